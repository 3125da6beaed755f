package daemon

import (
	"errors"
	"expvar"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
)

// Debug is a daemon's debug listener (-debug-addr, -debug-public): a
// second HTTP server, beside the daemon's own, that serves the runtime's
// profiles and counters (DebugHandler) to whoever reaches its address. The
// zero value is none.
//
// It is off by default, and refused on an address that is not loopback
// unless Public is set: a CPU profile costs the daemon CPU, a goroutine
// dump shows every stream, and the command line it serves (cmdline, and
// "cmdline" in /debug/vars) holds every flag, -auth-token's secret
// included.
type Debug struct {
	// Addr is the listen address (e.g. "127.0.0.1:6060"; port 0 picks a
	// free one, logged); empty: no debug listener.
	Addr string
	// Public allows an Addr that is not loopback (":6060", a LAN
	// address); Run then logs a warning. Behind it the debug routes are
	// open to the network: put them behind a firewall.
	Public bool
}

// DebugHandler returns the debug routes, on a ServeMux of their own:
// net/http/pprof's handlers under /debug/pprof/ (the index, every named
// profile, cmdline, profile, symbol and trace) and expvar's /debug/vars
// (JSON of every published variable: "cmdline" and "memstats", the
// runtime.MemStats, by default).
//
// The daemon's own routes never include them: importing net/http/pprof and
// expvar registers the same handlers on http.DefaultServeMux, which no
// daemon serves.
func DebugHandler() http.Handler {
	mux := http.NewServeMux()
	// pprof.Index also serves each named profile, /debug/pprof/<name>.
	for path, h := range map[string]http.HandlerFunc{
		"":        pprof.Index,
		"cmdline": pprof.Cmdline,
		"profile": pprof.Profile,
		"symbol":  pprof.Symbol,
		"trace":   pprof.Trace,
	} {
		mux.Handle("/debug/pprof/"+path, h)
	}
	mux.Handle("/debug/vars", expvar.Handler())
	return mux
}

// errDebugNotLoopback is listen's refusal of a public address.
var errDebugNotLoopback = errors.New("not a loopback address: the profiles and the command line (-auth-token included) would be open to the network; " +
	"use 127.0.0.1:PORT (or [::1]:PORT), or add -debug-public to allow it")

// listen opens d's listener; an error names -debug-addr. An address that
// is not loopback (an empty host, 0.0.0.0, another interface's, a name
// that resolves elsewhere) is refused unless d.Public: what counts is the
// address the listener has, after resolution.
func (d Debug) listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", d.Addr)
	if err != nil {
		return nil, fmt.Errorf("-debug-addr %s: %w", d.Addr, err)
	}
	if !d.Public && !isLoopback(ln.Addr()) {
		ln.Close()
		return nil, fmt.Errorf("-debug-addr %s: %w", d.Addr, errDebugNotLoopback)
	}
	return ln, nil
}

func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// debugServer is a running debug listener; close stops it and waits for
// its Serve to return.
type debugServer struct {
	hs   *http.Server
	done chan struct{}
}

// serveDebug serves DebugHandler on ln and logs its address ("<name>
// debug listening", with a warning when it is not loopback).
func serveDebug(name string, ln net.Listener, logger *slog.Logger) *debugServer {
	addr := ln.Addr().String()
	if !isLoopback(ln.Addr()) {
		logger.Warn(name+" debug listener is not loopback: its profiles and command line are open to whoever reaches it", "addr", addr)
	}
	logger.Info(name+" debug listening", "addr", addr, "url", "http://"+addr+"/debug/pprof/")
	ds := &debugServer{
		hs: &http.Server{
			Handler:           DebugHandler(),
			ReadHeaderTimeout: DefaultReadHeaderTimeout,
			// No WriteTimeout: /debug/pprof/profile?seconds=N and trace
			// answer after N seconds.
			ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		},
		done: make(chan struct{}),
	}
	go func() {
		defer close(ds.done)
		_ = ds.hs.Serve(ln) // ErrServerClosed, or the listener failed: nothing to do but stop
	}()
	return ds
}

// close closes the listener and every connection at once (a profile or
// trace being taken is cut; its handler ends as its request's context
// does), and waits for Serve to return.
func (ds *debugServer) close() {
	_ = ds.hs.Close()
	<-ds.done
}
