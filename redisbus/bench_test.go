package redisbus

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane/backplanetest"
)

// BenchmarkPublishToDelivery measures the backplane end to end: Publish
// on replica 0 (the Lua script in Redis), then every replica's reader
// (XREAD BLOCK), mirror bus and one in-process subscriber per replica.
// One iteration is one event; the metrics are backplanetest.Delivery's.
//
// publishers=1 publishes one event at a time (latency); publishers=16
// keeps 16 publishes in flight (throughput).
func BenchmarkPublishToDelivery(b *testing.B) {
	for _, replicas := range []int{1, 3} {
		for _, publishers := range []int{1, 16} {
			b.Run(fmt.Sprintf("replicas=%d/publishers=%d", replicas, publishers), func(b *testing.B) {
				benchDelivery(b, replicas, publishers)
			})
		}
	}
}

func benchDelivery(b *testing.B, replicas, publishers int) {
	r := startRedis(b)
	opts := Options{KeyPrefix: "bench:", ReadBlock: 100 * time.Millisecond}
	opts.Bus.MaxQueuedBytes = 1 << 30
	var bps []*Backplane
	var subs []*eventbus.Subscription
	for range replicas {
		bp, err := New(r.client(b), opts)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { bp.Close() })
		bps = append(bps, bp)
		sub, err := bp.Subscribe(context.Background(), "s", eventbus.SubscribeOptions{MaxQueued: 1 << 24})
		if err != nil {
			b.Fatal(err)
		}
		subs = append(subs, sub)
	}
	backplanetest.Delivery(b, publishers, 1, subs, func(ctx context.Context, _ int, data json.RawMessage) error {
		_, _, err := bps[0].Publish(ctx, "s", eventbus.Event{Type: "bench", Data: data})
		return err
	})
}

// BenchmarkPublish measures one Publish round trip (no subscribers, one
// publisher): plain, with a new idempotency key each time (the lookup, the
// record and the pruning in the script, and the fingerprint's second
// encoding on the replica), and a retry of one key (a duplicate: nothing
// appended).
func BenchmarkPublish(b *testing.B) {
	bp := benchBackplane(b)
	ctx := context.Background()
	ev := eventbus.Event{Type: "bench", Data: json.RawMessage(`{"order":42,"sku":"ab-123","qty":1}`), OriginatorClientID: "c1"}
	b.Run("key=none", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := bp.Publish(ctx, "plain", ev); err != nil {
				b.Fatal(err)
			}
		}
	})
	keys := make([]string, 0, 1<<16)
	for i := range cap(keys) {
		keys = append(keys, "550e8400-e29b-41d4-a716-"+strconv.Itoa(100000000000+i))
	}
	runs := 0
	b.Run("key=new", func(b *testing.B) {
		b.ReportAllocs()
		runs++
		session := "keyed" + strconv.Itoa(runs) // -count runs this again on the same Redis
		i := 0
		for b.Loop() {
			if _, _, dup, err := bp.PublishIdempotent(ctx, session, keys[i%len(keys)], ev); err != nil || dup && i < len(keys) {
				b.Fatal(dup, err)
			}
			i++
		}
	})
	b.Run("key=duplicate", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, _, err := bp.PublishIdempotent(ctx, "dup", "550e8400-e29b-41d4-a716-446655440000", ev); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkStreamOpen measures opening (and closing) a live subscription to
// a session this replica already mirrors: through the backplane, which
// checks the epoch with Redis first (one round trip), and on the mirror bus
// directly, without the check.
func BenchmarkStreamOpen(b *testing.B) {
	bp := benchBackplane(b)
	ctx := context.Background()
	bus, err := bp.Bus(ctx, "s")
	if err != nil {
		b.Fatal(err)
	}
	b.Run("check=epoch", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sub, err := bp.Subscribe(ctx, "s", eventbus.SubscribeOptions{})
			if err != nil {
				b.Fatal(err)
			}
			sub.Close()
		}
	})
	b.Run("check=none", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sub, err := bus.Subscribe(ctx, eventbus.SubscribeOptions{})
			if err != nil {
				b.Fatal(err)
			}
			sub.Close()
		}
	})
}

// benchBackplane is one backplane on a Redis of its own, closed when b
// ends.
func benchBackplane(b *testing.B) *Backplane {
	r := startRedis(b)
	bp, err := New(r.client(b), Options{KeyPrefix: "bench:", ReadBlock: 100 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bp.Close() })
	return bp
}
