package natsbus

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
)

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
