package eventbus

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssebus/eventbus/internal/benchkit"
)

// Paced benchmarks (issue 13): a publisher at a fixed rate in events/s,
// paced by a spin-wait (every event at its time) or by sleeping between
// bursts (each millisecond's events at once, then a sleep), consumers that
// check every delivery and may pause a few milliseconds now and then, as
// the scheduler and the garbage collector make them. They report losses
// apart from speed: lost events and evicted subscribers, the rate the
// publisher achieved, and the delivery latency from just before Publish to
// the consumer (p50, p99, p99.9, from every 8th event). Run them with
//
//	go test -run '^$' -bench 'Paced' -benchtime 1x -count 5 | tee paced.txt
//
// and read the metrics per sub-benchmark (benchstat works on them too).
// The naive impl is a blocking bus (one buffered channel of 256 per
// subscriber): it never loses, it slows the publisher, so its achieved
// rate tells whether it sustains the pace.

// pacedRun configures one paced run.
type pacedRun struct {
	impl   string // "evict", "resync", "catchup", "naive", "naive-enc"
	subs   int
	rate   int // events per second
	pacer  benchkit.Pacer
	pause  bool // consumers pause 2-5 ms about every 50 ms
	all    bool // measure the latency of every event, not every 8th
	events int
	yields bool // OverflowEvict's publisher yields (off: a variant to measure them)
}

// pacedResult is what a run measured.
type pacedResult struct {
	lost, evicted int64 // events some subscriber never got; subscribers evicted
	dup           int64 // deliveries out of order or twice (must be 0)
	achieved      float64
	lat           benchkit.Hist
	catchUps      uint64
}

// pacedConsumer checks one subscriber's deliveries.
type pacedConsumer struct {
	mask    uint64 // the latency of ids with id&mask == 0 is measured
	next    uint64 // next expected id
	lost    int64
	dup     int64
	evicted bool
	lat     benchkit.Hist
	rng     *rand.Rand
	pauseAt time.Duration
	got     atomic.Uint64 // events seen, for the end of the run
	ended   atomic.Bool   // its stream ended (evicted, or closed)
}

func (c *pacedConsumer) see(id uint64, sent []atomic.Int64, base time.Time, pause bool) {
	switch {
	case id == c.next:
		c.next++
	case id > c.next:
		c.lost += int64(id - c.next)
		c.next = id + 1
	default:
		c.dup++
	}
	if id&c.mask == 0 {
		c.lat.Add(int64(time.Since(base)) - sent[id].Load())
	}
	c.got.Store(c.next - 1)
	if id&63 == 0 {
		if pause {
			if now := time.Since(base); now >= c.pauseAt {
				time.Sleep(time.Duration(2+c.rng.IntN(4)) * time.Millisecond)
				c.pauseAt = time.Since(base) + time.Duration(20+c.rng.IntN(60))*time.Millisecond
			}
		}
	}
}

func runPaced(tb testing.TB, r pacedRun) pacedResult {
	sent := make([]atomic.Int64, r.events+1)
	base := time.Now()
	cons := make([]*pacedConsumer, r.subs)
	for i := range cons {
		cons[i] = &pacedConsumer{mask: 7, next: 1, rng: rand.New(rand.NewPCG(uint64(i), 13)),
			pauseAt: time.Duration(rand.IntN(50)) * time.Millisecond}
		if r.all {
			cons[i].mask = 0
		}
	}
	var wg sync.WaitGroup
	var publish func(seq uint64)
	var stop func()
	var bus *EventBus
	switch r.impl {
	case "naive":
		chans := make([]chan uint64, r.subs)
		var mu sync.RWMutex
		for i := range chans {
			chans[i] = make(chan uint64, 256)
			c := cons[i]
			wg.Go(func() {
				for id := range chans[i] {
					c.see(id, sent, base, r.pause)
				}
				c.ended.Store(true)
			})
		}
		publish = func(seq uint64) {
			mu.RLock()
			for _, ch := range chans {
				ch <- seq
			}
			mu.RUnlock()
		}
		stop = func() {
			for _, ch := range chans {
				close(ch)
			}
		}
	case "naive-enc":
		// The naive bus handed what a publish of the library builds: the
		// event encoded by the bus's encoder and its frame, allocated as
		// Publish allocates them. What it adds to naive is the frame's
		// cost; what eventbus adds to it is the delivery's.
		enc, err := newEncoder(Options{})
		if err != nil {
			tb.Fatal(err)
		}
		chans := make([]chan *frame, r.subs)
		for i := range chans {
			chans[i] = make(chan *frame, 256)
			c := cons[i]
			wg.Go(func() {
				for f := range chans[i] {
					c.see(f.id, sent, base, r.pause)
				}
				c.ended.Store(true)
			})
		}
		ev := Event{Type: "bench", Data: benchData}
		publish = func(seq uint64) {
			p, err := enc.encode(ev, seq)
			if err != nil {
				tb.Error(err)
				return
			}
			f := new(frame)
			*f = p.build(seq)
			for _, ch := range chans {
				ch <- f
			}
		}
		stop = func() {
			for _, ch := range chans {
				close(ch)
			}
		}
	default:
		policy := map[string]OverflowPolicy{"evict": OverflowEvict, "resync": OverflowResync, "catchup": OverflowCatchUp}[r.impl]
		var err error
		bus, err = New(Options{MaxSubscribers: r.subs, OverflowPolicy: policy, Logger: quiet, RingSize: min(MaxRingSize, max(DefaultRingSize, r.events))})
		if err != nil {
			tb.Fatal(err)
		}
		var started sync.WaitGroup
		for i := range cons {
			s, err := bus.Subscribe(context.Background(), SubscribeOptions{})
			if err != nil {
				tb.Fatal(err)
			}
			c := cons[i]
			started.Add(1)
			wg.Go(func() {
				started.Done()
				for f := range s.Events() {
					if id := f.ID(); id != 0 {
						c.see(id, sent, base, r.pause)
					}
				}
				c.evicted = s.Err() != nil
				c.ended.Store(true)
			})
		}
		started.Wait()
		ev := Event{Type: "bench", Data: benchData}
		publish = func(seq uint64) {
			if _, err := bus.Publish(ev); err != nil {
				tb.Error(err)
			}
		}
		stop = func() { _ = bus.Close() }
	}
	if !r.yields {
		defer func(f func()) { yieldProcessor = f }(yieldProcessor)
		yieldProcessor = func() {}
	}

	interval := time.Second / time.Duration(r.rate)
	start := time.Since(base)
	for seq := uint64(1); seq <= uint64(r.events); seq++ {
		benchkit.Wait(base, start+time.Duration(seq-1)*interval, r.pacer)
		sent[seq].Store(int64(time.Since(base)))
		publish(seq)
	}
	elapsed := time.Since(base) - start
	// Let the consumers finish: every one has every event, or stops moving.
	deadline := time.Now().Add(10 * time.Second)
	for _, c := range cons {
		last, lastChange := c.got.Load(), time.Now()
		for c.got.Load() < uint64(r.events) && !c.ended.Load() && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
			if g := c.got.Load(); g != last {
				last, lastChange = g, time.Now()
			} else if time.Since(lastChange) > 500*time.Millisecond {
				break // evicted, or its stream ended
			}
		}
	}
	stop()
	wg.Wait()
	res := pacedResult{achieved: float64(r.events) / elapsed.Seconds()}
	for _, c := range cons {
		if c.next <= uint64(r.events) {
			c.lost += int64(uint64(r.events) - (c.next - 1))
		}
		res.lost += c.lost
		res.dup += c.dup
		if c.evicted {
			res.evicted++
		}
		res.lat.Merge(&c.lat)
	}
	if bus != nil {
		res.catchUps = bus.Stats().CatchUp.Entered
	}
	return res
}

// pacedRate overrides BenchmarkPaced's rates: go test -bench Paced -args
// -paced.rate=300000.
var pacedRate = flag.Int("paced.rate", 0, "events/s of BenchmarkPaced (0: 100,000, and 5,000 at 1000 subscribers)")

// BenchmarkPaced: every impl at 1, 64 and 1000 subscribers, both paces,
// with and without pausing consumers, at 100,000 events/s (the rate of
// the report; 5,000/s at 1000 subscribers, about what the naive
// blocking bus sustains there), each run half a second. Under
// OverflowEvict the yields can be switched off (impl=evict-noyield) to see
// what they buy.
func BenchmarkPaced(b *testing.B) {
	for _, subs := range benchSizes {
		rate := 100_000
		if subs >= 1000 {
			rate = 5_000
		}
		if *pacedRate > 0 {
			rate = *pacedRate
		}
		events := max(2000, rate/2)
		for _, pace := range []string{"spin", "burst"} {
			for _, pause := range []bool{false, true} {
				for _, impl := range []string{"naive", "evict", "evict-noyield", "resync", "catchup"} {
					name := fmt.Sprintf("subs=%d/rate=%d/pace=%s/pause=%v/impl=%s", subs, rate, pace, pause, impl)
					b.Run(name, func(b *testing.B) {
						r := pacedRun{impl: impl, subs: subs, rate: rate, pacer: benchkit.Spin, pause: pause, events: events, yields: true}
						if pace == "burst" {
							r.pacer = benchkit.Burst
						}
						if impl == "evict-noyield" {
							r.impl, r.yields = "evict", false
						}
						benchPaced(b, r)
					})
				}
			}
		}
	}
}

func benchPaced(b *testing.B, r pacedRun) {
	var lost, evicted, dup int64
	var achieved float64
	var lat benchkit.Hist
	var catchUps uint64
	runs := 0
	for b.Loop() {
		res := runPaced(b, r)
		lost += res.lost
		evicted += res.evicted
		dup += res.dup
		achieved += res.achieved
		catchUps += res.catchUps
		lat.Merge(&res.lat)
		runs++
		runtime.GC()
	}
	if dup != 0 {
		b.Errorf("%d deliveries out of order or duplicated", dup)
	}
	n := float64(runs)
	b.ReportMetric(float64(lost)/n, "lost/run")
	b.ReportMetric(float64(evicted)/n, "evicted/run")
	b.ReportMetric(achieved/n, "events/s")
	b.ReportMetric(float64(catchUps)/n, "catchups/run")
	b.ReportMetric(float64(lat.Quantile(0.5).Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat.Quantile(0.99).Microseconds()), "p99-µs")
	b.ReportMetric(float64(lat.Quantile(0.999).Microseconds()), "p99.9-µs")
	if r.all {
		b.ReportMetric(float64(lat.Max().Microseconds()), "max-µs")
		b.ReportMetric(100*lat.Above(time.Millisecond), "%>1ms")
	}
}

// BenchmarkDeliveryLatency is the delivery latency of issue 26: 64
// subscribers, 10,000 events/s for 2 s, a publisher that sleeps until each
// event is due (one woken for each event, by a timer or a request) or one
// that keeps its processor busy, yielding (runtime.Gosched) until the event
// is due; the naive channel bus (the send hands the processor to a waiting
// consumer) and the same bus handed frames that the library's encoder
// built, as Publish builds them (naive-enc: what the frame costs, apart
// from what the delivery costs) against eventbus's Events. Every event's
// latency is measured, from just before Publish to each subscriber: p50,
// p99, p99.9, the largest, and the share over 1 ms; losses apart. Run it
// with
//
//	go test -run '^$' -bench DeliveryLatency -benchtime 1x -count 8
func BenchmarkDeliveryLatency(b *testing.B) {
	for _, pacer := range []benchkit.Pacer{benchkit.Sleep, benchkit.Yield} {
		for _, impl := range []string{"naive", "naive-enc", "evict", "catchup"} {
			b.Run(fmt.Sprintf("pace=%v/impl=%s", pacer, impl), func(b *testing.B) {
				benchPaced(b, pacedRun{impl: impl, subs: 64, rate: 10_000, pacer: pacer, events: 20_000, yields: true, all: true})
			})
		}
	}
}

// BenchmarkCatchUpPublishLatency times Publish at 1000 subscribers on
// Events that pause 3 ms every 200 frames, a publisher spin-paced at 3000
// events/s: with MaxQueued 16 nearly all of them fall behind and catch up
// over and over (catchups/op), with 4096 none does. The difference is what
// catching up costs the publisher (the read of the ring, and the hand-over
// to the live fan-out).
func BenchmarkCatchUpPublishLatency(b *testing.B) {
	for _, mq := range []int{4096, 16} {
		b.Run(fmt.Sprintf("maxQueued=%d", mq), func(b *testing.B) {
			const subs, rate, events = 1000, 3000, 6000
			bus, err := New(Options{MaxSubscribers: subs, OverflowPolicy: OverflowCatchUp, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			var wg sync.WaitGroup
			for range subs {
				s, err := bus.Subscribe(context.Background(), SubscribeOptions{MaxQueued: mq})
				if err != nil {
					b.Fatal(err)
				}
				wg.Go(func() {
					n := 0
					for range s.Events() {
						if n++; n%200 == 0 {
							time.Sleep(3 * time.Millisecond)
						}
					}
				})
			}
			lat := make([]time.Duration, 0, events)
			ev := Event{Type: "bench", Data: benchData}
			for b.Loop() {
				start := time.Now()
				for i := range events {
					due := start.Add(time.Duration(i) * time.Second / rate)
					for time.Now().Before(due) {
					}
					t0 := time.Now()
					if _, err := bus.Publish(ev); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t0))
				}
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			b.ReportMetric(float64(lat[len(lat)*999/1000].Microseconds()), "p99.9-µs")
			b.ReportMetric(float64(bus.Stats().CatchUp.Entered)/float64(b.N), "catchups/op")
			_ = bus.Close()
			wg.Wait()
		})
	}
}

// BenchmarkWakeRound is one event to 64 waiting consumers, timed from
// just before the publish to the last consumer's receipt (round-µs), and
// the publish alone (pub-µs): what a delivery latency is made of once the
// consumers wait, without a pacer's timer (issue 26). The naive bus is a
// buffered channel per consumer, whose send hands the value to the
// waiting receiver; eventbus's consumers range over Events, or take with
// TakeReady and wait on Ready as a transport does. Each round starts after
// a 100 µs pause, so that every consumer is parked. Run it on one
// processor and on two:
//
//	go test -run '^$' -bench WakeRound -cpu 1,2 -count 8
func BenchmarkWakeRound(b *testing.B) {
	const subs = 64
	for _, impl := range []string{"naive", "events", "take"} {
		b.Run("impl="+impl, func(b *testing.B) {
			var seen atomic.Int64
			done := make(chan struct{}, 1)
			see := func(n int64) {
				if seen.Add(n) == subs {
					done <- struct{}{}
				}
			}
			var wg sync.WaitGroup
			var publish, stop func()
			if impl == "naive" {
				chans := make([]chan uint64, subs)
				for i := range chans {
					chans[i] = make(chan uint64, 256)
					wg.Go(func() {
						for range chans[i] {
							see(1)
						}
					})
				}
				publish = func() {
					for _, ch := range chans {
						ch <- 1
					}
				}
				stop = func() {
					for _, ch := range chans {
						close(ch)
					}
				}
			} else {
				bus, err := New(Options{MaxSubscribers: subs, Logger: quiet})
				if err != nil {
					b.Fatal(err)
				}
				for range subs {
					s, err := bus.Subscribe(context.Background(), SubscribeOptions{})
					if err != nil {
						b.Fatal(err)
					}
					if impl == "events" {
						wg.Go(func() {
							for range s.Events() {
								see(1)
							}
						})
						continue
					}
					wg.Go(func() {
						var batch []Frame
						for {
							var open bool
							if batch, open = s.TakeReady(batch[:0]); len(batch) > 0 {
								see(int64(len(batch)))
								s.MarkWritten(len(batch))
							}
							if !open {
								return
							}
							if len(batch) == 0 {
								<-s.Ready()
							}
						}
					})
				}
				ev := Event{Type: "bench", Data: benchData}
				publish = func() {
					if _, err := bus.Publish(ev); err != nil {
						b.Error(err)
					}
				}
				stop = func() { _ = bus.Close() }
			}
			var round, pub time.Duration
			rounds := 0
			for b.Loop() {
				seen.Store(0)
				time.Sleep(100 * time.Microsecond)
				start := time.Now()
				publish()
				pub += time.Since(start)
				<-done
				round += time.Since(start)
				rounds++
			}
			stop()
			wg.Wait()
			b.ReportMetric(float64(pub.Nanoseconds())/float64(rounds)/1e3, "pub-µs")
			b.ReportMetric(float64(round.Nanoseconds())/float64(rounds)/1e3, "round-µs")
		})
	}
}

// TestPacedReferenceBuses runs the paced harness's two channel buses
// briefly: each delivers every event once, in order, to every consumer,
// so that their latencies compare deliveries, not losses.
func TestPacedReferenceBuses(t *testing.T) {
	for _, impl := range []string{"naive", "naive-enc"} {
		res := runPaced(t, pacedRun{impl: impl, subs: 4, rate: 20_000, pacer: benchkit.Sleep, events: 2_000, yields: true, all: true})
		if res.lost != 0 || res.dup != 0 || res.evicted != 0 {
			t.Errorf("%s: lost %d, duplicated %d, evicted %d", impl, res.lost, res.dup, res.evicted)
		}
		if res.lat.Quantile(0.5) <= 0 {
			t.Errorf("%s: no latency measured", impl)
		}
	}
}
