package eventbus

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/ssebus/eventbus/internal/muxcursor"
)

// DefaultMaxStreamSessions is how many sessions a MuxHandler serves on one
// stream when MaxStreamSessions is 0.
const DefaultMaxStreamSessions = 32

// MuxHandler serves several sessions' buses as one Server-Sent Events
// stream, so that a page watching many sessions needs one connection (a
// browser opens at most 6 HTTP/1.1 connections per host), typically on a
// route such as "GET /events?session=a&session=b". One goroutine, the
// request's, serves every session of a stream: it waits on one ReadyGroup
// and takes from the sessions that are ready, with no goroutine per
// session.
//
// The stream follows the single-session Handler's rules (see Handler):
// the retry: line with its jitter, heartbeats, one write and one flush per
// batch under a write deadline (Handler.WriteTimeout), HEAD,
// CORS, the JSON error answers, HTTP/1.1 and HTTP/2 alike, the Grant's
// lifetime and Revoke. What differs:
//
// Request rules, in this order: CORS, the method and a writer that can
// flush, as Handler; the sessions (Sessions, by default every "session"
// query parameter, in order) must be 1 to MaxStreamSessions distinct ids
// that CheckSessionID accepts (non-empty, at most MaxSessionIDBytes, valid
// UTF-8), else 400 invalid_sessions, whose message names the first bad
// one; ?types= and ?maxQueued= as
// Handler, applying to every session; then for each session in order,
// the Handler's Lookup (never creating a session: a Hub's LookupSession),
// whose ErrSessionNotFound is 404 session_not_found for the first unknown
// id; then the Handler's Authorize for each session in order, with its id,
// the first refusal answering
// the request; then the subscriptions, all or none (a full bus is 429
// subscriber_limit_exceeded, and the subscriptions already made are
// closed). Every error answer about one session names it: its JSON body is
// {"error":...,"code":...,"session":"<id>"}. A HEAD makes the same checks
// and subscribes to nothing.
//
// The cursor: the stream reads Last-Event-ID, else ?lastEventId=, as a
// composite cursor (docs/SPEC.md 6.8: up to MaxCursorEntries entries,
// whatever MaxStreamSessions is; the entries of sessions the URL does not name are
// ignored); Event-Epoch and ?epoch= are not used. A session the cursor
// names resumes as its own single stream would, independently of the
// others: what it missed and its replay_complete, or its
// state_resync_required (ring_evicted with exact ids,
// replay_budget_exceeded, or epoch_reset when the entry's epoch is not its
// bus's: a restart, a DELETE and re-creation). A session the cursor does
// not name starts live, without replay_complete. The cursor "0" (as a
// single stream reads it: "00" too) starts every session from the start
// of its ring, as its single stream with Last-Event-ID 0 would: its
// replay (ring_evicted first when its ring no longer starts at id 1), its
// replay_complete, then live, each under its own replay budget; so a new
// page asks for what its sessions retain without building a cursor. Any
// other single stream's id is no cursor. A cursor that cannot be
// parsed is logged and never an error: every session starts live, and
// its first frame says so, state_resync_required cursor_invalid
// (SubscribeOptions.CursorInvalid), as does a session the cursor names
// ambiguously (two entries with its tag, or another session of the stream
// with the same tag).
//
// The wire: every event frame's id: line is the composite cursor after
// that event (every session's last delivered id and epoch); synthetic
// frames and signals carry no id line, as on a single stream. The event:
// line is the frame's type. Every frame's data: envelope, events, signals
// and synthetic frames alike, starts with the member "session":"<id>",
// then the single stream's envelope members in their order:
// {"session":"a","id":7,"v":1,"type":...}. The session member is spliced
// in as the frame is copied into the batch: the shared encoding of an
// event is never re-encoded or copied for it. The stream's headers are a
// single stream's, with Event-Epochs (the sessions' epochs, in the order
// of the request's sessions, comma-separated) instead of Event-Epoch.
// Within a session, frames come in the bus's order; across sessions
// nothing is promised.
//
// Backpressure stays per session: each session is its own subscription
// of its bus, with its own caps and overflow policy (SubscribeOptions of
// Subscribe: ?maxQueued= for each). The stream holds no more than what its
// subscriptions had queued (one batch, written before the next take), so
// at most the sum of their caps. An eviction (client_evicted) ends the
// whole stream after that frame: the client resumes every session with its
// cursor. A session whose bus closes leaves the stream after its queued
// frames and its terminal frame (the bus's own, from CloseForShutdown or
// backplane.CloseWithError, else stream_error with errorKind "closed",
// ErrorKindClosed); the others go on, and the stream ends when no session
// is left. A stream that ends by
// itself for every session (its lifetime, Revoke, an internal error)
// writes one stream_error naming the session it is about: for the
// lifetime the session whose Grant expires first, for Revoke the first
// session whose Grant named the subject, else the first session.
//
// A MuxHandler is safe for concurrent use once its fields are set; they
// must not change while it serves. It must not be copied after first use.
// Its zero value, without a Handler, answers 404 session_not_found to a
// request with valid sessions, since it has no Lookup.
type MuxHandler struct {
	// Handler is the single-session route's Handler, whose Lookup and
	// Authorize this route calls once per session (with the session's
	// id) and whose settings it uses: Logger, Retry, RetryJitter,
	// Heartbeat, WriteTimeout and CORS (BareIDs does not apply: the id
	// line is the cursor). Its Revoke ends this MuxHandler's streams too
	// (they share its registry), so a daemon that serves both routes
	// from one Handler revokes both with one call. nil: no Lookup (every
	// session is unknown) and the defaults.
	Handler *Handler
	// Sessions returns the session ids of a request, in the stream's
	// order. nil: every "session" query parameter, in order (a pair that
	// cannot be decoded is 400 invalid_sessions). An error that is or
	// wraps a *StatusError is answered as that says; another is 400
	// invalid_sessions with its message. The ids it returns must then be
	// 1 to MaxStreamSessions distinct ids that CheckSessionID accepts.
	Sessions func(r *http.Request) ([]string, error)
	// MaxStreamSessions is the most sessions one stream serves; 0 (or a
	// negative value) means DefaultMaxStreamSessions, above
	// MaxCursorEntries means MaxCursorEntries.
	MaxStreamSessions int

	def Handler // when Handler is nil
}

// handler returns the Handler whose settings and registry m uses.
func (m *MuxHandler) handler() *Handler {
	if m.Handler != nil {
		return m.Handler
	}
	return &m.def
}

// maxSessions is MaxStreamSessions with its default and bound applied.
func (m *MuxHandler) maxSessions() int {
	switch n := m.MaxStreamSessions; {
	case n <= 0:
		return DefaultMaxStreamSessions
	case n > MaxCursorEntries:
		return MaxCursorEntries
	default:
		return n
	}
}

// Revoke is Handler.Revoke for the streams of m (and, when m.Handler is
// set, of that Handler too: they share it). It never blocks on a stream
// and is safe to call from any goroutine.
func (m *MuxHandler) Revoke(subject string) int { return m.handler().Revoke(subject) }

// ServeHTTP implements http.Handler.
func (m *MuxHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// As Handler.ServeHTTP: the checks run in open, whose frame is gone
	// before the stream waits.
	h := m.handler()
	if !h.precheck(w, r) {
		return
	}
	if st := m.open(w, r, false); st != nil {
		h.serveSSE(st, w, r)
	}
}

// OpenStream opens the multiplexed route's stream for request r, for a
// transport of the caller's (github.com/ssebus/eventbus/websocket's), as
// ServeHTTP opens it for SSE: the sessions (Sessions, or the "session"
// parameters), the query's lastEventId (a composite cursor, "0", or
// absent; the Last-Event-ID header too), types and maxQueued, then for
// each session the Handler's Lookup and Authorize, then the
// subscriptions, with the same rules, status codes and JSON answers. It
// does not check the method, CORS or the writer: those are the
// transport's (a WebSocket checks its handshake and its origin first). A
// HEAD is opened as a GET.
//
// It returns nil when it answered the request itself (a refusal); the
// caller then returns. Otherwise the stream is subscribed and nothing has
// been written: the caller starts its transport (a WebSocket's upgrade)
// and calls Serve, or Close when its transport could not start. The
// stream's sessions may change while it is served (Add, Remove), up to
// MaxStreamSessions at once. It is called on the request's goroutine and
// blocks while Lookup and Authorize run.
func (m *MuxHandler) OpenStream(w http.ResponseWriter, r *http.Request) *Stream {
	return m.open(w, r, true)
}

// open reads the multiplexed route's request and opens its stream (see
// OpenStream), with sessions that may change when dynamic is set.
func (m *MuxHandler) open(w http.ResponseWriter, r *http.Request, dynamic bool) *Stream {
	h := m.handler()
	ids, ok := m.sessions(w, r)
	if !ok {
		return nil
	}
	sq, ok := parseStreamQuery(w, r)
	if !ok {
		return nil
	}
	var head func(*Stream)
	if !dynamic {
		head = func(st *Stream) { writeSSEHeaders(w, r, "Event-Epochs", epochList(st)) }
	}
	var (
		parsed              bool
		cursor              muxcursor.Cursor
		unusable, fromStart bool
	)
	return h.openStream(w, r, openPlan{
		ids: ids, sq: sq, multiplexed: true, dynamic: dynamic, maxSessions: m.maxSessions(), head: head,
		options: func(st *Stream, mb *Member) SubscribeOptions {
			if !parsed {
				// After Lookup and Authorize: a refused request or a HEAD
				// logs nothing about its cursor.
				cursor, unusable, fromStart = parseMuxCursor(r, h, sq.cursor)
				parsed = true
			}
			e, how := entryFor(cursor, mb.session, ids)
			return st.memberOptions(mb, cursor != nil || unusable, unusable, fromStart, e, how)
		},
	})
}

// memberOptions returns the subscription options of member m of a
// multiplexed stream whose cursor was given (given), could not be parsed
// (unusable) or is "0" (fromStart), where the cursor names m as how says
// (entryFor) with entry e; it sets m's cursor entry to where the stream
// starts it.
func (st *Stream) memberOptions(m *Member, given, unusable, fromStart bool, e muxcursor.Entry, how int) SubscribeOptions {
	opts := SubscribeOptions{Types: st.types, MaxQueued: st.maxQueued}
	epoch := m.bus.Epoch()
	if how == entryAmbiguous {
		st.h.logger().LogAttrs(st.r.Context(), slog.LevelWarn, "eventbus: multiplexed cursor names a session ambiguously, serving it live only",
			slog.String("session", quoteHead(m.session, 64)))
	}
	switch {
	case fromStart:
		// "0": from the start of its ring, as its single stream with
		// Last-Event-ID 0 (SPEC 6.8).
		opts.Resume = true
	case how != entryNamed:
		// Live. Its entry is the bus's last id before subscribing: every
		// later event is delivered, so a resume from it loses nothing (it
		// may replay an event published while the stream opened, which
		// the client never had).
		m.entry.ID = m.bus.LastEventID()
		// A cursor that was given but cannot be used for this session is
		// said in-band, before any live frame: the client learns what it
		// may have missed (SPEC 6.8).
		opts.CursorInvalid = given && (unusable || how == entryAmbiguous)
	case e.Epoch == m.entry.Epoch:
		opts.Resume, opts.LastEventID, opts.Epoch = true, e.ID, epoch
		m.entry.ID = e.ID
	default:
		// Another epoch: epoch_reset, and the replay of this epoch from
		// its start. Any epoch of another bus will do for the bus to see
		// the mismatch; the tag's hex names it in logs.
		opts.Resume, opts.LastEventID, opts.Epoch = true, e.ID, strconv.FormatUint(e.Epoch, 16)
	}
	return opts
}

// sessions returns the request's session ids, or answers 400
// invalid_sessions (or the StatusError of Sessions) and reports false.
func (m *MuxHandler) sessions(w http.ResponseWriter, r *http.Request) ([]string, bool) {
	var ids []string
	if m.Sessions != nil {
		var err error
		if ids, err = m.Sessions(r); err != nil {
			var se *StatusError
			if errors.As(err, &se) {
				m.handler().logRefusal(r, "eventbus: sessions refused", se, "")
				se.serve(w, "")
			} else {
				writeJSONError(w, http.StatusBadRequest, err.Error(), "invalid_sessions", 0)
			}
			return nil, false
		}
	} else {
		query, err := url.ParseQuery(r.URL.RawQuery)
		ids = query["session"]
		if err != nil && rawParamCount(r.URL.RawQuery, "session") != len(ids) {
			writeJSONError(w, http.StatusBadRequest, "a session parameter cannot be decoded", "invalid_sessions", 0)
			return nil, false
		}
	}
	if msg := checkSessions(ids, m.maxSessions()); msg != "" {
		writeJSONError(w, http.StatusBadRequest, msg, "invalid_sessions", 0)
		return nil, false
	}
	return ids, true
}

// checkSessions applies the rules of a stream's session list, and returns
// what is wrong with it ("" when nothing is).
func checkSessions(ids []string, maxSessions int) string {
	switch {
	case len(ids) == 0:
		return "no session: give 1 to " + strconv.Itoa(maxSessions) + " session parameters"
	case len(ids) > maxSessions:
		return strconv.Itoa(len(ids)) + " sessions, more than " + strconv.Itoa(maxSessions)
	}
	for i, id := range ids {
		if err := CheckSessionID(id); err != nil {
			// Named by position and by CheckSessionID's escaped quote: an
			// id that is not UTF-8 cannot be named in JSON as it is.
			return "session " + strconv.Itoa(i+1) + ": " + err.Error()
		}
		if slices.Contains(ids[:i], id) {
			return "session " + quoteHead(id, 64) + " is given twice"
		}
	}
	return ""
}

// parseMuxCursor parses the request's cursor: nil when there is none, and
// unusable set when one was given that is not a composite cursor (logged; every
// session is then served live, after its cursor_invalid notice), fromStart
// for "0" (every session from the start of its ring; "00" too, as a single
// stream reads it). The bound is ParseCursor's, MaxCursorEntries, not the
// stream's MaxStreamSessions: a cursor may name more sessions than the URL
// (a client that dropped some, or keeps one cursor for several streams),
// and the entries of sessions the URL does not name are ignored.
func parseMuxCursor(r *http.Request, h *Handler, raw string) (c muxcursor.Cursor, unusable, fromStart bool) {
	if raw == "" {
		return nil, false, false
	}
	if strings.Trim(raw, "0") == "" {
		return nil, false, true
	}
	c, err := muxcursor.ParseCursor(raw)
	if err != nil {
		h.logger().LogAttrs(r.Context(), slog.LevelWarn, "eventbus: malformed multiplexed cursor, serving live only",
			slog.String("value", quoteHead(raw, 64)), slog.Int("bytes", len(raw)), slog.String("error", err.Error()))
		return nil, true, false
	}
	return c, false, false
}

// How a cursor names one session of a stream (cursorEntryFor).
const (
	entryNone      = iota // no entry has its tag: the session starts live
	entryNamed            // exactly one entry, for it alone: it resumes
	entryAmbiguous        // its tag is in the cursor but cannot be resolved
)

// entryFor returns the cursor's entry for session and how the cursor
// names it: entryNone when no entry has its tag, entryAmbiguous when
// entries have its tag but it cannot be told which session they are for
// (another of the stream's sessions has the same tag, about 2^-40 per
// pair) or which entry counts (two entries with its tag).
func entryFor(c muxcursor.Cursor, session string, sessions []string) (muxcursor.Entry, int) {
	if c == nil {
		return muxcursor.Entry{}, entryNone
	}
	tag := muxcursor.SessionTag(session)
	n := 0
	var found muxcursor.Entry
	for _, e := range c {
		if e.Session == tag {
			found = e
			n++
		}
	}
	if n == 0 {
		return muxcursor.Entry{}, entryNone
	}
	for _, other := range sessions {
		if other != session && muxcursor.SessionTag(other) == tag {
			return muxcursor.Entry{}, entryAmbiguous
		}
	}
	if n > 1 {
		return muxcursor.Entry{}, entryAmbiguous
	}
	return found, entryNamed
}

// sessionMember is `"session":<id as a JSON string>,`, the member spliced
// into every frame of the session: its string escaped as the frames'
// strings are (no HTML escaping).
func sessionMember(id string) []byte {
	var b bytes.Buffer
	b.WriteString(`"session":`)
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(id) // a string cannot fail
	m := b.Bytes()
	m[len(m)-1] = ',' // in place of Encode's newline
	return m
}

// epochList is the Event-Epochs header: the epochs in the stream's
// order.
func epochList(st *Stream) string {
	var b strings.Builder
	for i, m := range st.order {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(m.bus.Epoch())
	}
	return b.String()
}
