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
	"time"

	"github.com/ssebus/eventbus"
	jsclient "github.com/ssebus/eventbus/clients/js"
	"github.com/ssebus/eventbus/internal/daemon"
)

//go:embed index.html
var indexHTML []byte

// maxSessionIDBytes bounds the {id} path segment; sessions are map keys and
// appear in logs.
const maxSessionIDBytes = 128

// bodySlack is what a POST body may carry beyond MaxEventBytes. A body past
// MaxEventBytes+bodySlack is refused (413) before it is read to the end.
const bodySlack = daemon.BodySlack

// publishErrors maps the idempotency errors (and the bus's own) to HTTP
// answers, as the backplane daemons do; this daemon never answers
// publish_outcome_unknown: its publishes are definite.
var publishErrors = daemon.PublishErrors{
	InvalidKey: eventbus.ErrInvalidIdempotencyKey,
	KeyReused:  eventbus.ErrIdempotencyKeyReused,
}

var (
	errShuttingDown    = errors.New("sessiond: shutting down")
	errTooManySessions = errors.New("sessiond: too many sessions")
	errInvalidSession  = fmt.Errorf("sessiond: session id longer than %d bytes", maxSessionIDBytes)
)

type config struct {
	Options     eventbus.Options // used for every session's bus
	MaxSessions int              // <= 0: unlimited
	// Stream, when set, sets the SSE handler's stream settings (Heartbeat,
	// Retry, EpochIDs, CORS...); nil keeps the handler's defaults.
	Stream func(*eventbus.Handler) error
	Logger *slog.Logger // nil: slog.Default()
	// IdempotencyWindow is how long a session remembers an
	// Idempotency-Key (at most daemon.DefaultIdempotencyKeys of them);
	// 0: daemon.DefaultIdempotencyWindow.
	IdempotencyWindow time.Duration
	// Auth, when set, is the access control of -auth-token: every
	// /session route needs credentials, POST /login, /logout and /revoke
	// exist, and the viewer shows its login form. nil: none.
	Auth *daemon.Auth
}

// server owns the sessions. It is safe for concurrent use.
type server struct {
	cfg     config
	logger  *slog.Logger
	maxBody int64
	events  http.Handler      // the eventbus SSE handler; its Lookup is s.lookup
	enc     *eventbus.Encoder // for the fingerprints of idempotent publishes
	index   []byte            // the viewer page, told whether to show its login form

	mu       sync.Mutex
	closed   bool
	sessions map[string]*session
}

// session is one bus plus what the daemon records about its streams. Every
// field but id and bus is guarded by server.mu.
type session struct {
	id      string
	bus     *eventbus.EventBus
	created time.Time

	idem    daemon.Idempotency   // the session's Idempotency-Keys (own lock)
	streams map[*stream]struct{} // open GET streams, for /disconnect
	// GET requests that reached the bus (after the handler's own checks; a
	// 429 for the subscriber limit still counts), and those of them that
	// carried a Last-Event-ID header or ?lastEventId=.
	streamsOpened  uint64
	streamsResumed uint64
	lastResumeFrom string // that value, as the client sent it (truncated)
}

// stream is one GET /session/{id}/events request; /disconnect cuts it.
type stream struct {
	cut  *daemon.Stream
	sess *session // set by lookup; guarded by server.mu
}

type streamKey struct{}

func (sess *session) busOrNil() *eventbus.EventBus {
	if sess == nil {
		return nil
	}
	return sess.bus
}

func newServer(cfg config) (*server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Options.Logger == nil {
		cfg.Options.Logger = cfg.Logger
	}
	// Validate the bus options once, at startup, rather than on the first request.
	probe, err := eventbus.New(cfg.Options)
	if err != nil {
		return nil, err
	}
	probe.Close()
	enc, err := eventbus.NewEncoder(cfg.Options)
	if err != nil {
		return nil, err
	}

	s := &server{
		enc:      enc,
		cfg:      cfg,
		logger:   cfg.Logger,
		maxBody:  daemon.MaxBody(cfg.Options.MaxEventBytes),
		sessions: make(map[string]*session),
	}
	h := &eventbus.Handler{Lookup: s.lookup, Logger: cfg.Logger}
	if cfg.Stream != nil {
		if err := cfg.Stream(h); err != nil {
			return nil, err
		}
	}
	cfg.Auth.Install(h)
	s.events = h
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

// getSession returns the live session id, creating it when create is set.
func (s *server) getSession(id string, create bool) (*session, error) {
	if len(id) > maxSessionIDBytes {
		return nil, errInvalidSession
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errShuttingDown
	}
	if sess := s.sessions[id]; sess != nil {
		return sess, nil
	}
	if !create {
		return nil, eventbus.ErrSessionNotFound
	}
	if s.cfg.MaxSessions > 0 && len(s.sessions) >= s.cfg.MaxSessions {
		return nil, errTooManySessions
	}
	bus, err := eventbus.New(s.cfg.Options) // validated in newServer; no I/O
	if err != nil {
		return nil, err
	}
	sess := &session{id: id, bus: bus, created: time.Now(), streams: make(map[*stream]struct{})}
	sess.idem.Window = s.cfg.IdempotencyWindow
	s.sessions[id] = sess
	return sess, nil
}

// publish publishes ev to session id, creating the session if needed. A bus
// closed by a concurrent DELETE is replaced by a new session, as a POST after
// the DELETE would be.
func (s *server) publish(id string, ev eventbus.Event) (eventbus.Frame, *session, error) {
	var f eventbus.Frame
	sess, err := s.withSession(id, func(sess *session) (err error) {
		f, err = sess.bus.Publish(ev)
		return err
	})
	return f, sess, err
}

// publishIdempotent is publish with an Idempotency-Key whose event has
// fingerprint fp (daemon.Idempotency.Publish).
func (s *server) publishIdempotent(id, key, fp string, ev eventbus.Event) (eventID uint64, sess *session, duplicate bool, err error) {
	sess, err = s.withSession(id, func(sess *session) (err error) {
		eventID, duplicate, err = sess.idem.Publish(key, fp, func() (uint64, error) {
			f, err := sess.bus.Publish(ev)
			return f.ID(), err
		})
		return err
	})
	return eventID, sess, duplicate, err
}

// withSession runs publish on session id, created if needed, again on a new
// session when a concurrent DELETE closed the bus.
func (s *server) withSession(id string, publish func(*session) error) (*session, error) {
	for attempt := 0; ; attempt++ {
		sess, err := s.getSession(id, true)
		if err != nil {
			return nil, err
		}
		err = publish(sess)
		if errors.Is(err, eventbus.ErrClosed) && attempt < 3 {
			continue
		}
		return sess, err
	}
}

// deleteSession forgets session id and closes its bus; its streams receive
// what is queued, then end. It reports whether the session existed.
func (s *server) deleteSession(id string) bool {
	s.mu.Lock()
	sess := s.sessions[id]
	delete(s.sessions, id)
	s.mu.Unlock()
	if sess == nil {
		return false
	}
	sess.bus.Close()
	s.logger.Info("session deleted", "session", id, "epoch", sess.bus.Epoch(), "lastEventId", sess.bus.LastEventID())
	return true
}

// disconnect cuts every open stream of session id as mode says and
// returns how many.
func (s *server) disconnect(id string, mode daemon.CutMode) int {
	s.mu.Lock()
	var cuts []*daemon.Stream
	if sess := s.sessions[id]; sess != nil {
		for st := range sess.streams {
			cuts = append(cuts, st.cut)
		}
	}
	s.mu.Unlock()
	for _, c := range cuts {
		c.Cut(mode)
	}
	return len(cuts)
}

// closeAll refuses new sessions and closes every bus. Idempotent.
func (s *server) closeAll() {
	s.mu.Lock()
	s.closed = true
	all := s.sessions
	s.sessions = make(map[string]*session)
	s.mu.Unlock()
	for _, sess := range all {
		sess.bus.Close()
	}
}

func (s *server) ServeIndex(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; img-src 'self' data:")
	w.Write(s.index)
}

// ServeEvents wraps the eventbus handler: the request context it sees can be
// cancelled by /disconnect. lookup registers the stream with its session.
func (s *server) ServeEvents(w http.ResponseWriter, r *http.Request) {
	cut, r := daemon.Track(r)
	defer cut.Done()
	st := &stream{cut: cut}
	defer func() {
		s.mu.Lock()
		if st.sess != nil {
			delete(st.sess.streams, st)
		}
		s.mu.Unlock()
	}()
	s.events.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), streamKey{}, st)))
}

// lookup is the eventbus handler's Lookup: it creates the session on first
// use and records the stream. What it refuses it answers as the other
// routes do (a StatusError): 400 invalid_session_id, 503 shutting_down or
// too_many_sessions with Retry-After.
func (s *server) lookup(r *http.Request) (*eventbus.EventBus, error) {
	id := r.PathValue("id")
	sess, err := s.getSession(id, true)
	switch {
	case errors.Is(err, errInvalidSession):
		return nil, &eventbus.StatusError{Status: http.StatusBadRequest, Code: "invalid_session_id", Message: err.Error()}
	case errors.Is(err, errShuttingDown):
		return nil, &eventbus.StatusError{Status: http.StatusServiceUnavailable, Code: "shutting_down", Message: err.Error(), RetryAfter: time.Second}
	case errors.Is(err, errTooManySessions):
		return nil, &eventbus.StatusError{Status: http.StatusServiceUnavailable, Code: "too_many_sessions", Message: err.Error(), RetryAfter: time.Second}
	}
	if err != nil || r.Method == http.MethodHead {
		return sess.busOrNil(), err // a HEAD opens no stream
	}
	resume := r.Header.Get("Last-Event-ID")
	if resume == "" {
		resume = r.URL.Query().Get("lastEventId")
	}
	if len(resume) > 64 {
		resume = resume[:64]
	}
	s.mu.Lock()
	if st, ok := r.Context().Value(streamKey{}).(*stream); ok && st.sess == nil {
		st.sess = sess
		sess.streams[st] = struct{}{}
	}
	sess.streamsOpened++
	if resume != "" {
		sess.streamsResumed++
		sess.lastResumeFrom = resume
	}
	s.mu.Unlock()
	s.logger.Info("stream opened", "session", id, "epoch", sess.bus.Epoch(), "lastEventId", resume, "remote", r.RemoteAddr)
	return sess.bus, nil
}

func (s *server) ServePublish(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if len(id) > maxSessionIDBytes {
		daemon.WriteError(w, http.StatusBadRequest, "invalid_session_id", errInvalidSession.Error())
		return
	}
	key, keyed := daemon.IdempotencyKey(r)
	if keyed {
		if err := eventbus.CheckIdempotencyKey(key); err != nil {
			daemon.WriteError(w, http.StatusBadRequest, "invalid_idempotency_key", err.Error())
			return
		}
	}
	req, ok := daemon.DecodePublish(w, r, s.maxBody)
	if !ok {
		return
	}

	var (
		eventID uint64
		sess    *session
		dup     bool
		err     error
	)
	ev := req.Event()
	if keyed {
		var fp string
		if fp, err = s.enc.Fingerprint(ev); err == nil {
			eventID, sess, dup, err = s.publishIdempotent(id, key, fp, ev)
		}
	} else {
		var f eventbus.Frame
		f, sess, err = s.publish(id, ev)
		eventID = f.ID()
	}
	switch {
	case err == nil:
		daemon.WritePublished(w, eventID, sess.bus.Epoch(), dup)
	case errors.Is(err, errShuttingDown):
		daemon.WriteUnavailable(w, "shutting_down", err.Error())
	case errors.Is(err, errTooManySessions):
		daemon.WriteUnavailable(w, "too_many_sessions", err.Error())
	default:
		if !publishErrors.Write(w, err) {
			s.logger.Error("publish failed", "session", id, "err", err)
			daemon.WriteError(w, http.StatusInternalServerError, "internal", "publish failed")
		}
	}
}

func (s *server) ServeStatus(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	sess, err := s.getSession(id, false)
	if err != nil {
		daemon.WriteError(w, http.StatusNotFound, "session_not_found", "session not found")
		return
	}
	s.mu.Lock()
	st := map[string]any{
		"id":             sess.id,
		"epoch":          sess.bus.Epoch(),
		"lastEventId":    sess.bus.LastEventID(),
		"subscribers":    sess.bus.SubscriberCount(),
		"streams":        len(sess.streams),
		"streamsOpened":  sess.streamsOpened,
		"streamsResumed": sess.streamsResumed,
		"lastResumeFrom": sess.lastResumeFrom,
		"createdAt":      sess.created.UTC().Format(time.RFC3339Nano),
	}
	s.mu.Unlock()
	daemon.WriteJSON(w, http.StatusOK, st)
}

func (s *server) ServeDelete(w http.ResponseWriter, r *http.Request) {
	s.deleteSession(r.PathValue("id"))
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) ServeDisconnect(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
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
