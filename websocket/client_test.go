package websocket_test

// sseclient's Client over this module's transport, through Dialer, on the
// network of the bubble: WebSocket first, SSE when the WebSocket route is
// not there, one cursor for both.

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ssebus/eventbus/sseclient"
	"github.com/ssebus/eventbus/websocket"
)

// clientLog is what a Client reported.
type clientLog struct {
	mu         sync.Mutex
	events     map[string][]uint64
	transports []string
}

func (l *clientLog) attach(c *sseclient.Client) {
	c.OnEvent = func(e sseclient.Event) {
		l.mu.Lock()
		l.events[e.Session] = append(l.events[e.Session], e.ID)
		l.mu.Unlock()
	}
	c.OnState = func(s sseclient.StateChange) {
		if s.State == sseclient.StateOpen {
			l.mu.Lock()
			l.transports = append(l.transports, s.Transport)
			l.mu.Unlock()
		}
	}
}

func (l *clientLog) snap() (map[string][]uint64, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ev := map[string][]uint64{}
	for k, v := range l.events {
		ev[k] = slices.Clone(v)
	}
	return ev, slices.Clone(l.transports)
}

// runClient runs c until the test ends.
func runClient(t *testing.T, c *sseclient.Client) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

func TestGoClientOverWebSocket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		e.session("a")
		e.session("b")
		e.publish("a", "n", 1)
		l := &clientLog{events: map[string][]uint64{}}
		c := &sseclient.Client{
			URL: "http://eventbus.test/events", Sessions: []string{"a", "b"}, ResumeFrom: "0",
			HTTPClient: e.client, WebSocket: &websocket.Dialer{HTTPClient: e.client},
			WebSocketURL: "ws://eventbus.test/ws",
		}
		l.attach(c)
		runClient(t, c)
		synctest.Wait()
		e.publish("b", "n", 1)
		e.publish("a", "n", 2)
		synctest.Wait()
		ev, tr := l.snap()
		if !slices.Equal(ev["a"], []uint64{1, 2}) || !slices.Equal(ev["b"], []uint64{1}) || !slices.Equal(tr, []string{sseclient.TransportWebSocket}) {
			t.Fatalf("events %v on %v", ev, tr)
		}
		// Sessions changed on the open socket: no reconnect.
		e.session("c")
		if err := c.AddSession("c"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		e.publish("c", "n", 1)
		synctest.Wait()
		if ev, tr := l.snap(); !slices.Equal(ev["c"], []uint64{1}) || len(tr) != 1 {
			t.Fatalf("after AddSession: events %v on %v", ev, tr)
		}
		if got := c.LastEventID(); got == "" || got == "0" {
			t.Fatalf("LastEventID %q", got)
		}
	})
}

// A daemon without the WebSocket route answers its handshake with a plain
// 404 page, no JSON error of eventbus's: the client falls back to SSE and
// loses nothing; once the route is there, WebSocketRetry later, it goes
// back, with the cursor SSE left, and sees nothing twice.
func TestGoClientFallsBackAndBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		e.wsDown.Store(true)
		e.session("a")
		e.publish("a", "n", 1)
		l := &clientLog{events: map[string][]uint64{}}
		c := &sseclient.Client{
			URL: "http://eventbus.test/events", Sessions: []string{"a"}, ResumeFrom: "0",
			HTTPClient: e.client, WebSocket: &websocket.Dialer{HTTPClient: e.client},
			WebSocketURL:   "ws://eventbus.test/ws",
			WebSocketRetry: 30 * time.Second,
		}
		l.attach(c)
		runClient(t, c)
		synctest.Wait()
		e.publish("a", "n", 2)
		synctest.Wait()
		if ev, tr := l.snap(); !slices.Equal(ev["a"], []uint64{1, 2}) || !slices.Equal(tr, []string{sseclient.TransportSSE}) {
			t.Fatalf("events %v on %v, want 1, 2 over SSE", ev, tr)
		}
		e.wsDown.Store(false)
		time.Sleep(30 * time.Second)
		synctest.Wait()
		e.publish("a", "n", 3)
		synctest.Wait()
		if ev, tr := l.snap(); !slices.Equal(ev["a"], []uint64{1, 2, 3}) || !slices.Equal(tr, []string{sseclient.TransportSSE, sseclient.TransportWebSocket}) {
			t.Fatalf("events %v on %v, want 1, 2, 3 once each, back on the WebSocket", ev, tr)
		}
	})
}
