package natsbus

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
// on replica 0 (one JetStream publish with the expected last subject
// sequence), then every replica's ordered consumer, mirror bus and one
// in-process subscriber per replica. One iteration is one event; the
// metrics are backplanetest.Delivery's. The server is embedded in the
// test binary (it shares the processors with the benchmark) and has one
// node: a replicated stream adds a raft round trip per publish.
//
// publishers=1 publishes one event at a time (latency); publishers=16
// keeps 16 publishes in flight (throughput: on one session they queue on
// the replica's publish lock, since JetStream takes one expected-sequence
// publish per subject at a time).
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
	srv := startServer(b)
	opts := benchOptions()
	opts.Bus.MaxQueuedBytes = 1 << 30
	var bps []*Backplane
	var subs []*eventbus.Subscription
	for range replicas {
		bp := benchBackplane(b, srv, opts)
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
// publisher): plain, with a new idempotency key each time (Nats-Msg-Id and
// the fingerprint's second encoding), and a retry of one key (a duplicate:
// nothing appended, the first publish read back).
func BenchmarkPublish(b *testing.B) {
	bp := benchBackplane(b, startServer(b), benchOptions())
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
	runs := 0
	b.Run("key=new", func(b *testing.B) {
		b.ReportAllocs()
		runs++
		session := "keyed" + strconv.Itoa(runs) // -count runs this again on the same server
		i := 0
		for b.Loop() {
			if _, _, dup, err := bp.PublishIdempotent(ctx, session, "550e8400-e29b-41d4-a716-"+strconv.Itoa(100000000000+i), ev); err != nil || dup {
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
// checks the epoch with the stream's leader first (one round trip), and on
// the mirror bus directly, without the check.
func BenchmarkStreamOpen(b *testing.B) {
	bp := benchBackplane(b, startServer(b), benchOptions())
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

func benchOptions() Options {
	return Options{Stream: "BENCH", Subject: "bench", Logger: discardLogger, IdleTimeout: time.Hour}
}

// benchBackplane is one backplane with a connection of its own to srv,
// closed when b ends.
func benchBackplane(b *testing.B, srv *natsServer, opts Options) *Backplane {
	bp, err := New(context.Background(), connect(b, srv.URL()), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bp.Close() })
	return bp
}
