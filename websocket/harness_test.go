package websocket_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ws "github.com/coder/websocket"
	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/websocket"
)

// The tests run in testing/synctest bubbles: the server (an http.Server
// on memListener), its clients (coder's Dial and net/http's Transport,
// dialing net.Pipe connections) and every timer are in the bubble, so
// heartbeats, write timeouts and lifetimes take no real time, and a
// goroutine left behind fails the test.

// memListener is a net.Listener of in-memory connections (net.Pipe).
type memListener struct {
	conns  chan net.Conn
	done   chan struct{}
	once   sync.Once
	closed atomic.Int32 // server ends of connections closed
}

func newMemListener() *memListener {
	return &memListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *memListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *memListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *memListener) Addr() net.Addr { return memAddr{} }

// dial is the clients' DialContext: one end of a new pipe, the other
// accepted by the server.
func (l *memListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- &serverConn{Conn: server, l: l}:
		return client, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// serverConn is the server's end of a connection: it counts its close.
type serverConn struct {
	net.Conn
	l    *memListener
	once sync.Once
}

func (c *serverConn) Close() error {
	c.once.Do(func() { c.l.closed.Add(1) })
	return c.Conn.Close()
}

type memAddr struct{}

func (memAddr) Network() string { return "mem" }
func (memAddr) String() string  { return "mem" }

// env is a daemon serving a Hub's sessions on GET /events (the SSE
// multiplexed route) and GET /ws, in the bubble.
type env struct {
	t       *testing.T
	hub     *eventbus.Hub
	streams *eventbus.Handler
	mux     *eventbus.MuxHandler
	ws      *websocket.Handler
	client  *http.Client
	l       *memListener
	wsDown  atomic.Bool // GET /ws answers a plain 404, as a daemon without it
	// wsReturned counts the calls of the WebSocket Handler's ServeHTTP
	// that have returned.
	wsReturned atomic.Int32
}

// newEnv starts the daemon; configure, when not nil, sets the handlers'
// fields before it serves. It stops when the test ends.
func newEnv(t *testing.T, configure func(e *env)) *env {
	t.Helper()
	return newEnvHub(t, eventbus.HubOptions{}, configure)
}

// newEnvHub is newEnv with the Hub's options.
func newEnvHub(t *testing.T, opts eventbus.HubOptions, configure func(e *env)) *env {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	opts.Logger = quiet
	hub, err := eventbus.NewHub(opts)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, hub: hub}
	e.streams = &eventbus.Handler{Lookup: hub.LookupSession, RetryJitter: -1, Logger: quiet}
	e.mux = &eventbus.MuxHandler{Handler: e.streams}
	e.ws = &websocket.Handler{Mux: e.mux}
	if configure != nil {
		configure(e)
	}
	routes := http.NewServeMux()
	routes.Handle("/events", e.mux)
	routes.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		if e.wsDown.Load() { // a daemon without the route: a plain 404 page
			http.NotFound(w, r)
			return
		}
		e.ws.ServeHTTP(w, r)
		e.wsReturned.Add(1)
	})
	e.l, e.client = serveInMemory(t, routes, func() { _ = hub.Close() })
	return e
}

// session creates session id and returns its bus.
func (e *env) session(id string) *eventbus.EventBus {
	e.t.Helper()
	b, err := e.hub.GetOrCreate(id)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

// publish publishes an event of type typ with data n on session id.
func (e *env) publish(id, typ string, n int) {
	e.t.Helper()
	if _, err := e.hub.Publish(id, eventbus.Event{Type: typ, Data: n}); err != nil {
		e.t.Fatal(err)
	}
}

// dial opens /ws?query; the connection is closed when the test ends.
func (e *env) dial(query string, opts *ws.DialOptions) (*ws.Conn, *http.Response, error) {
	e.t.Helper()
	if opts == nil {
		opts = &ws.DialOptions{}
	}
	opts.HTTPClient = e.client
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, resp, err := ws.Dial(ctx, "ws://eventbus.test/ws?"+query, opts)
	if c != nil {
		c.SetReadLimit(-1) // a frame line is as long as the event
		e.t.Cleanup(func() { _ = c.CloseNow() })
	}
	return c, resp, err
}

// mustDial is dial that fails the test on an error.
func (e *env) mustDial(query string, opts *ws.DialOptions) *ws.Conn {
	e.t.Helper()
	c, _, err := e.dial(query, opts)
	if err != nil {
		e.t.Fatalf("dial %s: %v", query, err)
	}
	return c
}

// readMsg reads one message and returns its lines.
func readMsg(t *testing.T, c *ws.Conn) []string {
	t.Helper()
	lines, err := tryReadMsg(c)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return lines
}

// tryReadMsg reads one text message, within a minute, and returns its
// lines.
func tryReadMsg(c *ws.Conn) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	typ, p, err := c.Read(ctx)
	if err != nil {
		return nil, err
	}
	if typ != ws.MessageText {
		return nil, errors.New("a binary message")
	}
	return strings.Split(string(p), "\n"), nil
}

// line is a message line, decoded.
type line struct {
	raw     string
	Op      string            `json:"op"`
	Cursor  string            `json:"cursor"`
	Epochs  map[string]string `json:"epochs"`
	Session string            `json:"session"`
	ID      uint64            `json:"id"`
	Type    string            `json:"type"`
	Data    json.RawMessage   `json:"data"`
	Status  int               `json:"status"`
	Code    string            `json:"code"`
	Error   string            `json:"error"`
}

func decode(t *testing.T, raw string) line {
	t.Helper()
	var l line
	if err := json.Unmarshal([]byte(raw), &l); err != nil {
		t.Fatalf("line %q: %v", raw, err)
	}
	l.raw = raw
	return l
}

// reader collects a connection's messages, line by line, on a goroutine
// of its own: a client that always reads, so the server never blocks on
// it. The goroutine ends when the connection does.
type reader struct {
	t     *testing.T
	lines chan line
	done  chan struct{}
	err   error // why reading ended, once done is closed
}

func newReader(t *testing.T, c *ws.Conn) *reader {
	r := &reader{t: t, lines: make(chan line, 10000), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			_, p, err := c.Read(context.Background())
			if err != nil {
				r.err = err
				return
			}
			for raw := range strings.SplitSeq(string(p), "\n") {
				var l line
				if err := json.Unmarshal([]byte(raw), &l); err != nil {
					r.err = err
					return
				}
				l.raw = raw
				r.lines <- l
			}
		}
	}()
	t.Cleanup(func() {
		_ = c.CloseNow()
		<-r.done
	})
	return r
}

// next returns the next line, failing the test when the connection ends
// first or nothing comes within a minute.
func (r *reader) next() line {
	r.t.Helper()
	select {
	case l := <-r.lines:
		return l
	case <-r.done:
		select {
		case l := <-r.lines:
			return l
		default:
		}
		r.t.Fatalf("the connection ended: %v", r.err)
	case <-time.After(time.Minute):
		r.t.Fatal("no line within a minute")
	}
	return line{}
}

// until returns the lines up to and including the first that match says
// is the one.
func (r *reader) until(match func(line) bool) []line {
	r.t.Helper()
	var got []line
	for {
		l := r.next()
		got = append(got, l)
		if match(l) {
			return got
		}
	}
}

// end waits for the connection to end and returns its close status (-1
// without a close frame), failing when a line comes first.
func (r *reader) end() ws.StatusCode {
	r.t.Helper()
	select {
	case l := <-r.lines:
		r.t.Fatalf("a line before the end: %s", l.raw)
	case <-r.done:
	case <-time.After(2 * time.Minute):
		r.t.Fatal("the connection did not end")
	}
	select {
	case l := <-r.lines:
		r.t.Fatalf("a line before the end: %s", l.raw)
	default:
	}
	return ws.CloseStatus(r.err)
}

func isCursor(l line) bool { return l.Op == "cursor" }

// sseEvent is one event of an SSE stream.
type sseEvent struct {
	id, typ, data string
}

// sseStream reads an SSE response's events on a goroutine of its own.
type sseStream struct {
	t      *testing.T
	events chan sseEvent
	body   io.ReadCloser
	done   chan struct{}
}

// openSSE opens GET /events?query with header lastEventID when not empty.
func (e *env) openSSE(query, lastEventID string) *sseStream {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://eventbus.test/events?"+query, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		e.t.Fatalf("GET /events?%s: %s", query, resp.Status)
	}
	s := &sseStream{t: e.t, events: make(chan sseEvent, 10000), body: resp.Body, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		br := bufio.NewReader(resp.Body)
		var ev sseEvent
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				return
			}
			l = strings.TrimSuffix(l, "\n")
			switch {
			case l == "":
				if ev.data != "" {
					s.events <- ev
				}
				ev = sseEvent{}
			case strings.HasPrefix(l, "id: "):
				ev.id = l[len("id: "):]
			case strings.HasPrefix(l, "event: "):
				ev.typ = l[len("event: "):]
			case strings.HasPrefix(l, "data: "):
				ev.data = l[len("data: "):]
			}
		}
	}()
	e.t.Cleanup(s.close)
	return s
}

func (s *sseStream) next() sseEvent {
	s.t.Helper()
	select {
	case ev := <-s.events:
		return ev
	case <-time.After(time.Minute):
		s.t.Fatal("no SSE event within a minute")
	}
	return sseEvent{}
}

func (s *sseStream) close() {
	_ = s.body.Close()
	<-s.done
}

// handshake sends a GET /ws with a WebSocket handshake's headers (unless
// plain) and extra headers, and returns the answer's status and JSON code.
func (e *env) handshake(method, query string, plain bool, extra map[string]string) (int, string, http.Header) {
	e.t.Helper()
	req, err := http.NewRequest(method, "http://eventbus.test/ws?"+query, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if !plain {
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	}
	for k, v := range extra {
		req.Header.Set(k, v)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Error, Code string
	}
	if resp.StatusCode == http.StatusSwitchingProtocols || method == http.MethodHead {
		return resp.StatusCode, "", resp.Header
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		e.t.Fatalf("%s /ws?%s: %s, body: %v", method, query, resp.Status, err)
	}
	return resp.StatusCode, body.Code, resp.Header
}

// serveInMemory serves routes on an in-memory listener until the test
// ends, then closes the server, waits for it and calls done; it returns
// the listener and a client that dials it.
func serveInMemory(t *testing.T, routes http.Handler, done func()) (*memListener, *http.Client) {
	l := newMemListener()
	srv := &http.Server{Handler: routes}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(l)
	}()
	tr := &http.Transport{DialContext: l.dial}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		_ = srv.Close()
		<-served
		done()
	})
	return l, &http.Client{Transport: tr}
}
