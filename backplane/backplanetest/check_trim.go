package backplanetest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
)

// The log trimmed to RingSize: Info names what it holds, a resume from
// before it gets ring_evicted with the first id held, then those events;
// a resume inside what it holds is exact.
func checkTrimRingEvicted(t testing.TB, h *harness) {
	a, _, c := h.three(Options{RingSize: 10})
	ctx := context.Background()
	var epoch string
	for range 50 {
		_, e, err := a.BP.Publish(ctx, "s", eventbus.Event{Type: "e", Data: "x"})
		if err != nil {
			t.Fatal(err)
		}
		epoch = e
	}
	in, err := a.BP.Info(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if in.FirstEventID != 41 || in.LastEventID != 50 || in.Epoch != epoch {
		t.Fatalf("Info %+v, want ids 41..50 of epoch %s: the log keeps RingSize (10) events", in, epoch)
	}
	sc := c.Open(t, "s", map[string]string{"Last-Event-ID": "5", "Event-Epoch": epoch}, "")
	rs := sc.Next(wait)
	if rs.Event != eventbus.TypeStateResyncRequired || rs.Str(t, "data", "reason") != "ring_evicted" ||
		rs.Num(t, "data", "lastDeliveredId") != 5 || rs.Num(t, "data", "earliestAvailableId") != 41 ||
		rs.Str(t, "data", "epoch") != epoch {
		t.Fatalf("want ring_evicted 5 -> 41, got %+v", rs)
	}
	WantIDs(t, sc.Events(10, wait), 41, 50)
	if rc := sc.Next(wait); rc.Event != eventbus.TypeReplayComplete || rc.Num(t, "data", "replayedCount") != 10 {
		t.Fatalf("want replay_complete of 10, got %+v", rc)
	}
	s2 := c.Open(t, "s", map[string]string{"Last-Event-ID": "40", "Event-Epoch": epoch}, "")
	WantIDs(t, s2.Events(10, wait), 41, 50)
}

// The log trimmed to RingMaxBytes as tightly as the bound allows (the
// newest event dropped would not have fitted), Info.Bytes exact; an event
// above the bound stays, alone.
func checkTrimByBytes(t testing.TB, h *harness) {
	rs, _ := h.cluster(1, Options{RingMaxBytes: 1000})
	a := rs[0]
	ctx := context.Background()
	enc, err := backplane.NewEncoder(eventbus.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ts := map[string]any{"serverTimestamp": 1} // the same envelope here and in the engine
	size := func(i int) uint64 {
		ev, err := enc.Encode(eventbus.Event{Type: "e", Data: strings.Repeat("x", i*3), Meta: ts})
		if err != nil {
			t.Fatal(err)
		}
		return uint64(len(ev.Envelope(uint64(i + 1))))
	}
	for i := range 40 {
		if _, _, err := a.BP.Publish(ctx, "s", eventbus.Event{Type: "e", Data: strings.Repeat("x", i*3), Meta: ts}); err != nil {
			t.Fatal(err)
		}
	}
	in, err := a.BP.Info(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if in.LastEventID != 40 || in.FirstEventID < 2 || in.FirstEventID > 40 {
		t.Fatalf("Info %+v after 40 events of up to 220 bytes, RingMaxBytes 1000", in)
	}
	var sum uint64
	for id := in.FirstEventID; id <= in.LastEventID; id++ {
		sum += size(int(id - 1))
	}
	if in.Bytes != sum || sum > 1000 {
		t.Fatalf("Info %+v: ids %d..%d are %d envelope bytes, RingMaxBytes 1000", in, in.FirstEventID, in.LastEventID, sum)
	}
	if dropped := in.FirstEventID - 1; sum+size(int(dropped-1)) <= 1000 {
		t.Fatalf("id %d was trimmed although %d+%d bytes fit RingMaxBytes 1000", dropped, sum, size(int(dropped-1)))
	}
	s := a.Open(t, "s", map[string]string{"Last-Event-ID": "0", "Event-Epoch": in.Epoch}, "")
	if rs := s.Next(wait); rs.Str(t, "data", "reason") != "ring_evicted" || rs.Num(t, "data", "earliestAvailableId") != int64(in.FirstEventID) {
		t.Fatalf("a resume from 0: %+v, want ring_evicted to %d", rs, in.FirstEventID)
	}
	if _, _, err := a.BP.Publish(ctx, "s", eventbus.Event{Type: "e", Data: strings.Repeat("y", 2000)}); err != nil {
		t.Fatal(err)
	}
	if in, _ = a.BP.Info(ctx, "s"); in.FirstEventID != 41 || in.LastEventID != 41 {
		t.Fatalf("after an event above RingMaxBytes: Info %+v, want it alone (id 41)", in)
	}
}

// A reader held while the log was trimmed past its last id: its
// subscribers lose nothing silently. Every id they miss is announced by
// state_resync_required (ring_evicted) from the last id they got to the
// next one they get, and they go on to the end (a reader that had
// fetched some events before the trim may deliver those).
func checkReaderGap(t testing.TB, h *harness) {
	rs, _ := h.cluster(2, Options{RingSize: 10}, "gates")
	a, b := rs[0], rs[1]
	sa := a.Open(t, "s", nil, "")
	for range 3 {
		b.Publish(t, "s", "e", nil)
	}
	WantIDs(t, sa.Events(3, wait), 1, 3)
	a.Gate.Hold(t, "s")
	defer a.Gate.Release()
	for range 30 {
		b.Publish(t, "s", "e", nil)
	}
	a.Gate.Release()
	last, gaps := uint64(3), 0
	for last < 33 {
		f := sa.Next(wait)
		switch {
		case f.Event == eventbus.TypeStateResyncRequired:
			if f.Str(t, "data", "reason") != "ring_evicted" || f.Num(t, "data", "lastDeliveredId") != int64(last) {
				t.Fatalf("after id %d: %+v, want ring_evicted from %d", last, f, last)
			}
			next := sa.Next(wait)
			if next.ID == 0 || int64(next.ID) != f.Num(t, "data", "earliestAvailableId") || next.ID <= last+1 {
				t.Fatalf("ring_evicted %+v, then %+v: the next id must be the earliestAvailableId, past the gap", f, next)
			}
			last, gaps = next.ID, gaps+1
		case f.ID == last+1:
			last = f.ID
		default:
			t.Fatalf("got %s id %d after id %d, without ring_evicted", f.Event, f.ID, last)
		}
	}
	sa.Quiet(50 * time.Millisecond)
	t.Logf("the held reader went on with %d announced gaps", gaps)
}
