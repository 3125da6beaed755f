package redisbus

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
)

// BenchmarkPublishToDelivery measures the backplane end to end: Publish
// on replica 0 (the Lua script in Redis), then every replica's reader
// (XREAD BLOCK), mirror bus and one in-process subscriber per replica.
// One iteration is one event. Metrics:
//
//	events/s      events delivered to every replica, per second of the run
//	deliveries/s  events/s times the replicas
//	p50-µs p99-µs publish start to delivery, over every (event, replica)
//	publish-µs    mean time Publish took
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
	for range replicas {
		bp, err := New(r.client(b), opts)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { bp.Close() })
		bps = append(bps, bp)
	}
	ctx := context.Background()
	type result struct {
		lat  []time.Duration
		last time.Time
		n    int
	}
	results := make([]result, replicas)
	var wg sync.WaitGroup
	var subs []*eventbus.Subscription
	wants := make([]chan int, replicas) // how many events each subscriber waits for
	for i, bp := range bps {
		sub, err := bp.Subscribe(ctx, "s", eventbus.SubscribeOptions{MaxQueued: 1 << 24})
		if err != nil {
			b.Fatal(err)
		}
		subs = append(subs, sub)
		wants[i] = make(chan int, 1)
		wg.Go(func() {
			res := &results[i]
			target := -1
			var frames []eventbus.Frame
			for {
				var open bool
				frames, open = sub.AppendReady(frames[:0])
				now := time.Now()
				for _, f := range frames {
					if f.ID() == 0 {
						continue
					}
					if t, ok := sentAt(f.JSON()); ok {
						res.lat = append(res.lat, now.Sub(t))
					}
					res.n++
					res.last = now
				}
				if !open || (target >= 0 && res.n >= target) {
					return
				}
				if len(frames) > 0 {
					continue
				}
				select {
				case <-sub.Ready():
				case target = <-wants[i]:
				}
			}
		})
	}

	jobs := make(chan struct{}, publishers)
	var pubWG sync.WaitGroup
	var pubMu sync.Mutex
	var pubTotal time.Duration
	publish := func() {
		start := time.Now()
		data := strconv.AppendInt([]byte(`{"t":`), start.UnixNano(), 10)
		data = append(data, '}')
		if _, _, err := bps[0].Publish(ctx, "s", eventbus.Event{Type: "bench", Data: json.RawMessage(data)}); err != nil {
			b.Error(err)
		}
		d := time.Since(start)
		pubMu.Lock()
		pubTotal += d
		pubMu.Unlock()
	}
	for range publishers * min(publishers-1, 1) { // no pool for one publisher
		pubWG.Go(func() {
			for range jobs {
				publish()
			}
		})
	}
	n := 0
	start := time.Now()
	for b.Loop() {
		if publishers == 1 {
			publish()
		} else {
			jobs <- struct{}{}
		}
		n++
	}
	close(jobs)
	pubWG.Wait()
	for i := range wants {
		wants[i] <- n
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		for _, s := range subs {
			s.Close()
		}
		<-done
		b.Fatal("deliveries incomplete after 30s")
	}
	for _, s := range subs {
		s.Close()
	}
	var lat []time.Duration
	end := start
	for _, res := range results {
		if res.n != n {
			b.Fatalf("a subscriber got %d of %d events", res.n, n)
		}
		lat = append(lat, res.lat...)
		if res.last.After(end) {
			end = res.last
		}
	}
	slices.Sort(lat)
	elapsed := end.Sub(start).Seconds()
	b.ReportMetric(float64(n)/elapsed, "events/s")
	b.ReportMetric(float64(n*replicas)/elapsed, "deliveries/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(pubTotal.Microseconds())/float64(n), "publish-µs")
}

// sentAt reads the publish time the benchmark put in data.t.
func sentAt(env []byte) (time.Time, bool) {
	i := bytes.Index(env, []byte(`"data":{"t":`))
	if i < 0 {
		return time.Time{}, false
	}
	j := i + len(`"data":{"t":`)
	k := j
	for k < len(env) && env[k] >= '0' && env[k] <= '9' {
		k++
	}
	ns, err := strconv.ParseInt(string(env[j:k]), 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.Unix(0, ns), true
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
