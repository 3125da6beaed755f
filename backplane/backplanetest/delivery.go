package backplanetest

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
)

// Delivery measures a backplane end to end, one event per iteration:
// publish (on one replica) until the event has been delivered to subs
// (in-process subscriptions, one per replica and session, with queues
// large enough for the whole run). Iteration k publishes to session
// k%sessions, and subs[i] is a subscription to session i%sessions, which
// must get every event of its session; Delivery closes them. publishers
// is how many publishes are in flight: 1 measures latency, more measure
// throughput. It reports:
//
//	events/s      events delivered to every replica, per second of the run
//	deliveries/s  events/s times the replicas
//	p50-µs p99-µs publish start to delivery, over every (event, replica)
//	publish-µs    mean time publish took
//
// (with sessions > 1, an event counts once however many sessions there
// are: events/s is publishes delivered everywhere per second).
func Delivery(b *testing.B, publishers, sessions int, subs []*eventbus.Subscription,
	publish func(ctx context.Context, session int, data json.RawMessage) error) {
	b.Helper()
	ctx := context.Background()
	type result struct {
		lat  []time.Duration
		last time.Time
		n    int
	}
	results := make([]result, len(subs))
	var wg sync.WaitGroup
	wants := make([]chan int, len(subs)) // how many events each subscriber waits for
	for i, sub := range subs {
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

	jobs := make(chan int, publishers)
	var pubWG sync.WaitGroup
	var pubMu sync.Mutex
	var pubTotal time.Duration
	one := func(k int) {
		start := time.Now()
		data := strconv.AppendInt([]byte(`{"t":`), start.UnixNano(), 10)
		data = append(data, '}')
		if err := publish(ctx, k%sessions, json.RawMessage(data)); err != nil {
			b.Error(err)
		}
		d := time.Since(start)
		pubMu.Lock()
		pubTotal += d
		pubMu.Unlock()
	}
	for range publishers * min(publishers-1, 1) { // no pool for one publisher
		pubWG.Go(func() {
			for k := range jobs {
				one(k)
			}
		})
	}
	n := 0
	start := time.Now()
	for b.Loop() {
		if publishers == 1 {
			one(n)
		} else {
			jobs <- n
		}
		n++
	}
	close(jobs)
	pubWG.Wait()
	for i := range wants {
		// Iterations k < n with k%sessions == i%sessions.
		j := i % sessions
		wants[i] <- (n - j + sessions - 1) / sessions
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
	for i, res := range results {
		if want := (n - i%sessions + sessions - 1) / sessions; res.n != want {
			b.Fatalf("subscriber %d got %d of %d events", i, res.n, want)
		}
		lat = append(lat, res.lat...)
		if res.last.After(end) {
			end = res.last
		}
	}
	slices.Sort(lat)
	elapsed := end.Sub(start).Seconds()
	b.ReportMetric(float64(n)/elapsed, "events/s")
	b.ReportMetric(float64(n*len(subs)/sessions)/elapsed, "deliveries/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	b.ReportMetric(float64(pubTotal.Microseconds())/float64(n), "publish-µs")
}

// sentAt reads the publish time Delivery put in data.t.
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
