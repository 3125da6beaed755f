package pgbus

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane/backplanetest"
)

// BenchmarkPublishToDelivery measures the backplane end to end, as
// redisbus's benchmark of the same name does: Publish on replica 0 (one
// call of the publish function: advisory lock, insert, trim, NOTIFY,
// commit), then every replica's listener and reader (a query of the new
// rows), mirror bus and one in-process subscriber per replica. One
// iteration is one event; the metrics are backplanetest.Delivery's.
//
// sessions=1 publishes to one session (whose publishes the advisory lock
// serialises); sessions=16 spreads the publishes over 16 sessions, one
// subscriber on each per replica.
func BenchmarkPublishToDelivery(b *testing.B) {
	for _, replicas := range []int{1, 3} {
		for _, publishers := range []int{1, 16} {
			b.Run(fmt.Sprintf("replicas=%d/publishers=%d", replicas, publishers), func(b *testing.B) {
				benchDelivery(b, replicas, publishers, 1)
			})
		}
	}
	b.Run("replicas=3/publishers=16/sessions=16", func(b *testing.B) {
		benchDelivery(b, 3, 16, 16)
	})
}

func benchDelivery(b *testing.B, replicas, publishers, sessions int) {
	url, schema := testSchema(b)
	opts := Options{Schema: schema}
	opts.Bus.MaxQueuedBytes = 1 << 30
	var bps []*Backplane
	for range replicas {
		pool := newPool(b, url)
		bp, err := New(context.Background(), pool, opts)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { bp.Close() })
		bps = append(bps, bp)
	}
	names := make([]string, sessions)
	for i := range names {
		names[i] = fmt.Sprintf("s%d", i)
	}
	var subs []*eventbus.Subscription
	for _, bp := range bps {
		for _, s := range names {
			sub, err := bp.Subscribe(context.Background(), s, eventbus.SubscribeOptions{MaxQueued: 1 << 24})
			if err != nil {
				b.Fatal(err)
			}
			subs = append(subs, sub)
		}
	}
	backplanetest.Delivery(b, publishers, sessions, subs, func(ctx context.Context, session int, data json.RawMessage) error {
		_, _, err := bps[0].Publish(ctx, names[session], eventbus.Event{Type: "bench", Data: data})
		return err
	})
}
