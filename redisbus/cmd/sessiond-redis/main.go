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
//	GET    /session/{id}              the session as Redis and this replica see it (404 if Redis has none)
//	DELETE /session/{id}              forget the session in Redis; every replica's streams of it end -> 204
//	POST   /session/{id}/disconnect   cut this replica's open streams of the session -> {"disconnected":N}
//	POST   /session/{id}/signal       send {"type":..., "about":...} to the session's streams on every replica -> 204
//
// On SIGINT or SIGTERM it closes the backplane (open streams drain and
// end), then shuts the HTTP server down. The Redis keys stay.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/redisbus"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr, nil)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sessiond-redis:", err)
		os.Exit(1)
	}
}

const usageText = `sessiond-redis: a demo replica for github.com/ssebus/eventbus/redisbus.
Run several against one Redis; a client may resume on any of them.

Routes:
  GET    /session/{id}/events       SSE stream (Last-Event-ID or ?lastEventId= resumes,
                                    Event-Epoch or ?epoch= names the epoch seen; ?maxQueued=16..2048)
  POST   /session/{id}/events       publish {"type":"...","data":...,"originatorClientId":"..."}
                                    -> {"id":N,"epoch":"..."}; 400 bad body, 413 too large, 503 Redis down
  GET    /session/{id}              the session in Redis and on this replica; 404 if Redis has none
  DELETE /session/{id}              forget the session in Redis -> 204; the next use starts a new epoch
  POST   /session/{id}/disconnect   cut this replica's streams of the session -> {"disconnected":N}
  POST   /session/{id}/signal       change signal {"type":"...","about":"..."} to the session's
                                    streams on every replica (no id, not stored) -> 204

Flags:
`

// run parses args, serves until ctx is done, then shuts down. ready, when
// set, is called with the listen address once the daemon serves.
func run(ctx context.Context, args []string, logOut io.Writer, ready func(addr string)) error {
	fs := flag.NewFlagSet("sessiond-redis", flag.ContinueOnError)
	fs.SetOutput(logOut)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageText)
		fs.PrintDefaults()
	}
	var (
		addr           = fs.String("addr", "127.0.0.1:8081", "listen address")
		redisAddr      = fs.String("redis", "127.0.0.1:6379", "Redis address host:port, or a redis:// URL")
		name           = fs.String("name", "", "replica name for logs and GET /session/{id} (default: the listen address)")
		prefix         = fs.String("prefix", redisbus.DefaultKeyPrefix, "prefix of every Redis key")
		ringSize       = fs.Int("ring", 0, "events each session's stream keeps for resumes (0: eventbus default 8000)")
		maxSubs        = fs.Int("max-subscribers", 0, "concurrent streams per session on this replica (0: eventbus default 64)")
		maxQueued      = fs.Int("max-queued", 0, "per-stream live frame backlog (0: eventbus default 256)")
		maxEvent       = fs.Int("max-event-bytes", 0, "largest encoded event a POST may publish (0: eventbus default 16 MiB)")
		publishTimeout = fs.Duration("publish-timeout", 0, "bound of one publish in Redis (0: redisbus default 2s)")
		idleTimeout    = fs.Duration("idle-timeout", 0, "release a session's mirror after this long without streams here (0: redisbus default 1m)")
		keyTTL         = fs.Duration("key-ttl", 0, "expire a session's Redis keys after this long without a publish (0: never)")
		poolSize       = fs.Int("redis-pool", 256, "Redis connections; every session with streams here holds one in XREAD")
		heartbeat      = fs.Duration("heartbeat", 0, "SSE heartbeat after this long without a write (0: handler default 15s)")
		retry          = fs.Duration("retry", 0, "SSE retry: directive sent to clients (0: handler default 3s)")
		writeTimeout   = fs.Duration("write-timeout", 0, "deadline of one SSE write+flush (0: handler default 30s)")
		demo           = fs.Bool("demo", false, `publish "tick" events to session "demo"`)
		demoInterval   = fs.Duration("demo-interval", 500*time.Millisecond, "interval between demo ticks")
		shutdownWait   = fs.Duration("shutdown-timeout", 10*time.Second, "how long shutdown waits for open requests")
		verbose        = fs.Bool("v", false, "debug logging")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: level}))

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

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	if *name == "" {
		*name = ln.Addr().String()
	}
	bp, err := redisbus.New(client, redisbus.Options{
		Bus: eventbus.Options{
			MaxSubscribers: *maxSubs,
			MaxQueued:      *maxQueued,
			MaxEventBytes:  *maxEvent,
			Logger:         logger,
		},
		RingSize:       *ringSize,
		PublishTimeout: *publishTimeout,
		IdleTimeout:    *idleTimeout,
		KeyPrefix:      *prefix,
		KeyTTL:         *keyTTL,
		Logger:         logger,
	})
	if err != nil {
		ln.Close()
		return err
	}
	maxBody := int64(*maxEvent)
	if maxBody == 0 {
		maxBody = eventbus.DefaultMaxEventBytes
	}
	srv := &server{bp: bp, name: *name, logger: logger, maxBody: maxBody + 1<<20, streams: map[string]map[*context.CancelFunc]struct{}{}}
	h := bp.Handler()
	h.Logger, h.Heartbeat, h.Retry, h.WriteTimeout = logger, *heartbeat, *retry, *writeTimeout
	srv.events = h

	hs := &http.Server{
		Handler:           srv.routes(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	logger.Info("sessiond-redis listening", "addr", ln.Addr().String(), "redis", ropts.Addr, "replica", *name)
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	if ready != nil {
		ready(ln.Addr().String())
	}

	demoDone := make(chan struct{})
	demoCtx, stopDemo := context.WithCancel(ctx)
	defer stopDemo()
	if *demo {
		go func() {
			defer close(demoDone)
			srv.runDemo(demoCtx, "demo", *demoInterval)
		}()
	} else {
		close(demoDone)
	}

	select {
	case err := <-serveErr:
		stopDemo()
		<-demoDone
		bp.Close()
		return err
	case <-ctx.Done():
	}
	logger.Info("sessiond-redis shutting down")
	stopDemo()
	<-demoDone
	// Close the mirrors first: each stream gets what it has queued, then
	// its handler returns, so Shutdown finds idle connections.
	bp.Close()
	sctx, cancel := context.WithTimeout(context.Background(), *shutdownWait)
	defer cancel()
	err = hs.Shutdown(sctx)
	if err != nil {
		logger.Warn("shutdown timed out; closing connections", "err", err)
		err = hs.Close()
	}
	if serr := <-serveErr; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}

type server struct {
	bp      *redisbus.Backplane
	events  *eventbus.Handler
	name    string
	logger  *slog.Logger
	maxBody int64

	mu      sync.Mutex
	streams map[string]map[*context.CancelFunc]struct{} // open streams by session, for /disconnect
}

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.serveIndex)
	mux.HandleFunc("GET /session/{id}/events", s.serveEvents)
	mux.HandleFunc("POST /session/{id}/events", s.servePublish)
	mux.HandleFunc("GET /session/{id}", s.serveStatus)
	mux.HandleFunc("DELETE /session/{id}", s.serveDelete)
	mux.HandleFunc("POST /session/{id}/disconnect", s.serveDisconnect)
	mux.HandleFunc("POST /session/{id}/signal", s.serveSignal)
	return mux
}

func (s *server) serveIndex(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "sessiond-redis replica %s\n\n", s.name)
	io.WriteString(w, strings.TrimSuffix(usageText, "Flags:\n"))
}

// serveEvents runs the backplane's SSE handler under a context that
// /disconnect can cancel, as a client disconnect would.
func (s *server) serveEvents(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ctx, cancel := context.WithCancel(r.Context())
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

type publishRequest struct {
	Type               string          `json:"type"`
	Data               json.RawMessage `json:"data"`
	OriginatorClientID string          `json:"originatorClientId"`
}

func (s *server) servePublish(w http.ResponseWriter, r *http.Request) {
	var req publishRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, s.maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", err.Error())
			return
		}
		writeError(w, http.StatusBadRequest, "invalid_body", "malformed body: "+err.Error())
		return
	}
	ev := eventbus.Event{Type: req.Type, OriginatorClientID: req.OriginatorClientID}
	if req.Data != nil {
		ev.Data = req.Data
	}
	id, epoch, err := s.bp.Publish(r.Context(), r.PathValue("id"), ev)
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "epoch": epoch})
	case errors.Is(err, eventbus.ErrEventTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, "event_too_large", err.Error())
	case errors.Is(err, eventbus.ErrInvalidEvent), errors.Is(err, redisbus.ErrInvalidSession):
		writeError(w, http.StatusBadRequest, "invalid_event", err.Error())
	case errors.Is(err, redisbus.ErrUnavailable), errors.Is(err, eventbus.ErrClosed):
		s.logger.Warn("publish failed", "session", r.PathValue("id"), "err", err)
		writeError(w, http.StatusServiceUnavailable, "unavailable", "publish failed: Redis unavailable")
	default:
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
	}
}

func (s *server) serveSignal(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Type  string `json:"type"`
		About string `json:"about"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_body", "malformed body: "+err.Error())
		return
	}
	err := s.bp.Signal(r.Context(), r.PathValue("id"), req.Type, req.About)
	switch {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
	case errors.Is(err, eventbus.ErrEventTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, "event_too_large", err.Error())
	case errors.Is(err, eventbus.ErrInvalidEvent), errors.Is(err, redisbus.ErrInvalidSession):
		writeError(w, http.StatusBadRequest, "invalid_event", err.Error())
	default:
		writeError(w, http.StatusServiceUnavailable, "unavailable", err.Error())
	}
}

func (s *server) serveStatus(w http.ResponseWriter, r *http.Request) {
	in, err := s.bp.Info(r.Context(), r.PathValue("id"))
	switch {
	case errors.Is(err, redisbus.ErrInvalidSession):
		writeError(w, http.StatusNotFound, "session_not_found", "session not found")
		return
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, "unavailable", err.Error())
		return
	case !in.Exists:
		writeError(w, http.StatusNotFound, "session_not_found", "session not found")
		return
	}
	s.mu.Lock()
	open := len(s.streams[r.PathValue("id")])
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{
		"id": r.PathValue("id"), "replica": s.name,
		"epoch": in.Epoch, "lastEventId": in.LastEventID, "firstEventId": in.FirstEventID, "bytes": in.Bytes,
		"local": in.Local, "localLastEventId": in.LocalLastEventID, "subscribers": in.Subscribers, "streams": open,
	})
}

func (s *server) serveDelete(w http.ResponseWriter, r *http.Request) {
	if err := s.bp.Delete(r.Context(), r.PathValue("id")); err != nil {
		if errors.Is(err, redisbus.ErrInvalidSession) {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		writeError(w, http.StatusServiceUnavailable, "unavailable", err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *server) serveDisconnect(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	var cancels []context.CancelFunc
	for c := range s.streams[r.PathValue("id")] {
		cancels = append(cancels, *c)
	}
	s.mu.Unlock()
	for _, c := range cancels {
		c()
	}
	writeJSON(w, http.StatusOK, map[string]int{"disconnected": len(cancels)})
}

// runDemo publishes a "tick" event to session id every interval until ctx
// is done.
func (s *server) runDemo(ctx context.Context, id string, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			n++
			data := fmt.Appendf(nil, `{"n":%d,"at":%q,"replica":%q}`, n, now.UTC().Format(time.RFC3339Nano), s.name)
			if _, _, err := s.bp.Publish(ctx, id, eventbus.Event{Type: "tick", Data: json.RawMessage(data)}); err != nil && ctx.Err() == nil {
				s.logger.Warn("demo publish failed", "session", id, "err", err)
			}
		}
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"internal","code":"internal"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]string{"error": msg, "code": code})
}
