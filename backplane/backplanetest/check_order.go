package backplanetest

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
)

// Publishes alternating over three replicas get ids 1, 2, 3 ... in one
// epoch, every replica's subscribers get them all, and another session
// starts at 1 of its own.
func checkIDsContiguous(t testing.TB, h *harness) {
	rs, _ := h.cluster(3, Options{})
	var streams []*Stream
	for _, rp := range rs {
		streams = append(streams, rp.Open(t, "s", nil, ""))
	}
	ctx := context.Background()
	var last uint64
	var epoch string
	const n = 30
	for i := range n {
		rp := rs[i%len(rs)]
		id, e, err := rp.BP.Publish(ctx, "s", eventbus.Event{Type: "e", Data: i})
		if err != nil {
			t.Fatalf("%s: publish %d: %v", rp.Name, i+1, err)
		}
		if id != last+1 {
			t.Fatalf("got %d after %d (publish %d, on %s)", id, last, i+1, rp.Name)
		}
		if epoch != "" && e != epoch {
			t.Fatalf("publish %d on %s answered epoch %q, the earlier ones %q", i+1, rp.Name, e, epoch)
		}
		last, epoch = id, e
	}
	for i, s := range streams {
		WantIDs(t, s.Events(n, wait), 1, n)
		if s.Epoch != epoch {
			t.Fatalf("%s's stream has epoch %q, the publishes %q", rs[i].Name, s.Epoch, epoch)
		}
	}
	for _, rp := range rs {
		in, err := rp.BP.Info(ctx, "s")
		if err != nil || !in.Exists || in.LastEventID != n || in.Epoch != epoch {
			t.Fatalf("%s: Info %+v, %v; want the last id %d of epoch %s", rp.Name, in, err, n, epoch)
		}
		if id := rp.Publish(t, "other-"+rp.Name, "e", nil); id != 1 {
			t.Fatalf("the first publish of a new session on %s got id %d", rp.Name, id)
		}
	}
}

// Publishers on every replica at once: every subscriber on every replica
// (two each) gets every event with the same ids, bytes and order, each
// publisher's events in its own order, and one epoch.
func checkOneOrderEverywhere(t testing.TB, h *harness) {
	reps, _ := h.cluster(3, Options{MaxQueued: burstQueue})
	var subs []*Stream
	for _, rp := range reps {
		for range 2 {
			subs = append(subs, rp.Open(t, "s1", nil, ""))
		}
	}
	const per, publishers = 100, 2 // per replica: 2 publishers of 100 each
	var wg sync.WaitGroup
	ids := make([][]uint64, len(reps)*publishers)
	for i := range ids {
		rp := reps[i%len(reps)]
		wg.Go(func() {
			for n := range per {
				id, _, err := rp.BP.Publish(context.Background(), "s1", eventbus.Event{
					Type: "e", Data: map[string]int{"p": i, "n": n}})
				if err != nil {
					t.Errorf("%s: %v", rp.Name, err)
					return
				}
				ids[i] = append(ids[i], id)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	seen := map[uint64]bool{}
	for i := range ids {
		for k, id := range ids[i] {
			if seen[id] {
				t.Fatalf("id %d assigned twice", id)
			}
			seen[id] = true
			if k > 0 && id <= ids[i][k-1] {
				t.Fatalf("publisher %d got id %d after %d", i, id, ids[i][k-1])
			}
		}
	}
	total := uint64(len(ids) * per)
	var ref []Frame
	for i, s := range subs {
		got := s.Events(int(total), wait)
		WantIDs(t, got, 1, total)
		if i == 0 {
			ref = got
			continue
		}
		for k := range got {
			if got[k] != ref[k] {
				t.Fatalf("subscriber %d frame %d = %+v, subscriber 0 has %+v", i, k, got[k], ref[k])
			}
		}
	}
	next := make([]int64, len(ids))
	for _, f := range ref {
		p, n := f.Num(t, "data", "p"), f.Num(t, "data", "n")
		if n != next[p] {
			t.Fatalf("publisher %d: event n=%d at id %d, want n=%d", p, n, f.ID, next[p])
		}
		next[p]++
	}
	if subs[0].Epoch == "" || subs[0].Epoch != subs[5].Epoch {
		t.Fatalf("epochs differ across replicas: %q, %q", subs[0].Epoch, subs[5].Epoch)
	}
}

// A session opened on three replicas at once, before its first publish,
// has one epoch everywhere: the streams', the first publish's, Info's;
// a resume with it on any replica is no epoch_reset.
func checkEpochKept(t testing.TB, h *harness) {
	rs, _ := h.cluster(3, Options{})
	streams := make([]*Stream, len(rs))
	var wg sync.WaitGroup
	for i, rp := range rs {
		wg.Go(func() { streams[i] = rp.Open(t, "fresh", nil, "") })
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	epoch := streams[0].Epoch
	if len(epoch) != 32 {
		t.Fatalf("the stream's epoch is %q, want 32 hex characters", epoch)
	}
	for i, s := range streams {
		if s.Epoch != epoch {
			t.Fatalf("%s opened the new session with epoch %q, %s with %q", rs[i].Name, s.Epoch, rs[0].Name, epoch)
		}
	}
	ctx := context.Background()
	for i, rp := range rs {
		id, e, err := rp.BP.Publish(ctx, "fresh", eventbus.Event{Type: "e"})
		if err != nil || id != uint64(i+1) || e != epoch {
			t.Fatalf("publish on %s: id %d epoch %q err %v; want id %d in the streams' epoch %q", rp.Name, id, e, err, i+1, epoch)
		}
		if in, err := rp.BP.Info(ctx, "fresh"); err != nil || in.Epoch != epoch {
			t.Fatalf("%s: Info %+v %v, want epoch %q", rp.Name, in, err, epoch)
		}
	}
	for i, s := range streams {
		WantIDs(t, s.Events(3, wait), 1, 3)
		s.Close()
		resumed := rs[(i+1)%len(rs)].Open(t, "fresh", map[string]string{"Last-Event-ID": "1", "Event-Epoch": epoch}, "")
		if resumed.Epoch != epoch {
			t.Fatalf("a resume on %s got epoch %q, want %q", rs[(i+1)%len(rs)].Name, resumed.Epoch, epoch)
		}
		wantResumed(t, resumed, 2, 3)
	}
}

// wantResumed reads a resume in the session's epoch: events from..to in
// order and one replay_complete, no resync. The seam may fall anywhere
// among the events: a replica whose reader has not been fed the newest of
// them yet replays what it has and delivers the rest live, after
// replay_complete, which loses nothing.
func wantResumed(t testing.TB, s *Stream, from, to uint64) {
	t.Helper()
	var events []Frame
	seam := false
	deadline := time.Now().Add(wait)
	for !seam || uint64(len(events)) < to-from+1 {
		f := s.Next(time.Until(deadline))
		switch {
		case f.ID != 0:
			events = append(events, f)
		case f.Event == eventbus.TypeReplayComplete && !seam:
			seam = true
		case f.Event == eventbus.TypeSlowClientWarning:
		default:
			t.Fatalf("a resume in the session's epoch got %s %s after %d events, want events %d..%d and one replay_complete", f.Event, f.Data, len(events), from, to)
		}
	}
	WantIDs(t, events, from, to)
}

// The envelope a subscriber receives, live and from the log's history, is
// what a plain bus would publish, with the log's id; a session id of any
// bytes and a type of any the bus accepts survive the engine exactly.
func checkEnvelope(t testing.TB, h *harness) {
	a, _, c := h.three(Options{})
	ctx := context.Background()
	ev := eventbus.Event{Type: "t\u2028x: y\xfe", Data: map[string]any{"k": "v\n"}, Meta: map[string]any{"serverTimestamp": 7, "m": 1}, OriginatorClientID: "c1"}
	plain, err := eventbus.New(eventbus.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want, err := plain.Publish(ev)
	plain.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, session := range []string{"s", "a.b c/\u00e9\x00*>%41{x}"} {
		sub, err := a.BP.Subscribe(ctx, session, eventbus.SubscribeOptions{})
		if err != nil {
			t.Fatalf("subscribe to %q: %v", session, err)
		}
		if _, _, err := a.BP.Publish(ctx, session, ev); err != nil {
			t.Fatalf("publish to %q: %v", session, err)
		}
		got := take(t, sub, 1)[0]
		sub.Close()
		if got.ID() != 1 || got.Type() != ev.Type || string(got.JSON()) != string(want.JSON()) {
			t.Fatalf("session %q: got id %d type %q %s, want id 1 type %q %s", session, got.ID(), got.Type(), got.JSON(), ev.Type, want.JSON())
		}
		// From the log, on a replica that has no mirror of it yet.
		old, err := c.BP.Subscribe(ctx, session, eventbus.SubscribeOptions{Resume: true, LastEventID: 0})
		if err != nil {
			t.Fatalf("resume %q: %v", session, err)
		}
		hist := take(t, old, 1)[0]
		old.Close()
		if hist.ID() != 1 || hist.Type() != ev.Type || string(hist.JSON()) != string(want.JSON()) {
			t.Fatalf("session %q from the log: got id %d type %q %s, want %s", session, hist.ID(), hist.Type(), hist.JSON(), want.JSON())
		}
	}
	// Over HTTP: the frame's fields.
	s := a.Open(t, "s", map[string]string{"Last-Event-ID": "0"}, "")
	if f := s.Next(wait); f.ID != 1 || f.Event != ev.Type || f.Data != string(want.JSON()) {
		t.Fatalf("over HTTP: %+v, want %s", f, want.JSON())
	}
}

// Invalid and oversized events are refused and use no id, whether the
// encoder refuses them or the engine does, which alone knows the id's
// digits.
func checkPublishValidation(t testing.TB, h *harness) {
	rs, _ := h.cluster(1, Options{MaxEventBytes: 200})
	a := rs[0]
	ctx := context.Background()
	if _, _, err := a.BP.Publish(ctx, "s", eventbus.Event{Type: ""}); !errors.Is(err, eventbus.ErrInvalidEvent) {
		t.Fatalf("empty type: %v, want eventbus.ErrInvalidEvent", err)
	}
	if _, _, err := a.BP.Publish(ctx, "s", eventbus.Event{Type: "e", Data: func() {}}); !errors.Is(err, eventbus.ErrInvalidEvent) {
		t.Fatalf("func data: %v, want eventbus.ErrInvalidEvent", err)
	}
	if _, _, err := a.BP.Publish(ctx, "", eventbus.Event{Type: "e"}); err == nil || h.ErrInvalidSession != nil && !errors.Is(err, h.ErrInvalidSession) {
		t.Fatalf("empty session: %v, want the module's ErrInvalidSession", err)
	}
	ts := map[string]any{"serverTimestamp": 1}
	for range 9 {
		if _, _, err := a.BP.Publish(ctx, "s", eventbus.Event{Type: "e", Meta: ts}); err != nil {
			t.Fatal(err)
		}
	}
	// An event that fits with a one-digit id but not with id 10.
	enc, err := backplane.NewEncoder(eventbus.Options{})
	if err != nil {
		t.Fatal(err)
	}
	small, err := enc.Encode(eventbus.Event{Type: "e", Data: "", Meta: ts})
	if err != nil {
		t.Fatal(err)
	}
	ev := eventbus.Event{Type: "e", Data: strings.Repeat("p", 200-len(small.Envelope(1))), Meta: ts}
	if e, _ := enc.Encode(ev); len(e.Envelope(1)) != 200 {
		t.Fatalf("crafted envelope of %d bytes", len(e.Envelope(1)))
	}
	if _, _, err := a.BP.Publish(ctx, "s", ev); !errors.Is(err, eventbus.ErrEventTooLarge) {
		t.Fatalf("an event of 201 bytes with id 10: %v, want eventbus.ErrEventTooLarge", err)
	}
	if id, _, err := a.BP.Publish(ctx, "s", eventbus.Event{Type: "e"}); err != nil || id != 10 {
		t.Fatalf("the next publish: id %d, %v; want 10", id, err)
	}
}

// A publisher cannot forge a synthetic frame (issue 32): an event or a
// signal whose type is one of eventbus.ReservedTypes is refused with
// eventbus.ErrInvalidEvent, plain or keyed, and uses no id; no stream,
// on the publishing replica or another, gets a frame of it, and a
// refused keyed publish records no key.
func checkReservedTypes(t testing.TB, h *harness) {
	rs, _ := h.cluster(2, Options{})
	a, b := rs[0], rs[1]
	streams := []*Stream{a.Open(t, "s", nil, ""), b.Open(t, "s", nil, "")}
	ctx := context.Background()
	for _, typ := range eventbus.ReservedTypes() {
		ev := eventbus.Event{Type: typ, Data: map[string]any{"reason": "queue_overflow", "droppedAfter": 1}}
		if id, _, err := a.BP.Publish(ctx, "s", ev); !errors.Is(err, eventbus.ErrInvalidEvent) {
			t.Fatalf("publish of type %s: id %d, %v; want eventbus.ErrInvalidEvent", typ, id, err)
		}
		if id, _, _, err := b.BP.PublishIdempotent(ctx, "s", "k-"+typ, ev); !errors.Is(err, eventbus.ErrInvalidEvent) {
			t.Fatalf("keyed publish of type %s: id %d, %v; want eventbus.ErrInvalidEvent", typ, id, err)
		}
		if err := a.BP.Signal(ctx, "s", typ, "x"); !errors.Is(err, eventbus.ErrInvalidEvent) {
			t.Fatalf("signal of type %s: %v; want eventbus.ErrInvalidEvent", typ, err)
		}
	}
	if id := a.Publish(t, "s", "e", nil); id != 1 {
		t.Fatalf("the first publish after the refused ones has id %d, want 1", id)
	}
	key := "k-" + eventbus.TypeClientEvicted
	if id, _, dup, err := b.BP.PublishIdempotent(ctx, "s", key, eventbus.Event{Type: "e"}); err != nil || id != 2 || dup {
		t.Fatalf("the key of a refused publish: id %d dup %v err %v, want a new event, id 2", id, dup, err)
	}
	for i, s := range streams {
		for want := uint64(1); want <= 2; want++ {
			if f := s.Next(wait); f.ID != want || f.Event != "e" {
				t.Fatalf("replica %s's stream got %+v, want event %d of type e", rs[i].Name, f, want)
			}
		}
		s.Quiet(50 * time.Millisecond)
	}
}

// The session id rule (eventbus.CheckSessionID) holds on every method: an
// id that is not valid UTF-8 (two that JSON would both label "a\ufffd"),
// the empty id and one past eventbus.MaxSessionIDBytes are refused with
// the module's ErrInvalidSession wrapping eventbus.ErrInvalidSessionID,
// the stream with 400 invalid_session_id, and none becomes a session; the
// longest id and UTF-8 beyond ASCII are sessions of their own.
func checkInvalidSessionIDs(t testing.TB, h *harness) {
	rs, _ := h.cluster(1, Options{})
	a := rs[0]
	ctx := context.Background()
	want := func(what, id string, err error) {
		t.Helper()
		if !errors.Is(err, eventbus.ErrInvalidSessionID) || h.ErrInvalidSession != nil && !errors.Is(err, h.ErrInvalidSession) {
			t.Fatalf("%s of %q: %v, want the module's ErrInvalidSession wrapping eventbus.ErrInvalidSessionID", what, id, err)
		}
	}
	for _, id := range []string{"a\xff", "a\xfe", "caf\xc3", "", strings.Repeat("x", eventbus.MaxSessionIDBytes+1)} {
		_, _, err := a.BP.Publish(ctx, id, eventbus.Event{Type: "e"})
		want("Publish", id, err)
		_, _, _, err = a.BP.PublishIdempotent(ctx, id, "k", eventbus.Event{Type: "e"})
		want("PublishIdempotent", id, err)
		want("Signal", id, a.BP.Signal(ctx, id, "t", "about"))
		want("Delete", id, a.BP.Delete(ctx, id))
		_, err = a.BP.Info(ctx, id)
		want("Info", id, err)
		_, err = a.BP.Bus(ctx, id)
		want("Bus", id, err)
		sub, err := a.BP.Subscribe(ctx, id, eventbus.SubscribeOptions{})
		if sub != nil {
			sub.Close()
		}
		want("Subscribe", id, err)
		if id == "" {
			continue // no route names it
		}
		resp, err := a.Server.Client().Get(a.URL(id, ""))
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Code string }
		derr := json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || derr != nil || body.Code != "invalid_session_id" {
			t.Fatalf("the stream of %q: %s %q (%v), want 400 invalid_session_id", id, resp.Status, body.Code, derr)
		}
	}
	if n := a.BP.Sessions(); n != 0 {
		t.Fatalf("%d sessions after the refused calls, want none", n)
	}
	for _, id := range []string{"caf\u00e9", "\u65e5\u672c", strings.Repeat("x", eventbus.MaxSessionIDBytes)} {
		if n, _, err := a.BP.Publish(ctx, id, eventbus.Event{Type: "e"}); err != nil || n != 1 {
			t.Fatalf("Publish to %q: id %d, %v; want a session of its own at 1", id, n, err)
		}
	}
}

// burstQueue is the subscribers' queue of the checks that publish a burst
// faster than a test's client reads it.
const burstQueue = 4096

// take returns the next n frames of sub within the suite's wait.
func take(t testing.TB, sub *eventbus.Subscription, n int) []eventbus.Frame {
	t.Helper()
	var out []eventbus.Frame
	for len(out) < n {
		more, open := sub.AppendReady(out)
		if len(more) > len(out) {
			out = more
			continue
		}
		if !open {
			t.Fatalf("the subscription ended (%v) after %d of %d frames", sub.Err(), len(out), n)
		}
		select {
		case <-sub.Ready():
		case <-time.After(wait):
			t.Fatalf("%d of %d frames within %v", len(out), n, wait)
		}
	}
	return out[:n]
}
