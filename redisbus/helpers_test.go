package redisbus

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
)

// replica is one daemon replica in-process: its own Redis client,
// backplane and HTTP server.
type replica struct {
	name string
	bp   *Backplane
	srv  *httptest.Server
}

// testOptions are quick to notice changes and to close.
func testOptions(t testing.TB) Options {
	return Options{
		KeyPrefix:      "t:" + t.Name() + ":",
		ReadBlock:      100 * time.Millisecond,
		PublishTimeout: time.Second,
		IdleTimeout:    time.Hour,
	}
}

func newReplica(t testing.TB, r *redisServer, name string, opts Options) *replica {
	t.Helper()
	client := r.client(t)
	bp, err := New(client, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bp.Close() })
	mux := http.NewServeMux()
	h := bp.Handler()
	h.Heartbeat = time.Hour
	mux.Handle("GET /session/{id}/events", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &replica{name: name, bp: bp, srv: srv}
}

func (rp *replica) publish(t testing.TB, session, typ string, data any) uint64 {
	t.Helper()
	id, _, err := rp.bp.Publish(context.Background(), session, eventbus.Event{Type: typ, Data: data})
	if err != nil {
		t.Fatalf("%s: publish: %v", rp.name, err)
	}
	return id
}

// frame is one SSE frame as a client sees it.
type frame struct {
	ID    uint64 // 0: no id line
	Event string
	Data  string
}

func (f frame) field(t testing.TB, path ...string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(f.Data), &v); err != nil {
		t.Fatalf("frame data %q: %v", f.Data, err)
	}
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// num returns a numeric field of a frame's envelope, -1 when absent.
func (f frame) num(t testing.TB, path ...string) int64 {
	t.Helper()
	v, ok := f.field(t, path...).(float64)
	if !ok {
		return -1
	}
	return int64(v)
}

func (f frame) str(t testing.TB, path ...string) string {
	t.Helper()
	s, _ := f.field(t, path...).(string)
	return s
}

// sse is an open SSE stream read by one goroutine that ends when the
// stream ends or close is called.
type sse struct {
	t      testing.TB
	Epoch  string
	frames chan frame
	cancel context.CancelFunc
	done   chan struct{}
}

// openSSE opens GET /session/{session}/events on rp with the given headers
// (Last-Event-ID, Event-Epoch) and query; it returns once the response
// headers are in, which is after the subscription is registered.
func openSSE(t testing.TB, rp *replica, session string, header map[string]string, query string) *sse {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	url := rp.srv.URL + "/session/" + session + "/events"
	if query != "" {
		url += "?" + query
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := rp.srv.Client().Do(req)
	if err != nil {
		cancel()
		t.Fatalf("%s: GET %s: %v", rp.name, url, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel()
		t.Fatalf("%s: GET %s: %s", rp.name, url, resp.Status)
	}
	s := &sse{t: t, Epoch: resp.Header.Get("Event-Epoch"), frames: make(chan frame, 1<<16), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer close(s.frames)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 32<<20)
		var f frame
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if f.Event != "" || f.Data != "" {
					select {
					case s.frames <- f:
					case <-ctx.Done():
						return
					}
				}
				f = frame{}
			case strings.HasPrefix(line, "id: "):
				f.ID, _ = strconv.ParseUint(line[4:], 10, 64)
			case strings.HasPrefix(line, "event: "):
				f.Event = line[7:]
			case strings.HasPrefix(line, "data: "):
				f.Data = line[6:]
			}
		}
	}()
	t.Cleanup(s.close)
	return s
}

// next returns the next frame; it fails the test after d, or when the
// stream ends.
func (s *sse) next(d time.Duration) frame {
	s.t.Helper()
	select {
	case f, ok := <-s.frames:
		if !ok {
			s.t.Fatalf("stream ended, want a frame")
		}
		return f
	case <-time.After(d):
		s.t.Fatalf("no frame within %v", d)
	}
	return frame{}
}

// nextEvent skips synthetic frames without id except those of the given
// types, which it fails on.
func (s *sse) events(n int, d time.Duration) []frame {
	s.t.Helper()
	var out []frame
	deadline := time.Now().Add(d)
	for len(out) < n {
		f := s.next(time.Until(deadline))
		if f.ID == 0 {
			s.t.Fatalf("unexpected %s frame %s after %d events", f.Event, f.Data, len(out))
		}
		out = append(out, f)
	}
	return out
}

// ended waits until the stream ends, returning the frames it still got.
func (s *sse) ended(d time.Duration) []frame {
	s.t.Helper()
	var out []frame
	deadline := time.After(d)
	for {
		select {
		case f, ok := <-s.frames:
			if !ok {
				return out
			}
			out = append(out, f)
		case <-deadline:
			s.t.Fatalf("stream did not end within %v (got %d frames)", d, len(out))
			return nil
		}
	}
}

// quiet checks that nothing arrives for d.
func (s *sse) quiet(d time.Duration) {
	s.t.Helper()
	select {
	case f, ok := <-s.frames:
		if ok {
			s.t.Fatalf("unexpected frame %+v", f)
		}
	case <-time.After(d):
	}
}

func (s *sse) close() {
	s.cancel()
	<-s.done
}

// wantIDs checks that frames carry exactly the ids from..to, in order.
func wantIDs(t testing.TB, frames []frame, from, to uint64) {
	t.Helper()
	if uint64(len(frames)) != to-from+1 {
		t.Fatalf("got %d events, want ids %d..%d", len(frames), from, to)
	}
	for i, f := range frames {
		if want := from + uint64(i); f.ID != want {
			t.Fatalf("event %d has id %d, want %d", i, f.ID, want)
		}
	}
}

// waitFor polls cond every 5ms until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// liveReplica starts a replica with opts and one live stream of session
// "s" that has received the event with id 1.
func liveReplica(t testing.TB, r *redisServer, opts Options) (*replica, *sse) {
	t.Helper()
	a := newReplica(t, r, "A", opts)
	s := openSSE(t, a, "s", nil, "")
	a.publish(t, "s", "e", nil)
	wantIDs(t, s.events(1, wait), 1, 1)
	return a, s
}

// lateMirror publishes 20 events of session "s" on a while c's only live
// stream of it opens after the 10th, so that c's ring starts at 11; it
// returns that stream, which has read 11 to 20.
func lateMirror(t testing.TB, a, c *replica) *sse {
	t.Helper()
	for range 10 {
		a.publish(t, "s", "e", nil)
	}
	live := openSSE(t, c, "s", nil, "")
	for range 10 {
		a.publish(t, "s", "e", nil)
	}
	wantIDs(t, live.events(10, wait), 11, 20)
	return live
}

// endedUnavailable checks that s ends with exactly one frame, a
// stream_error of kind unavailable.
func (s *sse) endedUnavailable() {
	s.t.Helper()
	rest := s.ended(wait)
	if len(rest) != 1 || rest[0].Event != eventbus.TypeStreamError || rest[0].str(s.t, "data", "errorKind") != eventbus.ErrorKindUnavailable {
		s.t.Fatalf("frames at the end of the outage: %+v; want one stream_error unavailable", rest)
	}
}
