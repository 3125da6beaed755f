//go:build unix

package eventbus

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkStreamEngine is BenchmarkHandler and BenchmarkMux without the
// network: the stream's SSE response is written to an in-memory writer
// that counts the frames it is given (its Write, flush and write deadline
// do nothing else), so an op is one event from Publish to the stream's
// write of it, and what is measured is Publish, the stream loop and the SSE
// encoding, not the kernel's loopback or a client's parsing. It uses the
// exported API only, so it runs unchanged on the library before the one
// stream engine (issue 34) and after it. streams=single is a Handler's
// stream of one session; streams=mux32 a MuxHandler's stream of 32
// sessions, the events published to them in turn. window is how many
// events the publisher may have in flight: 1 (every event its own batch:
// the costs per batch) and 1024 (bursts: the costs per frame).
// cpu-ns/event is the process's CPU time per event (getrusage): the
// publisher and the stream's goroutine; writes/event the Writes the stream
// made (one per batch). mallocs/event and heap-B/event are the process's
// allocations per event from runtime.MemStats, as fractions (allocs/op and
// B/op are rounded down to whole numbers, which would hide an allocation
// per batch of several events): Publish's own are 2 per event, so what is
// above 2 is the stream's.
func BenchmarkStreamEngine(b *testing.B) {
	for _, window := range []int{1, 1024} {
		for _, sessions := range []int{1, 32} {
			name := "streams=single"
			if sessions > 1 {
				name = "streams=mux" + strconv.Itoa(sessions)
			}
			b.Run("window="+strconv.Itoa(window)+"/"+name, func(b *testing.B) { benchStreamEngine(b, sessions, window) })
		}
	}
}

func benchStreamEngine(b *testing.B, sessions, window int) {
	logger := slog.New(slog.DiscardHandler)
	buses := make(map[string]*EventBus, sessions)
	ids := make([]string, sessions)
	order := make([]*EventBus, sessions)
	for i := range ids {
		bus, err := New(Options{MaxQueued: 1 << 16, MaxQueuedBytes: 1 << 30, Logger: logger})
		if err != nil {
			b.Fatal(err)
		}
		defer bus.Close()
		ids[i] = "session-" + strconv.Itoa(i)
		buses[ids[i]], order[i] = bus, bus
	}
	single := &Handler{Logger: logger, Lookup: func(*http.Request, string) (*EventBus, error) { return order[0], nil }}
	var h http.Handler = single
	path := "/session/" + ids[0] + "/events"
	if sessions > 1 {
		h = &MuxHandler{Handler: withLookup(single, busesByID(buses))}
		path = muxPath(ids)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := httptest.NewRequest(http.MethodGet, path, nil).WithContext(ctx)
	r.SetPathValue("id", ids[0])
	w := &frameSinkWriter{counter: newFrameCounter(), header: http.Header{}}
	served := make(chan struct{})
	go func() {
		defer close(served)
		h.ServeHTTP(w, r)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for _, bus := range order {
		for bus.SubscriberCount() != 1 {
			if time.Now().After(deadline) {
				b.Fatal("a session has no subscriber")
			}
			time.Sleep(time.Millisecond)
		}
	}
	counter := w.counter
	ev := Event{Type: "tick", Data: json.RawMessage(`{"n":1,"at":"2024-06-21T20:00:00.000Z"}`)}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cpu0 := processCPU()
	var i int64
	for b.Loop() {
		if _, err := order[i%int64(sessions)].Publish(ev); err != nil {
			b.Fatal(err)
		}
		i++
		if i%int64(window) == 0 {
			counter.await(i)
		}
	}
	if !counter.awaitFor(i, 10*time.Second) {
		b.Fatalf("%d of %d events written", counter.frames.Load(), i)
	}
	cpu := processCPU() - cpu0
	runtime.ReadMemStats(&m1)
	b.ReportMetric(float64(cpu)/float64(i), "cpu-ns/event")
	b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/float64(i), "mallocs/event")
	b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/float64(i), "heap-B/event")
	b.ReportMetric(float64(w.writes.Load())/float64(i), "writes/event")
	cancel()
	<-served
}

// frameSinkWriter is an http.ResponseWriter in memory for
// BenchmarkStreamEngine: it counts the frames written (blank lines, as
// frameCounter.read does) and the Writes, and supports Flush and write
// deadlines as no-ops. Its Write is called from the stream's goroutine
// only.
type frameSinkWriter struct {
	counter *frameCounter
	header  http.Header
	prev    byte
	writes  atomic.Int64
}

func (w *frameSinkWriter) Header() http.Header { return w.header }

func (w *frameSinkWriter) WriteHeader(int) {}

func (w *frameSinkWriter) Write(p []byte) (int, error) {
	w.writes.Add(1)
	k := int64(0)
	for _, x := range p {
		if x == '\n' && w.prev == '\n' {
			k++
		}
		w.prev = x
	}
	c := w.counter
	if k > 0 && c.frames.Add(k) >= c.want.Load() {
		select {
		case c.reached <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

func (w *frameSinkWriter) Flush() {}

func (w *frameSinkWriter) FlushError() error { return nil }

func (w *frameSinkWriter) SetWriteDeadline(time.Time) error { return nil }
