package eventbus

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

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
