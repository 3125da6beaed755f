// Command sessiond-pg is a demo daemon for package pgbus: the session
// event routes of sessiond-redis, with every session's events in
// PostgreSQL tables, so that several replicas serve the same sessions and
// a client may resume with Last-Event-ID on any of them. Its HTTP surface
// (routes, bodies, status codes, headers) is sessiond-redis's: a client
// cannot tell which engine is behind it.
//
// Usage:
//
//	go run ./cmd/sessiond-pg [-addr 127.0.0.1:8081] [-pg postgres://...] [flags]
//
// (from the pgbus module: cd pgbus first). Routes:
//
//	GET    /session/{id}/events       the SSE stream (eventbus.Handler, resumes from the table)
//	POST   /session/{id}/events       publish {"type":..., "data":..., "originatorClientId":...} -> {"id":N,"epoch":...}
//	                                  (an Idempotency-Key header makes a retry safe: see pgbus/README.md)
//	GET    /session/{id}              the session as PostgreSQL and this replica see it (404 if it has none)
//	DELETE /session/{id}              forget the session; every replica's streams of it end -> 204
//	POST   /session/{id}/disconnect   cut this replica's open streams of the session -> {"disconnected":N}
//	POST   /session/{id}/signal       send {"type":..., "about":...} to the session's streams on every replica -> 204
//
// On SIGINT or SIGTERM it closes the backplane (open streams drain and
// end), then shuts the HTTP server down. The rows stay.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ssebus/eventbus"
	shared "github.com/ssebus/eventbus/internal/daemon" // not "daemon": main_test.go has a func daemon
	"github.com/ssebus/eventbus/pgbus"
)

func main() {
	shared.Main("sessiond-pg", func(ctx context.Context, args []string, logOut io.Writer) error {
		return run(ctx, args, logOut, nil)
	})
}

const usageText = `sessiond-pg: a demo replica for github.com/ssebus/eventbus/pgbus.
Run several against one PostgreSQL; a client may resume on any of them.

Routes:
  GET    /session/{id}/events       SSE stream (Last-Event-ID or ?lastEventId= resumes,
                                    Event-Epoch or ?epoch= names the epoch seen; ?maxQueued=16..2048)
                                    503 unavailable with Retry-After when PostgreSQL is down
  POST   /session/{id}/events       publish {"type":"...","data":...,"originatorClientId":"..."}
                                    -> {"id":N,"epoch":"..."}; 400 bad body, 413 too large,
                                    503 unavailable (PostgreSQL down: not appended, retry after Retry-After),
                                    503 publish_outcome_unknown (PostgreSQL did not answer in time: the
                                    event may or may not be appended; retry with the same key).
                                    Idempotency-Key: <1..255 printable ASCII> makes a retry of the
                                    same event within -idempotency-window append nothing
                                    -> {"id":<first>,"epoch":"...","duplicate":true};
                                    the key with another event: 422 idempotency_key_reused
  GET    /session/{id}              the session in PostgreSQL and on this replica; 404 if it has none
  DELETE /session/{id}              forget the session -> 204; the next use starts a new epoch
  POST   /session/{id}/disconnect   cut this replica's streams of the session -> {"disconnected":N}
  POST   /session/{id}/signal       change signal {"type":"...","about":"..."} to the session's
                                    streams on every replica (no id, not stored) -> 204

Flags:
`

// run parses args, serves until ctx is done, then shuts down. ready, when
// set, is called with the listen address once the daemon serves.
func run(ctx context.Context, args []string, logOut io.Writer, ready func(addr string)) error {
	fs, f := shared.NewFlags("sessiond-pg", usageText, logOut, shared.FlagDocs{
		DefaultAddr:    "127.0.0.1:8081",
		Ring:           "events each session keeps in the table for resumes (0: eventbus default 8000)",
		MaxSubscribers: "concurrent streams per session on this replica (0: eventbus default 64)",
		WriteTimeout:   "deadline of one SSE write+flush (0: handler default 30s)",
	})
	var (
		pgURL          = fs.String("pg", "postgres://127.0.0.1:5432/postgres", "PostgreSQL URL or keyword/value connection string (libpq's PG* variables apply)")
		name           = fs.String("name", "", "replica name for logs and GET /session/{id} (default: the listen address)")
		schema         = fs.String("schema", pgbus.DefaultSchema, "PostgreSQL schema of the tables and functions (created when missing) and prefix of the notification channels")
		publishTimeout = fs.Duration("publish-timeout", 0, "bound of one publish in PostgreSQL (0: pgbus default 2s)")
		idleTimeout    = fs.Duration("idle-timeout", 0, "release a session's mirror after this long without streams here (0: pgbus default 1m)")
		sessionTTL     = fs.Duration("session-ttl", 0, "delete a session after this long without a publish or a new mirror (0: never)")
		poolSize       = fs.Int("pg-pool", 32, "PostgreSQL connections of this replica (one more is held by the listener)")
		outageTimeout  = fs.Duration("outage-timeout", 0, "end a session's streams (stream_error unavailable) after PostgreSQL is unreachable this long (0: pgbus default 30s)")
	)
	if err := shared.Parse(fs, args); err != nil {
		return err
	}
	logger := f.Logger(logOut)

	cfg, err := pgxpool.ParseConfig(*pgURL)
	if err != nil {
		return fmt.Errorf("-pg: %w", err)
	}
	if *poolSize < 2 {
		return fmt.Errorf("-pg-pool is %d, want at least 2", *poolSize)
	}
	cfg.MaxConns = int32(*poolSize) // the listener takes one out of the pool: one more on the server
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("-pg: %w", err)
	}
	defer pool.Close()

	ln, err := net.Listen("tcp", f.Addr)
	if err != nil {
		return err
	}
	if *name == "" {
		*name = ln.Addr().String()
	}
	bp, err := pgbus.New(ctx, pool, pgbus.Options{
		Bus:               f.BusOptions(logger), // its RingSize bounds each session's rows too
		PublishTimeout:    *publishTimeout,
		OutageTimeout:     *outageTimeout,
		IdempotencyWindow: f.IdempotencyWindow,
		IdleTimeout:       *idleTimeout,
		Schema:            *schema,
		SessionTTL:        *sessionTTL,
		Logger:            logger,
	})
	if err != nil {
		ln.Close()
		return err
	}
	srv := &server{bp: bp, name: *name, logger: logger, maxBody: shared.MaxBody(f.MaxEventBytes), streams: map[string]map[*context.CancelFunc]struct{}{}}
	h := bp.Handler()
	h.Logger, h.Heartbeat, h.Retry, h.WriteTimeout = logger, f.Heartbeat, f.Retry, f.WriteTimeout
	// ServeEvents looks the session up first, to answer PostgreSQL down
	// with 503 and Retry-After (the Handler answers any Lookup error but
	// ErrSessionNotFound with 500); the Handler takes the bus it found.
	h.Lookup = func(r *http.Request) (*eventbus.EventBus, error) {
		if bus, ok := r.Context().Value(busKey{}).(*eventbus.EventBus); ok {
			return bus, nil
		}
		return nil, eventbus.ErrSessionNotFound
	}
	srv.events = h

	d := &shared.Server{
		Name:     "sessiond-pg",
		Listener: ln,
		Handler:  srv.routes(),
		Logger:   logger,
		// Close the mirrors first: each stream gets what it has queued,
		// then its handler returns, so Shutdown finds idle connections.
		Close:           func() { bp.Close() },
		ListenAttrs:     []any{"pg", cfg.ConnConfig.Host, "schema", *schema, "replica", *name},
		Ready:           ready,
		ShutdownTimeout: f.ShutdownTimeout,
	}
	if f.Demo {
		d.Demo = &shared.Demo{Interval: f.DemoInterval, Replica: *name, Publish: srv.publishDemo, Logger: logger}
	}
	return d.Run(ctx)
}

// busKey is the request context key of the bus ServeEvents found.
type busKey struct{}

// publishErrors maps pgbus's publish errors to HTTP answers.
var publishErrors = shared.PublishErrors{
	OutcomeUnknown: pgbus.ErrOutcomeUnknown,
	KeyReused:      eventbus.ErrIdempotencyKeyReused,
	InvalidKey:     eventbus.ErrInvalidIdempotencyKey,
	InvalidSession: pgbus.ErrInvalidSession,
	Unavailable:    pgbus.ErrUnavailable,
}

type server struct {
	bp      *pgbus.Backplane
	events  *eventbus.Handler
	name    string
	logger  *slog.Logger
	maxBody int64

	mu      sync.Mutex
	streams map[string]map[*context.CancelFunc]struct{} // open streams by session, for /disconnect
}

func (s *server) routes() http.Handler {
	mux := shared.Mux(s)
	mux.HandleFunc("POST /session/{id}/signal", s.ServeSignal)
	return mux
}

func (s *server) ServeIndex(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "sessiond-pg replica %s\n\n", s.name)
	io.WriteString(w, strings.TrimSuffix(usageText, "Flags:\n"))
}

// ServeEvents finds the session's mirror (checking its epoch with
// PostgreSQL), then runs the backplane's SSE handler on it under a context
// that /disconnect can cancel, as a client disconnect would.
func (s *server) ServeEvents(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	bus, err := s.bp.Bus(r.Context(), id)
	switch {
	case errors.Is(err, pgbus.ErrInvalidSession):
		shared.WriteError(w, http.StatusNotFound, "session_not_found", "session not found")
		return
	case errors.Is(err, pgbus.ErrUnavailable):
		s.logger.Warn("stream refused: PostgreSQL unavailable", "session", id, "err", err)
		shared.WriteUnavailable(w, "unavailable", "PostgreSQL unavailable; retry after Retry-After")
		return
	case errors.Is(err, eventbus.ErrClosed):
		shared.WriteUnavailable(w, "shutting_down", "the daemon is shutting down")
		return
	case err != nil: // the client left while the session opened
		shared.WriteError(w, http.StatusInternalServerError, "internal", "session lookup failed")
		return
	}
	ctx, cancel := context.WithCancel(context.WithValue(r.Context(), busKey{}, bus))
	defer cancel()
	key := &cancel
	s.mu.Lock()
	if s.streams[id] == nil {
		s.streams[id] = map[*context.CancelFunc]struct{}{}
	}
	s.streams[id][key] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.streams[id], key)
		if len(s.streams[id]) == 0 {
			delete(s.streams, id)
		}
		s.mu.Unlock()
	}()
	s.logger.Debug("stream opened", "session", id, "lastEventId", r.Header.Get("Last-Event-ID"), "remote", r.RemoteAddr)
	s.events.ServeHTTP(w, r.WithContext(ctx))
}

func (s *server) ServePublish(w http.ResponseWriter, r *http.Request) {
	key, keyed := shared.IdempotencyKey(r)
	req, ok := shared.DecodePublish(w, r, s.maxBody)
	if !ok {
		return
	}
	var (
		id    uint64
		epoch string
		dup   bool
		err   error
	)
	if keyed {
		id, epoch, dup, err = s.bp.PublishIdempotent(r.Context(), r.PathValue("id"), key, req.Event())
	} else {
		id, epoch, err = s.bp.Publish(r.Context(), r.PathValue("id"), req.Event())
	}
	if err == nil {
		shared.WritePublished(w, id, epoch, dup)
		return
	}
	if errors.Is(err, pgbus.ErrUnavailable) {
		s.logger.Warn("publish failed", "session", r.PathValue("id"), "keyed", keyed, "err", err)
	}
	if !publishErrors.Write(w, err) {
		shared.WriteError(w, http.StatusInternalServerError, "internal", err.Error())
	}
}

func (s *server) ServeSignal(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Type  string `json:"type"`
		About string `json:"about"`
	}
	if err := shared.NewBodyDecoder(w, r, 1<<20).Decode(&req); err != nil {
		shared.WriteError(w, http.StatusBadRequest, "invalid_body", "malformed body: "+err.Error())
		return
	}
	err := s.bp.Signal(r.Context(), r.PathValue("id"), req.Type, req.About)
	switch {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
	case errors.Is(err, eventbus.ErrEventTooLarge):
		shared.WriteError(w, http.StatusRequestEntityTooLarge, "event_too_large", err.Error())
	case errors.Is(err, eventbus.ErrInvalidEvent), errors.Is(err, pgbus.ErrInvalidSession):
		shared.WriteError(w, http.StatusBadRequest, "invalid_event", err.Error())
	default:
		shared.WriteUnavailable(w, "unavailable", err.Error())
	}
}

func (s *server) ServeStatus(w http.ResponseWriter, r *http.Request) {
	in, err := s.bp.Info(r.Context(), r.PathValue("id"))
	switch {
	case errors.Is(err, pgbus.ErrInvalidSession):
		shared.WriteError(w, http.StatusNotFound, "session_not_found", "session not found")
		return
	case err != nil:
		shared.WriteUnavailable(w, "unavailable", err.Error())
		return
	case !in.Exists:
		shared.WriteError(w, http.StatusNotFound, "session_not_found", "session not found")
		return
	}
	s.mu.Lock()
	open := len(s.streams[r.PathValue("id")])
	s.mu.Unlock()
	shared.WriteJSON(w, http.StatusOK, map[string]any{
		"id": r.PathValue("id"), "replica": s.name,
		"epoch": in.Epoch, "lastEventId": in.LastEventID, "firstEventId": in.FirstEventID, "bytes": in.Bytes,
		"local": in.Local, "localLastEventId": in.LocalLastEventID, "subscribers": in.Subscribers, "streams": open,
	})
}

func (s *server) ServeDelete(w http.ResponseWriter, r *http.Request) {
	if err := s.bp.Delete(r.Context(), r.PathValue("id")); err != nil {
		if errors.Is(err, pgbus.ErrInvalidSession) {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		shared.WriteUnavailable(w, "unavailable", err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) ServeDisconnect(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	var cancels []context.CancelFunc
	for c := range s.streams[r.PathValue("id")] {
		cancels = append(cancels, *c)
	}
	s.mu.Unlock()
	for _, c := range cancels {
		c()
	}
	shared.WriteJSON(w, http.StatusOK, map[string]int{"disconnected": len(cancels)})
}

// publishDemo is the demo's Publish; an error after the demo was stopped
// is not worth a log line.
func (s *server) publishDemo(ctx context.Context, id string, ev eventbus.Event) error {
	if _, _, err := s.bp.Publish(ctx, id, ev); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}
