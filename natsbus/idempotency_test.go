package natsbus

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

// The same key and event is a duplicate on any replica (the first id,
// nothing appended); the same key with another event is refused; what
// counts as the same event; keys are per session.
func TestIdempotencyKeyReused(t *testing.T) {
	srv := startServer(t)
	a, b := newReplica(t, srv.URL(), "A", testOptions()), newReplica(t, srv.URL(), "B", testOptions())
	ctx := context.Background()
	ev := eventbus.Event{Type: "e", Data: map[string]int{"n": 1}, OriginatorClientID: "c1", Meta: map[string]any{"trace": "t1"}}
	id, epoch, dup, err := a.bp.PublishIdempotent(ctx, "s", "k", ev)
	if err != nil || id != 1 || dup {
		t.Fatalf("first publish: id %d dup %v err %v", id, dup, err)
	}
	for name, other := range map[string]eventbus.Event{
		"type":       {Type: "f", Data: ev.Data, OriginatorClientID: "c1", Meta: ev.Meta},
		"data":       {Type: "e", Data: map[string]int{"n": 2}, OriginatorClientID: "c1", Meta: ev.Meta},
		"no data":    {Type: "e", OriginatorClientID: "c1", Meta: ev.Meta},
		"originator": {Type: "e", Data: ev.Data, OriginatorClientID: "c2", Meta: ev.Meta},
		"meta":       {Type: "e", Data: ev.Data, OriginatorClientID: "c1", Meta: map[string]any{"trace": "t2"}},
	} {
		_, _, _, err := b.bp.PublishIdempotent(ctx, "s", "k", other)
		if !errors.Is(err, eventbus.ErrIdempotencyKeyReused) {
			t.Fatalf("same key, other %s: %v, want ErrIdempotencyKeyReused", name, err)
		}
	}
	// The stamp is not the event's identity, whoever sets it; spacing of
	// the data is not either.
	stamped := ev
	stamped.Meta = map[string]any{"trace": "t1", "serverTimestamp": 12345}
	stamped.Data = json.RawMessage(`{ "n" : 1 }`)
	for _, rp := range []*replica{a, b} {
		if id, e, dup, err := rp.bp.PublishIdempotent(ctx, "s", "k", stamped); err != nil || id != 1 || !dup || e != epoch {
			t.Fatalf("%s: the same event again: id %d dup %v epoch %s err %v", rp.name, id, dup, e, err)
		}
	}
	if n := subjectCount(t, a.bp, "s"); n != 1 {
		t.Fatalf("the subject holds %d messages, want 1", n)
	}
	// Keys are per session, and a plain Publish does not see them.
	if id, _, dup, err := a.bp.PublishIdempotent(ctx, "s2", "k", eventbus.Event{Type: "x"}); err != nil || id != 1 || dup {
		t.Fatalf("the key in another session: id %d dup %v err %v", id, dup, err)
	}
	if id := a.publish(t, "s", "e", nil); id != 2 {
		t.Fatalf("plain publish: id %d, want 2", id)
	}
}

func TestInvalidIdempotencyKey(t *testing.T) {
	srv := startServer(t)
	a := newReplica(t, srv.URL(), "A", testOptions())
	ctx := context.Background()
	for _, k := range []string{"", strings.Repeat("k", 256), "a\nb", "tab\t", "caf\u00e9", "\x7f"} {
		if _, _, _, err := a.bp.PublishIdempotent(ctx, "s", k, eventbus.Event{Type: "e"}); !errors.Is(err, eventbus.ErrInvalidIdempotencyKey) {
			t.Fatalf("key %q: %v, want ErrInvalidIdempotencyKey", k, err)
		}
	}
	// Keys that differ only in trailing spaces or case are different keys.
	for i, k := range []string{strings.Repeat("k", 255), " spaced key ~!", " spaced key ~! ", "K", "k"} {
		if id, _, dup, err := a.bp.PublishIdempotent(ctx, "s", k, eventbus.Event{Type: "e"}); err != nil || id != uint64(i+1) || dup {
			t.Fatalf("key %q: id %d dup %v err %v", k, id, dup, err)
		}
	}
}

// Concurrent publishes of one key on three replicas append once; every
// one answers the same id.
func TestIdempotentConcurrent(t *testing.T) {
	srv := startServer(t)
	a, b, c := threeReplicas(t, srv.URL(), testOptions())
	ctx := context.Background()
	for round := range 5 {
		key := fmt.Sprint("k", round)
		var wg sync.WaitGroup
		var mu sync.Mutex
		ids := map[uint64]int{}
		firsts := 0
		for i := range 9 {
			rp := []*replica{a, b, c}[i%3]
			wg.Go(func() {
				id, _, dup, err := rp.bp.PublishIdempotent(ctx, "s", key, eventbus.Event{Type: "e", Data: round})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("%s: %v", rp.name, err)
					return
				}
				ids[id]++
				if !dup {
					firsts++
				}
			})
		}
		wg.Wait()
		if len(ids) != 1 || ids[uint64(round+1)] != 9 || firsts != 1 {
			t.Fatalf("round %d: ids %v, %d not duplicates", round, ids, firsts)
		}
	}
	if n := subjectCount(t, a.bp, "s"); n != 5 {
		t.Fatalf("the subject holds %d messages, want 5", n)
	}
}

// After the window a key is forgotten: the same publish appends again.
func TestIdempotencyWindowExpires(t *testing.T) {
	srv := startServer(t)
	opts := testOptions()
	opts.IdempotencyWindow = 500 * time.Millisecond
	a := newReplica(t, srv.URL(), "A", opts)
	ctx := context.Background()
	publish := func(key string) (uint64, bool) {
		t.Helper()
		id, _, dup, err := a.bp.PublishIdempotent(ctx, "s", key, eventbus.Event{Type: "e", Data: 1})
		if err != nil {
			t.Fatal(err)
		}
		return id, dup
	}
	if id, dup := publish("k"); id != 1 || dup {
		t.Fatalf("first: %d %v", id, dup)
	}
	if id, dup := publish("k"); id != 1 || !dup {
		t.Fatalf("within the window: %d %v", id, dup)
	}
	time.Sleep(opts.IdempotencyWindow + 100*time.Millisecond)
	waitFor(t, wait, "the key to be forgotten", func() bool {
		_, dup := publish("k")
		return !dup
	})
	if in, _ := a.bp.Info(ctx, "s"); in.LastEventID != 2 {
		t.Fatalf("after the window: last id %d, want 2", in.LastEventID)
	}
}

// Delete forgets the keys: the next publish with a key is new, in a new
// epoch.
func TestDeleteForgetsIdempotencyKeys(t *testing.T) {
	srv := startServer(t)
	a := newReplica(t, srv.URL(), "A", testOptions())
	ctx := context.Background()
	_, epoch, _, err := a.bp.PublishIdempotent(ctx, "s", "k", eventbus.Event{Type: "e"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.bp.Delete(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	id, epoch2, dup, err := a.bp.PublishIdempotent(ctx, "s", "k", eventbus.Event{Type: "e"})
	if err != nil || id != 1 || dup || epoch2 == epoch {
		t.Fatalf("after Delete: id %d dup %v epoch %s (old %s) err %v", id, dup, epoch2, epoch, err)
	}
}

// A publish that times out on a hung server (a proxy that holds every
// byte) is applied when the server answers again; the retry with the same
// key returns its id as a duplicate, on any replica, and the subject holds
// the event once.
func TestIdempotentRetryAfterTimeout(t *testing.T) {
	srv := startServer(t)
	p := startStall(t, srv.URL()[len("nats://"):])
	opts := testOptions()
	opts.PublishTimeout = 300 * time.Millisecond
	a, b := newReplica(t, p.Addr, "A", opts), newReplica(t, srv.URL(), "B", opts)
	sb := b.open(t, "s", nil, "")
	for range 3 {
		a.publish(t, "s", "e", nil)
	}
	wantIDs(t, sb.Events(3, wait), 1, 3)
	ctx := context.Background()
	ev := eventbus.Event{Type: "order.placed", Data: map[string]any{"n": 1, "sku": "x"}, OriginatorClientID: "c1"}

	p.Hold()
	start := time.Now()
	_, _, dup, err := a.bp.PublishIdempotent(ctx, "s", "order-42", ev)
	took := time.Since(start)
	p.Release()
	if !errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, ErrUnavailable) || dup {
		t.Fatalf("publish to a hung server: dup %v, err %v; want ErrOutcomeUnknown (and ErrUnavailable)", dup, err)
	}
	if took > opts.PublishTimeout+200*time.Millisecond {
		t.Fatalf("publish took %v, timeout %v", took, opts.PublishTimeout)
	}
	// The server gets the held publish once the proxy forwards it.
	waitFor(t, wait, "the timed-out publish to be applied", func() bool {
		in, err := b.bp.Info(ctx, "s")
		return err == nil && in.LastEventID == 4
	})
	var id uint64
	var epoch string
	waitFor(t, wait, "the retry", func() bool {
		id, epoch, dup, err = a.bp.PublishIdempotent(ctx, "s", "order-42", ev)
		return err == nil
	})
	if id != 4 || !dup || epoch != sb.Epoch {
		t.Fatalf("retry: id %d dup %v epoch %s; want id 4, a duplicate of epoch %s", id, dup, epoch, sb.Epoch)
	}
	if id, _, dup, err = b.bp.PublishIdempotent(ctx, "s", "order-42", ev); err != nil || id != 4 || !dup {
		t.Fatalf("retry on B: id %d dup %v err %v", id, dup, err)
	}
	if next := a.publish(t, "s", "e", nil); next != 5 {
		t.Fatalf("next publish has id %d, want 5", next)
	}
	got := sb.Events(2, wait)
	wantIDs(t, got, 4, 5)
	if got[0].Event != "order.placed" {
		t.Fatalf("id 4 is %+v", got[0])
	}
	sb.Quiet(50 * time.Millisecond)
}

// A retry whose first publish has been trimmed from the stream since
// cannot be told its id: it is refused (ErrIdempotencyKeyReused, saying
// so) and appends nothing.
func TestDuplicateOfTrimmedEvent(t *testing.T) {
	srv := startServer(t)
	opts := testOptions()
	opts.RingSize = 5
	a := newReplica(t, srv.URL(), "A", opts)
	ctx := context.Background()
	if _, _, _, err := a.bp.PublishIdempotent(ctx, "s", "k", eventbus.Event{Type: "e"}); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		a.publish(t, "s", "e", nil)
	}
	_, _, _, err := a.bp.PublishIdempotent(ctx, "s", "k", eventbus.Event{Type: "e"})
	if !errors.Is(err, eventbus.ErrIdempotencyKeyReused) || !strings.Contains(err.Error(), "trimmed") {
		t.Fatalf("retry of a trimmed event: %v", err)
	}
	if in, _ := a.bp.Info(ctx, "s"); in.LastEventID != 11 {
		t.Fatalf("last id %d, want 11", in.LastEventID)
	}
}
