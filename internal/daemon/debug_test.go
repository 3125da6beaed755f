package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestFlagsDebug(t *testing.T) {
	docs := FlagDocs{DefaultAddr: "127.0.0.1:1"}
	var out bytes.Buffer
	fs, _ := NewFlags("testd", "", &out, docs)
	if err := Parse(fs, []string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	for _, want := range []string{"-debug-addr", "/debug/pprof/", "/debug/vars", "-debug-public"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-h output lacks %q:\n%s", want, out.String())
		}
	}
	fs, f := NewFlags("testd", "", io.Discard, docs)
	if err := Parse(fs, nil); err != nil || f.Debug != (Debug{}) {
		t.Fatalf("default: %v, %+v", err, f.Debug)
	}
	fs, f = NewFlags("testd", "", io.Discard, docs)
	if err := Parse(fs, []string{"-debug-addr", "127.0.0.1:6060", "-debug-public"}); err != nil ||
		f.Debug != (Debug{Addr: "127.0.0.1:6060", Public: true}) {
		t.Fatalf("-debug-addr 127.0.0.1:6060 -debug-public: %v, %+v", err, f.Debug)
	}
}

// debugGet returns the body of a 200 answer to GET http://addr+path.
func debugGet(t *testing.T, client *http.Client, addr, path string) []byte {
	t.Helper()
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v\n%s", path, resp.StatusCode, err, b)
	}
	return b
}

// serveWithDebug runs a Server with debug until stop, which checks that Run
// returned nil; it returns the daemon's address and its log once it serves.
func serveWithDebug(t *testing.T, debug Debug) (addr string, logs *logBuffer, stop func()) {
	t.Helper()
	logs = new(logBuffer)
	ready := make(chan struct{})
	s := &Server{
		Name:            "testd",
		Listener:        listen(t),
		Handler:         http.NotFoundHandler(),
		Logger:          slog.New(slog.NewTextHandler(logs, nil)),
		Debug:           debug,
		Ready:           func(string) { close(ready) },
		Close:           func(context.Context) {},
		ShutdownTimeout: 5 * time.Second,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := runServer(ctx, s)
	<-ready
	return s.Listener.Addr().String(), logs, func() {
		t.Helper()
		cancel()
		if err := waitRun(t, done); err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
}

// With Debug set, Run serves the profiles and the counters on a listener of
// their own, logged before the daemon's own, which serves none of them;
// Run closes it when it returns.
func TestServerRunDebugListener(t *testing.T) {
	addr, logs, stop := serveWithDebug(t, Debug{Addr: "127.0.0.1:0"})

	m := regexp.MustCompile(`level=INFO msg="testd debug listening" addr=(127\.0\.0\.1:\d+) url=http://127\.0\.0\.1:\d+/debug/pprof/\n` +
		`.*level=INFO msg="testd listening" addr=`).FindStringSubmatch(logs.String())
	if m == nil {
		t.Fatalf("no debug listening line before the listening line:\n%s", logs.String())
	}
	debugAddr := m[1]
	if strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("a warning for a loopback address:\n%s", logs.String())
	}
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	var vars struct {
		Memstats struct {
			StackInuse, HeapInuse uint64
			NumGC                 uint32
		} `json:"memstats"`
	}
	if err := json.Unmarshal(debugGet(t, client, debugAddr, "/debug/vars"), &vars); err != nil || vars.Memstats.StackInuse == 0 || vars.Memstats.HeapInuse == 0 {
		t.Fatalf("/debug/vars: %v, memstats %+v", err, vars.Memstats)
	}
	if b := debugGet(t, client, debugAddr, "/debug/pprof/"); !bytes.Contains(b, []byte("goroutine")) {
		t.Errorf("/debug/pprof/ lists no goroutine profile:\n%s", b)
	}
	if b := debugGet(t, client, debugAddr, "/debug/pprof/goroutine?debug=1"); !bytes.HasPrefix(b, []byte("goroutine profile: total ")) {
		t.Errorf("/debug/pprof/goroutine?debug=1 starts %q", b[:min(len(b), 40)])
	}
	gc := vars.Memstats.NumGC
	debugGet(t, client, debugAddr, "/debug/pprof/heap?gc=1")
	if err := json.Unmarshal(debugGet(t, client, debugAddr, "/debug/vars"), &vars); err != nil || vars.Memstats.NumGC <= gc {
		t.Errorf("heap?gc=1 ran no collection: NumGC %d, then %d (%v)", gc, vars.Memstats.NumGC, err)
	}
	debugGet(t, client, debugAddr, "/debug/pprof/cmdline")
	debugGet(t, client, debugAddr, "/debug/pprof/symbol")

	// The daemon's own listener serves none of it.
	for _, path := range []string{"/debug/vars", "/debug/pprof/"} {
		resp, err := client.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("the daemon's listener answers %s: %d", path, resp.StatusCode)
		}
	}

	stop()
	if c, err := net.Dial("tcp", debugAddr); err == nil {
		c.Close()
		t.Fatal("the debug listener is still open after Run returned")
	}
}

// A debug address Run cannot use is its error at start, before it serves:
// the daemon's listener is closed and Close called, as for any start
// error.
func TestServerRunDebugAddrErrors(t *testing.T) {
	busy := listen(t)
	defer busy.Close()
	for _, c := range []struct {
		debug Debug
		want  string
	}{
		{Debug{Addr: "127.0.0.1:http-x"}, "-debug-addr 127.0.0.1:http-x: "},
		{Debug{Addr: busy.Addr().String()}, "-debug-addr " + busy.Addr().String() + ": listen tcp"},
		{Debug{Addr: ":0"}, "-debug-addr :0: not a loopback address"},
		{Debug{Addr: "0.0.0.0:0"}, "-debug-addr 0.0.0.0:0: not a loopback address"},
	} {
		var closes atomic.Int32
		var logs logBuffer
		s := &Server{
			Name:     "testd",
			Listener: listen(t),
			Handler:  http.NotFoundHandler(),
			Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
			Debug:    c.debug,
			Close:    func(context.Context) { closes.Add(1) },
		}
		err := waitRun(t, runServer(context.Background(), s))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.debug, err, c.want)
		}
		if closes.Load() != 1 || strings.Contains(logs.String(), "listening") {
			t.Errorf("%+v: Close called %d times; logs:\n%s", c.debug, closes.Load(), logs.String())
		}
		if conn, err := net.Dial("tcp", s.Listener.Addr().String()); err == nil {
			conn.Close()
			t.Errorf("%+v: the daemon's listener is still open", c.debug)
		}
	}
	if !strings.Contains(errDebugNotLoopback.Error(), "-debug-public") {
		t.Errorf("the refusal does not say how to allow it: %v", errDebugNotLoopback)
	}
}

// -debug-public allows an address that is not loopback, with a warning.
func TestServerRunDebugPublic(t *testing.T) {
	_, logs, stop := serveWithDebug(t, Debug{Addr: ":0", Public: true})
	stop()
	if !strings.Contains(logs.String(), `level=WARN msg="testd debug listener is not loopback`) ||
		!strings.Contains(logs.String(), `msg="testd debug listening"`) {
		t.Fatalf("no warning:\n%s", logs.String())
	}
}
