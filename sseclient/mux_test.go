package sseclient_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
	"github.com/ssebus/eventbus/internal/muxcursor"
	"github.com/ssebus/eventbus/sseclient"
)

// The client on a multiplexed stream (Client.Sessions) against the real
// eventbus.MuxHandler: per-session resume, dedup, resyncs and epochs, the
// composite cursor, gone sessions, the replay budget, a restart.

// muxRecorder is a recorder that also keeps what OnSessionGone reports.
type muxRecorder struct {
	*recorder
	gone []sseclient.SessionGone
}

// goneSnap returns a copy of what OnSessionGone reported.
func (rc *muxRecorder) goneSnap() []sseclient.SessionGone {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]sseclient.SessionGone(nil), rc.gone...)
}

// startMux starts c (URL set to s's multiplexed route) and returns once
// its stream is open.
func startMux(t *testing.T, s *server, c *sseclient.Client) *muxRecorder {
	t.Helper()
	c.URL = s.muxURL()
	rc := &muxRecorder{recorder: newRecorder()}
	c.OnSessionGone = func(g sseclient.SessionGone) {
		rc.mu.Lock()
		rc.gone = append(rc.gone, g)
		rc.mu.Unlock()
		rc.note()
	}
	startOpen(t, c, rc.recorder)
	return rc
}

// bySession returns "<id>" lists of the events of each session, in order.
func bySession(evs []sseclient.Event) map[string][]uint64 {
	out := map[string][]uint64{}
	for _, e := range evs {
		out[e.Session] = append(out[e.Session], e.ID)
	}
	return out
}

func countOf[T any](xs []T, f func(T) bool) int {
	n := 0
	for _, x := range xs {
		if f(x) {
			n++
		}
	}
	return n
}

// Each session's events once, in order, across a cut: the client sends
// every session and the composite cursor, and each named session catches
// up on its own.
func TestMuxClientResumesEachSessionExactly(t *testing.T) {
	g := newGate(http.DefaultTransport)
	s := newServer(t, serverConfig{})
	for _, id := range []string{"a", "b", "c"} {
		s.publish(id, "note", nil) // before the stream: not delivered
	}
	c := &sseclient.Client{Sessions: []string{"a", "b", "c"}, HTTPClient: &http.Client{Transport: g}}
	rc := startMux(t, s, c)
	first, _ := url.Parse(g.lastURL())
	if q := first.Query(); !slices.Equal(q["session"], []string{"a", "b", "c"}) || q.Has("lastEventId") {
		t.Fatalf("first URL %s: want the sessions in order and no cursor", first)
	}
	s.publish("a", "note", nil) // a#2
	rc.wait(t, "a#2", waitLong, func() bool { return len(rc.events) == 1 })
	// b and c took their live positions from a#2's cursor: nothing
	// published to them while the client is away is lost.
	if _, id, ok := c.SessionCursor("b"); !ok || id != 1 {
		t.Fatalf("b's position %d %v, want 1 (the server's live position)", id, ok)
	}
	g.hold()
	s.cut(muxStreams, nil)
	s.publish("b", "note", nil) // b#2
	s.publish("a", "note", nil) // a#3
	s.publish("c", "note", nil) // c#2
	cursor := c.LastEventID()
	g.release()
	rc.wait(t, "three catch-ups", waitLong, func() bool { return len(rc.caught) == 3 && len(rc.events) == 4 })
	if got := bySession(rc.snap().events); !slices.Equal(got["a"], []uint64{2, 3}) || !slices.Equal(got["b"], []uint64{2}) || !slices.Equal(got["c"], []uint64{2}) {
		t.Fatalf("events by session %v", got)
	}
	second, _ := url.Parse(g.lastURL())
	if second.Query().Get("lastEventId") != cursor {
		t.Fatalf("resumed with %q, want the composite cursor %q", second.Query().Get("lastEventId"), cursor)
	}
	cur, err := muxcursor.ParseCursor(cursor)
	if err != nil || len(cur) != 3 {
		t.Fatalf("cursor %q: %v", cursor, err)
	}
	for id, last := range map[string]uint64{"a": 2, "b": 1, "c": 1} {
		if e, ok := cur.Entry(id); !ok || e != muxcursor.NewEntry(id, s.bus(id).Epoch(), last) {
			t.Fatalf("cursor entry of %s: %+v, want %d of %s", id, e, last, s.bus(id).Epoch())
		}
	}
	for _, x := range rc.snap().caught {
		if x.Epoch != s.bus(x.Session).Epoch() {
			t.Fatalf("caught up %+v: the epoch of its session", x)
		}
	}
	for _, e := range rc.snap().events {
		if e.Epoch != s.bus(e.Session).Epoch() || e.Replayed != (e.Session != "a" || e.ID == 3) {
			t.Fatalf("event %+v: its session's epoch, replayed when it came after the cut", e)
		}
	}
	if got := c.ActiveSessions(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("ActiveSessions %v", got)
	}
}

// awayAndBack cuts the client's connections abruptly and holds its
// reconnection while away runs, then lets it come back.
func awayAndBack(t *testing.T, s *server, g *gate, away func()) {
	t.Helper()
	g.hold()
	s.srv.CloseClientConnections()
	deadline := time.Now().Add(waitLong)
	for s.openStreams(muxStreams) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the cut stream did not end")
		}
		time.Sleep(time.Millisecond)
	}
	away()
	g.release()
}

// A session deleted and re-created while the client is away is an
// epoch_reset for it alone, with the replay of its new epoch; the others
// resume exactly.
func TestMuxClientEpochResetOfOneSession(t *testing.T) {
	g := newGate(http.DefaultTransport)
	s := newServer(t, serverConfig{})
	for _, id := range []string{"a", "b"} {
		s.publish(id, "note", nil)
	}
	c := &sseclient.Client{Sessions: []string{"a", "b"}, HTTPClient: &http.Client{Transport: g}}
	rc := startMux(t, s, c)
	s.publish("a", "note", nil)
	s.publish("b", "note", nil)
	rc.wait(t, "2 events", waitLong, func() bool { return len(rc.events) == 2 })
	old := s.bus("b").Epoch()
	awayAndBack(t, s, g, func() {
		s.remove("b")
		s.publish("b", "note", nil) // b#1 of a new epoch
		s.publish("a", "note", nil) // a#3
	})
	rc.wait(t, "both caught up", waitLong, func() bool { return len(rc.caught) == 2 && len(rc.events) == 4 })
	got := rc.snap()
	if len(got.resyncs) != 1 {
		t.Fatalf("resyncs %+v, want b's epoch_reset only", got.resyncs)
	}
	rs := got.resyncs[0]
	if rs.Session != "b" || rs.Reason != "epoch_reset" || rs.PreviousEpoch != old || rs.Epoch != s.bus("b").Epoch() || rs.LastDeliveredID != 2 {
		t.Fatalf("resync %+v", rs)
	}
	if by := bySession(got.events); !slices.Equal(by["a"], []uint64{2, 3}) || !slices.Equal(by["b"], []uint64{2, 1}) {
		t.Fatalf("events by session %v: a exact, b from its new epoch's start", by)
	}
	if e, id, ok := c.SessionCursor("b"); e != s.bus("b").Epoch() || id != 1 || !ok {
		t.Fatalf("b's cursor %s %d %v", e, id, ok)
	}
}

// A restart (every bus new, published to before the client is back):
// every session gets its epoch_reset and resumes from its new epoch.
func TestMuxClientAcrossARestart(t *testing.T) {
	g := newGate(http.DefaultTransport)
	s := newServer(t, serverConfig{})
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		s.publish(id, "note", nil)
	}
	c := &sseclient.Client{Sessions: ids, HTTPClient: &http.Client{Transport: g}}
	rc := startMux(t, s, c)
	for _, id := range ids {
		s.publish(id, "note", nil)
	}
	rc.wait(t, "3 events", waitLong, func() bool { return len(rc.events) == 3 })
	// A crash: the connections cut, no frame, then new buses.
	awayAndBack(t, s, g, func() {
		s.srv.CloseClientConnections()
		s.restart()
		for _, id := range ids {
			s.publish(id, "note", nil)
		}
	})
	rc.wait(t, "three resets and catch-ups", waitLong, func() bool { return len(rc.resyncs) == 3 && len(rc.caught) == 3 && len(rc.events) == 6 })
	for _, rs := range rc.snap().resyncs {
		if rs.Reason != "epoch_reset" || rs.Epoch != s.bus(rs.Session).Epoch() || rs.LastDeliveredID != 2 {
			t.Fatalf("resync %+v", rs)
		}
	}
	for id, got := range bySession(rc.snap().events) {
		if !slices.Equal(got, []uint64{2, 1}) {
			t.Fatalf("%s: %v, want 2 then 1 of the new epoch", id, got)
		}
	}
}

// A ring eviction in one session: its resync says exactly what is lost,
// the other resumes exactly.
func TestMuxClientRingEvictedInOneSession(t *testing.T) {
	g := newGate(http.DefaultTransport)
	s := newServer(t, serverConfig{opts: eventbus.Options{RingSize: 4}})
	s.publish("a", "note", nil)
	s.publish("b", "note", nil)
	c := &sseclient.Client{Sessions: []string{"a", "b"}, HTTPClient: &http.Client{Transport: g}}
	rc := startMux(t, s, c)
	s.publish("a", "note", nil)
	rc.wait(t, "a#2", waitLong, func() bool { return len(rc.events) == 1 })
	awayAndBack(t, s, g, func() {
		for range 6 {
			s.publish("a", "note", nil) // a#3..8; the ring keeps 5..8
		}
		s.publish("b", "note", nil) // b#2
	})
	rc.wait(t, "caught up", waitLong, func() bool { return len(rc.caught) == 2 })
	got := rc.snap()
	if len(got.resyncs) != 1 || got.resyncs[0].Session != "a" || got.resyncs[0].Reason != "ring_evicted" ||
		got.resyncs[0].Missing != (sseclient.IDRange{From: 3, To: 4}) {
		t.Fatalf("resyncs %+v, want a's ring_evicted missing 3..4", got.resyncs)
	}
	if by := bySession(got.events); !slices.Equal(by["a"], []uint64{2, 5, 6, 7, 8}) || !slices.Equal(by["b"], []uint64{2}) {
		t.Fatalf("events %v", by)
	}
}

// The replay budget cuts one session's replay: the client resumes it at
// once, losing and repeating nothing; the other session's replay and
// events are not disturbed.
func TestMuxClientReplayBudgetOfOneSession(t *testing.T) {
	s := newServer(t, serverConfig{opts: eventbus.Options{ReplayBudgetBytes: 300}})
	for range 10 {
		s.publish("a", "note", strings.Repeat("x", 50))
	}
	s.publish("b", "note", nil)
	cur := muxcursor.Cursor{}.Set("a", s.bus("a").Epoch(), 0).Set("b", s.bus("b").Epoch(), 0)
	c := &sseclient.Client{Sessions: []string{"a", "b"}, ResumeFrom: cur.String()}
	rc := startMux(t, s, c)
	rc.wait(t, "everything", waitLong, func() bool { return len(rc.events) == 11 })
	got := rc.snap()
	if by := bySession(got.events); !slices.Equal(by["a"], seq(1, 10)) || !slices.Equal(by["b"], []uint64{1}) {
		t.Fatalf("events %v", by)
	}
	if len(got.resyncs) != 0 {
		t.Fatalf("a budget cut is no loss: resyncs %+v", got.resyncs)
	}
	if opens := countOf(got.states, func(x sseclient.StateChange) bool { return x.State == sseclient.StateOpen }); opens < 2 {
		t.Fatalf("%d opens: the cut replay resumes on a new connection", opens)
	}
}

// The composite cursor's test vector: the token given as ResumeFrom is
// sent as is, read as session "a" at 42 of epoch tag 0x0123456789ab; its
// epoch is not the bus's, so the server answers epoch_reset.
func TestMuxClientResumeCursorVector(t *testing.T) {
	const token = "m1r2PcTIYBI0VniasAAAAAAAAq"
	g := newGate(http.DefaultTransport)
	s := newServer(t, serverConfig{})
	s.publish("a", "note", nil)
	c := &sseclient.Client{Sessions: []string{"a"}, ResumeFrom: token, HTTPClient: &http.Client{Transport: g}}
	if e, id, ok := c.SessionCursor("a"); ok || id != 0 || e != "" {
		t.Fatal("a position before Run")
	}
	rc := startMux(t, s, c)
	if u, _ := url.Parse(g.urls[0]); u.Query().Get("lastEventId") != token {
		t.Fatalf("first URL %s: want lastEventId=%s", g.urls[0], token)
	}
	rc.wait(t, "the reset and a#1", waitLong, func() bool { return len(rc.resyncs) == 1 && len(rc.events) == 1 })
	if rs := rc.snap().resyncs[0]; rs.Session != "a" || rs.Reason != "epoch_reset" || rs.LastDeliveredID != 42 || rs.PreviousEpoch != "" {
		t.Fatalf("resync %+v", rs)
	}
}

func TestMuxClientInvalidOptions(t *testing.T) {
	for name, c := range map[string]*sseclient.Client{
		"empty session":   {Sessions: []string{"a", ""}},
		"not UTF-8":       {Sessions: []string{"a", "a\xff"}},
		"too long an id":  {Sessions: []string{"a", strings.Repeat("x", 257)}},
		"repeated":        {Sessions: []string{"a", "a"}},
		"with an epoch":   {Sessions: []string{"a"}, ResumeEpoch: strings.Repeat("a", 32)},
		"bad cursor":      {Sessions: []string{"a"}, ResumeFrom: "5"},
		"too many":        {Sessions: manyIDs(257)},
		"cursor too long": {Sessions: []string{"a"}, ResumeFrom: "m1" + strings.Repeat("r2PcTIYBI0VniasAAAAAAAAq", 257)},
	} {
		t.Run(name, func(t *testing.T) {
			c.URL = "http://127.0.0.1:1/events"
			if err := c.Run(t.Context()); !errors.Is(err, sseclient.ErrInvalidOption) {
				t.Fatalf("Run: %v, want ErrInvalidOption", err)
			}
		})
	}
}

func manyIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "s" + strings.Repeat("x", i%5) + string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	return ids
}

// A session the server says is gone is dropped from the URL: a 404 naming
// it, or its stream_error "closed" while streaming (the stream goes on
// for the others); with none left Run ends with ErrNoSessions.
func TestMuxClientDropsGoneSessions(t *testing.T) {
	g := newGate(http.DefaultTransport)
	s := newServer(t, serverConfig{})
	s.publish("a", "note", nil)
	s.publish("b", "note", nil)
	c := &sseclient.Client{Sessions: []string{"a", "nope", "b"}, HTTPClient: &http.Client{Transport: g}}
	rc := startMux(t, s, c)
	rc.wait(t, "nope gone, then open", waitLong, func() bool {
		return len(rc.gone) == 1 && rc.states[len(rc.states)-1].State == sseclient.StateOpen
	})
	gone := rc.goneSnap()
	he := new(sseclient.HTTPError)
	if g0 := gone[0]; g0.Session != "nope" || g0.Reason != "session_not_found" || !errors.As(g0.Err, &he) || he.Session != "nope" || he.StatusCode != http.StatusNotFound {
		t.Fatalf("gone %+v", g0)
	}
	if u, _ := url.Parse(g.lastURL()); !slices.Equal(u.Query()["session"], []string{"a", "b"}) {
		t.Fatalf("URL after the 404: %s", u)
	}
	s.publish("b", "note", nil)
	rc.wait(t, "b#2", waitLong, func() bool { return len(rc.events) == 1 })

	s.remove("b") // deleted while streaming
	rc.wait(t, "b gone", waitLong, func() bool { return len(rc.gone) == 2 })
	if g1 := rc.goneSnap()[1]; g1.Session != "b" || g1.Reason != "closed" || g1.LastEventID != 2 {
		t.Fatalf("gone %+v", g1)
	}
	s.publish("a", "note", nil)
	rc.wait(t, "a#2 on the same stream", waitLong, func() bool { return len(rc.events) == 2 })
	if opens := countOf(rc.snap().states, func(x sseclient.StateChange) bool { return x.State == sseclient.StateOpen }); opens != 1 {
		t.Fatalf("%d opens: the stream of a goes on without a reconnect", opens)
	}
	if got := c.ActiveSessions(); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("ActiveSessions %v", got)
	}

	s.remove("a")
	rc.wait(t, "closed", waitLong, func() bool {
		return len(rc.states) > 0 && rc.states[len(rc.states)-1].State == sseclient.StateClosed
	})
	if err := rc.snap().states[len(rc.snap().states)-1].Err; !errors.Is(err, sseclient.ErrNoSessions) {
		t.Fatalf("Run ended with %v, want ErrNoSessions", err)
	}
}

// A shutdown (every session's bus closed with CloseForShutdown, their
// next replica's buses of the same epochs in their place): the client
// comes back once, after a delay in [retryAfter, 2*retryAfter], and
// resumes every session exactly.
func TestMuxClientShutdownComesBackAfterRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newServer(t, serverConfig{pipe: true})
		ids := []string{"a", "b"}
		for _, id := range ids {
			s.publish(id, "e", 1)
		}
		c := &sseclient.Client{URL: s.muxURL(), Sessions: ids, HTTPClient: s.httpClient()}
		rc := newRecorder()
		rc.attach(c)
		start(t, c)
		rc.wait(t, "open", time.Minute, func() bool { return len(rc.openedAt()) == 1 })
		for _, id := range ids {
			s.publish(id, "e", 2)
		}
		rc.wait(t, "2 events", time.Minute, func() bool { return len(rc.events) == 2 })

		const ra = 4 * time.Second
		ended := time.Now()
		for _, id := range ids {
			next, err := backplane.NewMirror(eventbus.Options{Logger: quietLogger()}, backplane.MirrorOptions{Epoch: s.bus(id).Epoch(), NextID: 3})
			if err != nil {
				t.Fatal(err)
			}
			s.mu.Lock()
			old := s.buses[id]
			s.buses[id] = next
			s.mu.Unlock()
			old.CloseForShutdown(ra)
		}
		rc.wait(t, "the reconnect", time.Minute, func() bool { return len(rc.openedAt()) == 2 })
		snap := rc.snap()
		if d := snap.openedAt()[1].Sub(ended); d < ra || d > 2*ra {
			t.Fatalf("reconnected %v after the shutdown, want within [%v, %v]", d, ra, 2*ra)
		}
		var se *sseclient.StreamError
		if !errors.As(snap.errs[len(snap.errs)-1], &se) || se.Kind != "shutdown" || se.Session == "" {
			t.Fatalf("reported %v, want a session's StreamError of kind shutdown", snap.errs)
		}
		rc.wait(t, "caught up", time.Minute, func() bool { return len(rc.caught) == 2 })
		if len(rc.snap().resyncs) != 0 || len(rc.snap().events) != 2 {
			t.Fatalf("resyncs %+v, events %v: the next replica loses nothing", rc.snap().resyncs, rc.snap().ids())
		}
	})
}

// A server that sends no Event-Epochs header: the client takes each
// session's epoch tag from the id lines, so its cursor stays exact, and a
// tag other than its cursor's is reported as an epoch change.
func TestMuxClientWithoutEventEpochs(t *testing.T) {
	epochB := strings.Repeat("b", 32)
	line := func(id uint64) string { return muxcursor.Cursor{}.Set("a", epochB, id).String() }
	var mu sync.Mutex
	var cursors []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		cursors = append(cursors, r.URL.Query().Get("lastEventId"))
		n := len(cursors)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		if n == 1 {
			fmt.Fprintf(w, "retry: 10\n\nid: %s\nevent: e\ndata: {\"session\":\"a\",\"id\":5,\"v\":1,\"type\":\"e\"}\n\n", line(5))
			return // the response ends: a cut
		}
		fmt.Fprintf(w, "id: %s\nevent: e\ndata: {\"session\":\"a\",\"id\":6,\"v\":1,\"type\":\"e\"}\n\n", line(6))
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(srv.Close) // after the client's stop, which start's cleanup does first
	c := &sseclient.Client{URL: srv.URL + "/events", Sessions: []string{"a"},
		ResumeFrom: muxcursor.Cursor{}.Set("a", strings.Repeat("a", 32), 3).String()}
	rc := newRecorder()
	rc.attach(c)
	start(t, c)
	rc.wait(t, "2 events", waitLong, func() bool { return len(rc.events) == 2 })
	got := rc.snap()
	if len(got.resyncs) != 1 || got.resyncs[0].Reason != "epoch_reset" || got.resyncs[0].Detail != "epoch_changed" ||
		got.resyncs[0].LastDeliveredID != 3 || got.resyncs[0].Missing != (sseclient.IDRange{From: 1, To: 4}) {
		t.Fatalf("resyncs %+v", got.resyncs)
	}
	mu.Lock()
	defer mu.Unlock()
	if cursors[1] != line(5) {
		t.Fatalf("resumed from %q, want %q: the tag of the id line", cursors[1], line(5))
	}
}

// A multiplexed cursor the server could not use: every session reports
// cursor_invalid with what it misses from its own position, then goes on
// live.
func TestMuxClientCursorInvalid(t *testing.T) {
	s := newServer(t, serverConfig{})
	for range 4 {
		s.publish("a", "note", nil)
	}
	s.publish("b", "note", nil)
	cur := muxcursor.Cursor{}.Set("a", s.bus("a").Epoch(), 1).Set("b", s.bus("b").Epoch(), 1)
	mangleCursor(s, "m1"+strings.Repeat("!", 24))
	c := &sseclient.Client{Sessions: []string{"a", "b"}, ResumeFrom: cur.String()}
	rc := startMux(t, s, c)
	rc.wait(t, "a's resync", waitLong, func() bool { return len(rc.resyncs) == 1 })
	s.publish("a", "note", nil)
	s.publish("b", "note", nil)
	rc.wait(t, "the live events", waitLong, func() bool { return len(rc.events) == 2 })
	got := rc.snap()
	want := sseclient.Resync{Session: "a", Reason: "cursor_invalid", EarliestAvailableID: 5, Epoch: s.bus("a").Epoch(), Missing: sseclient.IDRange{From: 2, To: 4}}
	if len(got.resyncs) != 1 || got.resyncs[0] != want || len(got.caught) != 0 {
		t.Fatalf("resyncs %+v (caught up %d), want only %+v: b lacks nothing", got.resyncs, len(got.caught), want)
	}
	if by := bySession(got.events); !slices.Equal(by["a"], []uint64{5}) || !slices.Equal(by["b"], []uint64{2}) {
		t.Fatalf("events %v", by)
	}
}
