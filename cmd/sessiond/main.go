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
//	GET    /session/{id}/events           the SSE stream (eventbus.Handler); creates the session on first use
//	POST   /session/{id}/events           publish {"type":..., "data":..., "originatorClientId":...} -> {"id":N,"epoch":...}
//	GET    /session/{id}                  status of a session as JSON (404 if it does not exist)
//	DELETE /session/{id}                  close the session's bus and forget it (its streams drain and end) -> 204
//	POST   /session/{id}/disconnect       cut every open stream of the session, as a load balancer would;
//	                                      clients reconnect by themselves and resume with Last-Event-ID
//
// A GET or POST after DELETE starts a new session with a new epoch. With -demo
// the daemon publishes "tick" events to session "demo". On SIGINT or SIGTERM it
// closes every bus (open streams drain and end), then shuts the HTTP server
// down.
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
	"syscall"
	"time"

	"github.com/ssebus/eventbus"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sessiond:", err)
		os.Exit(1)
	}
}

const usageText = `sessiond: a demo daemon for github.com/ssebus/eventbus.

Routes:
  GET    /                          viewer page (?session=ID, default "demo")
  GET    /session/{id}/events       SSE stream; creates the session on first use
                                    (Last-Event-ID or ?lastEventId= resumes; ?maxQueued=16..2048)
  POST   /session/{id}/events       publish {"type":"...","data":...,"originatorClientId":"..."}
                                    -> {"id":N,"epoch":"..."}; 400 bad body or type, 413 too large
  GET    /session/{id}              session status as JSON; 404 if the session does not exist
  DELETE /session/{id}              close the session's bus and forget it -> 204; the next
                                    GET or POST starts a new session with a new epoch
  POST   /session/{id}/disconnect   demo feature: cut every open stream of the session, as a
                                    load balancer would; clients reconnect and resume with
                                    Last-Event-ID -> {"disconnected":N}

Flags:
`

// run parses args, serves until ctx is done, then shuts down: every bus is
// closed first (open streams drain and end), then the HTTP server.
func run(ctx context.Context, args []string, logOut io.Writer) error {
	fs := flag.NewFlagSet("sessiond", flag.ContinueOnError)
	fs.SetOutput(logOut)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageText)
		fs.PrintDefaults()
	}
	var (
		addr         = fs.String("addr", "127.0.0.1:8080", "listen address")
		ringSize     = fs.Int("ring", 0, "replay ring size in events per session (0: eventbus default 8000)")
		maxSubs      = fs.Int("max-subscribers", 0, "concurrent streams per session (0: eventbus default 64)")
		maxQueued    = fs.Int("max-queued", 0, "per-stream live frame backlog (0: eventbus default 256)")
		maxEvent     = fs.Int("max-event-bytes", 0, "largest encoded event a POST may publish (0: eventbus default 16 MiB)")
		maxSessions  = fs.Int("max-sessions", 1000, "sessions the daemon keeps at once; a new one beyond this is refused with 503")
		demo         = fs.Bool("demo", false, `publish "tick" events to session "demo"`)
		demoInterval = fs.Duration("demo-interval", 500*time.Millisecond, "interval between demo ticks")
		heartbeat    = fs.Duration("heartbeat", 0, "SSE heartbeat after this long without a write (0: handler default 15s)")
		retry        = fs.Duration("retry", 0, "SSE retry: directive sent to clients (0: handler default 3s)")
		writeTimeout = fs.Duration("write-timeout", 0, "deadline of one SSE write+flush; a stream that blocks past it is dropped (0: handler default 30s)")
		shutdownWait = fs.Duration("shutdown-timeout", 10*time.Second, "how long shutdown waits for open requests")
		verbose      = fs.Bool("v", false, "debug logging")
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

	srv, err := newServer(config{
		Options: eventbus.Options{
			RingSize:       *ringSize,
			MaxSubscribers: *maxSubs,
			MaxQueued:      *maxQueued,
			MaxEventBytes:  *maxEvent,
			Logger:         logger,
		},
		MaxSessions:  *maxSessions,
		Heartbeat:    *heartbeat,
		Retry:        *retry,
		WriteTimeout: *writeTimeout,
		Logger:       logger,
	})
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	hs := &http.Server{
		Handler:           srv.routes(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		// No WriteTimeout: streams are long-lived; the SSE handler puts a
		// deadline on each write instead.
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	logger.Info("sessiond listening", "addr", ln.Addr().String(), "url", "http://"+ln.Addr().String()+"/")

	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()

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
		srv.closeAll()
		return err
	case <-ctx.Done():
	}

	logger.Info("sessiond shutting down")
	stopDemo()
	<-demoDone
	// Close the buses first: each stream receives what it has queued, then
	// its handler returns, so Shutdown finds idle connections instead of
	// waiting on streams that would never end by themselves.
	srv.closeAll()
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

// runDemo publishes a "tick" event with a counter to session id every interval
// until ctx is done. After a DELETE of the session the next tick starts a new one.
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
			data := fmt.Appendf(nil, `{"n":%d,"at":%q}`, n, now.UTC().Format(time.RFC3339Nano))
			if _, _, err := s.publish(id, eventbus.Event{Type: "tick", Data: json.RawMessage(data)}); err != nil && !errors.Is(err, errShuttingDown) {
				s.logger.Warn("demo publish failed", "session", id, "err", err)
			}
		}
	}
}
