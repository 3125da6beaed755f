package pgbus

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
)

// Within the window, a key already used in the session answers the first
// publish's id with duplicate=true and appends nothing, on any replica;
// another event under the same key is refused; other sessions and other
// keys are independent.
func TestPublishIdempotent(t *testing.T) {
	url, schema := testSchema(t)
	a, b, _ := threeReplicas(t, url, testOptions(schema))
	ctx := context.Background()
	ev := eventbus.Event{Type: "e", Data: map[string]int{"n": 1}}
	id, epoch, dup, err := a.bp.PublishIdempotent(ctx, "s", "k1", ev)
	if err != nil || id != 1 || dup {
		t.Fatalf("first publish: %d %v %v", id, dup, err)
	}
	// The same event, stamped at another time (as a retry is), with its
	// data spelled otherwise, on another replica.
	retry := eventbus.Event{Type: "e", Data: json.RawMessage(`{ "n": 1 }`), Meta: map[string]any{"serverTimestamp": 5}}
	id2, epoch2, dup, err := b.bp.PublishIdempotent(ctx, "s", "k1", retry)
	if err != nil || id2 != 1 || !dup || epoch2 != epoch {
		t.Fatalf("retry: %d %q %v %v, want 1 %q duplicate", id2, epoch2, dup, err, epoch)
	}
	for _, other := range []eventbus.Event{
		{Type: "e", Data: map[string]int{"n": 2}},
		{Type: "f", Data: map[string]int{"n": 1}},
		{Type: "e"},
		{Type: "e", Data: json.RawMessage(`{"n":1,"m":0}`)},
		{Type: "e", Data: map[string]int{"n": 1}, OriginatorClientID: "c"},
		{Type: "e", Data: map[string]int{"n": 1}, Meta: map[string]any{"attempt": 2}},
	} {
		if _, _, _, err := b.bp.PublishIdempotent(ctx, "s", "k1", other); !errors.Is(err, eventbus.ErrIdempotencyKeyReused) {
			t.Fatalf("key reused for %+v: %v", other, err)
		}
	}
	if id, _, dup, err := a.bp.PublishIdempotent(ctx, "s", "k2", ev); err != nil || id != 2 || dup {
		t.Fatalf("another key: %d %v %v", id, dup, err)
	}
	if id, _, dup, err := a.bp.PublishIdempotent(ctx, "other", "k1", ev); err != nil || id != 1 || dup {
		t.Fatalf("another session: %d %v %v", id, dup, err)
	}
	if id := a.publish(t, "s", "e", nil); id != 3 {
		t.Fatalf("plain publish after: id %d", id)
	}
	// null data and absent data are different events.
	if _, _, _, err := a.bp.PublishIdempotent(ctx, "s", "k3", eventbus.Event{Type: "e"}); err != nil {
		t.Fatal(err)
	}
	null := eventbus.Event{Type: "e", Data: json.RawMessage("null")}
	if _, _, _, err := a.bp.PublishIdempotent(ctx, "s", "k3", null); !errors.Is(err, eventbus.ErrIdempotencyKeyReused) {
		t.Fatalf("null data under the key of absent data: %v", err)
	}
	// Delete forgets the keys with the session.
	if err := a.bp.Delete(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if id, _, dup, err := a.bp.PublishIdempotent(ctx, "s", "k1", ev); err != nil || id != 1 || dup {
		t.Fatalf("after delete: %d %v %v", id, dup, err)
	}
}

// The same key published at once on three replicas: one append, and
// every caller gets its id.
func TestPublishIdempotentConcurrent(t *testing.T) {
	url, schema := testSchema(t)
	a, b, c := threeReplicas(t, url, testOptions(schema))
	ev := eventbus.Event{Type: "e", Data: "once"}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ids []uint64
	dups := 0
	for range 4 {
		for _, rp := range []*replica{a, b, c} {
			wg.Go(func() {
				id, _, dup, err := rp.bp.PublishIdempotent(context.Background(), "s", "same", ev)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				ids = append(ids, id)
				if dup {
					dups++
				}
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	for _, id := range ids {
		if id != 1 {
			t.Fatalf("ids %v, want all 1", ids)
		}
	}
	if dups != len(ids)-1 {
		t.Fatalf("%d duplicates of %d publishes", dups, len(ids))
	}
	if n := queryInt(t, url, "SELECT count(*) FROM "+schema+".events"); n != 1 {
		t.Fatalf("table holds %d events", n)
	}
}

// Keys are 1 to 255 bytes of printable ASCII; anything else is refused
// before PostgreSQL is asked.
func TestIdempotencyKeyValidation(t *testing.T) {
	url, schema := testSchema(t)
	a := newReplica(t, url, "A", testOptions(schema))
	for _, k := range []string{"", strings.Repeat("k", 256), "tab\tkey", "é", "nul\x00", "del\x7f"} {
		if _, _, _, err := a.bp.PublishIdempotent(context.Background(), "s", k, eventbus.Event{Type: "e"}); !errors.Is(err, eventbus.ErrInvalidIdempotencyKey) {
			t.Fatalf("key %q: %v", k, err)
		}
	}
	for _, k := range []string{" ", "~", strings.Repeat("k", 255), "a b:c/d"} {
		if _, _, _, err := a.bp.PublishIdempotent(context.Background(), "s", k, eventbus.Event{Type: "e"}); err != nil {
			t.Fatalf("key %q: %v", k, err)
		}
	}
	if n := queryInt(t, url, "SELECT count(*) FROM "+schema+".events"); n != 4 {
		t.Fatalf("table holds %d events, want 4", n)
	}
}

// Past the window a key is forgotten: the same publish appends again, and
// the janitor deletes the expired rows.
func TestIdempotencyWindow(t *testing.T) {
	url, schema := testSchema(t)
	opts := testOptions(schema)
	opts.IdempotencyWindow = 200 * time.Millisecond
	a := newReplica(t, url, "A", opts)
	ctx := context.Background()
	ev := eventbus.Event{Type: "e", Data: 1}
	if id, _, _, err := a.bp.PublishIdempotent(ctx, "s", "k", ev); err != nil || id != 1 {
		t.Fatalf("first: %d %v", id, err)
	}
	if id, _, dup, err := a.bp.PublishIdempotent(ctx, "s", "k", ev); err != nil || id != 1 || !dup {
		t.Fatalf("within the window: %d %v %v", id, dup, err)
	}
	time.Sleep(300 * time.Millisecond)
	if id, _, dup, err := a.bp.PublishIdempotent(ctx, "s", "k", eventbus.Event{Type: "other"}); err != nil || id != 2 || dup {
		t.Fatalf("past the window: %d %v %v", id, dup, err)
	}
	waitFor(t, 5*time.Second, "the janitor", func() bool {
		return queryInt(t, url, "SELECT count(*) FROM "+schema+".idempotency") == 0
	})
}
