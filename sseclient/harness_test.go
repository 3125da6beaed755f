package sseclient_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/internal/pipenet"
	"github.com/ssebus/eventbus/sseclient"
)

// server is the real eventbus.Handler behind an httptest server, one bus
// per session, with the controls a test needs: publish, a clean cut of a
// session's streams (what sessiond's /disconnect does), an abrupt cut of
// every connection, a restart (new buses, so new epochs, on the same
// address), and an epilogue written after a cut stream's handler returned
// (a terminal frame nothing in the handler writes on demand: stream_error
// internal; the lifetime's reauthenticate and Revoke's revoked come from the
// Handler's own hooks, auth_test.go).
type server struct {
	t       testing.TB
	opts    eventbus.Options
	handler *eventbus.Handler
	srv     *httptest.Server
	pipe    *pipenet.Listener // set for in-memory servers (synctest)
	before  func(w http.ResponseWriter, r *http.Request) bool

	mu      sync.Mutex
	buses   map[string]*eventbus.EventBus
	streams map[*stream]string
}

type stream struct {
	cancel   context.CancelFunc
	epilogue []byte
}

type serverConfig struct {
	opts eventbus.Options
	// handler adjusts the Handler (Retry, Heartbeat...).
	handler func(*eventbus.Handler)
	// pipe serves over an in-memory listener, for synctest bubbles.
	pipe bool
}

func newServer(t testing.TB, cfg serverConfig) *server {
	s := &server{t: t, opts: cfg.opts, buses: map[string]*eventbus.EventBus{}, streams: map[*stream]string{}}
	s.handler = &eventbus.Handler{
		Lookup: func(r *http.Request, id string) (*eventbus.EventBus, error) {
			if r.PathValue("id") == "" { // the multiplexed route, which never creates
				return s.existing(r, id)
			}
			return s.bus(id), nil
		},
		Retry: 20 * time.Millisecond,
		// Exact retry: values, so tests can bound the client's delays.
		RetryJitter: -1,
		Logger:      quietLogger(),
		// SPEC 5.3's id lines unless a test asks for the Handler's default
		// epoch ids (cfg.handler clears it).
		BareIDs: true,
	}
	if cfg.handler != nil {
		cfg.handler(s.handler)
	}
	if cfg.opts.Logger == nil {
		s.opts.Logger = quietLogger()
	}
	s.srv = httptest.NewUnstartedServer(s.routes())
	if cfg.pipe {
		s.srv.Listener.Close()
		s.pipe = pipenet.Listen()
		s.srv.Listener = s.pipe
	}
	s.srv.Start()
	t.Cleanup(s.close)
	return s
}

// muxStreams is the name under which the streams of GET /events (the
// multiplexed stream, MuxHandler on the Handler) are filed, for cut.
const muxStreams = "events"

func (s *server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /session/{id}/events", func(w http.ResponseWriter, r *http.Request) {
		s.serve(w, r, r.PathValue("id"), s.handler)
	})
	m := &eventbus.MuxHandler{Handler: s.handler}
	mux.HandleFunc("GET /events", func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, muxStreams, m) })
	return mux
}

// serve serves a stream with h, filed under id for cut.
func (s *server) serve(w http.ResponseWriter, r *http.Request, id string, h http.Handler) {
	if s.before != nil && !s.before(w, r) {
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	st := &stream{cancel: cancel}
	s.mu.Lock()
	s.streams[st] = id
	s.mu.Unlock()
	h.ServeHTTP(w, r.WithContext(ctx))
	s.mu.Lock()
	delete(s.streams, st)
	epilogue := st.epilogue
	s.mu.Unlock()
	if epilogue != nil && r.Context().Err() == nil {
		w.Write(epilogue)
		http.NewResponseController(w).Flush()
	}
}

// existing is the multiplexed stream's Lookup: a session's bus, never
// created (a publish creates it).
func (s *server) existing(_ *http.Request, id string) (*eventbus.EventBus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b := s.buses[id]; b != nil {
		return b, nil
	}
	return nil, eventbus.ErrSessionNotFound
}

// remove closes session id's bus and forgets it, as a Hub's Delete does:
// its streams get what is queued, then its end.
func (s *server) remove(id string) {
	s.mu.Lock()
	b := s.buses[id]
	delete(s.buses, id)
	s.mu.Unlock()
	if b != nil {
		b.Close()
	}
}

// muxURL is the multiplexed stream's URL (the client adds the sessions).
func (s *server) muxURL() string { return s.srv.URL + "/events" }

// close stops the server as a crash does: every connection is cut, then
// every bus is closed (a plain Close would end each single stream with
// stream_error closed, which a client takes for its session's end: the
// daemon's restart is no delete), then the HTTP server.
func (s *server) close() {
	// No new connection (a client reconnecting at once would find the
	// closed bus); a stream still being set up, or blocked writing, must
	// not hold Close.
	s.srv.Listener.Close()
	s.srv.CloseClientConnections()
	s.mu.Lock()
	for _, b := range s.buses {
		b.Close()
	}
	s.mu.Unlock()
	s.srv.Close()
}

// bus returns session id's bus, creating it.
func (s *server) bus(id string) *eventbus.EventBus {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.buses[id]
	if b == nil {
		var err error
		b, err = eventbus.New(s.opts)
		if err != nil {
			panic(err)
		}
		s.buses[id] = b
	}
	return b
}

func (s *server) url(id string) string { return s.srv.URL + "/session/" + id + "/events" }

// client returns an HTTP client for this server (nil: the Client's own).
func (s *server) httpClient() *http.Client {
	if s.pipe == nil {
		return nil
	}
	tr := &http.Transport{DialContext: s.pipe.DialContext}
	s.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func (s *server) publish(id, typ string, data any) uint64 {
	s.t.Helper()
	f, err := s.bus(id).Publish(eventbus.Event{Type: typ, Data: data})
	if err != nil {
		s.t.Fatalf("publish: %v", err)
	}
	return f.ID()
}

// cut ends every stream of session id cleanly (the response ends with its
// chunked terminator), after writing epilogue when it is not nil. It
// returns how many it cut.
func (s *server) cut(id string, epilogue []byte) int {
	s.mu.Lock()
	var cancels []context.CancelFunc
	for st, sid := range s.streams {
		if sid == id {
			st.epilogue = epilogue
			cancels = append(cancels, st.cancel)
		}
	}
	s.mu.Unlock()
	for _, c := range cancels {
		c()
	}
	return len(cancels)
}

func (s *server) openStreams(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, sid := range s.streams {
		if sid == id {
			n++
		}
	}
	return n
}

// restart stops the server abruptly and starts a new one, with new buses,
// on the same address.
func (s *server) restart() {
	s.t.Helper()
	addr := s.srv.Listener.Addr().String()
	s.close()
	s.mu.Lock()
	s.buses = map[string]*eventbus.EventBus{}
	s.mu.Unlock()
	var ln net.Listener
	var err error
	for range 50 {
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		s.t.Fatalf("listen again on %s: %v", addr, err)
	}
	s.srv = httptest.NewUnstartedServer(s.routes())
	s.srv.Listener.Close()
	s.srv.Listener = ln
	s.srv.Start()
}

// recorder collects what a Client reports, for assertions.
type recorder struct {
	mu      sync.Mutex
	changed chan struct{}
	events  []sseclient.Event
	signals []sseclient.Signal
	caught  []sseclient.CaughtUp
	resyncs []sseclient.Resync
	slow    []sseclient.SlowWarning
	evicted []sseclient.Eviction
	states  []sseclient.StateChange
	errs    []error
	stamps  []time.Time // when each state change arrived
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{}, 1)} }

func (rc *recorder) note() {
	select {
	case rc.changed <- struct{}{}:
	default:
	}
}

// attach sets every callback of c that is nil to record into rc.
func (rc *recorder) attach(c *sseclient.Client) {
	add := func(f func()) {
		rc.mu.Lock()
		f()
		rc.mu.Unlock()
		rc.note()
	}
	if c.OnEvent == nil {
		c.OnEvent = func(e sseclient.Event) { add(func() { rc.events = append(rc.events, e) }) }
	}
	c.OnSignal = func(s sseclient.Signal) { add(func() { rc.signals = append(rc.signals, s) }) }
	c.OnCaughtUp = func(x sseclient.CaughtUp) { add(func() { rc.caught = append(rc.caught, x) }) }
	c.OnResync = func(x sseclient.Resync) { add(func() { rc.resyncs = append(rc.resyncs, x) }) }
	c.OnSlow = func(x sseclient.SlowWarning) { add(func() { rc.slow = append(rc.slow, x) }) }
	c.OnEvicted = func(x sseclient.Eviction) { add(func() { rc.evicted = append(rc.evicted, x) }) }
	c.OnState = func(x sseclient.StateChange) {
		add(func() { rc.states = append(rc.states, x); rc.stamps = append(rc.stamps, time.Now()) })
	}
	c.OnError = func(err error) { add(func() { rc.errs = append(rc.errs, err) }) }
}

// snap returns a copy of what rc recorded so far, to read without racing
// the client. Conditions passed to wait read rc itself (wait holds the lock).
func (rc *recorder) snap() *recorder {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return &recorder{
		events:  append([]sseclient.Event(nil), rc.events...),
		signals: append([]sseclient.Signal(nil), rc.signals...),
		caught:  append([]sseclient.CaughtUp(nil), rc.caught...),
		resyncs: append([]sseclient.Resync(nil), rc.resyncs...),
		slow:    append([]sseclient.SlowWarning(nil), rc.slow...),
		evicted: append([]sseclient.Eviction(nil), rc.evicted...),
		states:  append([]sseclient.StateChange(nil), rc.states...),
		errs:    append([]error(nil), rc.errs...),
		stamps:  append([]time.Time(nil), rc.stamps...),
	}
}

func (rc *recorder) ids() []uint64 {
	ids := make([]uint64, len(rc.events))
	for i, e := range rc.events {
		ids[i] = e.ID
	}
	return ids
}

func (rc *recorder) stateNames() []string {
	var out []string
	for _, s := range rc.states {
		if len(out) == 0 || out[len(out)-1] != s.State.String() {
			out = append(out, s.State.String())
		}
	}
	return out
}

// wait blocks until cond holds (checked under the recorder's lock), for
// at most d; it fails the test past that.
func (rc *recorder) wait(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		rc.mu.Lock()
		ok := cond()
		rc.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-rc.changed:
		case <-deadline.C:
			rc.mu.Lock()
			defer rc.mu.Unlock()
			t.Fatalf("timed out waiting for %s; ids %v, states %v, errors %v, resyncs %+v", what, idsOf(rc.events), rc.states, rc.errs, rc.resyncs)
		}
	}
}

func idsOf(evs []sseclient.Event) []uint64 {
	out := make([]uint64, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

// start runs c in a goroutine the test owns; the cleanup cancels it and
// waits for Run to return.
func start(t testing.TB, c *sseclient.Client) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

// runFinal runs c until it stops by itself and returns its error.
func runFinal(t testing.TB, c *sseclient.Client, d time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	err := c.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("Run did not stop by itself within %v", d)
	}
	return err
}

func seq(a, b uint64) []uint64 {
	var out []uint64
	for i := a; i <= b; i++ {
		out = append(out, i)
	}
	return out
}

func data(t testing.TB, e sseclient.Event, v any) {
	t.Helper()
	if err := json.Unmarshal(e.Data, v); err != nil {
		t.Fatalf("event %d data %s: %v", e.ID, e.Data, err)
	}
}

// gate is an http.RoundTripper that holds new requests while closed.
type gate struct {
	next http.RoundTripper
	mu   sync.Mutex
	open chan struct{} // closed while the gate is open
	urls []string
}

func newGate(next http.RoundTripper) *gate {
	g := &gate{next: next, open: make(chan struct{})}
	close(g.open)
	return g
}

func (g *gate) RoundTrip(req *http.Request) (*http.Response, error) {
	g.mu.Lock()
	g.urls = append(g.urls, req.URL.String())
	open := g.open
	g.mu.Unlock()
	select {
	case <-open:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	return g.next.RoundTrip(req)
}

func (g *gate) hold() {
	g.mu.Lock()
	g.open = make(chan struct{})
	g.mu.Unlock()
}

func (g *gate) release() {
	g.mu.Lock()
	close(g.open)
	g.mu.Unlock()
}

func (g *gate) lastURL() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.urls[len(g.urls)-1]
}

func wantIDs(t testing.TB, got, want []uint64) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("ids %v, want %v", got, want)
	}
}
