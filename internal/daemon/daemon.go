// Package daemon holds what the two demo daemons, cmd/sessiond (in-memory
// buses) and redisbus/cmd/sessiond-redis (buses mirrored from Redis), do
// alike: the process entry point, the shared flags, the listen, serve and
// graceful-shutdown sequence, the debug listener (-debug-addr), the demo
// publisher, the route table and the JSON responses, and the routes of a
// backplane daemon over any engine (Replica, which pgbus/cmd/sessiond-pg
// serves). What is specific to a daemon (how sessions are found, created,
// published to and deleted) stays in the daemon.
//
// It is internal to github.com/ssebus/eventbus; the redisbus and pgbus
// modules may import it because their import paths lie under that prefix.
package daemon

import (
	"context"
	"crypto/tls"
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
)

// Main is a daemon's func main. It calls run with a context that is
// cancelled on SIGINT or SIGTERM, os.Args[1:], os.Stderr and a nil ready
// (a test passes its own, to learn the listen address), and blocks until
// run returns. Then it exits the process: with status 0 when run
// returned nil or flag.ErrHelp (-h), else with status 1 after printing
// "name: err" to os.Stderr. It never returns.
func Main(name string, run func(ctx context.Context, args []string, logOut io.Writer, ready func(addr string)) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr, nil)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Server is one daemon's HTTP server and what its shutdown closes. Fill it
// in and call Run once; a Server must not be copied or reused after Run.
//
// It serves HTTP/1.1 and HTTP/2: over TLS (with TLS set) HTTP/2 is
// negotiated as browsers do; without TLS a client may speak HTTP/2 with
// prior knowledge (h2c, as curl --http2-prior-knowledge), which browsers
// never do. Every request's context carries the connection it came on,
// for Stream.Cut.
type Server struct {
	// Name starts the log lines "<Name> listening" and "<Name> shutting
	// down", e.g. "sessiond".
	Name string
	// Listener is where Run serves. Run owns it from the call on and has
	// closed it when it returns, whatever the outcome.
	Listener net.Listener
	// Handler serves every request.
	Handler http.Handler
	// TLS, when set, makes Run serve HTTPS with it on Listener.
	TLS *tls.Config
	// Logger receives the lifecycle lines and, at Warn, the HTTP server's
	// own errors. Required.
	Logger *slog.Logger
	// ListenAttrs are added to the "<Name> listening" line after
	// "addr", as key-value pairs (slog style).
	ListenAttrs []any
	// Ready, when set, is called with the listen address once the HTTP
	// server runs, on Run's goroutine, before Run waits. It must not block
	// for long.
	Ready func(addr string)
	// Demo, when set, runs on a goroutine of its own from the start of
	// serving until shutdown begins; Run cancels its context and waits for
	// it to return before it calls Close.
	Demo *Demo
	// Close closes every bus, after which the daemon refuses new sessions:
	// each open stream receives what it has queued and the stream_error
	// shutdown (Hub.Shutdown, a backplane's Close), then its handler
	// returns. Run calls it exactly once, on a goroutine of its own, once
	// the demo has stopped and the HTTP server's graceful shutdown has
	// closed the listener, beside that shutdown (which waits for those
	// streams to end). Its ctx ends at the shutdown's deadline
	// (ShutdownTimeout from the start of the shutdown, shared with the
	// HTTP server's): a Close that waits for streams to drain
	// (Hub.Shutdown) stops waiting then. Run returns only after Close has.
	// Required.
	Close func(ctx context.Context)
	// ShutdownTimeout bounds the whole shutdown, from ctx's end: how long
	// it waits for open requests and streams to end by themselves. At it
	// the remaining connections are closed, a stream blocked writing to a
	// client that does not read included, and Run returns.
	ShutdownTimeout time.Duration
	// Limits bound the headers, bodies and idle connections of clients
	// (the zero value: every default). Run refuses invalid Limits.
	Limits Limits
	// Debug, when its Addr is set, is a second listener serving the
	// runtime's profiles and counters (DebugHandler, on a mux of its own):
	// Run listens on it first (an address it cannot listen on, or one
	// that is not loopback without Debug.Public, is Run's error, after it
	// has closed Listener and called Close), logs "<Name> debug listening"
	// with its address just before the "<Name> listening" line, and
	// closes it, cutting a profile in progress, when it returns.
	Debug Debug
	// Memory, when set, is the daemon's memory budget: unless GOMEMLIMIT
	// is set, Run sets the Go runtime's soft memory limit to its Limit
	// (its Bodies 0: Limits' body budget), logs it, and puts the previous
	// limit back when it returns. nil leaves the limit alone.
	Memory *MemoryBudget
}

// Run serves until ctx is done or the HTTP server fails, then shuts down
// within ShutdownTimeout: it stops the demo, then calls Close (so open
// streams drain, get the shutdown frame and end) while it shuts the HTTP
// server down gracefully, and at the deadline closes the connections that
// remain. It blocks until all of that is done and every goroutine it
// started has returned.
//
// Run returns the HTTP server's error when it failed while serving (Close
// has been called all the same). After ctx is done it returns nil, also
// when the graceful shutdown timed out (that is logged at Warn and the
// remaining connections are closed), unless closing them failed or the
// server had failed meanwhile. It closes nothing but Listener, the HTTP
// server and the debug listener; a daemon's other resources (a Redis
// client) are its own to close.
func (s *Server) Run(ctx context.Context) error {
	logger := s.Logger
	limits, err := s.Limits.withDefaults()
	if err != nil {
		s.Listener.Close()
		s.Close(context.Background())
		return err
	}
	var debugLn net.Listener
	if s.Debug.Addr != "" {
		if debugLn, err = s.Debug.listen(); err != nil {
			s.Listener.Close()
			s.Close(context.Background())
			return err
		}
	}
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	if s.TLS != nil {
		protocols.SetHTTP2(true)
	} else {
		protocols.SetUnencryptedHTTP2(true)
	}
	hs := &http.Server{
		Handler: s.Handler,
		// No ReadTimeout or WriteTimeout: streams are long-lived; the SSE
		// handler puts a deadline on each write instead (and clears it
		// after the flush, as HTTP/2 needs), and Limits puts one on
		// reading a request body.
		ErrorLog:    slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		Protocols:   &protocols,
		TLSConfig:   s.TLS,
		ConnContext: ConnContext,
	}
	limits.apply(hs)
	if s.Memory != nil {
		m := *s.Memory
		if m.Bodies == 0 {
			m.Bodies = limits.BodyBudget
		}
		defer setMemoryLimit(logger, m, os.LookupEnv)()
	}
	if debugLn != nil {
		defer serveDebug(s.Name, debugLn, logger).close()
	}
	addr := s.Listener.Addr().String()
	logger.Info(s.Name+" listening", append([]any{"addr", addr}, s.ListenAttrs...)...)

	serveErr := make(chan error, 1)
	go func() {
		if s.TLS != nil {
			serveErr <- hs.ServeTLS(s.Listener, "", "")
		} else {
			serveErr <- hs.Serve(s.Listener)
		}
	}()
	if s.Ready != nil {
		s.Ready(addr)
	}

	demoDone := make(chan struct{})
	demoCtx, stopDemo := context.WithCancel(ctx)
	defer stopDemo()
	if s.Demo != nil {
		go func() {
			defer close(demoDone)
			s.Demo.Run(demoCtx)
		}()
	} else {
		close(demoDone)
	}

	select {
	case err := <-serveErr:
		stopDemo()
		<-demoDone
		cctx, cancel := context.WithTimeout(context.Background(), s.ShutdownTimeout)
		defer cancel()
		s.Close(cctx)
		return err
	case <-ctx.Done():
	}

	logger.Info(s.Name + " shutting down")
	// The bound runs from the signal: a demo publish in flight counts.
	sctx, cancel := context.WithTimeout(context.Background(), s.ShutdownTimeout)
	defer cancel()
	stopDemo()
	<-demoDone
	// The order of docs/hub.md ("Shutting down"). The listener closes at
	// once (a client told to come back finds another replica, or a refused
	// connection, never a 503 loop), then Close runs beside the HTTP
	// server's shutdown (hs.Shutdown starts it once the listener is
	// closed), idle connections close, and each stream ends as soon as it
	// has written what its bus queued and the shutdown frame; hs.Shutdown
	// waits for those alone. A stream whose client does not read is
	// blocked in a write, which only its connection closing ends: hs.Close
	// does that at the deadline, and nothing else waits for it.
	closed := make(chan struct{})
	hs.RegisterOnShutdown(func() {
		defer close(closed)
		s.Close(sctx)
	})
	err = hs.Shutdown(sctx)
	if err != nil {
		logger.Warn("shutdown timed out; closing connections", "err", err)
		err = hs.Close()
	}
	<-closed
	if serr := <-serveErr; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}
