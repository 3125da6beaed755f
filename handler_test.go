package eventbus

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// ---------------------------------------------------------------------------
// Test harness: buses with a fixed clock, captured logs, a real loopback
// server, an SSE client on top of the strict parser, and in-memory writers.

// publishN publishes n events of type "e" whose data is their own id.
func publishN(t *testing.T, b *EventBus, n int) []Frame {
	t.Helper()
	var fs []Frame
	for range n {
		f, err := b.Publish(Event{Type: "e", Data: b.LastEventID() + 1})
		require.NoError(t, err)
		fs = append(fs, f)
	}
	return fs
}

// wantEvent is what the parser reports for event id published by publishN.
func wantEvent(id uint64) sseEvent {
	s := strconv.FormatUint(id, 10)
	return sseEvent{
		Type: "e",
		Data: `{"id":` + s + `,"v":1,"type":"e","data":` + s + `,"_meta":{"serverTimestamp":1719000000000}}`,
		ID:   s,
	}
}

// wantSynth is a synthetic frame with data (exact JSON); lastID is the last
// event id the client saw before it (a synthetic frame has no id of its own).
func wantSynth(typ, data, lastID string) sseEvent {
	return sseEvent{
		Type: typ,
		Data: `{"v":1,"type":"` + typ + `","data":` + data + `,"_meta":{"serverTimestamp":1719000000000}}`,
		ID:   lastID,
	}
}

// wantReplayComplete is b's replay_complete after count replayed events up
// to last; lastID is the SSE id the client holds when it arrives.
func wantReplayComplete(b *EventBus, count int, last uint64, lastID string) sseEvent {
	if count == 0 {
		return wantSynth(TypeReplayComplete, `{"replayedCount":0,"epoch":"`+b.Epoch()+`"}`, lastID)
	}
	return wantSynth(TypeReplayComplete, fmt.Sprintf(`{"replayedCount":%d,"lastReplayedEventId":%d,"lastEventId":%d,"epoch":"%s"}`,
		count, last, last, b.Epoch()), lastID)
}

// testEnv is a loopback HTTP server with the Handler on
// "GET /session/{id}/events" and a Lookup over a map of buses.
type testEnv struct {
	srv  *httptest.Server
	h    *Handler
	logs *logCapture

	mu    sync.Mutex
	buses map[string]*EventBus
}

// testJitter is the RetryJitter of the test handlers: none unless a test
// asks for it, so that "retry:" is exact.
func testJitter(j time.Duration) time.Duration {
	if j == 0 {
		return -1
	}
	return j
}

type envOptions struct {
	handler        *Handler // Retry, RetryJitter, Heartbeat, WriteTimeout, EpochIDs, CORS and Authorize are used; nil: none
	wrap           func(http.Handler) http.Handler
	maxHeaderBytes int
	http2          bool
	anyMethod      bool // route every method to the handler, not only GET/HEAD
}

func newEnv(t *testing.T, o envOptions) *testEnv {
	t.Helper()
	e := &testEnv{logs: &logCapture{}, buses: map[string]*EventBus{}}
	if o.handler == nil {
		o.handler = &Handler{}
	}
	e.h = &Handler{
		Lookup:       e.lookup,
		Logger:       e.logs.logger(),
		Retry:        o.handler.Retry,
		RetryJitter:  testJitter(o.handler.RetryJitter),
		Heartbeat:    o.handler.Heartbeat,
		WriteTimeout: o.handler.WriteTimeout,
		EpochIDs:     o.handler.EpochIDs,
		CORS:         o.handler.CORS,
		Authorize:    o.handler.Authorize,
	}
	var h http.Handler = e.h
	if o.wrap != nil {
		h = o.wrap(h)
	}
	mux := http.NewServeMux()
	if o.anyMethod {
		mux.Handle("/session/{id}/events", h)
	} else {
		mux.Handle("GET /session/{id}/events", h)
	}
	e.srv = httptest.NewUnstartedServer(mux)
	if o.maxHeaderBytes > 0 {
		e.srv.Config.MaxHeaderBytes = o.maxHeaderBytes
	}
	if o.http2 {
		e.srv.EnableHTTP2 = true
		e.srv.StartTLS()
	} else {
		e.srv.Start()
	}
	t.Cleanup(e.srv.Close)
	return e
}

func (e *testEnv) lookup(r *http.Request) (*EventBus, error) {
	id := r.PathValue("id")
	e.mu.Lock()
	b, ok := e.buses[id]
	e.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrSessionNotFound, id)
	}
	return b, nil
}

// sessionWithEvents adds a session of its own with n events published
// (by publishN) and returns its stream path and bus.
func (e *testEnv) sessionWithEvents(t *testing.T, n int) (string, *EventBus) {
	e.mu.Lock()
	id := "s" + strconv.Itoa(len(e.buses)+1)
	e.mu.Unlock()
	b := e.bus(t, id, Options{})
	publishN(t, b, n)
	return "/session/" + id + "/events", b
}

// bus adds a session.
func (e *testEnv) bus(t *testing.T, id string, opts Options) *EventBus {
	b := newBus(t, e.logs.capture(opts))
	e.mu.Lock()
	e.buses[id] = b
	e.mu.Unlock()
	return b
}

// do sends a request; the body is closed when the test ends.
func (e *testEnv) do(t *testing.T, method, path string, hdr http.Header) *http.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, method, e.srv.URL+path, nil)
	require.NoError(t, err)
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	resp, err := e.srv.Client().Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

// open starts a stream and requires a 200 text/event-stream answer.
func (e *testEnv) open(t *testing.T, path string, hdr http.Header) *sseStream {
	t.Helper()
	resp := e.do(t, http.MethodGet, path, hdr)
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	}
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	return newSSEStream(t, resp)
}

// stream opens a stream and requires "retry: 3000" as its first record.
// When it returns, the subscription is registered (the handler subscribes
// before it sends the headers).
func (e *testEnv) stream(t *testing.T, path string, hdr http.Header) *sseStream {
	t.Helper()
	c := e.open(t, path, hdr)
	require.Equal(t, sseRecord{Kind: sseRetryRecord, Retry: 3000}, c.next())
	return c
}

// requireJSONError checks an error answer of SPEC 10 and returns its body.
func requireJSONError(t *testing.T, status int, hdr http.Header, body []byte, wantStatus int, code string) map[string]any {
	t.Helper()
	require.Equal(t, wantStatus, status, "body %s", body)
	require.Equal(t, "application/json", hdr.Get("Content-Type"))
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&m), "body %q", body)
	require.Equal(t, code, m["code"], "body %s", body)
	msg, _ := m["error"].(string)
	require.NotEmpty(t, msg, "body %s", body)
	return m
}

func requireHTTPError(t *testing.T, resp *http.Response, wantStatus int, code string) map[string]any {
	t.Helper()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return requireJSONError(t, resp.StatusCode, resp.Header, body, wantStatus, code)
}

// memWriter is an in-memory ResponseWriter that implements http.Flusher.
// Hooks run without its lock, on the handler's goroutine.
type memWriter struct {
	mu      sync.Mutex
	header  http.Header
	sent    http.Header // the header at WriteHeader
	status  int
	body    bytes.Buffer
	writes  int
	flushes int

	beforeWrite func(n int, p []byte) error // n counts from 1; an error fails the write
	beforeFlush func(n int)
}

func newMemWriter() *memWriter { return &memWriter{header: http.Header{}} }

func (w *memWriter) Header() http.Header { return w.header }

func (w *memWriter) WriteHeader(code int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.status == 0 {
		w.status, w.sent = code, w.header.Clone()
	}
}

func (w *memWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.writes++
	n, hook := w.writes, w.beforeWrite
	w.mu.Unlock()
	if hook != nil {
		if err := hook(n, p); err != nil {
			return 0, err
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.status == 0 {
		w.status, w.sent = http.StatusOK, w.header.Clone()
	}
	return w.body.Write(p)
}

func (w *memWriter) Flush() {
	w.mu.Lock()
	w.flushes++
	n, hook := w.flushes, w.beforeFlush
	w.mu.Unlock()
	if hook != nil {
		hook(n)
	}
}

type memState struct {
	status          int
	header          http.Header
	body            string
	writes, flushes int
}

func (w *memWriter) state() memState {
	w.mu.Lock()
	defer w.mu.Unlock()
	return memState{w.status, w.sent, w.body.String(), w.writes, w.flushes}
}

// deadlineWriter adds SetWriteDeadline, found by http.ResponseController.
// From write number blockFrom on (0: never), a Write blocks until the
// deadline and then fails, like a socket whose peer stopped reading.
type deadlineWriter struct {
	*memWriter
	dmu       sync.Mutex
	deadline  time.Time
	sets      []deadlineSet
	blockFrom int
}

type deadlineSet struct{ at, deadline time.Time }

func newDeadlineWriter(blockFrom int) *deadlineWriter {
	w := &deadlineWriter{memWriter: newMemWriter(), blockFrom: blockFrom}
	w.beforeWrite = func(n int, p []byte) error {
		if w.blockFrom == 0 || n < w.blockFrom {
			return nil
		}
		w.dmu.Lock()
		d := w.deadline
		w.dmu.Unlock()
		if d.IsZero() {
			return errors.New("test: a write without a deadline would block forever")
		}
		time.Sleep(time.Until(d))
		return os.ErrDeadlineExceeded
	}
	return w
}

func (w *deadlineWriter) SetWriteDeadline(d time.Time) error {
	w.dmu.Lock()
	defer w.dmu.Unlock()
	w.deadline = d
	w.sets = append(w.sets, deadlineSet{time.Now(), d})
	return nil
}

func (w *deadlineWriter) deadlineSets() []deadlineSet {
	w.dmu.Lock()
	defer w.dmu.Unlock()
	return append([]deadlineSet(nil), w.sets...)
}

// noFlushWriter cannot flush and wraps nothing.
type noFlushWriter struct{ w *memWriter }

func (n noFlushWriter) Header() http.Header         { return n.w.Header() }
func (n noFlushWriter) Write(p []byte) (int, error) { return n.w.Write(p) }
func (n noFlushWriter) WriteHeader(code int)        { n.w.WriteHeader(code) }

// unwrapOnlyWriter cannot flush itself but wraps a writer that can.
type unwrapOnlyWriter struct{ inner http.ResponseWriter }

func (u unwrapOnlyWriter) Header() http.Header         { return u.inner.Header() }
func (u unwrapOnlyWriter) Write(p []byte) (int, error) { return u.inner.Write(p) }
func (u unwrapOnlyWriter) WriteHeader(code int)        { u.inner.WriteHeader(code) }
func (u unwrapOnlyWriter) Unwrap() http.ResponseWriter { return u.inner }

// countingWriter is middleware-style: it counts flushes and times writes and
// flushes, and exposes the real writer with Unwrap (so the handler's write
// deadlines reach the connection).
type countingWriter struct {
	http.ResponseWriter
	mu       sync.Mutex
	flushes  int
	writes   int
	slowest  time.Duration // the longest single Write or Flush
	slowFrom time.Time     // when it started
	failures int
}

func (c *countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

func (c *countingWriter) record(start time.Time, err error) {
	d := time.Since(start)
	c.mu.Lock()
	if d > c.slowest {
		c.slowest, c.slowFrom = d, start
	}
	if err != nil {
		c.failures++
	}
	c.mu.Unlock()
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.writes++ // before writing, for the same reason as in FlushError
	c.mu.Unlock()
	start := time.Now()
	n, err := c.ResponseWriter.Write(p)
	c.record(start, err)
	return n, err
}

func (c *countingWriter) FlushError() error {
	// Count before flushing: the client can read the flushed bytes, and the
	// test looks at the count, before Flush returns here.
	c.mu.Lock()
	c.flushes++
	c.mu.Unlock()
	start := time.Now()
	err := http.NewResponseController(c.ResponseWriter).Flush()
	c.record(start, err)
	return err
}

func (c *countingWriter) Flush() { _ = c.FlushError() }

func (c *countingWriter) counts() (writes, flushes, failures int, slowest time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes, c.flushes, c.failures, c.slowest
}

// slowestSpan returns when the longest Write or Flush started and ended.
func (c *countingWriter) slowestSpan() (from, to time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.slowFrom, c.slowFrom.Add(c.slowest)
}

// countingMiddleware wraps every request's writer and hands the wrappers to
// the test.
type countingMiddleware struct {
	mu   sync.Mutex
	last *countingWriter
}

func (m *countingMiddleware) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cw := &countingWriter{ResponseWriter: w}
		m.mu.Lock()
		m.last = cw
		m.mu.Unlock()
		next.ServeHTTP(cw, r)
	})
}

func (m *countingMiddleware) writer() *countingWriter {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.last
}

// serveMem runs h.ServeHTTP on w in a goroutine with a cancellable request.
func serveMem(h *Handler, w http.ResponseWriter, target string, hdr http.Header) (cancel func(), done <-chan struct{}) {
	ctx, cancelCtx := context.WithCancel(context.Background())
	req := httptest.NewRequest(http.MethodGet, target, nil).WithContext(ctx)
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		h.ServeHTTP(w, req)
	}()
	return cancelCtx, ch
}

func busHandler(b *EventBus, logs *logCapture) *Handler {
	return &Handler{
		Lookup:      func(*http.Request) (*EventBus, error) { return b, nil },
		Logger:      logs.logger(),
		RetryJitter: testJitter(0),
	}
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		require.FailNow(t, what)
	}
}

// gateFirstFlush makes the handler's first flush (the "retry:" line, which
// comes after Subscribe) wait until the returned release is called; reached
// is closed when the handler is waiting there.
func gateFirstFlush(w *memWriter) (reached <-chan struct{}, release func()) {
	r, g := make(chan struct{}), make(chan struct{})
	w.beforeFlush = func(n int) {
		if n == 1 {
			close(r)
			<-g
		}
	}
	var once sync.Once
	return r, func() { once.Do(func() { close(g) }) }
}

func parseBody(t *testing.T, body string) []sseRecord {
	t.Helper()
	recs, err := parseSSE([]byte(body))
	require.NoError(t, err, "the body must end on an event boundary: %q", body[max(0, len(body)-256):])
	return recs
}

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// ---------------------------------------------------------------------------
// Request rules: maxQueued, 404, 429, order, methods, flushing.

func TestHandlerMaxQueuedRejected(t *testing.T) {
	e := newEnv(t, envOptions{})
	b := e.bus(t, "s", Options{})
	for _, tc := range []struct{ name, query string }{
		{"not decimal", "maxQueued=abc"},
		{"plus sign", "maxQueued=%2B16"},
		{"plus decodes to a space", "maxQueued=+16"},
		{"leading space", "maxQueued=%2016"},
		{"trailing space", "maxQueued=16%20"},
		{"negative", "maxQueued=-1"},
		{"empty", "maxQueued="},
		{"no value", "maxQueued"},
		{"repeated", "maxQueued=16&maxQueued=16"},
		{"repeated with different values", "maxQueued=16&maxQueued=32"},
		{"below minimum", "maxQueued=15"},
		{"zero", "maxQueued=0"},
		{"above maximum", "maxQueued=2049"},
		{"overflows uint64", "maxQueued=99999999999999999999"},
		{"hex", "maxQueued=0x10"},
		{"exponent", "maxQueued=1e3"},
		{"decimal point", "maxQueued=16.0"},
		{"fullwidth digits", "maxQueued=%EF%BC%91%EF%BC%96"},
		{"NUL", "maxQueued=16%00"},
		{"malformed escape", "maxQueued=%zz"},
		{"repeated, one malformed", "maxQueued=16&maxQueued=%zz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := e.do(t, http.MethodGet, "/session/s/events?"+tc.query, nil)
			m := requireHTTPError(t, resp, http.StatusBadRequest, "invalid_max_queued")
			require.Len(t, m, 2, "only error and code: %v", m)
			require.Zero(t, b.SubscriberCount())
		})
	}
	require.Zero(t, b.Stats().PeakSubscribers, "a rejected request never subscribes")
}

func TestHandlerMaxQueuedAccepted(t *testing.T) {
	t.Run("over HTTP", func(t *testing.T) {
		e := newEnv(t, envOptions{})
		b := e.bus(t, "s", Options{})
		for _, q := range []string{"16", "2048", "0016", "002048"} {
			c := e.stream(t, "/session/s/events?maxQueued="+q, nil)
			_ = c.resp.Body.Close()
		}
		require.Eventually(t, func() bool { return b.SubscriberCount() == 0 }, 5*time.Second, time.Millisecond)
	})

	// The value reaches the subscription: its slow_client_warning fires at
	// 0.75 of it and reports it.
	for _, tc := range []struct {
		name    string
		query   string
		busMax  int
		applied int
	}{
		{"16", "?maxQueued=16", 0, 16},
		{"2048", "?maxQueued=2048", 0, 2048},
		{"leading zeros", "?maxQueued=0016", 0, 16},
		{"absent means the bus default", "", 0, DefaultMaxQueued},
		{"absent means the bus option", "", 100, 100},
	} {
		t.Run("applied "+tc.name, func(t *testing.T) {
			logs := &logCapture{}
			b := newBus(t, logs.capture(Options{MaxQueued: tc.busMax}))
			w := newMemWriter()
			reached, release := gateFirstFlush(w)
			defer release()
			cancel, done := serveMem(busHandler(b, logs), w, "/session/s/events"+tc.query, nil)
			defer func() { cancel(); waitClosed(t, done, "handler did not return") }()
			waitClosed(t, reached, "handler did not reach its first flush")

			warnAt := tc.applied * 3 / 4
			fs := publishN(t, b, warnAt)
			queued := 0
			for _, f := range fs {
				queued += f.Size()
			}
			release()
			want := wantSynth(TypeSlowClientWarning, fmt.Sprintf(
				`{"queueSize":%d,"maxQueued":%d,"lastEventId":%d,"queuedBytes":%d,"maxQueuedBytes":%d,"threshold":"frames"}`,
				warnAt, tc.applied, warnAt, queued, DefaultMaxQueuedBytes), strconv.Itoa(warnAt))
			require.Eventually(t, func() bool { return strings.Contains(w.state().body, "event: slow_client_warning") },
				5*time.Second, time.Millisecond)
			recs := parseBody(t, w.state().body)
			require.Len(t, recs, warnAt+2)
			require.Equal(t, sseRecord{Kind: sseRetryRecord, Retry: 3000}, recs[0])
			for i := 1; i <= warnAt; i++ {
				require.Equal(t, wantEvent(uint64(i)), recs[i].Event)
			}
			require.Equal(t, want, recs[warnAt+1].Event)
		})
	}
}

func TestHandlerSessionNotFound(t *testing.T) {
	e := newEnv(t, envOptions{})
	resp := e.do(t, http.MethodGet, "/session/nope/events", nil)
	m := requireHTTPError(t, resp, http.StatusNotFound, "session_not_found")
	require.Len(t, m, 2)

	t.Run("nil bus", func(t *testing.T) {
		h := &Handler{Lookup: func(*http.Request) (*EventBus, error) { return nil, nil }, Logger: (&logCapture{}).logger()}
		w := newMemWriter()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/session/x/events", nil))
		st := w.state()
		requireJSONError(t, st.status, st.header, []byte(st.body), http.StatusNotFound, "session_not_found")
	})
	t.Run("zero Handler", func(t *testing.T) {
		w := newMemWriter()
		(&Handler{}).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/session/x/events", nil))
		st := w.state()
		requireJSONError(t, st.status, st.header, []byte(st.body), http.StatusNotFound, "session_not_found")
	})
	t.Run("other lookup error is 500", func(t *testing.T) {
		logs := &logCapture{}
		h := &Handler{Lookup: func(*http.Request) (*EventBus, error) { return nil, errors.New("store down") }, Logger: logs.logger()}
		w := newMemWriter()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/session/x/events", nil))
		st := w.state()
		requireJSONError(t, st.status, st.header, []byte(st.body), http.StatusInternalServerError, "internal")
		require.NotContains(t, st.body, "store down", "internal errors are logged, not sent")
		require.Len(t, logs.find("lookup failed"), 1)
	})
}

func TestHandlerSubscriberLimit(t *testing.T) {
	e := newEnv(t, envOptions{})
	b := e.bus(t, "s", Options{MaxSubscribers: 2})
	first := e.stream(t, "/session/s/events", nil)
	e.stream(t, "/session/s/events", nil)
	require.Equal(t, 2, b.SubscriberCount())

	resp := e.do(t, http.MethodGet, "/session/s/events", nil)
	require.Equal(t, "5", resp.Header.Get("Retry-After"))
	m := requireHTTPError(t, resp, http.StatusTooManyRequests, "subscriber_limit_exceeded")
	require.Len(t, m, 3, "error, code and limit: %v", m)
	require.Equal(t, json.Number("2"), m["limit"])
	require.Equal(t, 2, b.SubscriberCount())

	// A slot frees when a client leaves.
	_ = first.resp.Body.Close()
	require.Eventually(t, func() bool { return b.SubscriberCount() == 1 }, 5*time.Second, time.Millisecond)
	e.stream(t, "/session/s/events", nil)
	require.Equal(t, 2, b.SubscriberCount())
}

func TestHandlerCheckOrder(t *testing.T) {
	logs := &logCapture{}
	full := newBus(t, logs.capture(Options{MaxSubscribers: 1}))
	_, err := full.Subscribe(t.Context(), SubscribeOptions{})
	require.NoError(t, err)
	lookup := func(r *http.Request) (*EventBus, error) {
		if r.PathValue("id") == "full" {
			return full, nil
		}
		return nil, ErrSessionNotFound
	}
	h := &Handler{Lookup: lookup, Logger: logs.logger()}
	mux := http.NewServeMux()
	mux.Handle("/session/{id}/events", h)
	run := func(w http.ResponseWriter, target string, header http.Header) {
		req := httptest.NewRequest(http.MethodGet, target, nil)
		for k, vs := range header {
			req.Header[k] = vs
		}
		mux.ServeHTTP(w, req)
	}
	for _, tc := range []struct {
		name     string
		target   string
		header   http.Header
		noFlush  bool
		status   int
		wantCode string
	}{
		{"flushing before maxQueued", "/session/full/events?maxQueued=abc", nil, true, 500, "streaming_unsupported"},
		{"flushing before not found", "/session/nope/events", nil, true, 500, "streaming_unsupported"},
		{"maxQueued before not found", "/session/nope/events?maxQueued=1", nil, false, 400, "invalid_max_queued"},
		{"maxQueued before the limit", "/session/full/events?maxQueued=1", nil, false, 400, "invalid_max_queued"},
		{"a bad Last-Event-ID is never an error: not found", "/session/nope/events", hdr("Last-Event-ID", "abc"), false, 404, "session_not_found"},
		{"a bad Last-Event-ID is never an error: limit", "/session/full/events", hdr("Last-Event-ID", "-1"), false, 429, "subscriber_limit_exceeded"},
		{"not found before the limit", "/session/nope/events", nil, false, 404, "session_not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mw := newMemWriter()
			var w http.ResponseWriter = mw
			if tc.noFlush {
				w = noFlushWriter{mw}
			}
			run(w, tc.target, tc.header)
			st := mw.state()
			requireJSONError(t, st.status, st.header, []byte(st.body), tc.status, tc.wantCode)
			require.Equal(t, 1, full.SubscriberCount())
		})
	}
}

func TestHandlerCannotFlush(t *testing.T) {
	logs := &logCapture{}
	b := newBus(t, logs.capture(Options{}))
	mw := newMemWriter()
	busHandler(b, logs).ServeHTTP(noFlushWriter{mw}, httptest.NewRequest(http.MethodGet, "/session/s/events", nil))
	st := mw.state()
	requireJSONError(t, st.status, st.header, []byte(st.body), http.StatusInternalServerError, "streaming_unsupported")
	require.Zero(t, b.SubscriberCount())
	require.Zero(t, b.Stats().PeakSubscribers, "500 before subscribing")
	require.Zero(t, mw.state().flushes)
}

func TestHandlerFlushThroughUnwrap(t *testing.T) {
	logs := &logCapture{}
	b := newBus(t, logs.capture(Options{}))
	mw := newMemWriter()
	cancel, done := serveMem(busHandler(b, logs), unwrapOnlyWriter{mw}, "/session/s/events", nil)
	require.Eventually(t, func() bool { return mw.state().flushes == 1 }, 5*time.Second, time.Millisecond)
	publishN(t, b, 1)
	require.Eventually(t, func() bool { return mw.state().flushes == 2 }, 5*time.Second, time.Millisecond)
	cancel()
	waitClosed(t, done, "handler did not return")
	st := mw.state()
	require.Equal(t, http.StatusOK, st.status)
	recs := parseBody(t, st.body)
	require.Equal(t, []sseRecord{{Kind: sseRetryRecord, Retry: 3000}, {Kind: sseEventRecord, Event: wantEvent(1)}}, recs)
	require.Zero(t, b.SubscriberCount())
}

func TestHandlerMethods(t *testing.T) {
	t.Run("HEAD through the GET route", func(t *testing.T) {
		e := newEnv(t, envOptions{})
		b := e.bus(t, "s", Options{})
		resp := e.do(t, http.MethodHead, "/session/s/events", nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
		require.Equal(t, b.Epoch(), resp.Header.Get("Event-Epoch"))
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Empty(t, body)
		require.Zero(t, b.Stats().PeakSubscribers, "a HEAD never subscribes")

		resp = e.do(t, http.MethodHead, "/session/nope/events", nil)
		require.Equal(t, http.StatusNotFound, resp.StatusCode)
		require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	})
	t.Run("POST through the GET route", func(t *testing.T) {
		e := newEnv(t, envOptions{})
		b := e.bus(t, "s", Options{})
		resp := e.do(t, http.MethodPost, "/session/s/events", nil)
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
		require.Zero(t, b.Stats().PeakSubscribers)
	})
	t.Run("the handler itself", func(t *testing.T) {
		e := newEnv(t, envOptions{anyMethod: true})
		b := e.bus(t, "s", Options{})
		for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodOptions} {
			resp := e.do(t, m, "/session/s/events", nil)
			require.Equal(t, "GET, HEAD", resp.Header.Get("Allow"), m)
			requireHTTPError(t, resp, http.StatusMethodNotAllowed, "method_not_allowed")
		}
		require.Zero(t, b.Stats().PeakSubscribers)
		c := e.stream(t, "/session/s/events", nil)
		publishN(t, b, 1)
		c.expect(wantEvent(1))
	})
}

// ---------------------------------------------------------------------------
// Response headers and the first bytes.

func TestHandlerResponseHeaders(t *testing.T) {
	check := func(t *testing.T, resp *http.Response, b *EventBus) {
		t.Helper()
		h := resp.Header
		require.Equal(t, []string{"text/event-stream"}, h.Values("Content-Type"))
		require.Equal(t, []string{"no-cache, no-transform"}, h.Values("Cache-Control"))
		require.Equal(t, []string{"no"}, h.Values("X-Accel-Buffering"))
		require.Equal(t, []string{b.Epoch()}, h.Values("Event-Epoch"))
		require.Regexp(t, regexp.MustCompile(`^[0-9a-f]{32}$`), h.Get("Event-Epoch"))
		require.Equal(t, []string{"Event-Epoch"}, h.Values("Access-Control-Expose-Headers"))
		require.Empty(t, h.Values("Content-Length"))
		require.Equal(t, int64(-1), resp.ContentLength)
	}

	t.Run("HTTP/1.1", func(t *testing.T) {
		e := newEnv(t, envOptions{})
		b := e.bus(t, "s", Options{})
		c := e.stream(t, "/session/s/events", nil)
		require.Equal(t, 1, c.resp.ProtoMinor)
		check(t, c.resp, b)
		require.Equal(t, []string{"keep-alive"}, c.resp.Header.Values("Connection"))
		require.Equal(t, "retry: 3000\n", string(c.raw()), "the retry directive comes first, alone, flushed at once")
	})
	t.Run("HTTP/2", func(t *testing.T) {
		e := newEnv(t, envOptions{http2: true})
		b := e.bus(t, "s", Options{})
		c := e.stream(t, "/session/s/events", nil)
		require.Equal(t, 2, c.resp.ProtoMajor)
		check(t, c.resp, b)
		require.Empty(t, c.resp.Header.Values("Connection"), "no connection-specific header on HTTP/2")
		publishN(t, b, 1)
		c.expect(wantEvent(1))
	})
	t.Run("HTTP/1.0", func(t *testing.T) {
		e := newEnv(t, envOptions{})
		e.bus(t, "s", Options{})
		conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
		require.NoError(t, err)
		defer conn.Close()
		require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
		_, err = io.WriteString(conn, "GET /session/s/events HTTP/1.0\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.NotEqual(t, "keep-alive", resp.Header.Get("Connection"), "keep-alive is for HTTP/1.1 only")
		buf := make([]byte, len("retry: 3000\n"))
		_, err = io.ReadFull(resp.Body, buf)
		require.NoError(t, err)
		require.Equal(t, "retry: 3000\n", string(buf))
	})
}

func TestHandlerRetryDirective(t *testing.T) {
	for _, tc := range []struct {
		retry time.Duration
		want  int64
	}{
		{0, 3000},
		{1500 * time.Millisecond, 1500},
		{time.Minute, 60000},
	} {
		t.Run(tc.retry.String(), func(t *testing.T) {
			e := newEnv(t, envOptions{handler: &Handler{Retry: tc.retry}})
			e.bus(t, "s", Options{})
			c := e.open(t, "/session/s/events", nil)
			require.Equal(t, sseRecord{Kind: sseRetryRecord, Retry: tc.want}, c.next())
			require.Equal(t, fmt.Sprintf("retry: %d\n", tc.want), string(c.raw()))
		})
	}
}

// ---------------------------------------------------------------------------
// Heartbeat and write deadlines, on the fake clock of a synctest bubble with
// in-memory writers (the real network is not durably blocking).

func TestHandlerHeartbeat(t *testing.T) {
	for _, tc := range []struct {
		name  string
		every time.Duration
	}{
		{"default", 0},
		{"custom", 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				every := orDefault(tc.every, DefaultHeartbeat)
				logs := &logCapture{}
				b := newBus(t, logs.capture(Options{}))
				h := busHandler(b, logs)
				h.Heartbeat = tc.every
				w := newMemWriter() // no SetWriteDeadline: ErrNotSupported is fine
				cancel, done := serveMem(h, w, "/session/s/events", nil)
				synctest.Wait()
				require.Equal(t, "retry: 3000\n", w.state().body)
				require.Equal(t, 1, w.state().flushes)

				// A heartbeat is a ":" line, or the retry: line again when
				// the stream has had an event since its last one.
				beats := func() int {
					n := -1 // the retry: line that opens the stream
					for line := range strings.SplitSeq(w.state().body, "\n") {
						if line == ":" || line == "retry: 3000" {
							n++
						}
					}
					return n
				}
				time.Sleep(every - time.Nanosecond)
				synctest.Wait()
				require.Equal(t, 0, beats(), "no heartbeat before the idle time")
				time.Sleep(time.Nanosecond)
				synctest.Wait()
				require.Equal(t, 1, beats())
				require.Equal(t, "retry: 3000\n:\n", w.state().body, "the retry: line already gave the tail a field")
				require.Equal(t, 2, w.state().flushes, "a heartbeat is flushed")

				// A write postpones the next heartbeat to a full idle time after it.
				time.Sleep(every / 2)
				publishN(t, b, 1)
				synctest.Wait()
				require.Equal(t, 3, w.state().flushes)
				time.Sleep(every - time.Nanosecond)
				synctest.Wait()
				require.Equal(t, 1, beats())
				time.Sleep(time.Nanosecond)
				synctest.Wait()
				require.Equal(t, 2, beats())
				require.True(t, strings.HasSuffix(w.state().body, "\n\nretry: 3000\n"), "the first heartbeat after an event is the retry: line")

				// And it keeps beating while idle.
				time.Sleep(3 * every)
				synctest.Wait()
				require.Equal(t, 5, beats())

				cancel()
				<-done
				recs := parseBody(t, w.state().body)
				comment := sseRecord{Kind: sseCommentRecord, Comment: ""}
				retry := sseRecord{Kind: sseRetryRecord, Retry: 3000}
				require.Equal(t, []sseRecord{
					retry, comment,
					{Kind: sseEventRecord, Event: wantEvent(1)}, retry, comment, comment, comment,
				}, recs, "a heartbeat is a comment: it never goes through the queue or dispatches an event")
				require.Zero(t, b.SubscriberCount())
			})
		})
	}
}

func TestHandlerWriteDeadline(t *testing.T) {
	t.Run("every write has a deadline, cleared after its flush", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			logs := &logCapture{}
			b := newBus(t, logs.capture(Options{}))
			w := newDeadlineWriter(0)
			start := time.Now()
			cancel, done := serveMem(busHandler(b, logs), w, "/session/s/events", nil)
			synctest.Wait()
			time.Sleep(5 * time.Second)
			publishN(t, b, 1) // a batch at 5s
			synctest.Wait()
			time.Sleep(DefaultHeartbeat) // a heartbeat at 20s
			synctest.Wait()
			cancel()
			<-done
			at := func(d time.Duration) time.Time { return start.Add(d) }
			require.Equal(t, []deadlineSet{
				{at(0), at(DefaultWriteTimeout)},                                 // retry:
				{at(0), time.Time{}},                                             // cleared
				{at(5 * time.Second), at(5*time.Second + DefaultWriteTimeout)},   // the batch
				{at(5 * time.Second), time.Time{}},                               // cleared
				{at(20 * time.Second), at(20*time.Second + DefaultWriteTimeout)}, // the heartbeat
				{at(20 * time.Second), time.Time{}},                              // cleared
			}, w.deadlineSets())
			require.Equal(t, 3, w.state().writes)
		})
	})

	for _, tc := range []struct {
		name      string
		timeout   time.Duration
		blockFrom int                         // the write that blocks
		trigger   func(*testing.T, *EventBus) // makes that write happen
		at        time.Duration               // when the write starts
	}{
		{"retry line blocks", 0, 1, func(*testing.T, *EventBus) {}, 0},
		{"batch blocks", 2 * time.Second, 2, func(t *testing.T, b *EventBus) {
			time.Sleep(5 * time.Second)
			publishN(t, b, 3)
		}, 5 * time.Second},
		{"heartbeat blocks", time.Second, 2, func(*testing.T, *EventBus) {}, DefaultHeartbeat},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				timeout := orDefault(tc.timeout, DefaultWriteTimeout)
				logs := &logCapture{}
				b := newBus(t, logs.capture(Options{}))
				h := busHandler(b, logs)
				h.WriteTimeout = tc.timeout
				w := newDeadlineWriter(tc.blockFrom)
				start := time.Now()
				_, done := serveMem(h, w, "/session/s/events", nil)
				synctest.Wait()
				require.Equal(t, 1, b.SubscriberCount())
				tc.trigger(t, b)
				synctest.Wait()

				time.Sleep(tc.at + timeout - time.Since(start) - time.Nanosecond)
				synctest.Wait()
				require.Equal(t, 1, b.SubscriberCount(), "still blocked just before the deadline")
				select {
				case <-done:
					require.FailNow(t, "handler returned before the deadline")
				default:
				}
				time.Sleep(time.Nanosecond)
				synctest.Wait()
				select {
				case <-done:
				default:
					require.FailNow(t, "handler still running at the deadline")
				}
				require.Equal(t, tc.at+timeout, time.Since(start))
				require.Zero(t, b.SubscriberCount(), "a blocked write cancels the subscription at once")

				st := w.state()
				if tc.blockFrom == 1 {
					require.Empty(t, st.body)
				} else {
					require.Equal(t, "retry: 3000\n", st.body, "no frame after a failed write")
				}
				require.Len(t, logs.kind(DiagWriteFailed), 1)
				require.Equal(t, uint64(3*boolInt(tc.name == "batch blocks")), b.Stats().Dropped.Blocked,
					"the frames of the failed batch count as dropped, reason blocked")
				require.Zero(t, b.Stats().Dropped.Cancelled)

				// The bus is unharmed.
				publishN(t, b, 1)
			})
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ---------------------------------------------------------------------------
// Resuming: Last-Event-ID, lastEventId, epochs, and the resync frames.

func TestHandlerResume(t *testing.T) {
	e := newEnv(t, envOptions{})
	setup := func(t *testing.T) (string, *EventBus) { return e.sessionWithEvents(t, 5) }
	rc := func(b *EventBus, count int, last uint64) sseEvent {
		lastID := ""
		if count > 0 {
			lastID = strconv.FormatUint(last, 10)
		}
		return wantReplayComplete(b, count, last, lastID)
	}
	events := func(from, to uint64) []sseEvent {
		var evs []sseEvent
		for i := from; i <= to; i++ {
			evs = append(evs, wantEvent(i))
		}
		return evs
	}
	for _, tc := range []struct {
		name   string
		query  string
		header http.Header
		want   func(b *EventBus) []sseEvent
	}{
		{"header", "", hdr("Last-Event-ID", "3"), func(b *EventBus) []sseEvent {
			return append(events(4, 5), rc(b, 2, 5))
		}},
		{"query when the header is absent", "?lastEventId=2", nil, func(b *EventBus) []sseEvent {
			return append(events(3, 5), rc(b, 3, 5))
		}},
		{"query when the header is empty", "?lastEventId=2", hdr("Last-Event-ID", ""), func(b *EventBus) []sseEvent {
			return append(events(3, 5), rc(b, 3, 5))
		}},
		{"header wins over query", "?lastEventId=1", hdr("Last-Event-ID", "4"), func(b *EventBus) []sseEvent {
			return append(events(5, 5), rc(b, 1, 5))
		}},
		{"repeated header: the first counts", "", hdr("Last-Event-ID", "4", "Last-Event-ID", "1"), func(b *EventBus) []sseEvent {
			return append(events(5, 5), rc(b, 1, 5))
		}},
		{"repeated query: the first counts", "?lastEventId=4&lastEventId=1", nil, func(b *EventBus) []sseEvent {
			return append(events(5, 5), rc(b, 1, 5))
		}},
		{"zero means from the start", "", hdr("Last-Event-ID", "0"), func(b *EventBus) []sseEvent {
			return append(events(1, 5), rc(b, 5, 5))
		}},
		{"leading zeros", "", hdr("Last-Event-ID", "0003"), func(b *EventBus) []sseEvent {
			return append(events(4, 5), rc(b, 2, 5))
		}},
		{"up to date", "", hdr("Last-Event-ID", "5"), func(b *EventBus) []sseEvent {
			return []sseEvent{rc(b, 0, 0)}
		}},
		{"the largest id a client may send", "", hdr("Last-Event-ID", "9007199254740991"), func(b *EventBus) []sseEvent {
			resync := wantSynth(TypeStateResyncRequired,
				`{"reason":"epoch_reset","lastDeliveredId":9007199254740991,"earliestAvailableId":1,"epoch":"`+b.Epoch()+`"}`, "")
			return append(append([]sseEvent{resync}, events(1, 5)...), rc(b, 5, 5))
		}},
		{"matching epoch", "", hdr("Last-Event-ID", "4", "Event-Epoch", "<epoch>"), func(b *EventBus) []sseEvent {
			return append(events(5, 5), rc(b, 1, 5))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, b := setup(t)
			for _, vs := range tc.header {
				for i, v := range vs {
					if v == "<epoch>" {
						vs[i] = b.Epoch()
					}
				}
			}
			c := e.stream(t, path+tc.query, tc.header)
			c.expect(tc.want(b)...)
			// Then live, with nothing in between.
			publishN(t, b, 1)
			c.expect(wantEvent(6))
		})
	}
}

func TestHandlerMalformedLastEventID(t *testing.T) {
	e := newEnv(t, envOptions{maxHeaderBytes: 16 << 20})
	huge := strings.Repeat("9", 10<<20)               // 10 MB of digits: overflows early
	hugeJunk := strings.Repeat("\u00e9x", (10<<20)/3) // 10 MB, cut inside a rune at 64 bytes
	values := []string{
		"abc", "-1", "+1", "1.0", " 1", "1 ", "0x1", "1e3", "1_000",
		"9007199254740992",     // 2^53
		"18446744073709551615", // 2^64-1
		"18446744073709551616", // 2^64
		"\u0661",               // ARABIC-INDIC DIGIT ONE
		"1\x00", "\t1",
		strings.Repeat("7", 65), // digits, too long, longer than the quote
	}
	n := 0
	check := func(t *testing.T, raw, query string, header http.Header) {
		n++
		id := "s" + strconv.Itoa(n)
		b := e.bus(t, id, Options{})
		publishN(t, b, 3)
		before := len(e.logs.find("malformed Last-Event-ID"))
		c := e.stream(t, "/session/"+id+"/events"+query, header)
		// Live only: no replay, no resync, no replay_complete.
		publishN(t, b, 1)
		c.expect(wantEvent(4))
		logs := e.logs.find("malformed Last-Event-ID")
		require.Len(t, logs, before+1, "one diagnostic")
		requireQuotedPrefix(t, raw, logs[len(logs)-1].Attrs["value"])
	}
	for _, raw := range values {
		name := strconv.Quote(raw[:min(len(raw), 12)])
		t.Run("query "+name, func(t *testing.T) {
			check(t, raw, "?lastEventId="+url.QueryEscape(raw), nil)
		})
		if strings.TrimSpace(raw) == raw && !strings.ContainsAny(raw, "\x00") {
			// A server trims header values, so spaces are tested via the
			// query and in memory only.
			t.Run("header "+name, func(t *testing.T) {
				check(t, raw, "", hdr("Last-Event-ID", raw))
			})
			t.Run("header wins over a valid query "+name, func(t *testing.T) {
				check(t, raw, "?lastEventId=1", hdr("Last-Event-ID", raw))
			})
		}
	}
	t.Run("10 MB header", func(t *testing.T) {
		check(t, huge, "", hdr("Last-Event-ID", huge))
	})

	// In memory: values a server would trim, and the other 10 MB cases
	// without the cost of parsing them as HTTP.
	for _, tc := range []struct {
		name          string
		header, query string
	}{
		{"leading space", " 1", ""},
		{"trailing space", "1 ", ""},
		{"tab", "\t1", ""},
		{"NUL", "1\x00", ""},
		{"10 MB non-digits header", hugeJunk, ""},
		{"10 MB digits query", "", huge},
		{"10 MB non-digits query", "", strings.Repeat("x", 10<<20)},
	} {
		t.Run("in memory "+tc.name, func(t *testing.T) {
			logs := &logCapture{}
			b := newBus(t, logs.capture(Options{}))
			publishN(t, b, 3)
			w := newMemWriter()
			target, raw := "/session/s/events", tc.header
			var header http.Header
			if tc.header != "" {
				header = hdr("Last-Event-ID", tc.header)
			} else {
				target, raw = target+"?lastEventId="+url.QueryEscape(tc.query), tc.query
			}
			cancel, done := serveMem(busHandler(b, logs), w, target, header)
			require.Eventually(t, func() bool { return b.SubscriberCount() == 1 && w.state().flushes == 1 }, 5*time.Second, time.Millisecond)
			publishN(t, b, 1)
			require.Eventually(t, func() bool { return w.state().flushes == 2 }, 5*time.Second, time.Millisecond)
			cancel()
			waitClosed(t, done, "handler did not return")
			st := w.state()
			require.Equal(t, http.StatusOK, st.status)
			require.Equal(t, []sseRecord{{Kind: sseRetryRecord, Retry: 3000}, {Kind: sseEventRecord, Event: wantEvent(4)}},
				parseBody(t, st.body))
			found := logs.find("malformed Last-Event-ID")
			require.Len(t, found, 1)
			requireQuotedPrefix(t, raw, found[0].Attrs["value"])
		})
	}
	t.Run("missing or empty is not logged", func(t *testing.T) {
		before := len(e.logs.find("malformed"))
		e.bus(t, "quiet", Options{})
		e.stream(t, "/session/quiet/events", nil)
		e.stream(t, "/session/quiet/events", hdr("Last-Event-ID", ""))
		e.stream(t, "/session/quiet/events?lastEventId=", nil)
		require.Len(t, e.logs.find("malformed"), before)
	})
}

// requireQuotedPrefix checks a logged value: a Go-quoted string of the
// first min(len(raw), 64) bytes of raw.
func requireQuotedPrefix(t *testing.T, raw, quoted string) {
	t.Helper()
	v, err := strconv.Unquote(quoted)
	require.NoError(t, err, "the value is quoted: %s", quoted)
	require.Equal(t, raw[:min(len(raw), 64)], v, "at most 64 bytes of the value")
}

func TestHandlerResyncReasons(t *testing.T) {
	e := newEnv(t, envOptions{})
	const otherEpoch = "0123456789abcdef0123456789abcdef"
	n := 0
	// ring: RingSize 3 after 10 events holds 8, 9, 10; nextID is 11.
	ringBus := func(t *testing.T, opts Options) (string, *EventBus) {
		n++
		id := "s" + strconv.Itoa(n)
		if opts.RingSize == 0 {
			opts.RingSize = 3
		}
		b := e.bus(t, id, opts)
		publishN(t, b, 10)
		return "/session/" + id + "/events", b
	}
	resync := func(b *EventBus, fields, lastID string) sseEvent {
		return wantSynth(TypeStateResyncRequired, "{"+fields+`,"epoch":"`+b.Epoch()+`"}`, lastID)
	}
	complete := func(b *EventBus, count int, last uint64) sseEvent {
		return wantSynth(TypeReplayComplete, fmt.Sprintf(`{"replayedCount":%d,"lastReplayedEventId":%d,"lastEventId":%d,"epoch":"%s"}`,
			count, last, last, b.Epoch()), strconv.FormatUint(last, 10))
	}
	for _, tc := range []struct {
		name   string
		opts   Options
		query  string
		header http.Header
		want   func(b *EventBus) []sseEvent
	}{
		{"ring_evicted", Options{}, "", hdr("Last-Event-ID", "2"), func(b *EventBus) []sseEvent {
			return []sseEvent{
				resync(b, `"reason":"ring_evicted","lastDeliveredId":2,"earliestAvailableId":8`, ""),
				wantEvent(8), wantEvent(9), wantEvent(10), complete(b, 3, 10),
			}
		}},
		{"no resync right before the ring", Options{}, "", hdr("Last-Event-ID", "7"), func(b *EventBus) []sseEvent {
			return []sseEvent{wantEvent(8), wantEvent(9), wantEvent(10), complete(b, 3, 10)}
		}},
		{"epoch_reset by cursor", Options{}, "", hdr("Last-Event-ID", "50"), func(b *EventBus) []sseEvent {
			return []sseEvent{
				resync(b, `"reason":"epoch_reset","lastDeliveredId":50,"earliestAvailableId":8`, ""),
				wantEvent(8), wantEvent(9), wantEvent(10), complete(b, 3, 10),
			}
		}},
		{"epoch_reset at nextID", Options{}, "", hdr("Last-Event-ID", "11"), func(b *EventBus) []sseEvent {
			return []sseEvent{
				resync(b, `"reason":"epoch_reset","lastDeliveredId":11,"earliestAvailableId":8`, ""),
				wantEvent(8), wantEvent(9), wantEvent(10), complete(b, 3, 10),
			}
		}},
		{"epoch_mismatch via Event-Epoch", Options{}, "", hdr("Last-Event-ID", "9", "Event-Epoch", otherEpoch), func(b *EventBus) []sseEvent {
			return []sseEvent{
				resync(b, `"reason":"epoch_reset","detail":"epoch_mismatch","lastDeliveredId":9,"earliestAvailableId":8`, ""),
				wantEvent(8), wantEvent(9), wantEvent(10), complete(b, 3, 10),
			}
		}},
		{"epoch_mismatch via ?epoch=", Options{}, "?epoch=" + otherEpoch, hdr("Last-Event-ID", "9"), func(b *EventBus) []sseEvent {
			return []sseEvent{
				resync(b, `"reason":"epoch_reset","detail":"epoch_mismatch","lastDeliveredId":9,"earliestAvailableId":8`, ""),
				wantEvent(8), wantEvent(9), wantEvent(10), complete(b, 3, 10),
			}
		}},
		{"epoch_mismatch with ?lastEventId and ?epoch", Options{}, "?lastEventId=9&epoch=" + otherEpoch, nil, func(b *EventBus) []sseEvent {
			return []sseEvent{
				resync(b, `"reason":"epoch_reset","detail":"epoch_mismatch","lastDeliveredId":9,"earliestAvailableId":8`, ""),
				wantEvent(8), wantEvent(9), wantEvent(10), complete(b, 3, 10),
			}
		}},
		{"Event-Epoch header wins over ?epoch=", Options{}, "?epoch=" + otherEpoch, hdr("Last-Event-ID", "9", "Event-Epoch", "<epoch>"), func(b *EventBus) []sseEvent {
			return []sseEvent{wantEvent(10), complete(b, 1, 10)}
		}},
		{"an epoch over 64 bytes is ignored", Options{}, "?epoch=" + strings.Repeat("a", 65), hdr("Last-Event-ID", "9"), func(b *EventBus) []sseEvent {
			return []sseEvent{wantEvent(10), complete(b, 1, 10)}
		}},
		{"replay_budget_exceeded", Options{RingSize: 100, ReplayBudgetBytes: 2 * len(wantEvent(1).Data)}, "", hdr("Last-Event-ID", "0"), func(b *EventBus) []sseEvent {
			return []sseEvent{
				wantEvent(1), wantEvent(2),
				resync(b, `"reason":"replay_budget_exceeded","lastDeliveredId":2,"earliestAvailableId":3`, "2"),
				complete(b, 2, 2),
			}
		}},
		{"ring_evicted then replay_budget_exceeded", Options{RingSize: 5, ReplayBudgetBytes: 2*len(wantEvent(1).Data) + 1}, "", hdr("Last-Event-ID", "1"), func(b *EventBus) []sseEvent {
			return []sseEvent{
				resync(b, `"reason":"ring_evicted","lastDeliveredId":1,"earliestAvailableId":6`, ""),
				wantEvent(6), wantEvent(7),
				resync(b, `"reason":"replay_budget_exceeded","lastDeliveredId":7,"earliestAvailableId":8`, "7"),
				complete(b, 2, 7),
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, b := ringBus(t, tc.opts)
			for _, vs := range tc.header {
				for i, v := range vs {
					if v == "<epoch>" {
						vs[i] = b.Epoch()
					}
				}
			}
			c := e.stream(t, path+tc.query, tc.header)
			c.expect(tc.want(b)...)
			publishN(t, b, 1)
			c.expect(wantEvent(11))
		})
	}
	t.Run("epoch ignored without a last id", func(t *testing.T) {
		path, b := ringBus(t, Options{})
		c := e.stream(t, path, hdr("Event-Epoch", otherEpoch))
		publishN(t, b, 1)
		c.expect(wantEvent(11))
	})
}

// ---------------------------------------------------------------------------
// Ending a stream: disconnect, a reader that never reads, bus Close,
// eviction, unexpected errors.

func TestHandlerClientDisconnect(t *testing.T) {
	e := newEnv(t, envOptions{})
	b := e.bus(t, "s", Options{})
	c := e.stream(t, "/session/s/events", nil)
	publishN(t, b, 3)
	c.expect(wantEvent(1), wantEvent(2), wantEvent(3))
	require.Equal(t, 1, b.SubscriberCount())

	start := time.Now()
	require.NoError(t, c.resp.Body.Close())
	require.Eventually(t, func() bool { return b.SubscriberCount() == 0 }, 5*time.Second, time.Millisecond,
		"a client disconnect cancels the subscription")
	t.Logf("subscription gone %v after the disconnect", time.Since(start))
	require.Zero(t, b.Stats().Dropped.Blocked, "a disconnect is a cancellation, not a blocked writer")
	require.Empty(t, e.logs.kind(DiagWriteFailed))
	publishN(t, b, 1)
}

func TestHandlerSlowReaderDropped(t *testing.T) {
	const writeTimeout = 200 * time.Millisecond
	setup := func(t *testing.T, http2 bool) (*testEnv, *countingMiddleware, *EventBus) {
		mw := &countingMiddleware{}
		e := newEnv(t, envOptions{handler: &Handler{WriteTimeout: writeTimeout}, wrap: mw.wrap, http2: http2})
		// Caps high enough that the queue never evicts: only the write
		// deadline may drop this subscriber.
		b := e.bus(t, "s", Options{MaxQueued: 1 << 20, MaxQueuedBytes: 1 << 30})
		return e, mw, b
	}
	// flood publishes 128 KiB events until the subscriber is gone.
	flood := func(t *testing.T, e *testEnv, mw *countingMiddleware, b *EventBus) {
		require.Equal(t, 1, b.SubscriberCount())
		payload := strings.Repeat("x", 128<<10)
		start := time.Now()
		var slowestPublish time.Duration
		var publishedAt []time.Time
		for b.SubscriberCount() > 0 && time.Since(start) < 20*time.Second {
			t0 := time.Now()
			_, err := b.Publish(Event{Type: "big", Data: payload})
			slowestPublish = max(slowestPublish, time.Since(t0))
			require.NoError(t, err)
			publishedAt = append(publishedAt, time.Now())
			time.Sleep(2 * time.Millisecond)
		}
		published := len(publishedAt)
		gone := time.Since(start)
		require.Zero(t, b.SubscriberCount(), "a client that never reads is dropped")
		_, _, failures, slowest := mw.writer().counts()
		t.Logf("dropped after %v and %d events of 128 KiB; slowest write or flush %v; slowest publish %v",
			gone, published, slowest, slowestPublish)
		// Publish never waits for a blocked writer: publishes completed
		// while the handler sat in its blocked write. (A bound on the
		// slowest publish alone would measure the machine's load.)
		from, to := mw.writer().slowestSpan()
		during := 0
		for _, at := range publishedAt {
			if at.After(from) && at.Before(to) {
				during++
			}
		}
		require.Positive(t, during, "publishes went on during the blocked write")
		require.Less(t, slowestPublish, 5*time.Second)
		require.GreaterOrEqual(t, failures, 1)
		require.Less(t, slowest, writeTimeout+2*time.Second, "no write or flush outlives its deadline by much")
		require.Len(t, e.logs.kind(DiagWriteFailed), 1, "a blocked writer, not a client that left")
		st := b.Stats()
		require.Positive(t, st.Dropped.Blocked)
		require.Zero(t, st.Dropped.Cancelled)
		require.Zero(t, st.Evictions.QueueOverflow+st.Evictions.QueueBytesOverflow, "dropped by the deadline, not evicted")
		_, err := b.Publish(Event{Type: "after"})
		require.NoError(t, err)
	}

	t.Run("HTTP/1.1", func(t *testing.T) {
		e, mw, b := setup(t, false)
		conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
		require.NoError(t, err)
		defer conn.Close()
		require.NoError(t, conn.(*net.TCPConn).SetReadBuffer(4096))
		require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
		_, err = io.WriteString(conn, "GET /session/s/events HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		buf := make([]byte, len("retry: 3000\n"))
		_, err = io.ReadFull(resp.Body, buf)
		require.NoError(t, err)
		// From now on the client never reads.
		flood(t, e, mw, b)
	})
	t.Run("HTTP/2", func(t *testing.T) {
		e, mw, b := setup(t, true)
		resp := e.do(t, http.MethodGet, "/session/s/events", nil)
		require.Equal(t, 2, resp.ProtoMajor)
		// The body is never read: the stream's flow-control window fills.
		flood(t, e, mw, b)
	})
}

func TestHandlerBusCloseEndsStream(t *testing.T) {
	t.Run("over HTTP", func(t *testing.T) {
		e := newEnv(t, envOptions{})
		b := e.bus(t, "s", Options{})
		publishN(t, b, 20)
		c := e.stream(t, "/session/s/events", hdr("Last-Event-ID", "0"))
		publishN(t, b, 5)
		require.NoError(t, b.Close())
		var want []sseRecord
		for i := uint64(1); i <= 20; i++ {
			want = append(want, sseRecord{Kind: sseEventRecord, Event: wantEvent(i)})
		}
		want = append(want, sseRecord{Kind: sseEventRecord, Event: wantSynth(TypeReplayComplete,
			`{"replayedCount":20,"lastReplayedEventId":20,"lastEventId":20,"epoch":"`+b.Epoch()+`"}`, "20")})
		for i := uint64(21); i <= 25; i++ {
			want = append(want, sseRecord{Kind: sseEventRecord, Event: wantEvent(i)})
		}
		require.Equal(t, want, c.rest(), "every buffered frame, then EOF")
		require.Zero(t, b.SubscriberCount())
	})
	t.Run("frames buffered at Close", func(t *testing.T) {
		logs := &logCapture{}
		b := newBus(t, logs.capture(Options{}))
		w := newMemWriter()
		reached, release := gateFirstFlush(w)
		_, done := serveMem(busHandler(b, logs), w, "/session/s/events", nil)
		waitClosed(t, reached, "handler did not reach its first flush")
		publishN(t, b, 50)
		require.NoError(t, b.Close())
		release()
		waitClosed(t, done, "Close must end the stream without a cancellation")
		recs := parseBody(t, w.state().body)
		require.Len(t, recs, 51)
		for i := 1; i <= 50; i++ {
			require.Equal(t, wantEvent(uint64(i)), recs[i].Event)
		}
		require.NotContains(t, w.state().body, TypeStreamError)
	})
	t.Run("subscribing to a closed bus", func(t *testing.T) {
		e := newEnv(t, envOptions{})
		b := e.bus(t, "s", Options{})
		require.NoError(t, b.Close())
		c := e.stream(t, "/session/s/events", nil)
		require.Empty(t, c.rest())
	})
}

func TestHandlerCloseWithErrorWritesOneTerminalFrame(t *testing.T) {
	logs := &logCapture{}
	b := newBus(t, logs.capture(Options{}))
	w := newMemWriter()
	reached, release := gateFirstFlush(w)
	defer release()
	_, done := serveMem(busHandler(b, logs), w, "/session/s/events", nil)
	waitClosed(t, reached, "handler did not reach its first flush")
	publishN(t, b, 2)
	require.NoError(t, b.CloseWithError(ErrorKindUnavailable, "backplane unreachable"))
	release()
	waitClosed(t, done, "the stream ends after its terminal frame")
	recs := parseBody(t, w.state().body)
	require.Equal(t, []sseRecord{
		{Kind: sseRetryRecord, Retry: 3000},
		{Kind: sseEventRecord, Event: wantEvent(1)},
		{Kind: sseEventRecord, Event: wantEvent(2)},
		{Kind: sseEventRecord, Event: wantSynth(TypeStreamError, `{"error":"backplane unreachable","errorKind":"unavailable"}`, "2")},
	}, recs, "exactly one stream_error, after what was queued")
}

func TestHandlerEviction(t *testing.T) {
	logs := &logCapture{}
	b := newBus(t, logs.capture(Options{}))
	w := newMemWriter()
	reached, release := gateFirstFlush(w)
	defer release()
	_, done := serveMem(busHandler(b, logs), w, "/session/s/events?maxQueued=16", nil)
	waitClosed(t, reached, "handler did not reach its first flush")
	fs := publishN(t, b, 17)
	require.Zero(t, b.SubscriberCount(), "the 17th live frame evicts")
	queued, at12 := 0, 0
	for i, f := range fs[:16] {
		queued += f.Size()
		if i == 11 {
			at12 = queued
		}
	}
	release()
	waitClosed(t, done, "an evicted stream ends by itself")
	recs := parseBody(t, w.state().body)
	var want []sseRecord
	want = append(want, sseRecord{Kind: sseRetryRecord, Retry: 3000})
	for i := uint64(1); i <= 16; i++ {
		want = append(want, sseRecord{Kind: sseEventRecord, Event: wantEvent(i)})
		if i == 12 {
			want = append(want, sseRecord{Kind: sseEventRecord, Event: wantSynth(TypeSlowClientWarning, fmt.Sprintf(
				`{"queueSize":12,"maxQueued":16,"lastEventId":12,"queuedBytes":%d,"maxQueuedBytes":%d,"threshold":"frames"}`,
				at12, DefaultMaxQueuedBytes), "12")})
		}
	}
	want = append(want, sseRecord{Kind: sseEventRecord, Event: wantSynth(TypeClientEvicted, fmt.Sprintf(
		`{"reason":"queue_overflow","droppedAfter":17,"queueSize":16,"maxQueued":16,"queuedBytes":%d,"maxQueuedBytes":%d}`,
		queued, DefaultMaxQueuedBytes), "16")})
	require.Equal(t, want, recs, "the terminal frame ends the stream; no stream_error after it")
}

func TestHandlerStreamError(t *testing.T) {
	t.Run("the subscription ends with an unexpected error", func(t *testing.T) {
		logs := &logCapture{}
		b := newBus(t, logs.capture(Options{}))
		w := newMemWriter()
		_, done := serveMem(busHandler(b, logs), w, "/session/s/events", nil)
		require.Eventually(t, func() bool { return w.state().flushes == 1 }, 5*time.Second, time.Millisecond)
		publishN(t, b, 1)
		require.Eventually(t, func() bool { return w.state().flushes == 2 }, 5*time.Second, time.Millisecond)

		// What a failure below the HTTP layer would do: the subscription
		// ends, with drain, for a reason that is neither eviction, Close
		// nor cancellation.
		b.mu.Lock()
		require.Len(t, b.subs, 1)
		sub := b.subs[0]
		b.removeLocked(sub)
		b.mu.Unlock()
		sub.end(errors.New(`history read failed: "boom"`))
		sub.q.close(true)

		waitClosed(t, done, "the stream ends")
		recs := parseBody(t, w.state().body)
		require.Len(t, recs, 3)
		require.Equal(t, wantEvent(1), recs[1].Event)
		last := recs[2].Event
		require.Equal(t, TypeStreamError, last.Type)
		require.Equal(t, "1", last.ID, "stream_error has no id line")
		var env struct {
			V    int             `json:"v"`
			Type string          `json:"type"`
			Data json.RawMessage `json:"data"`
			Meta struct {
				ServerTimestamp int64 `json:"serverTimestamp"`
			} `json:"_meta"`
		}
		dec := json.NewDecoder(strings.NewReader(last.Data))
		dec.DisallowUnknownFields()
		require.NoError(t, dec.Decode(&env))
		require.Equal(t, 1, env.V)
		require.Equal(t, TypeStreamError, env.Type)
		require.JSONEq(t, `{"error":"history read failed: \"boom\"","errorKind":"internal"}`, string(env.Data))
		require.Equal(t, `{"error":"history read failed: \"boom\"","errorKind":"internal"}`, string(env.Data), "field order")
		require.Positive(t, env.Meta.ServerTimestamp)
		require.Zero(t, b.SubscriberCount())
	})

	t.Run("a panic while writing", func(t *testing.T) {
		logs := &logCapture{}
		b := newBus(t, logs.capture(Options{}))
		w := newMemWriter()
		w.beforeWrite = func(n int, p []byte) error {
			if n == 2 {
				panic("writer bug")
			}
			return nil
		}
		_, done := serveMem(busHandler(b, logs), w, "/session/s/events", nil)
		require.Eventually(t, func() bool { return w.state().flushes == 1 }, 5*time.Second, time.Millisecond)
		publishN(t, b, 1)
		waitClosed(t, done, "the stream ends after a panic, without taking the process down")
		recs := parseBody(t, w.state().body)
		require.Len(t, recs, 2)
		require.Equal(t, TypeStreamError, recs[1].Event.Type)
		require.Contains(t, recs[1].Event.Data, `"data":{"error":"internal error","errorKind":"internal"}`)
		require.Len(t, logs.find("panicked"), 1)
		require.Zero(t, b.SubscriberCount())
	})
}

// ---------------------------------------------------------------------------
// Batching.

func TestHandlerBatchOneFlush(t *testing.T) {
	t.Run("live frames ready together", func(t *testing.T) {
		logs := &logCapture{}
		b := newBus(t, logs.capture(Options{}))
		w := newMemWriter()
		reached, release := gateFirstFlush(w)
		defer release()
		cancel, done := serveMem(busHandler(b, logs), w, "/session/s/events", nil)
		defer func() { cancel(); waitClosed(t, done, "handler did not return") }()
		waitClosed(t, reached, "handler did not reach its first flush")
		publishN(t, b, 100) // ready before the handler reads
		release()
		require.Eventually(t, func() bool { return strings.Count(w.state().body, "event: e\n") == 100 },
			5*time.Second, time.Millisecond)
		st := w.state()
		require.Equal(t, 2, st.flushes, "retry, then one flush for the batch of 100")
		require.Equal(t, 2, st.writes, "small frames are copied into one write")
		require.Len(t, parseBody(t, st.body), 101)
	})

	t.Run("replay over HTTP with a wrapping writer", func(t *testing.T) {
		var mw countingMiddleware
		e := newEnv(t, envOptions{wrap: mw.wrap})
		b := e.bus(t, "s", Options{})
		publishN(t, b, 100)
		c := e.stream(t, "/session/s/events", hdr("Last-Event-ID", "0"))
		for i := uint64(1); i <= 100; i++ {
			c.expect(wantEvent(i))
		}
		require.Equal(t, TypeReplayComplete, c.nextEvent().Type)
		// The batch is larger than net/http's write buffer, so its bytes
		// reach the client before the handler's Flush call: wait for it.
		flushes := func() int { _, n, _, _ := mw.writer().counts(); return n }
		require.Eventually(t, func() bool { return flushes() >= 2 }, 5*time.Second, time.Millisecond)
		require.Equal(t, 2, flushes(), "retry, then the 101 replayed frames with one flush")
	})

	t.Run("large frames are written directly, still one flush", func(t *testing.T) {
		logs := &logCapture{}
		b := newBus(t, logs.capture(Options{}))
		big := strings.Repeat("y", directWriteSize)
		var want []sseEvent
		for i := range 6 {
			typ, data := "small", any(i)
			if i%2 == 1 {
				typ, data = "big", big
			}
			f, err := b.Publish(Event{Type: typ, Data: data})
			require.NoError(t, err)
			want = append(want, sseEvent{Type: typ, Data: string(f.JSON()), ID: strconv.FormatUint(f.ID(), 10)})
		}
		w := newMemWriter()
		cancel, done := serveMem(busHandler(b, logs), w, "/session/s/events", hdr("Last-Event-ID", "0"))
		require.Eventually(t, func() bool { return strings.Contains(w.state().body, "event: replay_complete") },
			5*time.Second, time.Millisecond)
		cancel()
		waitClosed(t, done, "handler did not return")
		st := w.state()
		require.Equal(t, 2, st.flushes)
		require.Greater(t, st.writes, 2, "big frames go out from their shared bytes")
		evs := sseEvents(parseBody(t, st.body))
		require.Len(t, evs, 7)
		require.Equal(t, want, evs[:6], "order kept across direct and copied writes")
	})
}

// ---------------------------------------------------------------------------
// Event types cannot inject SSE lines.

func TestHandlerRejectsInjectedTypes(t *testing.T) {
	e := newEnv(t, envOptions{})
	b := e.bus(t, "s", Options{})
	c := e.stream(t, "/session/s/events", nil)
	for _, typ := range []string{
		"", "x\nid: 999", "x\rdata: evil", "x\r\n\r\nevent: evil", "\n", "\r", "evil\n\n",
	} {
		_, err := b.Publish(Event{Type: typ, Data: "evil"})
		require.ErrorIs(t, err, ErrInvalidEvent, "%q", typ)
		require.Zero(t, b.LastEventID(), "a rejected event uses no id")
	}
	// Characters that matter to SSE elsewhere are harmless on the event line.
	var want []sseEvent
	for _, typ := range []string{"ok", "a: b", " leading space", "data: not data", ":colon", "id: 7", "tab\there", "nul\x00", "\u2028sep"} {
		f, err := b.Publish(Event{Type: typ, Data: "fine"})
		require.NoError(t, err, "%q", typ)
		want = append(want, sseEvent{Type: typ, Data: string(f.JSON()), ID: strconv.FormatUint(f.ID(), 10)})
	}
	c.expect(want...)
	require.NotContains(t, string(c.raw()), "evil")
}

// ---------------------------------------------------------------------------
// Epoch ids on the wire (Handler.EpochIDs) and ParseEventID.

// epochEvent is wantEvent(id) as a stream with EpochIDs carries it: the
// SSE id is "<epoch>:<id>", the envelope's "id" stays the number.
func epochEvent(epoch string, id uint64) sseEvent {
	ev := wantEvent(id)
	ev.ID = epoch + ":" + ev.ID
	return ev
}

func TestHandlerEpochIDs(t *testing.T) {
	e := newEnv(t, envOptions{handler: &Handler{EpochIDs: true}})
	setup := func(t *testing.T) (string, *EventBus) { return e.sessionWithEvents(t, 5) }
	const other = "0123456789abcdef0123456789abcdef"
	rc := wantReplayComplete
	events := func(b *EventBus, from, to uint64) []sseEvent {
		var evs []sseEvent
		for i := from; i <= to; i++ {
			evs = append(evs, epochEvent(b.Epoch(), i))
		}
		return evs
	}
	reset := func(b *EventBus, last uint64, detail string) sseEvent {
		if detail != "" {
			detail = `"detail":"` + detail + `",`
		}
		return wantSynth(TypeStateResyncRequired, fmt.Sprintf(`{"reason":"epoch_reset",%s"lastDeliveredId":%d,"earliestAvailableId":1,"epoch":"%s"}`,
			detail, last, b.Epoch()), "")
	}
	for _, tc := range []struct {
		name   string
		query  string
		header http.Header
		want   func(b *EventBus) []sseEvent
	}{
		{"live", "", nil, func(b *EventBus) []sseEvent { return nil }},
		{"the epoch form in the header", "", hdr("Last-Event-ID", "<epoch>:3"), func(b *EventBus) []sseEvent {
			return append(events(b, 4, 5), rc(b, 2, 5, b.Epoch()+":5"))
		}},
		{"the epoch form in the query", "?lastEventId=<epoch>:2", nil, func(b *EventBus) []sseEvent {
			return append(events(b, 3, 5), rc(b, 3, 5, b.Epoch()+":5"))
		}},
		{"leading zeros after the epoch", "", hdr("Last-Event-ID", "<epoch>:0004"), func(b *EventBus) []sseEvent {
			return append(events(b, 5, 5), rc(b, 1, 5, b.Epoch()+":5"))
		}},
		{"zero after the epoch: from the start", "", hdr("Last-Event-ID", "<epoch>:0"), func(b *EventBus) []sseEvent {
			return append(events(b, 1, 5), rc(b, 5, 5, b.Epoch()+":5"))
		}},
		{"up to date", "", hdr("Last-Event-ID", "<epoch>:5"), func(b *EventBus) []sseEvent {
			return []sseEvent{rc(b, 0, 0, "")}
		}},
		{"the plain form still resumes", "", hdr("Last-Event-ID", "3"), func(b *EventBus) []sseEvent {
			return append(events(b, 4, 5), rc(b, 2, 5, b.Epoch()+":5"))
		}},
		{"another epoch: epoch_reset, the whole ring", "", hdr("Last-Event-ID", other+":3"), func(b *EventBus) []sseEvent {
			return append(append([]sseEvent{reset(b, 3, "epoch_mismatch")}, events(b, 1, 5)...), rc(b, 5, 5, b.Epoch()+":5"))
		}},
		{"another epoch with a cursor beyond the bus", "?lastEventId=" + other + ":9007199254740991", nil, func(b *EventBus) []sseEvent {
			return append(append([]sseEvent{reset(b, 9007199254740991, "epoch_mismatch")}, events(b, 1, 5)...), rc(b, 5, 5, b.Epoch()+":5"))
		}},
		{"Event-Epoch that agrees", "", hdr("Last-Event-ID", "<epoch>:4", "Event-Epoch", "<epoch>"), func(b *EventBus) []sseEvent {
			return append(events(b, 5, 5), rc(b, 1, 5, b.Epoch()+":5"))
		}},
		{"?epoch= that agrees", "?epoch=<epoch>", hdr("Last-Event-ID", "<epoch>:4"), func(b *EventBus) []sseEvent {
			return append(events(b, 5, 5), rc(b, 1, 5, b.Epoch()+":5"))
		}},
		{"an over-long Event-Epoch is ignored, the id's counts", "", hdr("Last-Event-ID", other+":4", "Event-Epoch", strings.Repeat("e", 65)), func(b *EventBus) []sseEvent {
			return append(append([]sseEvent{reset(b, 4, "epoch_mismatch")}, events(b, 1, 5)...), rc(b, 5, 5, b.Epoch()+":5"))
		}},
		{"Event-Epoch that disagrees: live only", "", hdr("Last-Event-ID", "<epoch>:3", "Event-Epoch", other), func(b *EventBus) []sseEvent {
			return nil
		}},
		{"?epoch= that disagrees: live only", "?epoch=" + other + "&lastEventId=<epoch>:3", nil, func(b *EventBus) []sseEvent {
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, b := setup(t)
			for _, vs := range tc.header {
				for i, v := range vs {
					vs[i] = strings.ReplaceAll(v, "<epoch>", b.Epoch())
				}
			}
			before := len(e.logs.find("disagree"))
			c := e.stream(t, path+strings.ReplaceAll(tc.query, "<epoch>", b.Epoch()), tc.header)
			want := tc.want(b)
			c.expect(want...)
			publishN(t, b, 1)
			c.expect(epochEvent(b.Epoch(), 6))
			require.Contains(t, string(c.raw()), "\nid: "+b.Epoch()+":6\nevent: e\ndata: {\"id\":6,", "the envelope's id stays the number")
			disagree := e.logs.find("disagree")[before:]
			if strings.Contains(tc.name, "disagrees") {
				require.Len(t, disagree, 1)
				require.Empty(t, e.logs.find("malformed"))
			} else {
				require.Empty(t, disagree)
			}
		})
	}

	t.Run("off: the SPEC wire, both forms still accepted", func(t *testing.T) {
		e := newEnv(t, envOptions{})
		b := e.bus(t, "s", Options{})
		publishN(t, b, 3)
		c := e.stream(t, "/session/s/events", hdr("Last-Event-ID", b.Epoch()+":1"))
		c.expect(wantEvent(2), wantEvent(3), wantSynth(TypeReplayComplete, `{"replayedCount":2,"lastReplayedEventId":3,"lastEventId":3,"epoch":"`+b.Epoch()+`"}`, "3"))
		require.NotContains(t, string(c.raw()), b.Epoch()+":", "no epoch on the id lines")
	})

	t.Run("frames written from their shared bytes and signals", func(t *testing.T) {
		b := e.bus(t, "big", Options{})
		c := e.stream(t, "/session/big/events", nil)
		big := strings.Repeat("x", directWriteSize)
		_, err := b.Publish(Event{Type: "big", Data: big})
		require.NoError(t, err)
		require.NoError(t, b.Signal("sig", "doc/1"))
		publishN(t, b, 1)
		ev := c.nextEvent()
		require.Equal(t, b.Epoch()+":1", ev.ID)
		require.Equal(t, "big", ev.Type)
		require.Contains(t, ev.Data, `{"id":1,"v":1,"type":"big","data":"`+big+`"`)
		ev = c.nextEvent()
		require.Equal(t, "sig", ev.Type)
		require.Equal(t, b.Epoch()+":1", ev.ID, "a signal carries no id line")
		c.expect(epochEvent(b.Epoch(), 2))
	})
}

// A browser across a daemon restart: the plain EventSource sends back the
// id it last saw, and the new bus (a new epoch, already past that id) must
// answer epoch_reset instead of resuming in the middle of its own sequence.
func TestHandlerEpochIDsAcrossARestart(t *testing.T) {
	e := newEnv(t, envOptions{handler: &Handler{EpochIDs: true}})
	old := e.bus(t, "s", Options{})
	publishN(t, old, 3)
	c := e.stream(t, "/session/s/events", hdr("Last-Event-ID", "0"))
	c.expect(epochEvent(old.Epoch(), 1), epochEvent(old.Epoch(), 2), epochEvent(old.Epoch(), 3))
	c.nextEvent() // replay_complete
	last := c.r.lastEventID()

	restarted := e.bus(t, "s", Options{}) // replaces the session
	publishN(t, restarted, 22)
	c = e.stream(t, "/session/s/events", hdr("Last-Event-ID", last))
	resync := c.nextEvent()
	require.Equal(t, TypeStateResyncRequired, resync.Type)
	require.Contains(t, resync.Data, `"reason":"epoch_reset","detail":"epoch_mismatch","lastDeliveredId":3,"earliestAvailableId":1`)
	for i := uint64(1); i <= 22; i++ {
		require.Equal(t, epochEvent(restarted.Epoch(), i), c.nextEvent())
	}

	// The same cursor as a plain id would have joined the two epochs.
	c = e.stream(t, "/session/s/events", hdr("Last-Event-ID", "3"))
	require.Equal(t, epochEvent(restarted.Epoch(), 4), c.nextEvent(), "what EpochIDs prevents")
}

// refParseEventID is the reference: the plain form, or 32 characters of
// [0-9a-f], a colon and the plain form.
var refEventIDPattern = regexp.MustCompile(`^(?:([0-9a-f]{32}):)?([0-9]+)$`)

func refParseEventID(s string) (string, uint64, bool) {
	m := refEventIDPattern.FindStringSubmatch(s)
	if m == nil {
		return "", 0, false
	}
	id, ok := refParseLastEventID(m[2])
	if !ok {
		return "", 0, false
	}
	return m[1], id, true
}

func TestParseEventID(t *testing.T) {
	const ep = "0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		in    string
		epoch string
		id    uint64
		ok    bool
	}{
		{"7", "", 7, true},
		{"0", "", 0, true},
		{ep + ":7", ep, 7, true},
		{ep + ":0", ep, 0, true},
		{ep + ":007", ep, 7, true},
		{ep + ":9007199254740991", ep, 1<<53 - 1, true},
		{ep + ":9007199254740992", "", 0, false},
		{ep + ":18446744073709551616", "", 0, false},
		{"9007199254740992", "", 0, false},
		{ep + ":", "", 0, false},
		{ep, "", 0, false},
		{":7", "", 0, false},
		{ep[:31] + ":7", "", 0, false},
		{ep + "0:7", "", 0, false},
		{strings.ToUpper(ep) + ":7", "", 0, false},
		{"0123456789ABCDEF0123456789abcdef:7", "", 0, false},
		{"g123456789abcdef0123456789abcdef:7", "", 0, false},
		{ep + ": 7", "", 0, false},
		{ep + ":7 ", "", 0, false},
		{ep + ":+7", "", 0, false},
		{ep + ":-7", "", 0, false},
		{ep + ":7:8", "", 0, false},
		{ep + "::7", "", 0, false},
		{" " + ep + ":7", "", 0, false},
		{ep + ":\u0667", "", 0, false},
		{ep + ":7\x00", "", 0, false},
		{"", "", 0, false},
	} {
		epoch, id, ok := ParseEventID(tc.in)
		require.Equal(t, tc.ok, ok, "%q", tc.in)
		require.Equal(t, tc.epoch, epoch, "%q", tc.in)
		require.Equal(t, tc.id, id, "%q", tc.in)
	}
	huge := ep + ":" + strings.Repeat("9", 10<<20)
	ok := true
	require.Zero(t, testing.AllocsPerRun(10, func() { _, _, ok = ParseEventID(huge) }), "a hostile value allocates nothing")
	require.False(t, ok)
}

func FuzzParseEventID(f *testing.F) {
	const ep = "0123456789abcdef0123456789abcdef"
	for _, s := range []string{"", "1", ep + ":1", ep + ":", ep + ":9007199254740992", strings.ToUpper(ep) + ":1", ep[:31] + "::1", ep + ":1:2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		epoch, id, ok := ParseEventID(s)
		wantEpoch, wantID, wantOK := refParseEventID(s)
		require.Equal(t, wantOK, ok, "%q", s)
		require.Equal(t, wantEpoch, epoch, "%q", s)
		require.Equal(t, wantID, id, "%q", s)
	})
}

// With EpochIDs the writer puts "id: <epoch>:" before each event's shared
// bytes: framing a batch allocates nothing, as without it.
func TestEpochIDsFramingDoesNotAllocate(t *testing.T) {
	b := newBus(t, Options{RingSize: 64})
	frames := publishN(t, b, 16)
	frames = append(frames, replayCompleteFrame(1, 16, b.Epoch(), 0))
	for _, epochIDs := range []bool{false, true} {
		s := stream{w: newMemWriter()}
		if epochIDs {
			s.idPrefix = []byte("id: " + b.Epoch() + ":")
		}
		s.reserve(frames)
		allocs := testing.AllocsPerRun(100, func() {
			s.buf = s.buf[:0]
			s.reserve(frames)
			for _, f := range frames {
				s.add(f)
			}
		})
		require.Zero(t, allocs, "epochIDs=%v", epochIDs)
		recs, err := parseSSE(s.buf)
		require.NoError(t, err)
		require.Len(t, recs, 17)
		for i, r := range recs[:16] {
			want := strconv.Itoa(i + 1)
			if epochIDs {
				want = b.Epoch() + ":" + want
			}
			require.Equal(t, want, r.Event.ID)
		}
	}
}

// ---------------------------------------------------------------------------
// Framing for lenient clients, and the retry jitter.

// requireEveryBlockHasData fails when a blank line of body ends a block
// without a data: line. Several common clients dispatch such a block as an
// empty event: r3labs/sse and sseclient-py split the stream at blank
// lines, go-sse dispatches a block with a retry: field, httpx-sse every
// blank line once it has seen an id (it keeps the last id, as the standard
// says, and dispatches whenever that is set).
func requireEveryBlockHasData(t *testing.T, body string) {
	t.Helper()
	hasData, lines := false, 0
	// Every line ends with LF; the text after the last one is no line.
	for line := range strings.SplitSeq(strings.TrimSuffix(body, "\n"), "\n") {
		lines++
		switch {
		case line == "":
			require.True(t, hasData, "line %d: a blank line ends a block without data in %q", lines, body[:min(len(body), 2048)])
			hasData = false
		case strings.HasPrefix(line, "data:"):
			hasData = true
		}
	}
}

func TestHandlerFramingForLenientClients(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logCapture{}
		b := newBus(t, logs.capture(Options{MaxQueued: 16}))
		publishN(t, b, 3)
		h := busHandler(b, logs)
		h.Heartbeat = time.Second
		h.EpochIDs = true
		w := newMemWriter()
		_, done := serveMem(h, w, "/session/s/events", hdr("Last-Event-ID", "1"))
		synctest.Wait()
		require.Equal(t, "retry: 3000\nid: "+b.Epoch()+":2\n", w.state().body[:len("retry: 3000\nid: ")+len(b.Epoch())+3],
			"retry: and the replay share a block")
		time.Sleep(3 * time.Second) // three heartbeats
		synctest.Wait()
		publishN(t, b, 2)
		synctest.Wait()
		time.Sleep(time.Second)
		synctest.Wait()
		b.Close() // the stream ends after a heartbeat
		<-done
		body := w.state().body
		// Heartbeats: the retry: line and two ":" after the replay, the
		// retry: line after the live events. The tail after the last event
		// always holds a field (go-sse stops for good on a tail of comments).
		require.Equal(t, 2, strings.Count(body, "\n:"), "lines that start with a colon")
		require.Equal(t, 3, strings.Count(body, "retry: 3000\n"))
		require.True(t, strings.HasSuffix(body, "}\n\nretry: 3000\n"), "%q", body[max(0, len(body)-64):])
		requireEveryBlockHasData(t, body)
		recs := parseBody(t, body)
		require.Equal(t, sseRecord{Kind: sseRetryRecord, Retry: 3000}, recs[0], "a conforming parser applies retry: at once")
		require.Len(t, sseEvents(recs), 5, "events 2..5 and replay_complete")
	})

	t.Run("a live stream that gets nothing", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			logs := &logCapture{}
			b := newBus(t, logs.capture(Options{}))
			h := busHandler(b, logs)
			w := newMemWriter()
			cancel, done := serveMem(h, w, "/session/s/events", nil)
			synctest.Wait()
			time.Sleep(2 * DefaultHeartbeat)
			synctest.Wait()
			cancel()
			<-done
			require.Equal(t, "retry: 3000\n:\n:\n", w.state().body, "no blank line at all: nothing a client could dispatch, and a field in the tail")
		})
	})

	t.Run("terminal frames", func(t *testing.T) {
		e := newEnv(t, envOptions{})
		b := e.bus(t, "s", Options{MaxQueued: 16})
		c := e.stream(t, "/session/s/events?maxQueued=16", nil)
		publishN(t, b, 1)
		c.expect(wantEvent(1))
		sub := b.SubscriberCount()
		require.Equal(t, 1, sub)
		b.Close()
		c.rest()
		requireEveryBlockHasData(t, string(c.raw()))
	})
}

func TestHandlerRetryJitter(t *testing.T) {
	retries := func(t *testing.T, h *Handler, n int) map[int64]int {
		e := newEnv(t, envOptions{handler: h})
		e.h.RetryJitter = h.RetryJitter // 0 too: the default
		e.bus(t, "s", Options{})
		seen := map[int64]int{}
		for range n {
			c := e.open(t, "/session/s/events", nil)
			r := c.next()
			require.Equal(t, sseRetryRecord, r.Kind)
			seen[r.Retry]++
			require.NoError(t, c.resp.Body.Close())
		}
		return seen
	}
	t.Run("default: up to half of Retry more, per connection", func(t *testing.T) {
		seen := retries(t, &Handler{RetryJitter: 0}, 100)
		for ms := range seen {
			require.GreaterOrEqual(t, ms, int64(3000))
			require.LessOrEqual(t, ms, int64(4500))
		}
		require.Greater(t, len(seen), 50, "100 connections spread over 1501 values: %v", seen)
	})
	t.Run("custom", func(t *testing.T) {
		seen := retries(t, &Handler{Retry: time.Second, RetryJitter: 3 * time.Millisecond}, 60)
		for ms := range seen {
			require.GreaterOrEqual(t, ms, int64(1000))
			require.LessOrEqual(t, ms, int64(1003))
		}
		require.Len(t, seen, 4, "each of 1000..1003 in 60 draws: %v", seen)
	})
	t.Run("negative: none", func(t *testing.T) {
		require.Equal(t, map[int64]int{1500: 20}, retries(t, &Handler{Retry: 1500 * time.Millisecond, RetryJitter: -1}, 20))
	})
	t.Run("jitter is drawn without allocating", func(t *testing.T) {
		h := &Handler{}
		require.Zero(t, testing.AllocsPerRun(100, func() { h.retryMillis() }))
	})
}
