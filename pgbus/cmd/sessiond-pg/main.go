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
// -auth-token and -token-lifetime work as in cmd/sessiond (POST /login,
// /logout and /revoke; a revocation ends the streams of this replica). On
// SIGINT or SIGTERM it closes the backplane (open streams drain and end),
// then shuts the HTTP server down. The rows stay.
package main

import (
	"context"
	"fmt"
	"io"
	"net"

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

` + shared.AuthUsage + `
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
	auth, err := f.Auth("sessiond-pg", false)
	if err != nil {
		return err
	}

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
	h := bp.Handler()
	h.Logger, h.Heartbeat, h.Retry, h.WriteTimeout = logger, f.Heartbeat, f.Retry, f.WriteTimeout
	srv := shared.NewReplica(&shared.Replica{
		Daemon: "sessiond-pg", Usage: usageText, Name: *name, Engine: "PostgreSQL",
		Backplane: engine{bp},
		Errors: shared.PublishErrors{
			OutcomeUnknown: pgbus.ErrOutcomeUnknown,
			KeyReused:      eventbus.ErrIdempotencyKeyReused,
			InvalidKey:     eventbus.ErrInvalidIdempotencyKey,
			InvalidSession: pgbus.ErrInvalidSession,
			Unavailable:    pgbus.ErrUnavailable,
		},
		Logger: logger, MaxBody: shared.MaxBody(f.MaxEventBytes), Auth: auth,
	}, h)

	d := &shared.Server{
		Name:     "sessiond-pg",
		Listener: ln,
		Handler:  srv.Routes(),
		Logger:   logger,
		// Close the mirrors first: each stream gets what it has queued,
		// then its handler returns, so Shutdown finds idle connections.
		Close:           func() { bp.Close() },
		ListenAttrs:     []any{"pg", cfg.ConnConfig.Host, "schema", *schema, "replica", *name},
		Ready:           ready,
		ShutdownTimeout: f.ShutdownTimeout,
		Limits:          f.Limits(),
	}
	if f.Demo {
		d.Demo = &shared.Demo{Interval: f.DemoInterval, Replica: *name, Publish: srv.PublishDemo, Logger: logger}
	}
	return d.Run(ctx)
}

// engine is the backplane as the shared replica serves it.
type engine struct{ *pgbus.Backplane }

func (e engine) Info(ctx context.Context, session string) (shared.SessionInfo, error) {
	in, err := e.Backplane.Info(ctx, session)
	return shared.SessionInfo(in), err
}
