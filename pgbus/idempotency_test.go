package pgbus

import (
	"context"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
)

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
