package backplanetest

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
)

// A slow subscriber on B is evicted there; every other subscriber, on
// every replica, gets everything, and the other mirrors evict nobody.
func checkSlowSubscriberEvictedLocally(t testing.TB, h *harness) {
	a, b, c := h.three(Options{})
	var fast []*Stream
	for _, rp := range []*Replica{a, b, c} {
		fast = append(fast, rp.Open(t, "s", nil, ""))
	}
	slow, err := b.BP.Subscribe(context.Background(), "s", eventbus.SubscribeOptions{MaxQueued: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	for range 100 {
		a.Publish(t, "s", "e", nil)
	}
	for _, s := range fast {
		WantIDs(t, s.Events(100, wait), 1, 100)
	}
	var ids []uint64
	var types []string
	for f := range slow.Events() {
		if f.ID() != 0 {
			ids = append(ids, f.ID())
		} else {
			types = append(types, f.Type())
		}
	}
	if len(ids) != 16 || ids[0] != 1 || ids[15] != 16 {
		t.Fatalf("the slow subscriber got ids %v, want 1..16", ids)
	}
	if len(types) != 2 || types[0] != eventbus.TypeSlowClientWarning || types[1] != eventbus.TypeClientEvicted {
		t.Fatalf("the slow subscriber got synthetic frames %v", types)
	}
	if !errors.Is(slow.Err(), eventbus.ErrEvicted) {
		t.Fatalf("the slow subscriber ended with %v", slow.Err())
	}
	for _, rp := range []*Replica{a, b, c} {
		bus, err := rp.BP.Bus(context.Background(), "s")
		if err != nil {
			t.Fatal(err)
		}
		want := uint64(0)
		if rp == b {
			want = 1
		}
		if got := bus.Stats().Evictions.QueueOverflow; got != want {
			t.Fatalf("%s evicted %d, want %d", rp.Name, got, want)
		}
	}
}

// A signal sent on one replica reaches the session's subscribers on every
// replica, without an id; an invalid one is refused.
func checkSignals(t testing.TB, h *harness) {
	a, b, c := h.three(Options{})
	var subs []*Stream
	for _, rp := range []*Replica{a, b, c} {
		subs = append(subs, rp.Open(t, "s", nil, ""))
	}
	if err := b.BP.Signal(context.Background(), "s", "doc.changed", "doc/1"); err != nil {
		t.Fatal(err)
	}
	for i, s := range subs {
		f := s.Next(wait)
		if f.ID != 0 || f.Event != "doc.changed" || f.Str(t, "about") != "doc/1" {
			t.Fatalf("replica %d got %+v", i, f)
		}
	}
	if err := a.BP.Signal(context.Background(), "s", "", "x"); !errors.Is(err, eventbus.ErrInvalidEvent) {
		t.Fatalf("an empty signal type: %v, want eventbus.ErrInvalidEvent", err)
	}
	a.Publish(t, "s", "e", nil)
	for _, s := range subs {
		WantIDs(t, s.Events(1, wait), 1, 1)
	}
}

// Delete forgets the session: every replica's streams of it end, the
// next publish starts a new epoch at id 1, a resume with the old epoch
// gets epoch_reset; deleting an unknown session is no error.
func checkDelete(t testing.TB, h *harness) {
	a, _, c := h.three(Options{})
	sa, sc := a.Open(t, "s", nil, ""), c.Open(t, "s", nil, "")
	a.Publish(t, "s", "e", nil)
	a.Publish(t, "s", "e", nil)
	WantIDs(t, sa.Events(2, wait), 1, 2)
	WantIDs(t, sc.Events(2, wait), 1, 2)
	ctx := context.Background()
	if err := a.BP.Delete(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	noEvents(t, "A", sa.Ended(wait))
	noEvents(t, "C", sc.Ended(wait))
	if in, err := c.BP.Info(ctx, "s"); err != nil || in.Exists {
		t.Fatalf("Info after Delete: %+v %v, want no session", in, err)
	}
	id, epoch, err := c.BP.Publish(ctx, "s", eventbus.Event{Type: "e"})
	if err != nil || id != 1 || epoch == sa.Epoch || len(epoch) != 32 {
		t.Fatalf("publish after Delete: id %d epoch %q err %v (old epoch %q), want id 1 of a new epoch", id, epoch, err, sa.Epoch)
	}
	s := a.Open(t, "s", map[string]string{"Last-Event-ID": "2", "Event-Epoch": sa.Epoch}, "")
	if rs := s.Next(wait); rs.Str(t, "data", "reason") != "epoch_reset" || rs.Num(t, "data", "earliestAvailableId") != 1 {
		t.Fatalf("a resume with the deleted epoch: %+v, want epoch_reset to 1", rs)
	}
	WantIDs(t, s.Events(1, wait), 1, 1)
	if err := a.BP.Delete(ctx, "never-used"); err != nil {
		t.Fatalf("Delete of an unknown session: %v", err)
	}
}

// noEvents fails t when frames (what a stream got before it ended) hold
// an event.
func noEvents(t testing.TB, who string, frames []Frame) {
	t.Helper()
	for _, f := range frames {
		if f.ID != 0 {
			t.Fatalf("%s's stream got id %d after its epoch ended", who, f.ID)
		}
	}
}

// A Delete on A, then at once a new stream on B, whose reader has not
// noticed (it is held): the stream is of the new epoch and gets its
// events, B's streams of the dead epoch end; the same for an in-process
// subscription.
func checkDeleteThenNewStream(t testing.TB, h *harness) {
	rs, _ := h.cluster(2, Options{}, "gates")
	a, b := rs[0], rs[1]
	old := b.Open(t, "s", nil, "")
	a.Publish(t, "s", "e", nil)
	WantIDs(t, old.Events(1, wait), 1, 1)
	b.Gate.Hold(t, "s") // B's reader will not notice the delete
	defer b.Gate.Release()
	ctx := context.Background()
	if err := a.BP.Delete(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	fresh := b.Open(t, "s", nil, "")
	if fresh.Epoch == old.Epoch || len(fresh.Epoch) != 32 {
		t.Fatalf("the new stream on B has epoch %q, the deleted one was %q", fresh.Epoch, old.Epoch)
	}
	noEvents(t, "B's old", old.Ended(wait)) // without its reader: the new stream released the mirror
	b.Gate.Release()
	id, epoch, err := a.BP.Publish(ctx, "s", eventbus.Event{Type: "e"})
	if err != nil || id != 1 || epoch != fresh.Epoch {
		t.Fatalf("publish on A after the delete: id %d epoch %s err %v; want 1 in %s", id, epoch, err, fresh.Epoch)
	}
	WantIDs(t, fresh.Events(1, wait), 1, 1)

	b.Gate.Hold(t, "s")
	if err := a.BP.Delete(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	sub, err := b.BP.Subscribe(ctx, "s", eventbus.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	b.Gate.Release()
	fresh.Ended(wait)
	if id := a.Publish(t, "s", "e", nil); id != 1 {
		t.Fatalf("publish after the second delete: id %d, want 1", id)
	}
	if got := take(t, sub, 1); got[0].ID() != 1 {
		t.Fatalf("the in-process subscription got %v, want id 1 of the new epoch", got)
	}
}

// A publish through a replica whose mirror is of a deleted epoch (its
// reader has not noticed) releases that mirror at once.
func checkPublishReleasesStaleMirror(t testing.TB, h *harness) {
	rs, _ := h.cluster(2, Options{}, "gates")
	a, b := rs[0], rs[1]
	sa := a.Open(t, "s", nil, "")
	a.Publish(t, "s", "e", nil)
	WantIDs(t, sa.Events(1, wait), 1, 1)
	a.Gate.Hold(t, "s")
	defer a.Gate.Release()
	if err := b.BP.Delete(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	if id := a.Publish(t, "s", "e", nil); id != 1 {
		t.Fatalf("publish after the delete: id %d, want 1", id)
	}
	noEvents(t, "A", sa.Ended(wait))
}

// A mirror without local subscribers is released after IdleTimeout, with
// its reader, and one with a subscriber is not; the next lookup makes a
// new mirror of the same epoch.
func checkIdleRelease(t testing.TB, h *harness) {
	rs, _ := h.cluster(1, Options{IdleTimeout: 100 * time.Millisecond})
	a := rs[0]
	s := a.Open(t, "s", nil, "")
	a.Publish(t, "s", "e", nil)
	WantIDs(t, s.Events(1, wait), 1, 1)
	time.Sleep(300 * time.Millisecond)
	if n := a.BP.Sessions(); n != 1 {
		t.Fatalf("a mirror with a subscriber was released (%d sessions)", n)
	}
	s.Close()
	WaitFor(t, wait, "the idle mirror's release", func() bool { return a.BP.Sessions() == 0 })
	s2 := a.Open(t, "s", map[string]string{"Last-Event-ID": "0", "Event-Epoch": s.Epoch}, "")
	if s2.Epoch != s.Epoch {
		t.Fatalf("the session's epoch changed from %q to %q when its mirror was released", s.Epoch, s2.Epoch)
	}
	WantIDs(t, s2.Events(1, wait), 1, 1)
}

// Close ends the replica's open streams, each with stream_error shutdown
// (at the default retryAfter), within a second, and every goroutine;
// Publish and Bus then fail with eventbus.ErrClosed. Idempotent.
func checkClose(t testing.TB, h *harness) {
	rs, _ := h.cluster(1, Options{})
	a := rs[0]
	s := a.Open(t, "s", nil, "")
	for i := range 5 {
		a.Publish(t, "s"+strconv.Itoa(i), "e", nil)
	}
	a.Publish(t, "s", "e", nil)
	WantIDs(t, s.Events(1, wait), 1, 1)
	start := time.Now()
	a.BP.Close()
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Close took %v", took)
	}
	s.EndedShutdown(wait, eventbus.DefaultShutdownRetryAfter)
	if _, _, err := a.BP.Publish(context.Background(), "s", eventbus.Event{Type: "e"}); !errors.Is(err, eventbus.ErrClosed) {
		t.Fatalf("Publish after Close: %v, want eventbus.ErrClosed", err)
	}
	if _, err := a.BP.Bus(context.Background(), "s"); !errors.Is(err, eventbus.ErrClosed) {
		t.Fatalf("Bus after Close: %v, want eventbus.ErrClosed", err)
	}
	a.BP.Close()
}
