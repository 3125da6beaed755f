package sseclient_test

// The client over the WebSocket transport (Client.WebSocket), against the
// real stream engine through an in-memory dialer: the wire of
// docs/SPEC.md 6.10 written by a Transport of this test on the engine's
// exported seam (the network and github.com/coder/websocket are the
// websocket module's tests, which run this client over them too). WebSocket
// first, SSE as the fallback and back, one cursor for both, sessions added
// and removed on the open socket, the server's answers.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/sseclient"
)

// memWS is an in-memory WebSocket server of s's sessions: each dial opens
// a stream of the MuxHandler on s's Handler, whose batches a memConn
// turns into SPEC 6.10's messages.
type memWS struct {
	m     *eventbus.MuxHandler
	dials atomic.Int32
	// down makes a dial fail as a network does.
	down atomic.Bool
	// answer, when set, is the handshake's answer: a status and a JSON
	// error body with its code, as a server that serves no WebSocket there
	// gives; a proxy's page when the code is "".
	answer atomic.Pointer[handshakeAnswer]
	mu     sync.Mutex
	conns  []*memConn
}

func newMemWS(s *server) *memWS { return &memWS{m: &eventbus.MuxHandler{Handler: s.handler}} }

func (d *memWS) DialWebSocket(ctx context.Context, rawURL string, header http.Header) (sseclient.WebSocketConn, *http.Response, error) {
	d.dials.Add(1)
	switch {
	case d.down.Load():
		return nil, nil, errors.New("dial tcp: connection refused")
	case d.answer.Load() != nil:
		a := d.answer.Load()
		rec := httptest.NewRecorder()
		if a.code == "" {
			rec.WriteHeader(a.status)
			rec.WriteString("<html>bad gateway</html>")
		} else {
			rec.Header().Set("Content-Type", "application/json")
			rec.WriteHeader(a.status)
			rec.WriteString(`{"error":"no websocket here","code":"` + a.code + `"}`)
		}
		return nil, rec.Result(), fmt.Errorf("expected 101, got %d", a.status)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, nil, err
	}
	u.Scheme = "http"
	r := httptest.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	r.Header = header.Clone()
	rec := httptest.NewRecorder()
	st := d.m.OpenStream(rec, r)
	if st == nil {
		return nil, rec.Result(), errors.New("handshake refused")
	}
	c := &memConn{st: st, in: make(chan []byte, 4096), closed: make(chan struct{})}
	sctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.served = make(chan struct{})
	go func() {
		defer close(c.served)
		st.Serve(sctx, c)
		c.Close()
	}()
	d.mu.Lock()
	d.conns = append(d.conns, c)
	d.mu.Unlock()
	return c, nil, nil
}

// cutAll ends every open connection abruptly (no terminal frame).
func (d *memWS) cutAll() {
	d.mu.Lock()
	conns := d.conns
	d.conns = nil
	d.mu.Unlock()
	for _, c := range conns {
		c.Close()
		<-c.served
	}
}

// memConn is both sides of one in-memory WebSocket: the server's
// Transport and the client's WebSocketConn.
type memConn struct {
	st     *eventbus.Stream
	in     chan []byte // server to client
	closed chan struct{}
	once   sync.Once
	cancel context.CancelFunc
	served chan struct{}
	seen   []*eventbus.Member // the members the last cursor line's epochs named
}

func (c *memConn) push(b []byte) {
	select {
	case c.in <- b:
	case <-c.closed:
	}
}

// WriteBatch writes SPEC 6.10's message: each frame's multiplexed envelope
// on a line, then the cursor line when the cursor moved (with the epochs
// when the sessions changed).
func (c *memConn) WriteBatch(b *eventbus.Batch) error {
	select {
	case <-c.closed:
		return errors.New("closed")
	default:
	}
	var msg []byte
	for i := range b.Len() {
		j := b.Frame(i).JSON()
		msg = append(append(append(append(msg, j[:1]...), b.Member(i).SessionMember()...), j[1:]...), '\n')
	}
	if b.CursorMoved() {
		line := struct {
			Op     string            `json:"op"`
			Cursor string            `json:"cursor"`
			Epochs map[string]string `json:"epochs,omitempty"`
		}{"cursor", string(b.AppendCursor(nil, b.Len()-1)), nil}
		var now []*eventbus.Member
		for i := range c.st.Len() {
			now = append(now, c.st.Member(i))
		}
		if !slices.Equal(now, c.seen) {
			epochs := map[string]string{}
			for _, m := range now {
				epochs[m.Session()] = m.Epoch()
			}
			line.Epochs = epochs
			c.seen = now
		}
		j, _ := json.Marshal(line)
		msg = append(msg, j...)
	}
	c.push(bytes.TrimSuffix(msg, []byte("\n")))
	return nil
}

func (c *memConn) Keepalive() error { return nil }
func (c *memConn) Interrupt()       { c.Close() }

func (c *memConn) ReadMessage(ctx context.Context) ([]byte, error) {
	select {
	case m := <-c.in:
		return m, nil
	default:
	}
	select {
	case m := <-c.in:
		return m, nil
	case <-c.closed:
		return nil, errors.New("websocket closed")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// WriteMessage is the server's reader: add and remove, answered.
func (c *memConn) WriteMessage(_ context.Context, p []byte) error {
	var m struct{ Op, Session, LastEventID string }
	if err := json.Unmarshal(p, &m); err != nil {
		return err
	}
	var err error
	switch m.Op {
	case "add":
		err = c.st.Add(m.Session, m.LastEventID)
	case "remove":
		err = c.st.Remove(m.Session)
	}
	var reply []byte
	var se *eventbus.StatusError
	switch {
	case errors.As(err, &se):
		reply, _ = json.Marshal(struct {
			Op      string `json:"op"`
			Session string `json:"session"`
			Status  int    `json:"status"`
			Code    string `json:"code"`
			Error   string `json:"error"`
		}{"error", m.Session, se.Status, se.Code, se.Message})
	case err == nil:
		op := map[string]string{"add": "added", "remove": "removed"}[m.Op]
		reply, _ = json.Marshal(struct {
			Op      string `json:"op"`
			Session string `json:"session"`
		}{op, m.Session})
	}
	c.push(reply)
	return nil
}

func (c *memConn) Ping(context.Context) error { return nil }

func (c *memConn) Close() error {
	c.once.Do(func() { close(c.closed); c.cancel() })
	return nil
}

// wsClient is a multiplexed client of s with the in-memory WebSocket first.
func wsClient(s *server, d *memWS, sessions ...string) *sseclient.Client {
	return &sseclient.Client{
		URL:          s.muxURL(),
		Sessions:     sessions,
		WebSocket:    d,
		WebSocketURL: "ws://" + strings.TrimPrefix(s.srv.URL, "http://") + "/ws",
		HTTPClient:   s.httpClient(),
	}
}

// transports returns the transport of each StateOpen.
func (rc *recorder) transports() []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []string
	for _, st := range rc.states {
		if st.State == sseclient.StateOpen {
			out = append(out, st.Transport)
		}
	}
	return out
}

func TestWebSocketFirstThenSSEAndBackWithOneCursor(t *testing.T) {
	s := newServer(t, serverConfig{})
	d := newMemWS(s)
	s.publish("a", "note", 1)
	s.publish("b", "note", 1)
	c := wsClient(s, d, "a", "b")
	c.ResumeFrom = "0"
	c.WebSocketRetry = 300 * time.Millisecond
	rc := startOpen(t, c)
	rc.wait(t, "both sessions' first events", waitLong, func() bool { return len(rc.events) == 2 })
	if got := rc.transports(); !slices.Equal(got, []string{sseclient.TransportWebSocket}) {
		t.Fatalf("opened on %v, want the WebSocket", got)
	}

	// The WebSocket goes away: the client falls back to SSE with the same
	// cursor and gets exactly what it missed.
	d.down.Store(true)
	d.cutAll()
	s.publish("a", "note", 2)
	s.publish("b", "note", 2)
	rc.wait(t, "the events published while it fell back", waitLong, func() bool { return len(rc.events) == 4 })
	if got := rc.transports(); got[len(got)-1] != sseclient.TransportSSE {
		t.Fatalf("opened on %v, want SSE last", got)
	}

	// The WebSocket is back: after WebSocketRetry the client ends its SSE
	// stream and returns to it, again with the cursor SSE left.
	d.down.Store(false)
	rc.wait(t, "the WebSocket again", waitLong, func() bool {
		return len(rc.states) > 0 && rc.states[len(rc.states)-1].Transport == sseclient.TransportWebSocket
	})
	s.publish("a", "note", 3)
	s.publish("b", "note", 3)
	rc.wait(t, "6 events", waitLong, func() bool { return len(rc.events) == 6 })
	got := bySession(rc.snap().events)
	if !slices.Equal(got["a"], []uint64{1, 2, 3}) || !slices.Equal(got["b"], []uint64{1, 2, 3}) {
		t.Fatalf("events by session %v: want 1, 2, 3 each, once", got)
	}
}

// handshakeAnswer is a JSON refusal of a handshake (memWS.answer).
type handshakeAnswer struct {
	status int
	code   string
}

// A proxy's answer to the handshake (no JSON error of the server's), and
// one that says the WebSocket is not served there with the JSON error of a
// server (a route without /ws, a proxy that stripped the Upgrade headers
// before the handler, a writer that cannot be taken over), are no answer
// about the stream: the client falls back to SSE at once, where the same
// server serves it, and dials no more for WebSocketRetry.
func TestWebSocketUnavailableFallsBack(t *testing.T) {
	for _, a := range []handshakeAnswer{
		{http.StatusBadGateway, ""}, // a proxy's page
		{http.StatusNotFound, "not_found"},
		{http.StatusMethodNotAllowed, "method_not_allowed"},
		{http.StatusUpgradeRequired, "upgrade_required"},
		{http.StatusInternalServerError, "streaming_unsupported"},
	} {
		t.Run(strconv.Itoa(a.status)+"_"+a.code, func(t *testing.T) {
			s := newServer(t, serverConfig{})
			d := newMemWS(s)
			d.answer.Store(&a)
			s.publish("a", "note", 1)
			c := wsClient(s, d, "a")
			c.ResumeFrom = "0"
			rc := startOpen(t, c)
			rc.wait(t, "the event over SSE", waitLong, func() bool { return len(rc.events) == 1 })
			if got := rc.transports(); !slices.Equal(got, []string{sseclient.TransportSSE}) {
				t.Fatalf("opened on %v, want SSE", got)
			}
			if d.dials.Load() != 1 {
				t.Fatalf("%d dials, want 1 (then SSE for WebSocketRetry)", d.dials.Load())
			}
		})
	}
}

// The server's own answer on the handshake counts as it does over SSE: a
// 404 session_not_found names a session that is gone.
func TestWebSocketServerAnswerIsTheServers(t *testing.T) {
	s := newServer(t, serverConfig{})
	d := newMemWS(s)
	s.publish("a", "note", 1)
	c := wsClient(s, d, "a", "nobody")
	c.ResumeFrom = "0"
	rc := &muxRecorder{recorder: newRecorder()}
	c.OnSessionGone = func(g sseclient.SessionGone) {
		rc.mu.Lock()
		rc.gone = append(rc.gone, g)
		rc.mu.Unlock()
		rc.note()
	}
	startOpen(t, c, rc.recorder)
	rc.wait(t, "a's event", waitLong, func() bool { return len(rc.events) == 1 })
	if g := rc.goneSnap(); len(g) != 1 || g[0].Session != "nobody" || g[0].Reason != "session_not_found" {
		t.Fatalf("gone %+v", g)
	}
	for _, tr := range rc.transports() {
		if tr != sseclient.TransportWebSocket {
			t.Fatalf("opened on %v: a 404 of the server is no reason to fall back", rc.transports())
		}
	}
}

// AddSession and RemoveSession on an open WebSocket change its sessions in
// place: no reconnect, the added session resumed from the client's
// position in it, the removed one's events no longer delivered.
func TestWebSocketAddAndRemoveInPlace(t *testing.T) {
	s := newServer(t, serverConfig{})
	d := newMemWS(s)
	s.publish("a", "note", 1)
	s.publish("b", "note", 1)
	c := wsClient(s, d, "a")
	c.ResumeFrom = "0"
	rc := startOpen(t, c)
	rc.wait(t, "a#1", waitLong, func() bool { return len(rc.events) == 1 })

	if err := c.AddSession("b"); err != nil {
		t.Fatal(err)
	}
	// Live from its subscription on: publish once the server has it.
	subscribers(t, s, "b", 1)
	s.publish("b", "note", 2)
	rc.wait(t, "b's live event", waitLong, func() bool { return len(bySession(rc.events)["b"]) == 1 })
	if got := bySession(rc.snap().events)["b"]; !slices.Equal(got, []uint64{2}) {
		t.Fatalf("b's events %v, want 2 (added live: the client had no position in it)", got)
	}
	if err := c.RemoveSession("a"); err != nil {
		t.Fatal(err)
	}
	subscribers(t, s, "a", 0)
	s.publish("a", "note", 2)
	s.publish("b", "note", 3)
	rc.wait(t, "b#3", waitLong, func() bool { return len(bySession(rc.events)["b"]) == 2 })
	if got := bySession(rc.snap().events)["a"]; !slices.Equal(got, []uint64{1}) {
		t.Fatalf("a's events %v after its removal, want only 1", got)
	}
	// Added back: resumed from its position, a#2 delivered, nothing twice.
	if err := c.AddSession("a"); err != nil {
		t.Fatal(err)
	}
	rc.wait(t, "a#2", waitLong, func() bool { return len(bySession(rc.events)["a"]) == 2 })
	if got := bySession(rc.snap().events)["a"]; !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("a's events %v, want 1, 2", got)
	}
	if n := d.dials.Load(); n != 1 {
		t.Fatalf("%d dials: the changes reconnected", n)
	}
	if got := c.ActiveSessions(); !slices.Equal(got, []string{"b", "a"}) {
		t.Fatalf("ActiveSessions %v", got)
	}
}

// subscribers waits until session id's bus has n subscribers: what the
// server did with a change the client sent, which no callback reports.
func subscribers(t *testing.T, s *server, id string, n int) {
	t.Helper()
	for deadline := time.Now().Add(waitLong); s.bus(id).SubscriberCount() != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("session %s has %d subscribers, want %d", id, s.bus(id).SubscriberCount(), n)
		}
	}
}
