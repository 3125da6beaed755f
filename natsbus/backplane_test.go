package natsbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/internal/backplanetest"
)

// TestBackplane runs the tests every backplane must pass
// (internal/backplanetest.Run): Close, resuming on another replica and
// behind a late mirror and while publishing, local eviction, the replay
// budget, signals.
func TestBackplane(t *testing.T) { backplanetest.Run(t, cluster) }

// Events published concurrently on all three replicas reach every
// subscriber on every replica, with the same ids, bytes and order.
func TestThreeReplicasOneOrder(t *testing.T) {
	srv := startServer(t)
	a, b, c := threeReplicas(t, srv.URL(), testOptions())
	backplanetest.ThreeReplicasOneOrder(t, a.shared, b.shared, c.shared)
}

// subjectCount is how many messages the stream holds on session's subject.
func subjectCount(t *testing.T, bp *Backplane, session string) uint64 {
	t.Helper()
	st, err := bp.js.Stream(context.Background(), bp.opts.Stream)
	if err != nil {
		t.Fatal(err)
	}
	subj := bp.subject(session)
	info, err := st.Info(context.Background(), jetstream.WithSubjectFilter(subj))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subj]
}

// After the stream's per-subject limit trimmed past the cursor:
// ring_evicted, then what the stream still holds.
func TestResumeAfterTrim(t *testing.T) {
	srv := startServer(t)
	opts := testOptions()
	opts.RingSize = 10
	a, _, c := threeReplicas(t, srv.URL(), opts)
	var epoch string
	for range 50 {
		_, e, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e", Data: "x"})
		if err != nil {
			t.Fatal(err)
		}
		epoch = e
	}
	in, err := a.bp.Info(context.Background(), "s")
	if err != nil {
		t.Fatal(err)
	}
	if !in.Exists || in.FirstEventID != 41 || in.LastEventID != 50 || in.Epoch != epoch {
		t.Fatalf("info %+v, want ids 41..50 of epoch %s", in, epoch)
	}
	if n := subjectCount(t, a.bp, "s"); n != 10 {
		t.Fatalf("the subject holds %d messages, want 10 (MaxMsgsPerSubject)", n)
	}
	sc := c.open(t, "s", map[string]string{"Last-Event-ID": "5", "Event-Epoch": epoch}, "")
	rs := sc.Next(wait)
	if rs.Event != eventbus.TypeStateResyncRequired || rs.Str(t, "data", "reason") != "ring_evicted" ||
		rs.Num(t, "data", "lastDeliveredId") != 5 || rs.Num(t, "data", "earliestAvailableId") != 41 ||
		rs.Str(t, "data", "epoch") != epoch {
		t.Fatalf("want ring_evicted 5 -> 41, got %+v", rs)
	}
	wantIDs(t, sc.Events(10, wait), 41, 50)
	if rc := sc.Next(wait); rc.Event != eventbus.TypeReplayComplete || rc.Num(t, "data", "replayedCount") != 10 {
		t.Fatalf("want replay_complete of 10, got %+v", rc)
	}
	// A resume inside what is held is exact.
	s2 := c.open(t, "s", map[string]string{"Last-Event-ID": "40", "Event-Epoch": epoch}, "")
	wantIDs(t, s2.Events(10, wait), 41, 50)
}

// A resume from the stream finds the first event wanted among other
// sessions' messages (the stream's sequence interleaves them), from any
// cursor, whatever the interleaving.
func TestResumeLocatesAmongOtherSessions(t *testing.T) {
	srv := startServer(t)
	a, _, c := threeReplicas(t, srv.URL(), testOptions())
	var epoch string
	for i := range 300 {
		// "s" gets every event at first, then one in seven, then bursts.
		if i < 50 || i < 200 && i%7 == 0 || i >= 200 && i%40 < 10 {
			_, epoch, _ = a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e", Data: i})
		}
		a.publish(t, fmt.Sprintf("other%d", i%3), "e", nil)
	}
	in, _ := a.bp.Info(context.Background(), "s")
	last := in.LastEventID
	for _, from := range []uint64{0, 1, 17, 49, 50, 51, 60, last - 11, last - 1} {
		sc := c.open(t, "s", map[string]string{"Last-Event-ID": fmt.Sprint(from), "Event-Epoch": epoch}, "")
		wantIDs(t, sc.Events(int(last-from), wait), from+1, last)
		if rc := sc.Next(wait); rc.Event != eventbus.TypeReplayComplete {
			t.Fatalf("from %d: want replay_complete, got %+v", from, rc)
		}
		sc.Close()
	}
}

// Session ids with every character NATS gives a meaning to (or forbids in
// a subject) are sessions of their own, each on its own subject.
func TestHostileSessionIDs(t *testing.T) {
	srv := startServer(t)
	a, _, c := threeReplicas(t, srv.URL(), testOptions())
	ids := []string{"a.b", "a", "b", "*", ">", "a.*", "a.>", "a b", "tab\there", "new\nline", "%41", "A", "%",
		"..", ".", "caf\u00e9", "\x00", "\xff\xfe", strings.Repeat(".", MaxSessionIDBytes), "$JS.API.STREAM.LIST", "t.s.x"}
	ctx := context.Background()
	subs := map[string]*eventbus.Subscription{}
	for _, id := range ids {
		if _, ok := untoken(token(id)); !ok || strings.ContainsAny(token(id), ". \t\r\n*>") {
			t.Fatalf("token(%q) = %q", id, token(id))
		}
		sub, err := c.bp.Subscribe(ctx, id, eventbus.SubscribeOptions{})
		if err != nil {
			t.Fatalf("subscribe %q: %v", id, err)
		}
		defer sub.Close()
		subs[id] = sub
	}
	for i, id := range ids {
		for k := range 2 {
			got, _, err := a.bp.Publish(ctx, id, eventbus.Event{Type: "e", Data: i})
			if err != nil || got != uint64(k+1) {
				t.Fatalf("publish %d to %q: id %d, %v", k, id, got, err)
			}
		}
		if err := a.bp.Signal(ctx, id, "sig", id); err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range ids {
		sub := subs[id]
		var frames []eventbus.Frame
		deadline := time.After(wait)
		for len(frames) < 3 {
			if more, _ := sub.AppendReady(frames); len(more) > len(frames) {
				frames = more
				continue
			}
			select {
			case <-sub.Ready():
			case <-deadline:
				t.Fatalf("%q got %d frames: %v", id, len(frames), frames)
			}
		}
		var sig int
		for _, f := range frames {
			if f.ID() == 0 {
				sig++
				continue
			}
			var env struct{ Data int }
			json.Unmarshal(f.JSON(), &env)
			if env.Data != i {
				t.Fatalf("%q got an event of %q", id, ids[env.Data])
			}
		}
		if len(frames) != 3 || sig != 1 {
			t.Fatalf("%q got %d frames, %d signals: %v", id, len(frames), sig, frames)
		}
	}
	// Delete is per id too.
	if err := a.bp.Delete(ctx, "a.b"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "a.*", "a.>", "*", ">"} {
		if in, err := a.bp.Info(ctx, id); err != nil || in.LastEventID != 2 {
			t.Fatalf("%q after deleting \"a.b\": %+v %v", id, in, err)
		}
	}
	if in, _ := a.bp.Info(ctx, "a.b"); in.Exists {
		t.Fatalf("\"a.b\" after Delete: %+v", in)
	}
	for _, bad := range []string{"", strings.Repeat("x", MaxSessionIDBytes+1)} {
		if _, _, err := a.bp.Publish(ctx, bad, eventbus.Event{Type: "e"}); !errors.Is(err, ErrInvalidSession) {
			t.Fatalf("session of %d bytes: %v", len(bad), err)
		}
	}
}

// token is reversible and distinct ids never share a token.
func TestTokenRoundTrip(t *testing.T) {
	seen := map[string]string{}
	for _, id := range []string{"a", "A", "%41", "%", "a.b", "a%2Eb", "-_", "\x00", "\xff", " "} {
		tok := token(id)
		if back, ok := untoken(tok); !ok || back != id {
			t.Fatalf("untoken(token(%q)) = %q, %v", id, back, ok)
		}
		if other, dup := seen[tok]; dup {
			t.Fatalf("%q and %q share the token %q", id, other, tok)
		}
		seen[tok] = id
	}
	for _, bad := range []string{"%", "%4", "%zz", "%4g"} {
		if _, ok := untoken(bad); ok {
			t.Fatalf("untoken(%q) accepted", bad)
		}
	}
}

// Delete rolls the session up; every replica's mirror closes; the next
// publish starts a new epoch at id 1.
func TestDelete(t *testing.T) {
	srv := startServer(t)
	a, _, c := threeReplicas(t, srv.URL(), testOptions())
	sa, sc := a.open(t, "s", nil, ""), c.open(t, "s", nil, "")
	for range 3 {
		a.publish(t, "s", "e", nil)
	}
	wantIDs(t, sa.Events(3, wait), 1, 3)
	wantIDs(t, sc.Events(3, wait), 1, 3)
	if err := a.bp.Delete(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	sa.Ended(wait)
	sc.Ended(wait)
	if n := subjectCount(t, a.bp, "s"); n != 1 {
		t.Fatalf("the subject holds %d messages after Delete, want the tombstone alone", n)
	}
	if in, err := c.bp.Info(context.Background(), "s"); err != nil || in.Exists {
		t.Fatalf("Info after Delete: %+v %v", in, err)
	}
	id, epoch, err := c.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
	if err != nil || id != 1 || epoch == sa.Epoch {
		t.Fatalf("publish after delete: id %d epoch %q err %v (old epoch %q)", id, epoch, err, sa.Epoch)
	}
	// A client of the old epoch gets epoch_reset on the new one.
	s2 := a.open(t, "s", map[string]string{"Last-Event-ID": "3", "Event-Epoch": sa.Epoch}, "")
	rs := s2.Next(wait)
	if rs.Str(t, "data", "reason") != "epoch_reset" || rs.Str(t, "data", "detail") != "epoch_mismatch" || rs.Str(t, "data", "epoch") != epoch {
		t.Fatalf("want epoch_reset, got %+v", rs)
	}
	wantIDs(t, s2.Events(1, wait), 1, 1)
	if err := a.bp.Delete(context.Background(), "never-used"); err != nil {
		t.Fatalf("Delete of an unknown session: %v", err)
	}
}

// A Delete on A, then at once a new live stream on B (whose reader has not
// seen the tombstone): the stream is of the new epoch and gets its events;
// B's stream of the dead epoch ends.
func TestDeleteThenNewStreamOnAnotherReplica(t *testing.T) {
	srv := startServer(t)
	a, b := newReplica(t, srv.URL(), "A", testOptions()), newReplica(t, srv.URL(), "B", testOptions())
	old := b.open(t, "s", nil, "")
	a.publish(t, "s", "e", nil)
	wantIDs(t, old.Events(1, wait), 1, 1)
	g := installGate(b.bp)
	defer g.open()
	g.close(t) // B's reader will not see the tombstone
	if err := a.bp.Delete(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	fresh := b.open(t, "s", nil, "")
	if fresh.Epoch == old.Epoch || len(fresh.Epoch) != 32 {
		t.Fatalf("new stream on B has epoch %q, the deleted one was %q", fresh.Epoch, old.Epoch)
	}
	old.Ended(wait) // without its reader: the new stream released the mirror
	g.open()
	id, epoch, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
	if err != nil || id != 1 || epoch != fresh.Epoch {
		t.Fatalf("publish on A after the delete: id %d epoch %s err %v; want 1 in %s", id, epoch, err, fresh.Epoch)
	}
	wantIDs(t, fresh.Events(1, wait), 1, 1)
}

// A publish through a replica whose mirror is of a deleted session
// releases that mirror at once.
func TestPublishReleasesStaleMirror(t *testing.T) {
	srv := startServer(t)
	a, b := newReplica(t, srv.URL(), "A", testOptions()), newReplica(t, srv.URL(), "B", testOptions())
	g := installGate(a.bp)
	defer g.open()
	sa := a.open(t, "s", nil, "")
	a.publish(t, "s", "e", nil)
	wantIDs(t, sa.Events(1, wait), 1, 1)
	g.close(t)
	if err := b.bp.Delete(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	if id := a.publish(t, "s", "e", nil); id != 1 {
		t.Fatalf("publish after the delete: id %d", id)
	}
	sa.Ended(wait)
}

// A client that read id n through A resumes on C before C's reader has
// seen n: C waits for its reader (Head) instead of answering epoch_reset.
func TestResumeOnALaggingReplica(t *testing.T) {
	srv := startServer(t)
	a, _, c := threeReplicas(t, srv.URL(), testOptions())
	g := installGate(c.bp)
	live := c.open(t, "s", nil, "") // C's mirror exists
	g.close(t)
	sa := a.open(t, "s", nil, "")
	for range 10 {
		a.publish(t, "s", "e", nil)
	}
	wantIDs(t, sa.Events(10, wait), 1, 10)
	go func() {
		time.Sleep(200 * time.Millisecond)
		g.open()
	}()
	sc := c.open(t, "s", map[string]string{"Last-Event-ID": "10", "Event-Epoch": sa.Epoch}, "")
	if rc := sc.Next(wait); rc.Event != eventbus.TypeReplayComplete || rc.Num(t, "data", "replayedCount") != 0 {
		t.Fatalf("want an empty replay_complete, got %+v", rc)
	}
	wantIDs(t, live.Events(10, wait), 1, 10)
	a.publish(t, "s", "e", nil)
	wantIDs(t, sc.Events(1, wait), 11, 11)
}

// A resume whose history cannot be read (a message with the backplane's
// headers but a body that is not an event, as another writer could leave
// on the subject): the client is told what it missed cannot be read, then
// gets the live events.
func TestResumeHistoryUnavailable(t *testing.T) {
	srv := startServer(t)
	a, _, c := threeReplicas(t, srv.URL(), testOptions())
	for range 10 {
		a.publish(t, "s", "e", nil)
	}
	in, _ := a.bp.Info(context.Background(), "s")
	if _, err := a.bp.js.PublishMsg(context.Background(), newMsg(a.bp.subject("s"), in.Epoch, 11, []byte("no type line"))); err != nil {
		t.Fatal(err)
	}
	live := c.open(t, "s", nil, "") // C's mirror starts after id 11
	for range 9 {
		a.publish(t, "s", "e", nil)
	}
	wantIDs(t, live.Events(9, wait), 12, 20)
	sc := c.open(t, "s", map[string]string{"Last-Event-ID": "5", "Event-Epoch": in.Epoch}, "")
	rs := sc.Next(wait)
	if rs.Event != eventbus.TypeStateResyncRequired || rs.Str(t, "data", "reason") != "ring_evicted" ||
		rs.Str(t, "data", "detail") != "history_unavailable" || rs.Num(t, "data", "lastDeliveredId") != 5 ||
		rs.Num(t, "data", "earliestAvailableId") != 21 {
		t.Fatalf("want ring_evicted (history_unavailable) 5 -> 21, got %+v", rs)
	}
	if rc := sc.Next(wait); rc.Event != eventbus.TypeReplayComplete || rc.Num(t, "data", "replayedCount") != 0 {
		t.Fatalf("want an empty replay_complete, got %+v", rc)
	}
	a.publish(t, "s", "e", nil)
	wantIDs(t, sc.Events(1, wait), 21, 21)
}

// Invalid and oversized events use no id, whether the local encoder or
// the check with the id's digits refuses them.
func TestPublishValidation(t *testing.T) {
	srv := startServer(t)
	opts := testOptions()
	opts.Bus.MaxEventBytes = 200
	a := newReplica(t, srv.URL(), "A", opts)
	ctx := context.Background()
	if _, _, err := a.bp.Publish(ctx, "s", eventbus.Event{Type: ""}); !errors.Is(err, eventbus.ErrInvalidEvent) {
		t.Fatalf("empty type: %v", err)
	}
	if _, _, err := a.bp.Publish(ctx, "s", eventbus.Event{Type: "e", Data: func() {}}); !errors.Is(err, eventbus.ErrInvalidEvent) {
		t.Fatalf("func data: %v", err)
	}
	ts := map[string]any{"serverTimestamp": 1}
	for range 9 {
		if _, _, err := a.bp.Publish(ctx, "s", eventbus.Event{Type: "e", Meta: ts}); err != nil {
			t.Fatal(err)
		}
	}
	// An event that fits with a one-digit id but not with id 10.
	enc, err := a.bp.encoder.Encode(eventbus.Event{Type: "e", Data: "", Meta: ts})
	if err != nil {
		t.Fatal(err)
	}
	ev := eventbus.Event{Type: "e", Data: strings.Repeat("p", 200-len(enc.Envelope(1))), Meta: ts}
	if enc, _ = a.bp.encoder.Encode(ev); len(enc.Envelope(1)) != 200 {
		t.Fatalf("crafted envelope of %d bytes", len(enc.Envelope(1)))
	}
	if _, _, err := a.bp.Publish(ctx, "s", ev); !errors.Is(err, eventbus.ErrEventTooLarge) {
		t.Fatalf("event of 201 bytes with id 10: %v", err)
	}
	id, _, err := a.bp.Publish(ctx, "s", eventbus.Event{Type: "e"})
	if err != nil || id != 10 {
		t.Fatalf("next publish: id %d, %v; want 10", id, err)
	}
}

// The envelope a subscriber receives is what a plain bus would publish,
// with the log's id, and any type the core accepts round-trips.
func TestEnvelope(t *testing.T) {
	srv := startServer(t)
	a, _, c := threeReplicas(t, srv.URL(), testOptions())
	s := a.open(t, "s", nil, "")
	ctx := context.Background()
	ev := eventbus.Event{Type: "t\u2028x: y", Data: map[string]any{"k": "v\n"}, Meta: map[string]any{"serverTimestamp": 7, "m": 1}, OriginatorClientID: "c1"}
	if _, _, err := a.bp.Publish(ctx, "s", ev); err != nil {
		t.Fatal(err)
	}
	f := s.Next(wait)
	plain, _ := eventbus.New(eventbus.Options{})
	defer plain.Close()
	want, err := plain.Publish(ev)
	if err != nil {
		t.Fatal(err)
	}
	if f.ID != 1 || f.Event != ev.Type || f.Data != string(want.JSON()) {
		t.Fatalf("got %+v, want %s", f, want.JSON())
	}
	// The same from the stream's history.
	h := c.open(t, "s", map[string]string{"Last-Event-ID": "0", "Event-Epoch": s.Epoch}, "")
	if g := h.Next(wait); g != f {
		t.Fatalf("from the history: %+v, live %+v", g, f)
	}
}

// Sessions without local subscribers are released after IdleTimeout, with
// their reader; the next lookup makes a new mirror of the same epoch.
func TestIdleRelease(t *testing.T) {
	srv := startServer(t)
	opts := testOptions()
	opts.IdleTimeout = 100 * time.Millisecond
	a, s := liveReplica(t, srv.URL(), opts)
	time.Sleep(300 * time.Millisecond)
	if n := a.bp.Sessions(); n != 1 {
		t.Fatalf("a session with a subscriber was released (%d)", n)
	}
	s.Close()
	waitFor(t, wait, "idle release", func() bool { return a.bp.Sessions() == 0 })
	s2 := a.open(t, "s", map[string]string{"Last-Event-ID": "0", "Event-Epoch": s.Epoch}, "")
	wantIDs(t, s2.Events(1, wait), 1, 1)
}

// The stream deleted under the backplane: the next read creates it again,
// mirrors close (their epoch is gone), ids restart at 1 in a new epoch,
// and a client presenting the old epoch gets epoch_reset.
func TestLostStream(t *testing.T) {
	srv := startServer(t)
	a, _, c := threeReplicas(t, srv.URL(), testOptions())
	sa := a.open(t, "s", nil, "")
	for range 5 {
		a.publish(t, "s", "e", nil)
	}
	wantIDs(t, sa.Events(5, wait), 1, 5)
	if err := a.bp.js.DeleteStream(context.Background(), "T"); err != nil {
		t.Fatal(err)
	}
	if rest := sa.Ended(wait); len(rest) != 0 {
		t.Fatalf("frames after the stream was lost: %+v", rest)
	}
	var id uint64
	var epoch string
	waitFor(t, wait, "publish after the stream was lost", func() bool {
		var err error
		id, epoch, err = c.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		return err == nil
	})
	if id != 1 || epoch == sa.Epoch {
		t.Fatalf("after the lost stream: id %d epoch %s (old %s)", id, epoch, sa.Epoch)
	}
	sc := c.open(t, "s", map[string]string{"Last-Event-ID": "5", "Event-Epoch": sa.Epoch}, "")
	if rs := sc.Next(wait); rs.Str(t, "data", "reason") != "epoch_reset" {
		t.Fatalf("want epoch_reset, got %+v", rs)
	}
	wantIDs(t, sc.Events(1, wait), 1, 1)
}

// The server stopped, then started again (its store kept): Publish fails
// within its timeout with ErrUnavailable (nothing sent: the connection has
// no reconnect buffer), a new stream is 503; afterwards the ids go on in
// the same epoch and the open stream resumes without a loss.
func TestServerRestart(t *testing.T) {
	srv := startServer(t)
	opts := testOptions()
	opts.PublishTimeout = 300 * time.Millisecond
	a, sa := liveReplica(t, srv.URL(), opts)
	srv.Stop()
	// A publish written before the client noticed is outcome unknown.
	waitFor(t, wait, "the client to notice", func() bool { return !a.bp.nc.IsConnected() })
	for range 3 {
		start := time.Now()
		_, _, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("publish with the server down: %v, want ErrUnavailable alone", err)
		}
		if took := time.Since(start); took > opts.PublishTimeout+200*time.Millisecond {
			t.Fatalf("publish took %v, timeout %v", took, opts.PublishTimeout)
		}
	}
	resp, err := a.shared.Server.Client().Get(a.shared.URL("other", ""))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" || !strings.Contains(string(body), `"code":"unavailable"`) {
		t.Fatalf("GET with the server down: %s %v %s", resp.Status, resp.Header, body)
	}
	srv.Start()
	var id uint64
	var epoch string
	waitFor(t, wait, "publish after the restart", func() bool {
		id, epoch, err = a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		return err == nil
	})
	if id != 2 || epoch != sa.Epoch {
		t.Fatalf("after the restart: id %d epoch %s, want 2 of %s", id, epoch, sa.Epoch)
	}
	wantIDs(t, sa.Events(1, wait), 2, 2)
	sa.Quiet(50 * time.Millisecond)
}

// The server gone past OutageTimeout: every open stream ends with a
// terminal stream_error "unavailable", the session is released, new
// streams are refused while it is down, and a client reconnecting
// afterwards resumes from its cursor without a loss.
func TestOutageEndsStreams(t *testing.T) {
	srv := startServer(t)
	opts := testOptions()
	opts.OutageTimeout = 500 * time.Millisecond
	opts.PublishTimeout = 300 * time.Millisecond
	a, b := newReplica(t, srv.URL(), "A", opts), newReplica(t, srv.URL(), "B", opts)
	sa, sb := a.open(t, "s", nil, ""), b.open(t, "s", nil, "")
	for range 3 {
		a.publish(t, "s", "e", nil)
	}
	wantIDs(t, sa.Events(3, wait), 1, 3)
	wantIDs(t, sb.Events(3, wait), 1, 3)

	srv.Stop()
	start := time.Now()
	sa.EndedUnavailable(wait)
	sb.EndedUnavailable(wait)
	if took := time.Since(start); took > opts.OutageTimeout+time.Second {
		t.Fatalf("streams ended %v after the stop, OutageTimeout %v", took, opts.OutageTimeout)
	}
	if a.bp.Sessions() != 0 || b.bp.Sessions() != 0 {
		t.Fatalf("sessions still held: A %d, B %d", a.bp.Sessions(), b.bp.Sessions())
	}
	if _, err := a.bp.Subscribe(context.Background(), "s", eventbus.SubscribeOptions{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Subscribe while the server is down: %v", err)
	}
	srv.Start()
	waitFor(t, wait, "publish after the outage", func() bool {
		_, _, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		return err == nil
	})
	waitFor(t, wait, "B to reconnect", b.bp.nc.IsConnected)
	again := b.open(t, "s", map[string]string{"Last-Event-ID": "3", "Event-Epoch": sa.Epoch}, "")
	wantIDs(t, again.Events(1, wait), 4, 4)
	if rc := again.Next(wait); rc.Event != eventbus.TypeReplayComplete {
		t.Fatalf("want replay_complete, got %+v", rc)
	}
	a.publish(t, "s", "e", nil)
	wantIDs(t, again.Events(1, wait), 5, 5)
}

// A blip shorter than OutageTimeout ends nothing: the reader goes on from
// its last id.
func TestShortOutageEndsNothing(t *testing.T) {
	srv := startServer(t)
	opts := testOptions()
	opts.OutageTimeout = 5 * time.Second
	a, sa := liveReplica(t, srv.URL(), opts)
	srv.Stop()
	time.Sleep(300 * time.Millisecond)
	srv.Start()
	waitFor(t, wait, "publish after the blip", func() bool {
		_, _, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		return err == nil
	})
	wantIDs(t, sa.Events(1, wait), 2, 2)
	if a.bp.Sessions() != 1 {
		t.Fatalf("the session was released by a blip")
	}
}

func TestNewRejectsInvalidOptions(t *testing.T) {
	srv := startServer(t)
	js := connect(t, srv.URL())
	for name, o := range map[string]Options{
		"negative window":      {IdempotencyWindow: -1},
		"window below 100ms":   {IdempotencyWindow: time.Millisecond},
		"negative outage":      {OutageTimeout: -1},
		"outage below check":   {OutageTimeout: time.Second, CheckInterval: 2 * time.Second},
		"negative read count":  {ReadCount: -1},
		"stream name with dot": {Stream: "a.b"},
		"subject wildcard":     {Subject: "a.*"},
		"subject empty token":  {Subject: "a..b"},
		"bad bus options":      {Bus: eventbus.Options{RingSize: -1}},
	} {
		if bp, err := New(context.Background(), js, o); !errors.Is(err, eventbus.ErrInvalidOption) {
			if bp != nil {
				bp.Close()
			}
			t.Fatalf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
	if _, err := New(context.Background(), nil, Options{}); !errors.Is(err, eventbus.ErrInvalidOption) {
		t.Fatalf("nil JetStream: %v", err)
	}
}

// New sets the limits it relies on on an existing stream and keeps the
// rest of its operator's config.
func TestNewUpdatesTheStream(t *testing.T) {
	srv := startServer(t)
	js := connect(t, srv.URL())
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"other.>"}, MaxBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	opts := testOptions()
	opts.RingSize = 77
	bp, err := New(ctx, js, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer bp.Close()
	st, err := js.Stream(ctx, "T")
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if cfg.MaxMsgsPerSubject != 77 || cfg.Duplicates != DefaultIdempotencyWindow || !cfg.AllowRollup || !cfg.AllowMsgTTL ||
		cfg.MaxBytes != 1<<30 || len(cfg.Subjects) != 2 || cfg.Subjects[0] != "other.>" || cfg.Subjects[1] != "t.s.>" {
		t.Fatalf("stream config %+v", cfg)
	}
}
