package eventbus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

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

// muxSession is one session of a multiplexed stream.
type muxSession struct {
	id      string
	bus     *EventBus
	sub     *Subscription
	subject string // its Grant's
	// member is `"session":"<id>",`, spliced into every frame's envelope.
	member []byte
	// entry is its position in the cursor; group the offset of its group
	// in the stream's id line.
	entry muxcursor.Entry
	group int
	// Serve loop state.
	todo     bool // take from it before waiting: its last take had frames, or it was woken
	left     bool // it has left the stream (its subscription ended)
	terminal bool // its terminal frame was written
	pending  int  // frames taken that are in the unflushed batch
}

// ServeHTTP implements http.Handler.
func (m *MuxHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// As Handler.ServeHTTP: the checks run in open, whose frame is gone
	// before the stream waits.
	if st := m.open(w, r); st != nil {
		serveStream(st, &st.s, st.group.Ready(), st.ends, &st.end)
	}
}

// open checks and answers the request, or subscribes to every session and
// sends the stream's headers and retry: line, and returns the stream to
// serve; nil when there is none, having undone what it did.
func (m *MuxHandler) open(w http.ResponseWriter, r *http.Request) *muxStream {
	h := m.handler()
	if !h.precheck(w, r) {
		return nil
	}
	ids, ok := m.sessions(w, r)
	if !ok {
		return nil
	}
	sq, ok := parseStreamQuery(w, r)
	if !ok {
		return nil
	}

	sess := make([]muxSession, len(ids))
	for i, id := range ids {
		var bus *EventBus
		var err error
		if h.Lookup != nil {
			bus, err = h.Lookup(r, id)
		}
		if !h.lookedUp(w, r, bus, err, id) {
			return nil
		}
		sess[i].id, sess[i].bus = id, bus
	}

	st := &muxStream{h: h, sess: sess, lifetime: -1}
	opened := false
	defer func() {
		if !opened { // refused, failed or panicked (in Authorize, say): undo
			st.close()
		}
	}()
	var expires time.Time
	authorize := h.Authorize
	if authorize != nil {
		if r.Method != http.MethodHead {
			// Filed before the first Authorize, as Handler does.
			st.ls = h.reg.begin()
		}
		subjects := make([]string, 0, len(sess))
		for i := range sess {
			grant, err := authorize(r, sess[i].id, sess[i].bus)
			if !h.authorized(w, r, grant, err, sess[i].id) {
				return nil
			}
			sess[i].subject = grant.Subject
			subjects = append(subjects, grant.Subject)
			if !grant.Expires.IsZero() && (st.lifetime < 0 || grant.Expires.Before(expires)) {
				st.lifetime, expires = i, grant.Expires
			}
		}
		if st.ls != nil {
			h.reg.commit(st.ls, subjects...)
		}
	}

	if r.Method == http.MethodHead {
		writeSSEHeaders(w, r, "Event-Epochs", epochList(sess))
		return nil
	}

	cursor, unusable, fromStart := m.parseCursor(r, h, sq.cursor)
	st.group = NewReadyGroup(len(sess))
	interrupt := st.s.interrupt // one for every session: any shed ends the stream
	for i := range sess {
		opts := SubscribeOptions{Types: sq.types, MaxQueued: sq.maxQueued, Group: st.group, Interrupt: interrupt}
		ms := &sess[i]
		epoch := ms.bus.Epoch()
		ms.entry = muxcursor.Entry{Session: muxcursor.SessionTag(ms.id), Epoch: muxcursor.EpochTag(epoch)}
		e, named := cursorEntryFor(cursor, sess, i)
		if named == entryAmbiguous {
			h.logger().LogAttrs(r.Context(), slog.LevelWarn, "eventbus: multiplexed cursor names a session ambiguously, serving it live only",
				slog.String("session", quoteHead(ms.id, 64)))
		}
		switch {
		case fromStart:
			// "0": from the start of its ring, as its single stream with
			// Last-Event-ID 0 (SPEC 6.8).
			opts.Resume = true
		case named != entryNamed:
			// Live. Its entry is the bus's last id before subscribing:
			// every later event is delivered, so a resume from it loses
			// nothing (it may replay an event published while the stream
			// opened, which the client never had).
			ms.entry.ID = ms.bus.LastEventID()
			// A cursor that was given but cannot be used for this
			// session is said in-band, before any live frame: the client
			// learns what it may have missed (SPEC 6.8).
			opts.CursorInvalid = unusable || named == entryAmbiguous
		case e.Epoch == ms.entry.Epoch:
			opts.Resume, opts.LastEventID, opts.Epoch = true, e.ID, epoch
			ms.entry.ID = e.ID
		default:
			// Another epoch: epoch_reset, and the replay of this epoch
			// from its start. Any epoch of another bus will do for the bus
			// to see the mismatch; the tag's hex names it in logs.
			opts.Resume, opts.LastEventID, opts.Epoch = true, e.ID, strconv.FormatUint(e.Epoch, 16)
		}
		sub, err := subscribeRequest(r, ms.bus, opts)
		if err != nil {
			writeSubscribeError(w, err, ms.id) // the deferred close ends the others
			return nil
		}
		ms.sub = sub
		ms.member = sessionMember(ms.id)
		ms.todo = true
	}

	writeSSEHeaders(w, r, "Event-Epochs", epochList(sess))
	st.s.init(h, w, r)
	st.buildIDLine()
	if err := st.s.flushBatch(); err != nil {
		st.dropAll(r.Context(), err)
		return nil
	}
	if st.ls != nil {
		st.ends.revoked = st.ls.revoked
	}
	if st.lifetime >= 0 {
		st.lifetimeTimer = time.NewTimer(time.Until(expires))
		st.ends.lifetime = st.lifetimeTimer.C
	}
	st.lifetime = max(st.lifetime, 0)
	st.active = len(sess)
	opened = true
	return st
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
				m.handler().refused(w, r, "eventbus: sessions refused", se, "")
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

// parseCursor parses the request's cursor: nil when there is none, and
// unusable set when one was given that is not a composite cursor (logged; every
// session is then served live, after its cursor_invalid notice), fromStart
// for "0" (every session from the start of its ring; "00" too, as a single
// stream reads it). The bound is ParseCursor's, MaxCursorEntries, not the
// stream's MaxStreamSessions: a cursor may name more sessions than the URL
// (a client that dropped some, or keeps one cursor for several streams),
// and the entries of sessions the URL does not name are ignored.
func (m *MuxHandler) parseCursor(r *http.Request, h *Handler, raw string) (c muxcursor.Cursor, unusable, fromStart bool) {
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

// cursorEntryFor returns the cursor's entry for session i and how the
// cursor names it: entryNone when no entry has its tag, entryAmbiguous
// when entries have its tag but it cannot be told which session they are
// for (another session of the stream has the same tag, about 2^-40 per
// pair) or which entry counts (two entries with its tag).
func cursorEntryFor(c muxcursor.Cursor, sess []muxSession, i int) (muxcursor.Entry, int) {
	if c == nil {
		return muxcursor.Entry{}, entryNone
	}
	tag := muxcursor.SessionTag(sess[i].id)
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
	for j := range sess {
		if j != i && muxcursor.SessionTag(sess[j].id) == tag {
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

// epochList is the Event-Epochs header: the epochs in session order.
func epochList(sess []muxSession) string {
	var b strings.Builder
	for i := range sess {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(sess[i].bus.Epoch())
	}
	return b.String()
}

// muxStream is a served multiplexed stream: its sessions, what ends it,
// its writer, and the serve loop's state. It lives on the heap, not in a
// frame of the request's goroutine (see Handler.ServeHTTP).
type muxStream struct {
	h      *Handler
	sess   []muxSession
	group  *ReadyGroup
	s      stream
	ends   streamEnds
	end    endCause // how the stream ends by itself, once known
	active int      // sessions that have not left
	// lifetimeTimer is the first Grant's Expires; nil without one.
	lifetimeTimer *time.Timer
	// The batch being taken: the frames, the session of each, the
	// sessions the group woke, those whose subscription ended.
	frames []Frame
	owners []int
	woken  []int
	ending []int
	// idLine is "id: " + the cursor + "\n", rewritten one group at a
	// time: the group of the session whose event is written.
	idLine []byte
	// lifetime is the session whose Grant expires first; ls the stream's
	// registry entry (nil without Authorize).
	lifetime int
	ls       *liveStream
	// current is the session whose frame is being written, for a panic's
	// frame; start the session the next batch takes from first (0 unless
	// the last batch reached its bound before it).
	current int
	start   int
}

// muxBatchBytes bounds the envelopes one batch of a multiplexed stream
// takes from its sessions (each TakeReady takes at most 256 KiB, and at
// least one frame): a stream blocked in a write holds at most about that
// much outside its sessions' caps, whatever the number of sessions.
const muxBatchBytes = 256 << 10

// buildIDLine lays out the id line with every session's entry.
func (st *muxStream) buildIDLine() {
	st.idLine = make([]byte, 0, len(idField)+muxcursor.Len(len(st.sess))+1)
	st.idLine = append(append(st.idLine, idField...), muxcursor.Prefix...)
	for i := range st.sess {
		st.sess[i].group = len(st.idLine)
		st.idLine = append(st.idLine, make([]byte, muxcursor.EntryLen)...)
		muxcursor.Put(st.idLine[st.sess[i].group:], st.sess[i].entry)
	}
	st.idLine = append(st.idLine, '\n')
}

// close releases what open took, in reverse order.
func (st *muxStream) close() {
	if st.lifetimeTimer != nil {
		st.lifetimeTimer.Stop()
	}
	if st.s.beat != nil {
		st.s.beat.Stop()
	}
	for i := range st.sess {
		if st.sess[i].sub != nil {
			st.sess[i].sub.Close()
		}
	}
	if st.ls != nil {
		st.h.reg.remove(st.ls)
	}
}

// failed is served.failed: every subscription is dropped after a
// heartbeat's write failed.
func (st *muxStream) failed(err error) { st.dropAll(st.s.ctx, err) }

// panicked is served.panicked: a stream_error internal frame naming the
// session whose frame was being written, in place of the half-written
// batch.
func (st *muxStream) panicked(p any) {
	s := &st.s
	st.h.logger().LogAttrs(s.ctx, slog.LevelError, "eventbus: stream panicked", slog.Any("panic", p))
	s.buf = s.buf[:0]
	st.add(st.sess[st.current].bus.StreamErrorFrame("internal error", ErrorKindInternal), st.current)
	_ = s.flushBatch()
}

// batch takes from every session that may have frames and writes what it
// took as one batch, with the frames of the sessions that left and the one
// that ends the stream when it ends by itself. more reports that frames
// were taken, done that the stream is over.
//
//go:noinline
func (st *muxStream) batch() (more, done bool) {
	s := &st.s
	ctx := s.ctx
	st.woken = st.group.Woken(st.woken[:0])
	for _, i := range st.woken {
		st.sess[i].todo = true // members joined in session order
	}
	frames, owners, ending := st.frames[:0], st.owners[:0], st.ending[:0]
	// A batch takes up to muxBatchBytes of envelopes: what a stream blocked
	// in a write holds outside its sessions' caps. The sessions it did not
	// reach keep todo, and the next batch starts with the first of them,
	// so that no session waits behind the others for long.
	taken := 0
	first := st.start
	st.start = 0
	for k := range st.sess {
		i := (first + k) % len(st.sess)
		ms := &st.sess[i]
		if !ms.todo || ms.left {
			continue
		}
		if taken >= muxBatchBytes {
			st.start, more = i, true
			break
		}
		n := len(frames)
		var open bool
		frames, open = ms.sub.TakeReady(frames)
		for _, f := range frames[n:] {
			taken += f.Size()
		}
		for range len(frames) - n {
			owners = append(owners, i)
		}
		ms.pending += len(frames) - n
		// A take with frames leaves the queue not waiting: it signals
		// nothing until a take finds it empty, so it is taken from again
		// before the loop waits.
		ms.todo = len(frames) > n
		more = more || ms.todo
		if !open {
			ms.left, ms.todo = true, false
			ending = append(ending, i)
			st.active--
		}
	}
	if st.end == endNone {
		st.end = st.ends.poll() // after the takes, as Handler's
	}
	if st.end == endRevoked {
		for i := range st.sess {
			st.sess[i].sub.MarkDiscarded(st.sess[i].pending)
			st.sess[i].pending = 0
		}
		clear(frames)
		frames, owners, ending = frames[:0], owners[:0], ending[:0]
	}
	st.reserve(frames, owners)
	evicted := false
	for k, f := range frames {
		i := owners[k]
		st.current = i
		if f.ID() != 0 {
			st.sess[i].entry.ID = f.ID()
			muxcursor.Put(st.idLine[st.sess[i].group:], st.sess[i].entry)
		}
		st.add(f, i)
		if f.Terminal() {
			evicted = evicted || f.Type() == TypeClientEvicted
			st.sess[i].terminal = true
		}
	}
	clear(frames) // do not pin delivered frames while idle
	st.frames, st.owners, st.ending = frames[:0], owners[:0], ending[:0]
	if ctx.Err() == nil {
		for _, i := range ending {
			if st.sess[i].terminal {
				continue
			}
			// The bus closed (its own terminal frame, if any, came
			// above): tell the client this session leaves.
			f, ok := endErrorFrame(st.sess[i].bus, st.sess[i].sub)
			if !ok {
				f = st.sess[i].bus.StreamErrorFrame("session closed", ErrorKindClosed)
			}
			st.add(f, i)
		}
	}
	switch {
	case st.end == endRevoked && ctx.Err() == nil:
		i := st.revokedSession()
		st.add(st.sess[i].bus.StreamErrorFrame(revokedMessage, ErrorKindRevoked), i)
	case st.end == endLifetime && st.active > 0 && !evicted:
		// After what was queued: the client resumes after its cursor.
		i := st.lifetime
		st.add(st.sess[i].bus.StreamErrorFrame(lifetimeEndedMessage, ErrorKindReauthenticate), i)
	}
	if len(s.buf) > 0 || s.pending {
		if err := s.flushBatch(); err != nil {
			st.dropAll(ctx, err)
			return false, true
		}
		s.tailField = false // every frame ends with a blank line
	}
	for i := range st.sess {
		if ms := &st.sess[i]; ms.pending > 0 {
			ms.sub.MarkWritten(ms.pending)
			ms.pending = 0
		}
	}
	if evicted || st.active == 0 || st.end != endNone {
		s.armLastChunk()
		return false, true // the deferred close ends the subscriptions left
	}
	return more, false
}

// revokedSession is the session a revocation's frame names: the first
// whose Grant named the revoked subject, else the first.
func (st *muxStream) revokedSession() int {
	if st.ls != nil && st.ls.by != "" {
		for i := range st.sess {
			if st.sess[i].subject == st.ls.by {
				return i
			}
		}
	}
	return 0
}

// dropAll ends every subscription after a write failed or blocked: the
// frames of each session in the failed batch are counted as blocked.
func (st *muxStream) dropAll(ctx context.Context, err error) {
	for i := range st.sess {
		if ms := &st.sess[i]; !ms.left || ms.pending > 0 {
			dropWriteFailed(ctx, ms.sub, ms.pending, err)
			ms.pending = 0
		}
	}
}

// reserve makes room in the batch buffer for the frames add will copy,
// in one allocation, as stream.reserve does for a single stream.
func (st *muxStream) reserve(frames []Frame, owners []int) {
	need := 0
	for k, f := range frames {
		if f.Size() < directWriteSize {
			need += len(f.SSE())
		}
		need += len(st.sess[owners[k]].member)
		if f.ID() != 0 {
			need += len(st.idLine)
		}
	}
	if s := &st.s; len(s.buf)+need <= maxBatchBuffer {
		s.buf = slices.Grow(s.buf, need)
	}
}

// add adds frame f of session i to the batch: for an event, the id line
// with the cursor in place of the frame's own; then the frame's bytes up
// to its envelope's "{", the session member, and the rest of the frame.
func (st *muxStream) add(f Frame, i int) {
	s := &st.s
	s.frames++
	wire := f.SSE()
	if s.err != nil || wire == nil {
		return
	}
	var idLine []byte
	from := 0
	if f.ID() != 0 {
		idLine = st.idLine
		from = bytes.IndexByte(wire, '\n') + 1
	}
	open := len(wire) - 2 - len(f.JSON()) + 1 // after the envelope's "{"
	member := st.sess[i].member
	rest := wire[open:]
	big := f.Size() >= directWriteSize
	if big || len(s.buf)+len(idLine)+open-from+len(member)+len(rest) > maxBatchBuffer {
		s.write(nil)
	}
	s.buf = append(s.buf, idLine...)
	s.buf = append(s.buf, wire[from:open]...)
	s.buf = append(s.buf, member...)
	if big {
		s.write(nil)
		s.write(rest)
		return
	}
	s.buf = append(s.buf, rest...)
}
