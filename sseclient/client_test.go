package sseclient_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/sseclient"
)

const waitLong = 20 * time.Second

func newClient(url string) *sseclient.Client { return &sseclient.Client{URL: url} }

// bothIDForms runs f against a Handler with plain ids ("id: N") and with
// epoch ids ("id: <epoch>:<N>").
func bothIDForms(t *testing.T, f func(t *testing.T, epochIDs bool)) {
	for _, epochIDs := range []bool{false, true} {
		t.Run(fmt.Sprint("EpochIDs=", epochIDs), func(t *testing.T) { f(t, epochIDs) })
	}
}

// stallAtFirstEvent starts c with a recorder whose OnEvent stops reading at
// event 1 until release is closed: the server's writes then block and its
// queue for the client fills. It returns once the stream is open.
func stallAtFirstEvent(t *testing.T, c *sseclient.Client) (rc *recorder, release chan struct{}) {
	rc, release = newRecorder(), make(chan struct{})
	c.OnEvent = func(e sseclient.Event) {
		if e.ID == 1 {
			<-release
		}
		rc.mu.Lock()
		rc.events = append(rc.events, e)
		rc.mu.Unlock()
		rc.note()
	}
	return startOpen(t, c, rc), release
}

// startOpen starts c, recording into rc (a new recorder when none is
// given), and returns once its stream is open.
func startOpen(t *testing.T, c *sseclient.Client, rcs ...*recorder) *recorder {
	rc := newRecorder()
	if len(rcs) > 0 {
		rc = rcs[0]
	}
	rc.attach(c)
	start(t, c)
	rc.wait(t, "open", waitLong, func() bool { return len(rc.states) >= 2 })
	return rc
}

func TestLiveThenCleanCutResumesWithoutGapOrDuplicate(t *testing.T) {
	bothIDForms(t, func(t *testing.T, epochIDs bool) {
		s := newServer(t, serverConfig{handler: func(h *eventbus.Handler) { h.BareIDs = !epochIDs }})
		c := &sseclient.Client{URL: s.url("a")}
		rc := startOpen(t, c)
		for i := 1; i <= 3; i++ {
			s.publish("a", "note", map[string]int{"i": i})
		}
		rc.wait(t, "3 events", waitLong, func() bool { return len(rc.events) == 3 })
		epoch := s.bus("a").Epoch()
		if e, id, ok := c.Cursor(); e != epoch || id != 3 || !ok {
			t.Fatalf("Cursor() = %q %d %v, want %q 3 true", e, id, ok, epoch)
		}
		var d struct{ I int }
		data(t, rc.snap().events[2], &d)
		if d.I != 3 || rc.snap().events[2].Epoch != epoch || rc.snap().events[2].Type != "note" || rc.snap().events[2].ServerTimestamp == 0 {
			t.Fatalf("event 3 = %+v", rc.snap().events[2])
		}

		if n := s.cut("a", nil); n != 1 {
			t.Fatalf("cut %d streams", n)
		}
		rc.wait(t, "replay_complete", waitLong, func() bool { return len(rc.caught) == 1 })
		if got := rc.snap().caught[0]; got.ReplayedCount != 0 || got.Epoch != epoch {
			t.Fatalf("caught up %+v", got)
		}
		for i := 4; i <= 6; i++ {
			s.publish("a", "note", map[string]int{"i": i})
		}
		rc.wait(t, "6 events", waitLong, func() bool { return len(rc.events) == 6 })
		wantIDs(t, rc.snap().ids(), seq(1, 6))
		if got := strings.Join(rc.snap().stateNames(), ","); got != "connecting,open,reconnecting,open" {
			t.Fatalf("states %s", got)
		}
		if len(rc.snap().errs) != 1 || !errors.Is(rc.snap().errs[0], sseclient.ErrStreamCut) {
			t.Fatalf("errors %v, want one ErrStreamCut", rc.snap().errs)
		}
	})
}

func TestAbruptCutResumes(t *testing.T) {
	bothIDForms(t, func(t *testing.T, epochIDs bool) {
		s := newServer(t, serverConfig{handler: func(h *eventbus.Handler) { h.BareIDs = !epochIDs }})
		c := &sseclient.Client{URL: s.url("a")}
		rc := startOpen(t, c)
		for i := 1; i <= 3; i++ {
			s.publish("a", "note", nil)
		}
		rc.wait(t, "3 events", waitLong, func() bool { return len(rc.events) == 3 })
		// Every connection closed at once, as a failing load balancer would.
		s.srv.CloseClientConnections()
		s.publish("a", "note", nil)
		rc.wait(t, "resumed", waitLong, func() bool { return len(rc.caught) == 1 && len(rc.events) == 4 })
		s.publish("a", "note", nil)
		rc.wait(t, "5 events", waitLong, func() bool { return len(rc.events) == 5 })
		wantIDs(t, rc.snap().ids(), seq(1, 5))
		if !rc.snap().events[3].Replayed || rc.snap().events[4].Replayed {
			t.Fatalf("replayed flags %v %v", rc.snap().events[3].Replayed, rc.snap().events[4].Replayed)
		}
	})
}

func TestRestartIsAnEpochResetNeverASilentJoin(t *testing.T) {
	bothIDForms(t, func(t *testing.T, epochIDs bool) {
		s := newServer(t, serverConfig{handler: func(h *eventbus.Handler) { h.BareIDs = !epochIDs }})
		g := newGate(http.DefaultTransport.(*http.Transport).Clone())
		hc := &http.Client{Transport: g}
		defer g.next.(*http.Transport).CloseIdleConnections()
		for i := 1; i <= 3; i++ {
			s.publish("a", "note", nil)
		}
		c := &sseclient.Client{URL: s.url("a"), HTTPClient: hc}
		rc := startOpen(t, c)
		s.publish("a", "note", map[string]int{"gen": 1})
		rc.wait(t, "event 4", waitLong, func() bool { return len(rc.events) == 1 })
		old := s.bus("a").Epoch()

		g.hold()
		s.restart()
		// The new epoch is past the client's cursor (4) already: a resume by
		// number alone would join it at 5.
		for i := 1; i <= 6; i++ {
			s.publish("a", "note", map[string]int{"gen": 2})
		}
		g.release()
		rc.wait(t, "resumed in the new epoch", waitLong, func() bool { return len(rc.caught) == 1 })
		if len(rc.snap().resyncs) != 1 {
			t.Fatalf("resyncs %+v", rc.snap().resyncs)
		}
		rs := rc.snap().resyncs[0]
		fresh := s.bus("a").Epoch()
		if rs.Reason != "epoch_reset" || rs.Detail != "epoch_mismatch" || rs.PreviousEpoch != old || rs.Epoch != fresh || rs.LastDeliveredID != 4 || !rs.Missing.Empty() {
			t.Fatalf("resync %+v", rs)
		}
		wantIDs(t, rc.snap().ids(), append([]uint64{4}, seq(1, 6)...))
		for _, e := range rc.snap().events[1:] {
			if e.Epoch != fresh || !e.Replayed {
				t.Fatalf("event %+v", e)
			}
		}
		q, _ := url.Parse(g.lastURL())
		cursor := "4"
		if epochIDs {
			cursor = old + ":4" // the form the server used
		}
		if q.Query().Get("lastEventId") != cursor || q.Query().Get("epoch") != old {
			t.Fatalf("resumed with %s", g.lastURL())
		}
	})
}

func TestEvictionThenResumeLosesNothing(t *testing.T) {
	s := newServer(t, serverConfig{})
	c := &sseclient.Client{URL: s.url("a"), MaxQueued: 16}
	rc, release := stallAtFirstEvent(t, c)
	payload := strings.Repeat("p", 256<<10)
	const n = 80 // 20 MiB: past loopback's socket buffers and the 8 MiB replay budget
	for range n {
		s.publish("a", "big", map[string]string{"p": payload})
	}
	deadline := time.Now().Add(waitLong)
	for s.bus("a").Stats().Evictions.QueueBytesOverflow+s.bus("a").Stats().Evictions.QueueOverflow == 0 {
		if time.Now().After(deadline) {
			t.Fatal("never evicted")
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(release)
	rc.wait(t, "every event", 60*time.Second, func() bool { return len(rc.events) == n })
	wantIDs(t, rc.snap().ids(), seq(1, n))
	if len(rc.snap().evicted) == 0 || len(rc.snap().resyncs) != 0 {
		t.Fatalf("evicted %+v, resyncs %+v", rc.snap().evicted, rc.snap().resyncs)
	}
	if st := s.bus("a").Stats(); st.Resyncs.ReplayBudgetExceeded == 0 {
		t.Fatalf("the resume was not cut by the replay budget: %+v", st.Resyncs)
	}
}

func TestRingEvictedResyncHasTheExactMissingRange(t *testing.T) {
	s := newServer(t, serverConfig{opts: eventbus.Options{RingSize: 10}})
	tr := http.DefaultTransport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	g := newGate(tr)
	c := &sseclient.Client{URL: s.url("a"), HTTPClient: &http.Client{Transport: g}}
	rc := startOpen(t, c)
	for range 3 {
		s.publish("a", "note", nil)
	}
	rc.wait(t, "3 events", waitLong, func() bool { return len(rc.events) == 3 })
	g.hold()
	s.cut("a", nil)
	// Until its handler returns, the cut stream still delivers what is
	// published; the client seeing the end of the response means it has.
	rc.wait(t, "the cut", waitLong, func() bool { return rc.states[len(rc.states)-1].State == sseclient.StateReconnecting })
	for range 50 {
		s.publish("a", "note", nil)
	}
	g.release()
	rc.wait(t, "caught up", waitLong, func() bool { return len(rc.caught) == 1 })
	want := sseclient.Resync{Reason: "ring_evicted", LastDeliveredID: 3, EarliestAvailableID: 44, Epoch: s.bus("a").Epoch(), Missing: sseclient.IDRange{From: 4, To: 43}}
	if len(rc.snap().resyncs) != 1 || rc.snap().resyncs[0] != want {
		t.Fatalf("resyncs %+v, want %+v", rc.snap().resyncs, want)
	}
	wantIDs(t, rc.snap().ids(), append(seq(1, 3), seq(44, 53)...))
}

func TestOverflowResyncPolicyAnnouncesExactlyWhatIsMissing(t *testing.T) {
	s := newServer(t, serverConfig{opts: eventbus.Options{OverflowPolicy: eventbus.OverflowResync, MaxQueued: 16}})
	rc, release := stallAtFirstEvent(t, newClient(s.url("a")))
	payload := strings.Repeat("q", 64<<10)
	const n = 200
	for range n {
		s.publish("a", "big", map[string]string{"p": payload})
	}
	close(release)
	rc.wait(t, "the last event", 60*time.Second, func() bool { return len(rc.events) > 0 && rc.events[len(rc.events)-1].ID == n })
	// Every id is either delivered once or inside an announced range.
	got := map[uint64]bool{}
	for _, e := range rc.snap().events {
		if got[e.ID] {
			t.Fatalf("id %d twice", e.ID)
		}
		got[e.ID] = true
	}
	for _, r := range rc.snap().resyncs {
		for id := r.Missing.From; id <= r.Missing.To; id++ {
			if got[id] {
				t.Fatalf("id %d delivered but announced missing in %+v", id, r)
			}
			got[id] = true
		}
	}
	for id := uint64(1); id <= n; id++ {
		if !got[id] {
			t.Fatalf("id %d lost silently; resyncs %+v", id, rc.snap().resyncs)
		}
	}
	if len(rc.snap().resyncs) == 0 {
		t.Fatal("no overflow resync: the test did not overflow")
	}
}

func TestOneMiBEventAndALineLongerThan64KiB(t *testing.T) {
	s := newServer(t, serverConfig{})
	c := &sseclient.Client{URL: s.url("a")}
	rc := startOpen(t, c)
	var b strings.Builder
	for i := 0; b.Len() < 1<<20; i++ {
		b.WriteString("0123456789abcdef\u00e9\u4e16")
	}
	big := b.String()
	s.publish("a", "blob", map[string]string{"s": big[:100<<10]})
	s.publish("a", "blob", map[string]string{"s": big})
	rc.wait(t, "2 events", waitLong, func() bool { return len(rc.events) == 2 })
	for i, want := range []string{big[:100<<10], big} {
		var d struct{ S string }
		data(t, rc.snap().events[i], &d)
		if d.S != want {
			t.Fatalf("event %d: %d bytes, want %d", i+1, len(d.S), len(want))
		}
	}
}

// The client takes control only from the stream's own word, never from
// application data: an epoch in an event's data, and events and a signal
// named like synthetic frames. A server of this module refuses those types
// (eventbus.ReservedTypes), so the stream here is scripted, as another or
// an older server could send it.
func TestApplicationDataIsNeverControl(t *testing.T) {
	s := newServer(t, serverConfig{})
	fake := strings.Repeat("f", 32)
	forged := func(id uint64, typ, data string) string {
		return fmt.Sprintf("id: %d\nevent: %s\ndata: {\"id\":%d,\"v\":1,\"type\":%q,\"data\":%s}\n\n", id, typ, id, typ, data)
	}
	scripted(s, epochA, syn(eventbus.TypeReplayComplete, `{"replayedCount":0,"epoch":"`+epochA+`"}`)+
		forged(1, "note", `{"epoch":"`+fake+`"}`)+
		forged(2, eventbus.TypeReplayComplete, `{"replayedCount":9,"epoch":"`+fake+`"}`)+
		forged(3, eventbus.TypeStateResyncRequired, `{"reason":"epoch_reset","epoch":"`+fake+`","earliestAvailableId":1}`)+
		forged(4, eventbus.TypeClientEvicted, `{"reason":"queue_overflow"}`)+
		forged(5, eventbus.TypeStreamError, `{"error":"x","errorKind":"revoked"}`)+
		"event: "+eventbus.TypeReplayComplete+"\ndata: {\"v\":1,\"type\":\"replay_complete\",\"about\":\"doc/1\"}\n\n"+
		forged(6, "note", "null"))
	rc := newRecorder()
	c := &sseclient.Client{URL: s.url("a"), ResumeFrom: "0"}
	rc.attach(c)
	start(t, c)
	rc.wait(t, "6 events and a signal", waitLong, func() bool { return len(rc.events) == 6 && len(rc.signals) == 1 })
	if e, id, _ := c.Cursor(); e != epochA || id != 6 {
		t.Fatalf("cursor %q %d, want %q 6", e, id, epochA)
	}
	if len(rc.snap().caught) != 1 || len(rc.snap().resyncs) != 0 || len(rc.snap().evicted) != 0 || len(rc.snap().errs) != 0 {
		t.Fatalf("control from data: caught %v resyncs %v evicted %v errs %v", rc.snap().caught, rc.snap().resyncs, rc.snap().evicted, rc.snap().errs)
	}
	if sig := rc.snap().signals[0]; sig.Type != eventbus.TypeReplayComplete || sig.About != "doc/1" {
		t.Fatalf("signal %+v", sig)
	}
}

func TestFinalAnswers(t *testing.T) {
	s := newServer(t, serverConfig{})
	s.handler.Lookup = func(r *http.Request, _ string) (*eventbus.EventBus, error) {
		if r.PathValue("id") == "missing" {
			return nil, eventbus.ErrSessionNotFound
		}
		return s.bus(r.PathValue("id")), nil
	}
	var he *sseclient.HTTPError
	err := runFinal(t, &sseclient.Client{URL: s.url("missing")}, waitLong)
	if !errors.As(err, &he) || he.StatusCode != 404 || he.Code != "session_not_found" {
		t.Fatalf("404: %v", err)
	}
	err = runFinal(t, &sseclient.Client{URL: s.url("a"), Types: []string{"Bad.*"}}, waitLong)
	if !errors.As(err, &he) || he.StatusCode != 400 || he.Code != "invalid_filter" {
		t.Fatalf("400: %v", err)
	}
	s.before = func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "text/html")
		w.Write([]byte("<html>"))
		return false
	}
	if err := runFinal(t, &sseclient.Client{URL: s.url("a")}, waitLong); !errors.Is(err, sseclient.ErrNotEventStream) {
		t.Fatalf("html: %v", err)
	}
	// 401 and 403: auth_test.go, from the Handler's Authorize.
}

func TestEventAboveMaxEventBytesIsFinal(t *testing.T) {
	s := newServer(t, serverConfig{})
	s.publish("a", "blob", strings.Repeat("x", 5000))
	err := runFinal(t, &sseclient.Client{URL: s.url("a"), ResumeFrom: "0", MaxEventBytes: 4096}, waitLong)
	if !errors.Is(err, sseclient.ErrEventTooLarge) {
		t.Fatalf("err %v", err)
	}
}

func TestInvalidOptions(t *testing.T) {
	for name, c := range map[string]*sseclient.Client{
		"no URL":          {},
		"ftp":             {URL: "ftp://x/"},
		"maxQueued 15":    {URL: "http://x/", MaxQueued: 15},
		"maxQueued 2049":  {URL: "http://x/", MaxQueued: 2049},
		"negative max":    {URL: "http://x/", MaxEventBytes: -1},
		"negative delay":  {URL: "http://x/", InitialDelay: -1},
		"bad epoch":       {URL: "http://x/", ResumeEpoch: "E"},
		"id past 2^53-1":  {URL: "http://x/", ResumeFrom: "9007199254740992"},
		"bad ResumeFrom":  {URL: "http://x/", ResumeFrom: "-1"},
		"a mux cursor":    {URL: "http://x/", ResumeFrom: "m1r2PcTIYBI0VniasAAAAAAAAq"},
		"epochs differ":   {URL: "http://x/", ResumeFrom: strings.Repeat("a", 32) + ":1", ResumeEpoch: strings.Repeat("b", 32)},
		"negative wait":   {URL: "http://x/", RetryNotFound: -1},
		"comma in filter": {URL: "http://x/", Types: []string{"a,b"}},
		"client timeout":  {URL: "http://x/", HTTPClient: &http.Client{Timeout: time.Second}},
	} {
		if err := c.Run(context.Background()); !errors.Is(err, sseclient.ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
}

func TestRunReturnsOnCancelWhileStreamingAndResumesOnTheNextRun(t *testing.T) {
	s := newServer(t, serverConfig{})
	rc := newRecorder()
	c := &sseclient.Client{URL: s.url("a")}
	rc.attach(c)
	stop := start(t, c)
	rc.wait(t, "open", waitLong, func() bool { return len(rc.states) >= 2 })
	s.publish("a", "note", nil)
	rc.wait(t, "event", waitLong, func() bool { return len(rc.events) == 1 })
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run returned %v", err)
	}
	if last := rc.snap().states[len(rc.snap().states)-1]; last.State != sseclient.StateClosed || !errors.Is(last.Err, context.Canceled) {
		t.Fatalf("last state %+v", last)
	}
	if n := s.openStreams("a"); n != 0 {
		// The server sees the disconnect a little later.
		deadline := time.Now().Add(waitLong)
		for s.openStreams("a") != 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	s.publish("a", "note", nil)
	start(t, c)
	rc.wait(t, "resumed by the second Run", waitLong, func() bool { return len(rc.events) == 2 && len(rc.caught) == 1 })
	wantIDs(t, rc.snap().ids(), seq(1, 2))
}

func TestConcurrentRunIsRefused(t *testing.T) {
	s := newServer(t, serverConfig{})
	c := &sseclient.Client{URL: s.url("a")}
	startOpen(t, c)
	if err := c.Run(context.Background()); !errors.Is(err, sseclient.ErrRunning) {
		t.Fatalf("second Run: %v", err)
	}
}

// mangleCursor makes s's requests carry a cursor the server cannot use,
// as an intermediary that rewrites it would: the server serves the stream
// live, after state_resync_required cursor_invalid.
func mangleCursor(s *server, garbage string) {
	s.before = func(_ http.ResponseWriter, r *http.Request) bool {
		q := r.URL.Query()
		if q.Has("lastEventId") {
			q.Set("lastEventId", garbage)
			r.URL.RawQuery = q.Encode()
		}
		r.Header.Del("Last-Event-ID")
		return true
	}
}

// A cursor the server could not use (issue 32 point 3): the client reports
// cursor_invalid as the other resyncs, missing from its own cursor to
// earliestAvailableId-1, then takes the live events.
func TestCursorInvalidResyncReportsWhatIsMissing(t *testing.T) {
	s := newServer(t, serverConfig{})
	for range 5 {
		s.publish("a", "note", nil)
	}
	epoch := s.bus("a").Epoch()
	mangleCursor(s, "not-a-cursor")
	c := &sseclient.Client{URL: s.url("a"), ResumeFrom: "2", ResumeEpoch: epoch}
	rc := startOpen(t, c)
	rc.wait(t, "the resync", waitLong, func() bool { return len(rc.resyncs) == 1 })
	s.publish("a", "note", nil)
	rc.wait(t, "the live event", waitLong, func() bool { return len(rc.events) == 1 })
	want := sseclient.Resync{Reason: "cursor_invalid", LastDeliveredID: 0, EarliestAvailableID: 6, Epoch: epoch, Missing: sseclient.IDRange{From: 3, To: 5}}
	if got := rc.snap(); len(got.resyncs) != 1 || got.resyncs[0] != want || len(got.caught) != 0 {
		t.Fatalf("resyncs %+v (caught up %d), want %+v and no replay_complete", got.resyncs, len(got.caught), want)
	}
	wantIDs(t, rc.snap().ids(), []uint64{6})
	if st := s.bus("a").Stats(); st.Resyncs.CursorInvalid != 1 {
		t.Fatalf("the server counted %d cursor_invalid resyncs, want 1", st.Resyncs.CursorInvalid)
	}
}
