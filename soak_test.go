package eventbus

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// soakHeapMargin is what the live heap may grow by across the soak, beyond
// the ring (which is full, with events of the same size, before the
// baseline is taken). Measured: +50..75 KB for 10,000 cycles, +105..210 KB
// for 100,000; a heap profile attributes it to the runtime's goroutine
// descriptors (runtime.malg: the runtime never frees a g, and context
// cancellations run AfterFunc goroutines, a few hundred at the peak) and
// the bus's subscriber slice capacity, not to anything a subscription
// left behind.
const soakHeapMargin = 1 << 20

// TestSoakSubscribeCancelEvict runs 10,000 subscribe/cancel cycles (live,
// resumed, with a context cancelled, Close, breaking out of Events, a
// context already done) and 1,000 evictions (MaxQueued 1 subscribers that
// never read, then drained, closed, cancelled or just dropped) while two
// publishers publish, then checks that the goroutine count returns to its
// baseline and the live heap to within soakHeapMargin of its baseline:
// nothing a subscription owned (queue, context callback, registration)
// survives it. -short runs 2,000 cycles and 200 evictions, EVENTBUS_LONG=1
// 100,000 cycles and 10,000 evictions.
func TestSoakSubscribeCancelEvict(t *testing.T) {
	cycles, evictions := pick(2_000, 10_000, 100_000), pick(200, 1_000, 10_000)
	const ringSize = 1000
	// A context cancellation unregisters on the context's own goroutine, a
	// little later: leave room for the ones still in flight.
	b, err := New(Options{RingSize: ringSize, MaxSubscribers: 4096, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ev := Event{Type: "soak", Data: strings.Repeat("s", 100)}
	for range ringSize {
		if _, err := b.Publish(ev); err != nil {
			t.Fatal(err)
		}
	}
	// A warm-up cycle of every kind, so lazily allocated package state
	// (pools, the context package's machinery) is in the baseline.
	soakCycles(t, b, 0, 50)
	baseG := runtime.NumGoroutine()
	baseHeap := liveHeap()
	baseRing := b.Stats().RingBytes
	start := time.Now()

	stop := make(chan struct{})
	var pubs sync.WaitGroup
	for range 2 {
		pubs.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := b.Publish(ev); err != nil {
					t.Errorf("publish: %v", err)
					return
				}
				if i%16 == 0 {
					time.Sleep(50 * time.Microsecond)
				}
			}
		})
	}
	var work sync.WaitGroup
	const cycleWorkers = 4
	for w := range cycleWorkers {
		work.Go(func() { soakCycles(t, b, uint64(w+1), cycles/cycleWorkers) })
	}
	var evicted atomic.Int64
	for range 2 {
		work.Go(func() { soakEvictions(t, b, evictions/2, &evicted) })
	}
	work.Wait()
	close(stop)
	pubs.Wait()
	elapsed := time.Since(start)

	if n := b.SubscriberCount(); n != 0 {
		t.Errorf("%d subscribers left after every subscription ended", n)
	}
	st := b.Stats()
	if got := st.Evictions.QueueOverflow + st.Evictions.QueueBytesOverflow; got < uint64(evictions) {
		t.Errorf("%d evictions, want at least %d", got, evictions)
	}
	g := waitGoroutines(baseG)
	heap := liveHeap()
	ring := b.Stats().RingBytes
	t.Logf("%d cycles, %d evictions, %d events published in %v; goroutines %d -> %d; live heap %d -> %d (%+d bytes; ring %d -> %d bytes); peak subscribers %d",
		cycles, evicted.Load(), st.Published, elapsed.Round(time.Millisecond), baseG, g, baseHeap, heap,
		int64(heap)-int64(baseHeap), baseRing, ring, st.PeakSubscribers)
	if g > baseG {
		t.Errorf("goroutines: %d after the soak, baseline %d", g, baseG)
	}
	if limit := baseHeap + uint64(max(ring-baseRing, 0)) + soakHeapMargin; heap > limit {
		t.Errorf("live heap %d after the soak, baseline %d: more than the ring's growth + %d", heap, baseHeap, soakHeapMargin)
	}
}

// soakCycles runs n subscribe/cancel cycles of every kind.
func soakCycles(t *testing.T, b *EventBus, seed uint64, n int) {
	r := rand.New(rand.NewPCG(seed, 3))
	var buf []Frame
	for i := range n {
		opts := SubscribeOptions{MaxQueued: 4096}
		if r.IntN(2) == 0 {
			last := b.LastEventID()
			opts.Resume, opts.LastEventID, opts.Epoch = true, last-min(last, uint64(r.IntN(64))), b.Epoch()
		}
		switch i % 5 {
		case 0: // a context, cancelled
			ctx, cancel := context.WithCancel(context.Background())
			s, err := b.Subscribe(ctx, opts)
			if err != nil {
				t.Errorf("subscribe: %v", err)
				cancel()
				return
			}
			buf, _ = s.AppendReady(buf[:0])
			cancel()
		case 1: // Close
			s, err := b.Subscribe(context.Background(), opts)
			if err != nil {
				t.Errorf("subscribe: %v", err)
				return
			}
			buf, _ = s.AppendReady(buf[:0])
			s.Close()
		case 2: // breaking out of Events (a resume always has replay_complete)
			opts.Resume, opts.LastEventID = true, b.LastEventID()
			ctx, cancel := context.WithCancel(context.Background())
			s, err := b.Subscribe(ctx, opts)
			if err != nil {
				t.Errorf("subscribe: %v", err)
				cancel()
				return
			}
			for range s.Events() {
				break
			}
			cancel()
		case 3: // a context already done: never registered
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if _, err := b.Subscribe(ctx, opts); err != nil {
				t.Errorf("subscribe: %v", err)
				return
			}
		case 4: // a context with a deadline, cancelled by Close first
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			s, err := b.Subscribe(ctx, opts)
			if err != nil {
				t.Errorf("subscribe: %v", err)
				cancel()
				return
			}
			s.Close()
			cancel()
		}
		clear(buf)
	}
}

// soakEvictions makes n subscribers that never read get evicted.
func soakEvictions(t *testing.T, b *EventBus, n int, evicted *atomic.Int64) {
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := b.Subscribe(ctx, SubscribeOptions{MaxQueued: 1})
		if err != nil {
			t.Errorf("subscribe: %v", err)
			cancel()
			return
		}
		for s.Err() == nil {
			time.Sleep(20 * time.Microsecond) // the publishers overflow it
		}
		if !errors.Is(s.Err(), ErrEvicted) {
			t.Errorf("subscription ended with %v, want eviction", s.Err())
		}
		evicted.Add(1)
		switch i % 4 {
		case 0: // drained to the end
			for {
				if _, open := s.AppendReady(nil); !open {
					break
				}
			}
		case 1:
			s.Close()
		case 2:
			cancel() // nothing watches the context any more
		case 3: // dropped as is, with its terminal frame queued
		}
		cancel()
	}
}
