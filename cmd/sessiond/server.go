package main

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ssebus/eventbus"
	jsclient "github.com/ssebus/eventbus/clients/js"
	"github.com/ssebus/eventbus/internal/daemon"
	"github.com/ssebus/eventbus/internal/muxcursor"
	"github.com/ssebus/eventbus/websocket"
)

//go:embed index.html
var indexHTML []byte

// bodySlack is what a POST body may carry beyond MaxEventBytes. A body past
// MaxEventBytes+bodySlack is refused (413) before it is read to the end.
const bodySlack = eventbus.PublishBodySlack

// errShuttingDown is what the daemon's writes answer once it shuts down:
// 503 shutting_down, as eventbus.ErrClosed.
var errShuttingDown = fmt.Errorf("sessiond: shutting down: %w", eventbus.ErrClosed)

type config struct {
	// Hub holds the sessions: its Bus options are every session's,
	// MaxSessions, IdleTimeout and MaxTotalBytes bound them all, and it
	// keeps their Idempotency-Keys (IdempotencyWindow, MaxIdempotencyKeys;
	// Hub.PublishIdempotent), within MaxTotalBytes too.
	Hub eventbus.HubOptions
	// Stream, when set, sets the SSE handler's stream settings (Heartbeat,
	// Retry, BareIDs, CORS...); nil keeps the handler's defaults.
	Stream func(*eventbus.Handler) error
	Logger *slog.Logger // nil: slog.Default()
	// CreateOnStream (-create-on-stream) makes a GET or HEAD of a
	// stream (single, or each session of a multiplexed one) get-or-create
	// its session, as before the hub. For tests of
	// clients that reconnect across restarts and DELETEs (and learn the
	// epoch with a HEAD); it lets a client fill MaxSessions with sessions
	// that stay until they are idle for IdleTimeout.
	CreateOnStream bool
	// Auth, when set, is the access control of -auth-token: every
	// /session route needs credentials, POST /login, /logout and /revoke
	// exist, and the viewer shows its login form. nil: none.
	Auth *daemon.Auth
	// MaxStreamSessions is the most sessions one multiplexed stream (GET
	// /events) serves; 0: eventbus.DefaultMaxStreamSessions.
	MaxStreamSessions int
	// BodyTimeout and BodyBudget bound the bodies of POST
	// /session/{id}/events as eventbus.PublishHandler's fields do (0: its
	// defaults): -body-timeout and -body-budget, which the server's
	// limits apply to every route.
	BodyTimeout time.Duration
	BodyBudget  int64
}

// server serves the sessions of its hub. It is safe for concurrent use.
type server struct {
	cfg    config
	logger *slog.Logger
	hub    *eventbus.Hub
	events http.Handler         // the eventbus SSE handler; its Lookup is s.lookup
	mux    *eventbus.MuxHandler // the multiplexed stream (GET /events), sharing events' Lookup
	ws     *websocket.Handler   // the multiplexed stream over a WebSocket (GET /ws), on mux
	index  []byte               // the viewer page, told whether to show its login form
	// The write routes, the library's on hubWrites{s}.
	publishRoute, deleteRoute, signalRoute http.Handler

	closing atomic.Bool // set by shutdown: new requests get 503 shutting_down

	// meta is what the daemon records about each session's bus beside the
	// hub (*eventbus.EventBus -> *session): its creation and stream
	// counts. A sync.Map, so that a publish to a known session takes no
	// lock of the daemon's, as the hub takes none of its own. An entry
	// lives as long as its bus is the hub's for its id; one of a bus the
	// hub has expired or deleted is left for prune.
	meta    sync.Map
	metaLen atomic.Int64   // entries in meta
	pruning sync.Mutex     // one prune at a time
	mu      sync.Mutex     // guards the sessions' stream counts
	streams daemon.Streams // open streams by session id, for /disconnect; each removes itself when it ends
}

// session is what the daemon records about one bus of the hub (its
// Idempotency-Keys are the hub's). Every field but id, bus and created is
// guarded by server.mu.
type session struct {
	id      string
	bus     *eventbus.EventBus
	created time.Time
	// GET requests that reached the bus (after the handler's own checks; a
	// 429 for the subscriber limit still counts), and those of them whose
	// cursor (Last-Event-ID, else ?lastEventId=) the handler resumes from:
	// not one it serves live after cursor_invalid.
	streamsOpened  uint64
	streamsResumed uint64
	lastResumeFrom string // that value, as the client sent it (truncated)
}

func newServer(cfg config) (*server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Hub.Logger == nil {
		cfg.Hub.Logger = cfg.Logger
	}
	if cfg.Hub.Bus.Logger == nil {
		cfg.Hub.Bus.Logger = cfg.Logger
	}
	s := &server{
		cfg:    cfg,
		logger: cfg.Logger,
	}
	w := hubWrites{s}
	s.publishRoute = &eventbus.PublishHandler{Publisher: w, MaxBodyBytes: daemon.MaxBody(cfg.Hub.Bus.MaxEventBytes),
		BodyTimeout: cfg.BodyTimeout, BodyBudget: cfg.BodyBudget, Logger: cfg.Logger}
	s.deleteRoute = &eventbus.DeleteHandler{Deleter: w, Logger: cfg.Logger}
	s.signalRoute = &eventbus.SignalHandler{Signaler: w, BodyTimeout: cfg.BodyTimeout, Logger: cfg.Logger}
	h := &eventbus.Handler{Lookup: s.lookup, Logger: cfg.Logger}
	if cfg.Stream != nil {
		if err := cfg.Stream(h); err != nil {
			return nil, err
		}
	}
	// The hub last: its goroutine is only started once nothing can fail.
	hub, err := eventbus.NewHub(cfg.Hub)
	if err != nil {
		return nil, err
	}
	s.hub = hub
	cfg.Auth.Install(h)
	s.events = h
	// The multiplexed stream shares h: its settings, its Lookup and
	// Authorize (once per session, so credentials are checked as on the
	// single route) and its registry, so that h.Revoke (POST /logout,
	// /revoke) ends both kinds of stream.
	s.mux = &eventbus.MuxHandler{Handler: h, MaxStreamSessions: cfg.MaxStreamSessions}
	// A WebSocket's stream outlives its request: the handler tracks it
	// for /disconnect from the upgrade to its end.
	s.ws = &websocket.Handler{Mux: s.mux, StreamContext: s.streams.MuxContext}
	s.index = indexHTML
	if cfg.Auth != nil {
		s.index = bytes.Replace(indexHTML, []byte(`data-auth="off"`), []byte(`data-auth="on"`), 1)
	}
	return s, nil
}

// routes is the daemon's HTTP handler: the daemon.Mux routes, the
// JavaScript client's modules the viewer loads (served from the files of
// clients/js, embedded there: one copy), and with -auth-token the login
// routes and the credential checks.
func (s *server) routes() http.Handler {
	mux := daemon.Mux(s)
	mux.Handle(daemon.ClientPattern, http.StripPrefix(daemon.ClientPrefix, jsclient.Handler()))
	return s.cfg.Auth.Protect(mux)
}

// session returns the daemon's record of bus, the hub's bus of session
// id, making it on first use.
func (s *server) session(id string, bus *eventbus.EventBus) *session {
	if v, ok := s.meta.Load(bus); ok {
		return v.(*session)
	}
	sess := &session{id: id, bus: bus, created: time.Now()}
	if v, loaded := s.meta.LoadOrStore(bus, sess); loaded {
		return v.(*session)
	}
	s.metaLen.Add(1)
	s.prune()
	return sess
}

// prune forgets the records of buses the hub no longer holds (idle
// expiry, DELETE), once there are twice as many records as sessions: the
// records stay within a constant factor of the sessions, at O(1) amortized
// cost per new session.
func (s *server) prune() {
	if s.metaLen.Load() < 2*int64(s.hub.Len())+64 || !s.pruning.TryLock() {
		return
	}
	defer s.pruning.Unlock()
	s.meta.Range(func(k, v any) bool {
		if cur, ok := s.hub.Lookup(v.(*session).id); !ok || cur != k {
			s.forget(k.(*eventbus.EventBus))
		}
		return true
	})
}

// forget drops the record of bus, if any.
func (s *server) forget(bus *eventbus.EventBus) {
	if _, ok := s.meta.LoadAndDelete(bus); ok {
		s.metaLen.Add(-1)
	}
}

// withBus runs publish on the hub's bus of session id, made if needed
// (hub.GetOrCreate), once more on a new bus when the session expired or
// was deleted between the two (as hub.Publish does; this daemon needs the
// bus for its epoch and its record). An id that eventbus.CheckSessionID
// refuses is GetOrCreate's error.
func (s *server) withBus(id string, publish func(*session) error) (*session, error) {
	for retried := false; ; retried = true {
		if s.closing.Load() {
			return nil, errShuttingDown
		}
		bus, err := s.hub.GetOrCreate(id)
		if err != nil {
			return nil, err
		}
		sess := s.session(id, bus)
		err = publish(sess)
		if errors.Is(err, eventbus.ErrClosed) && !retried {
			continue
		}
		return sess, err
	}
}

// publish publishes ev to session id, creating the session if needed.
func (s *server) publish(id string, ev eventbus.Event) (eventbus.Frame, *session, error) {
	var f eventbus.Frame
	sess, err := s.withBus(id, func(sess *session) (err error) {
		f, err = sess.bus.Publish(ev)
		return err
	})
	return f, sess, err
}

// publishIdempotent is publish with an Idempotency-Key: the hub keeps the
// keys (hub.PublishIdempotent, within its byte budget) and answers the
// epoch of the bus that holds the event.
func (s *server) publishIdempotent(id, key string, ev eventbus.Event) (eventID uint64, epoch string, duplicate bool, err error) {
	if s.closing.Load() {
		return 0, "", false, errShuttingDown
	}
	eventID, epoch, duplicate, err = s.hub.PublishIdempotent(id, key, ev)
	if err == nil {
		if bus, ok := s.hub.Lookup(id); ok && bus.Epoch() == epoch {
			s.session(id, bus) // its record, as a plain publish makes it
		}
	}
	return eventID, epoch, duplicate, err
}

// deleteSession closes session id's bus and forgets it (hub.Delete); its
// streams receive what is queued, then end. It reports whether the
// session existed.
func (s *server) deleteSession(id string) bool {
	bus, ok := s.hub.Lookup(id)
	if !ok || !s.hub.Delete(id) {
		return false
	}
	s.forget(bus)
	s.logger.Info("session deleted", "session", id, "epoch", bus.Epoch(), "lastEventId", bus.LastEventID())
	return true
}

// hubWrites is the daemon's write side as the library's routes take it
// (eventbus.Publisher, Deleter, Signaler): the hub's, refused with
// errShuttingDown once the daemon shuts down, and keeping the daemon's
// record of each session.
type hubWrites struct{ s *server }

func (w hubWrites) Publish(_ context.Context, id string, e eventbus.Event) (uint64, string, error) {
	f, sess, err := w.s.publish(id, e)
	if err != nil {
		return 0, "", err
	}
	return f.ID(), sess.bus.Epoch(), nil
}

func (w hubWrites) PublishIdempotent(_ context.Context, id, key string, e eventbus.Event) (uint64, string, bool, error) {
	return w.s.publishIdempotent(id, key, e)
}

func (w hubWrites) Delete(_ context.Context, id string) error {
	w.s.deleteSession(id)
	return nil
}

func (w hubWrites) Signal(ctx context.Context, id, typ, about string) error {
	if w.s.closing.Load() {
		return errShuttingDown
	}
	return w.s.hub.Publisher().Signal(ctx, id, typ, about)
}

// disconnect cuts every open stream of session id as mode says and
// returns how many.
func (s *server) disconnect(id string, mode daemon.CutMode) int {
	return s.streams.Cut(id, mode)
}

// shutdown refuses new requests and shuts the hub down: every bus is
// closed with drain (each stream receives what is queued, then ends),
// bounded by ctx, past which the remaining streams end without drain.
// Idempotent.
func (s *server) shutdown(ctx context.Context) {
	s.closing.Store(true)
	if err := s.hub.Shutdown(ctx); err != nil {
		s.logger.Warn("streams did not drain in time; closed them", "err", err)
	}
}

// closeAll is shutdown without a bound on the drain (tests).
func (s *server) closeAll() { s.shutdown(context.Background()) }

func (s *server) ServeIndex(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; img-src 'self' data:")
	w.Write(s.index)
}

// ServeEvents wraps the eventbus handler: the request context it sees can be
// cancelled by /disconnect, which finds the stream by its session id.
func (s *server) ServeEvents(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodOptions {
		s.events.ServeHTTP(w, r) // a CORS preflight: no session, no stream
		return
	}
	s.streams.Serve(w, r, s.events, r.PathValue("id"))
}

// ServeMuxEvents is GET /events?session=<id>&session=<id>...: the
// sessions' buses on one stream (eventbus.MuxHandler; it answers a list of
// sessions that is empty, too long or repeats one with 400
// invalid_sessions, an unknown session with 404 naming it). A disconnect
// of any of its sessions cuts the whole stream, whose client then resumes
// every session with its cursor.
func (s *server) ServeMuxEvents(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodOptions {
		s.mux.ServeHTTP(w, r)
		return
	}
	s.streams.Serve(w, r, s.mux, daemon.MuxSessions(r)...)
}

// ServeWebSocket is GET /ws?session=<id>&session=<id>...: the multiplexed
// stream over a WebSocket (github.com/ssebus/eventbus/websocket, docs/SPEC.md
// 6.10), on the same MuxHandler: the same sessions, Lookup, Authorize,
// limits and cursor as GET /events. A disconnect of any of the sessions of
// its URL cuts it (clean: the connection closes; abort: a TCP reset); one
// the client adds on the open socket is not tracked for /disconnect. The
// stream is tracked by the handler's StreamContext, as it outlives the
// request.
func (s *server) ServeWebSocket(w http.ResponseWriter, r *http.Request) {
	s.ws.ServeHTTP(w, r)
}

// lookup is the eventbus handler's Lookup: hub.LookupSession, which never
// creates a session (an unknown one is 404 session_not_found, HEAD
// included; with CreateOnStream a GET or HEAD creates it), then it counts
// the stream. What else it refuses it answers as the other routes do: an
// id eventbus.CheckSessionID refuses is its error, which the handler
// answers 400 invalid_session_id; 503 shutting_down with Retry-After (a
// StatusError).
//
// The multiplexed stream (GET /events) shares the handler, so it calls
// lookup once per session; there the cursor is the composite one (see
// lookupMux).
func (s *server) lookup(r *http.Request, id string) (*eventbus.EventBus, error) {
	if r.PathValue("id") == "" {
		return s.lookupMux(r, id)
	}
	return s.streamBus(r, id, func() string {
		query := r.URL.Query()
		resume := r.Header.Get("Last-Event-ID")
		if resume == "" {
			resume = query.Get("lastEventId")
		}
		// Counted as a resume only when the handler resumes: a cursor it
		// cannot parse, or whose epoch disagrees with Event-Epoch or
		// ?epoch=, is served live after cursor_invalid (docs/SPEC.md 6.2).
		idEpoch, _, ok := eventbus.ParseEventID(resume)
		if !ok {
			return ""
		}
		epoch := r.Header.Get("Event-Epoch")
		if epoch == "" {
			epoch = query.Get("epoch")
		}
		if idEpoch != "" && epoch != "" && len(epoch) <= 64 && epoch != idEpoch {
			return ""
		}
		return resume
	})
}

// lookupMux is lookup for one session of a multiplexed stream:
// hub.LookupSession (or with CreateOnStream GetOrCreate), with lookup's
// refusals and counts; the session resumes when the request's cursor names
// it, exactly as the handler reads it (any cursor ParseCursor accepts, its
// entry for this session alone), from "<epoch tag, 12 hex digits>:<id>"
// (what its counters show).
func (s *server) lookupMux(r *http.Request, id string) (*eventbus.EventBus, error) {
	return s.streamBus(r, id, func() string {
		raw := r.Header.Get("Last-Event-ID")
		if raw == "" {
			raw = r.URL.Query().Get("lastEventId")
		}
		c, err := muxcursor.ParseCursor(raw)
		if err != nil {
			return "" // the handler logs it and serves the session live
		}
		e, ok := c.Entry(id)
		if !ok {
			return "" // not named, or named twice: live
		}
		// Another session of the stream with the same tag: the handler
		// cannot tell whose entry it is and serves both live.
		for _, other := range r.URL.Query()["session"] {
			if other != id && muxcursor.SessionTag(other) == e.Session {
				return ""
			}
		}
		return fmt.Sprintf("%012x:%d", e.Epoch, e.ID)
	})
}

// streamBus finds the bus of session id for a stream and counts the
// stream (not a HEAD) in the session's record, as resumed when resume
// returns what it resumes from.
func (s *server) streamBus(r *http.Request, id string, resume func() string) (*eventbus.EventBus, error) {
	if err := eventbus.CheckSessionID(id); err != nil {
		return nil, err // the handlers answer 400 invalid_session_id
	}
	if s.closing.Load() {
		return nil, eventbus.ErrorStatus(errShuttingDown) // 503 shutting_down
	}
	var bus *eventbus.EventBus
	var err error
	if s.cfg.CreateOnStream && r.Method != http.MethodOptions {
		bus, err = s.hub.GetOrCreate(id)
		if errors.Is(err, eventbus.ErrHubFull) {
			return nil, eventbus.ErrorStatus(err) // 503 too_many_sessions
		}
	} else {
		bus, err = s.hub.LookupSession(r, id)
	}
	if err != nil || r.Method == http.MethodHead {
		return bus, err // a HEAD opens no stream
	}
	from := resume()
	if len(from) > 64 {
		from = from[:64]
	}
	sess := s.session(id, bus)
	s.mu.Lock()
	sess.streamsOpened++
	if from != "" {
		sess.streamsResumed++
		sess.lastResumeFrom = from
	}
	s.mu.Unlock()
	s.logger.Info("stream opened", "session", id, "epoch", bus.Epoch(), "lastEventId", from, "remote", r.RemoteAddr)
	return bus, nil
}

// ServePublish is eventbus.PublishHandler on the hub.
func (s *server) ServePublish(w http.ResponseWriter, r *http.Request) { s.publishRoute.ServeHTTP(w, r) }

// ServeSignal is eventbus.SignalHandler on the hub: a change signal to the
// streams of a live session (none: nothing to tell, 204).
func (s *server) ServeSignal(w http.ResponseWriter, r *http.Request) { s.signalRoute.ServeHTTP(w, r) }

func (s *server) ServeStatus(w http.ResponseWriter, r *http.Request) {
	id, ok := daemon.SessionID(w, r)
	if !ok {
		return
	}
	bus, ok := s.hub.Lookup(id)
	if !ok {
		eventbus.WriteError(w, r, eventbus.ErrSessionNotFound)
		return
	}
	sess := s.session(id, bus)
	s.mu.Lock()
	st := map[string]any{
		"id":             sess.id,
		"epoch":          bus.Epoch(),
		"lastEventId":    bus.LastEventID(),
		"subscribers":    bus.SubscriberCount(),
		"streams":        s.streams.Count(id),
		"streamsOpened":  sess.streamsOpened,
		"streamsResumed": sess.streamsResumed,
		"lastResumeFrom": sess.lastResumeFrom,
		"createdAt":      sess.created.UTC().Format(time.RFC3339Nano),
	}
	s.mu.Unlock()
	daemon.WriteJSON(w, http.StatusOK, st)
}

// ServeDelete is eventbus.DeleteHandler on the hub.
func (s *server) ServeDelete(w http.ResponseWriter, r *http.Request) { s.deleteRoute.ServeHTTP(w, r) }

func (s *server) ServeDisconnect(w http.ResponseWriter, r *http.Request) {
	id, ok := daemon.SessionID(w, r)
	if !ok {
		return
	}
	mode, err := daemon.ParseCutMode(r)
	if err != nil {
		daemon.WriteError(w, http.StatusBadRequest, "invalid_mode", err.Error())
		return
	}
	n := s.disconnect(id, mode)
	if n > 0 {
		s.logger.Info("streams cut on request", "session", id, "streams", n, "mode", mode)
	}
	daemon.WriteJSON(w, http.StatusOK, map[string]any{"disconnected": n, "mode": mode.String()})
}
