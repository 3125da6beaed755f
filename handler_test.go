package eventbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/build"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
		h := &Handler{Lookup: func(*http.Request, string) (*EventBus, error) { return nil, nil }, Logger: (&logCapture{}).logger()}
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
		h := &Handler{Lookup: func(*http.Request, string) (*EventBus, error) { return nil, errors.New("store down") }, Logger: logs.logger()}
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
	lookup := func(r *http.Request, _ string) (*EventBus, error) {
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

// transportFiles are the files of the package's SSE transport, the
// Transport that Handler and MuxHandler serve their Streams with. They may
// use only what a transport outside the package could (the WebSocket
// module's): the package's exported API, plus their own unexported
// declarations. The stream engine (stream.go, transport.go) and the routes
// that open its streams (handler.go, mux.go) are the package's own.
var transportFiles = []string{"sse.go"}

// ---------------------------------------------------------------------------
// The Handler is built on exported API only.

// A stream's subscription is detached from its request (subscribeRequest,
// SubscribeOptions.Detached): subscribing for a request allocates what a
// subscription without a context does, nothing on the request's context.
// Watching it for the life of each stream (a context derived from it, a
// callback on each, their maps of children) cost about 1 KiB per idle
// connection (issue 26).
func TestHandlerSubscriptionCostsNoContext(t *testing.T) {
	b := newBus(t, Options{})
	const runs = 50
	reqs := make([]*http.Request, runs+1) // AllocsPerRun runs once more to warm up
	for i := range reqs {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		reqs[i] = httptest.NewRequest(http.MethodGet, "/events", nil).WithContext(ctx)
	}
	next := 0
	forRequest := testing.AllocsPerRun(runs, func() {
		sub, err := subscribeRequest(reqs[next], b, SubscribeOptions{})
		next++
		if err != nil {
			t.Fatal(err)
		}
		sub.Close()
	})
	bare := testing.AllocsPerRun(runs, func() {
		sub, err := b.Subscribe(context.Background(), SubscribeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sub.Close()
	})
	if forRequest != bare {
		t.Fatalf("a subscription for a request allocates %v times, one without a context %v", forRequest, bare)
	}
	if n := b.SubscriberCount(); n != 0 {
		t.Fatalf("%d subscribers left", n)
	}
}

// TestSSETransportUsesExportedAPIOnly type-checks the package (its
// non-test files, importing the standard library from the compiler's
// export data) and fails for every identifier in a transport file that
// resolves to an unexported object of this package (a package-level name,
// a field or a method) declared outside the transport's files: so the
// WebSocket transport, or any other, is written outside the package with
// what the SSE transport uses (issues 14 and 34).
func TestSSETransportUsesExportedAPIOnly(t *testing.T) {
	t.Parallel()
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range transportFiles {
		if !slices.Contains(pkg.GoFiles, name) {
			t.Fatalf("transport file %s is not a Go file of the package (renamed? update transportFiles)", name)
		}
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range pkg.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(pkg.Dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	info := &types.Info{Uses: make(map[*ast.Ident]types.Object)}
	conf := types.Config{Importer: moduleImporter{fset, importer.ForCompiler(fset, "gc", nil), modulePath(t), pkg.Dir}}
	tpkg, err := conf.Check(pkg.ImportPath, fset, files, info)
	if err != nil {
		t.Fatal(err)
	}
	isHandlerFile := func(pos token.Pos) bool {
		return slices.Contains(transportFiles, filepath.Base(fset.Position(pos).Filename))
	}
	var bad []string
	for id, obj := range info.Uses {
		if obj.Pkg() != tpkg || obj.Exported() || !isHandlerFile(id.Pos()) || isHandlerFile(obj.Pos()) {
			continue
		}
		bad = append(bad, fset.Position(id.Pos()).String()+": "+id.Name+" (declared at "+filepath.Base(fset.Position(obj.Pos()).String())+")")
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Errorf("the SSE transport uses unexported API: %s", b)
	}
	if t.Failed() {
		t.Log("expose what the transport needs as documented exported API of the seam (Stream, Batch, Member), or move the helper into the transport's files")
	}
}

// moduleImporter imports the standard library from the compiler's export
// data and this module's own packages (internal/...) by type-checking
// their source, for which the compiler has no export data here.
type moduleImporter struct {
	fset   *token.FileSet
	gc     types.Importer
	module string // the import path of the module's root package
	dir    string // its directory
}

// modulePath reads the module path from go.mod.
func modulePath(t *testing.T) string {
	b, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if m, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.TrimSpace(m)
		}
	}
	t.Fatal("go.mod names no module")
	return ""
}

func (im moduleImporter) Import(path string) (*types.Package, error) {
	rel, ok := strings.CutPrefix(path, im.module+"/")
	if !ok {
		return im.gc.Import(path)
	}
	p, err := build.ImportDir(filepath.Join(im.dir, filepath.FromSlash(rel)), 0)
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for _, name := range p.GoFiles {
		f, err := parser.ParseFile(im.fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return (&types.Config{Importer: im}).Check(path, im.fset, files, nil)
}

// ---------------------------------------------------------------------------
// Resuming: Last-Event-ID, lastEventId, epochs, and the resync frames.

// fillEpoch replaces every "<epoch>" value of hdr with b's epoch.
func fillEpoch(hdr http.Header, b *EventBus) {
	for _, vs := range hdr {
		for i, v := range vs {
			if v == "<epoch>" {
				vs[i] = b.Epoch()
			}
		}
	}
}

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
			fillEpoch(tc.header, b)
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
	size := pick(1<<20, 10<<20, 10<<20)           // 1 MB with -short
	huge := strings.Repeat("9", size)             // 10 MB of digits: overflows early
	hugeJunk := strings.Repeat("\u00e9x", size/3) // 10 MB, cut inside a rune at 64 bytes
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
		// Live only, said first: no replay, no replay_complete.
		publishN(t, b, 1)
		c.expect(wantCursorInvalid(b, 4, ""), wantEvent(4))
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
		{"10 MB non-digits query", "", strings.Repeat("x", size)},
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
			// The retry: line, then the notice, each a batch of its own.
			require.Eventually(t, func() bool { return b.SubscriberCount() == 1 && w.state().flushes == 2 }, 5*time.Second, time.Millisecond)
			publishN(t, b, 1)
			require.Eventually(t, func() bool { return w.state().flushes == 3 }, 5*time.Second, time.Millisecond)
			cancel()
			waitClosed(t, done, "handler did not return")
			st := w.state()
			require.Equal(t, http.StatusOK, st.status)
			require.Equal(t, []sseRecord{{Kind: sseRetryRecord, Retry: 3000}, {Kind: sseEventRecord, Event: wantCursorInvalid(b, 4, "")},
				{Kind: sseEventRecord, Event: wantEvent(4)}}, parseBody(t, st.body))
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
			fillEpoch(tc.header, b)
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
// Epoch ids on the wire (Handler.EpochIDs) and ParseEventID.

// epochEvent is wantEvent(id) as a stream with EpochIDs carries it: the
// SSE id is "<epoch>:<id>", the envelope's "id" stays the number.
func epochEvent(epoch string, id uint64) sseEvent {
	ev := wantEvent(id)
	ev.ID = epoch + ":" + ev.ID
	return ev
}

func TestHandlerEpochIDs(t *testing.T) {
	e := newEnv(t, envOptions{epochIDs: true})
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
		{"Event-Epoch that disagrees: live only, said", "", hdr("Last-Event-ID", "<epoch>:3", "Event-Epoch", other), func(b *EventBus) []sseEvent {
			return []sseEvent{wantCursorInvalid(b, 6, "")}
		}},
		{"?epoch= that disagrees: live only, said", "?epoch=" + other + "&lastEventId=<epoch>:3", nil, func(b *EventBus) []sseEvent {
			return []sseEvent{wantCursorInvalid(b, 6, "")}
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
		big := strings.Repeat("x", sseDirectWriteSize)
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
	e := newEnv(t, envOptions{epochIDs: true})
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

// ---------------------------------------------------------------------------
// Hostile input over HTTP: what a remote client can throw at the SSE route,
// end to end on a real loopback server.

// TestHostileHugeLastEventID sends a 10 MB Last-Event-ID header (1 MB with
// -short; the server
// accepts 16 MiB of headers): the stream is live only (no replay, no
// replay_complete), the value is logged once, quoted and truncated to 64
// bytes, and nothing is retained.
func TestHostileHugeLastEventID(t *testing.T) {
	logs := &logCapture{}
	b := newBus(t, Options{})
	ts := serveSession(t, b, &Handler{Logger: slog.New(logs)})
	for range 3 {
		if _, err := b.Publish(Event{Type: "old"}); err != nil {
			t.Fatal(err)
		}
	}
	size := pick(1<<20, 10<<20, 10<<20) // 1 MB with -short
	for i, huge := range []string{
		strings.Repeat("9", size),             // digits that overflow 2^53 early
		strings.Repeat("1 OR 1=1; ", size/10), // 10 MB of junk
		"1" + strings.Repeat("0", size-1),     // a 10 MB number
	} {
		s := openStream(t, ts, "/session/s/events", http.Header{"Last-Event-Id": {huge}})
		if s.resp.StatusCode != http.StatusOK {
			t.Fatalf("value %d: status %d", i, s.resp.StatusCode)
		}
		require.Eventually(t, func() bool { return b.SubscriberCount() == 1 }, 20*time.Second, time.Millisecond)
		f, err := b.Publish(Event{Type: "live"})
		if err != nil {
			t.Fatal(err)
		}
		if ev := s.skipToEvent(); ev.Type != TypeStateResyncRequired || !strings.Contains(ev.Data, `"reason":"cursor_invalid"`) {
			t.Fatalf("value %d: first frame %+v, want the cursor_invalid notice", i, ev)
		}
		if ev := s.skipToEvent(); ev.Type != "live" || ev.ID != strconv.FormatUint(f.ID(), 10) {
			t.Fatalf("value %d: then %+v, want the live event %d only", i, ev, f.ID())
		}
		s.close()
		require.Eventually(t, func() bool { return b.SubscriberCount() == 0 }, 20*time.Second, time.Millisecond)
		recs := logs.find("malformed Last-Event-ID")
		if len(recs) != i+1 {
			t.Fatalf("value %d: %d log records, want one per request", i, len(recs))
		}
		if got, want := recs[i].Attrs["value"], strconv.Quote(huge[:64]); got != want {
			t.Errorf("value %d logged as %q, want %q", i, got, want)
		}
	}
}

// TestHostileQueryParameters: maxQueued values a client may throw (huge,
// signed, spaced, hex, fullwidth, repeated, out of range) are 400 with the
// JSON body and subscribe nothing; leading zeros are fine. Repeated
// Last-Event-ID headers and lastEventId parameters: the first counts.
func TestHostileQueryParameters(t *testing.T) {
	b := newBus(t, Options{})
	ts := serveSession(t, b, &Handler{Logger: slog.New(slog.DiscardHandler)})
	for _, q := range []string{
		"maxQueued=99999999999999999999", "maxQueued=184467440737095516160000", "maxQueued=-16", "maxQueued=+16",
		"maxQueued=%2016", "maxQueued=16%20", "maxQueued=0x10", "maxQueued=1e2", "maxQueued=", "maxQueued",
		"maxQueued=16&maxQueued=16", "maxQueued=16&maxQueued=", "maxQueued=%EF%BC%91%EF%BC%96", "maxQueued=15",
		"maxQueued=2049", "maxQueued=%zz", "maxQueued=16;x", "maxQueued=" + strings.Repeat("9", 100000),
	} {
		resp, err := ts.Client().Get(ts.URL + "/session/s/events?" + q)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct{ Error, Code string }
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Content-Type") != "application/json" ||
			json.Unmarshal(body, &e) != nil || e.Code != "invalid_max_queued" || e.Error == "" {
			t.Errorf("%.60s: %d %q %s", q, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	}
	if b.SubscriberCount() != 0 || b.Stats().PeakSubscribers != 0 {
		t.Fatalf("a rejected request subscribed")
	}
	for _, q := range []string{"maxQueued=0000000000000000000000016", "maxQueued=2048", "maxQueued=%31%36"} {
		s := openStream(t, ts, "/session/s/events?"+q, nil)
		if s.resp.StatusCode != http.StatusOK {
			t.Errorf("%s: status %d", q, s.resp.StatusCode)
		}
		s.close()
	}
	require.Eventually(t, func() bool { return b.SubscriberCount() == 0 }, 20*time.Second, time.Millisecond)

	for range 9 {
		if _, err := b.Publish(Event{Type: "t"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name      string
		pathQuery string
		hdr       http.Header
		first     uint64 // the first replayed id
	}{
		{"repeated header", "", http.Header{"Last-Event-Id": {"2", "7"}}, 3},
		{"repeated parameter", "?lastEventId=5&lastEventId=1", nil, 6},
		{"header over parameter", "?lastEventId=1", http.Header{"Last-Event-Id": {"8"}}, 9},
		{"empty header, parameter", "?lastEventId=4", http.Header{"Last-Event-Id": {""}}, 5},
	} {
		s := openStream(t, ts, "/session/s/events"+tc.pathQuery, tc.hdr)
		var ids []string
		for {
			ev := s.skipToEvent()
			if ev.Type == TypeReplayComplete {
				break
			}
			ids = append(ids, ev.ID)
		}
		var want []string
		for id := tc.first; id <= 9; id++ {
			want = append(want, strconv.FormatUint(id, 10))
		}
		if fmt.Sprint(ids) != fmt.Sprint(want) {
			t.Errorf("%s: replayed %v, want %v", tc.name, ids, want)
		}
		s.close()
	}
}

// TestHostileFloodPastSubscriberLimit makes 10,000 requests (1,000 with
// -short) to a full session (keep-alive connections, 8 concurrent clients): every one is 429
// with Retry-After: 5 and the JSON body naming the limit; none subscribes,
// and nothing leaks (subscriber count, peak, goroutines).
func TestHostileFloodPastSubscriberLimit(t *testing.T) {
	const limit, workers = 2, 8
	attempts := int64(pick(1_000, 10_000, 10_000))
	b := newBus(t, Options{MaxSubscribers: limit})
	ts := serveSession(t, b, &Handler{Logger: slog.New(slog.DiscardHandler)})
	for range limit {
		s, err := b.Subscribe(context.Background(), SubscribeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
	}
	baseG := runtime.NumGoroutine()
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	hc := &http.Client{Transport: tr}
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= attempts {
				resp, err := hc.Get(ts.URL + "/session/s/events?maxQueued=64")
				if err != nil {
					t.Errorf("GET: %v", err)
					return
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				var e struct {
					Error, Code string
					Limit       int
				}
				if err != nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "5" ||
					resp.Header.Get("Content-Type") != "application/json" || json.Unmarshal(body, &e) != nil ||
					e.Code != "subscriber_limit_exceeded" || e.Limit != limit || e.Error == "" {
					t.Errorf("%d %v %s (%v)", resp.StatusCode, resp.Header, body, err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	tr.CloseIdleConnections()
	if st := b.Stats(); b.SubscriberCount() != limit || st.PeakSubscribers != limit {
		t.Errorf("subscribers %d, peak %d, want %d", b.SubscriberCount(), st.PeakSubscribers, limit)
	}
	if g := waitGoroutines(baseG); g > baseG {
		t.Errorf("goroutines: %d after the flood, baseline %d", g, baseG)
	}
	t.Logf("%d requests past the limit answered 429 in %v", attempts, elapsed.Round(time.Millisecond))
}

// TestHostileClientNeverReads: a client sends its request and never reads
// a byte, not even the response headers. One 12 MiB event (accepted: no
// live entry is queued, and the handler takes it at once) fills the
// sockets; the write blocks, hits Handler.WriteTimeout, and the
// subscription is dropped, reason blocked: not evicted, and nothing stays
// behind (subscriber count, goroutines).
func TestHostileClientNeverReads(t *testing.T) {
	var diags atomic.Int64
	b := newBus(t, Options{OnDiagnostic: func(d Diagnostic) bool {
		if d.Kind == DiagWriteFailed {
			diags.Add(1)
		}
		return true
	}})
	ts := serveSession(t, b, &Handler{WriteTimeout: 300 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	baseG := runtime.NumGoroutine()

	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(4096)
	if _, err := io.WriteString(conn, "GET /session/s/events HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	require.Eventually(t, func() bool { return b.SubscriberCount() == 1 }, 20*time.Second, time.Millisecond)
	if _, err := b.Publish(Event{Type: "big", Data: strings.Repeat("b", 12<<20)}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	require.Eventually(t, func() bool { return b.SubscriberCount() == 0 }, 20*time.Second, time.Millisecond)
	gone := time.Since(start)
	// The subscription is unregistered first; the drop is counted and the
	// diagnostic emitted right after, on the handler's goroutine.
	require.Eventually(t, func() bool { return diags.Load() > 0 }, 5*time.Second, time.Millisecond, "no write_failed diagnostic")
	st := b.Stats()
	if st.Dropped.Blocked == 0 || st.Evictions != (EvictionStats{}) || diags.Load() != 1 {
		t.Errorf("dropped %+v, evictions %+v, %d write_failed diagnostics", st.Dropped, st.Evictions, diags.Load())
	}
	conn.Close()
	if g := waitGoroutines(baseG); g > baseG {
		t.Errorf("goroutines: %d, baseline %d", g, baseG)
	}
	t.Logf("a client that never reads was dropped %v after Publish of the 12 MiB event returned (WriteTimeout 300ms)", gone.Round(time.Millisecond))
}

// ---------------------------------------------------------------------------
// Fuzzed request values.

// refParseLastEventID is the reference: one or more ASCII digits whose
// value, by strconv.ParseUint, is at most 2^53-1.
func refParseLastEventID(s string) (uint64, bool) {
	if s == "" {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v > 1<<53-1 {
		return 0, false
	}
	return v, true
}

func FuzzParseLastEventID(f *testing.F) {
	for _, s := range []string{
		"", "0", "1", "007", "42",
		"9007199254740991", "09007199254740991", "9007199254740992",
		"18446744073709551615", "18446744073709551616", "99999999999999999999999",
		strings.Repeat("0", 100) + "1", strings.Repeat("9", 1000),
		"-1", "+1", " 1", "1 ", "1.0", "abc", "0x10", "1e3", "1_000",
		"\u0661", "1\x00", "\xff", "\t1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := parseDecimalID(s)
		want, wantOK := refParseLastEventID(s)
		require.Equal(t, wantOK, ok, "%q", s)
		require.Equal(t, want, got, "%q", s)
	})
}

// refParseMaxQueued is the reference for one maxQueued value.
func refParseMaxQueued(s string) (int, bool) {
	if s == "" {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v < MinClientMaxQueued || v > MaxClientMaxQueued {
		return 0, false
	}
	return int(v), true
}

func FuzzParseMaxQueued(f *testing.F) {
	for _, s := range []string{
		"", "0", "15", "16", "0016", "2048", "2049", "99999999999999999999",
		strings.Repeat("0", 50) + "16", "+16", " 16", "-1", "abc", "16.0", "\uff11\uff16",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := parseMaxQueued([]string{s})
		want, ok := refParseMaxQueued(s)
		require.Equal(t, ok, err == nil, "%q: %v", s, err)
		if ok {
			require.Equal(t, want, got)
		}
		_, err = parseMaxQueued([]string{s, s})
		require.Error(t, err, "a repeated value is always rejected")
	})
}

// FuzzHandlerRequest drives the request rules with fuzzed Last-Event-ID,
// lastEventId, epoch and maxQueued values: never a panic, never a 5xx, 400
// exactly when maxQueued is invalid, a malformed cursor (either id form,
// ParseEventID) is logged with at most 64 bytes of it, and an epoch that
// disagrees with the id's is logged once.
func FuzzHandlerRequest(f *testing.F) {
	f.Add("3", "", "", "16")
	f.Add("", "abc", "x", "")
	f.Add("9007199254740992", "1", strings.Repeat("e", 65), "2049")
	f.Add(strings.Repeat("7", 200), "", "", "0016")
	f.Add("\xff", "\x00", "\n", "+16")
	f.Add("0123456789abcdef0123456789abcdef:1", "", "0123456789abcdef0123456789abcdef", "")
	f.Add("", "0123456789abcdef0123456789abcdef:1", "fedcba9876543210fedcba9876543210", "")
	f.Add("0123456789abcdef0123456789ABCDEF:1", "", "", "")
	f.Fuzz(func(t *testing.T, header, query, epoch, maxQueued string) {
		logs := &logCapture{}
		b, err := New(Options{Now: testNow, Logger: logs.logger(), OnDiagnostic: logs.diag})
		require.NoError(t, err)
		defer b.Close()
		_, err = b.Publish(Event{Type: "e"})
		require.NoError(t, err)

		q := url.Values{}
		if query != "" {
			q.Set("lastEventId", query)
		}
		if epoch != "" {
			q.Set("epoch", epoch)
		}
		if maxQueued != "" {
			q.Set("maxQueued", maxQueued)
		}
		target := "/session/s/events"
		if len(q) > 0 {
			target += "?" + q.Encode()
		}
		// A request whose client is already gone: the handler answers and
		// returns at once without streaming.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		req := httptest.NewRequest(http.MethodGet, target, nil).WithContext(ctx)
		if header != "" {
			req.Header["Last-Event-Id"] = []string{header}
		}
		w := newMemWriter()
		busHandler(b, logs).ServeHTTP(w, req)
		st := w.state()

		_, mqOK := refParseMaxQueued(maxQueued)
		if maxQueued != "" && !mqOK {
			requireJSONError(t, st.status, st.header, []byte(st.body), http.StatusBadRequest, "invalid_max_queued")
			return
		}
		require.Equal(t, http.StatusOK, st.status, "body %q", st.body)
		require.Empty(t, st.body, "nothing is written once the client is gone (no write deadline is armed then)")
		require.Zero(t, b.SubscriberCount())

		raw := header
		if raw == "" {
			raw = query
		}
		malformed := logs.find("malformed Last-Event-ID")
		disagree := logs.find("disagree")
		idEpoch, _, ok := refParseEventID(raw)
		if ok || raw == "" {
			require.Empty(t, malformed)
			// An epoch given beside one in the id must be the same.
			given := epoch
			if len(given) > 64 {
				given = ""
			}
			require.Equal(t, idEpoch != "" && given != "" && given != idEpoch, len(disagree) == 1, "epoch %q, id %q: %v", epoch, raw, disagree)
			return
		}
		require.Len(t, malformed, 1)
		v, err := strconv.Unquote(malformed[0].Attrs["value"])
		require.NoError(t, err)
		require.Equal(t, raw[:min(len(raw), 64)], v)
	})
}

// The default is the safe one (issue 33): a Handler nobody configured
// writes epoch ids, so a browser's own Last-Event-ID names the epoch, and
// a resume after the session's bus was replaced (a daemon restart, a
// Delete, an idle expiry) is told epoch_reset instead of joining the new
// sequence silently. Only BareIDs, set on purpose, gives that up.
func TestHandlerDefaultAnnouncesANewEpoch(t *testing.T) {
	var bus atomic.Pointer[EventBus]
	b1 := newBus(t, Options{})
	bus.Store(b1)
	srv := httptest.NewServer(&Handler{Lookup: func(*http.Request, string) (*EventBus, error) { return bus.Load(), nil }})
	defer srv.Close()
	publishN(t, b1, 3)
	c := openStream(t, srv, "/session/s/events", hdr("Last-Event-ID", "0"))
	last := ""
	for !strings.HasSuffix(last, ":3") {
		last = c.skipToEvent().ID
	}
	require.Equal(t, b1.Epoch()+":3", last, "the id line carries the epoch")
	c.close()

	b2 := newBus(t, Options{}) // the daemon restarted
	bus.Store(b2)
	publishN(t, b2, 6)
	c = openStream(t, srv, "/session/s/events", hdr("Last-Event-ID", last))
	ev := c.skipToEvent()
	require.Equal(t, TypeStateResyncRequired, ev.Type, "a resume across the restart says so")
	require.Contains(t, ev.Data, `"reason":"epoch_reset"`)
	c.close()
}
