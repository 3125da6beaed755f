package backplanetest

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/sseclient"
)

// maxEventBytes bounds one event a Stream reads: twice the bus's default
// MaxEventBytes, with room for the framing.
const maxEventBytes = 32<<20 + 64<<10

// Frame is one SSE event as a client sees it, read by sseclient.Parser.
type Frame struct {
	ID    uint64 // the number of the event's id field; 0: no id field
	Event string // the event type ("message" when the frame has no event field)
	Data  string // the data lines, joined by LF
}

// Field returns the value at path in the frame's JSON data (nil when
// absent); it fails the test when the data is not JSON.
func (f Frame) Field(t testing.TB, path ...string) any {
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

// Num returns a numeric field of the frame's envelope, -1 when absent.
func (f Frame) Num(t testing.TB, path ...string) int64 {
	t.Helper()
	v, ok := f.Field(t, path...).(float64)
	if !ok {
		return -1
	}
	return int64(v)
}

// Str returns a string field of the frame's envelope, "" when absent.
func (f Frame) Str(t testing.TB, path ...string) string {
	t.Helper()
	s, _ := f.Field(t, path...).(string)
	return s
}

// Stream is an open SSE stream read by one goroutine, which ends when the
// stream ends or Close is called (Open registers Close as a cleanup).
type Stream struct {
	t testing.TB
	// Epoch is the response's Event-Epoch header.
	Epoch  string
	frames chan Frame
	cancel context.CancelFunc
	done   chan struct{}
}

// Open sends GET url with the given headers (Last-Event-ID, Event-Epoch)
// through client and returns once the response headers are in, which is
// after the subscription is registered. A status other than 200 fails the
// test.
func Open(t testing.TB, client *http.Client, url string, header map[string]string) *Stream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("GET %s: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel()
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	s := &Stream{t: t, Epoch: resp.Header.Get("Event-Epoch"), frames: make(chan Frame, 1<<16), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer close(s.frames)
		defer resp.Body.Close()
		p := sseclient.NewParser(resp.Body)
		p.MaxEventBytes = maxEventBytes
		for {
			m, err := p.Next()
			if err != nil {
				return // the end of the stream, Close, or a framing error
			}
			if m.Kind != sseclient.KindEvent {
				continue // comments (heartbeats) and retry fields
			}
			f := Frame{Event: m.Type, Data: string(m.Data)}
			if m.HasID {
				// "N", or "<epoch>:<N>" from a daemon with -epoch-ids.
				_, n, found := strings.Cut(m.ID, ":")
				if !found {
					n = m.ID
				}
				f.ID, _ = strconv.ParseUint(n, 10, 64)
			}
			select {
			case s.frames <- f:
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(s.Close)
	return s
}

// Next returns the next frame; it fails the test after d, or when the
// stream ends.
func (s *Stream) Next(d time.Duration) Frame {
	s.t.Helper()
	select {
	case f, ok := <-s.frames:
		if !ok {
			s.t.Fatalf("the stream ended, want a frame")
		}
		return f
	case <-time.After(d):
		s.t.Fatalf("no frame within %v", d)
	}
	return Frame{}
}

// Events returns the next n frames, all of which must carry an id, within
// d. A slow_client_warning among them is skipped: on a loaded machine a
// stream's queue can pass 75% between two reads of a test that publishes
// first and reads after, which is a warning and no loss (an eviction that
// followed would still fail the ids).
func (s *Stream) Events(n int, d time.Duration) []Frame {
	s.t.Helper()
	var out []Frame
	deadline := time.Now().Add(d)
	for len(out) < n {
		f := s.Next(time.Until(deadline))
		if f.ID == 0 && f.Event == eventbus.TypeSlowClientWarning {
			continue
		}
		if f.ID == 0 {
			s.t.Fatalf("unexpected %s frame %s after %d events", f.Event, f.Data, len(out))
		}
		out = append(out, f)
	}
	return out
}

// Ended waits until the stream ends, returning the frames it still got.
func (s *Stream) Ended(d time.Duration) []Frame {
	s.t.Helper()
	var out []Frame
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

// Quiet checks that nothing arrives for d.
func (s *Stream) Quiet(d time.Duration) {
	s.t.Helper()
	select {
	case f, ok := <-s.frames:
		if ok {
			s.t.Fatalf("unexpected frame %+v", f)
		}
	case <-time.After(d):
	}
}

// EndedUnavailable checks that the stream ends within d with exactly one
// frame, a stream_error of errorKind unavailable (the backplane could not
// be reached past its bound).
func (s *Stream) EndedUnavailable(d time.Duration) {
	s.t.Helper()
	if f := s.endedWith(d, eventbus.ErrorKindUnavailable); f.Num(s.t, "data", "retryAfter") != -1 {
		s.t.Fatalf("a stream_error unavailable with a retryAfter: %s", f.Data)
	}
}

// EndedShutdown checks that the stream ends within d with exactly one
// frame, a stream_error of errorKind shutdown carrying retryAfter (the
// backplane was closed: its replica goes away).
func (s *Stream) EndedShutdown(d, retryAfter time.Duration) {
	s.t.Helper()
	if f := s.endedWith(d, eventbus.ErrorKindShutdown); f.Num(s.t, "data", "retryAfter") != retryAfter.Milliseconds() {
		s.t.Fatalf("the shutdown frame %s, want retryAfter %d", f.Data, retryAfter.Milliseconds())
	}
}

// endedWith checks that the stream ends within d with exactly one frame,
// a stream_error of errorKind kind, and returns it.
func (s *Stream) endedWith(d time.Duration, kind string) Frame {
	s.t.Helper()
	rest := s.Ended(d)
	if len(rest) != 1 || rest[0].Event != eventbus.TypeStreamError || rest[0].Str(s.t, "data", "errorKind") != kind {
		s.t.Fatalf("the stream ended with %+v, want one stream_error (%s)", rest, kind)
	}
	return rest[0]
}

// Close ends the stream and waits for its reader. Idempotent.
func (s *Stream) Close() {
	s.cancel()
	<-s.done
}

// WantIDs checks that frames carry exactly the ids from..to, in order.
func WantIDs(t testing.TB, frames []Frame, from, to uint64) {
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

// WaitFor polls cond every 5ms until it holds, failing the test after d.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
