package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/internal/daemon"
)

const testToken = "demo-token"

// newAuthServer is newTestServer with -auth-token testToken and
// -token-lifetime lifetime.
func newAuthServer(t *testing.T, lifetime time.Duration) (*server, *httptest.Server) {
	t.Helper()
	return newAuthServerWith(t, lifetime, config{})
}

// newAuthServerWith is newAuthServer with the rest of cfg.
func newAuthServerWith(t *testing.T, lifetime time.Duration, cfg config) (*server, *httptest.Server) {
	t.Helper()
	auth, err := daemon.NewAuth(daemon.AuthOptions{Token: testToken, Lifetime: lifetime, Realm: "sessiond"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Logger, cfg.Auth = slog.New(slog.NewTextHandler(io.Discard, nil)), auth
	if cfg.Stream == nil {
		cfg.Stream = bareIDs
	}
	s, err := newServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.routes())
	t.Cleanup(func() {
		s.closeAll()
		ts.Close()
		http.DefaultClient.CloseIdleConnections()
	})
	return s, ts
}

func bearer() http.Header { return http.Header{"Authorization": {"Bearer " + testToken}} }

// loginCookie logs in as subject and returns the Cookie header to send.
func loginCookie(t *testing.T, ts *httptest.Server, subject string) http.Header {
	t.Helper()
	r := call(t, http.MethodPost, ts.URL+"/login", nil, `{"token":"`+testToken+`","subject":"`+subject+`"}`)
	if r.status != http.StatusOK || r.json(t)["subject"] != subject {
		t.Fatalf("login: %d %s", r.status, r.body)
	}
	for _, c := range (&http.Response{Header: r.header}).Cookies() {
		if c.Name == daemon.AuthCookie {
			return http.Header{"Cookie": {c.Name + "=" + c.Value}}
		}
	}
	t.Fatalf("login set no cookie: %v", r.header)
	return nil
}

func withHeader(h http.Header, k, v string) http.Header {
	h = h.Clone()
	h.Set(k, v)
	return h
}

// readIDs reads the stream to its end and returns the ids of its events
// (type "a") and the errorKind of its terminal stream_error ("" without).
func readIDs(t *testing.T, s *sseStream) (ids []uint64, kind string) {
	t.Helper()
	for {
		f, err := s.next()
		if errors.Is(err, io.EOF) {
			return ids, kind
		}
		if err != nil {
			t.Fatal(err)
		}
		switch f.event {
		case eventbus.TypeStreamError:
			var env struct {
				Data struct {
					ErrorKind string `json:"errorKind"`
				} `json:"data"`
			}
			if err := json.Unmarshal([]byte(f.data), &env); err != nil {
				t.Fatal(err)
			}
			kind = env.Data.ErrorKind
		case "a":
			n, err := strconv.ParseUint(f.id, 10, 64)
			if err != nil {
				t.Fatalf("id %q: %v", f.id, err)
			}
			ids = append(ids, n)
		}
	}
}

func TestAuthTokenAndCookie(t *testing.T) {
	_, ts := newAuthServer(t, 0)
	events := ts.URL + "/session/a/events"

	// Without credentials nothing works, and no session is created.
	r := call(t, http.MethodGet, events, nil, "")
	if r.status != http.StatusUnauthorized || r.json(t)["code"] != "unauthorized" || r.header.Get("WWW-Authenticate") != `Bearer realm="sessiond"` {
		t.Fatalf("anonymous stream: %d %v %s", r.status, r.header, r.body)
	}
	if r := call(t, http.MethodPost, events, nil, `{"type":"a"}`); r.status != http.StatusUnauthorized {
		t.Fatalf("anonymous publish: %d %s", r.status, r.body)
	}
	if r := call(t, http.MethodGet, ts.URL+"/session/a", bearer(), ""); r.status != http.StatusNotFound {
		t.Fatalf("the anonymous requests created the session: %d %s", r.status, r.body)
	}
	if r := call(t, http.MethodGet, events, http.Header{"Authorization": {"Bearer wrong"}}, ""); r.status != http.StatusUnauthorized ||
		r.header.Get("WWW-Authenticate") != `Bearer realm="sessiond", error="invalid_token"` {
		t.Fatalf("a wrong token: %d %v", r.status, r.header)
	}

	// The token, as a header.
	if r := call(t, http.MethodPost, events, bearer(), `{"type":"a","data":1}`); r.status != http.StatusOK {
		t.Fatalf("publish with the token: %d %s", r.status, r.body)
	}
	s := openStream(t, events, withHeader(bearer(), "Last-Event-ID", "0"))
	if f, _ := s.mustNext(t); f.id != "1" {
		t.Fatalf("stream with the token: %+v", f)
	}
	s.close()

	// The cookie of POST /login, as a browser's EventSource sends it.
	cookie := loginCookie(t, ts, "alice")
	c := openStream(t, events, withHeader(cookie, "Last-Event-ID", "0"))
	if f, _ := c.mustNext(t); f.id != "1" {
		t.Fatalf("stream with the cookie: %+v", f)
	}
	if r := call(t, http.MethodPost, events, cookie, `{"type":"a","data":2}`); r.status != http.StatusOK {
		t.Fatalf("publish with the cookie: %d %s", r.status, r.body)
	}
	c.mustNext(t) // replay_complete
	if f, _ := c.mustNext(t); f.id != "2" {
		t.Fatalf("live with the cookie: %+v", f)
	}

	// The viewer knows it has to log in.
	if r := call(t, http.MethodGet, ts.URL+"/", nil, ""); r.status != http.StatusOK || !bytes.Contains(r.body, []byte(`<body data-auth="on">`)) {
		t.Fatalf("index with -auth-token: %d", r.status)
	}
	// It loads the client's modules before any login.
	if r := call(t, http.MethodGet, ts.URL+daemon.ClientPrefix+"/index.js", nil, ""); r.status != http.StatusOK {
		t.Fatalf("the client's modules with -auth-token and no credentials: %d %s", r.status, r.body)
	}
}

func TestAuthWithoutFlagsChangesNothing(t *testing.T) {
	srv, ts := newTestServer(t, eventbus.Options{})
	for _, path := range []string{"/login", "/logout", "/revoke"} {
		if r := call(t, http.MethodPost, ts.URL+path, nil, `{}`); r.status != http.StatusNotFound || r.json(t)["code"] != "not_found" {
			t.Fatalf("POST %s without -auth-token: %d %s", path, r.status, r.body)
		}
	}
	if r := call(t, http.MethodGet, ts.URL+"/", nil, ""); !bytes.Contains(r.body, []byte(`<body data-auth="off">`)) {
		t.Fatal("the viewer shows its login form without -auth-token")
	}
	srv.create(t, "x")
	s := openStream(t, ts.URL+"/session/x/events", nil) // no credentials needed
	publish(t, ts, "x", `{"type":"a"}`)
	if f, _ := s.mustNext(t); f.id != "1" {
		t.Fatalf("%+v", f)
	}
}

func TestAuthTokenLifetimeResumesWithoutLoss(t *testing.T) {
	const lifetime = 400 * time.Millisecond
	s, ts := newAuthServer(t, lifetime)
	events := ts.URL + "/session/l/events"
	s.create(t, "l")
	stop := make(chan struct{})
	published := make(chan uint64, 1)
	go func() {
		var last uint64
		defer func() { published <- last }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			r := call(t, http.MethodPost, events, bearer(), `{"type":"a"}`)
			if r.status != http.StatusOK {
				t.Errorf("publish: %d %s", r.status, r.body)
				return
			}
			last = uint64(r.json(t)["id"].(float64))
		}
	}()

	// Three lifetimes with the token, then three with login cookies (a
	// fresh login each time, as the viewer does): each ends with
	// reauthenticate, and the next resumes from its last id.
	var ids []uint64
	cursor := "0"
	for i := range 6 {
		header := bearer()
		if i >= 3 {
			header = loginCookie(t, ts, "viewer")
		}
		start := time.Now()
		got, kind := readIDs(t, openStream(t, events, withHeader(header, "Last-Event-ID", cursor)))
		if kind != eventbus.ErrorKindReauthenticate {
			t.Fatalf("stream %d ended with errorKind %q after %v, want reauthenticate", i, kind, time.Since(start))
		}
		if d := time.Since(start); d < lifetime-50*time.Millisecond {
			t.Fatalf("stream %d ended after %v, before its lifetime %v", i, d, lifetime)
		}
		ids = append(ids, got...)
		if len(ids) > 0 {
			cursor = strconv.FormatUint(ids[len(ids)-1], 10)
		}
	}
	close(stop)
	last := <-published
	if uint64(len(ids)) < last {
		ids = append(ids, readIDsUntil(t, openStream(t, events, withHeader(bearer(), "Last-Event-ID", cursor)), last)...)
	}
	if uint64(len(ids)) != last {
		t.Fatalf("got %d ids for %d published", len(ids), last)
	}
	for i, id := range ids {
		if id != uint64(i+1) {
			t.Fatalf("ids[%d] = %d: a gap or a duplicate", i, id)
		}
	}
	// An expired login is refused: the client must log in again.
	cookie := loginCookie(t, ts, "viewer")
	time.Sleep(lifetime)
	if r := call(t, http.MethodGet, events, cookie, ""); r.status != http.StatusUnauthorized {
		t.Fatalf("an expired login: %d %s", r.status, r.body)
	}
}

// readIDsUntil reads event ids until it has seen last, then closes s.
func readIDsUntil(t *testing.T, s *sseStream, last uint64) []uint64 {
	t.Helper()
	defer s.close()
	var ids []uint64
	for {
		if len(ids) > 0 && ids[len(ids)-1] == last {
			return ids
		}
		f, err := s.next()
		if err != nil {
			t.Fatalf("reading to id %d: %v (got %v)", last, err, ids)
		}
		if f.id != "" && f.event == "a" {
			n, _ := strconv.ParseUint(f.id, 10, 64)
			ids = append(ids, n)
		}
	}
}

func TestAuthLogoutRevokesExactlyTheSubject(t *testing.T) {
	s, ts := newAuthServer(t, 0)
	events := ts.URL + "/session/r/events"
	s.create(t, "r")
	alice, bob := loginCookie(t, ts, "alice"), loginCookie(t, ts, "bob")
	a1, a2 := openStream(t, events, alice), openStream(t, events, alice)
	b1 := openStream(t, events, bob)
	tok := openStream(t, events, bearer())
	waitFor(t, "four streams", func() bool { return s.subscribers("r") == 4 })

	r := call(t, http.MethodPost, ts.URL+"/logout", alice, "")
	if r.status != http.StatusOK || r.json(t)["revoked"] != float64(2) || r.json(t)["subject"] != "alice" {
		t.Fatalf("logout: %d %s", r.status, r.body)
	}
	for _, st := range []*sseStream{a1, a2} {
		if ids, kind := readIDs(t, st); kind != eventbus.ErrorKindRevoked || len(ids) != 0 {
			t.Fatalf("alice's stream: ids %v, errorKind %q; want revoked", ids, kind)
		}
	}
	// Her reconnection with the old cookie is refused: final for her.
	if r := call(t, http.MethodGet, events, alice, ""); r.status != http.StatusUnauthorized {
		t.Fatalf("alice reconnecting after logout: %d %s", r.status, r.body)
	}
	// Bob and the token holder go on.
	call(t, http.MethodPost, events, bob, `{"type":"a"}`)
	for _, st := range []*sseStream{b1, tok} {
		if f, _ := st.mustNext(t); f.id != "1" {
			t.Fatalf("a stream of another subject: %+v", f)
		}
	}
	// /revoke ends the token's streams; the token itself stays valid.
	r = call(t, http.MethodPost, ts.URL+"/revoke", bob, `{"subject":"bearer"}`)
	if r.status != http.StatusOK || r.json(t)["revoked"] != float64(1) {
		t.Fatalf("revoke bearer: %d %s", r.status, r.body)
	}
	if _, kind := readIDs(t, tok); kind != eventbus.ErrorKindRevoked {
		t.Fatalf("the token's stream ended with %q", kind)
	}
	again := openStream(t, events, withHeader(bearer(), "Last-Event-ID", "1"))
	if f, _ := again.mustNext(t); f.event != eventbus.TypeReplayComplete {
		t.Fatalf("the token after a revocation: %+v", f)
	}
	b1.close()
	again.close()
}
