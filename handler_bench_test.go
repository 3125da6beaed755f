package eventbus

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkHandler measures one event from Publish to a client that has
// read it, through the Handler over loopback TCP, on HTTP/1.1 and on h2c,
// with the SPEC's id lines and with EpochIDs. One op is one event; the
// publisher waits for the client every 64 events, so delivery is inside the
// timed loop. allocs/op counts the whole process: Publish's own 2, the
// server's writes and the client's reads; EpochIDs must add none. The
// grant case has an Authorize whose Grant has a subject and a lifetime
// (a revocable, bounded stream): that must add nothing per frame either.
func BenchmarkHandler(b *testing.B) {
	for _, proto := range []string{"http1", "h2c"} {
		for _, epochIDs := range []bool{false, true} {
			ids := "plain"
			if epochIDs {
				ids = "epoch"
			}
			b.Run("proto="+proto+"/ids="+ids, func(b *testing.B) {
				benchHandler(b, proto == "h2c", epochIDs, false)
			})
		}
	}
	b.Run("proto=http1/ids=plain/grant", func(b *testing.B) { benchHandler(b, false, false, true) })
}

func benchHandler(b *testing.B, h2c, epochIDs, grant bool) {
	bus, err := New(Options{MaxQueued: 1 << 16, MaxQueuedBytes: 1 << 30, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer bus.Close()
	h := &Handler{
		Lookup:  func(*http.Request, string) (*EventBus, error) { return bus, nil },
		Logger:  slog.New(slog.DiscardHandler),
		BareIDs: !epochIDs,
	}
	if grant {
		h.Authorize = func(*http.Request, string, *EventBus) (Grant, error) {
			return Grant{Subject: "bench", Expires: time.Now().Add(time.Hour)}, nil
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	var p http.Protocols
	p.SetHTTP1(!h2c)
	p.SetUnencryptedHTTP2(h2c)
	srv := &http.Server{Handler: h, Protocols: &p}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	tr := &http.Transport{Protocols: &p}
	defer tr.CloseIdleConnections()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ln.Addr().String()+"/", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()

	counter := newFrameCounter()
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		counter.read(resp.Body)
	}()
	if bus.SubscriberCount() != 1 { // RoundTrip returns with the headers, after Subscribe
		b.Fatal("no subscriber")
	}
	ev := Event{Type: "tick", Data: json.RawMessage(`{"n":1,"at":"2024-06-21T20:00:00.000Z"}`)}
	const window = 64
	var i int64
	for b.Loop() {
		if _, err := bus.Publish(ev); err != nil {
			b.Fatal(err)
		}
		i++
		if i%window == 0 {
			counter.await(i)
		}
	}
	cancel()
	<-readDone
}

// frameCounter counts the frames its readers read (blank lines, "\n\n",
// possibly split between two reads) and their bytes, and wakes await when
// the frames reach what it waits for. Its methods are safe for concurrent
// use, one read per body.
type frameCounter struct {
	frames, bytes, want atomic.Int64
	reached             chan struct{}
}

func newFrameCounter() *frameCounter { return &frameCounter{reached: make(chan struct{}, 1)} }

// read counts what body holds, until it ends or fails.
func (c *frameCounter) read(body io.Reader) {
	buf := make([]byte, 64<<10)
	prev := byte(0)
	for {
		n, err := body.Read(buf)
		k := int64(0)
		for _, x := range buf[:n] {
			if x == '\n' && prev == '\n' {
				k++
			}
			prev = x
		}
		c.bytes.Add(int64(n))
		if k > 0 && c.frames.Add(k) >= c.want.Load() {
			select {
			case c.reached <- struct{}{}:
			default:
			}
		}
		if err != nil {
			return
		}
	}
}

// await waits until n frames were read in all.
func (c *frameCounter) await(n int64) { c.awaitFor(n, 0) }

// awaitFor is await for at most timeout (0: no bound); it reports whether
// the frames were read.
func (c *frameCounter) awaitFor(n int64, timeout time.Duration) bool {
	c.want.Store(n)
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	for c.frames.Load() < n {
		select {
		case <-c.reached:
		case <-expired:
			return false
		}
	}
	return true
}
