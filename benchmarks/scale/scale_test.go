//go:build linux

package main

import (
	"bufio"
	"bytes"
	"flag"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
)

// childEnv makes the test binary, started again by run, a child server.
const childEnv = "SCALE_TEST_CHILD=1"

func TestMain(m *testing.M) {
	if os.Getenv("SCALE_TEST_CHILD") == "1" {
		os.Exit(childMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// TestRun runs the whole program small, both implementations with the
// children as separate processes, and checks that what it reports is whole
// and sane: nothing lost, every connection reached every round, heartbeats
// received, every figure positive.
func TestRun(t *testing.T) {
	cfg := config{
		conns: 200, sessions: 4,
		heartbeat: 100 * time.Millisecond, idle: 500 * time.Millisecond,
		fanouts: 2, impls: []string{"eventbus", "naive"}, runs: 1,
		settle: 200 * time.Millisecond, fanoutTimeout: 10 * time.Second,
		roundGap: 50 * time.Millisecond, inflight: 50, jsonLines: true,
		exe: os.Args[0], childEnv: []string{childEnv},
	}
	var out, logw bytes.Buffer
	runs, err := run(cfg, &out, &logw)
	t.Log(logw.String())
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || len(runs[0].Results) != 2 {
		t.Fatalf("got %d runs", len(runs))
	}
	var frame [2]float64
	for i, impl := range []string{"eventbus", "naive"} {
		r := runs[0].Results[impl]
		if r.Lost != 0 || r.Ended != 0 || r.Unexpected != 0 {
			t.Errorf("%s: lost %d, ended %d, unexpected %d", impl, r.Lost, r.Ended, r.Unexpected)
		}
		if len(r.Rounds) != cfg.fanouts {
			t.Fatalf("%s: %d rounds", impl, len(r.Rounds))
		}
		for k, rd := range r.Rounds {
			if rd.Delivered != cfg.conns || rd.Missing != 0 {
				t.Errorf("%s round %d: delivered %d, missing %d", impl, k+1, rd.Delivered, rd.Missing)
			}
			if !(0 < rd.FirstMicros && rd.FirstMicros <= rd.P50Micros && rd.P50Micros <= rd.P99Micros &&
				rd.P99Micros <= rd.LastMicros && rd.LastMicros < 10e6) {
				t.Errorf("%s round %d: latencies %+v", impl, k+1, rd)
			}
		}
		// The window is 5 heartbeats long; a loaded machine (and the race
		// detector) may delay some, none may be missing.
		if r.HeartbeatsMin < 1 || r.HeartbeatsMean < 2 || r.HeartbeatsMax > 7 {
			t.Errorf("%s: heartbeats per connection mean %.2f, min %d, max %d", impl, r.HeartbeatsMean, r.HeartbeatsMin, r.HeartbeatsMax)
		}
		// Each connection is a handler goroutine and net/http's reader.
		if r.GoroutinesPerConn < 1.9 || r.GoroutinesPerConn > 2.2 {
			t.Errorf("%s: %.2f goroutines per connection", impl, r.GoroutinesPerConn)
		}
		if r.StackPerConn <= 0 || r.HeapPerConn <= 0 || r.RSSPerConn <= 0 || r.RSSFreedPerConn <= 0 ||
			r.HeartbeatCPU <= 0 || r.LoopMicros <= 0 || r.IdleSeconds < 0.5 {
			t.Errorf("%s: a figure is not positive: %+v", impl, r)
		}
		if r.StackPerConn > 64<<10 || r.HeapPerConn > 256<<10 {
			t.Errorf("%s: per connection stacks %.0f B, heap %.0f B", impl, r.StackPerConn, r.HeapPerConn)
		}
		frame[i] = r.BytesPerFrame
	}
	// The same envelope on the wire: the frames differ in nothing but
	// the timestamps' digits, which have the same count.
	if frame[0] != frame[1] || frame[0] < 100 {
		t.Errorf("bytes per frame: eventbus %.1f, naive %.1f", frame[0], frame[1])
	}
	for _, want := range []string{"| goroutine stacks per conn", "| fan-out: last client reached |", `{"impl":"eventbus"`, `{"impl":"naive"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report has no %q", want)
		}
	}
}

// The naive frame is byte for byte the eventbus frame of the same event.
func TestNaiveFrameMatchesEventbus(t *testing.T) {
	at := func() time.Time { return time.UnixMilli(1_719_000_000_000) }
	bus, err := eventbus.New(eventbus.Options{Now: at})
	if err != nil {
		t.Fatal(err)
	}
	defer bus.Close()
	enc, err := eventbus.NewEncoder(eventbus.Options{Now: at})
	if err != nil {
		t.Fatal(err)
	}
	ev := eventbus.Event{Type: eventType, Data: tick{Sent: 1_719_000_000_123_456_789}}
	for range 12 { // ids of one and two digits
		f, err := bus.Publish(ev)
		if err != nil {
			t.Fatal(err)
		}
		e, err := enc.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendNaiveFrame(nil, f.ID(), e); !bytes.Equal(got, f.SSE()) {
			t.Fatalf("id %d:\n naive    %q\n eventbus %q", f.ID(), got, f.SSE())
		}
	}
}

// The client's parser counts heartbeats (comments and eventbus's retry:
// line after a frame), records an event once, and flags what is no
// round's event.
func TestClientParse(t *testing.T) {
	in := "retry: 3200\n:\n:\n" +
		"id: 1\nevent: tick\ndata: {\"id\":1,\"data\":{\"sent\":42}}\n\n" +
		"retry: 3200\n:\n" +
		"id: 1\nevent: tick\ndata: {\"id\":1,\"data\":{\"sent\":42}}\n\n" + // a repeat
		"event: stream_error\ndata: {}\n\n" + // no id
		"id: 2\r\nevent: tick\r\ndata: {\"data\":{\"sent\":43}}\r\n\r\n"
	f := &fleet{got: make([]atomic.Int64, 2), rounds: 2}
	c := &conn{arrived: make([]atomic.Int64, 2), sent: make([]atomic.Int64, 2)}
	f.conns = []*conn{c}
	c.read(bufio.NewReader(strings.NewReader(in)), f)
	if h := c.heartbeats.Load(); h != 5 {
		t.Errorf("heartbeats %d, want 5", h)
	}
	if c.frames.Load() != 2 || f.got[0].Load() != 1 || f.got[1].Load() != 1 || f.unexpected.Load() != 2 {
		t.Errorf("frames %d, got %d %d, unexpected %d", c.frames.Load(), f.got[0].Load(), f.got[1].Load(), f.unexpected.Load())
	}
	if c.sent[0].Load() != 42 || c.sent[1].Load() != 43 || c.arrived[1].Load() == 0 {
		t.Errorf("sent %d %d", c.sent[0].Load(), c.sent[1].Load())
	}
	first := int64(len("id: 1\nevent: tick\ndata: {\"id\":1,\"data\":{\"sent\":42}}\n\n"))
	second := int64(len("id: 2\r\nevent: tick\r\ndata: {\"data\":{\"sent\":43}}\r\n\r\n"))
	if c.frameBytes.Load() != first+second {
		t.Errorf("frame bytes %d, want %d", c.frameBytes.Load(), first+second)
	}
	if !c.done.Load() || f.ended.Load() != 1 {
		t.Errorf("the end of the stream was not seen")
	}
}

func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags(nil, flag.ContinueOnError)
	if err != nil || cfg.conns != 10_000 || cfg.sessions != 200 || cfg.heartbeat != time.Second ||
		cfg.idle != 10*time.Second || cfg.fanouts != 5 || cfg.runs != 1 || len(cfg.impls) != 2 {
		t.Fatalf("defaults: %+v, %v", cfg, err)
	}
	for _, args := range [][]string{
		{"-impl", "other"}, {"-conns", "10", "-sessions", "20"}, {"-heartbeat", "0s"}, {"-fanouts", "0"}, {"extra"},
	} {
		if _, err := parseFlags(args, flag.ContinueOnError); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	if err := checkFiles(1 << 40); err == nil || !strings.Contains(err.Error(), "connections are possible") {
		t.Errorf("checkFiles: %v", err)
	}
}

// Two runs give a spread row per metric, the ratio included; one
// implementation gives no ratio column.
func TestReportSpread(t *testing.T) {
	res := func(impl string, stack float64) *implResult {
		return &implResult{Impl: impl, StackPerConn: stack, Rounds: []roundResult{{}}}
	}
	runs := []runResult{
		{Index: 1, Order: []string{"eventbus", "naive"}, Results: map[string]*implResult{"eventbus": res("eventbus", 2048), "naive": res("naive", 1024)}},
		{Index: 2, Order: []string{"naive", "eventbus"}, Results: map[string]*implResult{"eventbus": res("eventbus", 3072), "naive": res("naive", 1024)}},
	}
	cfg := config{runs: 2, fanouts: 1, impls: []string{"eventbus", "naive"}}
	var out bytes.Buffer
	writeSpread(&out, cfg, runs)
	if want := "| goroutine stacks per conn (StackInuse, after GCs) | 2.0 KiB-3.0 KiB (2.5 KiB) | 1.0 KiB-1.0 KiB (1.0 KiB) | 2.00x-3.00x (2.50x) |"; !strings.Contains(out.String(), want) {
		t.Errorf("no %q in\n%s", want, out.String())
	}
	out.Reset()
	cfg.impls = []string{"naive"}
	writeRun(&out, cfg, runResult{Index: 1, Order: []string{"naive"}, Results: runs[0].Results})
	if strings.Contains(out.String(), "eventbus/naive") || !strings.Contains(out.String(), "| 1.0 KiB |") {
		t.Errorf("one implementation:\n%s", out.String())
	}
}
