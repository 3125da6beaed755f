// Command sessiond is a demo daemon for package eventbus: one event bus per
// session, streamed to browsers over Server-Sent Events.
//
// Usage:
//
//	cd cmd/sessiond && go run . [-addr 127.0.0.1:8080] [-demo] [flags]
//
// It is a module of its own (github.com/ssebus/eventbus/cmd/sessiond), so
// that what it depends on never reaches the root module's importers; its
// go.mod replaces the root module with the working tree, so it is run from
// a checkout, never installed or imported.
//
// Routes (Go 1.22 ServeMux patterns):
//
//	GET    /                              a viewer page that watches one session live, or several on one
//	                                      connection (?sessions=a,b,c: one column each)
//	GET    /static/eventbus-client/{file} the JavaScript client's modules the viewer imports
//	                                      (the files of clients/js, embedded)
//	GET    /session/{id}/events           the SSE stream (eventbus.Handler); 404 session_not_found for a
//	                                      session that does not exist (never creates one; HEAD neither)
//	GET    /events?session=ID&session=ID… several sessions on one SSE stream (eventbus.MuxHandler): 1 to
//	                                      -max-stream-sessions distinct ids, else 400 invalid_sessions; 404
//	                                      session_not_found naming the first unknown one; every frame's
//	                                      envelope names its session, every event's id line is the
//	                                      composite cursor that resumes each session exactly
//	GET    /ws?session=ID&session=ID…     the same stream over a WebSocket (github.com/ssebus/eventbus/websocket):
//	                                      each event's line is the envelope of GET /events, the cursor comes
//	                                      in its own line and resumes either route; sessions are added and
//	                                      removed on the open socket ({"op":"add"|"remove",...})
//	POST   /session/{id}/events           publish {"type":..., "data":..., "originatorClientId":...} -> {"id":N,"epoch":...};
//	                                      creates the session; 503 too_many_sessions when -max-sessions are live
//	GET    /session/{id}                  status of a session as JSON (404 if it does not exist)
//	DELETE /session/{id}                  close the session's bus and forget it (its streams drain and end) -> 204
//	POST   /session/{id}/signal           change signal {"type":...,"about":...} to the session's streams (no id,
//	                                      never stored) -> 204; a session that does not exist has none to tell
//	POST   /session/{id}/disconnect       cut every open stream of the session, as a load balancer would:
//	                                      ?mode=clean (default) ends the responses, ?mode=abort resets
//	                                      their TCP connections; clients reconnect by themselves and
//	                                      resume with Last-Event-ID
//
// With -auth-token every /session route needs "Authorization: Bearer <token>"
// or the cookie of POST /login (the viewer shows a login form), and
// -token-lifetime bounds each stream and login; POST /logout and POST
// /revoke end a subject's streams (README "Access control").
//
// The sessions live in an eventbus.Hub: -max-sessions bounds them, a session
// without a publish and without a stream for -idle-timeout is closed and
// forgotten (a full hub of idle sessions makes room at once), and
// -max-total-bytes bounds every replay ring and every remembered
// Idempotency-Key together (the Hub keeps the keys). A POST after DELETE or
// expiry starts a new session with a new epoch. Request headers and bodies
// are bounded (-header-timeout, -body-timeout, -body-budget; see
// internal/daemon.Limits). Unless GOMEMLIMIT is set, the Go runtime's memory
// limit is set from the budget these flags make (internal/daemon.MemoryBudget:
// -max-total-bytes, which holds the rings and what streams hold beyond
// them, the body budget, an eighth more and 32 MiB) and logged at start. With -demo
// the daemon publishes "tick" events to session "demo". The SSE ids carry the
// epoch (-epoch-ids, on by default, so that a browser's own Last-Event-ID
// names it); other origins may open the stream with -cors-origin. It serves HTTP/1.1 and h2c,
// or HTTPS with HTTP/2 with -tls-cert and -tls-key. A route answers a wrong
// method with a JSON 405 and an unknown path with a JSON 404. On SIGINT or
// SIGTERM it stops accepting connections and shuts the hub down: every open
// stream gets what is queued, then stream_error shutdown with
// -shutdown-retry-after (its client comes back after a random delay between
// that and twice it), and ends; at -shutdown-timeout the connections left (a
// client that does not read) are closed and the daemon exits.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/internal/daemon"
)

func main() { daemon.Main("sessiond", run) }

const usageText = `sessiond: a demo daemon for github.com/ssebus/eventbus.

Routes:
  GET    /                          viewer page (?session=ID, default "demo"; ?sessions=A,B,... watches
                                    several on one connection, one column each; ?transport=fetch,
                                    ?maxQueued=N, ?types=a,b), read with the JavaScript client
  GET    /static/eventbus-client/F  the JavaScript client's modules (index.js, client.js, cursor.js, parser.js)
  GET    /session/{id}/events       SSE stream (Last-Event-ID or ?lastEventId= resumes;
                                    ?maxQueued=16..2048); 404 session_not_found when the
                                    session does not exist: a GET or HEAD never creates one
  GET    /events?session=ID&...     several sessions on one SSE stream (one connection: a
                                    browser opens at most 6 per host over HTTP/1.1). 1 to
                                    -max-stream-sessions distinct ids, else 400 invalid_sessions;
                                    404 session_not_found with "session" naming the first unknown
                                    one; every frame's JSON starts with "session":"<id>"; each
                                    event's id: is a cursor of every session (m1...), which
                                    Last-Event-ID or ?lastEventId= gives back to resume each
                                    session exactly (?types=, ?maxQueued= as above, per session)
  POST   /session/{id}/events       publish {"type":"...","data":...,"originatorClientId":"..."}
                                    -> {"id":N,"epoch":"..."}, creating the session; 400 bad body
                                    or type, 413 too large, 408 body slower than -body-timeout,
                                    503 server_busy (-body-budget) or too_many_sessions
                                    (-max-sessions live, none idle) with Retry-After.
                                    With an Idempotency-Key header a retry of the same event within
                                    -idempotency-window (up to 256 keys per session, counted in
                                    -max-total-bytes) appends nothing
                                    -> {"id":<first>,"epoch":"...","duplicate":true}; the key with
                                    another event: 422 idempotency_key_reused
  GET    /session/{id}              session status as JSON; 404 if the session does not exist
  DELETE /session/{id}              close the session's bus and forget it -> 204; the next
                                    POST starts a new session with a new epoch (so does a POST
                                    after -idle-timeout without a publish or a stream)
  POST   /session/{id}/signal       change signal {"type":"...","about":"..."} to the session's
                                    streams (no id, not stored) -> 204
  POST   /session/{id}/disconnect   demo feature: cut every open stream of the session, as a
                                    load balancer would; clients reconnect and resume with
                                    Last-Event-ID -> {"disconnected":N,"mode":...}
                                    ?mode=clean (default): end the responses; ?mode=abort:
                                    reset their TCP connections (on HTTP/2, every request on them)

HTTP/1.1 and h2c (HTTP/2 with prior knowledge); HTTPS with HTTP/2 with -tls-cert/-tls-key.

` + daemon.AuthUsage + `
Flags:
`

// run parses args, serves until ctx is done, then shuts down: every bus is
// closed (open streams drain, get stream_error shutdown and end) while the
// HTTP server shuts down, within -shutdown-timeout. ready, when set, is
// called with the listen address once the daemon serves.
func run(ctx context.Context, args []string, logOut io.Writer, ready func(addr string)) error {
	fs, f := daemon.NewFlags("sessiond", usageText, logOut, daemon.FlagDocs{
		DefaultAddr:    "127.0.0.1:8080",
		Ring:           "replay ring size in events per session (0: eventbus default 8000)",
		MaxSubscribers: "concurrent streams per session (0: eventbus default 64)",
		WriteTimeout:   "deadline of one SSE write+flush; a stream that blocks past it is dropped (0: handler default 30s)",
		StreamSessions: "the most sessions one multiplexed stream (GET /events?session=...) serves, 1 to 256; more is 400 invalid_sessions",
	})
	var (
		maxSessions   = fs.Int("max-sessions", 0, "sessions held at once; a new one beyond this, when none is idle, gets 503 too_many_sessions (0: eventbus default 1000)")
		idleTimeout   = fs.Duration("idle-timeout", 0, "close and forget a session after this long without a publish and without a stream; its next publish starts a new epoch (0: eventbus default 10m; negative: never)")
		maxTotalBytes = fs.Int64("max-total-bytes", 0, "bound on the sum of every session's replay ring bytes and remembered Idempotency-Keys; past it the oldest events of the largest rings go, and resumes past them get ring_evicted, then, with every ring empty, the oldest keys (0: eventbus default 256 MiB)")
		maxAge        = fs.Duration("max-age", 0, "events older than this leave the replay ring; resumes past them get ring_evicted (0: no age bound)")
		createStream  = fs.Bool("create-on-stream", false, "a GET or HEAD of a stream (of /session/{id}/events, or of /events for each of its sessions) creates its session, as a POST does: the behavior before the hub, for tests of clients that reconnect across restarts (it lets a client fill -max-sessions with idle sessions for -idle-timeout)")
	)
	if err := daemon.Parse(fs, args); err != nil {
		return err
	}
	if n := f.MaxStreamSessions; n < 1 || n > eventbus.MaxCursorEntries {
		return fmt.Errorf("-max-stream-sessions %d: must be 1 to %d", n, eventbus.MaxCursorEntries)
	}
	logger := f.Logger(logOut)
	tlsConfig, err := f.TLSConfig()
	if err != nil {
		return err
	}
	auth, err := f.Auth("sessiond", tlsConfig != nil)
	if err != nil {
		return err
	}

	bus := f.BusOptions(logger)
	bus.MaxAge = *maxAge
	srv, err := newServer(config{
		Hub: eventbus.HubOptions{
			Bus:           bus,
			MaxSessions:   *maxSessions,
			IdleTimeout:   *idleTimeout,
			MaxTotalBytes: *maxTotalBytes,
			Logger:        logger,

			ShutdownRetryAfter: f.ShutdownRetryAfter,
			IdempotencyWindow:  f.IdempotencyWindow,
		},
		Stream:         f.Handler,
		Logger:         logger,
		Auth:           auth,
		CreateOnStream: *createStream,

		MaxStreamSessions: f.MaxStreamSessions,
		BodyTimeout:       f.BodyTimeout,
		BodyBudget:        f.BodyBudget,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", f.Addr)
	if err != nil {
		srv.hub.Close()
		return err
	}
	scheme := "http://"
	if tlsConfig != nil {
		scheme = "https://"
	}
	d := &daemon.Server{
		Name:            "sessiond",
		Listener:        ln,
		Handler:         srv.routes(),
		TLS:             tlsConfig,
		Logger:          logger,
		ListenAttrs:     []any{"url", scheme + ln.Addr().String() + "/"},
		Close:           srv.shutdown,
		Ready:           ready,
		ShutdownTimeout: f.ShutdownTimeout,
		Limits:          f.Limits(),
		Debug:           f.Debug,
		Memory:          f.HubMemoryBudget(srv.hub.Stats().MaxTotalBytes),
	}
	if f.Demo {
		// The demo session exists from the start, so that a viewer can
		// watch it before the first tick; the ticks keep it from expiring.
		if _, err := srv.hub.GetOrCreate(daemon.DemoSession); err != nil {
			srv.hub.Close()
			ln.Close()
			return err
		}
		d.Demo = &daemon.Demo{Interval: f.DemoInterval, Publish: srv.publishDemo, Logger: logger}
	}
	return d.Run(ctx)
}

// publishDemo is the demo's Publish. After a DELETE of the session the next
// tick starts a new one; a tick refused because the daemon shuts down is
// not worth a log line.
func (s *server) publishDemo(_ context.Context, id string, ev eventbus.Event) error {
	if _, _, err := s.publish(id, ev); err != nil && !errors.Is(err, errShuttingDown) {
		return err
	}
	return nil
}
