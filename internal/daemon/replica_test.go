package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane/backplanetest"
)

// fakeBackplane is a one-process Backplane: a plain bus per session, and
// an error to answer with instead when err is set. Its own session rule,
// stricter than eventbus.CheckSessionID, refuses "bad" (errFakeSession).
type fakeBackplane struct {
	mu    sync.Mutex
	buses map[string]*eventbus.EventBus
	keys  map[string]uint64
	err   error
}

var (
	errFakeUnavailable = errors.New("fake: unavailable")
	errFakeUnknown     = fmt.Errorf("%w: fake: outcome unknown", errFakeUnavailable)
	errFakeSession     = errors.New("fake: invalid session")
)

func (f *fakeBackplane) Bus(_ context.Context, s string) (*eventbus.EventBus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	if s == "bad" {
		return nil, errFakeSession
	}
	if f.buses[s] == nil {
		f.buses[s], _ = eventbus.New(eventbus.Options{})
	}
	return f.buses[s], nil
}

func (f *fakeBackplane) Publish(ctx context.Context, s string, e eventbus.Event) (uint64, string, error) {
	bus, err := f.Bus(ctx, s)
	if err != nil {
		return 0, "", err
	}
	fr, err := bus.Publish(e)
	return fr.ID(), bus.Epoch(), err
}

func (f *fakeBackplane) PublishIdempotent(ctx context.Context, s, key string, e eventbus.Event) (uint64, string, bool, error) {
	if err := eventbus.CheckIdempotencyKey(key); err != nil {
		return 0, "", false, err
	}
	f.mu.Lock()
	id, ok := f.keys[s+"\x00"+key]
	f.mu.Unlock()
	if ok {
		bus, _ := f.Bus(ctx, s)
		return id, bus.Epoch(), true, nil
	}
	id, epoch, err := f.Publish(ctx, s, e)
	if err == nil {
		f.mu.Lock()
		f.keys[s+"\x00"+key] = id
		f.mu.Unlock()
	}
	return id, epoch, false, err
}

func (f *fakeBackplane) Signal(ctx context.Context, s, typ, about string) error {
	bus, err := f.Bus(ctx, s)
	if err != nil {
		return err
	}
	return bus.Signal(typ, about)
}

func (f *fakeBackplane) Delete(ctx context.Context, s string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	if s == "bad" {
		return errFakeSession
	}
	if b := f.buses[s]; b != nil {
		b.Close()
		delete(f.buses, s)
	}
	return nil
}

func (f *fakeBackplane) Info(ctx context.Context, s string) (SessionInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return SessionInfo{}, f.err
	}
	if s == "bad" {
		return SessionInfo{}, errFakeSession
	}
	b := f.buses[s]
	if b == nil {
		return SessionInfo{}, nil
	}
	return SessionInfo{Exists: true, Epoch: b.Epoch(), LastEventID: b.LastEventID(), Local: true, Subscribers: b.SubscriberCount()}, nil
}

func (f *fakeBackplane) set(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

func (f *fakeBackplane) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range f.buses {
		b.Close()
	}
}

// The shared replica's routes on a fake engine: publish (plain and keyed),
// the stream, a signal, the status, /disconnect, DELETE, and the answers
// when the engine is unreachable, the outcome unknown, or the session id
// invalid.
func TestReplicaRoutes(t *testing.T) {
	fb := &fakeBackplane{buses: map[string]*eventbus.EventBus{}, keys: map[string]uint64{}}
	// Cleanups, not defers: the stream opened below closes first (its own
	// cleanup), so that the server's Close, which waits for the stream's
	// handler, does not hang when the test fails with the stream open.
	t.Cleanup(fb.close)
	r := NewReplica(&Replica{
		Daemon: "sessiond-test", Usage: "usage text\n\nFlags:\n", Name: "R1", Engine: "Fake",
		Backplane: fb,
		Errors:    ReplicaErrors(errFakeUnknown, errFakeSession, errFakeUnavailable),
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		MaxBody:   MaxBody(0),
	}, &eventbus.Handler{Heartbeat: time.Hour})
	srv := httptest.NewServer(r.Routes())
	t.Cleanup(srv.Close)
	client := srv.Client()
	t.Cleanup(client.CloseIdleConnections)
	do := func(method, path, body string, header map[string]string) (int, map[string]any, http.Header) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		json.NewDecoder(resp.Body).Decode(&v)
		return resp.StatusCode, v, resp.Header
	}

	s := backplanetest.Open(t, client, srv.URL+"/session/s/events", nil)
	if code, v, _ := do("POST", "/session/s/events", `{"type":"e"}`, nil); code != 200 || v["id"] != float64(1) {
		t.Fatalf("publish: %d %v", code, v)
	}
	key := map[string]string{"Idempotency-Key": "k"}
	do("POST", "/session/s/events", `{"type":"e"}`, key)
	if code, v, _ := do("POST", "/session/s/events", `{"type":"e"}`, key); code != 200 || v["id"] != float64(2) || v["duplicate"] != true {
		t.Fatalf("keyed retry: %d %v", code, v)
	}
	if code, v, _ := do("POST", "/session/s/events", `{"type":"e"}`, map[string]string{"Idempotency-Key": ""}); code != 400 || v["code"] != "invalid_idempotency_key" {
		t.Fatalf("empty key: %d %v", code, v)
	}
	backplanetest.WantIDs(t, s.Events(2, 5*time.Second), 1, 2)
	if code, _, _ := do("POST", "/session/s/signal", `{"type":"doc.changed","about":"d"}`, nil); code != 204 {
		t.Fatalf("signal: %d", code)
	}
	if f := s.Next(5 * time.Second); f.Event != "doc.changed" {
		t.Fatalf("want the signal, got %+v", f)
	}
	// A synthetic frame's type is refused as an event and as a signal,
	// plain or keyed: 400 invalid_event saying it is reserved (issue 32).
	for _, typ := range eventbus.ReservedTypes() {
		for _, c := range []struct {
			path, body string
			header     map[string]string
		}{
			{"/session/s/events", `{"type":"` + typ + `"}`, nil},
			{"/session/s/events", `{"type":"` + typ + `"}`, map[string]string{"Idempotency-Key": "k-" + typ}},
			{"/session/s/signal", `{"type":"` + typ + `","about":"d"}`, nil},
		} {
			code, v, _ := do("POST", c.path, c.body, c.header)
			if msg, _ := v["error"].(string); code != 400 || v["code"] != "invalid_event" || !strings.Contains(msg, "reserved") {
				t.Fatalf("POST %s of type %s (header %v): %d %v, want 400 invalid_event saying it is reserved", c.path, typ, c.header, code, v)
			}
		}
	}
	if code, v, _ := do("GET", "/session/s", "", nil); code != 200 || v["lastEventId"] != float64(2) || v["streams"] != float64(1) || v["replica"] != "R1" {
		t.Fatalf("status: %d %v", code, v)
	}
	if code, _, _ := do("GET", "/session/none", "", nil); code != 404 {
		t.Fatalf("status of an unknown session: %d", code)
	}
	if code, v, _ := do("POST", "/session/s/disconnect?mode=x", "", nil); code != 400 || v["code"] != "invalid_mode" {
		t.Fatalf("disconnect with a bad mode: %d %v", code, v)
	}
	if code, v, _ := do("POST", "/session/s/disconnect", "", nil); code != 200 || v["disconnected"] != float64(1) || v["mode"] != "clean" {
		t.Fatalf("disconnect: %d %v", code, v)
	}
	s.Ended(5 * time.Second)
	// An id eventbus.CheckSessionID refuses ("a%FF"), and one the engine's
	// own rule refuses ("bad"), are 400 invalid_session_id on every route;
	// the first never reaches the engine.
	for _, id := range []string{"a%FF", "a%FE", "bad"} {
		for _, c := range []struct{ method, path, body string }{
			{"GET", "/session/" + id + "/events", ""},
			{"POST", "/session/" + id + "/events", `{"type":"e"}`},
			{"POST", "/session/" + id + "/signal", `{"type":"doc.changed","about":"d"}`},
			{"GET", "/session/" + id, ""},
			{"DELETE", "/session/" + id, ""},
			{"POST", "/session/" + id + "/disconnect", ""},
		} {
			if id == "bad" && strings.HasSuffix(c.path, "/disconnect") {
				continue // the engine is not asked: nothing to refuse
			}
			if code, v, _ := do(c.method, c.path, c.body, nil); code != 400 || v["code"] != "invalid_session_id" {
				t.Fatalf("%s %s: %d %v, want 400 invalid_session_id", c.method, c.path, code, v)
			}
		}
	}
	fb.mu.Lock()
	_, reached := fb.buses["a\xff"]
	fb.mu.Unlock()
	if reached {
		t.Fatal("an id that is not UTF-8 reached the engine")
	}
	if code, _, _ := do("DELETE", "/session/s", "", nil); code != 204 {
		t.Fatalf("delete: %d", code)
	}
	// Without -auth-token too, a wrong method is the JSON 405.
	if code, v, h := do("PUT", "/session/s/events", "", nil); code != 405 || v["code"] != "method_not_allowed" || !strings.Contains(h.Get("Allow"), "POST") {
		t.Fatalf("PUT: %d %v Allow %q, want a JSON 405", code, v, h.Get("Allow"))
	}

	fb.set(errFakeUnavailable)
	for _, c := range []struct{ method, path, body, code string }{
		{"GET", "/session/s/events", "", "unavailable"},
		{"POST", "/session/s/events", `{"type":"e"}`, "unavailable"},
		{"GET", "/session/s", "", "unavailable"},
		{"DELETE", "/session/s", "", "unavailable"},
	} {
		if code, v, h := do(c.method, c.path, c.body, nil); code != 503 || v["code"] != c.code || h.Get("Retry-After") == "" {
			t.Fatalf("%s %s with the engine down: %d %v %v", c.method, c.path, code, v, h)
		}
	}
	fb.set(errFakeUnknown)
	if code, v, _ := do("POST", "/session/s/events", `{"type":"e"}`, nil); code != 503 || v["code"] != "publish_outcome_unknown" {
		t.Fatalf("outcome unknown: %d %v", code, v)
	}
	resp, err := client.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	idx, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(idx) != "sessiond-test replica R1\n\nusage text\n\n" {
		t.Fatalf("index %q", idx)
	}
}

// A replica with -auth-token: the stream and the other routes need
// credentials, an anonymous stream does not reach the engine, and a logout
// ends the replica's streams of the subject.
func TestReplicaAuth(t *testing.T) {
	fb := &fakeBackplane{buses: map[string]*eventbus.EventBus{}, keys: map[string]uint64{}}
	defer fb.close()
	auth, err := NewAuth(AuthOptions{Token: "tok", Realm: "sessiond-test"})
	if err != nil {
		t.Fatal(err)
	}
	r := NewReplica(&Replica{
		Daemon: "sessiond-test", Name: "R1", Engine: "Fake", Backplane: fb,
		Errors: EngineErrors{InvalidSession: errFakeSession, Unavailable: errFakeUnavailable},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), MaxBody: MaxBody(0), Auth: auth,
		WebSocket: func(m *eventbus.MuxHandler, track StreamContext) http.Handler { return trackedMux{m, track} },
	}, &eventbus.Handler{Heartbeat: time.Hour})
	srv := httptest.NewServer(r.Routes())
	defer srv.Close()
	client := srv.Client()
	defer client.CloseIdleConnections()
	send := func(method, path, body string, header http.Header) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	for _, c := range []struct{ method, path string }{
		{"GET", "/session/s/events"}, {"POST", "/session/s/events"}, {"GET", "/session/s"},
		{"GET", "/events?session=s"}, {"GET", "/ws?session=s"},
	} {
		if resp := send(c.method, c.path, `{"type":"e"}`, nil); resp.StatusCode != 401 || resp.Header.Get("WWW-Authenticate") != `Bearer realm="sessiond-test"` {
			t.Fatalf("anonymous %s %s: %s %v", c.method, c.path, resp.Status, resp.Header)
		}
	}
	fb.mu.Lock()
	reached := len(fb.buses)
	fb.mu.Unlock()
	if reached != 0 {
		t.Fatal("an anonymous request reached the engine")
	}
	bearer := http.Header{"Authorization": {"Bearer tok"}}
	s := backplanetest.Open(t, client, srv.URL+"/session/s/events", map[string]string{"Authorization": "Bearer tok"})
	if resp := send("POST", "/session/s/events", `{"type":"e"}`, bearer); resp.StatusCode != 200 {
		t.Fatalf("publish with the token: %s", resp.Status)
	}
	backplanetest.WantIDs(t, s.Events(1, 5*time.Second), 1, 1)
	if resp := send("POST", "/revoke", `{"subject":"bearer"}`, bearer); resp.StatusCode != 200 {
		t.Fatalf("revoke: %s", resp.Status)
	}
	rest := s.Ended(5 * time.Second)
	if len(rest) != 1 || rest[0].Event != eventbus.TypeStreamError || rest[0].Str(t, "data", "errorKind") != eventbus.ErrorKindRevoked {
		t.Fatalf("the stream ended with %+v, want stream_error revoked", rest)
	}
}

// A replica daemon refuses -cors-origin "*" with -cors-credentials before it
// listens, and closes its backplane (issue 22).
func TestReplicaServeRefusesStarWithCredentials(t *testing.T) {
	rf, err := ParseReplicaFlags("testd-replica", "example.com/testd", "testbus", "TestDB",
		[]string{"-addr", "127.0.0.1:0", "-cors-origin", "*", "-cors-credentials"}, io.Discard, func(*flag.FlagSet) {})
	if err != nil {
		t.Fatal(err)
	}
	closed := 0
	err = rf.Serve(context.Background(), ReplicaServer{Events: &eventbus.Handler{}, Close: func() { closed++ }})
	if err == nil || !strings.Contains(err.Error(), `-cors-origin "*" with -cors-credentials`) {
		t.Fatalf("Serve: %v", err)
	}
	if closed != 1 {
		t.Fatalf("the backplane was closed %d times, want 1", closed)
	}
}

// The replica's multiplexed routes on a fake engine: GET /events serves
// the sessions on one stream and never creates one (404 naming it, the
// engine untouched), and GET /ws goes to the handler Replica.WebSocket
// made from the replica's MuxHandler, tracked for /disconnect; without
// WebSocket there is no /ws.
func TestReplicaMuxAndWebSocketHook(t *testing.T) {
	fb := &fakeBackplane{buses: map[string]*eventbus.EventBus{}, keys: map[string]uint64{}}
	t.Cleanup(fb.close)
	var hooked *eventbus.MuxHandler
	r := NewReplica(&Replica{
		Daemon: "sessiond-test", Name: "R1", Engine: "Fake", Backplane: fb,
		Errors: ReplicaErrors(errFakeUnknown, errFakeSession, errFakeUnavailable),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), MaxBody: MaxBody(0),
		MaxStreamSessions: 2,
		// The daemons' hook is a websocket.Handler{Mux: m, StreamContext:
		// track}; here the mux itself serves /ws, under track's context
		// (the root module has no WebSocket library).
		WebSocket: func(m *eventbus.MuxHandler, track StreamContext) http.Handler {
			hooked = m
			return trackedMux{m, track}
		},
	}, &eventbus.Handler{Heartbeat: time.Hour})
	if hooked == nil || hooked != r.mux || hooked.Handler != r.events {
		t.Fatalf("the hook got %p, want the replica's MuxHandler on its SSE handler", hooked)
	}
	srv := httptest.NewServer(r.Routes())
	t.Cleanup(srv.Close)
	client := srv.Client()
	t.Cleanup(client.CloseIdleConnections)
	get := func(path string) (int, map[string]any) {
		t.Helper()
		resp, err := client.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		json.NewDecoder(resp.Body).Decode(&v)
		return resp.StatusCode, v
	}
	for _, path := range []string{"/events?session=nope", "/ws?session=nope"} {
		if code, v := get(path); code != 404 || v["code"] != "session_not_found" || v["session"] != "nope" {
			t.Fatalf("GET %s: %d %v, want 404 naming nope", path, code, v)
		}
	}
	if code, v := get("/events?session=a&session=b&session=c"); code != 400 || v["code"] != "invalid_sessions" {
		t.Fatalf("three sessions past -max-stream-sessions 2: %d %v", code, v)
	}
	fb.mu.Lock()
	made := len(fb.buses)
	fb.mu.Unlock()
	if made != 0 {
		t.Fatalf("the multiplexed routes made %d sessions in the engine, want none", made)
	}
	fb.Publish(context.Background(), "a", eventbus.Event{Type: "e"})
	fb.Publish(context.Background(), "b", eventbus.Event{Type: "e"})
	for _, path := range []string{"/events", "/ws"} {
		s := backplanetest.Open(t, client, srv.URL+path+"?session=a&session=b&lastEventId=0", nil)
		seen := map[string]bool{}
		for len(seen) < 2 {
			f := s.Next(5 * time.Second)
			if f.Event == "e" {
				seen[f.Str(t, "session")] = true
			}
		}
		resp, err := client.Post(srv.URL+"/session/b/disconnect", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if v["disconnected"] != float64(1) {
			t.Fatalf("%s: disconnect of b: %v, want the stream cut", path, v)
		}
		s.Ended(5 * time.Second)
	}

	plain := NewReplica(&Replica{Name: "R2", Backplane: fb, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, &eventbus.Handler{})
	srv2 := httptest.NewServer(plain.Routes())
	defer srv2.Close()
	resp, err := srv2.Client().Get(srv2.URL + "/ws?session=a")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("GET /ws without a WebSocket hook: %s, want 404", resp.Status)
	}
}

// trackedMux serves a multiplexed SSE stream as websocket.Handler serves
// its streams: under the context its StreamContext (track) gives, calling
// its func once the stream has ended.
type trackedMux struct {
	m     *eventbus.MuxHandler
	track StreamContext
}

func (t trackedMux) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, done := t.track(r)
	defer done()
	t.m.ServeHTTP(w, r.WithContext(ctx))
}
