package daemon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/internal/pipenet"
)

// limitedServer runs a Server with limits and h on an in-memory listener
// inside the current synctest bubble, and returns a dialer of raw
// connections to it. Cleanup stops the server.
func limitedServer(t *testing.T, limits Limits, h http.Handler) (dial func() net.Conn) {
	t.Helper()
	ln := pipenet.Listen()
	ctx, cancel := context.WithCancel(context.Background())
	done := runServer(ctx, &Server{
		Name: "testd", Listener: ln, Handler: h, Logger: slog.New(slog.DiscardHandler),
		Close: func(context.Context) {}, ShutdownTimeout: time.Second, Limits: limits,
	})
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return func() net.Conn {
		c, err := ln.DialContext(context.Background(), "", "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
}

// publishHandler is the daemons' POST route (eventbus.PublishHandler)
// with bodies of at most limit bytes arriving within timeout (0: its
// default), on a Publisher that answers the event's data's length as its
// id and its type as its epoch.
func publishHandler(limit int64, timeout time.Duration) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /session/{id}/events", &eventbus.PublishHandler{Publisher: echoPublisher{}, MaxBodyBytes: limit, BodyTimeout: timeout})
	return mux
}

type echoPublisher struct{}

func (echoPublisher) Publish(_ context.Context, _ string, e eventbus.Event) (uint64, string, error) {
	raw, _ := e.Data.(json.RawMessage)
	return uint64(len(raw)), e.Type, nil
}

func (p echoPublisher) PublishIdempotent(ctx context.Context, s, _ string, e eventbus.Event) (uint64, string, bool, error) {
	id, epoch, err := p.Publish(ctx, s, e)
	return id, epoch, false, err
}

// readResponse reads one HTTP response from c and its JSON body.
func readResponse(t *testing.T, br *bufio.Reader) (*http.Response, map[string]any) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("response %d: body: %v", resp.StatusCode, err)
	}
	return resp, body
}

func postHeaders(contentLength int64) string {
	return fmt.Sprintf("POST /session/s/events HTTP/1.1\r\nHost: pipe\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", contentLength)
}

// wantClosed fails unless the server has closed c: a read gets EOF.
func wantClosed(t *testing.T, br *bufio.Reader) {
	t.Helper()
	if b, err := br.ReadByte(); err == nil {
		t.Fatalf("the connection is still open: read %q", b)
	}
}

func TestSlowBodyGets408AtTheBodyTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dial := limitedServer(t, Limits{BodyTimeout: 5 * time.Second}, publishHandler(MaxBody(0), 5*time.Second))
		c := dial()
		start := time.Now()
		// The probe: headers announcing 1,000,000 bytes, then a
		// trickle of 21 of them.
		if _, err := io.WriteString(c, postHeaders(1_000_000)); err != nil {
			t.Fatal(err)
		}
		trickled := make(chan struct{})
		go func() {
			defer close(trickled)
			for range 21 {
				time.Sleep(200 * time.Millisecond)
				if _, err := c.Write([]byte(" ")); err != nil {
					return
				}
			}
		}()
		defer func() { <-trickled }()
		br := bufio.NewReader(c)
		resp, body := readResponse(t, br)
		if resp.StatusCode != http.StatusRequestTimeout || body["code"] != "request_timeout" || !resp.Close {
			t.Fatalf("slow body: %d %v (close %v), want 408 request_timeout with Connection: close", resp.StatusCode, body, resp.Close)
		}
		if took := time.Since(start); took != 5*time.Second {
			t.Fatalf("408 after %v, want exactly the body timeout 5s", took)
		}
		wantClosed(t, br)
	})
}

func TestSlowBodyGets408OnHTTP2(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ln := pipenet.Listen()
		ctx, cancel := context.WithCancel(context.Background())
		done := runServer(ctx, &Server{
			Name: "testd", Listener: ln, Handler: publishHandler(MaxBody(0), 5*time.Second), Logger: slog.New(slog.DiscardHandler),
			Close: func(context.Context) {}, ShutdownTimeout: time.Second, Limits: Limits{BodyTimeout: 5 * time.Second},
		})
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		tr := &http.Transport{Protocols: &p, DialContext: ln.DialContext}
		defer func() {
			tr.CloseIdleConnections()
			cancel()
			<-done
		}()
		body, bw := io.Pipe()
		defer bw.Close()
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			bw.Write([]byte(`{"type":"x","data":"`))
			for {
				time.Sleep(200 * time.Millisecond)
				if _, err := bw.Write([]byte("y")); err != nil {
					return
				}
			}
		}()
		req, _ := http.NewRequest(http.MethodPost, "http://pipe/session/s/events", body)
		start := time.Now()
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(b), "request_timeout") {
			t.Fatalf("slow HTTP/2 body: HTTP/%d %d %s, want 408 request_timeout", resp.ProtoMajor, resp.StatusCode, b)
		}
		if took := time.Since(start); took != 5*time.Second {
			t.Fatalf("408 after %v, want exactly 5s", took)
		}
		bw.CloseWithError(errors.New("done"))
		<-stopped
	})
}

func TestSlowHeadersAreCutAtTheReadHeaderTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dial := limitedServer(t, Limits{}, publishHandler(MaxBody(0), 0))
		start := time.Now()
		c := dial()
		stop, stopped := make(chan struct{}), make(chan struct{})
		go func() { // slowloris: a header line every second, never the end
			defer close(stopped)
			io.WriteString(c, "GET /session/s/events HTTP/1.1\r\nHost: pipe\r\n")
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(time.Second):
				}
				if _, err := fmt.Fprintf(c, "X-Slow-%d: 1\r\n", i); err != nil {
					return
				}
			}
		}()
		wantClosed(t, bufio.NewReader(c))
		close(stop)
		<-stopped
		if took := time.Since(start); took != DefaultReadHeaderTimeout {
			t.Fatalf("slow headers cut after %v, want exactly DefaultReadHeaderTimeout %v", took, DefaultReadHeaderTimeout)
		}
	})
}

func TestHeadersLargerThanMaxHeaderBytesGet431(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dial := limitedServer(t, Limits{MaxHeaderBytes: 1 << 10}, publishHandler(MaxBody(0), 0))
		c := dial()
		go fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: pipe\r\nX-Big: %s\r\n\r\n", strings.Repeat("x", 8<<10))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("8 KiB header over a 1 KiB limit: %d, want 431", resp.StatusCode)
		}
	})
}

func TestContentLengthOverMaxBodyIs413BeforeReading(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dial := limitedServer(t, Limits{MaxBody: 1000}, publishHandler(1000, 0))
		c := dial()
		start := time.Now()
		io.WriteString(c, postHeaders(1001)) // and never a byte of the body
		br := bufio.NewReader(c)
		resp, body := readResponse(t, br)
		if resp.StatusCode != http.StatusRequestEntityTooLarge || body["code"] != "body_too_large" || time.Since(start) != 0 {
			t.Fatalf("Content-Length 1001 over 1000: %d %v after %v, want 413 body_too_large at once", resp.StatusCode, body, time.Since(start))
		}
		wantClosed(t, br)
	})
}

func TestBodyBudgetRefusesWithRetryAfterAndReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, err := io.Copy(io.Discard, r.Body)
			if r.URL.Query().Has("hold") {
				<-release
			}
			WriteJSON(w, http.StatusOK, map[string]any{"bytes": n, "err": fmt.Sprint(err)})
		})
		dial := limitedServer(t, Limits{MaxBody: 1000, BodyBudget: 2500}, h)
		post := func(target string, n int, chunked bool) (*bufio.Reader, net.Conn) {
			c := dial()
			go func() {
				if chunked {
					fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: pipe\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", target, n, strings.Repeat("x", n))
					return
				}
				fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: pipe\r\nContent-Length: %d\r\n\r\n%s", target, n, strings.Repeat("x", n))
			}()
			return bufio.NewReader(c), c
		}
		// Two 1000-byte bodies held by their handlers reserve 2000 of 2500.
		held1, _ := post("/?hold", 1000, false)
		held2, _ := post("/?hold", 1000, false)
		synctest.Wait()
		// A third would pass the budget: refused before it is read.
		br, _ := post("/", 1000, false)
		resp, body := readResponse(t, br)
		if resp.StatusCode != http.StatusServiceUnavailable || body["code"] != "server_busy" || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("body over the budget: %d %v Retry-After %q, want 503 server_busy with Retry-After", resp.StatusCode, body, resp.Header.Get("Retry-After"))
		}
		// A chunked body reserves MaxBody: refused too; a small one fits.
		br, _ = post("/", 10, true)
		if resp, body := readResponse(t, br); resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("chunked body over the budget: %d %v, want 503", resp.StatusCode, body)
		}
		br, _ = post("/", 500, false)
		if resp, body := readResponse(t, br); resp.StatusCode != http.StatusOK || body["bytes"] != float64(500) {
			t.Fatalf("500 bytes within the budget: %d %v", resp.StatusCode, body)
		}
		close(release)
		for _, br := range []*bufio.Reader{held1, held2} {
			if resp, body := readResponse(t, br); resp.StatusCode != http.StatusOK || body["bytes"] != float64(1000) {
				t.Fatalf("held body: %d %v", resp.StatusCode, body)
			}
		}
		// Released: the budget admits bodies again, a chunked one too.
		br, _ = post("/", 1000, true)
		if resp, body := readResponse(t, br); resp.StatusCode != http.StatusOK || body["bytes"] != float64(1000) {
			t.Fatalf("after release: %d %v", resp.StatusCode, body)
		}
		// A chunked body past MaxBody is cut off at it.
		br, _ = post("/", 1001, true)
		if resp, body := readResponse(t, br); body["bytes"] != float64(1000) || !strings.Contains(fmt.Sprint(body["err"]), "too large") {
			t.Fatalf("chunked body of 1001 over MaxBody 1000: %d %v, want a read error after 1000 bytes", resp.StatusCode, body)
		}
	})
}

func TestBodyDeadlineEndsWithTheBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// A handler that works past the body timeout after reading its
		// body keeps its request context (the HTTP/1.1 server's background
		// read must not hit the body's deadline), and a stream (a GET)
		// has no deadline at all.
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, err := io.Copy(io.Discard, r.Body)
			time.Sleep(3 * time.Second)
			// The SSE handler's per-write deadlines still work behind the limits.
			wdErr := http.NewResponseController(w).SetWriteDeadline(time.Now().Add(time.Second))
			WriteJSON(w, http.StatusOK, map[string]any{"bytes": n, "readErr": fmt.Sprint(err), "ctxErr": fmt.Sprint(r.Context().Err()), "wdErr": fmt.Sprint(wdErr)})
		})
		dial := limitedServer(t, Limits{BodyTimeout: time.Second}, h)
		c := dial()
		br := bufio.NewReader(c)
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: pipe\r\nContent-Length: 3\r\n\r\nabc")
		resp, body := readResponse(t, br)
		if resp.StatusCode != http.StatusOK || body["bytes"] != float64(3) || body["readErr"] != "<nil>" || body["ctxErr"] != "<nil>" || body["wdErr"] != "<nil>" {
			t.Fatalf("handler past the body timeout: %d %v", resp.StatusCode, body)
		}
		// The connection stays usable: the next request on it is served.
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: pipe\r\n\r\n")
		if resp, body := readResponse(t, br); resp.StatusCode != http.StatusOK || body["ctxErr"] != "<nil>" || body["wdErr"] != "<nil>" {
			t.Fatalf("GET after it: %d %v", resp.StatusCode, body)
		}
	})
}

func TestLimitsInvalid(t *testing.T) {
	for _, l := range []Limits{{BodyTimeout: -1}, {MaxBody: 100, BodyBudget: 99}, {MaxHeaderBytes: -1}} {
		ln := listen(t)
		closed := false
		err := (&Server{Name: "testd", Listener: ln, Handler: http.NotFoundHandler(), Logger: slog.New(slog.DiscardHandler),
			Close: func(context.Context) { closed = true }, Limits: l}).Run(context.Background())
		if err == nil || !closed {
			t.Errorf("Limits %+v: Run = %v (Close called %v), want an error", l, err, closed)
		}
		if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Limits %+v: the listener is not closed: %v", l, err)
		}
	}
}

// The memory limit is the budget's sum, an eighth more and 32 MiB; at the
// defaults (-max-total-bytes 256 MiB, 64 subscribers of 2 MiB, 4 bodies of
// 17 MiB) 540.5 MiB.
func TestMemoryBudgetLimit(t *testing.T) {
	const mib = 1 << 20
	m := (&Flags{}).MemoryBudget(eventbus.DefaultMaxTotalBytes)
	if *m != (MemoryBudget{Rings: 256 * mib, Subscribers: 64, QueuedBytes: 2 * mib}) {
		t.Fatalf("default budget %+v", *m)
	}
	m.Bodies = DefaultBodyBudgetBodies * MaxBody(0)
	if got, want := m.Limit(), int64(452*mib+452*mib/8+32*mib); got != want {
		t.Fatalf("default limit %d, want %d (540.5 MiB)", got, want)
	}
	m = (&Flags{MaxSubscribers: 8, BodyBudget: 10 * mib}).MemoryBudget(64 * mib)
	if got, want := m.Limit(), int64(90*mib+90*mib/8+32*mib); got != want {
		t.Fatalf("limit of %+v: %d, want %d", *m, got, want)
	}
	// A Hub's daemon: its budget counts what streams hold beyond the
	// rings, so the streams add nothing.
	m = (&Flags{MaxSubscribers: 8, BodyBudget: 10 * mib}).HubMemoryBudget(64 * mib)
	if *m != (MemoryBudget{Rings: 64 * mib, Bodies: 10 * mib}) {
		t.Fatalf("hub budget %+v", *m)
	}
	if got, want := m.Limit(), int64(74*mib+74*mib/8+32*mib); got != want {
		t.Fatalf("limit of %+v: %d, want %d", *m, got, want)
	}
}

// GOMEMLIMIT, when set, wins: the runtime has applied it and the budget
// does not replace it. Without it the limit is the budget's, logged, and
// restore puts the previous one back.
func TestSetMemoryLimit(t *testing.T) {
	prev := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prev)
	m := MemoryBudget{Rings: 64 << 20, Subscribers: 2, QueuedBytes: 1 << 20, Bodies: 4 << 20}
	env := func(v string, set bool) func(string) (string, bool) {
		return func(k string) (string, bool) {
			if k != "GOMEMLIMIT" {
				t.Errorf("looked up %q", k)
			}
			return v, set
		}
	}
	for _, tc := range []struct {
		name string
		env  func(string) (string, bool)
	}{{"unset", env("", false)}, {"empty", env("", true)}} {
		var logs bytes.Buffer
		restore := setMemoryLimit(slog.New(slog.NewTextHandler(&logs, nil)), m, tc.env)
		if got := debug.SetMemoryLimit(-1); got != m.Limit() {
			t.Errorf("%s: limit %d, want %d", tc.name, got, m.Limit())
		}
		if !strings.Contains(logs.String(), "memory limit from the budget") || !strings.Contains(logs.String(), fmt.Sprintf("bytes=%d", m.Limit())) {
			t.Errorf("%s: log %q", tc.name, logs.String())
		}
		restore()
		if got := debug.SetMemoryLimit(-1); got != prev {
			t.Errorf("%s: restored %d, want %d", tc.name, got, prev)
		}
	}

	debug.SetMemoryLimit(123 << 20) // as the runtime would have from GOMEMLIMIT=123MiB
	var logs bytes.Buffer
	restore := setMemoryLimit(slog.New(slog.NewTextHandler(&logs, nil)), m, env("123MiB", true))
	if got := debug.SetMemoryLimit(-1); got != 123<<20 {
		t.Errorf("GOMEMLIMIT set: limit %d, want %d", got, 123<<20)
	}
	if !strings.Contains(logs.String(), "memory limit from GOMEMLIMIT") || !strings.Contains(logs.String(), "GOMEMLIMIT=123MiB") {
		t.Errorf("GOMEMLIMIT set: log %q", logs.String())
	}
	restore()
	if got := debug.SetMemoryLimit(-1); got != 123<<20 {
		t.Errorf("GOMEMLIMIT set: restore changed the limit to %d", got)
	}
}

// Run sets the limit of its Memory while it serves, its Bodies from the
// body budget of its Limits, and puts the previous limit back.
func TestServerRunSetsMemoryLimit(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "") // empty counts as unset
	prev := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(prev)
	var logs bytes.Buffer
	m := MemoryBudget{Rings: 64 << 20, Subscribers: 4, QueuedBytes: 1 << 20}
	want := MemoryBudget{Rings: 64 << 20, Subscribers: 4, QueuedBytes: 1 << 20, Bodies: 3 << 20}.Limit()
	ctx, cancel := context.WithCancel(context.Background())
	var during int64
	done := runServer(ctx, &Server{
		Name: "testd", Listener: pipenet.Listen(), Handler: http.NotFoundHandler(), Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Close: func(context.Context) {}, ShutdownTimeout: time.Second,
		Limits: Limits{MaxBody: 1 << 20, BodyBudget: 3 << 20}, Memory: &m,
		Ready: func(string) { during = debug.SetMemoryLimit(-1); cancel() },
	})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if during != want {
		t.Errorf("limit while serving %d, want %d", during, want)
	}
	if got := debug.SetMemoryLimit(-1); got != prev {
		t.Errorf("limit after Run %d, want the previous %d", got, prev)
	}
	if !strings.Contains(logs.String(), fmt.Sprintf(`msg="memory limit from the budget" bytes=%d`, want)) {
		t.Errorf("log: %s", logs.String())
	}
}
