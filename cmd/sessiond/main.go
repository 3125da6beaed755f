// Command sessiond is a demo daemon for package eventbus: one event bus per
// session, streamed to browsers over Server-Sent Events.
//
// Usage:
//
//	go run ./cmd/sessiond [-addr 127.0.0.1:8080] [-demo] [flags]
//
// Routes (Go 1.22 ServeMux patterns):
//
//	GET    /                              a viewer page that watches one session live
//	GET    /static/eventbus-client/{file} the JavaScript client's modules the viewer imports
//	                                      (the files of clients/js, embedded)
//	GET    /session/{id}/events           the SSE stream (eventbus.Handler); creates the session on first use
//	POST   /session/{id}/events           publish {"type":..., "data":..., "originatorClientId":...} -> {"id":N,"epoch":...}
//	GET    /session/{id}                  status of a session as JSON (404 if it does not exist)
//	DELETE /session/{id}                  close the session's bus and forget it (its streams drain and end) -> 204
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
// A GET or POST after DELETE starts a new session with a new epoch. With -demo
// the daemon publishes "tick" events to session "demo". The SSE ids carry the
// epoch (-epoch-ids, on by default, so that a browser's own Last-Event-ID
// names it); other origins may open the stream with -cors-origin. It serves HTTP/1.1 and h2c,
// or HTTPS with HTTP/2 with -tls-cert and -tls-key. A route answers a wrong
// method with a JSON 405 and an unknown path with a JSON 404. On SIGINT or
// SIGTERM it closes every bus (open streams drain and end), then shuts the
// HTTP server down.
package main

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/internal/daemon"
)

func main() { daemon.Main("sessiond", run) }

const usageText = `sessiond: a demo daemon for github.com/ssebus/eventbus.

Routes:
  GET    /                          viewer page (?session=ID, default "demo"; ?transport=fetch,
                                    ?maxQueued=N, ?types=a,b), read with the JavaScript client
  GET    /static/eventbus-client/F  the JavaScript client's modules (index.js, client.js, parser.js)
  GET    /session/{id}/events       SSE stream; creates the session on first use
                                    (Last-Event-ID or ?lastEventId= resumes; ?maxQueued=16..2048)
  POST   /session/{id}/events       publish {"type":"...","data":...,"originatorClientId":"..."}
                                    -> {"id":N,"epoch":"..."}; 400 bad body or type, 413 too large.
                                    With an Idempotency-Key header a retry of the same event within
                                    -idempotency-window (up to 256 keys per session) appends nothing
                                    -> {"id":<first>,"epoch":"...","duplicate":true}; the key with
                                    another event: 422 idempotency_key_reused
  GET    /session/{id}              session status as JSON; 404 if the session does not exist
  DELETE /session/{id}              close the session's bus and forget it -> 204; the next
                                    GET or POST starts a new session with a new epoch
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
// closed first (open streams drain and end), then the HTTP server. ready,
// when set, is called with the listen address once the daemon serves.
func run(ctx context.Context, args []string, logOut io.Writer, ready func(addr string)) error {
	fs, f := daemon.NewFlags("sessiond", usageText, logOut, daemon.FlagDocs{
		DefaultAddr:    "127.0.0.1:8080",
		Ring:           "replay ring size in events per session (0: eventbus default 8000)",
		MaxSubscribers: "concurrent streams per session (0: eventbus default 64)",
		WriteTimeout:   "deadline of one SSE write+flush; a stream that blocks past it is dropped (0: handler default 30s)",
	})
	maxSessions := fs.Int("max-sessions", 1000, "sessions the daemon keeps at once; a new one beyond this is refused with 503")
	if err := daemon.Parse(fs, args); err != nil {
		return err
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

	srv, err := newServer(config{
		Options:     f.BusOptions(logger),
		MaxSessions: *maxSessions,
		Stream:      f.Handler,
		Logger:      logger,
		Auth:        auth,

		IdempotencyWindow: f.IdempotencyWindow,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", f.Addr)
	if err != nil {
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
		Close:           srv.closeAll,
		Ready:           ready,
		ShutdownTimeout: f.ShutdownTimeout,
		Limits:          f.Limits(),
	}
	if f.Demo {
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
