package websocket_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ws "github.com/coder/websocket"
	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/websocket"
)

// BenchmarkTransport compares the WebSocket transport with the SSE
// multiplexed route (MuxHandler) in the same run: one stream of 4
// sessions over loopback HTTP/1.1, one op one event, published to the
// sessions in turn and counted once its client has read it. The publisher
// waits for the client every window events: window=1 makes every event a
// batch of its own (the cost per batch: a wake-up, a message, a cursor
// line), window=256 makes batches of up to 256 frames (the cost per
// frame). size=big publishes events of 128 KiB, which both transports
// write from their shared bytes.
//
// The clients read the raw connection into one buffer and count the frame
// lines ({"session":" opens each, on either wire) without decoding or
// allocating, so allocs/op is the server's (the publish, the stream and
// its transport) per event: at window=1, per batch; at window=256, per
// frame plus 1/256 of a batch's. frames/s is events delivered per second
// of wall time; wire-B/frame what the client read per event.
func BenchmarkTransport(b *testing.B) {
	for _, c := range []struct {
		window int
		size   string
	}{{1, "small"}, {256, "small"}, {8, "big"}} {
		for _, transport := range []string{"ws", "sse"} {
			name := "window=" + strconv.Itoa(c.window) + "/size=" + c.size + "/transport=" + transport
			b.Run(name, func(b *testing.B) { benchTransport(b, transport, c.window, c.size == "big") })
		}
	}
}

func benchTransport(b *testing.B, transport string, window int, big bool) {
	const sessions = 4
	logger := slog.New(slog.DiscardHandler)
	buses := map[string]*eventbus.EventBus{}
	order := make([]*eventbus.EventBus, sessions)
	query := make([]string, sessions)
	for i := range sessions {
		bus, err := eventbus.New(eventbus.Options{MaxQueued: 1 << 16, MaxQueuedBytes: 1 << 30, Logger: logger})
		if err != nil {
			b.Fatal(err)
		}
		defer bus.Close()
		id := "session-" + strconv.Itoa(i)
		buses[id], order[i], query[i] = bus, bus, "session="+id
	}
	streams := &eventbus.Handler{Logger: logger, Lookup: func(_ *http.Request, id string) (*eventbus.EventBus, error) {
		if bus := buses[id]; bus != nil {
			return bus, nil
		}
		return nil, eventbus.ErrSessionNotFound
	}}
	mux := &eventbus.MuxHandler{Handler: streams}
	routes := http.NewServeMux()
	routes.Handle("GET /events", mux)
	routes.Handle("GET /ws", &websocket.Handler{Mux: mux})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: routes}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	req := "GET /events?" + strings.Join(query, "&") + " HTTP/1.1\r\nHost: bench\r\n\r\n"
	if transport == "ws" {
		req = "GET /ws?" + strings.Join(query, "&") + " HTTP/1.1\r\nHost: bench\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
	}
	if _, err := io.WriteString(conn, req); err != nil {
		b.Fatal(err)
	}
	br := bufio.NewReaderSize(conn, 64<<10)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || (resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusSwitchingProtocols) {
		b.Fatalf("%v %v", resp, err)
	}
	counter := &frameCounter{reached: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		counter.read(br) // the raw connection: SSE's chunks and WebSocket's frames alike
	}()
	for _, bus := range order {
		for bus.SubscriberCount() != 1 {
			time.Sleep(time.Millisecond)
		}
	}

	data := json.RawMessage(`{"n":1,"at":"2024-06-21T20:00:00.000Z"}`)
	if big {
		data = json.RawMessage(`"` + strings.Repeat("x", 128<<10) + `"`)
	}
	ev := eventbus.Event{Type: "tick", Data: data}
	wire0 := counter.bytes.Load()
	start := time.Now()
	var i int64
	b.ReportAllocs()
	for b.Loop() {
		if _, err := order[i%sessions].Publish(ev); err != nil {
			b.Fatal(err)
		}
		i++
		if i%int64(window) == 0 {
			counter.await(i)
		}
	}
	counter.await(i)
	elapsed := time.Since(start)
	b.ReportMetric(float64(i)/elapsed.Seconds(), "frames/s")
	b.ReportMetric(float64(counter.bytes.Load()-wire0)/float64(i), "wire-B/frame")
	_ = conn.Close()
	<-done
}

// frameCounter counts the frame lines a client reads, without allocating.
type frameCounter struct {
	frames, bytes atomic.Int64
	target        atomic.Int64
	reached       chan struct{}
	timeout       *time.Timer // await's, reused: time.After would allocate per wait
}

// framePrefix opens every frame line of the multiplexed wire.
const framePrefix = `{"session":"`

// read counts the frames of r until it fails.
func (c *frameCounter) read(r io.Reader) {
	buf := make([]byte, 64<<10)
	matched := 0
	for {
		n, err := r.Read(buf)
		found := 0
		for _, x := range buf[:n] {
			switch {
			case x == framePrefix[matched]:
				matched++
				if matched == len(framePrefix) {
					found++
					matched = 0
				}
			case x == framePrefix[0]:
				matched = 1
			default:
				matched = 0
			}
		}
		c.bytes.Add(int64(n))
		if found > 0 {
			total := c.frames.Add(int64(found))
			if t := c.target.Load(); t > 0 && total >= t && c.target.CompareAndSwap(t, 0) {
				c.reached <- struct{}{}
			}
		}
		if err != nil {
			return
		}
	}
}

// await waits until n frames were read.
func (c *frameCounter) await(n int64) {
	c.target.Store(n)
	if c.frames.Load() >= n && c.target.CompareAndSwap(n, 0) {
		return
	}
	if c.timeout == nil {
		c.timeout = time.NewTimer(10 * time.Second)
	} else {
		c.timeout.Reset(10 * time.Second)
	}
	select {
	case <-c.reached:
		c.timeout.Stop()
	case <-c.timeout.C:
		panic("frames not delivered: " + strconv.FormatInt(c.frames.Load(), 10) + " of " + strconv.FormatInt(n, 10))
	}
}

// BenchmarkCoderWrite is why the transport writes its messages with a
// context that has no Done channel and bounds them with a watchdog of its
// own: coder's Conn arms a context.AfterFunc for every frame written with a
// context that can be cancelled (4 allocations a frame), and none for one
// that cannot. One op is one 200-byte text message to a client that
// drains the connection, over loopback.
func BenchmarkCoderWrite(b *testing.B) {
	accepted := make(chan *ws.Conn, 1)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := ws.Accept(w, r, nil)
		if err != nil {
			return
		}
		accepted <- c
		<-release
	}))
	defer srv.Close()
	defer close(release)
	client, _, err := ws.Dial(context.Background(), "ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer client.CloseNow()
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			_, r, err := client.Reader(context.Background())
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, r)
		}
	}()
	c := <-accepted
	defer func() { _ = c.CloseNow(); <-drained }()
	p := []byte(strings.Repeat("x", 200))
	cancellable, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
	}{{"ctx=background", context.Background()}, {"ctx=cancellable", cancellable}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := c.Write(tc.ctx, ws.MessageText, p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
