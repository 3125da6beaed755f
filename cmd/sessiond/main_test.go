package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/internal/daemon"
	"github.com/ssebus/eventbus/sseclient"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newTestServer serves a fresh daemon over httptest. Cleanup closes every bus
// first, so open streams end and the httptest server can close.
func newTestServer(t *testing.T, opts eventbus.Options) (*server, *httptest.Server) {
	t.Helper()
	s, err := newServer(config{
		Hub:    eventbus.HubOptions{Bus: opts},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Stream: bareIDs,
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(s.routes())
	ts.Config.ConnContext = daemon.ConnContext // as daemon.Server, for /disconnect?mode=abort
	ts.Start()
	t.Cleanup(func() {
		s.closeAll()
		ts.Close()
		http.DefaultClient.CloseIdleConnections()
	})
	return s, ts
}

// bareIDs is the Stream setting of the tests that read SPEC 5.3's id
// lines ("id: N"); the daemon's own default (-epoch-ids) is tested apart.
func bareIDs(h *eventbus.Handler) error {
	h.BareIDs = true
	return nil
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("response body %q is not a JSON object: %v", r.body, err)
	}
	return m
}

func do(t *testing.T, method, url, body string) response {
	t.Helper()
	return call(t, method, url, nil, body)
}

// call sends a request with header and body and returns the answer.
func call(t *testing.T, method, url string, header http.Header, body string) response {
	t.Helper()
	return callWith(t, http.DefaultClient, method, url, header, body)
}

// callWith is call with client.
func callWith(t *testing.T, client *http.Client, method, url string, header http.Header, body string) response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{resp.StatusCode, resp.Header, b}
}

func publish(t *testing.T, ts *httptest.Server, session, body string) response {
	t.Helper()
	return do(t, http.MethodPost, ts.URL+"/session/"+session+"/events", body)
}

// status returns GET /session/{id} decoded, or nil on 404.
func status(t *testing.T, ts *httptest.Server, session string) map[string]any {
	t.Helper()
	r := do(t, http.MethodGet, ts.URL+"/session/"+session, "")
	if r.status == http.StatusNotFound {
		return nil
	}
	if r.status != http.StatusOK {
		t.Fatalf("status of %s: %d %s", session, r.status, r.body)
	}
	return r.json(t)
}

// waitFor waits for cond with require.Eventually, as the root package's
// tests do, within the bound of the daemon's tests (5 s).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 5*time.Second, 5*time.Millisecond, "waiting for %s", what)
}

// sseFrame is one event of a stream.
type sseFrame struct {
	id, event, data string // id: "" when the event has no id field
}

// sseStream reads events from one GET /session/{id}/events response with
// sseclient.Parser.
type sseStream struct {
	resp   *http.Response
	p      *sseclient.Parser
	cancel context.CancelFunc
}

func openStream(t *testing.T, url string, header http.Header) *sseStream {
	t.Helper()
	return openStreamWith(t, http.DefaultClient, url, header)
}

// openStreamWith is openStream with client.
func openStreamWith(t *testing.T, client *http.Client, url string, header http.Header) *sseStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := client.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	s := &sseStream{resp: resp, p: sseclient.NewParser(resp.Body), cancel: cancel}
	t.Cleanup(s.close)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("GET %s: Content-Type %q", url, ct)
	}
	return s
}

func (s *sseStream) close() {
	s.cancel()
	s.resp.Body.Close()
}

// next returns the next event; comments and retry fields are skipped. At
// the end of the stream it returns io.EOF (an event the end cut off is
// dropped, as the standard says); a read error is wrapped.
func (s *sseStream) next() (sseFrame, error) {
	for {
		m, err := s.p.Next()
		if err == io.EOF {
			return sseFrame{}, io.EOF
		}
		if err != nil {
			return sseFrame{}, fmt.Errorf("reading stream: %w", err)
		}
		if m.Kind == sseclient.KindEvent {
			return sseFrame{id: m.ID, event: m.Type, data: string(m.Data)}, nil
		}
	}
}

func (s *sseStream) mustNext(t *testing.T) (sseFrame, map[string]any) {
	t.Helper()
	f, err := s.next()
	if err != nil {
		t.Fatal(err)
	}
	var env map[string]any
	if err := json.Unmarshal([]byte(f.data), &env); err != nil {
		t.Fatalf("frame data %q: %v", f.data, err)
	}
	return f, env
}

func (s *sseStream) mustEnd(t *testing.T) {
	t.Helper()
	for {
		f, err := s.next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("stream did not end cleanly: %v (last frame %+v)", err, f)
		}
	}
}

func TestPublishAssignsIDsAndEncodesTheBody(t *testing.T) {
	_, ts := newTestServer(t, eventbus.Options{})

	r := publish(t, ts, "s1", `{"type":"chat","data":{"text":"hi","n":[1, 2]},"originatorClientId":"c1"}`)
	if r.status != http.StatusOK || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("POST: %d %q %s", r.status, r.header.Get("Content-Type"), r.body)
	}
	first := r.json(t)
	if first["id"] != float64(1) {
		t.Fatalf("first id: %s", r.body)
	}
	epoch, _ := first["epoch"].(string)
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(epoch) {
		t.Fatalf("epoch %q", epoch)
	}
	r = publish(t, ts, "s1", `{"type":"chat","originatorClientId":""}`)
	if got := r.json(t); r.status != http.StatusOK || got["id"] != float64(2) || got["epoch"] != epoch {
		t.Fatalf("second POST: %d %s", r.status, r.body)
	}
	if st := status(t, ts, "s1"); st["lastEventId"] != float64(2) || st["epoch"] != epoch {
		t.Fatalf("status: %v", st)
	}

	// Resume from the start to see what was stored.
	s := openStream(t, ts.URL+"/session/s1/events", http.Header{"Last-Event-Id": {"0"}})
	f, _ := s.mustNext(t)
	if f.id != "1" || f.event != "chat" ||
		!strings.HasPrefix(f.data, `{"id":1,"v":1,"type":"chat","data":{"text":"hi","n":[1,2]},"_meta":{"serverTimestamp":`) ||
		!strings.HasSuffix(f.data, `},"originatorClientId":"c1"}`) {
		t.Fatalf("first frame: %+v", f)
	}
	f, env := s.mustNext(t)
	if f.id != "2" {
		t.Fatalf("second frame: %+v", f)
	}
	for _, k := range []string{"data", "originatorClientId"} {
		if _, ok := env[k]; ok {
			t.Errorf("second frame has %q although the POST left it empty: %s", k, f.data)
		}
	}
	f, env = s.mustNext(t)
	if f.event != eventbus.TypeReplayComplete || f.id != "" {
		t.Fatalf("after the replay: %+v", f)
	}
	if d, _ := env["data"].(map[string]any); d["replayedCount"] != float64(2) {
		t.Fatalf("replay_complete: %s", f.data)
	}
}

func TestPublishRejectsBadBodiesAndPublishesNothing(t *testing.T) {
	_, ts := newTestServer(t, eventbus.Options{})
	cases := []struct {
		name, body, code string
	}{
		{"not json", `not json`, "invalid_body"},
		{"empty", ``, "invalid_body"},
		{"array", `[1]`, "invalid_body"},
		{"truncated", `{"type":"a"`, "invalid_body"},
		{"two values", `{"type":"a"} {"type":"b"}`, "invalid_body"},
		{"unknown field", `{"type":"a","id":7}`, "invalid_body"},
		{"type not a string", `{"type":1}`, "invalid_body"},
		{"bad data", `{"type":"a","data":{x}}`, "invalid_body"},
		{"missing type", `{"data":1}`, "invalid_event"},
		{"empty type", `{"type":""}`, "invalid_event"},
		{"type with LF", `{"type":"a\nb"}`, "invalid_event"},
		{"type with CR", `{"type":"a\rb"}`, "invalid_event"},
	}
	// A synthetic frame's type is refused too (issue 32): published, it
	// would go out as that frame to every EventSource listening for it.
	for _, typ := range eventbus.ReservedTypes() {
		cases = append(cases, struct{ name, body, code string }{"reserved " + typ, `{"type":"` + typ + `","data":{}}`, "invalid_event"})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := publish(t, ts, "bad", c.body)
			if r.status != http.StatusBadRequest || r.header.Get("Content-Type") != "application/json" {
				t.Fatalf("%d %q %s", r.status, r.header.Get("Content-Type"), r.body)
			}
			got := r.json(t)
			if got["code"] != c.code || got["error"] == "" {
				t.Fatalf("body %s, want code %q", r.body, c.code)
			}
			if strings.HasPrefix(c.name, "reserved ") && !strings.Contains(got["error"].(string), "reserved") {
				t.Fatalf("body %s does not say the type is reserved", r.body)
			}
		})
	}
	// With an Idempotency-Key (the fingerprint is taken first) the answer
	// is the same.
	if r := postKeyed(t, ts, "bad", "k", `{"type":"client_evicted"}`); r.status != http.StatusBadRequest || r.json(t)["code"] != "invalid_event" {
		t.Fatalf("a keyed publish of a reserved type: %d %s", r.status, r.body)
	}
	if st := status(t, ts, "bad"); st != nil && st["lastEventId"] != float64(0) {
		t.Fatalf("a rejected POST published something: %v", st)
	}
	// The next good event still gets id 1, and the refused keyed publish
	// recorded no key (its reuse with another event would be a 422).
	if r := postKeyed(t, ts, "bad", "k", `{"type":"ok"}`); r.status != http.StatusOK || r.json(t)["id"] != float64(1) {
		t.Fatalf("%d %s", r.status, r.body)
	}
}

func TestPublishTooLargeIs413(t *testing.T) {
	_, ts := newTestServer(t, eventbus.Options{MaxEventBytes: 1024})

	big := `{"type":"blob","data":"` + strings.Repeat("x", 2000) + `"}`
	r := publish(t, ts, "big", big)
	if r.status != http.StatusRequestEntityTooLarge || r.json(t)["code"] != "event_too_large" {
		t.Fatalf("event over MaxEventBytes: %d %s", r.status, r.body)
	}
	// A body past MaxEventBytes+bodySlack is cut off before it is read to the end.
	huge := `{"type":"blob","data":"` + strings.Repeat("x", 1024+bodySlack) + `"}`
	r = publish(t, ts, "big", huge)
	if r.status != http.StatusRequestEntityTooLarge || r.json(t)["code"] != "body_too_large" {
		t.Fatalf("body over the limit: %d %s", r.status, r.body)
	}
	// Whitespace that compaction removes does not count toward the event size.
	spaced := `{"type":"blob","data":[` + strings.Repeat(" ", 4000) + `1]}`
	if r := publish(t, ts, "big", spaced); r.status != http.StatusOK || r.json(t)["id"] != float64(1) {
		t.Fatalf("spaced small event: %d %s", r.status, r.body)
	}
}

// Every route that names a session refuses an id eventbus.CheckSessionID
// refuses with 400 invalid_session_id (the multiplexed stream's list with
// invalid_sessions), and none creates a session: "a%FF" and "a%FE" would
// both be "a\ufffd" on a multiplexed stream (issue 32 point 2).
func TestInvalidSessionIDsAreRefused(t *testing.T) {
	s, ts := newTestServer(t, eventbus.Options{})
	long := strings.Repeat("s", eventbus.MaxSessionIDBytes+1)
	for _, raw := range []string{"a%FF", "a%FE", "%80", "caf%C3", "%ED%A0%80", long} {
		for _, rt := range []struct {
			method, path, body string
		}{
			{http.MethodPost, "/session/" + raw + "/events", `{"type":"a"}`},
			{http.MethodGet, "/session/" + raw + "/events", ""},
			{http.MethodHead, "/session/" + raw + "/events", ""},
			{http.MethodGet, "/session/" + raw, ""},
			{http.MethodDelete, "/session/" + raw, ""},
			{http.MethodPost, "/session/" + raw + "/disconnect", ""},
		} {
			r := do(t, rt.method, ts.URL+rt.path, rt.body)
			if r.status != http.StatusBadRequest {
				t.Fatalf("%s %s: %d %s, want 400", rt.method, rt.path, r.status, r.body)
			}
			if rt.method != http.MethodHead {
				if m := r.json(t); m["code"] != "invalid_session_id" || !strings.HasPrefix(m["error"].(string), "eventbus: invalid session id: ") {
					t.Fatalf("%s %s: %s, want invalid_session_id", rt.method, rt.path, r.body)
				}
			}
		}
		r := do(t, http.MethodGet, ts.URL+"/events?session=ok&session="+raw, "")
		if r.status != http.StatusBadRequest || r.json(t)["code"] != "invalid_sessions" || !strings.Contains(r.json(t)["error"].(string), "session 2: ") {
			t.Fatalf("the multiplexed stream of %s: %d %s, want 400 invalid_sessions naming session 2", raw, r.status, r.body)
		}
	}
	if n := s.hub.Len(); n != 0 {
		t.Fatalf("%d sessions after the refused requests, want none", n)
	}
	// The same idempotent publish is refused too, before its key is read.
	r := call(t, http.MethodPost, ts.URL+"/session/a%FF/events", http.Header{"Idempotency-Key": {"k"}}, `{"type":"a"}`)
	if r.status != http.StatusBadRequest || r.json(t)["code"] != "invalid_session_id" {
		t.Fatalf("keyed POST: %d %s", r.status, r.body)
	}
	// The longest id, and UTF-8 beyond ASCII, are sessions.
	for _, raw := range []string{strings.Repeat("s", eventbus.MaxSessionIDBytes), "caf%C3%A9"} {
		if r := publish(t, ts, raw, `{"type":"a"}`); r.status != http.StatusOK {
			t.Fatalf("POST %s: %d %s", raw, r.status, r.body)
		}
		if st := status(t, ts, raw); st == nil {
			t.Fatalf("no status of %s", raw)
		}
	}
	if st := status(t, ts, "caf%C3%A9"); st["id"] != "caf\u00e9" {
		t.Fatalf("status of caf\u00e9: %v", st)
	}
}

func TestMaxSessionsAndShutdownAreRefusedClearly(t *testing.T) {
	s, err := newServer(config{Hub: eventbus.HubOptions{MaxSessions: 1}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.routes())
	defer ts.Close()
	defer s.closeAll()

	if r := publish(t, ts, "one", `{"type":"a"}`); r.status != http.StatusOK {
		t.Fatalf("first session: %d %s", r.status, r.body)
	}
	if r := publish(t, ts, "two", `{"type":"a"}`); r.status != http.StatusServiceUnavailable || r.json(t)["code"] != "too_many_sessions" {
		t.Fatalf("POST to a second session: %d %s", r.status, r.body)
	}
	if r := do(t, http.MethodGet, ts.URL+"/session/two/events", ""); r.status != http.StatusNotFound || r.json(t)["code"] != "session_not_found" {
		t.Fatalf("GET of a second session: %d %v %s, want 404 (a GET never creates)", r.status, r.header, r.body)
	}
	if r := do(t, http.MethodGet, ts.URL+"/session/"+strings.Repeat("x", eventbus.MaxSessionIDBytes+1)+"/events", ""); r.status != http.StatusBadRequest ||
		r.json(t)["code"] != "invalid_session_id" {
		t.Fatalf("GET of a too long id: %d %s", r.status, r.body)
	}
	// The existing session still streams; a DELETE makes room.
	openStream(t, ts.URL+"/session/one/events", nil).close()
	do(t, http.MethodDelete, ts.URL+"/session/one", "")
	if r := publish(t, ts, "two", `{"type":"a"}`); r.status != http.StatusOK {
		t.Fatalf("POST after DELETE made room: %d %s", r.status, r.body)
	}

	s.closeAll()
	if r := publish(t, ts, "two", `{"type":"a"}`); r.status != http.StatusServiceUnavailable || r.json(t)["code"] != "shutting_down" {
		t.Fatalf("POST while shutting down: %d %s", r.status, r.body)
	}
	if r := do(t, http.MethodGet, ts.URL+"/session/two/events", ""); r.status != http.StatusServiceUnavailable || r.json(t)["code"] != "shutting_down" ||
		r.header.Get("Retry-After") != "1" {
		t.Fatalf("GET while shutting down: %d %v %s", r.status, r.header, r.body)
	}
}

func TestDeleteStartsANewEpoch(t *testing.T) {
	_, ts := newTestServer(t, eventbus.Options{})

	first := publish(t, ts, "d", `{"type":"a"}`).json(t)
	publish(t, ts, "d", `{"type":"a"}`)
	s := openStream(t, ts.URL+"/session/d/events", nil)

	r := do(t, http.MethodDelete, ts.URL+"/session/d", "")
	if r.status != http.StatusNoContent || len(r.body) != 0 {
		t.Fatalf("DELETE: %d %s", r.status, r.body)
	}
	s.mustEnd(t) // the stream of the closed bus drains and ends
	if st := status(t, ts, "d"); st != nil {
		t.Fatalf("deleted session still has a status: %v", st)
	}
	if r := do(t, http.MethodDelete, ts.URL+"/session/d", ""); r.status != http.StatusNoContent {
		t.Fatalf("DELETE of an unknown session: %d %s", r.status, r.body)
	}
	if r := do(t, http.MethodDelete, ts.URL+"/session/never", ""); r.status != http.StatusNoContent {
		t.Fatalf("DELETE of a never seen session: %d %s", r.status, r.body)
	}

	again := publish(t, ts, "d", `{"type":"a"}`).json(t)
	if again["id"] != float64(1) || again["epoch"] == first["epoch"] {
		t.Fatalf("POST after DELETE: %v, before: %v", again, first)
	}

	// A GET or HEAD after DELETE is a 404 and creates nothing; a resume
	// with the old epoch's cursor once a POST made the session again gets
	// epoch_reset.
	do(t, http.MethodDelete, ts.URL+"/session/d", "")
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		if r := do(t, method, ts.URL+"/session/d/events", ""); r.status != http.StatusNotFound {
			t.Fatalf("%s after DELETE: %d %s, want 404", method, r.status, r.body)
		}
	}
	if st := status(t, ts, "d"); st != nil {
		t.Fatalf("a GET after DELETE made the session again: %v", st)
	}
	third := publish(t, ts, "d", `{"type":"a"}`).json(t)
	s = openStream(t, ts.URL+"/session/d/events", http.Header{"Last-Event-ID": {again["epoch"].(string) + ":1"}})
	if f, env := s.mustNext(t); f.event != "state_resync_required" || env["data"].(map[string]any)["reason"] != "epoch_reset" ||
		env["data"].(map[string]any)["epoch"] != third["epoch"] {
		t.Fatalf("resume across DELETE: %+v, want state_resync_required epoch_reset to %v", f, third["epoch"])
	}
	s.close()
}

func TestDisconnectCutsStreamsAndTheClientResumes(t *testing.T) {
	srv, ts := newTestServer(t, eventbus.Options{})
	url := ts.URL + "/session/cut/events"
	srv.create(t, "cut")

	a := openStream(t, url, nil)
	b := openStream(t, url, nil)
	waitFor(t, "two subscribers", func() bool {
		st := status(t, ts, "cut")
		return st["subscribers"] == float64(2) && st["streams"] == float64(2)
	})
	epoch := status(t, ts, "cut")["epoch"]
	publish(t, ts, "cut", `{"type":"a","data":1}`)
	publish(t, ts, "cut", `{"type":"a","data":2}`)
	for _, s := range []*sseStream{a, b} {
		for _, want := range []string{"1", "2"} {
			if f, _ := s.mustNext(t); f.id != want {
				t.Fatalf("got %+v, want id %s", f, want)
			}
		}
	}

	r := do(t, http.MethodPost, ts.URL+"/session/cut/disconnect", "")
	if r.status != http.StatusOK || r.json(t)["disconnected"] != float64(2) {
		t.Fatalf("disconnect: %d %s", r.status, r.body)
	}
	for _, s := range []*sseStream{a, b} {
		if _, err := s.next(); err == nil {
			t.Fatal("a cut stream still delivers frames")
		}
	}
	waitFor(t, "no subscribers", func() bool {
		st := status(t, ts, "cut")
		return st["subscribers"] == float64(0) && st["streams"] == float64(0)
	})
	if r := do(t, http.MethodPost, ts.URL+"/session/cut/disconnect", ""); r.json(t)["disconnected"] != float64(0) {
		t.Fatalf("second disconnect: %s", r.body)
	}
	if r := do(t, http.MethodPost, ts.URL+"/session/unknown/disconnect", ""); r.status != http.StatusOK || r.json(t)["disconnected"] != float64(0) {
		t.Fatalf("disconnect of an unknown session: %d %s", r.status, r.body)
	}

	// An abort resets the connections: the clients see an error, not an end.
	a = openStream(t, url, nil)
	b = openStream(t, url, nil)
	waitFor(t, "two subscribers", func() bool { return status(t, ts, "cut")["subscribers"] == float64(2) })
	r = do(t, http.MethodPost, ts.URL+"/session/cut/disconnect?mode=abort", "")
	if v := r.json(t); r.status != http.StatusOK || v["disconnected"] != float64(2) || v["mode"] != "abort" {
		t.Fatalf("disconnect?mode=abort: %d %s", r.status, r.body)
	}
	for _, s := range []*sseStream{a, b} {
		if _, err := s.next(); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("an aborted stream: %v, want a connection reset", err)
		}
	}
	waitFor(t, "no subscribers", func() bool { return status(t, ts, "cut")["subscribers"] == float64(0) })
	if r := do(t, http.MethodPost, ts.URL+"/session/cut/disconnect?mode=rst", ""); r.status != http.StatusBadRequest || r.json(t)["code"] != "invalid_mode" {
		t.Fatalf("an unknown mode: %d %s", r.status, r.body)
	}

	// The session and its ring survive: a client resumes where it was cut.
	publish(t, ts, "cut", `{"type":"a","data":3}`)
	c := openStream(t, url, http.Header{"Last-Event-Id": {"2"}})
	if f, _ := c.mustNext(t); f.id != "3" {
		t.Fatalf("resumed stream: %+v", f)
	}
	if f, _ := c.mustNext(t); f.event != eventbus.TypeReplayComplete {
		t.Fatalf("resumed stream: %+v", f)
	}
	st := status(t, ts, "cut")
	if st["epoch"] != epoch || st["streamsOpened"] != float64(5) || st["streamsResumed"] != float64(1) || st["lastResumeFrom"] != "2" {
		t.Fatalf("status after the resume: %v", st)
	}
}

func TestIndexPage(t *testing.T) {
	_, ts := newTestServer(t, eventbus.Options{})
	r := do(t, http.MethodGet, ts.URL+"/", "")
	if r.status != http.StatusOK || !strings.HasPrefix(r.header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %d %q", r.status, r.header.Get("Content-Type"))
	}
	for _, want := range []string{"<!doctype html>", `import { EventBusClient } from "` + daemon.ClientPrefix + `/index.js"`, "new EventBusClient(",
		"window.seenIds", "window.reconnects", "/disconnect", "replay_complete"} {
		if !bytes.Contains(r.body, []byte(want)) {
			t.Errorf("index page lacks %q", want)
		}
	}
	// The client's modules the page imports, from the files of clients/js.
	for _, name := range []string{"index.js", "client.js", "cursor.js", "parser.js"} {
		want, err := os.ReadFile("../../clients/js/" + name)
		if err != nil {
			t.Fatal(err)
		}
		r := do(t, http.MethodGet, ts.URL+daemon.ClientPrefix+"/"+name, "")
		if r.status != http.StatusOK || r.header.Get("Content-Type") != "text/javascript; charset=utf-8" || !bytes.Equal(r.body, want) {
			t.Fatalf("GET %s: %d %q, %d bytes", name, r.status, r.header.Get("Content-Type"), len(r.body))
		}
	}
	if r := do(t, http.MethodGet, ts.URL+"/nope", ""); r.status != http.StatusNotFound || r.json(t)["code"] != "not_found" {
		t.Fatalf("GET /nope: %d %s", r.status, r.body)
	}
	for _, c := range []struct{ method, path, allow string }{
		{http.MethodPut, "/session/x/events", "GET, HEAD, OPTIONS, POST"},
		{http.MethodGet, "/session/x/disconnect", "POST"},
		{http.MethodPatch, "/session/x", "DELETE, GET, HEAD"},
	} {
		r := do(t, c.method, ts.URL+c.path, `{"type":"a"}`)
		if r.status != http.StatusMethodNotAllowed || r.json(t)["code"] != "method_not_allowed" ||
			r.header.Get("Content-Type") != "application/json" || r.header.Get("Allow") != c.allow {
			t.Fatalf("%s %s: %d %v %s", c.method, c.path, r.status, r.header, r.body)
		}
	}
	// Through the eventbus handler itself: its JSON 405 (OPTIONS without CORS).
	if r := do(t, http.MethodOptions, ts.URL+"/session/x/events", ""); r.status != http.StatusMethodNotAllowed || r.json(t)["code"] != "method_not_allowed" {
		t.Fatalf("OPTIONS: %d %s", r.status, r.body)
	}
}

// lockedBuffer is the daemon's log output in TestRun.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestRunServesTheDemoAndShutsDownOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-demo", "-demo-interval", "10ms", "-heartbeat", "1s"}, &logs, nil)
	}()
	addrRE := regexp.MustCompile(`msg="sessiond listening" addr=(\S+)`)
	var addr string
	waitFor(t, "the listening log line", func() bool {
		if m := addrRE.FindStringSubmatch(logs.String()); m != nil {
			addr = m[1]
			return true
		}
		return false
	})

	s := openStream(t, "http://"+addr+"/session/demo/events", nil)
	f, env := s.mustNext(t)
	if f.event != "tick" || !regexp.MustCompile(`^[0-9a-f]{32}:[1-9][0-9]*$`).MatchString(f.id) {
		t.Fatalf("demo frame: %+v, want an epoch id (-epoch-ids is on by default)", f)
	}
	if d, _ := env["data"].(map[string]any); d["n"] == nil {
		t.Fatalf("demo frame without a counter: %s", f.data)
	}

	cancel()
	s.mustEnd(t) // the bus is closed before the server shuts down
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v\nlogs:\n%s", err, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("run did not return after cancel\nlogs:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "sessiond shutting down") {
		t.Errorf("no shutdown log line:\n%s", logs.String())
	}
}

// The daemon sets the Go memory limit from its budget and says so: at
// -max-total-bytes 64 MiB with the default body budget (4 bodies of 17
// MiB), (64 + 68) MiB, an eighth more and 32 MiB. The Hub's budget counts
// what streams hold beyond the rings, so -max-subscribers adds nothing.
func TestRunSetsTheMemoryLimit(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "") // empty counts as unset
	ctx, cancel := context.WithCancel(context.Background())
	var logs lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-max-total-bytes", "67108864", "-max-subscribers", "8"}, &logs, nil)
	}()
	waitFor(t, "the listening log line", func() bool { return strings.Contains(logs.String(), "sessiond listening") })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	want := fmt.Sprintf(`msg="memory limit from the budget" bytes=%d MiB=180 rings=%d subscribers=0 queuedBytes=0 bodies=%d`,
		132*mib+132*mib/8+32*mib, 64*mib, 68*mib)
	if !strings.Contains(logs.String(), want) {
		t.Errorf("no %q in the logs:\n%s", want, logs.String())
	}
}

func TestRunFlags(t *testing.T) {
	var out lockedBuffer
	if err := run(context.Background(), []string{"-h"}, &out, nil); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	for _, want := range []string{"POST   /session/{id}/disconnect", "-max-subscribers", "-ring", "-demo", "-overflow policy",
		"-max-sessions", "-idle-timeout", "-max-total-bytes", "-max-age", "-body-timeout", "-body-budget", "-header-timeout", "-create-on-stream",
		"GET    /events?session=ID&...", "-max-stream-sessions"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-h output lacks %q:\n%s", want, out.String())
		}
	}
	if err := run(context.Background(), []string{"-ring", "-1", "-addr", "127.0.0.1:0"}, io.Discard, nil); !errors.Is(err, eventbus.ErrInvalidOption) {
		t.Fatalf("-ring -1: %v", err)
	}
	for _, bad := range [][]string{{"-max-sessions", "-1"}, {"-max-total-bytes", "-1"}, {"-max-total-bytes", "1000"}} {
		if err := run(context.Background(), append(bad, "-addr", "127.0.0.1:0"), io.Discard, nil); !errors.Is(err, eventbus.ErrInvalidOption) {
			t.Errorf("%v: %v, want ErrInvalidOption", bad, err)
		}
	}
	if err := run(context.Background(), []string{"-body-timeout", "-1s", "-addr", "127.0.0.1:0"}, io.Discard, nil); err == nil {
		t.Error("-body-timeout -1s was accepted")
	}
	for _, n := range []string{"0", "257"} {
		if err := run(context.Background(), []string{"-max-stream-sessions", n, "-addr", "127.0.0.1:0"}, io.Discard, nil); err == nil ||
			!strings.Contains(err.Error(), "-max-stream-sessions") {
			t.Errorf("-max-stream-sessions %s: %v", n, err)
		}
	}
	if err := run(context.Background(), []string{"extra"}, io.Discard, nil); err == nil {
		t.Fatal("a positional argument was accepted")
	}
	if err := run(context.Background(), []string{"-overflow", "drop", "-addr", "127.0.0.1:0"}, io.Discard, nil); err == nil {
		t.Fatal("-overflow drop was accepted")
	}
	if err := run(context.Background(), []string{"-cors-origin", "*", "-cors-credentials", "-addr", "127.0.0.1:0"}, io.Discard, nil); err == nil ||
		!strings.Contains(err.Error(), `-cors-origin "*" with -cors-credentials`) {
		t.Fatalf("-cors-origin '*' -cors-credentials: %v", err)
	}
}

// postKeyed is POST /session/{id}/events with an Idempotency-Key.
func postKeyed(t *testing.T, ts *httptest.Server, session, key, body string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, ts.URL+"/session/"+session+"/events", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, b}
}

// A POST retried with its Idempotency-Key (its answer was lost) appends
// once; the key with another body is 422; an invalid key is 400; DELETE
// forgets the keys with the session.
func TestPublishIdempotencyKey(t *testing.T) {
	_, ts := newTestServer(t, eventbus.Options{})
	body := `{"type":"order","data":{"n":1},"originatorClientId":"c1"}`
	r := postKeyed(t, ts, "s", "order-1", body)
	first := r.json(t)
	if r.status != http.StatusOK || first["id"] != float64(1) || first["duplicate"] != nil {
		t.Fatalf("first POST: %d %s", r.status, r.body)
	}
	r = postKeyed(t, ts, "s", "order-1", `{"type":"order", "data":{ "n": 1 },"originatorClientId":"c1"}`)
	if got := r.json(t); r.status != http.StatusOK || got["id"] != float64(1) || got["duplicate"] != true || got["epoch"] != first["epoch"] {
		t.Fatalf("retry: %d %s", r.status, r.body)
	}
	r = postKeyed(t, ts, "s", "order-1", `{"type":"order","data":{"n":2},"originatorClientId":"c1"}`)
	if r.status != http.StatusUnprocessableEntity || r.json(t)["code"] != "idempotency_key_reused" {
		t.Fatalf("same key, other data: %d %s", r.status, r.body)
	}
	for _, key := range []string{"", strings.Repeat("k", 256), "caf\u00e9"} {
		r = postKeyed(t, ts, "s", key, body)
		if r.status != http.StatusBadRequest || r.json(t)["code"] != "invalid_idempotency_key" {
			t.Fatalf("key %q: %d %s", key, r.status, r.body)
		}
	}
	if st := status(t, ts, "s"); st["lastEventId"] != float64(1) {
		t.Fatalf("after the retries: %v", st)
	}
	do(t, http.MethodDelete, ts.URL+"/session/s", "")
	r = postKeyed(t, ts, "s", "order-1", body)
	if got := r.json(t); r.status != http.StatusOK || got["id"] != float64(1) || got["duplicate"] != nil || got["epoch"] == first["epoch"] {
		t.Fatalf("after DELETE: %d %s", r.status, r.body)
	}
}

// subscribers returns the subscriber count of session id, 0 when the hub
// has none.
func (s *server) subscribers(id string) int {
	if bus, ok := s.hub.Lookup(id); ok {
		return bus.SubscriberCount()
	}
	return 0
}

// create makes session id in the hub, empty, as a publish would; a GET
// never creates one.
func (s *server) create(t *testing.T, id string) {
	t.Helper()
	if _, err := s.hub.GetOrCreate(id); err != nil {
		t.Fatal(err)
	}
}

// A Last-Event-ID the handler cannot use (malformed, or of an epoch that
// disagrees with Event-Epoch) is served live, after
// state_resync_required cursor_invalid naming the first id it delivers;
// the status counts no resume (issue 32 point 3).
func TestUnusableLastEventIDIsSaidInBand(t *testing.T) {
	_, ts := newTestServer(t, eventbus.Options{})
	var epoch string
	for i := 1; i <= 3; i++ {
		r := publish(t, ts, "s", `{"type":"a"}`)
		epoch = r.json(t)["epoch"].(string)
	}
	other := strings.Repeat("f", 32)
	next := 4
	for _, h := range []http.Header{
		{"Last-Event-Id": {"not-an-id"}},
		{"Last-Event-Id": {"-1"}},
		{"Last-Event-Id": {epoch + ":2"}, "Event-Epoch": {other}},
	} {
		s := openStream(t, ts.URL+"/session/s/events", h)
		f, env := s.mustNext(t)
		d, _ := env["data"].(map[string]any)
		if f.event != eventbus.TypeStateResyncRequired || d["reason"] != "cursor_invalid" || d["lastDeliveredId"] != float64(0) ||
			d["earliestAvailableId"] != float64(next) || d["epoch"] != epoch {
			t.Fatalf("%v: first frame %s %s, want cursor_invalid from %d", h, f.event, f.data, next)
		}
		publish(t, ts, "s", `{"type":"a"}`)
		if f, _ := s.mustNext(t); f.id != strconv.Itoa(next) {
			t.Fatalf("%v: then %+v, want the live event %d", h, f, next)
		}
		s.close()
		next++
	}
	// The query form too, and a resume that works is counted as one.
	s := openStream(t, ts.URL+"/session/s/events?lastEventId=x", nil)
	if f, _ := s.mustNext(t); f.event != eventbus.TypeStateResyncRequired {
		t.Fatalf("?lastEventId=x: %+v", f)
	}
	s.close()
	if st := status(t, ts, "s"); st["streamsResumed"] != float64(0) || st["lastResumeFrom"] != "" || st["streamsOpened"] != float64(4) {
		t.Fatalf("status claims a resume that did not happen: %v", st)
	}
	s = openStream(t, ts.URL+"/session/s/events", http.Header{"Last-Event-Id": {"5"}})
	if f, _ := s.mustNext(t); f.id != "6" {
		t.Fatalf("a resume from 5: %+v", f)
	}
	s.close()
	if st := status(t, ts, "s"); st["streamsResumed"] != float64(1) || st["lastResumeFrom"] != "5" {
		t.Fatalf("status after a resume: %v", st)
	}
}
