package eventbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Hostile input over HTTP: what a remote client or a careless producer can
// throw at the bus and its SSE route, end to end on a real loopback server.

// waitSubscribers waits until b has n subscribers (a stream registers
// before its headers are read, but this makes the order explicit).
func waitSubscribers(t *testing.T, b *EventBus, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for b.SubscriberCount() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d subscribers, want %d", b.SubscriberCount(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestHostileInjectionStaysInsideOneDataLine: types that would inject SSE
// lines are rejected at Publish (no id used, nobody receives anything);
// strings with "\n\ndata: x", "\r\nid: 99", "\r", U+2028, NUL and quotes in
// data, _meta keys and values, originatorClientId, and pre-encoded JSON
// with raw newlines reach the client as ONE event with ONE data line,
// whose JSON decodes back to exactly what was published.
func TestHostileInjectionStaysInsideOneDataLine(t *testing.T) {
	b := newBus(t, Options{})
	ts := serveSession(t, b, &Handler{Logger: slog.New(slog.DiscardHandler)})
	s := openStream(t, ts, "/session/s/events", nil)
	if s.resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", s.resp.StatusCode)
	}
	if r := s.next(); r.Kind != sseRetryRecord || r.Retry < 3000 || r.Retry > 4500 {
		t.Fatalf("first record %+v", r)
	}

	for _, typ := range []string{"\n", "\r", "\r\n", "a\n\ndata: x", "a\nid: 99", "x\revent: y", "ok\n", "\nok",
		"a\r\n\r\nid: 1\r\ndata: {}\r\n\r\n"} {
		_, err := b.Publish(Event{Type: typ, Data: "evil"})
		if !errors.Is(err, ErrInvalidEvent) {
			t.Errorf("Publish(type %q): %v, want ErrInvalidEvent", typ, err)
		}
		if err := b.Signal(typ, "about"); !errors.Is(err, ErrInvalidEvent) {
			t.Errorf("Signal(type %q): %v, want ErrInvalidEvent", typ, err)
		}
	}
	if b.LastEventID() != 0 || b.Stats().Rejected.Invalid != 18 {
		t.Fatalf("rejected events used ids or were not counted: last id %d, %+v", b.LastEventID(), b.Stats().Rejected)
	}

	evil := []string{"\n\ndata: x", "\r\nid: 99\r\n\r\n", "x\ry", "\u2028\u2029", "nul\x00", `"}]` + "\n", "id: 5\n\nevent: x\ndata: {}\n\n"}
	type published struct {
		f    Frame
		data any
		meta map[string]any
		orig string
	}
	var pubs []published
	for i, e := range evil {
		data := map[string]any{"text": e, "id": e, "nested": []any{e}}
		meta := map[string]any{"note": e, e: "key", "id": 77}
		f, err := b.Publish(Event{Type: "t", Data: data, Meta: meta, OriginatorClientID: e})
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		pubs = append(pubs, published{f, data, meta, e})
	}
	raw, err := b.Publish(Event{Type: "raw", Data: json.RawMessage("{\n  \"a\": \"b\\n\\ndata: x\",\r\n  \"id\": 9\n}\n")})
	if err != nil {
		t.Fatal(err)
	}
	sig := "\n\ndata: x"
	if err := b.Signal("sig", sig); err != nil {
		t.Fatal(err)
	}

	for _, p := range pubs {
		ev := s.skipToEvent()
		if ev.Type != "t" || ev.ID != strconv.FormatUint(p.f.ID(), 10) || strings.ContainsAny(ev.Data, "\r\n") {
			t.Fatalf("event %d arrived as type %q id %q data %q", p.f.ID(), ev.Type, ev.ID, ev.Data)
		}
		var env struct {
			ID   uint64         `json:"id"`
			Data any            `json:"data"`
			Meta map[string]any `json:"_meta"`
			Orig string         `json:"originatorClientId"`
		}
		if err := json.Unmarshal([]byte(ev.Data), &env); err != nil {
			t.Fatalf("event %d: %v in %q", p.f.ID(), err, ev.Data)
		}
		wantData, _ := json.Marshal(p.data)
		gotData, _ := json.Marshal(env.Data)
		if env.ID != p.f.ID() || string(gotData) != string(wantData) || env.Orig != p.orig ||
			env.Meta["note"] != p.meta["note"] || env.Meta[p.orig] != "key" || env.Meta["id"] != float64(77) {
			t.Errorf("event %d decoded to %+v, want data %s originator %q", p.f.ID(), env, wantData, p.orig)
		}
	}
	ev := s.skipToEvent()
	if ev.Type != "raw" || ev.ID != strconv.FormatUint(raw.ID(), 10) || strings.ContainsAny(ev.Data, "\r\n") ||
		!strings.Contains(ev.Data, `"data":{"a":"b\n\ndata: x","id":9}`) {
		t.Errorf("pre-encoded JSON arrived as %+v", ev)
	}
	ev = s.skipToEvent()
	var senv struct{ About string }
	if ev.Type != "sig" || ev.ID != strconv.FormatUint(raw.ID(), 10) /* the last id persists */ ||
		json.Unmarshal([]byte(ev.Data), &senv) != nil || senv.About != sig {
		t.Errorf("signal arrived as %+v", ev)
	}
}

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
		waitSubscribers(t, b, 1)
		f, err := b.Publish(Event{Type: "live"})
		if err != nil {
			t.Fatal(err)
		}
		if ev := s.skipToEvent(); ev.Type != "live" || ev.ID != strconv.FormatUint(f.ID(), 10) {
			t.Fatalf("value %d: first event %+v, want the live event %d only", i, ev, f.ID())
		}
		s.close()
		waitSubscribers(t, b, 0)
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
	waitSubscribers(t, b, 0)

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
	waitSubscribers(t, b, 1)
	if _, err := b.Publish(Event{Type: "big", Data: strings.Repeat("b", 12<<20)}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitSubscribers(t, b, 0)
	gone := time.Since(start)
	// The subscription is unregistered first; the drop is counted and the
	// diagnostic emitted right after, on the handler's goroutine.
	for deadline := time.Now().Add(5 * time.Second); diags.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
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
