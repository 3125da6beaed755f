package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ssebus/eventbus"
)

// serve runs one request through the daemon's routes in memory.
func serve(h http.Handler, method, target, body string) (int, map[string]any, http.Header) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, target, strings.NewReader(body)))
	var v map[string]any
	json.Unmarshal(rec.Body.Bytes(), &v)
	return rec.Code, v, rec.Header()
}

// The lockout: 1000 HEADs of new sessions filled -max-sessions and
// every new session got 503 until a restart. Now a HEAD (or GET) of an
// unknown session is a 404 and creates nothing.
func TestHeadsOfUnknownSessionsLockNobodyOut(t *testing.T) {
	s, err := newServer(config{Logger: slog.New(slog.DiscardHandler)}) // -max-sessions 1000, the default
	if err != nil {
		t.Fatal(err)
	}
	defer s.closeAll()
	ts := httptest.NewServer(s.routes())
	defer ts.Close()
	client := ts.Client()
	defer client.CloseIdleConnections()
	for i := range eventbus.DefaultMaxSessions {
		method := http.MethodHead
		if i%2 == 1 {
			method = http.MethodGet
		}
		req, _ := http.NewRequest(method, fmt.Sprintf("%s/session/x%d/events", ts.URL, i), nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("%s of unknown session x%d: %d, want 404", method, i, resp.StatusCode)
		}
	}
	if n := s.hub.Len(); n != 0 {
		t.Fatalf("%d HEADs and GETs of unknown sessions left %d sessions, want 0", eventbus.DefaultMaxSessions, n)
	}
	if r := publish(t, ts, "fresh", `{"type":"a"}`); r.status != http.StatusOK {
		t.Fatalf("POST to a new session after the probe: %d %s", r.status, r.body)
	}
}

// A hub full of idle sessions admits a new one at once, through HTTP; a
// full hub of live ones answers 503 too_many_sessions with Retry-After.
func TestFullHubOfIdleSessionsAdmitsANewOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const idle = time.Minute
		s, err := newServer(config{Hub: eventbus.HubOptions{MaxSessions: 3, IdleTimeout: idle}, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer s.closeAll()
		h := s.routes()
		post := func(session string) (int, map[string]any, http.Header) {
			return serve(h, http.MethodPost, "/session/"+session+"/events", `{"type":"a"}`)
		}
		for _, id := range []string{"a", "b", "c"} {
			if code, v, _ := post(id); code != http.StatusOK {
				t.Fatalf("POST %s: %d %v", id, code, v)
			}
		}
		// "a" has a subscriber: it never expires.
		bus, _ := s.hub.Lookup("a")
		sub, err := bus.Subscribe(context.Background(), eventbus.SubscribeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()

		time.Sleep(idle / 2)
		if code, v, hdr := post("d"); code != http.StatusServiceUnavailable || v["code"] != "too_many_sessions" || hdr.Get("Retry-After") == "" {
			t.Fatalf("POST to a 4th session while 3 are live: %d %v Retry-After %q, want 503 too_many_sessions", code, v, hdr.Get("Retry-After"))
		}
		time.Sleep(idle/2 + time.Millisecond) // b and c are idle past the timeout now
		for _, id := range []string{"d", "e"} {
			if code, v, _ := post(id); code != http.StatusOK || v["id"] != float64(1) {
				t.Fatalf("POST %s to a hub full of idle sessions: %d %v, want 200 id 1", id, code, v)
			}
		}
		if code, _, _ := serve(h, http.MethodGet, "/session/b", ""); code != http.StatusNotFound {
			t.Fatalf("the expired session b: status %d, want 404", code)
		}
		if code, v, _ := serve(h, http.MethodGet, "/session/a", ""); code != http.StatusOK || v["subscribers"] != float64(1) {
			t.Fatalf("the subscribed session a: %d %v, want it kept", code, v)
		}
		if st := s.hub.Stats(); st.Sessions != 3 || st.Expired != 2 || st.Refused != 1 {
			t.Fatalf("hub stats %+v, want 3 sessions, 2 expired, 1 refused", st)
		}
	})
}

// The daemon's records of sessions beside the hub stay within a constant
// factor of the live sessions while sessions come and go.
func TestSessionRecordsFollowTheHub(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := newServer(config{Hub: eventbus.HubOptions{MaxSessions: 10, IdleTimeout: time.Second}, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer s.closeAll()
		h := s.routes()
		for i := range 2000 {
			if code, v, _ := serve(h, http.MethodPost, fmt.Sprintf("/session/s%d/events", i), `{"type":"a"}`); code != http.StatusOK {
				t.Fatalf("POST %d: %d %v", i, code, v)
			}
			if i%10 == 9 {
				time.Sleep(2 * time.Second)
			}
		}
		n := 0
		s.meta.Range(func(any, any) bool { n++; return true })
		if n != int(s.metaLen.Load()) {
			t.Fatalf("%d session records, counted %d", n, s.metaLen.Load())
		}
		if limit := 2*s.hub.Len() + 64; n > limit {
			t.Fatalf("%d session records for %d live sessions, want at most %d", n, s.hub.Len(), limit)
		}
	})
}

// With -create-on-stream a GET or HEAD of the stream creates its session
// (as before the hub, for clients' tests).
func TestCreateOnStream(t *testing.T) {
	s, err := newServer(config{CreateOnStream: true, Hub: eventbus.HubOptions{MaxSessions: 1}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.closeAll()
	ts := httptest.NewServer(s.routes())
	defer ts.Close()
	if r := do(t, http.MethodHead, ts.URL+"/session/h/events", ""); r.status != http.StatusOK || s.hub.Len() != 1 {
		t.Fatalf("HEAD: %d, %d sessions; want 200 and its session", r.status, s.hub.Len())
	}
	s.hub.Delete("h")
	st := openStream(t, ts.URL+"/session/g/events", nil)
	defer st.close()
	if _, ok := s.hub.Lookup("g"); !ok {
		t.Fatal("the GET did not create its session")
	}
	if r := do(t, http.MethodGet, ts.URL+"/session/other/events", ""); r.status != http.StatusServiceUnavailable || r.json(t)["code"] != "too_many_sessions" ||
		r.header.Get("Retry-After") == "" {
		t.Fatalf("GET of a second session over -max-sessions 1: %d %s", r.status, r.body)
	}
}
