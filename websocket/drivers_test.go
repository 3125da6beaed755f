package websocket_test

// The three transports of the scenario table (scenarios_test.go) behind one
// driver: the single SSE stream (GET /session/{id}/events, eventbus.Handler),
// the multiplexed SSE stream (GET /events?session=..., eventbus.MuxHandler)
// and the WebSocket (GET /ws?session=..., this module's Handler), all served
// by one daemon on a Hub, in a synctest bubble (memListener). A driver opens
// a stream with a cursor, gives the frames it reads (type, session, id,
// data), keeps the last cursor the transport gave (the single stream's
// `id: <epoch>:N`, the multiplexed stream's composite `id:`, the WebSocket's
// cursor line) and observes how the stream ended.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	ws "github.com/coder/websocket"
	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/websocket"
)

// kind is a transport of the table.
type kind int

const (
	single kind = iota // GET /session/{id}/events: one session, no "session" member, ids <epoch>:N
	mux                // GET /events?session=...: composite cursor in id:
	wsock              // GET /ws?session=...: composite cursor in the cursor line
)

var kinds = []kind{single, mux, wsock}

func (k kind) String() string {
	return [...]string{"single-sse", "mux-sse", "websocket"}[k]
}

// scEnv is a daemon serving a Hub's sessions on the three routes. restart
// replaces its Hub by a new one (a daemon restart: new epochs).
type scEnv struct {
	t       *testing.T
	opts    eventbus.HubOptions
	mu      sync.Mutex
	hub     *eventbus.Hub
	streams *eventbus.Handler
	mux     *eventbus.MuxHandler
	ws      *websocket.Handler
	client  *http.Client
}

func newScEnv(t *testing.T, opts eventbus.HubOptions, configure func(e *scEnv)) *scEnv {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	opts.Logger = quiet
	if opts.IdleTimeout == 0 {
		opts.IdleTimeout = -1
	}
	e := &scEnv{t: t, opts: opts}
	e.hub = e.newHub()
	e.streams = &eventbus.Handler{
		Lookup: func(r *http.Request, id string) (*eventbus.EventBus, error) {
			return e.currentHub().LookupSession(r, id)
		},
		RetryJitter: -1,
		Logger:      quiet,
	}
	e.mux = &eventbus.MuxHandler{Handler: e.streams}
	e.ws = &websocket.Handler{Mux: e.mux}
	if configure != nil {
		configure(e)
	}
	routes := http.NewServeMux()
	routes.Handle("GET /session/{id}/events", e.streams)
	routes.Handle("/events", e.mux)
	routes.Handle("/ws", e.ws)
	_, e.client = serveInMemory(t, routes, func() { _ = e.currentHub().Close() })
	return e
}

func (e *scEnv) newHub() *eventbus.Hub {
	h, err := eventbus.NewHub(e.opts)
	if err != nil {
		e.t.Fatal(err)
	}
	return h
}

func (e *scEnv) currentHub() *eventbus.Hub {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.hub
}

// restart closes the Hub (as a daemon's exit does) and serves a new one.
func (e *scEnv) restart() {
	e.mu.Lock()
	old := e.hub
	e.hub = e.newHub()
	e.mu.Unlock()
	_ = old.Close()
}

func (e *scEnv) session(id string) *eventbus.EventBus {
	e.t.Helper()
	b, err := e.currentHub().GetOrCreate(id)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

// publish publishes events of type "n" with data v on session id and
// returns the last one.
func (e *scEnv) publish(id string, v ...any) eventbus.Frame {
	e.t.Helper()
	var f eventbus.Frame
	for _, d := range v {
		var err error
		if f, err = e.currentHub().Publish(id, eventbus.Event{Type: "n", Data: d}); err != nil {
			e.t.Fatal(err)
		}
	}
	return f
}

// publishN publishes n events of type "n" on session id.
func (e *scEnv) publishN(id string, n int) {
	e.t.Helper()
	for i := range n {
		e.publish(id, i)
	}
}

// frame is a frame a client read, whatever the transport.
type frame struct {
	Type       string          `json:"type"`
	Session    string          `json:"session"`
	ID         uint64          `json:"id"`
	Data       json.RawMessage `json:"data"`
	raw        string
	hasSession bool
}

// resync is the data of state_resync_required.
type resync struct {
	Reason              string
	Detail              string
	LastDeliveredID     uint64 `json:"lastDeliveredId"`
	EarliestAvailableID uint64 `json:"earliestAvailableId"`
}

// String is the frame as the table's transcripts write it: `a 7` for an
// event, `a resync epoch_reset 3->1`, `a replay_complete 2`, `a
// client_evicted queue_overflow`, `a stream_error shutdown`.
func (f frame) String() string {
	var d struct {
		resync
		ReplayedCount int
		ErrorKind     string
		RetryAfter    int
	}
	_ = json.Unmarshal(f.Data, &d)
	switch f.Type {
	case "state_resync_required":
		r := d.Reason
		if d.Detail != "" {
			r += "/" + d.Detail
		}
		return fmt.Sprintf("%s resync %s %d->%d", f.Session, r, d.LastDeliveredID, d.EarliestAvailableID)
	case "replay_complete":
		return fmt.Sprintf("%s replay_complete %d", f.Session, d.ReplayedCount)
	case "client_evicted":
		return fmt.Sprintf("%s client_evicted %s", f.Session, d.Reason)
	case "stream_error":
		return fmt.Sprintf("%s stream_error %s", f.Session, d.ErrorKind)
	}
	if f.ID != 0 {
		return fmt.Sprintf("%s %d", f.Session, f.ID)
	}
	return f.Session + " " + f.Type
}

// stream is one connection of a driver.
type stream struct {
	t      *testing.T
	k      kind
	frames chan frame
	done   chan struct{}
	start  func() // starts the reading goroutine (once)
	stop   func() // the client leaves
	once   sync.Once

	mu     sync.Mutex
	cursor string
	end    string // once done: "eof" (SSE), "close <code> <reason>", "cut" (no close frame)

	// A refused opening: its status and JSON code (and no stream).
	status int
	code   string
	body   string
}

// openOpts are a stream's opening options.
type openOpts struct {
	cursor   string     // "": none
	query    url.Values // maxQueued, types
	header   http.Header
	deferred bool // the client reads nothing until start
}

// open opens a stream of transport k on sessions (the single stream: the
// first alone).
func (e *scEnv) open(k kind, sessions []string, o openOpts) *stream {
	e.t.Helper()
	q := url.Values{}
	for key, v := range o.query {
		q[key] = v
	}
	s := &stream{t: e.t, k: k, frames: make(chan frame, 100000), done: make(chan struct{})}
	if k != single {
		for _, id := range sessions {
			q.Add("session", id)
		}
	}
	switch k {
	case single, mux:
		u := "http://eventbus.test/events?" + q.Encode()
		if k == single {
			u = "http://eventbus.test/session/" + url.PathEscape(sessions[0]) + "/events?" + q.Encode()
		}
		req, err := http.NewRequest(http.MethodGet, u, nil)
		if err != nil {
			e.t.Fatal(err)
		}
		for key, v := range o.header {
			req.Header[key] = v
		}
		if o.cursor != "" {
			req.Header.Set("Last-Event-ID", o.cursor)
		}
		resp, err := e.client.Do(req)
		if err != nil {
			e.t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			s.refused(resp.StatusCode, resp.Body)
			resp.Body.Close()
			return s
		}
		s.start = func() { go s.readSSE(resp.Body, sessions[0]) }
		s.stop = func() { _ = resp.Body.Close() }
	case wsock:
		if o.cursor != "" {
			q.Set("lastEventId", o.cursor) // as a browser gives it
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, resp, err := ws.Dial(ctx, "ws://eventbus.test/ws?"+q.Encode(), &ws.DialOptions{HTTPClient: e.client, HTTPHeader: o.header})
		if err != nil {
			if resp == nil {
				e.t.Fatalf("dial: %v", err)
			}
			s.refused(resp.StatusCode, resp.Body)
			return s
		}
		c.SetReadLimit(-1)
		s.start = func() { go s.readWS(c) }
		s.stop = func() { _ = c.CloseNow() }
	}
	e.t.Cleanup(s.close)
	if !o.deferred {
		s.begin()
	}
	return s
}

func (s *stream) refused(status int, body io.Reader) {
	s.status = status
	b, _ := io.ReadAll(body)
	s.body = string(b)
	var v struct{ Code string }
	_ = json.Unmarshal(b, &v)
	s.code = v.Code
	close(s.done)
}

// begin starts reading (a deferred stream).
func (s *stream) begin() { s.once.Do(s.start) }

// close: the client leaves; it waits for the reading goroutine.
func (s *stream) close() {
	if s.stop == nil {
		return
	}
	s.stop()
	s.begin()
	<-s.done
}

func (s *stream) finish(end string) {
	s.mu.Lock()
	s.end = end
	s.mu.Unlock()
	close(s.done)
}

func (s *stream) setCursor(c string) {
	s.mu.Lock()
	s.cursor = c
	s.mu.Unlock()
}

// lastCursor is the last cursor the transport gave.
func (s *stream) lastCursor() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cursor
}

func (s *stream) emit(raw, session string) error {
	var f frame
	if err := json.Unmarshal([]byte(raw), &f); err != nil {
		return fmt.Errorf("frame %q: %w", raw, err)
	}
	var members map[string]json.RawMessage
	_ = json.Unmarshal([]byte(raw), &members)
	_, f.hasSession = members["session"]
	f.raw = raw
	if s.k == single {
		// The single stream's envelope has no "session" member: the
		// session is the route's.
		if f.hasSession {
			return fmt.Errorf("a single stream's frame with a session member: %s", raw)
		}
		f.Session = session
	} else if !f.hasSession {
		return fmt.Errorf("a multiplexed frame without a session member: %s", raw)
	}
	s.frames <- f
	return nil
}

func (s *stream) readSSE(body io.Reader, session string) {
	br := bufio.NewReader(body)
	var id, data string
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			if errors.Is(err, io.EOF) {
				s.finish("eof")
			} else {
				s.finish("cut")
			}
			return
		}
		l = strings.TrimSuffix(l, "\n")
		switch {
		case l == "":
			if data != "" {
				if id != "" {
					s.setCursor(id)
				}
				if err := s.emit(data, session); err != nil {
					s.finish("bad: " + err.Error())
					return
				}
			}
			id, data = "", ""
		case strings.HasPrefix(l, "id: "):
			id = l[len("id: "):]
		case strings.HasPrefix(l, "data: "):
			data = l[len("data: "):]
		}
	}
}

func (s *stream) readWS(c *ws.Conn) {
	for {
		typ, p, err := c.Read(context.Background())
		if err != nil {
			var ce ws.CloseError
			if errors.As(err, &ce) {
				s.finish(fmt.Sprintf("close %d %s", ce.Code, ce.Reason))
			} else {
				s.finish("cut")
			}
			return
		}
		if typ != ws.MessageText {
			s.finish("bad: a binary message")
			return
		}
		for raw := range strings.SplitSeq(string(p), "\n") {
			if strings.HasPrefix(raw, `{"op":`) {
				var ctl struct{ Op, Cursor string }
				if err := json.Unmarshal([]byte(raw), &ctl); err != nil {
					s.finish("bad: " + err.Error())
					return
				}
				if ctl.Op == "cursor" {
					s.setCursor(ctl.Cursor)
				}
				continue
			}
			if err := s.emit(raw, ""); err != nil {
				s.finish("bad: " + err.Error())
				return
			}
		}
	}
}

// next returns the next frame, failing when the stream ends first or
// nothing comes within a minute of the bubble's clock.
func (s *stream) next() frame {
	s.t.Helper()
	select {
	case f := <-s.frames:
		return f
	case <-s.done:
		select {
		case f := <-s.frames:
			return f
		default:
		}
		s.t.Fatalf("%s: the stream ended (%s) before the next frame", s.k, s.ended())
	case <-time.After(time.Minute):
		s.t.Fatalf("%s: no frame within a minute", s.k)
	}
	return frame{}
}

// take returns the next n frames.
func (s *stream) take(n int) []frame {
	s.t.Helper()
	got := make([]frame, 0, n)
	for range n {
		got = append(got, s.next())
	}
	return got
}

// until returns the frames up to and including the first match.
func (s *stream) until(match func(frame) bool) []frame {
	s.t.Helper()
	var got []frame
	for {
		f := s.next()
		got = append(got, f)
		if match(f) {
			return got
		}
	}
}

// ready returns the frames read so far without waiting (after
// synctest.Wait: everything the server has written).
func (s *stream) ready() []frame {
	var got []frame
	for {
		select {
		case f := <-s.frames:
			got = append(got, f)
		default:
			return got
		}
	}
}

func (s *stream) ended() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.end
}

// waitEnd waits for the stream to end, failing if a frame comes first,
// and returns how it ended.
func (s *stream) waitEnd() string {
	s.t.Helper()
	select {
	case <-s.done:
	case f := <-s.frames:
		s.t.Fatalf("%s: frame %s before the end", s.k, f)
	case <-time.After(5 * time.Minute):
		s.t.Fatalf("%s: the stream did not end", s.k)
	}
	if f := s.ready(); len(f) > 0 {
		s.t.Fatalf("%s: frames %v before the end", s.k, f)
	}
	return s.ended()
}

// strs is the table's transcript of frames.
func strs(fs []frame) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.String()
	}
	return out
}

// ofSession keeps the frames of one session (across sessions a
// multiplexed stream promises no order).
func ofSession(fs []frame, session string) []frame {
	var out []frame
	for _, f := range fs {
		if f.Session == session {
			out = append(out, f)
		}
	}
	return out
}
