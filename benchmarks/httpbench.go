package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	r3sse "github.com/r3labs/sse/v2"
	gosse "github.com/tmaxmax/go-sse"

	"github.com/ssebus/eventbus/benchmarks/internal/naive"
)

// The HTTP scenario: the same one-publisher fan-out, but every subscriber is
// an HTTP client on loopback that parses the SSE stream and checks every id.

// httpServer is what an HTTP adapter provides: a handler for GET /events, a
// publish function, how to know that n clients are subscribed, and teardown.
type httpServer struct {
	handler   http.Handler
	publish   func(seq uint64) error
	waitReady func(ctx context.Context, n int) error // nil: the response headers mean subscribed
	closeLib  func()
}

type httpFanout struct {
	newServer func(cfg config) *httpServer
	cfg       config

	srv      *httpServer
	hs       *http.Server
	ln       net.Listener
	handlers sync.WaitGroup
	clients  sync.WaitGroup
	cancel   context.CancelFunc
	tr       *http.Transport
}

func (f *httpFanout) start(sinks []*sink) error {
	f.srv = f.newServer(f.cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	f.ln = ln
	f.hs = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			f.handlers.Add(1)
			defer f.handlers.Done()
			f.srv.handler.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = f.hs.Serve(ln) }()

	f.tr = &http.Transport{
		MaxIdleConns:        len(sinks) + 1,
		MaxIdleConnsPerHost: len(sinks) + 1,
		DisableCompression:  true,
	}
	client := &http.Client{Transport: f.tr}
	// stream= is r3labs's stream name, maxQueued= is eventbus's per-client
	// frame cap; every other handler ignores both.
	url := "http://" + ln.Addr().String() + "/events?stream=bench&maxQueued=" + strconv.Itoa(f.cfg.queue)
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel

	var headers sync.WaitGroup
	headers.Add(len(sinks))
	var startErr atomic.Value
	for _, s := range sinks {
		f.clients.Add(1)
		go func() {
			defer f.clients.Done()
			var once sync.Once
			signal := func() { once.Do(headers.Done) }
			defer signal()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				startErr.Store(err)
				s.end("error")
				return
			}
			req.Header.Set("Accept", "text/event-stream")
			resp, err := client.Do(req)
			if err != nil {
				if ctx.Err() == nil {
					startErr.Store(err)
				}
				s.end("error")
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
				startErr.Store(fmt.Errorf("status %d: %s", resp.StatusCode, b))
				s.end("error")
				return
			}
			signal()
			s.end(readSSE(resp.Body, s))
		}()
	}
	if f.srv.waitReady != nil {
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		err := f.srv.waitReady(wctx, len(sinks))
		wcancel()
		if err != nil {
			return fmt.Errorf("waiting for %d subscribers: %w", len(sinks), err)
		}
	} else {
		headers.Wait()
	}
	if err, ok := startErr.Load().(error); ok {
		return err
	}
	return nil
}

// readSSE parses an SSE stream and reports every event id to s. It returns
// why the stream ended.
//
// Unlike the tests, which all read SSE with sseclient.Parser, it is written
// by hand on purpose: every client of the HTTP scenario runs it in the
// process being measured. The Parser allocates a data buffer and the type
// and id strings of each event (3 allocations, about 2x the time of readSSE
// per event: BenchmarkReadSSE); with it the scenario measured up to 1.6x
// the ns/delivery (1.24-1.61x for eventbus.Handler) and 49-772 allocs/event
// instead of 1-5, the clients' cost swamping the server's (10 interleaved
// rounds, 16 and 256 clients). readSSE allocates nothing per event. It
// takes LF or CRLF line ends (every server measured writes LF), not a lone
// CR; TestReadSSE checks that it reads what the Parser reads.
func readSSE(body io.Reader, s *sink) string {
	br := bufio.NewReaderSize(body, 64<<10)
	var (
		id      uint64
		hasID   bool
		evType  []byte
		evicted bool
		errored bool
	)
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				return "protocol: line too long"
			}
			break
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 { // dispatch
			switch {
			case hasID:
				s.see(id)
			case string(evType) == "client_evicted":
				evicted = true
			case string(evType) == "slow_client_warning":
				s.warnings++
			case string(evType) == "stream_error":
				errored = true
			}
			hasID, evType = false, evType[:0]
			continue
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
		switch string(name) {
		case "id":
			n, err := strconv.ParseUint(string(value), 10, 64)
			id, hasID = n, err == nil
		case "event":
			evType = append(evType[:0], value...)
		}
	}
	return endReason(evicted, errored)
}

// endReason is why a stream read to its end ended: the library evicted the
// client or ended the stream with an error, or it just closed.
func endReason(evicted, errored bool) string {
	switch {
	case evicted:
		return "evicted"
	case errored:
		return "stream_error"
	}
	return "closed"
}

func (f *httpFanout) publish(seq uint64) error { return f.srv.publish(seq) }

func (f *httpFanout) stop() {
	f.cancel()
	f.clients.Wait()
	// Let the handlers notice the disconnects before the library goes away
	// (r3labs's handler goroutine would otherwise block forever on a closed stream).
	waitGroupWithin(&f.handlers, 3*time.Second)
	_ = f.hs.Close()
	f.srv.closeLib()
	waitGroupWithin(&f.handlers, 3*time.Second)
	f.tr.CloseIdleConnections()
}

func waitGroupWithin(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

func appendSSEFrame(dst []byte, m naiveMsg) []byte {
	dst = append(dst, "id: "...)
	dst = strconv.AppendUint(dst, m.ID, 10)
	dst = append(dst, "\nevent: bench\ndata: "...)
	dst = append(dst, m.Data...)
	return append(dst, "\n\n"...)
}

// naiveHTTP: the naive broker behind naive.Handler, which either writes
// every ready frame and flushes once per batch, or flushes after every
// event; the frame is built in the handler, per delivery.
func naiveHTTP(flushEach bool) func(cfg config) *httpServer {
	return func(cfg config) *httpServer {
		b := &naive.Broker{}
		return &httpServer{
			handler: naive.Handler(naive.HandlerOptions{
				Broker:    func(*http.Request) *naive.Broker { return b },
				Queue:     cfg.queue,
				Frame:     appendSSEFrame,
				FlushEach: flushEach,
			}),
			publish: func(seq uint64) error {
				b.Publish(naiveMsg{ID: seq, Data: newEnvelope(seq)})
				return nil
			},
			closeLib: b.Close,
		}
	}
}

// r3labsHTTP: r3labs/sse/v2 Server.ServeHTTP as is (AutoReplay off, see the
// in-process adapter).
func r3labsHTTP(config) *httpServer {
	srv := newR3Server()
	return &httpServer{
		handler: srv,
		publish: func(seq uint64) error {
			srv.Publish("bench", &r3sse.Event{
				ID:    strconv.AppendUint(make([]byte, 0, 8), seq, 10),
				Event: []byte("bench"),
				Data:  newEnvelope(seq),
			})
			return nil
		},
		closeLib: srv.Close,
	}
}

// gosseHTTP: go-sse's Server (Joe provider) as is. go-sse sends the response
// headers only with the first event, so readiness comes from Joe (Replay).
func gosseHTTP(config) *httpServer {
	var registered atomic.Int64
	srv := &gosse.Server{Provider: &gosse.Joe{Replayer: joeCounter{&registered}}}
	return &httpServer{
		handler: srv,
		publish: func(seq uint64) error {
			m := &gosse.Message{ID: gosse.ID(strconv.FormatUint(seq, 10)), Type: gosse.Type("bench")}
			m.AppendData(string(newEnvelope(seq)))
			return srv.Publish(m)
		},
		waitReady: func(ctx context.Context, n int) error {
			return pollUntil(ctx, func() bool { return registered.Load() >= int64(n) })
		},
		closeLib: func() { _ = srv.Shutdown(context.Background()) },
	}
}

// joeCounter counts subscriptions Joe has taken (see joeReady).
type joeCounter struct{ n *atomic.Int64 }

func (j joeCounter) Put(m *gosse.Message, _ []string) (*gosse.Message, error) { return m, nil }
func (j joeCounter) Replay(gosse.Subscription) error                          { j.n.Add(1); return nil }

func pollUntil(ctx context.Context, cond func() bool) error {
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}
