package sseclient_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/internal/muxcursor"
	"github.com/ssebus/eventbus/sseclient"
)

// Issue 33: what a client gets for a session that is gone (a DELETE while
// streaming, a 404), RetryNotFound for daemons whose sessions come back,
// AddSession and RemoveSession on a running multiplexed client, a
// multiplexed stream from the start ("0"), LastEventID, error strings
// without the cursor. The same against cmd/sessiond: daemon_test.go.

// closedAt returns the Err of the StateClosed rc recorded (nil, false
// while Run runs).
func (rc *recorder) closedAt() (error, bool) {
	for _, s := range rc.states {
		if s.State == sseclient.StateClosed {
			return s.Err, true
		}
	}
	return nil, false
}

// opens counts the streams that opened.
func (rc *recorder) opens() int {
	return countOf(rc.states, func(x sseclient.StateChange) bool { return x.State == sseclient.StateOpen })
}

// notFoundLookup makes s's single stream never create a session (a GET of
// an unknown one is 404 session_not_found, as the README's daemon answers).
func notFoundLookup(s *server) {
	s.handler.Lookup = func(r *http.Request, _ string) (*eventbus.EventBus, error) { return s.existing(r, r.PathValue("id")) }
}

// A session deleted while its single stream is open: stream_error closed,
// which the client reports as Run's final error (ErrSessionGone), without
// reconnecting to it.
func TestSingleStreamClosedIsTheSessionsEnd(t *testing.T) {
	g := newGate(http.DefaultTransport)
	s := newServer(t, serverConfig{})
	c := &sseclient.Client{URL: s.url("a"), HTTPClient: &http.Client{Transport: g}}
	rc := startOpen(t, c)
	s.publish("a", "note", nil)
	rc.wait(t, "a#1", waitLong, func() bool { return len(rc.events) == 1 })
	s.remove("a") // a Hub's Delete
	rc.wait(t, "the end", waitLong, func() bool { _, ok := rc.closedAt(); return ok })
	got := rc.snap()
	err, _ := got.closedAt()
	var se *sseclient.StreamError
	if !errors.Is(err, sseclient.ErrSessionGone) || !errors.As(err, &se) || se.Kind != "closed" || se.Message != "session closed" {
		t.Fatalf("Run ended with %v, want a StreamError closed that is ErrSessionGone", err)
	}
	if want := "sseclient: the session is gone (stream_error closed): session closed"; err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
	if len(got.errs) != 0 || got.opens() != 1 || len(g.urls) != 1 {
		t.Fatalf("errors %v, %d opens, %d requests: the end is final, reported once, never retried", got.errs, got.opens(), len(g.urls))
	}
}

// RetryNotFound: a 404 session_not_found is retried with backoff (each one
// reported, ErrSessionGone) until the session exists, then the stream
// opens; past the bound, it is final (on a multiplexed stream: the session
// is dropped). Without it a 404 is final at once.
func TestRetryNotFound(t *testing.T) {
	t.Run("single/comes back", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := newServer(t, serverConfig{pipe: true})
			notFoundLookup(s)
			c, rc := pipeClient(s, "a")
			c.RetryNotFound, c.ResumeFrom = 10*time.Second, "0"
			start(t, c)
			time.Sleep(3 * time.Second)
			synctest.Wait()
			s.publish("a", "note", nil) // something re-creates the session
			rc.wait(t, "a#1", time.Minute, func() bool { return len(rc.events) == 1 })
			got := rc.snap()
			if len(got.errs) < 2 {
				t.Fatalf("errors %v: the 404s are reported while retrying", got.errs)
			}
			for _, err := range got.errs {
				if !errors.Is(err, sseclient.ErrSessionGone) {
					t.Fatalf("reported %v, want 404 session_not_found", err)
				}
			}
			if _, ok := got.closedAt(); ok {
				t.Fatal("closed")
			}
		})
	})
	t.Run("single/bounded", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := newServer(t, serverConfig{pipe: true})
			notFoundLookup(s)
			c, rc := pipeClient(s, "a")
			c.RetryNotFound = 5 * time.Second
			begin := time.Now()
			start(t, c)
			rc.wait(t, "the end", time.Minute, func() bool { _, ok := rc.closedAt(); return ok })
			took := time.Since(begin)
			err, _ := rc.snap().closedAt()
			he := new(sseclient.HTTPError)
			if !errors.As(err, &he) || he.StatusCode != 404 || !errors.Is(err, sseclient.ErrSessionGone) {
				t.Fatalf("Run ended with %v, want the 404", err)
			}
			if took < 5*time.Second || took > 6*time.Second {
				t.Fatalf("final after %v, want at the bound, 5s", took)
			}
		})
	})
	t.Run("single/none", func(t *testing.T) {
		s := newServer(t, serverConfig{})
		notFoundLookup(s)
		err := runFinal(t, newClient(s.url("a")), waitLong)
		if !errors.Is(err, sseclient.ErrSessionGone) {
			t.Fatalf("Run ended with %v, want the 404 at once", err)
		}
	})
	t.Run("mux", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			s := newServer(t, serverConfig{pipe: true})
			s.publish("a", "note", nil)
			c := &sseclient.Client{URL: s.muxURL(), HTTPClient: s.httpClient(), Sessions: []string{"a", "b", "c"}, RetryNotFound: 5 * time.Second,
				InitialDelay: 100 * time.Millisecond}
			rc := &muxRecorder{recorder: newRecorder()}
			c.OnSessionGone = func(g sseclient.SessionGone) {
				rc.mu.Lock()
				rc.gone = append(rc.gone, g)
				rc.mu.Unlock()
				rc.note()
			}
			rc.attach(c)
			begin := time.Now()
			start(t, c)
			time.Sleep(2 * time.Second)
			s.bus("b") // b comes back; c never does
			rc.wait(t, "open", time.Minute, func() bool { return rc.opens() == 1 })
			took := time.Since(begin)
			gone := rc.goneSnap()
			if len(gone) != 1 || gone[0].Session != "c" || gone[0].Reason != "session_not_found" || took < 5*time.Second {
				t.Fatalf("gone %+v after %v: c is dropped once the bound passed (b came back within it)", gone, took)
			}
			if got := c.ActiveSessions(); !slices.Equal(got, []string{"a", "b"}) {
				t.Fatalf("ActiveSessions %v", got)
			}
		})
	})
}

// AddSession and RemoveSession on a running multiplexed client: each ends
// the connection and the next starts at once with the new list and the
// cursor; a removed session added again resumes from its position; calls
// from many goroutines at once (go test -race).
func TestMuxAddAndRemoveSession(t *testing.T) {
	g := newGate(http.DefaultTransport)
	s := newServer(t, serverConfig{})
	s.bus("a")
	s.publish("b", "note", nil) // before b is added: not delivered
	c := &sseclient.Client{Sessions: []string{"a"}, HTTPClient: &http.Client{Transport: g}}
	if err := (&sseclient.Client{URL: s.url("a")}).AddSession("b"); !errors.Is(err, sseclient.ErrNotMultiplexed) {
		t.Fatalf("AddSession on a single stream: %v", err)
	}
	if err := c.AddSession(""); !errors.Is(err, sseclient.ErrInvalidOption) {
		t.Fatalf("AddSession(\"\"): %v", err)
	}
	rc := startMux(t, s, c)
	s.publish("a", "note", nil)
	rc.wait(t, "a#1", waitLong, func() bool { return len(rc.events) == 1 })

	if err := c.AddSession("b"); err != nil {
		t.Fatal(err)
	}
	if got := c.ActiveSessions(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("ActiveSessions %v", got)
	}
	rc.wait(t, "the next stream", waitLong, func() bool { return rc.opens() == 2 })
	u, _ := url.Parse(g.lastURL())
	if !slices.Equal(u.Query()["session"], []string{"a", "b"}) || u.Query().Get("lastEventId") == "" {
		t.Fatalf("the URL after AddSession: %s", u)
	}
	s.publish("b", "note", nil)
	s.publish("a", "note", nil)
	rc.wait(t, "b#2, a#2", waitLong, func() bool { return len(rc.events) == 3 })

	if err := c.RemoveSession("a"); err != nil {
		t.Fatal(err)
	}
	rc.wait(t, "the stream of b", waitLong, func() bool { return rc.opens() == 3 })
	if err := c.RemoveSession("b"); !errors.Is(err, sseclient.ErrInvalidOption) {
		t.Fatalf("removing the last session: %v", err)
	}
	s.publish("a", "note", nil) // a#3, while a is not streamed
	s.publish("b", "note", nil) // b#3
	rc.wait(t, "b#3", waitLong, func() bool { return len(rc.events) == 4 })
	if err := c.AddSession("a"); err != nil {
		t.Fatal(err)
	}
	rc.wait(t, "a#3 resumed", waitLong, func() bool { return len(rc.events) == 5 })
	got := rc.snap()
	if by := bySession(got.events); !slices.Equal(by["a"], []uint64{1, 2, 3}) || !slices.Equal(by["b"], []uint64{2, 3}) {
		t.Fatalf("events %v", by)
	}
	if len(got.errs) != 0 || len(got.resyncs) != 0 {
		t.Fatalf("errors %v, resyncs %v: a change of sessions is no failure", got.errs, got.resyncs)
	}
	if want := (muxcursor.Cursor{}).Set("b", s.bus("b").Epoch(), 3).Set("a", s.bus("a").Epoch(), 3).String(); c.LastEventID() != want {
		t.Fatalf("LastEventID %q, want %q", c.LastEventID(), want)
	}

	// Many goroutines at once: every change lands, the stream follows.
	for i := range 8 {
		s.bus("x" + string(rune('0'+i)))
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			id := "x" + string(rune('0'+i))
			for range 5 {
				if err := c.AddSession(id); err != nil {
					t.Error(err)
				}
				_ = c.LastEventID()
				_ = c.ActiveSessions()
				if err := c.RemoveSession(id); err != nil {
					t.Error(err)
				}
			}
			if err := c.AddSession(id); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got := c.ActiveSessions(); len(got) != 10 {
		t.Fatalf("ActiveSessions %v, want a, b and x0..x7", got)
	}
	rc.wait(t, "a stream of the 10", waitLong, func() bool {
		u, _ := url.Parse(g.lastURL())
		return len(u.Query()["session"]) == 10 && rc.states[len(rc.states)-1].State == sseclient.StateOpen
	})
	// A session that started live holds a position only once an event's
	// cursor gives it one (a reconnect started by the last change may
	// still be under way): a's event does, then x3's is never lost.
	s.publish("a", "note", nil)
	rc.wait(t, "a#4", waitLong, func() bool { return len(rc.events) == 6 })
	s.publish("x3", "note", nil)
	rc.wait(t, "x3#1", waitLong, func() bool { return len(rc.events) == 7 && rc.events[6].Session == "x3" })
	if got := rc.snap(); len(got.errs) != 0 || len(rc.goneSnap()) != 0 {
		t.Fatalf("errors %v, gone %v", got.errs, rc.goneSnap())
	}
}

// A multiplexed stream from the start ("0"): every session's ring, each
// with its own OnCaughtUp (an empty one too); a reconnect then resumes
// every session from its position, an empty session from 0 of its epoch.
func TestMuxFromTheStart(t *testing.T) {
	g := newGate(http.DefaultTransport)
	s := newServer(t, serverConfig{})
	for range 3 {
		s.publish("a", "note", nil)
	}
	s.bus("empty")
	c := &sseclient.Client{Sessions: []string{"a", "empty"}, ResumeFrom: "0", HTTPClient: &http.Client{Transport: g}}
	if c.LastEventID() != "0" {
		t.Fatalf("LastEventID before Run %q, want 0", c.LastEventID())
	}
	rc := startMux(t, s, c)
	rc.wait(t, "a's ring and two catch-ups", waitLong, func() bool { return len(rc.events) == 3 && len(rc.caught) == 2 })
	if u, _ := url.Parse(g.urls[0]); u.Query().Get("lastEventId") != "0" {
		t.Fatalf("the first URL %s, want lastEventId=0", u)
	}
	for _, e := range rc.snap().events {
		if !e.Replayed {
			t.Fatalf("%+v: replayed", e)
		}
	}
	want := muxcursor.Cursor{}.Set("a", s.bus("a").Epoch(), 3).Set("empty", s.bus("empty").Epoch(), 0).String()
	if c.LastEventID() != want {
		t.Fatalf("LastEventID %q, want %q", c.LastEventID(), want)
	}
	g.hold()
	s.cut(muxStreams, nil)
	s.publish("empty", "note", nil)
	g.release()
	rc.wait(t, "empty#1", waitLong, func() bool { return len(rc.events) == 4 })
	if u, _ := url.Parse(g.lastURL()); u.Query().Get("lastEventId") != want {
		t.Fatalf("resumed with %s, want %s", u.Query().Get("lastEventId"), want)
	}
	if got := rc.snap(); len(got.resyncs) != 0 || got.events[3].Session != "empty" || got.events[3].ID != 1 {
		t.Fatalf("events %+v resyncs %+v", got.events, got.resyncs)
	}
}

// LastEventID is where the client stands (as EventSource.lastEventId),
// ResumeFrom only where it started: a later client resumes from it exactly.
func TestLastEventIDMovesAndResumes(t *testing.T) {
	s := newServer(t, serverConfig{})
	c := &sseclient.Client{URL: s.url("a"), ResumeFrom: "0"}
	if c.LastEventID() != "0" {
		t.Fatalf("before Run: %q", c.LastEventID())
	}
	rc := startOpen(t, c)
	s.publish("a", "note", nil)
	s.publish("a", "note", nil)
	rc.wait(t, "2 events", waitLong, func() bool { return len(rc.events) == 2 })
	at := c.LastEventID()
	if want := s.bus("a").Epoch() + ":2"; at != want || c.ResumeFrom != "0" {
		t.Fatalf("LastEventID %q (ResumeFrom %q), want %q", at, c.ResumeFrom, want)
	}
	s.publish("a", "note", nil)
	later := &sseclient.Client{URL: s.url("a"), ResumeFrom: at}
	rc2 := startOpen(t, later)
	rc2.wait(t, "a#3", waitLong, func() bool { return len(rc2.caught) == 1 && len(rc2.events) == 1 })
	if e := rc2.snap().events[0]; e.ID != 3 || !e.Replayed {
		t.Fatalf("resumed with %+v", e)
	}
}

// Error strings name the stream without its query: the cursor (and the
// sessions) are the client's position, not for logs.
func TestErrorStringsLeaveOutTheQuery(t *testing.T) {
	for _, c := range []*sseclient.Client{
		{URL: "http://127.0.0.1:1/session/a/events", ResumeFrom: strings.Repeat("a", 32) + ":17"},
		{URL: "http://127.0.0.1:1/events", Sessions: []string{"a"}, ResumeFrom: "m1r2PcTIYBI0VniasAAAAAAAAq"},
	} {
		var mu sync.Mutex
		var errs []error
		c.OnError = func(err error) {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
		c.InitialDelay = time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		c.Run(ctx)
		cancel()
		mu.Lock()
		if len(errs) == 0 {
			t.Fatal("no error reported")
		}
		for _, err := range errs {
			if s := err.Error(); strings.Contains(s, "lastEventId") || strings.Contains(s, "session=") || !strings.Contains(s, "?...") {
				t.Fatalf("error %q names the query", s)
			}
		}
		mu.Unlock()
	}
}
