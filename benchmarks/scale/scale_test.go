//go:build linux

package main

import (
	"bufio"
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
	"go.uber.org/goleak"
)

// childEnv makes the test binary, started again by run, a child server.
const childEnv = "SCALE_TEST_CHILD=1"

func TestMain(m *testing.M) {
	if os.Getenv("SCALE_TEST_CHILD") == "1" {
		os.Exit(childMain(os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

// smallConfig is a run of conns connections over 4 sessions, with a window
// of 5 heartbeats and 2 fan-outs, that takes seconds; the children are
// this test binary (TestMain).
func smallConfig(conns int, impls ...string) config {
	return config{
		conns: conns, sessions: 4,
		heartbeat: 100 * time.Millisecond, idle: 500 * time.Millisecond,
		fanouts: 2, impls: impls, runs: 1,
		settle: 200 * time.Millisecond, fanoutTimeout: 10 * time.Second,
		roundGap: 50 * time.Millisecond, inflight: 50, jsonLines: true,
		exe: os.Args[0], childEnv: []string{childEnv},
	}
}

// runSmall runs cfg, logs what it wrote, and returns its runs and report.
func runSmall(t *testing.T, cfg config) ([]runResult, string) {
	t.Helper()
	var out, logw bytes.Buffer
	runs, err := run(cfg, &out, &logw)
	t.Log(logw.String())
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	return runs, out.String()
}

// TestRun runs the whole program small, both implementations with the
// children as separate processes, and checks that what it reports is whole
// and sane: nothing lost, every connection reached every round, heartbeats
// received, every figure positive.
func TestRun(t *testing.T) {
	cfg := smallConfig(200, "eventbus", "naive")
	runs, out := runSmall(t, cfg)
	if len(runs) != 1 || len(runs[0].Results) != 2 {
		t.Fatalf("got %d runs", len(runs))
	}
	var frame [2]float64
	for i, impl := range []string{"eventbus", "naive"} {
		r := runs[0].Results[impl]
		checkResult(t, cfg, r)
		if r.RSSFreedPerConn <= 0 || r.HeartbeatCPU <= 0 {
			t.Errorf("%s: RSS after FreeOSMemory %.0f B, heartbeat CPU %.0f", impl, r.RSSFreedPerConn, r.HeartbeatCPU)
		}
		frame[i] = r.BytesPerFrame
	}
	// The same envelope on the wire: the frames differ in nothing but
	// the timestamps' digits, which have the same count.
	if frame[0] != frame[1] || frame[0] < 100 {
		t.Errorf("bytes per frame: eventbus %.1f, naive %.1f", frame[0], frame[1])
	}
	for _, want := range []string{"| goroutine stacks per conn", "| fan-out: last client reached |", `{"impl":"eventbus"`, `{"impl":"naive"`} {
		if !strings.Contains(out, want) {
			t.Errorf("the report has no %q", want)
		}
	}
}

// TestRunFloors runs the two floors small: every delivery made, the shared
// heartbeat received, and floor-raw's connections without a goroutine.
func TestRunFloors(t *testing.T) {
	cfg := smallConfig(200, "floor", "floor-raw")
	runs, out := runSmall(t, cfg)
	if len(runs) != 1 || len(runs[0].Results) != 2 {
		t.Fatalf("got %d runs", len(runs))
	}
	checkResult(t, cfg, runs[0].Results["floor"])
	raw := runs[0].Results["floor-raw"]
	checkDelivered(t, cfg, raw)
	if raw.GoroutinesPerConn > 0.1 || raw.BytesPerFrame != runs[0].Results["floor"].BytesPerFrame {
		t.Errorf("floor-raw: %.2f goroutines per connection, %.1f bytes per frame", raw.GoroutinesPerConn, raw.BytesPerFrame)
	}
	if !strings.Contains(out, "| floor-raw |") {
		t.Errorf("the report has no floor-raw column:\n%s", out)
	}
}

// TestRunTransports runs the library's other two transports small, the
// multiplexed SSE route and the WebSocket, beside the single stream, on
// the same Hub: every delivery made, the heartbeat (the WebSocket's ping)
// received, two goroutines per connection, the same events, and the
// heap profile -stackprofile asks for.
func TestRunTransports(t *testing.T) {
	cfg := smallConfig(200, "websocket", "mux", "eventbus")
	cfg.stackProfile = filepath.Join(t.TempDir(), "stacks.txt")
	runs, out := runSmall(t, cfg)
	if len(runs) != 1 || len(runs[0].Results) != 3 {
		t.Fatalf("got %d runs", len(runs))
	}
	for _, impl := range []string{"eventbus", "mux", "websocket"} {
		r := runs[0].Results[impl]
		checkResult(t, cfg, r)
		if r.RSSFreedPerConn <= 0 {
			t.Errorf("%s: RSS after FreeOSMemory %.0f B", impl, r.RSSFreedPerConn)
		}
		for _, p := range []string{profilePath(cfg.stackProfile, impl, 1), heapProfilePath(profilePath(cfg.stackProfile, impl, 1))} {
			if fi, err := os.Stat(p); err != nil || fi.Size() == 0 {
				t.Errorf("profile %s: %v", p, err)
			}
		}
	}
	// The single stream's frame, then the session member and the
	// composite cursor in the id: line (mux), or the session member, the
	// cursor line and a header of 2 bytes (websocket).
	single, mux, wsf := runs[0].Results["eventbus"].BytesPerFrame, runs[0].Results["mux"].BytesPerFrame, runs[0].Results["websocket"].BytesPerFrame
	if single < 100 || mux <= single || wsf <= single {
		t.Errorf("bytes per frame: eventbus %.1f, mux %.1f, websocket %.1f", single, mux, wsf)
	}
	if !strings.Contains(out, "| per connection, or per fan-out (median of the rounds) | eventbus | mux | websocket |") {
		t.Errorf("the report's columns:\n%s", out)
	}
}

// The WebSocket client reads the frames of a message's lines, skips the
// control lines, and counts the message's bytes for its events.
func TestClientWSLines(t *testing.T) {
	if got := envelopeID([]byte(`{"session":"s1","id":12,"v":1,"data":{"sent":5}}`)); got != 12 {
		t.Errorf("envelopeID %d", got)
	}
	if got := envelopeID([]byte(`data: {"session":"s1","v":1}`)); got != 0 {
		t.Errorf("envelopeID without an id: %d", got)
	}
	for n, want := range map[int]int64{0: 2, 125: 2, 126: 4, 65535: 4, 65536: 10} {
		if got := wsHeaderLen(n); got != want {
			t.Errorf("wsHeaderLen(%d) = %d, want %d", n, got, want)
		}
	}
	for impl, want := range map[string]string{"eventbus": "/session/s3/events", "sessiond": "/session/s3/events", "mux": "/events?session=s3", "websocket": "/ws?session=s3", "ws-smallbuf": "/ws-smallbuf?session=s3"} {
		if got := routeOf(impl).path(3); got != want {
			t.Errorf("%s: path %q, want %q", impl, got, want)
		}
	}
}

// checkResult checks that what run reported of one implementation is
// whole and sane.
func checkResult(t *testing.T, cfg config, r *implResult) {
	t.Helper()
	checkDelivered(t, cfg, r)
	impl := r.Impl
	// Each connection is a handler goroutine and net/http's reader.
	if r.GoroutinesPerConn < 1.9 || r.GoroutinesPerConn > 2.2 {
		t.Errorf("%s: %.2f goroutines per connection", impl, r.GoroutinesPerConn)
	}
	if r.StackPerConn <= 0 || r.HeapPerConn <= 0 || r.RSSPerConn <= 0 || r.HeartbeatCPU < 0 || r.LoopMicros <= 0 || r.IdleSeconds < 0.5 {
		t.Errorf("%s: a figure is not positive: %+v", impl, r)
	}
	if r.StackPerConn > 64<<10 || r.HeapPerConn > 256<<10 {
		t.Errorf("%s: per connection stacks %.0f B, heap %.0f B", impl, r.StackPerConn, r.HeapPerConn)
	}
	if r.ClientCPUPerDelivery <= 0 || r.ServerCPUPerDelivery < 0 {
		t.Errorf("%s: CPU per delivery: server %.2f µs, clients %.2f µs", impl, r.ServerCPUPerDelivery, r.ClientCPUPerDelivery)
	}
	if r.Connected.GCs < minGCs || r.AfterFanout.GCs < minGCs {
		t.Errorf("%s: %d and %d collections before the memory figures", impl, r.Connected.GCs, r.AfterFanout.GCs)
	}
}

// checkDelivered checks that every connection got every round's event and
// the heartbeats.
func checkDelivered(t *testing.T, cfg config, r *implResult) {
	t.Helper()
	impl := r.Impl
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
}

// TestRunSessiond runs the program small against cmd/sessiond, built from
// the working tree as -impl sessiond builds it: its figures come from
// outside the process (/proc and its debug listener), its events from
// POSTs, its frames' ids carry the epoch, and the first id of each session
// is the POST that created it.
func TestRunSessiond(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go command")
	}
	cfg := smallConfig(100, "sessiond")
	cfg.cpuProfile, cfg.stackProfile = filepath.Join(t.TempDir(), "cpu.pprof"), filepath.Join(t.TempDir(), "stacks.txt")
	runs, out := runSmall(t, cfg)
	r := runs[0].Results["sessiond"]
	checkResult(t, cfg, r)
	// The CPU in /proc counts in 10 ms ticks: a short window may see none.
	if r.RSSFreedPerConn != 0 || r.Connected.RSSFreed != 0 {
		t.Errorf("an RSS after FreeOSMemory, which sessiond cannot be made to run: %+v", r.Connected)
	}
	if r.BytesPerFrame < 100 {
		t.Errorf("%.1f bytes per frame", r.BytesPerFrame)
	}
	for _, want := range []string{"| RSS per conn, after FreeOSMemory | - |", `{"impl":"sessiond"`, "-debug-addr 127.0.0.1:0 -heartbeat 100ms -max-subscribers 64 -max-sessions 1000`"} {
		if !strings.Contains(out, want) {
			t.Errorf("the report has no %q", want)
		}
	}
	for _, p := range []string{profilePath(cfg.cpuProfile, "sessiond", 1), profilePath(cfg.stackProfile, "sessiond", 1)} {
		if fi, err := os.Stat(p); err != nil || fi.Size() == 0 {
			t.Errorf("profile %s: %v", p, err)
		}
	}
	if b, _ := os.ReadFile(profilePath(cfg.stackProfile, "sessiond", 1)); !bytes.HasPrefix(b, []byte("goroutine profile: total ")) {
		t.Errorf("the stack profile starts %.40q", b)
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
	enc, err := backplane.NewEncoder(eventbus.Options{Now: at})
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
		"id: 2\r\nevent: tick\r\ndata: {\"data\":{\"sent\":43}}\r\n\r\n" +
		"id: 3\nevent: tick\ndata: {\"data\":{\"sent\":44}}\n\n" // past the rounds
	f := &fleet{got: make([]atomic.Int64, 2), rounds: 2}
	c := &conn{arrived: make([]atomic.Int64, 2), sent: make([]atomic.Int64, 2)}
	f.conns = []*conn{c}
	c.read(bufio.NewReader(strings.NewReader(in)), f)
	if h := c.heartbeats.Load(); h != 5 {
		t.Errorf("heartbeats %d, want 5", h)
	}
	if c.frames.Load() != 2 || f.got[0].Load() != 1 || f.got[1].Load() != 1 || f.unexpected.Load() != 3 {
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

	// Epoch ids, "<epoch>:<N>", after a first event no round sent.
	f = &fleet{got: make([]atomic.Int64, 2), rounds: 2, idBase: 1}
	c = &conn{arrived: make([]atomic.Int64, 2), sent: make([]atomic.Int64, 2)}
	f.conns = []*conn{c}
	c.read(bufio.NewReader(strings.NewReader(
		"id: e1:1\nevent: created\ndata: {}\n\n"+
			"id: e1:2\nevent: tick\ndata: {\"data\":{\"sent\":42}}\n\n"+
			"id: e1:3\nevent: tick\ndata: {\"data\":{\"sent\":43}}\n\n")), f)
	if c.sent[0].Load() != 42 || c.sent[1].Load() != 43 || f.unexpected.Load() != 1 {
		t.Errorf("epoch ids: sent %d %d, unexpected %d", c.sent[0].Load(), c.sent[1].Load(), f.unexpected.Load())
	}
}

func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags(nil, flag.ContinueOnError)
	if err != nil || cfg.conns != 10_000 || cfg.sessions != 200 || cfg.heartbeat != time.Second ||
		cfg.idle != 10*time.Second || cfg.fanouts != 5 || cfg.runs != 1 || len(cfg.impls) != 2 {
		t.Fatalf("defaults: %+v, %v", cfg, err)
	}
	for arg, want := range map[string][]string{
		"both": {"eventbus", "naive"}, "all": {"eventbus", "sessiond", "naive"}, "sessiond": {"sessiond"},
		"naive,sessiond": {"naive", "sessiond"}, "floors": {"eventbus", "floor", "floor-raw", "naive"},
		"floor-raw,floor": {"floor-raw", "floor"},
		"transports":      {"eventbus", "mux", "websocket", "naive"}, "websocket,mux": {"websocket", "mux"},
	} {
		if cfg, err := parseFlags([]string{"-impl", arg, "-sessiond-bin", "/x/sessiond"}, flag.ContinueOnError); err != nil ||
			!slices.Equal(cfg.impls, want) || cfg.sessiondBin != "/x/sessiond" {
			t.Errorf("-impl %s: %v, %v", arg, cfg.impls, err)
		}
	}
	for _, args := range [][]string{
		{"-impl", "other"}, {"-impl", "naive,naive"}, {"-impl", "eventbus,"}, {"-impl", "both,sessiond"},
		{"-conns", "10", "-sessions", "20"}, {"-heartbeat", "0s"}, {"-fanouts", "0"}, {"extra"},
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
	// Three implementations: a ratio column for each against naive, "-"
	// for a figure one of them lacks.
	out.Reset()
	sd := res("sessiond", 4096)
	sd.Connected.RSSFreed, sd.Binary = 0, "sessiond -addr x"
	runs[0].Results["sessiond"], runs[0].Order = sd, []string{"eventbus", "sessiond", "naive"}
	runs[0].Results["eventbus"].Connected.RSSFreed, runs[0].Results["naive"].Connected.RSSFreed = 1, 1
	cfg.impls = runs[0].Order
	writeRun(&out, cfg, runs[0])
	for _, want := range []string{
		"| per connection, or per fan-out (median of the rounds) | eventbus | sessiond | naive | eventbus/naive | sessiond/naive |",
		"| goroutine stacks per conn (StackInuse, after GCs) | 2.0 KiB | 4.0 KiB | 1.0 KiB | 2.00x | 4.00x |",
		"| RSS per conn, after FreeOSMemory | 0.0 KiB | - | 0.0 KiB | - | - |",
		"sessiond: `sessiond -addr x`",
		"### Run 1 of 2 (eventbus first, then sessiond, then naive)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}

	out.Reset()
	cfg.impls = []string{"naive"}
	writeRun(&out, cfg, runResult{Index: 1, Order: []string{"naive"}, Results: runs[0].Results})
	if strings.Contains(out.String(), "eventbus/naive") || !strings.Contains(out.String(), "| 1.0 KiB |") {
		t.Errorf("one implementation:\n%s", out.String())
	}
}
