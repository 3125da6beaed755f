// Command sessiond-redis is a demo daemon for package redisbus: the
// session event routes of cmd/sessiond, with every session's events in a
// Redis stream, so that several replicas serve the same sessions and a
// client may resume with Last-Event-ID on any of them.
//
// Usage:
//
//	go run ./cmd/sessiond-redis [-addr 127.0.0.1:8081] [-redis 127.0.0.1:6379] [flags]
//
// (from the redisbus module: cd redisbus first). Routes:
//
//	GET    /session/{id}/events       the SSE stream (eventbus.Handler, resumes from Redis)
//	POST   /session/{id}/events       publish {"type":..., "data":..., "originatorClientId":...} -> {"id":N,"epoch":...}
//	                                  (an Idempotency-Key header makes a retry safe: see redisbus/README.md)
//	GET    /session/{id}              the session as Redis and this replica see it (404 if Redis has none)
//	DELETE /session/{id}              forget the session in Redis; every replica's streams of it end -> 204
//	POST   /session/{id}/disconnect   cut this replica's open streams of the session -> {"disconnected":N,"mode":...}
//	                                  (?mode=clean ends the responses, ?mode=abort resets the connections)
//	POST   /session/{id}/signal       send {"type":..., "about":...} to the session's streams on every replica -> 204
//
// The flags of cmd/sessiond apply (epoch ids on by default, -cors-origin,
// h2c, -tls-cert/-tls-key, -auth-token and -token-lifetime with POST /login,
// /logout and /revoke; a revocation ends the streams of this replica). On SIGINT or SIGTERM it closes the backplane
// (open streams drain and end), then shuts the HTTP server down. The Redis
// keys stay.
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

	"github.com/redis/go-redis/v9"
	"github.com/ssebus/eventbus"
	shared "github.com/ssebus/eventbus/internal/daemon" // not "daemon": main_test.go has a func daemon
	"github.com/ssebus/eventbus/redisbus"
)

func main() {
	shared.Main("sessiond-redis", func(ctx context.Context, args []string, logOut io.Writer) error {
		return run(ctx, args, logOut, nil)
	})
}

const usageText = `sessiond-redis: a demo replica for github.com/ssebus/eventbus/redisbus.
Run several against one Redis; a client may resume on any of them.

Routes:
  GET    /session/{id}/events       SSE stream (Last-Event-ID or ?lastEventId= resumes,
                                    Event-Epoch or ?epoch= names the epoch seen; ?maxQueued=16..2048)
  POST   /session/{id}/events       publish {"type":"...","data":...,"originatorClientId":"..."}
                                    -> {"id":N,"epoch":"..."}; 400 bad body, 413 too large,
                                    503 unavailable (Redis down: not appended, retry after Retry-After),
                                    503 publish_outcome_unknown (Redis did not answer in time: the
                                    event may or may not be appended; retry with the same key).
                                    Idempotency-Key: <1..255 printable ASCII> makes a retry of the
                                    same event within -idempotency-window append nothing
                                    -> {"id":<first>,"epoch":"...","duplicate":true};
                                    the key with another event: 422 idempotency_key_reused
  GET    /session/{id}              the session in Redis and on this replica; 404 if Redis has none
  DELETE /session/{id}              forget the session in Redis -> 204; the next use starts a new epoch
  POST   /session/{id}/disconnect   cut this replica's streams of the session -> {"disconnected":N,"mode":...}
                                    (?mode=clean: end the responses; ?mode=abort: reset the connections)
  POST   /session/{id}/signal       change signal {"type":"...","about":"..."} to the session's
                                    streams on every replica (no id, not stored) -> 204

` + shared.AuthUsage + `
Flags:
`

// run parses args, serves until ctx is done, then shuts down. ready, when
// set, is called with the listen address once the daemon serves.
func run(ctx context.Context, args []string, logOut io.Writer, ready func(addr string)) error {
	fs, f := shared.NewFlags("sessiond-redis", usageText, logOut, shared.FlagDocs{
		DefaultAddr:    "127.0.0.1:8081",
		Ring:           "events each session's stream keeps for resumes (0: eventbus default 8000)",
		MaxSubscribers: "concurrent streams per session on this replica (0: eventbus default 64)",
		WriteTimeout:   "deadline of one SSE write+flush (0: handler default 30s)",
	})
	var (
		redisAddr      = fs.String("redis", "127.0.0.1:6379", "Redis address host:port, or a redis:// URL")
		name           = fs.String("name", "", "replica name for logs and GET /session/{id} (default: the listen address)")
		prefix         = fs.String("prefix", redisbus.DefaultKeyPrefix, "prefix of every Redis key")
		publishTimeout = fs.Duration("publish-timeout", 0, "bound of one publish in Redis (0: redisbus default 2s)")
		idleTimeout    = fs.Duration("idle-timeout", 0, "release a session's mirror after this long without streams here (0: redisbus default 1m)")
		keyTTL         = fs.Duration("key-ttl", 0, "expire a session's Redis keys after this long without a publish (0: never)")
		poolSize       = fs.Int("redis-pool", 256, "Redis connections; every session with streams here holds one in XREAD")
		outageTimeout  = fs.Duration("outage-timeout", 0, "end a session's streams (stream_error unavailable) after Redis is unreachable this long (0: redisbus default 30s)")
	)
	if err := shared.Parse(fs, args); err != nil {
		return err
	}
	logger := f.Logger(logOut)

	ropts := &redis.Options{Addr: *redisAddr}
	if strings.Contains(*redisAddr, "://") {
		var err error
		if ropts, err = redis.ParseURL(*redisAddr); err != nil {
			return fmt.Errorf("-redis: %w", err)
		}
	}
	// Publish must never hang on a stalled Redis: honour context deadlines.
	ropts.ContextTimeoutEnabled = true
	ropts.PoolSize = *poolSize
	client := redis.NewClient(ropts)
	defer client.Close()

	tlsConfig, err := f.TLSConfig()
	if err != nil {
		return err
	}
	auth, err := f.Auth("sessiond-redis", tlsConfig != nil)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", f.Addr)
	if err != nil {
		return err
	}
	if *name == "" {
		*name = ln.Addr().String()
	}
	bp, err := redisbus.New(client, redisbus.Options{
		Bus:            f.BusOptions(logger), // its RingSize bounds each session's stream too
		PublishTimeout: *publishTimeout,
		IdleTimeout:    *idleTimeout,
		KeyPrefix:      *prefix,
		KeyTTL:         *keyTTL,
		Logger:         logger,

		IdempotencyWindow: f.IdempotencyWindow,
		OutageTimeout:     *outageTimeout,
	})
	if err != nil {
		ln.Close()
		return err
	}
	srv := &server{bp: bp, auth: auth, name: *name, logger: logger, maxBody: shared.MaxBody(f.MaxEventBytes), streams: map[string]map[*shared.Stream]struct{}{}}
	h := bp.Handler()
	h.Logger = logger
	if err := f.Handler(h); err != nil {
		bp.Close()
		ln.Close()
		return err
	}
	auth.Install(h)
	srv.events = h

	d := &shared.Server{
		Name:     "sessiond-redis",
		Listener: ln,
		Handler:  srv.routes(),
		TLS:      tlsConfig,
		Logger:   logger,
		// Close the mirrors first: each stream gets what it has queued,
		// then its handler returns, so Shutdown finds idle connections.
		Close:           func() { bp.Close() },
		ListenAttrs:     []any{"redis", ropts.Addr, "replica", *name},
		Ready:           ready,
		ShutdownTimeout: f.ShutdownTimeout,
		Limits:          f.Limits(),
	}
	if f.Demo {
		d.Demo = &shared.Demo{Interval: f.DemoInterval, Replica: *name, Publish: srv.publishDemo, Logger: logger}
	}
	return d.Run(ctx)
}

// publishErrors maps redisbus's publish errors to HTTP answers.
var publishErrors = shared.PublishErrors{
	OutcomeUnknown: redisbus.ErrOutcomeUnknown,
	KeyReused:      eventbus.ErrIdempotencyKeyReused,
	InvalidKey:     eventbus.ErrInvalidIdempotencyKey,
	InvalidSession: redisbus.ErrInvalidSession,
	Unavailable:    redisbus.ErrUnavailable,
}

type server struct {
	bp      *redisbus.Backplane
	auth    *shared.Auth // nil without -auth-token
	events  *eventbus.Handler
	name    string
	logger  *slog.Logger
	maxBody int64

	mu      sync.Mutex
	streams map[string]map[*shared.Stream]struct{} // open streams by session, for /disconnect
}

func (s *server) routes() http.Handler {
	mux := shared.Mux(s)
	mux.HandleFunc("POST /session/{id}/signal", s.ServeSignal)
	return s.auth.Protect(mux)
}

func (s *server) ServeIndex(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "sessiond-redis replica %s\n\n", s.name)
	io.WriteString(w, strings.TrimSuffix(usageText, "Flags:\n"))
}

// ServeEvents runs the backplane's SSE handler (whose Lookup checks the
// session's epoch with Redis and answers Redis down with 503 and
// Retry-After) on a request that /disconnect can cut.
func (s *server) ServeEvents(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if r.Method == http.MethodOptions {
		s.events.ServeHTTP(w, r)
		return
	}
	key, r := shared.Track(r)
	defer key.Done()
	s.mu.Lock()
	if s.streams[id] == nil {
		s.streams[id] = map[*shared.Stream]struct{}{}
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
	s.events.ServeHTTP(w, r)
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
	if errors.Is(err, redisbus.ErrUnavailable) {
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
	case errors.Is(err, eventbus.ErrInvalidEvent), errors.Is(err, redisbus.ErrInvalidSession):
		shared.WriteError(w, http.StatusBadRequest, "invalid_event", err.Error())
	default:
		shared.WriteUnavailable(w, "unavailable", err.Error())
	}
}

func (s *server) ServeStatus(w http.ResponseWriter, r *http.Request) {
	in, err := s.bp.Info(r.Context(), r.PathValue("id"))
	switch {
	case errors.Is(err, redisbus.ErrInvalidSession):
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
		if errors.Is(err, redisbus.ErrInvalidSession) {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		shared.WriteUnavailable(w, "unavailable", err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) ServeDisconnect(w http.ResponseWriter, r *http.Request) {
	mode, err := shared.ParseCutMode(r)
	if err != nil {
		shared.WriteError(w, http.StatusBadRequest, "invalid_mode", err.Error())
		return
	}
	s.mu.Lock()
	var cuts []*shared.Stream
	for c := range s.streams[r.PathValue("id")] {
		cuts = append(cuts, c)
	}
	s.mu.Unlock()
	for _, c := range cuts {
		c.Cut(mode)
	}
	shared.WriteJSON(w, http.StatusOK, map[string]any{"disconnected": len(cuts), "mode": mode.String()})
}

// publishDemo is the demo's Publish; an error after the demo was stopped
// is not worth a log line.
func (s *server) publishDemo(ctx context.Context, id string, ev eventbus.Event) error {
	if _, _, err := s.bp.Publish(ctx, id, ev); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}
