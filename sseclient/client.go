package sseclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// DefaultInitialDelay is the backoff base until the server sends retry:.
	DefaultInitialDelay = time.Second
	// DefaultMaxDelay caps the backoff (the server's retry: when larger).
	DefaultMaxDelay = 30 * time.Second
	// DefaultIdleTimeout is how long a connection may stay silent (three of
	// the server's default 15 s heartbeats) before the client reconnects.
	DefaultIdleTimeout = 45 * time.Second
	// DefaultWebSocketRetry is how long a client stays on SSE after its
	// WebSocket failed (Client.WebSocketRetry).
	DefaultWebSocketRetry = time.Minute

	// A connection that stayed open this long, or that delivered something
	// before a plain cut, resets the backoff.
	stableAfter = 10 * time.Second
	// An immediate reconnect (re-authentication, a replay cut by the
	// server's budget) after a connection shorter than this, right after
	// another immediate one, waits for the backoff instead: a server that
	// keeps asking must not get a tight loop.
	quickConn = time.Second
	// maxErrorBody bounds what is read of a non-200 answer.
	maxErrorBody = 64 << 10
	// defaultShutdownRetryAfter is a shutdown's retryAfter when its frame
	// has none (eventbus.DefaultShutdownRetryAfter).
	defaultShutdownRetryAfter = 2 * time.Second
	// Bounds of ?maxQueued= (eventbus.MinClientMaxQueued, MaxClientMaxQueued).
	minMaxQueued, maxMaxQueued = 16, 2048
)

// CredentialsReason says why Client.Credentials is called.
type CredentialsReason string

const (
	// ReasonInitial: before the first connection of a Run.
	ReasonInitial CredentialsReason = "initial"
	// ReasonReauthenticate: a stream_error reauthenticate ended the stream
	// (its lifetime ended, e.g. a token expired).
	ReasonReauthenticate CredentialsReason = "reauthenticate"
	// ReasonRevoked: a stream_error revoked ended the stream; a 401 or 403
	// with the new credentials is final.
	ReasonRevoked CredentialsReason = "revoked"
	// ReasonUnauthorized: a 401 answer. Asked once: another 401 or 403
	// right after is final.
	ReasonUnauthorized CredentialsReason = "unauthorized"
	// ReasonForbidden: a 403 answer, likewise.
	ReasonForbidden CredentialsReason = "forbidden"
)

// Credentials are what Client.Credentials returns: headers to send, and a
// token sent as "Authorization: Bearer <token>" when not empty.
type Credentials struct {
	Header http.Header
	Token  string
}

// State is a Client's connection state.
type State int

const (
	// StateConnecting: the first attempt of a Run is under way.
	StateConnecting State = iota + 1
	// StateOpen: a stream is open (the server answered 200).
	StateOpen
	// StateReconnecting: the stream was lost or refused; the client waits
	// (Delay) or tries again.
	StateReconnecting
	// StateClosed: Run is returning (Err is its result).
	StateClosed
)

// String returns the state's name: connecting, open, reconnecting, closed.
func (s State) String() string {
	switch s {
	case StateConnecting:
		return "connecting"
	case StateOpen:
		return "open"
	case StateReconnecting:
		return "reconnecting"
	case StateClosed:
		return "closed"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// StateChange is what OnState receives.
type StateChange struct {
	State State
	// Attempt counts the attempts of this Run, 1 for the first.
	Attempt int
	// Delay is, for StateReconnecting, how long the client waits before
	// the next attempt (0: at once).
	Delay time.Duration
	// Err is what ended the previous connection or attempt, or for
	// StateClosed what Run returns.
	Err error
	// Transport is, for StateOpen, what the stream came on: "websocket"
	// (Client.WebSocket) or "sse".
	Transport string
}

// The transports a StateChange names.
const (
	TransportSSE       = "sse"
	TransportWebSocket = "websocket"
)

// Client is a resumable client of one eventbus SSE stream (docs/SPEC.md
// sections 4, 5 and 9). Run connects and reconnects until its context ends or a final
// error: it keeps the last delivered id and its epoch across reconnects
// (both id forms: "N" and "<epoch>:<N>"), resumes with them, drops
// duplicates by id, follows the server's retry:, backs off with full
// jitter, honours Retry-After on 429 and 503, and turns the synthetic
// frames into typed callbacks. A stream_error shutdown (the server is going
// away: a restart, a deploy, a replica leaving) is no failure: the client
// waits a random delay in [retryAfter, 2*retryAfter] (the frame's hint,
// capped at MaxDelay/2), resets its backoff and resumes from its cursor.
// It knows one URL: with several replicas, the load balancer in front of
// them chooses where it lands. The epoch comes from the Event-Epoch header,
// the id line, or the epoch of replay_complete and state_resync_required,
// never from application data; a frame is classified by its envelope (an
// id is an event, "about" a signal), never by its SSE event name.
//
// With Sessions it reads several sessions on one multiplexed stream
// instead (see Sessions): the same rules, per session.
//
// Set the fields, then call Run. The fields must not change while Run
// runs. Callbacks run on Run's goroutine, one at a time, in stream order; a
// callback that blocks holds the stream (the server then warns, and evicts
// or resyncs the client, which resumes). Callbacks may call the methods
// (Cursor, LastEventID, AddSession...) but not Run. The zero Client has no
// URL: Run returns an error.
type Client struct {
	// URL is the stream, e.g. "http://127.0.0.1:8080/session/demo/events".
	// Its lastEventId and epoch parameters are replaced by the client's.
	URL string
	// HTTPClient makes the requests; nil means a client of Run's own,
	// whose idle connections Run closes before it returns. Its Timeout
	// must be 0 (it would end every stream).
	HTTPClient *http.Client
	// Header is sent with every request.
	Header http.Header
	// Credentials, when set, is called before the first connection, when a
	// stream ends with stream_error reauthenticate or revoked, and on a 401
	// or 403 (once); its result is sent with every request until the next
	// call. It runs on Run's goroutine with Run's context. An error from it
	// is Run's final error.
	Credentials func(ctx context.Context, reason CredentialsReason) (Credentials, error)

	// ResumeFrom is where the first Run starts (an option, read once:
	// where the client stands later is LastEventID, the method). Empty:
	// live only. "0": from the start of the ring, everything the server
	// still holds (with Sessions: of every session's ring, each with its
	// own OnCaughtUp). On a single stream "N" or "<epoch>:<N>": after
	// that event, the form LastEventID returns (and an EventSource's
	// lastEventId); with Sessions a composite cursor, an id line of the
	// multiplexed stream or LastEventID of an earlier client (a session it
	// does not name starts live). Later Runs continue from where the
	// previous one stopped.
	ResumeFrom string
	// ResumeEpoch is, on a single stream, the epoch ResumeFrom's id belongs
	// to when ResumeFrom is the plain form "N" (empty: unknown; the
	// server then cannot tell an id of another epoch). Not with Sessions.
	ResumeEpoch string

	// RetryNotFound is how long a 404 session_not_found is retried, with
	// backoff, before it is final: from the first 404 after the last
	// stream that opened (or the start). 0: a 404 is final at once (on a
	// multiplexed stream: the session it names is dropped). For daemons
	// whose sessions come back: after a restart a session is unknown until
	// something re-creates it (a publish, in the README's daemon), and the
	// client resumes it then (epoch_reset). On a multiplexed stream the
	// server refuses the whole request while one session is unknown, so
	// the other sessions wait too: keep it short there.
	RetryNotFound time.Duration

	// MaxQueued is sent as ?maxQueued= (16 to 2048); 0 sends none.
	MaxQueued int
	// Types is sent as ?types= (exact types or trailing wildcards).
	Types []string

	// MaxEventBytes bounds one event; 0 means DefaultMaxEventBytes. An
	// event above it is Run's final error (ErrEventTooLarge): a reconnect
	// would meet it again.
	MaxEventBytes int
	// InitialDelay is the backoff base until the server sends retry:
	// (which replaces it); 0 means DefaultInitialDelay.
	InitialDelay time.Duration
	// MaxDelay caps the backoff (the server's retry: when that is larger)
	// and the wait after a stream_error shutdown (whose retryAfter it caps
	// at MaxDelay/2); 0 means DefaultMaxDelay.
	MaxDelay time.Duration
	// IdleTimeout: a connection on which nothing (not even a heartbeat)
	// arrives for this long is dropped and resumed; 0 means
	// DefaultIdleTimeout. Time spent in callbacks does not count.
	IdleTimeout time.Duration

	// OnEvent receives each published event once, in id order.
	OnEvent func(Event)
	// OnSignal receives signals (change notifications).
	OnSignal func(Signal)
	// OnCaughtUp receives replay_complete after a resume.
	OnCaughtUp func(CaughtUp)
	// OnResync is told that events were lost; refetch.
	OnResync func(Resync)
	// OnSlow receives slow_client_warning.
	OnSlow func(SlowWarning)
	// OnEvicted receives client_evicted; the client then reconnects with
	// backoff and resumes.
	OnEvicted func(Eviction)
	// OnState receives every state change, and each new wait.
	OnState func(StateChange)
	// OnError receives every error Run recovers from: *HTTPError,
	// *StreamError, connection failures, ErrStreamCut (the response ended
	// without a terminal frame, or the connection failed), ErrIdleTimeout,
	// ErrProtocol. Run's final error is its result (and StateClosed's Err).
	// Error strings name the stream's URL without its query (which holds
	// the cursor).
	OnError func(error)

	// Sessions, when set, makes the client read these sessions on one
	// multiplexed stream (eventbus.MuxHandler): URL is its route, e.g.
	// "http://127.0.0.1:8080/events", to which the client adds one
	// session=<id> parameter per session, in order (its session
	// parameters are replaced). Every callback's value then names its
	// session (Event.Session...), each session is resumed, deduplicated
	// and epoch-checked on its own, and the client sends the composite
	// cursor of them all (LastEventID) as ?lastEventId=. A session the
	// server says is gone (a 404 session_not_found naming it, past
	// RetryNotFound, or a stream_error "closed" for it: deleted) is
	// dropped from the URL and reported to OnSessionGone, never retried;
	// when none is left Run returns ErrNoSessions. Sessions is read once,
	// by the first Run (or AddSession, RemoveSession): from then on the
	// client streams ActiveSessions, which AddSession, RemoveSession and
	// gone sessions change, across Runs too. At most 256 distinct ids,
	// each 1 to 256 bytes of valid UTF-8 (the server's session id rule;
	// its own bound, 32 sessions by default, answers 400). ResumeEpoch
	// must not be set with it.
	Sessions []string
	// OnSessionGone is told that a session of the stream is gone and was
	// dropped from it.
	OnSessionGone func(SessionGone)

	// WebSocket, when set (with Sessions), makes the client read the
	// multiplexed stream over a WebSocket first (docs/SPEC.md 6.10), at
	// WebSocketURL, and over SSE at URL as the fallback: when the
	// WebSocket cannot be opened for a reason that is not the server's
	// answer (a connection or handshake failure, a proxy's status without
	// the server's JSON error), or is cut before its first message, the
	// next connection is SSE at once, and SSE it stays for
	// WebSocketRetry; then the client ends the SSE stream and tries the
	// WebSocket again (falling back at once should it still fail). One
	// cursor serves both: a client that falls back, or back, loses no
	// event and sees none twice. The server's answers (401, 403, 404, 429,
	// 503...) count the same on either transport. On an open WebSocket,
	// AddSession and RemoveSession change the stream's sessions in place,
	// without reconnecting. nil: SSE only. The package imports no
	// WebSocket library: github.com/ssebus/eventbus/websocket's Dialer is
	// one.
	WebSocket WebSocketDialer
	// WebSocketURL is the WebSocket route, e.g. "ws://127.0.0.1:8080/ws"
	// (ws or wss): the client sets its session, lastEventId, types and
	// maxQueued parameters, as on URL. Required with WebSocket.
	WebSocketURL string
	// WebSocketRetry is how long the client stays on SSE after the
	// WebSocket failed; 0 means DefaultWebSocketRetry.
	WebSocketRetry time.Duration

	running atomic.Bool

	mu      sync.Mutex // guards the positions below, for Cursor and the multiplexed accessors
	started bool       // the cursor fields have been read
	pos     position   // a single stream's
	mux     *muxState  // a multiplexed stream's, from its first Run (or AddSession, RemoveSession) on
	// restart ends the current connection (nil between connections), for
	// AddSession and RemoveSession.
	restart context.CancelCauseFunc
}

// position is where a client stands in one sequence of events: a single
// stream, or one session of a multiplexed stream. Its cursor fields are
// guarded by Client.mu; the per-connection fields belong to Run.
type position struct {
	session   string // "" on a single stream
	epoch     string // the epoch of cursor, or of the stream without one; "" unknown
	cursor    uint64
	hasCursor bool
	epochForm bool // single stream: the server last sent ids as <epoch>:<N>
	// tag is, on a multiplexed stream, the epoch's tag in the composite
	// cursor (EpochTag of epoch when that is known): with hasCursor, what
	// the next connection resumes from.
	tag uint64
	mux bool

	// Per connection (Run's goroutine only).
	streamEpoch string // the epoch the server's headers or id lines gave
	replaying   bool   // resumed: until its replay_complete
	budgetCut   bool   // its replay was cut by the server's budget
}

// unknownEpoch reports whether p's epoch is not known at all: no epoch,
// and on a multiplexed stream no tag of one either.
func (p *position) unknownEpoch() bool { return p.epoch == "" && !(p.mux && p.hasCursor) }

// is reports whether e is p's epoch (on a multiplexed stream, the epoch
// of its tag when the full epoch is not known).
func (p *position) is(e string) bool {
	if p.epoch != "" || !p.mux {
		return e == p.epoch
	}
	return p.hasCursor && epochTag(e) == p.tag
}

// setEpoch sets p's epoch (and its tag).
func (p *position) setEpoch(e string) {
	p.epoch = e
	if e != "" {
		p.tag = epochTag(e)
	}
}

// Cursor returns where the client stands on a single stream: the epoch of
// the last delivered event (empty while unknown) and its id, with ok false
// when it has none (a live-only start before any event). On a multiplexed
// stream (Sessions) it reports none: see SessionCursor. It is safe to call
// from any goroutine, also while Run runs.
func (c *Client) Cursor() (epoch string, lastEventID uint64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pos.epoch, c.pos.cursor, c.pos.hasCursor
}

// LastEventID returns where the client stands, in the form ResumeFrom
// takes, to persist and resume from in a later client: what the next
// connection resumes from, as EventSource.lastEventId is in a browser. On
// a single stream "<epoch>:<N>" ("N" while the epoch is unknown; "0" for a
// start from the beginning before any event); on a multiplexed stream the
// composite cursor of the sessions streamed that have a position (the
// sessions gone or removed left out: the server refuses a cursor of more
// entries than its bound), "0" while a start from the beginning has given
// none a position yet. "" when the client has none: a live start before
// any event. Safe to call from any goroutine, also while Run runs; before
// the first Run it reports ResumeFrom as the client will read it.
func (c *Client) LastEventID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.Sessions) > 0 || c.mux != nil {
		if c.mux == nil {
			return c.ResumeFrom
		}
		return c.mux.lastEventID()
	}
	if !c.started {
		return c.ResumeFrom
	}
	p := &c.pos
	if !p.hasCursor {
		return ""
	}
	id := strconv.FormatUint(p.cursor, 10)
	if p.epoch != "" {
		return p.epoch + ":" + id
	}
	return id
}

// cursorOf returns p's cursor fields under the client's lock.
func (c *Client) cursorOf(p *position) (epoch string, id uint64, has bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return p.epoch, p.cursor, p.hasCursor
}

func (c *Client) setCursor(p *position, epoch string, id uint64, has bool) {
	c.mu.Lock()
	p.setEpoch(epoch)
	p.cursor, p.hasCursor = id, has
	c.mu.Unlock()
}

// Run streams until ctx is done (it then returns ctx.Err()) or a final
// error: a 400, 404, or other 4xx than 408, 425 and 429 (*HTTPError; a 404
// session_not_found only once RetryNotFound has passed); a 401 or 403
// without Credentials, or right after fresh ones; a response that is not
// an event stream (ErrNotEventStream); an event above MaxEventBytes
// (ErrEventTooLarge); an error from Credentials; an invalid field
// (ErrInvalidOption); on a single stream a stream_error closed (a
// *StreamError: the session was deleted); with Sessions, every session
// gone (ErrNoSessions: a 404 naming one of them, or its stream_error
// closed, drops it and the stream goes on; it is not final). A session
// that is gone, a 404 session_not_found or a stream_error closed, is an
// error for which errors.Is(err, ErrSessionGone) holds. Everything else
// it recovers from, reporting it through OnError. Run blocks; when it
// returns, every goroutine and
// connection it started has ended (with a caller's HTTPClient, its idle
// connections stay in its pool). Run must not be called again while it
// runs (it returns ErrRunning).
func (c *Client) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer c.running.Store(false)
	base, err := c.validate()
	if err != nil {
		return err
	}
	c.mu.Lock()
	if !c.started {
		c.started = true
		if len(c.Sessions) == 0 && c.ResumeFrom != "" {
			e, id, _ := ParseEventID(c.ResumeFrom) // validated
			c.pos.epochForm = e != ""
			if e == "" {
				e = c.ResumeEpoch
			}
			c.pos.epoch, c.pos.cursor, c.pos.hasCursor = e, id, true
		}
	}
	var mux *muxState
	if len(c.Sessions) > 0 || c.mux != nil {
		mux = c.muxState()
	}
	none := mux != nil && len(mux.want) == 0
	c.mu.Unlock()
	if none {
		return ErrNoSessions
	}
	hc := c.HTTPClient
	if hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		hc = &http.Client{Transport: tr}
		defer tr.CloseIdleConnections()
	}
	r := &run{
		c:         c,
		ctx:       ctx,
		hc:        hc,
		base:      base,
		initial:   orDefault(c.InitialDelay, DefaultInitialDelay),
		maxDelay:  orDefault(c.MaxDelay, DefaultMaxDelay),
		idle:      orDefault(c.IdleTimeout, DefaultIdleTimeout),
		maxEvent:  c.MaxEventBytes,
		lastRetry: -1,
		mux:       mux,
	}
	if c.WebSocket != nil {
		r.wsBase, _ = url.Parse(c.WebSocketURL) // validated
		c.setQuery(r.wsBase)
	}
	return r.loop()
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

func (c *Client) validate() (*url.URL, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return nil, bad("URL: %v", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, bad("URL %q is not http or https", c.URL)
	}
	switch {
	case c.MaxQueued != 0 && (c.MaxQueued < minMaxQueued || c.MaxQueued > maxMaxQueued):
		return nil, bad("MaxQueued %d outside [%d, %d]", c.MaxQueued, minMaxQueued, maxMaxQueued)
	case c.MaxEventBytes < 0:
		return nil, bad("negative MaxEventBytes %d", c.MaxEventBytes)
	case c.InitialDelay < 0 || c.MaxDelay < 0 || c.IdleTimeout < 0:
		return nil, bad("negative InitialDelay, MaxDelay or IdleTimeout")
	case c.ResumeEpoch != "" && !validEpoch(c.ResumeEpoch):
		return nil, bad("ResumeEpoch %q is not 32 lowercase hex digits", c.ResumeEpoch)
	case c.RetryNotFound < 0:
		return nil, bad("negative RetryNotFound")
	case c.HTTPClient != nil && c.HTTPClient.Timeout != 0:
		return nil, bad("HTTPClient.Timeout %v would end every stream", c.HTTPClient.Timeout)
	}
	for _, t := range c.Types {
		if t == "" || strings.Contains(t, ",") {
			return nil, bad("type filter %q is empty or holds a comma", t)
		}
	}
	if len(c.Sessions) == 0 && c.ResumeFrom != "" {
		e, _, ok := ParseEventID(c.ResumeFrom)
		switch {
		case !ok:
			return nil, bad("ResumeFrom %q is not N or <epoch>:<N> (a composite cursor needs Sessions)", head(c.ResumeFrom))
		case e != "" && c.ResumeEpoch != "" && e != c.ResumeEpoch:
			return nil, bad("ResumeFrom's epoch and ResumeEpoch differ")
		}
	}
	if err := c.validateMux(); err != nil {
		return nil, bad("%v", err)
	}
	if c.WebSocket != nil || c.WebSocketURL != "" {
		wu, err := url.Parse(c.WebSocketURL)
		switch {
		case c.WebSocket == nil || len(c.Sessions) == 0:
			return nil, bad("WebSocket and WebSocketURL go together, with Sessions")
		case err != nil || (wu.Scheme != "ws" && wu.Scheme != "wss"):
			return nil, bad("WebSocketURL %q is not ws or wss", head(c.WebSocketURL))
		case c.WebSocketRetry < 0:
			return nil, bad("negative WebSocketRetry")
		}
	}
	c.setQuery(u)
	return u, nil
}

// setQuery sets the client's parameters in u's query: its maxQueued and
// types; no lastEventId, epoch or (with Sessions) session, which each
// connection sets.
func (c *Client) setQuery(u *url.URL) {
	q := u.Query()
	q.Del("lastEventId")
	q.Del("epoch")
	if len(c.Sessions) > 0 {
		q.Del("session") // the client's own, at each connection
	}
	if c.MaxQueued != 0 {
		q.Set("maxQueued", strconv.Itoa(c.MaxQueued))
	}
	if len(c.Types) > 0 {
		q.Set("types", strings.Join(c.Types, ","))
	}
	u.RawQuery = q.Encode()
}

// run is the state of one Run.
type run struct {
	c        *Client
	ctx      context.Context
	hc       *http.Client
	base     *url.URL
	initial  time.Duration
	maxDelay time.Duration
	idle     time.Duration
	maxEvent int

	lastRetry     time.Duration // the server's retry:, -1 before any
	failures      int
	lastImmediate bool
	authFinal     bool // fresh credentials were just fetched: a 401/403 now is final
	creds         Credentials
	attempt       int
	mux           *muxState // nil on a single stream
	// notFoundSince is the first 404 session_not_found since the last
	// stream that opened (zero: none), for RetryNotFound.
	notFoundSince time.Time
	// wsBase is the WebSocket route with the client's parameters, nil
	// without Client.WebSocket; sseUntil is when the client tries it again
	// after it failed (zero: now).
	wsBase   *url.URL
	sseUntil time.Time
}

// how a connection ended
type end int

const (
	endNetwork end = iota + 1 // could not connect
	endHTTP                   // a non-200 answer
	endFatal                  // stop
	endCut                    // an open stream ended without a terminal frame
	endIdle                   // an open stream was silent for IdleTimeout
	endBudget                 // the replay was cut by the server's budget: resume at once
	endEvicted
	endStreamError
	endCancelled
	endGone     // a session of a multiplexed stream is gone: reconnect at once without it
	endRestart  // AddSession or RemoveSession: reconnect at once with the new list
	endFallback // the WebSocket failed (not the server's answer): SSE at once
)

type result struct {
	end        end
	err        error
	opened     bool
	openedAt   time.Time
	delivered  bool
	kind       string        // errorKind of a stream_error
	retryAfter time.Duration // of a stream_error shutdown
	status     int
	httpErr    *HTTPError
	// notFound: a 404 session_not_found within RetryNotFound, retried
	// with backoff (wait caps the delay at what is left of it).
	notFound bool
	wait     time.Duration
}

func (r *run) state(s State, delay time.Duration, err error) {
	if f := r.c.OnState; f != nil {
		f(StateChange{State: s, Attempt: r.attempt, Delay: delay, Err: err})
	}
}

// stateOpen reports StateOpen on transport.
func (r *run) stateOpen(transport string) {
	if f := r.c.OnState; f != nil {
		f(StateChange{State: StateOpen, Attempt: r.attempt, Transport: transport})
	}
}

func (r *run) report(err error) {
	if f := r.c.OnError; f != nil {
		f(err)
	}
}

func (r *run) stop(err error) error {
	r.state(StateClosed, 0, err)
	return err
}

func (r *run) loop() error {
	if r.c.Credentials != nil {
		if err := r.refresh(ReasonInitial); err != nil {
			return r.stop(err)
		}
	}
	for {
		r.attempt++
		if r.attempt == 1 {
			r.state(StateConnecting, 0, nil)
		}
		res := r.connect()
		if err := r.ctx.Err(); err != nil {
			return r.stop(err)
		}
		next := r.decide(res)
		if next.final != nil {
			return r.stop(next.final)
		}
		if res.err != nil {
			r.report(res.err)
		}
		if next.refresh != "" {
			if err := r.refresh(next.refresh); err != nil {
				return r.stop(err)
			}
		}
		r.state(StateReconnecting, next.delay, res.err)
		if delay := next.delay; delay > 0 {
			t := time.NewTimer(delay)
			select {
			case <-r.ctx.Done():
				t.Stop()
				return r.stop(r.ctx.Err())
			case <-t.C:
			}
		}
	}
}

func (r *run) refresh(reason CredentialsReason) error {
	cr, err := r.c.Credentials(r.ctx, reason)
	if err != nil {
		if r.ctx.Err() != nil {
			return r.ctx.Err()
		}
		return fmt.Errorf("sseclient: credentials (%s): %w", reason, err)
	}
	r.creds = cr
	return nil
}

// step is what follows a connection: a final error, or credentials to
// fetch (when refresh is set) and a delay before the next attempt.
type step struct {
	final   error
	refresh CredentialsReason
	delay   time.Duration
}

// decide turns how a connection ended into the next step.
func (r *run) decide(res result) step {
	immediate := func(reason CredentialsReason) step {
		quick := time.Since(res.openedAt) < quickConn
		was := r.lastImmediate
		r.lastImmediate = true
		if r.c.Credentials == nil {
			reason = "" // the application refreshes a cookie itself
		}
		if quick && was {
			return step{refresh: reason, delay: r.backoff(false)}
		}
		return step{refresh: reason}
	}
	switch res.end {
	case endFatal:
		return step{final: res.err}
	case endGone:
		// Each one drops a session, so this repeats at most once per
		// session of the URL.
		r.lastImmediate = false
		return step{}
	case endRestart:
		return step{}
	case endFallback:
		r.lastImmediate = false
		return step{}
	case endHTTP:
		r.lastImmediate = false
		s := res.status
		switch {
		case res.notFound:
			return step{delay: min(r.backoff(false), res.wait)}
		case s == http.StatusUnauthorized || s == http.StatusForbidden:
			if r.c.Credentials == nil || r.authFinal {
				return step{final: res.err}
			}
			r.authFinal = true
			if s == http.StatusForbidden {
				return step{refresh: ReasonForbidden}
			}
			return step{refresh: ReasonUnauthorized}
		case (s == http.StatusTooManyRequests || s == http.StatusServiceUnavailable) && res.httpErr.HasRetryAfter:
			r.backoff(false)
			ra := res.httpErr.RetryAfter
			return step{delay: ra + rand.N(ra/4+1)}
		case s >= 500 || s == http.StatusRequestTimeout || s == http.StatusTooEarly || s == http.StatusTooManyRequests:
			return step{delay: r.backoff(false)}
		}
		return step{final: res.err}
	}
	if !res.opened {
		r.lastImmediate = false
		return step{delay: r.backoff(false)}
	}
	switch {
	case res.end == endBudget:
		return immediate("")
	case res.end == endStreamError && res.kind == "reauthenticate":
		return immediate(ReasonReauthenticate)
	case res.end == endStreamError && res.kind == "revoked":
		st := immediate(ReasonRevoked)
		r.authFinal = true
		return st
	case res.end == endStreamError && res.kind == kindShutdown:
		// The server is going away, not failing: the next attempt starts
		// the backoff afresh (a daemon restarting refuses it a while).
		r.lastImmediate = false
		r.failures = 0
		return step{delay: r.shutdownDelay(res.retryAfter)}
	}
	r.lastImmediate = false
	stable := time.Since(res.openedAt) >= stableAfter || (res.end == endCut && res.delivered)
	return step{delay: r.backoff(stable)}
}

// backoff is full-jitter exponential backoff: a uniform delay in [0, cap),
// cap doubling with each failure since the last stable connection, from the
// server's retry: (or InitialDelay) up to MaxDelay (or the server's retry:
// when that is larger).
func (r *run) backoff(stable bool) time.Duration {
	if stable {
		r.failures = 0
	}
	r.failures++
	base := r.initial
	if r.lastRetry >= 0 {
		base = r.lastRetry
	}
	limit := max(r.maxDelay, base)
	capd := base
	for i := 1; i < r.failures && capd < limit; i++ {
		capd *= 2
	}
	capd = min(capd, limit)
	if capd <= 0 {
		return 0
	}
	return rand.N(capd)
}

// shutdownDelay is the wait after a stream_error shutdown: uniform in
// [ra, 2*ra], with ra the server's retryAfter capped at half of MaxDelay, so
// that the clients of a replica that leaves come back spread out, never
// later than MaxDelay.
func (r *run) shutdownDelay(retryAfter time.Duration) time.Duration {
	ra := min(retryAfter, r.maxDelay/2)
	if ra <= 0 {
		return 0
	}
	return ra + rand.N(ra+1)
}

func (r *run) url() string {
	if r.mux != nil {
		return r.mux.url(r.c, r.base)
	}
	u := *r.base
	r.c.mu.Lock()
	p := &r.c.pos
	epoch, cursor, has, form := p.epoch, p.cursor, p.hasCursor, p.epochForm
	r.c.mu.Unlock()
	if has {
		q := u.Query()
		id := strconv.FormatUint(cursor, 10)
		if form && epoch != "" {
			id = epoch + ":" + id
		}
		q.Set("lastEventId", id)
		if epoch != "" {
			q.Set("epoch", epoch)
		}
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// conn is the state of one open stream.
type conn struct {
	res  *result
	stop end
}

// errSessionsChanged is the cause with which AddSession and
// RemoveSession end a connection.
var errSessionsChanged = errors.New("sseclient: the sessions changed")

// errBackToWebSocket is the cause with which an SSE connection of a client
// with a WebSocket ends once WebSocketRetry has passed: the next
// connection tries the WebSocket again.
var errBackToWebSocket = errors.New("sseclient: back to the WebSocket")

// connect makes one attempt and, when the server answers 200, reads the
// stream to its end. A connection that AddSession or RemoveSession ended
// is endRestart, reported as nothing.
func (r *run) connect() result {
	ctx, cancel := context.WithCancelCause(r.ctx)
	defer cancel(nil)
	if r.mux != nil {
		r.c.mu.Lock()
		r.c.restart = cancel
		r.c.mu.Unlock()
		defer func() {
			r.c.mu.Lock()
			r.c.restart = nil
			r.c.mu.Unlock()
		}()
	}
	var res result
	switch {
	case r.wsBase == nil:
		res = r.attempt1(ctx, cancel)
	case !time.Now().Before(r.sseUntil):
		res = r.attemptWS(ctx, cancel)
	default:
		// SSE until WebSocketRetry has passed, then the WebSocket again:
		// this connection ends then, and the next resumes from the cursor.
		back := time.AfterFunc(time.Until(r.sseUntil), func() { cancel(errBackToWebSocket) })
		res = r.attempt1(ctx, cancel)
		back.Stop()
	}
	if r.ctx.Err() == nil && res.end != endFatal && res.end != endGone && (errors.Is(context.Cause(ctx), errSessionsChanged) || errors.Is(context.Cause(ctx), errBackToWebSocket)) {
		return result{end: endRestart, opened: res.opened, openedAt: res.openedAt, delivered: res.delivered}
	}
	return res
}

// attempt1 is connect's attempt, under ctx.
func (r *run) attempt1(ctx context.Context, cancel context.CancelCauseFunc) (res result) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url(), nil)
	if err != nil {
		return result{end: endFatal, err: fmt.Errorf("sseclient: %w", err)}
	}
	for k, v := range r.c.Header {
		req.Header[k] = v
	}
	for k, v := range r.creds.Header {
		req.Header[k] = v
	}
	if r.creds.Token != "" {
		req.Header.Set("Authorization", "Bearer "+r.creds.Token)
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Cache-Control", "no-cache")
	resp, err := r.hc.Do(req)
	if err != nil {
		return result{end: endNetwork, err: fmt.Errorf("sseclient: connect: %w", redactURL(err))}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		if resp.StatusCode == http.StatusNoContent {
			return result{end: endFatal, err: fmt.Errorf("%w: 204 No Content", ErrNotEventStream)}
		}
		return r.refused(httpError(resp))
	}
	if mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type")); err != nil || mt != "text/event-stream" {
		return result{end: endFatal, err: fmt.Errorf("%w: Content-Type %q", ErrNotEventStream, resp.Header.Get("Content-Type"))}
	}

	r.authFinal = false
	r.notFoundSince = time.Time{}
	res = result{opened: true, openedAt: time.Now()}
	cn := &conn{res: &res}
	r.c.mu.Lock()
	if r.mux != nil {
		r.mux.opened(resp.Header.Get("Event-Epochs"))
	} else {
		r.c.pos.opened(resp.Header.Get("Event-Epoch"))
	}
	r.c.mu.Unlock()
	r.stateOpen(TransportSSE)

	body := &idleReader{rd: resp.Body, d: r.idle, fire: func() { cancel(ErrIdleTimeout) }}
	defer body.stop()
	p := NewParser(body)
	p.MaxEventBytes = r.maxEvent
	for {
		m, err := p.Next()
		if err != nil {
			switch {
			case errors.Is(err, ErrEventTooLarge):
				res.end, res.err = endFatal, fmt.Errorf("%w; raise MaxEventBytes", err)
			case r.ctx.Err() != nil:
				res.end = endCancelled
			case context.Cause(ctx) == ErrIdleTimeout:
				res.end, res.err = endIdle, ErrIdleTimeout
			case err == io.EOF:
				res.end, res.err = endCut, fmt.Errorf("%w: the response ended", ErrStreamCut)
			default:
				res.end, res.err = endCut, fmt.Errorf("%w: %w", ErrStreamCut, redactURL(err))
			}
			return res
		}
		switch m.Kind {
		case KindRetry:
			r.lastRetry = m.Retry
		case KindEvent:
			r.frame(m, cn)
		}
		if cn.stop != 0 {
			res.end = cn.stop
			return res
		}
	}
}

// refused is how a connection the server answered with he ends: the
// server's word, whichever the transport.
func (r *run) refused(he *HTTPError) result {
	res := result{end: endHTTP, err: he, status: he.StatusCode, httpErr: he}
	if he.StatusCode == http.StatusNotFound && he.Code == "session_not_found" {
		if r.mux != nil && !r.mux.active(he.Session) {
			return res // not about a session of the stream: final
		}
		if wait := r.notFoundWait(); wait > 0 {
			res.notFound, res.wait = true, wait
			return res
		}
		if r.mux != nil {
			return r.gone(he.Session, "session_not_found", he)
		}
	}
	return res
}

// notFoundWait returns how much of RetryNotFound is left since the first
// 404 session_not_found after the last stream that opened (starting that
// window at the first), 0 when none is: the 404 is then final.
func (r *run) notFoundWait() time.Duration {
	if r.c.RetryNotFound <= 0 {
		return 0
	}
	if r.notFoundSince.IsZero() {
		r.notFoundSince = time.Now()
	}
	return max(0, r.c.RetryNotFound-time.Since(r.notFoundSince))
}

// redactURL takes the query (the cursor, the sessions) out of the URL an
// error of net/http names, so that error strings do not carry the
// client's position: "Get \"http://host/events?...\": ...". It returns
// err, to wrap.
func redactURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		if i := strings.IndexByte(ue.URL, '?'); i >= 0 {
			ue.URL = ue.URL[:i] + "?..."
		}
	}
	return err
}

// head is s cut to 64 bytes, for an error message.
func head(s string) string { return s[:min(len(s), 64)] }

// opened starts a connection of p, under the client's lock: it is
// replaying when it has a cursor, and takes in the stream's epoch, e (the
// header's: "" when there is none).
func (p *position) opened(e string) {
	p.replaying, p.budgetCut, p.streamEpoch = p.hasCursor, false, ""
	if validEpoch(e) {
		p.streamEpoch = e
		// Only a client without a position adopts the header's epoch at
		// once; with a cursor, the first frame says whether the server
		// accepted it (an epoch_reset says it did not).
		if !p.hasCursor {
			p.setEpoch(e)
		}
	}
}

func httpError(resp *http.Response) *HTTPError {
	he := &HTTPError{StatusCode: resp.StatusCode}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var j struct {
		Error   string `json:"error"`
		Code    string `json:"code"`
		Session string `json:"session"`
	}
	if json.Unmarshal(body, &j) == nil {
		he.Code, he.Message, he.Session = j.Code, j.Error, j.Session
	}
	if he.Message == "" {
		he.Message = http.StatusText(resp.StatusCode)
	}
	he.RetryAfter, he.HasRetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	he.Challenge = resp.Header.Get("WWW-Authenticate")
	return he
}

// parseRetryAfter reads Retry-After: delta-seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(s) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, t.Sub(now)), true
	}
	return 0, false
}

// idleReader cancels the request when one Read waits longer than d: time
// between Reads (spent in callbacks) does not count.
type idleReader struct {
	rd   io.Reader
	d    time.Duration
	fire func()
	t    *time.Timer
}

func (ir *idleReader) Read(b []byte) (int, error) {
	if ir.t == nil {
		ir.t = time.AfterFunc(ir.d, ir.fire)
	} else {
		ir.t.Reset(ir.d)
	}
	n, err := ir.rd.Read(b)
	ir.t.Stop()
	return n, err
}

func (ir *idleReader) stop() {
	if ir.t != nil {
		ir.t.Stop()
	}
}

func (r *run) protocol(format string, args ...any) {
	r.report(fmt.Errorf("%w: "+format, append([]any{ErrProtocol}, args...)...))
}

// frame handles one SSE event by its JSON envelope: an id makes it an
// application event, "about" a signal, anything else a synthetic frame.
// The SSE event name is never trusted: a publisher may use any type,
// "replay_complete" included. On a multiplexed stream the envelope's
// "session" says whose position it moves.
func (r *run) frame(m Message, cn *conn) {
	var env envelope
	if err := json.Unmarshal(m.Data, &env); err != nil || env.Type == "" {
		r.protocol("a frame that is not an event envelope: %.64q", m.Data)
		return
	}
	p := &r.c.pos
	if r.mux != nil {
		if p = r.mux.of(env.Session); p == nil {
			if p = r.adopt(env.Session); p == nil {
				r.protocol("a frame of no session of the stream: %.64q", m.Data)
				return
			}
		}
	}
	if env.ID != nil {
		r.event(p, &env, m, cn)
		return
	}
	if env.About != nil {
		if p.budgetCut {
			return
		}
		cn.res.delivered = true
		if f := r.c.OnSignal; f != nil {
			f(Signal{Session: p.session, Type: env.Type, About: *env.About, Meta: env.Meta, ServerTimestamp: serverTimestamp(env.Meta)})
		}
		return
	}
	switch env.Type {
	case TypeReplayComplete:
		var d CaughtUp
		if !r.decode(env, &d) {
			return
		}
		r.observeEpoch(p, d.Epoch, 0, false)
		p.replaying = false
		if r.mux != nil {
			r.mux.caughtUp(r.c, p)
		}
		if p.budgetCut {
			// Resume at once from the cursor, once no other session's
			// replay is still under way.
			if r.mux == nil || !r.mux.replaying() {
				cn.stop = endBudget
			}
			return
		}
		if r.mux != nil && r.mux.budgetCut() && !r.mux.replaying() {
			cn.stop = endBudget
		}
		cn.res.delivered = true
		d.Epoch, _, _ = r.c.cursorOf(p)
		d.Session = p.session
		if f := r.c.OnCaughtUp; f != nil {
			f(d)
		}
	case TypeStateResyncRequired:
		var d resyncData
		if r.decode(env, &d) {
			r.resync(p, d)
		}
	case TypeSlowClientWarning:
		var d SlowWarning
		if r.decode(env, &d) && r.c.OnSlow != nil {
			d.Session = p.session
			r.c.OnSlow(d)
		}
	case TypeClientEvicted:
		var d Eviction
		r.decode(env, &d)
		d.Session = p.session
		cn.stop = endEvicted
		if f := r.c.OnEvicted; f != nil {
			f(d)
		}
	case TypeStreamError:
		var d streamErrorData
		r.decode(env, &d)
		if d.ErrorKind == "" {
			d.ErrorKind = "internal"
		}
		se := &StreamError{Session: p.session, Kind: d.ErrorKind, Message: d.Error}
		if d.ErrorKind == kindClosed {
			if r.mux == nil {
				// The session is gone (deleted): final, never resumed.
				cn.stop, cn.res.err = endFatal, se
				return
			}
			// This session is gone (deleted); the others go on.
			if res := r.gone(p.session, kindClosed, se); res.end != endGone {
				cn.stop = res.end
				cn.res.err = res.err
			}
			return
		}
		if d.ErrorKind == kindShutdown {
			se.RetryAfter = retryAfterMillis(d.RetryAfter)
		}
		cn.stop = endStreamError
		cn.res.kind, cn.res.retryAfter = d.ErrorKind, se.RetryAfter
		cn.res.err = se
	}
	// Any other id-less type: a synthetic frame of a newer server, skipped.
}

// retryAfterMillis reads a shutdown's retryAfter: milliseconds, at most a
// day (a larger hint is capped by MaxDelay anyway);
// defaultShutdownRetryAfter when absent, negative or not a number.
func retryAfterMillis(ms *float64) time.Duration {
	if ms == nil || !(*ms >= 0) {
		return defaultShutdownRetryAfter
	}
	return time.Duration(min(*ms, float64(24*time.Hour/time.Millisecond)) * float64(time.Millisecond))
}

func (r *run) decode(env envelope, v any) bool {
	if env.Data == nil {
		return true
	}
	if err := json.Unmarshal(env.Data, v); err != nil {
		r.protocol("%s data: %v", env.Type, err)
		return false
	}
	return true
}

func (r *run) event(p *position, env *envelope, m Message, cn *conn) {
	id, err := env.id()
	if err != nil {
		r.report(err)
		return
	}
	shown := p.streamEpoch
	switch {
	case r.mux != nil:
		var changed *Resync
		if shown, changed = r.mux.event(r.c, p, m, id); changed != nil && r.c.OnResync != nil {
			r.c.OnResync(*changed)
		}
	case m.HasID:
		// The id line agrees with the envelope: its form (and epoch) count.
		if e, n, ok := ParseEventID(m.ID); ok && n == id {
			r.c.mu.Lock()
			p.epochForm = e != ""
			r.c.mu.Unlock()
			if e != "" {
				p.streamEpoch, shown = e, e
			}
		}
	}
	r.observeEpoch(p, shown, id, true)
	if p.budgetCut {
		return
	}
	epoch, cursor, has := r.c.cursorOf(p)
	if has && id <= cursor {
		return // a duplicate
	}
	r.c.setCursor(p, epoch, id, true)
	cn.res.delivered = true
	if f := r.c.OnEvent; f != nil {
		f(Event{
			Session:            p.session,
			ID:                 id,
			Epoch:              epoch,
			Type:               env.Type,
			Data:               env.Data,
			Meta:               env.Meta,
			ServerTimestamp:    serverTimestamp(env.Meta),
			OriginatorClientID: env.OriginatorClientID,
			Replayed:           p.replaying,
		})
	}
}

// observeEpoch takes in the epoch a frame of p shows. An epoch that
// differs from the cursor's without an epoch_reset first means the server
// did not see (or ignored) the client's epoch: the client resets itself
// and says so. firstID is the id of the event that showed it, when
// isEvent.
func (r *run) observeEpoch(p *position, e string, firstID uint64, isEvent bool) {
	if !validEpoch(e) {
		return
	}
	r.c.mu.Lock()
	epoch, cursor, has, same, unknown := p.epoch, p.cursor, p.hasCursor, p.is(e), p.unknownEpoch()
	if same || unknown || !has {
		p.setEpoch(e) // the epoch itself, where the client knew its tag only
	}
	r.c.mu.Unlock()
	if same || unknown || !has {
		return
	}
	// From the start of the new epoch: what this connection delivers next
	// moves the cursor on; a drop before that replays the whole new epoch.
	r.c.setCursor(p, e, 0, true)
	rs := Resync{
		Session:         p.session,
		Reason:          "epoch_reset",
		Detail:          "epoch_changed",
		LastDeliveredID: cursor,
		Epoch:           e,
		PreviousEpoch:   epoch,
	}
	if isEvent {
		rs.EarliestAvailableID = firstID
		if firstID > 1 {
			rs.Missing = IDRange{From: 1, To: firstID - 1}
		}
	}
	if f := r.c.OnResync; f != nil {
		f(rs)
	}
}

func (r *run) resync(p *position, d resyncData) {
	switch d.Reason {
	case "replay_budget_exceeded":
		// Nothing is lost: the rest is still in the ring. The client takes
		// replay_complete, drops what follows and resumes from its cursor.
		r.observeEpoch(p, d.Epoch, 0, false)
		p.budgetCut = true
		return
	case "epoch_reset":
		previous, _, _ := r.c.cursorOf(p)
		e := d.Epoch
		if !validEpoch(e) {
			e = p.streamEpoch
		}
		r.c.setCursor(p, e, 0, true) // the whole ring of the new epoch follows
		rs := Resync{
			Session:             p.session,
			Reason:              d.Reason,
			Detail:              d.Detail,
			LastDeliveredID:     d.LastDeliveredID,
			EarliestAvailableID: d.EarliestAvailableID,
			Epoch:               e,
			PreviousEpoch:       previous,
		}
		if d.EarliestAvailableID > 1 {
			rs.Missing = IDRange{From: 1, To: d.EarliestAvailableID - 1}
		}
		if f := r.c.OnResync; f != nil {
			f(rs)
		}
		return
	}
	r.observeEpoch(p, d.Epoch, 0, false)
	// The server's lastDeliveredId can be behind what this client holds
	// (under the resync overflow policy it is the last id the server
	// dequeued); what is missing starts after the later of the two.
	epoch, cursor, _ := r.c.cursorOf(p)
	from := max(d.LastDeliveredID, cursor) + 1
	if d.EarliestAvailableID == 0 || from > d.EarliestAvailableID-1 {
		return
	}
	if f := r.c.OnResync; f != nil {
		f(Resync{
			Session:             p.session,
			Reason:              d.Reason,
			Detail:              d.Detail,
			LastDeliveredID:     d.LastDeliveredID,
			EarliestAvailableID: d.EarliestAvailableID,
			Epoch:               epoch,
			Missing:             IDRange{From: from, To: d.EarliestAvailableID - 1},
		})
	}
}
