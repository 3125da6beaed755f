// Command sessiond-redis is a demo daemon for package redisbus: the
// session event routes of cmd/sessiond, with every session's events in a
// Redis stream, so that several replicas serve the same sessions and a
// client may resume with Last-Event-ID on any of them. Its HTTP surface is
// sessiond-pg's, served by the same code (internal/daemon.Replica).
//
// Usage:
//
//	go run ./cmd/sessiond-redis [-addr 127.0.0.1:8081] [-redis 127.0.0.1:6379] [flags]
//
// (from the redisbus module: cd redisbus first). Routes:
//
//	GET    /session/{id}/events       the SSE stream (eventbus.Handler, resumes from Redis)
//	GET    /events?session=ID&...     the sessions on one SSE stream (eventbus.MuxHandler, SPEC 6.8): its
//	                                  id line is a composite cursor; 404 for a session not in the engine
//	                                  (never created here); 1 to -max-stream-sessions ids
//	GET    /ws?session=ID&...         the same stream over a WebSocket (github.com/ssebus/eventbus/websocket,
//	                                  SPEC 6.10): the same cursor resumes either route, on any replica
//	POST   /session/{id}/events       publish {"type":..., "data":..., "originatorClientId":...} -> {"id":N,"epoch":...}
//	                                  (an Idempotency-Key header makes a retry safe: see redisbus/README.md)
//	GET    /session/{id}              the session as Redis and this replica see it (404 if Redis has none)
//	DELETE /session/{id}              forget the session in Redis; every replica's streams of it end -> 204
//	POST   /session/{id}/disconnect   cut this replica's open streams of the session -> {"disconnected":N,"mode":...}
//	                                  (?mode=clean ends the responses, ?mode=abort resets the connections)
//	POST   /session/{id}/signal       send {"type":..., "about":...} to the session's streams on every replica -> 204
//
// The flags of cmd/sessiond apply (epoch ids on by default, -cors-origin,
// h2c, -tls-cert/-tls-key, the header and body limits, -auth-token and
// -token-lifetime with POST /login, /logout and /revoke; a revocation ends
// the streams of this replica). On SIGINT or SIGTERM it closes the
// backplane (open streams drain, get stream_error shutdown with
// -shutdown-retry-after, and end) while the HTTP server shuts down, within
// -shutdown-timeout.
// The Redis keys stay.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ssebus/eventbus"
	shared "github.com/ssebus/eventbus/internal/daemon" // not "daemon": main_test.go has a func daemon
	"github.com/ssebus/eventbus/redisbus"
	"github.com/ssebus/eventbus/websocket"
)

func main() { shared.Main("sessiond-redis", run) }

// run parses args, serves until ctx is done, then shuts down. ready, when
// set, is called with the listen address once the daemon serves.
func run(ctx context.Context, args []string, logOut io.Writer, ready func(addr string)) error {
	var (
		redisAddr, prefix string
		keyTTL            time.Duration
		poolSize          int
	)
	rf, err := shared.ParseReplicaFlags("sessiond-redis", "github.com/ssebus/eventbus/redisbus", "redisbus", "Redis", args, logOut, func(fs *flag.FlagSet) {
		fs.StringVar(&redisAddr, "redis", "127.0.0.1:6379", "Redis address host:port, or a redis:// URL")
		fs.StringVar(&prefix, "prefix", redisbus.DefaultKeyPrefix, "prefix of every Redis key")
		fs.DurationVar(&keyTTL, "key-ttl", 0, "expire a session's Redis keys after this long without a publish (0: never)")
		fs.IntVar(&poolSize, "redis-pool", 256, "Redis connections; every session with streams here holds one in XREAD")
	})
	if err != nil {
		return err
	}
	ropts := &redis.Options{Addr: redisAddr}
	if strings.Contains(redisAddr, "://") {
		if ropts, err = redis.ParseURL(redisAddr); err != nil {
			return fmt.Errorf("-redis: %w", err)
		}
	}
	// Publish must never hang on a stalled Redis: honour context deadlines.
	ropts.ContextTimeoutEnabled = true
	ropts.PoolSize = poolSize
	client := redis.NewClient(ropts)
	defer client.Close()

	bp, err := redisbus.New(client, redisbus.Options{
		Bus:                rf.BusOptions(rf.Logger), // its RingSize bounds each session's stream too
		PublishTimeout:     rf.PublishTimeout,
		IdleTimeout:        rf.IdleTimeout,
		ShutdownRetryAfter: rf.ShutdownRetryAfter,
		KeyPrefix:          prefix,
		KeyTTL:             keyTTL,
		Logger:             rf.Logger,

		IdempotencyWindow: rf.IdempotencyWindow,
		OutageTimeout:     rf.OutageTimeout,
	})
	if err != nil {
		return err
	}
	return rf.Serve(ctx, shared.ReplicaServer{
		Backplane: bp,
		Errors:    shared.ReplicaErrors(redisbus.ErrOutcomeUnknown, redisbus.ErrInvalidSession, redisbus.ErrUnavailable),
		Events:    bp.Handler(), Close: func() { bp.Close() }, Ready: ready,
		WebSocket:   webSocket,
		ListenAttrs: []any{"redis", ropts.Addr},
	})
}

// webSocket is the replica's GET /ws: the multiplexed stream over a
// WebSocket (github.com/ssebus/eventbus/websocket, docs/SPEC.md 6.10) on
// the replica's MuxHandler, so with the same sessions, Lookup, Authorize,
// limits and cursor as its GET /events; track keeps its streams for
// /disconnect, as they outlive their requests.
func webSocket(m *eventbus.MuxHandler, track shared.StreamContext) http.Handler {
	return &websocket.Handler{Mux: m, StreamContext: track}
}
