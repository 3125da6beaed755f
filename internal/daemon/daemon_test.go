package daemon

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ssebus/eventbus"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// logBuffer collects the lines of a logger that goroutines share; each
// Write of a slog.TextHandler is one whole line.
type logBuffer struct {
	mu    sync.Mutex
	lines []string
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.lines = append(l.lines, string(p))
	l.mu.Unlock()
	return len(p), nil
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "")
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// runServer runs s on its own goroutine; the returned channel yields Run's
// result.
func runServer(ctx context.Context, s *Server) <-chan error {
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	return done
}

func waitRun(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
		return nil
	}
}

func TestServerRunServesThenClosesBusesBeforeShutdown(t *testing.T) {
	var logs logBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	buses := make(chan struct{}) // closed by Close: the "streams" end
	var (
		closes    atomic.Int32
		demoLive  atomic.Bool // a Publish call is in progress
		published = make(chan struct{}, 1)
	)
	stream := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "open\n")
		w.(http.Flusher).Flush()
		select {
		case <-buses:
			io.WriteString(w, "drained\n")
		case <-r.Context().Done():
		}
	})
	readyAddr := make(chan string, 1)
	s := &Server{
		Name:        "testd",
		Listener:    listen(t),
		Handler:     stream,
		Logger:      logger,
		ListenAttrs: []any{"k", "v"},
		Ready:       func(addr string) { readyAddr <- addr },
		Demo: &Demo{Interval: time.Millisecond, Logger: logger, Publish: func(ctx context.Context, session string, ev eventbus.Event) error {
			demoLive.Store(true)
			defer demoLive.Store(false)
			select {
			case published <- struct{}{}:
			default:
			}
			return nil
		}},
		Close: func(context.Context) {
			if demoLive.Load() {
				t.Error("Close was called while the demo still published")
			}
			closes.Add(1)
			close(buses)
		},
		ShutdownTimeout: 5 * time.Second,
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := runServer(ctx, s)

	addr := <-readyAddr
	if want := regexp.MustCompile(`level=INFO msg="testd listening" addr=` + regexp.QuoteMeta(addr) + ` k=v\n`); !want.MatchString(logs.String()) {
		t.Fatalf("no listening line for %s:\n%s", addr, logs.String())
	}
	<-published

	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, _ := br.ReadString('\n'); line != "open\n" {
		t.Fatalf("first line %q", line)
	}

	cancel()
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "drained\n" {
		t.Fatalf("the stream did not drain and end: %q, %v", rest, err)
	}
	if err := waitRun(t, done); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := closes.Load(); n != 1 {
		t.Fatalf("Close called %d times", n)
	}
	if !strings.Contains(logs.String(), `level=INFO msg="testd shutting down"`) {
		t.Fatalf("no shutdown line:\n%s", logs.String())
	}
	if _, err := net.Dial("tcp", addr); err == nil {
		t.Fatal("the listener is still open after Run returned")
	}
	http.DefaultClient.CloseIdleConnections()
}

func TestServerRunReturnsTheServeError(t *testing.T) {
	ln := listen(t)
	ln.Close() // Serve fails at once
	var closes atomic.Int32
	s := &Server{
		Name:     "testd",
		Listener: ln,
		Handler:  http.NotFoundHandler(),
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Demo: &Demo{Interval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Publish: func(context.Context, string, eventbus.Event) error { return nil }},
		Close: func(context.Context) { closes.Add(1) },
	}
	err := waitRun(t, runServer(context.Background(), s))
	if err == nil || errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("Run: %v, want the Serve error", err)
	}
	if n := closes.Load(); n != 1 {
		t.Fatalf("Close called %d times", n)
	}
}

func TestServerRunClosesConnectionsAfterShutdownTimeout(t *testing.T) {
	var logs logBuffer
	started := make(chan struct{})
	// A stream that Close does not end: only its connection closing does.
	stuck := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done()
	})
	s := &Server{
		Name:            "testd",
		Listener:        listen(t),
		Handler:         stuck,
		Logger:          slog.New(slog.NewTextHandler(&logs, nil)),
		Close:           func(context.Context) {},
		ShutdownTimeout: 50 * time.Millisecond,
	}
	addr := s.Listener.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := runServer(ctx, s)

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-started
	cancel()
	if err := waitRun(t, done); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !strings.Contains(logs.String(), `level=WARN msg="shutdown timed out; closing connections" err="context deadline exceeded"`) {
		t.Fatalf("no timeout line:\n%s", logs.String())
	}
	io.ReadAll(resp.Body) // returns: the connection was closed
}

func TestDemoPublishesTicks(t *testing.T) {
	for _, replica := range []string{"", "A"} {
		t.Run("replica="+replica, func(t *testing.T) {
			var logs logBuffer
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var got []eventbus.Event
			d := &Demo{
				Interval: time.Millisecond,
				Replica:  replica,
				Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
				Publish: func(pctx context.Context, session string, ev eventbus.Event) error {
					if pctx != ctx || session != DemoSession {
						t.Errorf("Publish(%v, %q)", pctx, session)
					}
					if ctx.Err() != nil {
						return nil // a tick that raced with the cancel
					}
					got = append(got, ev)
					switch len(got) {
					case 2:
						return errors.New("boom")
					case 3:
						cancel()
					}
					return nil
				},
			}
			d.Run(ctx) // returns once ctx is done

			if len(got) != 3 {
				t.Fatalf("%d ticks", len(got))
			}
			for i, ev := range got {
				var data struct {
					N       int    `json:"n"`
					At      string `json:"at"`
					Replica string `json:"replica"`
				}
				raw, _ := ev.Data.(json.RawMessage)
				dec := json.NewDecoder(bytes.NewReader(raw))
				dec.DisallowUnknownFields()
				if ev.Type != "tick" || dec.Decode(&data) != nil || data.N != i+1 || data.Replica != replica {
					t.Fatalf("tick %d: %s %s", i, ev.Type, ev.Data)
				}
				if _, err := time.Parse(time.RFC3339Nano, data.At); err != nil || !strings.HasSuffix(data.At, "Z") {
					t.Fatalf("tick %d: at %q: %v", i, data.At, err)
				}
			}
			if want := `level=WARN msg="demo publish failed" session=demo err=boom`; strings.Count(logs.String(), "msg=") != 1 || !strings.Contains(logs.String(), want) {
				t.Fatalf("logs:\n%s", logs.String())
			}
		})
	}
}

func TestFlags(t *testing.T) {
	docs := FlagDocs{DefaultAddr: "127.0.0.1:1", Ring: "RING HELP", MaxSubscribers: "SUBS HELP", WriteTimeout: "WT HELP"}

	var out bytes.Buffer
	fs, _ := NewFlags("testd", "USAGE\n", &out, docs)
	if err := Parse(fs, []string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	for _, want := range []string{"USAGE\n", "RING HELP", "SUBS HELP", "WT HELP", `(default "127.0.0.1:1")`, `session "demo"`, "-shutdown-timeout",
		"-overflow policy", "catchup (it reads what it missed", "(default evict)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-h output lacks %q:\n%s", want, out.String())
		}
	}

	out.Reset()
	fs, _ = NewFlags("testd", "USAGE\n", &out, docs)
	if err := Parse(fs, []string{"-v", "extra"}); err == nil || !strings.Contains(err.Error(), `unexpected arguments: ["extra"]`) || !strings.HasPrefix(out.String(), "USAGE\n") {
		t.Fatalf("positional argument: %v; output %q", err, out.String())
	}

	fs, f := NewFlags("testd", "", io.Discard, docs)
	own := fs.String("own", "", "a daemon's own flag")
	if f.Addr != "127.0.0.1:1" || f.DemoInterval != 500*time.Millisecond || f.ShutdownTimeout != 10*time.Second || f.Demo || f.Verbose || !f.EpochIDs {
		t.Fatalf("defaults: %+v", f)
	}
	if o := f.BusOptions(nil); o.OverflowPolicy != 0 {
		t.Fatalf("default -overflow: policy %d, want 0 (the bus's default, OverflowEvict)", o.OverflowPolicy)
	}
	err := Parse(fs, []string{"-addr", ":0", "-ring", "5", "-max-subscribers", "6", "-max-queued", "7", "-max-event-bytes", "8",
		"-heartbeat", "1s", "-retry", "2s", "-retry-jitter", "-1ns", "-write-timeout", "3s", "-epoch-ids=false",
		"-cors-origin", "https://a.example, http://b.example:8080", "-cors-credentials", "-tls-cert", "c.pem", "-tls-key", "k.pem",
		"-demo", "-demo-interval", "4s", "-shutdown-timeout", "5s", "-v", "-own", "x", "-overflow", "catchup",
		"-body-timeout", "6s", "-body-budget", "9000000", "-header-timeout", "7s"})
	if err != nil {
		t.Fatal(err)
	}
	want := Flags{Addr: ":0", RingSize: 5, MaxSubscribers: 6, MaxQueued: 7, MaxEventBytes: 8, Heartbeat: time.Second, Retry: 2 * time.Second,
		RetryJitter: -1, WriteTimeout: 3 * time.Second, CORSOrigin: "https://a.example, http://b.example:8080", CORSCredentials: true,
		TLSCert: "c.pem", TLSKey: "k.pem", Demo: true, DemoInterval: 4 * time.Second, ShutdownTimeout: 5 * time.Second, Verbose: true,
		Overflow: eventbus.OverflowCatchUp, BodyTimeout: 6 * time.Second, BodyBudget: 9000000, HeaderTimeout: 7 * time.Second}
	if *f != want || *own != "x" {
		t.Fatalf("parsed %+v, own %q", *f, *own)
	}
	if l := f.Limits(); l != (Limits{ReadHeaderTimeout: 7 * time.Second, BodyTimeout: 6 * time.Second, MaxBody: 8 + BodySlack, BodyBudget: 9000000}) {
		t.Fatalf("Limits() = %+v", l)
	}
	logger := f.Logger(io.Discard)
	if !logger.Enabled(context.Background(), slog.LevelDebug) {
		t.Error("-v does not log at debug level")
	}
	if (&Flags{}).Logger(io.Discard).Enabled(context.Background(), slog.LevelDebug) {
		t.Error("debug logging without -v")
	}
	if o := f.BusOptions(logger); !reflect.DeepEqual(o, eventbus.Options{RingSize: 5, MaxSubscribers: 6, MaxQueued: 7, MaxEventBytes: 8,
		OverflowPolicy: eventbus.OverflowCatchUp, Logger: logger}) {
		t.Fatalf("BusOptions: %+v", o)
	}
	for name, p := range map[string]eventbus.OverflowPolicy{"evict": eventbus.OverflowEvict, "resync": eventbus.OverflowResync, "catchup": eventbus.OverflowCatchUp} {
		fs, f := NewFlags("testd", "", io.Discard, docs)
		if err := Parse(fs, []string{"-overflow", name}); err != nil || f.Overflow != p || fs.Lookup("overflow").Value.String() != name {
			t.Errorf("-overflow %s: %v, policy %d, shown as %q", name, err, f.Overflow, fs.Lookup("overflow").Value.String())
		}
	}
	for _, bad := range []string{"", "Evict", "drop", "catch-up"} {
		var out bytes.Buffer
		fs, _ := NewFlags("testd", "", &out, docs)
		if err := Parse(fs, []string{"-overflow", bad}); err == nil || !strings.Contains(out.String(), "must be evict, resync or catchup") {
			t.Errorf("-overflow %q: %v; output %q", bad, err, out.String())
		}
	}
	h := &eventbus.Handler{}
	if err := f.Handler(h); err != nil {
		t.Fatal(err)
	}
	wantH := &eventbus.Handler{Heartbeat: time.Second, Retry: 2 * time.Second, RetryJitter: -1, WriteTimeout: 3 * time.Second, BareIDs: true,
		CORS: &eventbus.CORS{Origins: []string{"https://a.example", "http://b.example:8080"}, Credentials: true}}
	if !reflect.DeepEqual(h, wantH) {
		t.Fatalf("Handler: %+v, CORS %+v", h, h.CORS)
	}
	if _, err := f.TLSConfig(); err == nil || !strings.Contains(err.Error(), "c.pem") {
		t.Fatalf("TLSConfig of missing files: %v", err)
	}
}

func TestFlagsHandlerAndTLSErrors(t *testing.T) {
	h := &eventbus.Handler{CORS: &eventbus.CORS{}}
	if err := (&Flags{EpochIDs: true}).Handler(h); err != nil || h.CORS != nil || h.BareIDs {
		t.Fatalf("no -cors-origin: %v %+v", err, h)
	}
	if err := (&Flags{CORSCredentials: true}).Handler(h); err == nil {
		t.Fatal("-cors-credentials without -cors-origin")
	}
	// "*" with credentials would reflect every origin with
	// Allow-Credentials: true (issue 22).
	for _, origins := range []string{"*", "https://a.example, *"} {
		h := &eventbus.Handler{}
		err := (&Flags{CORSOrigin: origins, CORSCredentials: true}).Handler(h)
		if err == nil || !strings.Contains(err.Error(), `-cors-origin "*" with -cors-credentials would let every site read the streams`) || h.CORS != nil {
			t.Fatalf("-cors-origin %q -cors-credentials: %v, CORS %+v", origins, err, h.CORS)
		}
	}
	if err := (&Flags{CORSOrigin: "*"}).Handler(h); err != nil || !reflect.DeepEqual(h.CORS, &eventbus.CORS{Origins: []string{"*"}}) {
		t.Fatalf(`-cors-origin "*" alone: %v, CORS %+v`, err, h.CORS)
	}
	if c, err := (&Flags{}).TLSConfig(); c != nil || err != nil {
		t.Fatalf("no TLS: %v %v", c, err)
	}
	if _, err := (&Flags{TLSCert: "c.pem"}).TLSConfig(); err == nil || !strings.Contains(err.Error(), "go together") {
		t.Fatalf("-tls-cert alone: %v", err)
	}
	certFile, keyFile := writeTestCert(t)
	c, err := (&Flags{TLSCert: certFile, TLSKey: keyFile}).TLSConfig()
	if err != nil || len(c.Certificates) != 1 {
		t.Fatalf("TLSConfig: %v %v", c, err)
	}
}

// routeRecorder is a Routes that answers with the name of the method called.
type routeRecorder struct{}

func answer(name string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, name+" "+r.PathValue("id")) }
}

func (routeRecorder) ServeIndex(w http.ResponseWriter, r *http.Request)   { answer("index")(w, r) }
func (routeRecorder) ServeEvents(w http.ResponseWriter, r *http.Request)  { answer("events")(w, r) }
func (routeRecorder) ServePublish(w http.ResponseWriter, r *http.Request) { answer("publish")(w, r) }
func (routeRecorder) ServeStatus(w http.ResponseWriter, r *http.Request)  { answer("status")(w, r) }
func (routeRecorder) ServeDelete(w http.ResponseWriter, r *http.Request)  { answer("delete")(w, r) }
func (routeRecorder) ServeDisconnect(w http.ResponseWriter, r *http.Request) {
	answer("disconnect")(w, r)
}
func (routeRecorder) ServeSignal(w http.ResponseWriter, r *http.Request) { answer("signal")(w, r) }

func TestMux(t *testing.T) {
	mux := Mux(routeRecorder{})
	mux.HandleFunc("POST /session/{id}/extra", answer("extra"))
	h := JSONErrors(mux)
	for _, c := range []struct {
		method, path string
		status       int
		body, allow  string
	}{
		{"GET", "/", 200, "index ", ""},
		{"GET", "/session/a/events", 200, "events a", ""},
		{"HEAD", "/session/a/events", 200, "", ""},
		{"OPTIONS", "/session/a/events", 200, "events a", ""},
		{"POST", "/session/a/events", 200, "publish a", ""},
		{"GET", "/session/a", 200, "status a", ""},
		{"DELETE", "/session/a", 200, "delete a", ""},
		{"POST", "/session/a/disconnect", 200, "disconnect a", ""},
		{"POST", "/session/a/signal", 200, "signal a", ""},
		{"POST", "/session/a/extra", 200, "extra a", ""},
		{"GET", "/nope", 404, `{"error":"no such route","code":"not_found"}` + "\n", ""},
		{"PUT", "/session/a/events", 405, `{"error":"method PUT not allowed here","code":"method_not_allowed"}` + "\n", "GET, HEAD, OPTIONS, POST"},
		{"GET", "/session/a/disconnect", 405, `{"error":"method GET not allowed here","code":"method_not_allowed"}` + "\n", "POST"},
		{"POST", "/session/a", 405, `{"error":"method POST not allowed here","code":"method_not_allowed"}` + "\n", "DELETE, GET, HEAD"},
		{"GET", "/session/a/../a", 307, "", ""}, // the ServeMux's redirect to the clean path
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(c.method, c.path, nil))
		if w.Code != c.status || (c.body != "" && w.Body.String() != c.body) {
			t.Errorf("%s %s: %d %q", c.method, c.path, w.Code, w.Body.String())
		}
		if c.status >= 400 && (w.Header().Get("Content-Type") != "application/json" || w.Header().Get("Allow") != c.allow) {
			t.Errorf("%s %s: headers %v", c.method, c.path, w.Header())
		}
	}
}

func TestWriteJSON(t *testing.T) {
	check := func(w *httptest.ResponseRecorder, status int, body string) {
		t.Helper()
		if w.Code != status || w.Body.String() != body ||
			w.Header().Get("Content-Type") != "application/json" || w.Header().Get("Cache-Control") != "no-store" {
			t.Fatalf("%d %q %v", w.Code, w.Body.String(), w.Header())
		}
	}
	w := httptest.NewRecorder()
	WriteJSON(w, http.StatusTeapot, map[string]int{"b": 2, "a": 1})
	check(w, http.StatusTeapot, "{\"a\":1,\"b\":2}\n")

	w = httptest.NewRecorder()
	WriteJSON(w, http.StatusOK, func() {})
	check(w, http.StatusInternalServerError, "{\"error\":\"internal\",\"code\":\"internal\"}\n")

	w = httptest.NewRecorder()
	WriteError(w, http.StatusBadRequest, "bad_thing", "it is bad")
	check(w, http.StatusBadRequest, "{\"error\":\"it is bad\",\"code\":\"bad_thing\"}\n")
}

func TestBodyLimits(t *testing.T) {
	if got, want := MaxBody(0), int64(eventbus.DefaultMaxEventBytes)+BodySlack; got != want {
		t.Fatalf("MaxBody(0) = %d, want %d", got, want)
	}
	if got := MaxBody(10); got != 10+BodySlack {
		t.Fatalf("MaxBody(10) = %d", got)
	}

	decode := func(body string, limit int64) error {
		var req struct{ Type string }
		r := httptest.NewRequest("POST", "/", strings.NewReader(body))
		return NewBodyDecoder(httptest.NewRecorder(), r, limit).Decode(&req)
	}
	if err := decode(`{"type":"a"}`, 100); err != nil {
		t.Fatalf("good body: %v", err)
	}
	if err := decode(`{"type":"a","zz":1}`, 100); err == nil || !strings.Contains(err.Error(), `unknown field "zz"`) {
		t.Fatalf("unknown field: %v", err)
	}
	var mbe *http.MaxBytesError
	if err := decode(`{"type":"`+strings.Repeat("a", 100)+`"}`, 50); !errors.As(err, &mbe) || mbe.Limit != 50 {
		t.Fatalf("body over the limit: %v", err)
	}
}

func writeTestCert(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile, _, err := WriteSelfSignedCert(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// The server speaks HTTP/1.1 and h2c without TLS, HTTP/1.1 and HTTP/2 with
// it, and every request's context carries its connection.
func TestServerProtocols(t *testing.T) {
	certFile, keyFile, cert, err := WriteSelfSignedCert(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tlsConfig, err := (&Flags{TLSCert: certFile, TLSKey: keyFile}).TLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	proto := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, hasConn := r.Context().Value(connKey{}).(net.Conn)
		fmt.Fprintf(w, "%s conn=%v", r.Proto, hasConn)
	})
	for _, c := range []struct {
		name   string
		tls    *tls.Config
		client func(p *http.Protocols)
		scheme string
		want   string
	}{
		{"HTTP/1.1", nil, func(p *http.Protocols) { p.SetHTTP1(true) }, "http", "HTTP/1.1 conn=true"},
		{"h2c", nil, func(p *http.Protocols) { p.SetUnencryptedHTTP2(true) }, "http", "HTTP/2.0 conn=true"},
		{"TLS HTTP/1.1", tlsConfig, func(p *http.Protocols) { p.SetHTTP1(true) }, "https", "HTTP/1.1 conn=true"},
		{"TLS HTTP/2", tlsConfig, func(p *http.Protocols) { p.SetHTTP2(true) }, "https", "HTTP/2.0 conn=true"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &Server{Name: "testd", Listener: listen(t), Handler: proto, TLS: c.tls,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Close: func(context.Context) {}, ShutdownTimeout: time.Second}
			addr := s.Listener.Addr().String()
			ctx, cancel := context.WithCancel(context.Background())
			done := runServer(ctx, s)
			var p http.Protocols
			c.client(&p)
			tr := &http.Transport{Protocols: &p, TLSClientConfig: &tls.Config{RootCAs: roots}}
			resp, err := (&http.Client{Transport: tr}).Get(c.scheme + "://" + addr + "/")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			tr.CloseIdleConnections()
			cancel()
			if err := waitRun(t, done); err != nil {
				t.Fatal(err)
			}
			if string(body) != c.want {
				t.Fatalf("got %q, want %q", body, c.want)
			}
		})
	}
}

// A clean cut ends the response and keeps the connection; an abort resets
// the TCP connection, and the client sees ECONNRESET.
func TestStreamCut(t *testing.T) {
	streams := make(chan *Stream, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st, r := Track(r)
		defer st.Done()
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "open\n")
		w.(http.Flusher).Flush()
		streams <- st
		<-r.Context().Done()
	})
	s := &Server{Name: "testd", Listener: listen(t), Handler: h,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Close: func(context.Context) {}, ShutdownTimeout: time.Second}
	addr := s.Listener.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := runServer(ctx, s)
	defer func() {
		cancel()
		if err := waitRun(t, done); err != nil {
			t.Error(err)
		}
	}()

	for _, mode := range []CutMode{CutClean, CutAbort} {
		t.Run(mode.String(), func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(conn)
			for range 2 { // the same connection twice: kept after a clean cut
				io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				if line, _ := bufio.NewReader(resp.Body).ReadString('\n'); line != "open\n" {
					t.Fatalf("first line %q", line)
				}
				(<-streams).Cut(mode)
				rest, err := io.ReadAll(resp.Body)
				if mode == CutClean {
					if err != nil || len(rest) != 0 {
						t.Fatalf("clean cut: %q %v, want the end of the body", rest, err)
					}
					continue
				}
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Fatalf("abort: %v, want a connection reset", err)
				}
				return
			}
		})
	}
	for _, c := range []struct {
		q    string
		mode CutMode
		ok   bool
	}{{"", CutClean, true}, {"?mode=clean", CutClean, true}, {"?mode=abort", CutAbort, true}, {"?mode=rst", CutClean, false}} {
		m, err := ParseCutMode(httptest.NewRequest("POST", "/x"+c.q, nil))
		if m != c.mode || (err == nil) != c.ok {
			t.Errorf("%q: %v %v", c.q, m, err)
		}
	}
}
