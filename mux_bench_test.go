//go:build unix

package eventbus

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// BenchmarkMux compares 32 sessions on one multiplexed stream with the
// same 32 sessions on 32 single streams, over loopback HTTP/1.1, with the
// same events: one op is one event, published to the sessions in turn, and
// delivered to a client that has read it. The publisher waits for the
// clients every window events: 32 (one event per session, then wait: the
// streams are mostly idle, every event costs a wake-up) and 1024 (bursts).
//
// cpu-ns/event is the process's CPU time (user and system, getrusage)
// per event: the publisher, the server's stream goroutines and the
// clients' readers together, so it counts what a daemon and a browser on
// one machine pay; ns/op is the wall time. wire-B/event is what the
// clients read per event: on the multiplexed stream, the composite cursor
// (2+24×32 bytes) replaces the id line, and each envelope names its
// session. allocs/op counts the whole process.
func BenchmarkMux(b *testing.B) {
	for _, window := range []int{32, 1024} {
		for _, mux := range []bool{false, true} {
			name := "streams=single32"
			if mux {
				name = "streams=mux32"
			}
			b.Run("window="+strconv.Itoa(window)+"/"+name, func(b *testing.B) { benchMux(b, mux, window) })
		}
	}
}

func benchMux(b *testing.B, mux bool, window int) {
	const sessions = 32
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
	single := &Handler{Logger: logger, Lookup: func(r *http.Request, _ string) (*EventBus, error) { return buses[r.PathValue("id")], nil }}
	routes := http.NewServeMux()
	routes.Handle("GET /session/{id}/events", single)
	routes.Handle("GET /events", &MuxHandler{Handler: withLookup(single, busesByID(buses))})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: routes}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	tr := &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: sessions}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	paths := []string{muxPath(ids)}
	if !mux {
		paths = paths[:0]
		for _, id := range ids {
			paths = append(paths, "/session/"+id+"/events")
		}
	}
	counter := newFrameCounter()
	readers := make(chan struct{}, len(paths))
	for _, p := range paths {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ln.Addr().String()+p, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			defer func() { readers <- struct{}{} }()
			defer resp.Body.Close()
			counter.read(resp.Body)
		}()
	}
	for _, bus := range order {
		if bus.SubscriberCount() != 1 {
			b.Fatal("a session has no subscriber")
		}
	}
	ev := Event{Type: "tick", Data: json.RawMessage(`{"n":1,"at":"2024-06-21T20:00:00.000Z"}`)}
	cpu0, wire0 := processCPU(), counter.bytes.Load()
	var i int64
	for b.Loop() {
		if _, err := order[i%sessions].Publish(ev); err != nil {
			b.Fatal(err)
		}
		i++
		if i%int64(window) == 0 {
			counter.await(i)
		}
	}
	if !counter.awaitFor(i, 10*time.Second) {
		b.Fatalf("%d of %d events delivered", counter.frames.Load(), i)
	}
	b.ReportMetric(float64(processCPU()-cpu0)/float64(i), "cpu-ns/event")
	b.ReportMetric(float64(counter.bytes.Load()-wire0)/float64(i), "wire-B/event")
	cancel()
	for range paths {
		<-readers
	}
}

// processCPU is the process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
