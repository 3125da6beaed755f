package eventbus

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Handler serves one bus per request as a resumable Server-Sent Events
// stream, typically on a route such as "GET /session/{id}/events" of an
// [http.ServeMux]. It is written on the package's exported API only, as
// any other transport can be (docs/SPEC.md section 6.6).
//
// Before subscribing it checks, in this order: CORS (when set; a preflight
// is answered there, without Lookup or Authorize), the method, that the
// writer can flush, the request's parameters (the cursor from Last-Event-ID
// or ?lastEventId=, ?epoch=, ?types=, ?maxQueued=), Lookup, Authorize (when
// set), and the subscriber limit. A refusal is a JSON answer
// {"error":...,"code":...}; a malformed cursor is no refusal: it is
// logged, and the stream is live only and starts with
// state_resync_required cursor_invalid (SubscribeOptions.CursorInvalid),
// so that the client knows. A HEAD goes through the same checks and
// gets the stream's headers without subscribing. The order, the status
// codes and the parameters' grammar are in docs/SPEC.md sections 6.1 and
// 6.2.
//
// The stream writes every ready frame as one batch, with one write and one
// flush under a write deadline (see WriteTimeout); a write that fails or
// blocks past it cancels the subscription at once, and a
// client that leaves cancels it promptly. It sends heartbeats while idle,
// and ends by itself when its Grant's lifetime ends or Revoke names its
// subject. The response, its framing and the heartbeats are docs/SPEC.md
// sections 5.3 and 6.3 (on HTTP/1.1 and HTTP/2 alike); access control is
// section 6.5. The handler starts no goroutine of its own: the request's
// goroutine serves the stream.
//
// A Handler is safe for concurrent use once its fields are set; they must
// not change while it serves. It must not be copied after first use. Its
// zero value answers 404 to everything because it has no Lookup.
type Handler struct {
	// Lookup finds the bus of session, for request r: the route's {id}
	// wildcard (r.PathValue("id")) on this Handler's route, each session
	// of the request on a MuxHandler's, which calls it once per session,
	// in order. Hub.LookupSession fits it. It returns an error wrapping
	// ErrSessionNotFound (or a nil bus) for an unknown session (404
	// session_not_found), one wrapping ErrInvalidSessionID for an id
	// CheckSessionID refuses (400 invalid_session_id), and an error that
	// is or wraps a *StatusError for another answer of its choice (503
	// with Retry-After when its store is unreachable, 401 when it checks
	// credentials itself); any other error is a 500 whose cause is logged,
	// not sent. Lookup runs before Authorize: a Lookup that creates
	// sessions (or reads a remote store) should check credentials itself
	// first, or an anonymous client makes it do that work before Authorize
	// refuses it. It is called on the request's goroutine and may block.
	Lookup func(r *http.Request, session string) (*EventBus, error)
	// Authorize, when set, decides whether request r may stream session,
	// whose bus Lookup found, after the request checks and Lookup and
	// before subscribing (for a HEAD too; never for a CORS preflight): on
	// this Handler's route once, on a MuxHandler's once per session, in
	// order, the first refusal answering the request. It is called on the
	// request's goroutine and may block (the client waits; its context is
	// r.Context()). It returns what the stream may do: its subject, for
	// Revoke, and when its lifetime ends (see Grant). An error that is or
	// wraps a *StatusError is answered as that says (Unauthorized,
	// Forbidden, Unavailable); another error is a 500 whose cause is
	// logged. nil: every request that passes Lookup is served, without
	// subject or lifetime. The rules are docs/SPEC.md section 6.5.
	Authorize func(r *http.Request, session string, bus *EventBus) (Grant, error)
	// Logger receives diagnostics; nil means slog.Default().
	Logger *slog.Logger
	// Retry is the SSE reconnection delay sent first; 0 means DefaultRetry.
	Retry time.Duration
	// Heartbeat is the idle time before a heartbeat line (the retry: line
	// again, or a ":" comment: docs/SPEC.md section 5.3); 0 means
	// DefaultHeartbeat.
	Heartbeat time.Duration
	// WriteTimeout bounds each write and flush, and on HTTP/1.x the end of
	// the response net/http writes after the stream ends; 0 means
	// DefaultWriteTimeout. On HTTP/2 the deadline is cleared after every
	// batch, failed or not: a deadline left on a stream the client has
	// reset would keep the stream in memory for the whole WriteTimeout
	// (rapid reset). On HTTP/1.x it stays between batches and is set anew
	// only once older than WriteTimeout/8, so a blocked write fails
	// between 7/8 of WriteTimeout and WriteTimeout after it started. None
	// is set once the request's context is done (docs/SPEC.md section
	// 6.3).
	WriteTimeout time.Duration
	// RetryJitter spreads reconnections: each connection's retry: is Retry
	// plus a random delay in [0, RetryJitter], drawn per connection, so that
	// the clients of a daemon that restarts do not all come back at once.
	// 0 means Retry/2 (DefaultRetryJitterRatio); a negative value means
	// none, every connection gets exactly Retry.
	RetryJitter time.Duration
	// BareIDs makes the SSE id: line of every event "N", the decimal id
	// alone, as the TypeScript daemon's wire has it (the design this
	// library implements, docs/SPEC.md), instead of
	// "<epoch>:<N>" (the bus epoch, a colon, the id), the default. The
	// cost: a browser's EventSource sends the last id back by itself but
	// no Event-Epoch header, so after a daemon restart, a Delete or an
	// idle expiry its bare cursor cannot be told from one of the new bus:
	// it resumes in the new epoch as if nothing had happened, and what it
	// missed is lost silently (a client that sends ?epoch= or Event-Epoch
	// is still told epoch_reset). Set it only for clients that cannot take
	// the "<epoch>:<N>" form back. The envelope's "id" is the number
	// either way, and the handler accepts both forms whatever this says,
	// so switching it is safe during a rolling deploy (docs/SPEC.md
	// section 5.4).
	BareIDs bool
	// CORS, when set, lets pages of other origins open the stream (see
	// CORS). nil: no CORS headers but Access-Control-Expose-Headers, no
	// preflight (OPTIONS is 405), no origin check. One that does not
	// validate (CORS.Validate: "*" with Credentials) makes every request
	// 500 invalid_cors.
	CORS *CORS

	reg        registry    // the authorized streams, by subject, for Revoke
	corsLogged atomic.Bool // an invalid CORS was logged (see CORS.Validate)
}

func (h *Handler) logger() *slog.Logger {
	if h.Logger != nil {
		return h.Logger
	}
	return slog.Default()
}

// DefaultRetryJitterRatio is the Handler's default RetryJitter as a
// fraction of its Retry.
const DefaultRetryJitterRatio = 0.5

// ServeHTTP implements http.Handler. It answers a refused request and
// returns; a stream it serves until the stream ends (the client leaves,
// the bus closes, the subscription is evicted or revoked, its lifetime
// ends, or a write fails or blocks), on the request's goroutine.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The request's checks, Lookup, Authorize and Subscribe run in open,
	// whose large frame is gone before the stream first waits: between
	// batches the goroutine holds only net/http's frames, these and the
	// loop's few words, so the collector shrinks its stack back to what
	// net/http alone needs however deep Lookup or Authorize went (a daemon
	// that logs there grew it to 16 KiB, kept for the stream's life: issue
	// 26, docs/bench/NOTES.md).
	if st := h.open(w, r); st != nil {
		h.serveSSE(st, w, r)
	}
}

// serveSSE sends an opened stream's headers and serves it with the SSE
// transport, the single stream's wire or the multiplexed one.
func (h *Handler) serveSSE(st *Stream, w http.ResponseWriter, r *http.Request) {
	epoch := ""
	if st.multiplexed {
		writeSSEHeaders(w, r, "Event-Epochs", epochList(st))
	} else {
		writeSSEHeaders(w, r, "Event-Epoch", st.order[0].bus.Epoch())
		if !h.BareIDs {
			epoch = st.order[0].bus.Epoch()
		}
	}
	t := newSSETransport(h, w, r, st.multiplexed, epoch)
	t.finish(st.Serve(r.Context(), t))
}

// open checks and answers the request, or subscribes and returns the
// stream to serve; nil when there is none (refused, or a HEAD), having
// undone what it did.
func (h *Handler) open(w http.ResponseWriter, r *http.Request) *Stream {
	if !h.precheck(w, r) {
		return nil
	}
	sq, ok := parseStreamQuery(w, r)
	if !ok {
		return nil
	}
	query := sq.query

	opts := SubscribeOptions{Types: sq.types, MaxQueued: sq.maxQueued}
	raw := sq.cursor
	idEpoch := ""
	if raw != "" {
		if epoch, id, ok := ParseEventID(raw); ok {
			opts.Resume, opts.LastEventID, idEpoch = true, id, epoch
		} else {
			// Live only, as before, but said in-band: the client learns
			// from the stream itself that its cursor was not used and what
			// it may have missed (SPEC 4.1), not only the daemon's log.
			opts.CursorInvalid = true
			h.logger().LogAttrs(r.Context(), slog.LevelWarn, "eventbus: malformed Last-Event-ID, serving live only",
				slog.String("value", quoteHead(raw, 64)))
		}
	}
	opts.Epoch = r.Header.Get("Event-Epoch")
	if opts.Epoch == "" {
		opts.Epoch = query.Get("epoch")
	}
	if idEpoch != "" {
		switch {
		case opts.Epoch == "" || len(opts.Epoch) > 64: // an epoch the bus would ignore
			opts.Epoch = idEpoch
		case opts.Epoch != idEpoch:
			// Two epochs for one cursor: neither can be trusted to resume.
			h.logger().LogAttrs(r.Context(), slog.LevelWarn, "eventbus: Event-Epoch and the epoch in Last-Event-ID disagree, serving live only",
				slog.String("value", quoteHead(raw, 64)), slog.String("epoch", quoteHead(opts.Epoch, 64)))
			opts.Resume, opts.LastEventID, opts.Epoch = false, 0, ""
			opts.CursorInvalid = true
		}
	}
	return h.openStream(w, r, openPlan{
		ids: []string{r.PathValue("id")},
		sq:  sq,
		head: func(st *Stream) {
			// The headers a GET would get, without subscribing: a HEAD
			// takes no slot of the bus (and is never refused for a full
			// one).
			writeSSEHeaders(w, r, "Event-Epoch", st.order[0].bus.Epoch())
		},
		options: func(*Stream, *Member) SubscribeOptions { return opts },
	})
}

// precheck applies the checks that come before anything else, for the
// single and the multiplexed stream alike: CORS (a preflight, or an origin
// it refuses, is answered), the method (GET or HEAD, else 405) and a writer
// that can flush (else 500). It reports whether the request goes on.
func (h *Handler) precheck(w http.ResponseWriter, r *http.Request) bool {
	if h.CORS != nil {
		if err := h.CORS.Validate(); err != nil {
			// Fail closed: no request is served, so the mistake shows at
			// once instead of reflecting every origin with credentials.
			if h.corsLogged.CompareAndSwap(false, true) {
				h.logger().LogAttrs(r.Context(), slog.LevelError, "eventbus: refusing every request: invalid Handler.CORS", slog.String("error", err.Error()))
			}
			writeJSONError(w, http.StatusInternalServerError, "invalid CORS configuration", "invalid_cors", 0)
			return false
		}
		if !h.CORS.handle(w, r) {
			return false // a preflight, or an origin it refuses: answered
		}
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		allow := "GET, HEAD"
		if h.CORS != nil {
			allow = "GET, HEAD, OPTIONS"
		}
		w.Header().Set("Allow", allow)
		writeJSONError(w, http.StatusMethodNotAllowed, "method not allowed", "method_not_allowed", 0)
		return false
	}
	if !canFlush(w) {
		writeJSONError(w, http.StatusInternalServerError, "response writer cannot flush", "streaming_unsupported", 0)
		return false
	}
	return true
}

// streamQuery is what the single and the multiplexed stream read from a
// request alike.
type streamQuery struct {
	query     url.Values // a malformed pair is skipped, the rest kept
	queryErr  error      // url.ParseQuery's
	cursor    string     // Last-Event-ID, else ?lastEventId=; "" when neither
	types     []string   // ?types=, checked
	maxQueued int        // ?maxQueued=, checked; 0 when absent
}

// parseStreamQuery reads the cursor, types and maxQueued of a stream
// request, and answers 400 invalid_filter or invalid_max_queued itself
// (then ok is false).
func parseStreamQuery(w http.ResponseWriter, r *http.Request) (sq streamQuery, ok bool) {
	sq.query, sq.queryErr = url.ParseQuery(r.URL.RawQuery)
	query := sq.query
	sq.cursor = r.Header.Get("Last-Event-ID")
	if sq.cursor == "" {
		if v := query["lastEventId"]; len(v) > 0 {
			sq.cursor = v[0]
		}
	}
	if v := query["types"]; len(v) > 0 {
		for _, list := range v {
			for t := range strings.SplitSeq(list, ",") {
				if t != "" {
					sq.types = append(sq.types, t)
				}
			}
		}
		if err := CheckTypeFilters(sq.types); err != nil {
			writeJSONError(w, http.StatusBadRequest, err.Error(), "invalid_filter", 0)
			return sq, false
		}
	}
	if sq.queryErr != nil && rawParamCount(r.URL.RawQuery, "maxQueued") != len(query["maxQueued"]) {
		// ParseQuery skipped a maxQueued pair it could not decode ("%zz",
		// a ';' in the pair). Taking the default then would turn a value
		// that is not decimal into a 200 instead of the 400 of SPEC 6.2.
		writeJSONError(w, http.StatusBadRequest, "maxQueued must be a decimal number", "invalid_max_queued", 0)
		return sq, false
	}
	if v, ok := query["maxQueued"]; ok {
		n, err := parseMaxQueued(v)
		if err != nil {
			writeJSONError(w, http.StatusBadRequest, err.Error(), "invalid_max_queued", 0)
			return sq, false
		}
		sq.maxQueued = n
	}
	return sq, true
}

// lookupRefusal is the answer to a Lookup that found no bus (the
// StatusError it returned, 400 invalid_session_id, 404 session_not_found,
// or 500, logged), nil when it found one.
func (h *Handler) lookupRefusal(r *http.Request, bus *EventBus, err error, session string) *StatusError {
	var se *StatusError
	switch {
	case errors.As(err, &se):
		h.logRefusal(r, "eventbus: session lookup refused", se, session)
		return se
	case errors.Is(err, ErrInvalidSessionID):
		// CheckSessionID's message quotes the id escaped, which the
		// "session" member, JSON, cannot do for an id that is not UTF-8.
		return &StatusError{Status: http.StatusBadRequest, Code: "invalid_session_id", Message: err.Error()}
	case errors.Is(err, ErrSessionNotFound) || (err == nil && bus == nil):
		return &StatusError{Status: http.StatusNotFound, Code: "session_not_found", Message: "session not found"}
	case err != nil:
		h.logger().LogAttrs(r.Context(), slog.LevelError, "eventbus: session lookup failed", slog.String("error", err.Error()))
		return &StatusError{Status: http.StatusInternalServerError, Code: "internal", Message: "session lookup failed"}
	}
	return nil
}

// authorizeRefusal is the answer to an Authorize that refused (its
// StatusError, or 500, logged) or granted a lifetime that has ended
// already (401 credentials_expired), nil when it granted the stream.
func (h *Handler) authorizeRefusal(r *http.Request, grant Grant, err error, session string) *StatusError {
	if err != nil {
		var se *StatusError
		if errors.As(err, &se) {
			h.logRefusal(r, "eventbus: authorization refused", se, session)
			return se
		}
		h.logger().LogAttrs(r.Context(), slog.LevelError, "eventbus: authorization failed", slog.String("error", err.Error()))
		return &StatusError{Status: http.StatusInternalServerError, Code: "internal", Message: "authorization failed"}
	}
	if !grant.Expires.IsZero() && !time.Now().Before(grant.Expires) {
		// A stream that would end at once would have its client
		// reconnect at once, in a loop. A 401 must carry a challenge
		// (RFC 9110 11.6.1): the scheme the client used, else Bearer.
		scheme, _, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if scheme == "" {
			scheme = "Bearer"
		}
		return &StatusError{Status: http.StatusUnauthorized, Code: "credentials_expired", Message: "credentials expired",
			Challenge: scheme + ` error="invalid_token", error_description="credentials expired"`}
	}
	return nil
}

// subscribeRequest subscribes to bus for request r. The request context
// bounds the subscribing only (a mirror's read of its log must stop when
// the client leaves); the subscription is not tied to it. The handler ends
// it itself, with Close or CloseBlocked: it waits on r.Context() in serve,
// and on a failed write decides between cancelled and blocked. Left to the
// context, the net/http cancellation that follows every failed write, a
// deadline included, would race dropBlocked and count the buffered frames
// of a blocked writer as cancelled. A request whose context is done
// already gets an ended subscription, as Subscribe gives one. A context
// watched for the life of each stream cost about 1 KiB per idle
// connection (issue 26).
func subscribeRequest(r *http.Request, bus *EventBus, opts SubscribeOptions) (*Subscription, error) {
	opts.Detached = true
	return bus.Subscribe(r.Context(), opts)
}

// writeSubscribeError answers a Subscribe that failed: 429
// subscriber_limit_exceeded with Retry-After for a full bus, else 500;
// the body names session when it is not empty.
func writeSubscribeError(w http.ResponseWriter, err error, session string) {
	var limit *SubscriberLimitError
	if errors.As(err, &limit) {
		w.Header().Set("Retry-After", "5")
		w.Header().Set("Access-Control-Expose-Headers", "Retry-After")
		writeJSONErrorFor(w, http.StatusTooManyRequests, "subscriber limit exceeded", "subscriber_limit_exceeded", limit.Limit, session)
		return
	}
	writeJSONErrorFor(w, http.StatusInternalServerError, err.Error(), "internal", 0, session)
}

// logRefusal logs that Lookup or Authorize refused session with se: at
// Warn for a 5xx (something the daemon depends on failed), at Debug
// otherwise (a client without access is no event of the daemon's).
func (h *Handler) logRefusal(r *http.Request, msg string, se *StatusError, session string) {
	level := slog.LevelDebug
	if se.Status >= 500 || se.Status < 400 {
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{slog.Int("status", se.Status), slog.String("error", se.Error())}
	if session != "" {
		attrs = append(attrs, slog.String("session", quoteHead(session, 64)))
	}
	h.logger().LogAttrs(r.Context(), level, msg, attrs...)
}

// writeSSEHeaders sends the stream's response headers, with the epoch
// header epochName (exposed to CORS pages) set to epoch, and the 200
// status.
func writeSSEHeaders(w http.ResponseWriter, r *http.Request, epochName, epoch string) {
	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-cache, no-transform")
	if r.ProtoMajor == 1 {
		hd.Set("Connection", "keep-alive")
	}
	hd.Set("X-Accel-Buffering", "no")
	hd.Set(epochName, epoch)
	hd.Set("Access-Control-Expose-Headers", epochName)
	w.WriteHeader(http.StatusOK)
}

// canFlush reports whether w, or a writer it wraps (the Unwrap convention
// of http.ResponseController), can flush. It is checked before subscribing:
// once the status line is out it is too late to answer 500.
func canFlush(w http.ResponseWriter) bool {
	for {
		switch x := w.(type) {
		case http.Flusher:
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return false
		}
	}
}

// parseDecimalID parses the bare form of an event id strictly: one or more
// ASCII digits (leading zeros allowed) whose value is at most MaxEventID.
// Anything else, including a sign, a space or an empty string, reports
// false. It never allocates and reads a hostile 10 MB value in one pass.
func parseDecimalID(s string) (uint64, bool) {
	if s == "" {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
		if n > MaxEventID {
			return 0, false
		}
	}
	return n, true
}

// ParseEventID parses a Last-Event-ID value in either form a Handler
// accepts: "N" (one or more ASCII digits, leading zeros allowed, at most
// MaxEventID; no sign, no space), or "<epoch>:<N>", an epoch of exactly
// 32 lowercase hex digits (what EventBus.Epoch returns), a colon and N as
// before (the id: lines of a Handler without BareIDs). It returns the epoch ("" for
// the plain form, else a substring of s), the id, and whether s is valid;
// anything else (another epoch length, upper-case hex, a sign, a second
// colon...) reports false. It never allocates. Clients that keep their own
// cursor apply the same rule (docs/SPEC.md sections 5.4 and 6.2).
func ParseEventID(s string) (epoch string, id uint64, ok bool) {
	const epochLen = 32
	if len(s) > epochLen && s[epochLen] == ':' {
		for i := 0; i < epochLen; i++ {
			if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return "", 0, false
			}
		}
		epoch, s = s[:epochLen], s[epochLen+1:]
	}
	id, ok = parseDecimalID(s)
	if !ok {
		return "", 0, false
	}
	return epoch, id, true
}

// quoteHead quotes the first n bytes of s, for a log line or an answer
// that names a client's value of any length.
func quoteHead(s string, n int) string { return strconv.Quote(s[:min(len(s), n)]) }

// parseMaxQueued applies the rules of docs/SPEC.md section 6.2 to the
// maxQueued values of a query.
func parseMaxQueued(v []string) (int, error) {
	if len(v) != 1 {
		return 0, errors.New("maxQueued must be given once")
	}
	if v[0] == "" {
		return 0, errors.New("maxQueued is empty")
	}
	n := 0
	for i := 0; i < len(v[0]); i++ {
		c := v[0][i]
		if c < '0' || c > '9' {
			return 0, errors.New("maxQueued must be a decimal number")
		}
		if n <= MaxClientMaxQueued {
			// Past the maximum the value is out of range whatever follows;
			// stop accumulating so 20 digits cannot overflow.
			n = n*10 + int(c-'0')
		}
	}
	if n < MinClientMaxQueued || n > MaxClientMaxQueued {
		return 0, errors.New("maxQueued must be between " + strconv.Itoa(MinClientMaxQueued) + " and " + strconv.Itoa(MaxClientMaxQueued))
	}
	return n, nil
}

// writeJSONError answers an error with {"error":msg,"code":code} and, for a
// positive limit, "limit", on one line.
func writeJSONError(w http.ResponseWriter, status int, msg, code string, limit int) {
	writeJSONErrorFor(w, status, msg, code, limit, "")
}

// writeJSONErrorFor is writeJSONError with "session" after the others when
// session is not empty: the multiplexed stream names the session an answer
// is about.
func writeJSONErrorFor(w http.ResponseWriter, status int, msg, code string, limit int, session string) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // as the frames' JSON strings
	_ = enc.Encode(struct {
		Error   string `json:"error"`
		Code    string `json:"code"`
		Limit   int    `json:"limit,omitempty"`
		Session string `json:"session,omitempty"`
	}{msg, code, limit, session}) // cannot fail: strings and an int
	b := buf.Bytes()
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// rawParamCount counts the pairs of a raw query whose key is key, also the
// pairs url.ParseQuery skips because they cannot be decoded.
func rawParamCount(rawQuery, key string) int {
	n := 0
	for rawQuery != "" {
		var pair string
		pair, rawQuery, _ = strings.Cut(rawQuery, "&")
		k, _, _ := strings.Cut(pair, "=")
		if u, err := url.QueryUnescape(k); err == nil {
			k = u
		}
		if k == key {
			n++
		}
	}
	return n
}
