package eventbus

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// StatusError is an error that a Handler's Lookup or Authorize returns (or
// wraps) to choose the HTTP answer: the status, and the JSON body
// {"error":Message,"code":Code} that every error answer of the Handler has.
// Any other error of Lookup or Authorize is a 500 whose cause is logged, not
// sent; a StatusError's Message is sent to the client as it is, so it must
// not hold anything the client may not read. Its Err (the cause) is only
// logged.
//
// The Handler answers a StatusError whose Status is not in [400, 599] with a
// 500 (and logs it). A StatusError is a plain value: safe to share once
// built, never modified by the package. The answers are docs/SPEC.md
// section 6.5.
type StatusError struct {
	// Status is the HTTP status, 400 to 599: 401 for missing or invalid
	// credentials, 403 for credentials that do not allow the stream, 503
	// when what decides cannot be reached, 404 for an unknown session.
	Status int
	// Code is the body's "code", what clients branch on (snake_case).
	// Empty: derived from Status ("unauthorized", "forbidden",
	// "service_unavailable", ...).
	Code string
	// Message is the body's "error", for people. Empty: the status text.
	Message string
	// RetryAfter, when positive, is sent as Retry-After in whole seconds
	// (rounded up): a client waits that long before it tries again. Meant
	// for 503 and 429.
	RetryAfter time.Duration
	// Challenge, when set, is sent as WWW-Authenticate, such as
	// `Bearer realm="example"`. HTTP requires one on every 401.
	Challenge string
	// Err is the cause, for logs and errors.Is/As; never sent.
	Err error
}

// Unauthorized returns a 401 StatusError with code "unauthorized": the
// request has no valid credentials. challenge is its WWW-Authenticate
// value (for example `Bearer realm="app", error="invalid_token"`), message
// its body's "error".
func Unauthorized(challenge, message string) *StatusError {
	return &StatusError{Status: http.StatusUnauthorized, Code: "unauthorized", Message: message, Challenge: challenge}
}

// Forbidden returns a 403 StatusError with code "forbidden": the
// credentials are valid but do not allow this stream.
func Forbidden(message string) *StatusError {
	return &StatusError{Status: http.StatusForbidden, Code: "forbidden", Message: message}
}

// Unavailable returns a 503 StatusError with code "unavailable" and
// Retry-After: what decides (a session store, an identity provider, a
// backplane's engine) cannot be reached now; retryAfter is rounded up to
// whole seconds, and at least one second is sent.
func Unavailable(retryAfter time.Duration, message string) *StatusError {
	return &StatusError{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: message, RetryAfter: max(retryAfter, time.Second)}
}

// Error returns "eventbus: <status> <code>: <message>", then ": <cause>"
// when Err is set.
func (e *StatusError) Error() string {
	s := "eventbus: " + strconv.Itoa(e.Status) + " " + e.code() + ": " + e.message()
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns Err.
func (e *StatusError) Unwrap() error { return e.Err }

func (e *StatusError) code() string {
	if e.Code != "" {
		return e.Code
	}
	if t := http.StatusText(e.Status); t != "" {
		return strings.ReplaceAll(strings.ToLower(t), " ", "_")
	}
	return "error"
}

func (e *StatusError) message() string {
	if e.Message != "" {
		return e.Message
	}
	if t := http.StatusText(e.Status); t != "" {
		return t
	}
	return "error"
}

// ServeHTTP answers a request with the error exactly as a Handler does:
// the status, Retry-After and WWW-Authenticate when set, and the JSON body
// {"error":...,"code":...}. Middleware in front of a Handler (another
// route of the same daemon) uses it to answer alike. It writes nothing but
// the answer and must be called before anything was written to w; a
// Status outside [400, 599] is answered as 500 internal.
func (e *StatusError) ServeHTTP(w http.ResponseWriter, _ *http.Request) { e.serve(w, "") }

// serve is ServeHTTP with the body naming session when it is not empty
// (the multiplexed stream's answers).
func (e *StatusError) serve(w http.ResponseWriter, session string) {
	if e.Status < 400 || e.Status > 599 {
		writeJSONErrorFor(w, http.StatusInternalServerError, "internal error", "internal", 0, session)
		return
	}
	h := w.Header()
	var exposed []string
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64((e.RetryAfter+time.Second-1)/time.Second), 10))
		exposed = append(exposed, "Retry-After")
	}
	if e.Challenge != "" {
		h.Set("WWW-Authenticate", e.Challenge)
		exposed = append(exposed, "WWW-Authenticate")
	}
	if exposed != nil {
		// A page of another origin (CORS) reads neither header unless it
		// is exposed, and a client must honour Retry-After.
		h.Set("Access-Control-Expose-Headers", strings.Join(exposed, ", "))
	}
	writeJSONErrorFor(w, e.Status, e.message(), e.code(), 0, session)
}

// Grant is what Handler.Authorize allows a stream: who it is for, and how
// long it may last. The zero Grant allows the stream without a subject and
// without a bound. What a stream does at the end of its lifetime and when
// it is revoked is docs/SPEC.md section 6.5.
type Grant struct {
	// Subject names whom the stream serves (a user, a token, a device):
	// Handler.Revoke(Subject) ends it. Empty: the stream cannot be revoked
	// by subject.
	Subject string
	// Expires, when not zero, is the end of the stream's lifetime, such as
	// the expiry of the token it was opened with: at Expires the stream
	// writes what is queued, then the terminal frame stream_error
	// {"errorKind":"reauthenticate"}, and ends. The client gets fresh
	// credentials and reconnects at once, resuming from its cursor: it
	// loses nothing. A time not after the moment Authorize returns is
	// answered 401 credentials_expired instead of a stream.
	Expires time.Time
}

// maxRevokedDuring bounds how many subjects a stream being authorized
// remembers as revoked meanwhile; past it, the stream counts as revoked
// whatever its subject (it then reconnects once with fresh credentials).
const maxRevokedDuring = 64

// liveStream is one stream of a Handler with Authorize, in the registry
// from before Authorize is called until the stream ends. A multiplexed
// stream is one liveStream filed under the subject of each of its grants.
type liveStream struct {
	revoked chan struct{} // closed by Revoke (or at commit), once
	// Guarded by registry.mu:
	subjects []string
	pending  bool // Authorize has not returned yet
	// extending counts the Authorize calls of sessions being added
	// (Stream.Add); the stream stays in pending while there are any.
	extending int
	during    []string // subjects revoked while pending
	all       bool     // more than maxRevokedDuring of them
	listed    bool     // in bySubject (a Revoke has not taken it out)
	// by is the subject whose Revoke closed revoked ("" when unknown: more
	// than maxRevokedDuring revoked meanwhile). Written before the close,
	// so a reader that saw revoked closed may read it without the lock.
	by string
}

// registry holds a Handler's authorized streams by subject. Its lock is
// taken when a stream opens and ends and by Revoke: never per frame.
type registry struct {
	mu        sync.Mutex
	pending   map[*liveStream]struct{}
	bySubject map[string]map[*liveStream]struct{}
}

// begin registers a stream whose Authorize is about to be called, so that
// a Revoke while it runs is not missed.
func (g *registry) begin() *liveStream {
	ls := &liveStream{revoked: make(chan struct{}), pending: true}
	g.mu.Lock()
	if g.pending == nil {
		g.pending = make(map[*liveStream]struct{})
	}
	g.pending[ls] = struct{}{}
	g.mu.Unlock()
	return ls
}

// commit files ls under each of subjects once Authorize has granted it
// (empty ones are not filed). A stream one of whose subjects was revoked
// while it was being authorized is revoked at once (its channel is closed
// and it is not filed).
func (g *registry) commit(ls *liveStream, subjects ...string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.pending, ls)
	ls.pending = false
	revokedMeanwhile := ls.all
	for _, s := range ls.during {
		if !revokedMeanwhile && slices.Contains(subjects, s) {
			revokedMeanwhile, ls.by = true, s
		}
	}
	ls.during = nil
	if revokedMeanwhile {
		close(ls.revoked)
		return
	}
	for _, subject := range subjects {
		if subject == "" || slices.Contains(ls.subjects, subject) {
			continue
		}
		g.fileLocked(ls, subject)
	}
}

// fileLocked files ls under subject, for Revoke.
func (g *registry) fileLocked(ls *liveStream, subject string) {
	if g.bySubject == nil {
		g.bySubject = make(map[string]map[*liveStream]struct{})
	}
	set := g.bySubject[subject]
	if set == nil {
		set = make(map[*liveStream]struct{})
		g.bySubject[subject] = set
	}
	set[ls] = struct{}{}
	ls.subjects = append(ls.subjects, subject)
	ls.listed = true
}

// extendBegin marks ls, a stream that is open, as being authorized for
// one more session (Stream.Add), so that a Revoke while Authorize runs is
// remembered as for a stream being opened. nil: no registry entry (no
// Authorize), nothing to do.
func (g *registry) extendBegin(ls *liveStream) {
	if ls == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.pending == nil {
		g.pending = make(map[*liveStream]struct{})
	}
	g.pending[ls] = struct{}{}
	ls.extending++
}

// extendCommit ends what extendBegin began: it files ls under subject too
// (unless it is empty) and reports true, or reports false when subject
// was revoked while Authorize ran (or the stream itself was revoked), and
// files nothing.
func (g *registry) extendCommit(ls *liveStream, subject string) bool {
	if ls == nil {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	revoked := ls.all || slices.Contains(ls.during, subject)
	if ls.extending--; ls.extending == 0 && !ls.pending {
		delete(g.pending, ls)
		ls.during, ls.all = nil, false
	}
	select {
	case <-ls.revoked:
		return false
	default:
	}
	if revoked && subject != "" {
		return false
	}
	if subject != "" && !slices.Contains(ls.subjects, subject) {
		g.fileLocked(ls, subject)
	}
	return true
}

// drop takes ls out from under subject, when the stream no longer has a
// session of that subject (Stream.Remove).
func (g *registry) drop(ls *liveStream, subject string) {
	if ls == nil || subject == "" {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	i := slices.Index(ls.subjects, subject)
	if i < 0 {
		return
	}
	ls.subjects = slices.Delete(ls.subjects, i, i+1)
	set := g.bySubject[subject]
	delete(set, ls)
	if len(set) == 0 {
		delete(g.bySubject, subject)
	}
}

// remove forgets ls, pending or filed.
func (g *registry) remove(ls *liveStream) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.pending, ls)
	g.unlistLocked(ls, "")
}

// unlistLocked takes ls out of bySubject, under every subject but skip.
func (g *registry) unlistLocked(ls *liveStream, skip string) {
	if !ls.listed {
		return
	}
	ls.listed = false
	for _, subject := range ls.subjects {
		if subject == skip {
			continue
		}
		set := g.bySubject[subject]
		delete(set, ls)
		if len(set) == 0 {
			delete(g.bySubject, subject)
		}
	}
}

// revoke ends the filed streams of subject and marks the pending ones.
func (g *registry) revoke(subject string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	for ls := range g.pending {
		if len(ls.during) < maxRevokedDuring {
			ls.during = append(ls.during, subject)
		} else {
			ls.all = true
		}
	}
	set := g.bySubject[subject]
	for ls := range set {
		g.unlistLocked(ls, subject)
		ls.by = subject
		close(ls.revoked)
	}
	delete(g.bySubject, subject)
	return len(set)
}

// Revoke ends every stream of this Handler whose Grant named subject, at
// once: each writes the terminal frame stream_error
// {"errorKind":"revoked"} and ends; frames still queued for it are not
// written. Streams of other subjects go on. It returns how many open
// streams it ended. It never blocks on a stream (it closes a channel per
// stream under the registry's lock, which no frame takes) and is safe to
// call from any goroutine, on a zero Handler too (it returns 0).
//
// The ordering rule: Revoke ends every stream of subject that is open, or
// whose Authorize call is in progress, when Revoke is called; one being
// authorized ends as soon as it is granted, before any event (it is not
// counted in the result). A request whose Authorize starts after Revoke
// returned is not affected. So make the credentials invalid first, so that
// Authorize refuses them, then call Revoke: no stream authorized with them
// survives, and a client that reconnects once with the old credentials
// gets Authorize's 401 or 403, which is final for it.
//
// Revoke covers the streams of this Handler, in this process: a daemon
// with several replicas calls it on each (through its own broadcast). The
// rule is docs/SPEC.md section 6.5.
func (h *Handler) Revoke(subject string) int { return h.reg.revoke(subject) }

// Streams that a Handler ends by itself: the message of their terminal
// stream_error frame.
const (
	lifetimeEndedMessage = "the stream's lifetime ended: reauthenticate and resume"
	revokedMessage       = "access revoked"
)
