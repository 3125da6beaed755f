package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"go.uber.org/goleak"
)

// childEnv makes the test binary, started again by runDaemon, a stand-in
// daemon (childMain).
const childEnv = "RAPIDRESET_TEST_CHILD=1"

func TestMain(m *testing.M) {
	if os.Getenv("RAPIDRESET_TEST_CHILD") == "1" {
		os.Exit(childMain(os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

// sseServer returns an h2c (and HTTP/1.1) server of an eventbus.Handler
// on every path, as the demo daemon serves its streams, with a POST route
// that reads a body and refuses it (the nudge's), and the count of
// requests the handler began.
func sseServer(tb testing.TB) (*http.Server, *atomic.Int64) {
	bus, err := eventbus.New(eventbus.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		tb.Fatal(err)
	}
	h := &eventbus.Handler{
		Lookup:       func(*http.Request, string) (*eventbus.EventBus, error) { return bus, nil },
		Logger:       slog.New(slog.DiscardHandler),
		WriteTimeout: 30 * time.Second,
	}
	var served atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("GET /", func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		h.ServeHTTP(w, r)
	})
	mux.HandleFunc("POST /session/{id}/events", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if bytes.Contains(body, []byte("rapidresetNudge")) {
			http.Error(w, "unknown field", http.StatusBadRequest)
			return
		}
		_, _ = bus.Publish(eventbus.Event{Type: "t", Data: []byte("0")})
		_, _ = io.WriteString(w, `{"id":1}`)
	})
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return &http.Server{Handler: mux, Protocols: &p, ErrorLog: nil}, &served
}

// childMain serves sseServer on -addr, logs "child listening addr=..." as
// the daemons do, and returns at SIGTERM.
func childMain(args []string) int {
	fs := flag.NewFlagSet("child", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return 1
	}
	srv, _ := sseServer(nil)
	slog.New(slog.NewTextHandler(os.Stderr, nil)).Info("child listening", "addr", ln.Addr().String())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return 1
	}
	return 0
}

// TestAttack bursts against an in-process h2c server of an
// eventbus.Handler at a low rate: every reset is sent and acknowledged,
// the server's handler ran for the streams, and nothing failed.
func TestAttack(t *testing.T) {
	srv, served := sseServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })

	res, err := attack(t.Context(), attackConfig{
		addr: ln.Addr().String(), path: "/session/h/events", conns: 2, rate: 1000, duration: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res.String())
	if res.Resets < 500 {
		t.Errorf("%d resets sent, want about 1000", res.Resets)
	}
	if res.Acked != res.Resets || res.BeforeGoAway != 0 {
		t.Errorf("%d resets acknowledged (%d before a GOAWAY), want all %d", res.Acked, res.BeforeGoAway, res.Resets)
	}
	if res.Errors != 0 || res.GoAways != 0 || res.Dials != 2 {
		t.Errorf("errors %d %v, GOAWAYs %d, dials %d", res.Errors, res.FirstErrors, res.GoAways, res.Dials)
	}
	if res.MaxConcurrent != 250 {
		t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS %d, want Go's default 250", res.MaxConcurrent)
	}
	if res.Frames["SETTINGS"] < 2 || res.Frames["PING"] != 2 {
		t.Errorf("frames received %v: want the SETTINGS and their acks, and the final PINGs' acks", res.Frames)
	}
	if served.Load() == 0 {
		t.Error("the handler never ran")
	}
}

// TestDaemon runs the orchestration mode against the test binary as a
// stand-in daemon: the burst, the RSS samples, the gctrace lines and the
// nudged collection all arrive.
func TestDaemon(t *testing.T) {
	var progress bytes.Buffer
	r, err := runDaemon(t.Context(), daemonConfig{
		bin: os.Args[0], env: []string{childEnv}, create: "h",
		after: 500 * time.Millisecond, sample: 100 * time.Millisecond, nudge: true, dump: true, label: "child",
	}, attackConfig{path: "/session/h/events", conns: 2, rate: 500, duration: time.Second}, &progress)
	t.Log(progress.String())
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	r.write(&out, 500*time.Millisecond)
	t.Log(out.String())
	if r.attack.Resets == 0 || r.attack.Errors != 0 || r.attack.Acked != r.attack.Resets {
		t.Errorf("burst: %s", r.attack.String())
	}
	if len(r.samples) < 5 || r.peak <= 0 || r.baseline.rss <= 0 || r.at(0).rss <= 0 {
		t.Errorf("%d samples, peak %d, baseline %d", len(r.samples), r.peak, r.baseline.rss)
	}
	if g, ok := r.nudged(); !ok || len(r.nudgeGCs) != nudgeCollections || g.num != r.nudgeGCs[0].num+1 {
		t.Errorf("the nudge's collections: %+v, %s", r.nudgeGCs, r.nudgeErr)
	}
	// The test binary's own: the runtime's, the server's, the signal's.
	if r.goroutines < 3 || r.goroutines > 50 {
		t.Errorf("%d goroutines in the dump", r.goroutines)
	}
	if !strings.Contains(out.String(), "| child | ") {
		t.Errorf("no table row in the report")
	}
}

func TestParse(t *testing.T) {
	g, ok := parseGC("gc 36 @12.345s 3%: 0.031+4.1+0.012 ms clock, 0.062+0.5/3.9/7.1+0.025 ms cpu, 60->61->18 MB, 71 MB goal, 0 MB stacks, 0 MB globals, 2 P (forced)")
	if !ok || g.num != 36 || g.before != 60 || g.after != 61 || g.live != 18 || g.goal != 71 || !g.forced {
		t.Errorf("parseGC: %+v %v", g, ok)
	}
	// Torn by a log line: the heap figures start a line of their own.
	g, ok = parseGC(`gc time=2026-12-03T21:15:47.992Z level=INFO msg="stream opened"`)
	if ok {
		t.Errorf("parseGC took the torn head: %+v", g)
	}
	g, ok = parseGC(`165 @21.085s 8%: 0.16+9.8+0.061 ms clock, 0.32+2.8/5.0/0+0.12 ms cpu, 26->27->14 MB, 27 MB goal, 0 MB stacks, 0 MB globals, 2 P`)
	if !ok || g.num != -1 || g.live != 14 || g.goal != 27 || g.forced {
		t.Errorf("parseGC of a torn tail: %+v %v", g, ok)
	}
	if _, ok := parseGC(`time=2026-12-03T20:34:11Z level=INFO msg="stream opened" session=h`); ok {
		t.Error("parseGC took a log line")
	}
	if a := parseListening(`time=2026-12-03T20:34:11Z level=INFO msg="sessiond listening" addr=127.0.0.1:42155 sessions=1000`); a != "127.0.0.1:42155" {
		t.Errorf("parseListening: %q", a)
	}
	rss, hwm, err := parseStatus([]byte("Name:\tsessiond\nVmHWM:\t  107932 kB\nVmRSS:\t  100660 kB\nThreads:\t7\n"))
	if err != nil || rss != 100660<<10 || hwm != 107932<<10 {
		t.Errorf("parseStatus: %d %d %v", rss, hwm, err)
	}
	if _, _, err := parseStatus([]byte("Name:\tx\n")); err == nil {
		t.Error("parseStatus without VmRSS: no error")
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-rate", "0", "-addr", "x:1"},
		{"-conns", "0", "-addr", "x:1"},
		{"-path", "nope", "-addr", "x:1"},
		{},
		{"-daemon", "x", "-addr", "x:1"},
		{"-addr", "x:1", "extra"},
	} {
		if err := run(t.Context(), args, io.Discard, io.Discard); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}
