package backplanetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
)

// Within the window, the same key and event is a duplicate on any
// replica (the first id, nothing appended) however its data is spaced and
// whenever it is stamped; the same key with another event is refused;
// keys are per session and per epoch (Delete forgets them); a plain
// Publish does not see them.
func checkIdempotentPublish(t testing.TB, h *harness) {
	rs, _ := h.cluster(2, Options{})
	a, b := rs[0], rs[1]
	sb := b.Open(t, "s", nil, "")
	ctx := context.Background()
	ev := eventbus.Event{Type: "e", Data: map[string]int{"n": 1}, OriginatorClientID: "c1", Meta: map[string]any{"trace": "t1"}}
	id, epoch, dup, err := a.BP.PublishIdempotent(ctx, "s", "k", ev)
	if err != nil || id != 1 || dup {
		t.Fatalf("the first publish: id %d dup %v err %v, want id 1, no duplicate", id, dup, err)
	}
	for name, other := range map[string]eventbus.Event{
		"type":       {Type: "f", Data: ev.Data, OriginatorClientID: "c1", Meta: ev.Meta},
		"data":       {Type: "e", Data: map[string]int{"n": 2}, OriginatorClientID: "c1", Meta: ev.Meta},
		"no data":    {Type: "e", OriginatorClientID: "c1", Meta: ev.Meta},
		"null data":  {Type: "e", Data: json.RawMessage("null"), OriginatorClientID: "c1", Meta: ev.Meta},
		"more data":  {Type: "e", Data: json.RawMessage(`{"n":1,"m":0}`), OriginatorClientID: "c1", Meta: ev.Meta},
		"originator": {Type: "e", Data: ev.Data, OriginatorClientID: "c2", Meta: ev.Meta},
		"meta":       {Type: "e", Data: ev.Data, OriginatorClientID: "c1", Meta: map[string]any{"trace": "t2"}},
	} {
		if _, _, _, err := b.BP.PublishIdempotent(ctx, "s", "k", other); !errors.Is(err, eventbus.ErrIdempotencyKeyReused) {
			t.Fatalf("the same key with another %s: %v, want eventbus.ErrIdempotencyKeyReused", name, err)
		}
	}
	// The stamp is not the event's identity, whoever sets it; the data's
	// spacing is not either.
	again := ev
	again.Meta = map[string]any{"trace": "t1", "serverTimestamp": 12345}
	again.Data = json.RawMessage(`{ "n" : 1 }`)
	for _, rp := range rs {
		if id, e, dup, err := rp.BP.PublishIdempotent(ctx, "s", "k", again); err != nil || id != 1 || !dup || e != epoch {
			t.Fatalf("the same event again on %s: id %d dup %v epoch %s err %v, want a duplicate of id 1", rp.Name, id, dup, e, err)
		}
	}
	if id, _, dup, err := a.BP.PublishIdempotent(ctx, "s2", "k", eventbus.Event{Type: "x"}); err != nil || id != 1 || dup {
		t.Fatalf("the key in another session: id %d dup %v err %v, want a new event", id, dup, err)
	}
	if id, _, dup, err := a.BP.PublishIdempotent(ctx, "s", "k2", ev); err != nil || id != 2 || dup {
		t.Fatalf("another key: id %d dup %v err %v, want id 2", id, dup, err)
	}
	if id := a.Publish(t, "s", "e", nil); id != 3 {
		t.Fatalf("a plain publish after the keyed ones: id %d, want 3", id)
	}
	WantIDs(t, sb.Events(3, wait), 1, 3)
	sb.Quiet(50 * time.Millisecond)
	if err := a.BP.Delete(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	id, epoch2, dup, err := b.BP.PublishIdempotent(ctx, "s", "k", ev)
	if err != nil || id != 1 || dup || epoch2 == epoch {
		t.Fatalf("the key after Delete: id %d dup %v epoch %s (old %s) err %v, want id 1 of a new epoch", id, dup, epoch2, epoch, err)
	}
}

// Keys are 1 to eventbus.MaxIdempotencyKeyBytes bytes of printable
// ASCII: anything else is refused before the engine is asked, and keys
// that differ in case or trailing spaces are different keys.
func checkIdempotencyKeys(t testing.TB, h *harness) {
	rs, _ := h.cluster(1, Options{})
	a := rs[0]
	ctx := context.Background()
	for _, k := range []string{"", strings.Repeat("k", eventbus.MaxIdempotencyKeyBytes+1), "a\nb", "tab\t", "caf\u00e9", "nul\x00", "\x7f"} {
		if _, _, _, err := a.BP.PublishIdempotent(ctx, "s", k, eventbus.Event{Type: "e"}); !errors.Is(err, eventbus.ErrInvalidIdempotencyKey) {
			t.Fatalf("key %q: %v, want eventbus.ErrInvalidIdempotencyKey", k, err)
		}
	}
	for i, k := range []string{strings.Repeat("k", eventbus.MaxIdempotencyKeyBytes), " spaced key ~!", " spaced key ~! ", "K", "k", "a b:c/d"} {
		if id, _, dup, err := a.BP.PublishIdempotent(ctx, "s", k, eventbus.Event{Type: "e"}); err != nil || id != uint64(i+1) || dup {
			t.Fatalf("key %q: id %d dup %v err %v, want id %d", k, id, dup, err, i+1)
		}
	}
	if in, err := a.BP.Info(ctx, "s"); err != nil || in.LastEventID != 6 {
		t.Fatalf("Info %+v %v: invalid keys appended", in, err)
	}
}

// Publishes of one key at once on three replicas: one append, and every
// caller gets its id.
func checkIdempotentConcurrent(t testing.TB, h *harness) {
	rs, _ := h.cluster(3, Options{})
	ctx := context.Background()
	for round := range 3 {
		key := fmt.Sprint("k", round)
		var wg sync.WaitGroup
		var mu sync.Mutex
		ids := map[uint64]int{}
		firsts := 0
		for i := range 9 {
			rp := rs[i%3]
			wg.Go(func() {
				id, _, dup, err := rp.BP.PublishIdempotent(ctx, "s", key, eventbus.Event{Type: "e", Data: round})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("%s: %v", rp.Name, err)
					return
				}
				ids[id]++
				if !dup {
					firsts++
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		if len(ids) != 1 || ids[uint64(round+1)] != 9 || firsts != 1 {
			t.Fatalf("round %d: ids %v, %d not duplicates; want id %d for all 9, one first", round, ids, firsts, round+1)
		}
	}
	if in, err := rs[0].BP.Info(ctx, "s"); err != nil || in.LastEventID != 3 {
		t.Fatalf("Info %+v %v, want the last id 3", in, err)
	}
}

// After the window a key is forgotten: the same publish appends again.
func checkIdempotencyWindow(t testing.TB, h *harness) {
	const window = 500 * time.Millisecond
	rs, _ := h.cluster(1, Options{IdempotencyWindow: window})
	a := rs[0]
	ctx := context.Background()
	publish := func(key string) (uint64, bool) {
		t.Helper()
		id, _, dup, err := a.BP.PublishIdempotent(ctx, "s", key, eventbus.Event{Type: "e", Data: 1})
		if err != nil {
			t.Fatal(err)
		}
		return id, dup
	}
	if id, dup := publish("k"); id != 1 || dup {
		t.Fatalf("the first publish: id %d dup %v", id, dup)
	}
	if id, dup := publish("k"); id != 1 || !dup {
		t.Fatalf("within the window: id %d dup %v, want a duplicate of id 1", id, dup)
	}
	time.Sleep(window + 100*time.Millisecond)
	var id uint64
	WaitFor(t, wait, "the key to be forgotten after its window", func() bool {
		var dup bool
		id, dup = publish("k")
		return !dup
	})
	if id != 2 {
		t.Fatalf("the publish after the window got id %d, want 2", id)
	}
}

// A keyed publish that fails while the engine is down (whatever its
// outcome) and is retried with the same key, on another replica, once it
// is back: the event is in the log exactly once.
func checkIdempotentRetryAfterOutage(t testing.TB, h *harness) {
	rs, c := h.cluster(2, Options{PublishTimeout: 500 * time.Millisecond, OutageTimeout: time.Minute}, "outage")
	a, b := rs[0], rs[1]
	sb := b.Open(t, "s", nil, "")
	a.Publish(t, "s", "e", nil)
	WantIDs(t, sb.Events(1, wait), 1, 1)
	ev := eventbus.Event{Type: "order.placed", Data: map[string]string{"order": "o-1"}}
	c.Down()
	start := time.Now()
	_, _, _, failed := a.BP.PublishIdempotent(context.Background(), "s", "order-o-1", ev)
	took := time.Since(start)
	c.Up()
	if failed == nil || h.ErrUnavailable != nil && !errors.Is(failed, h.ErrUnavailable) {
		t.Fatalf("a publish while the engine is down: %v, want the module's ErrUnavailable", failed)
	}
	if took > 500*time.Millisecond+time.Second {
		t.Fatalf("a publish while the engine is down took %v, PublishTimeout 500ms", took)
	}
	var id uint64
	var dup bool
	var err error
	WaitFor(t, wait, "the retry once the engine is back", func() bool {
		id, _, dup, err = b.BP.PublishIdempotent(context.Background(), "s", "order-o-1", ev)
		return err == nil
	})
	if id != 2 {
		t.Fatalf("the retry: id %d (duplicate %v), want 2", id, dup)
	}
	got := sb.Events(1, wait)
	if got[0].ID != 2 || got[0].Str(t, "data", "order") != "o-1" {
		t.Fatalf("the stream got %+v, want the order as id 2", got[0])
	}
	// Each replica comes back on its own schedule: B's retry went
	// through, A may still be reconnecting. A publishes with a key of its
	// own until it is accepted, so an attempt of unknown outcome is not
	// appended twice.
	WaitFor(t, wait, "a publish on A once the engine is back", func() bool {
		id, _, _, err = a.BP.PublishIdempotent(context.Background(), "s", "after-the-outage", eventbus.Event{Type: "e"})
		return err == nil
	})
	if id != 3 {
		t.Fatalf("the publish on A after the outage: id %d, want 3", id)
	}
	WantIDs(t, sb.Events(1, wait), 3, 3)
	t.Logf("the failed attempt (%v) was applied: %v", failed, dup)
}
