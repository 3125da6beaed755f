// Command sessiond-pg is a demo daemon for package pgbus: the session
// event routes of sessiond-redis, with every session's events in
// PostgreSQL tables, so that several replicas serve the same sessions and
// a client may resume with Last-Event-ID on any of them. Its HTTP surface
// (routes, bodies, status codes, headers) is sessiond-redis's, served by
// the same code (internal/daemon.Replica): a client cannot tell which
// engine is behind it.
//
// Usage:
//
//	go run ./cmd/sessiond-pg [-addr 127.0.0.1:8081] [-pg postgres://...] [flags]
//
// (from the pgbus module: cd pgbus first). Routes:
//
//	GET    /session/{id}/events       the SSE stream (eventbus.Handler, resumes from the table)
//	GET    /events?session=ID&...     the sessions on one SSE stream (eventbus.MuxHandler, SPEC 6.8): its
//	                                  id line is a composite cursor; 404 for a session not in the engine
//	                                  (never created here); 1 to -max-stream-sessions ids
//	GET    /ws?session=ID&...         the same stream over a WebSocket (github.com/ssebus/eventbus/websocket,
//	                                  SPEC 6.10): the same cursor resumes either route, on any replica
//	POST   /session/{id}/events       publish {"type":..., "data":..., "originatorClientId":...} -> {"id":N,"epoch":...}
//	                                  (an Idempotency-Key header makes a retry safe: see pgbus/README.md)
//	GET    /session/{id}              the session as PostgreSQL and this replica see it (404 if it has none)
//	DELETE /session/{id}              forget the session; every replica's streams of it end -> 204
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
// The rows stay.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ssebus/eventbus"
	shared "github.com/ssebus/eventbus/internal/daemon" // not "daemon": main_test.go has a func daemon
	"github.com/ssebus/eventbus/pgbus"
	"github.com/ssebus/eventbus/websocket"
)

func main() { shared.Main("sessiond-pg", run) }

// run serves a replica until ctx is done, then closes the backplane
// (streams drain) and the HTTP server; ready, when set, learns the address.
func run(ctx context.Context, args []string, logOut io.Writer, ready func(addr string)) error {
	var (
		pgURL, schema string
		sessionTTL    time.Duration
		poolSize      int
	)
	rf, err := shared.ParseReplicaFlags("sessiond-pg", "github.com/ssebus/eventbus/pgbus", "pgbus", "PostgreSQL", args, logOut, func(fs *flag.FlagSet) {
		fs.StringVar(&pgURL, "pg", "postgres://127.0.0.1:5432/postgres", "PostgreSQL URL or keyword/value connection string (libpq's PG* variables apply)")
		fs.StringVar(&schema, "schema", pgbus.DefaultSchema, "PostgreSQL schema of the tables and functions (created when missing) and prefix of the notification channels")
		fs.DurationVar(&sessionTTL, "session-ttl", 0, "delete a session after this long without a publish or a new mirror (0: never)")
		fs.IntVar(&poolSize, "pg-pool", 32, "PostgreSQL connections of this replica (one more is held by the listener)")
	})
	if err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(pgURL)
	if err != nil {
		return fmt.Errorf("-pg: %w", err)
	}
	if poolSize < 2 {
		return fmt.Errorf("-pg-pool is %d, want at least 2", poolSize)
	}
	cfg.MaxConns = int32(poolSize) // the listener takes one out of the pool: one more on the server
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("-pg: %w", err)
	}
	defer pool.Close()

	bp, err := pgbus.New(ctx, pool, pgbus.Options{
		Bus:                rf.BusOptions(rf.Logger), // its RingSize bounds each session's rows too
		PublishTimeout:     rf.PublishTimeout,
		OutageTimeout:      rf.OutageTimeout,
		IdempotencyWindow:  rf.IdempotencyWindow,
		IdleTimeout:        rf.IdleTimeout,
		ShutdownRetryAfter: rf.ShutdownRetryAfter,
		Schema:             schema,
		SessionTTL:         sessionTTL,
		Logger:             rf.Logger,
	})
	if err != nil {
		return err
	}
	return rf.Serve(ctx, shared.ReplicaServer{
		Backplane: bp,
		Errors:    shared.ReplicaErrors(pgbus.ErrOutcomeUnknown, pgbus.ErrInvalidSession, pgbus.ErrUnavailable),
		Events:    bp.Handler(), Close: func() { bp.Close() }, Ready: ready,
		WebSocket:   webSocket,
		ListenAttrs: []any{"pg", cfg.ConnConfig.Host, "schema", schema},
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
