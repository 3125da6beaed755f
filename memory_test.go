package eventbus

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// raceEnabled reports whether the test binary was built with -race.
func raceEnabled() bool {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" {
				return s.Value == "true"
			}
		}
	}
	return false
}

// memOverhead is the heap TestMemoryBoundStalledSubscribers allows beyond
// subscribers x MaxQueuedBytes + RingMaxBytes, and beyond the distinct
// frames the ring and the queues actually hold. Measured (1 MiB events, 64
// stalled subscribers, default caps): the live heap peaks at 64.6..66.7 MiB
// above its baseline, at most 0.65 MiB more than the bytes of the distinct
// frames held (the ring's 64 MiB plus the 1..2 events evicted subscribers
// keep after the ring dropped them); 8 MiB leaves room for queue slices,
// frame headroom and allocator slack.
const memOverhead = 8 << 20

// TestMemoryBoundStalledSubscribers publishes 1 MiB events to 64
// subscribers that never read, with the default RingSize (8000),
// RingMaxBytes (64 MiB) and MaxQueuedBytes (2 MiB), and checks the live heap
// after a collection every few events: it stays within
// subscribers x MaxQueuedBytes + RingMaxBytes + memOverhead of the baseline
// however long the publishing goes (300 events; 3000 with EVENTBUS_LONG=1).
//
//   - evicted: the default policy evicts each stalled subscriber; it keeps
//     its queued frames (and the terminal one) until it is dropped.
//   - reconnect: each time it is evicted the client comes back, live, and
//     stalls again (the subscription is closed and a new one made), so
//     stalled queues keep pinning frames the ring has already dropped.
//   - resync: OverflowResync keeps every stalled subscriber; each overflow
//     drops its live frames (the clock moves 61 s per event, so the
//     repeated_overflow eviction never comes).
//   - catchup: OverflowCatchUp keeps every stalled subscriber behind (a
//     stall bound of a year, so the clock never evicts it): its queue holds
//     what it had when it fell behind, and nothing more is copied for it;
//     what it will read is the ring's.
//   - mixed: a quarter of the subscribers of each kind on one bus.
//
// Under -race, encoding a 1 MiB event costs ~50 ms (the detector checks
// every byte the JSON validator reads), so the normal
// `go test -race ./...` runs the mixed variant only, with 120 events (the
// ring is full after 64); without -race, or with EVENTBUS_LONG=1, every
// variant runs; -short runs the mixed one with 72 events.
//
// It also checks every queue against its caps after each publish: the
// live bytes never exceed MaxQueuedBytes (an event fits, as one 1 MiB
// event always does).
func TestMemoryBoundStalledSubscribers(t *testing.T) {
	events, modes := 300, []string{"evicted", "reconnect", "resync", "catchup", "mixed"}
	switch {
	case testing.Short():
		events, modes = 72, []string{"mixed"}
	case proveLong():
		events = 3000
	case raceEnabled():
		events, modes = 120, []string{"mixed"}
	}
	const subscribers = DefaultMaxSubscribers
	const eventSize = 1 << 20
	payload := json.RawMessage(`"` + strings.Repeat("m", eventSize-100) + `"`)
	bound := uint64(subscribers*DefaultMaxQueuedBytes + DefaultRingMaxBytes + memOverhead)

	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			base := liveHeap()
			var clockMu sync.Mutex
			clock := time.UnixMilli(1719000000000)
			opts := Options{Logger: slog.New(slog.DiscardHandler), Now: func() time.Time {
				clockMu.Lock()
				defer clockMu.Unlock()
				return clock
			}}
			b, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			subs := make([]*Subscription, subscribers)
			// kind returns how subscriber i behaves.
			kind := func(i int) string {
				if mode != "mixed" {
					return mode
				}
				return []string{"evicted", "reconnect", "resync", "catchup"}[i%4]
			}
			subscribe := func(i int) {
				so := SubscribeOptions{}
				switch kind(i) {
				case "resync":
					so.OverflowPolicy = OverflowResync
				case "catchup":
					so.OverflowPolicy, so.CatchUpStallTimeout = OverflowCatchUp, 365*24*time.Hour
				}
				s, err := b.Subscribe(context.Background(), so)
				if err != nil {
					t.Fatalf("subscribe: %v", err)
				}
				subs[i] = s
			}
			for i := range subs {
				subscribe(i)
			}
			var peak uint64
			var slack int64
			reconnects := 0
			for n := 1; n <= events; n++ {
				if _, err := b.Publish(Event{Type: "big", Data: payload}); err != nil {
					t.Fatalf("publish %d: %v", n, err)
				}
				clockMu.Lock()
				clock = clock.Add(61 * time.Second)
				clockMu.Unlock()
				for i, s := range subs {
					if c := s.q.counts(); c.liveBytes > DefaultMaxQueuedBytes {
						t.Fatalf("subscriber %d holds %d live bytes, cap %d", i, c.liveBytes, DefaultMaxQueuedBytes)
					}
					switch err := s.Err(); {
					case err == nil:
					case !errors.Is(err, ErrEvicted) || kind(i) == "resync" || kind(i) == "catchup":
						t.Fatalf("subscriber %d ended: %v", i, err)
					case kind(i) == "reconnect":
						s.Close()
						subscribe(i)
						reconnects++
					}
				}
				if n%20 == 0 || n == events {
					heap := liveHeap()
					peak = max(peak, heap)
					if heap > base+bound {
						t.Fatalf("after %d events of 1 MiB the live heap is %d MiB above its baseline, bound %d MiB",
							n, (heap-base)>>20, bound>>20)
					}
					// Tighter: the heap is the distinct frames the ring and
					// the queues hold (each event encoded once, shared),
					// plus the overhead; no hidden copy anywhere.
					held := heldFrameBytes(b, subs)
					if heap > base+held+memOverhead {
						t.Fatalf("after %d events the live heap is %.1f MiB above its baseline, but the ring and the queues hold %.1f MiB of frames",
							n, float64(heap-base)/(1<<20), float64(held)/(1<<20))
					}
					slack = max(slack, int64(heap-base)-int64(held))
				}
			}
			st := b.Stats()
			t.Logf("%s: %d events of %d bytes, %d stalled subscribers: live heap peak %.1f MiB above baseline, at most %.2f MiB above the frames held "+
				"(bound %d MiB = %d x %d MiB + %d MiB + %d MiB); ring %d events / %.1f MiB; evictions %+v, resyncs %d, reconnects %d",
				mode, events, eventSize-100+81, subscribers, float64(peak-base)/(1<<20), float64(slack)/(1<<20), bound>>20, subscribers,
				DefaultMaxQueuedBytes>>20, DefaultRingMaxBytes>>20, memOverhead>>20, st.RingLen, float64(st.RingBytes)/(1<<20),
				st.Evictions, st.Resyncs.QueueBytesOverflow+st.Resyncs.QueueOverflow, reconnects)
			want := map[string]int{}
			for i := range subs {
				want[kind(i)]++
			}
			// The evicted ones are gone; the others are registered.
			if st.Subscribers != want["reconnect"]+want["resync"]+want["catchup"] || st.Evictions.RepeatedOverflow != 0 ||
				(want["resync"] > 0) != (st.Resyncs.QueueBytesOverflow > 0) || st.CatchUp.Behind != want["catchup"] {
				t.Errorf("%d subscribers registered, want %d; evictions %+v; %d resyncs", st.Subscribers,
					want["reconnect"]+want["resync"]+want["catchup"], st.Evictions, st.Resyncs.QueueBytesOverflow)
			}
			for _, s := range subs {
				s.Close()
			}
		})
	}
}

// heldFrameBytes sums the wire bytes of the distinct frames the ring and the
// subscriptions' queues hold (a frame shared by the ring and many queues
// counts once).
func heldFrameBytes(b *EventBus, subs []*Subscription) uint64 {
	seen := map[*byte]bool{}
	var total uint64
	add := func(f Frame) {
		if len(f.wire) > 0 && !seen[&f.wire[0]] {
			seen[&f.wire[0]] = true
			total += uint64(len(f.wire))
		}
	}
	b.mu.Lock()
	for i := range b.ring.Len() {
		add(Frame{b.ring.at(i)})
	}
	b.mu.Unlock()
	for _, s := range subs {
		s.q.mu.Lock()
		for i := range s.q.length() {
			add(Frame{s.q.entry(i).f})
		}
		s.q.mu.Unlock()
	}
	return total
}

// The byte caps count envelopes; what a frame costs beyond its envelope is
// at most maxFrameExtra (660 bytes on 64-bit), so the caps and the count
// caps together bound the heap. Events of the longest type, each a fresh
// string as a daemon decoding requests holds it, are the worst case: their
// envelopes are ~340 bytes and each costs twice that again. Measured with
// runtime.ReadMemStats after a collection:
//
//   - ring: buses whose RingMaxBytes (8 KiB) holds 24 such events grow by
//     at most the sum of RingBytes + RingLen*maxFrameExtra, an eighth more
//     for the allocator's size classes, and each ring's slot array;
//   - queue: buses that keep one event (RingSize 1), each with a
//     subscriber that never reads, whose queue (MaxQueued 12,
//     MaxQueuedBytes 4 KiB) is full: at most MaxQueuedBytes +
//     MaxQueued*maxFrameExtra per subscriber, plus its one warning (a
//     forced frame, outside the caps), an eighth, and the queue's slots.
func TestMemoryWithinEnvelopeCapsPlusPerFrameExtra(t *testing.T) {
	buses := pick(64, 400, 1000)
	measure := func(t *testing.T, opts Options, subscribe bool, events int) (grown int64, bs []*EventBus, subs []*Subscription) {
		bs = make([]*EventBus, buses)
		for i := range bs {
			bs[i] = newBus(t, opts)
			if subscribe {
				s, err := bs[i].Subscribe(context.Background(), SubscribeOptions{MaxQueued: 12})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(s.Close)
				subs = append(subs, s)
			}
		}
		before := liveHeap()
		for _, b := range bs {
			for i := range events {
				typ := string([]byte(maxType(i))) // a fresh copy per event
				if _, err := b.Publish(Event{Type: typ, Data: json.RawMessage(`{"n":1}`)}); err != nil {
					t.Fatal(err)
				}
			}
		}
		return int64(liveHeap()) - int64(before), bs, subs
	}

	t.Run("ring", func(t *testing.T) {
		const ringCap = 8 << 10
		grown, bs, _ := measure(t, Options{RingMaxBytes: ringCap}, false, 40)
		var envelopes, frames, bound int64
		for _, b := range bs {
			st := b.Stats()
			require.LessOrEqual(t, st.RingBytes, ringCap)
			require.Equal(t, 24, st.RingLen, "8 KiB of ~340-byte envelopes")
			envelopes += int64(st.RingBytes)
			frames += int64(st.RingLen)
			bound += int64(len(b.ring.slots)) * 8
		}
		bound += (envelopes + frames*int64(maxFrameExtra)) * 9 / 8
		t.Logf("%d buses x 24 events of a %d-byte type: heap +%d bytes (%d per frame) for %d envelope bytes (%d per frame); bound %d",
			buses, MaxTypeLen, grown, grown/frames, envelopes, envelopes/frames, bound)
		assert.LessOrEqual(t, grown, bound)
		runtime.KeepAlive(bs)
	})

	t.Run("queue", func(t *testing.T) {
		const queueCap = 4 << 10
		grown, bs, subs := measure(t, Options{RingSize: 1, MaxQueuedBytes: queueCap}, true, 12)
		var bound int64
		for i, s := range subs {
			c := s.q.counts()
			require.Equal(t, queueCounts{12, 12, c.liveBytes, queueCap}, c, "a full queue")
			require.NoError(t, s.Err())
			require.Equal(t, 13, s.q.len(), "12 events and the warning")
			warning := s.q.entry(9).f
			require.Equal(t, TypeSlowClientWarning, warning.typ)
			bound += int64(queueCap+12*maxFrameExtra+warning.size()+maxFrameExtra) * 9 / 8
			bound += int64(len(s.q.buf))*9 + int64(len(bs[i].ring.slots))*8
		}
		t.Logf("%d stalled subscribers with 12 events of a %d-byte type queued: heap +%d bytes (%d per subscriber); bound %d",
			buses, MaxTypeLen, grown, grown/int64(buses), bound)
		assert.LessOrEqual(t, grown, bound)
		runtime.KeepAlive(bs)
		runtime.KeepAlive(subs)
	})
}

// TestPublisherIsolationHealthyReceiveEverything is the correctness side of
// BenchmarkPublishLatency's healthy=63,stalled=1 case: with 63 healthy
// subscribers and one that never reads (default MaxQueued 256), every
// healthy one receives every event, in order, with no synthetic frame (no
// warning, no eviction), and the stalled one is evicted with exactly its
// first 256 events, one warning after the 192nd, and client_evicted naming
// the 257th. Publish never blocks: a watchdog fails the test if one call
// is still running after 30 s (a hang detector, not a timing check; the
// slowest call is logged). The publisher waits, every 64 events, for every
// healthy consumer to be within 192 events, so on a loaded machine the
// healthy ones stay below the warning threshold (768 of 1024) by
// construction.
func TestPublisherIsolationHealthyReceiveEverything(t *testing.T) {
	n := pick(2_000, 10_000, 500_000)
	const healthy = DefaultMaxSubscribers - 1
	b, err := New(Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got := make([]atomic.Int64, healthy)
	var consumers sync.WaitGroup
	for i := range healthy {
		s, err := b.Subscribe(context.Background(), SubscribeOptions{MaxQueued: 1024})
		if err != nil {
			t.Fatal(err)
		}
		consumers.Go(func() {
			want := uint64(1)
			for f := range s.Events() {
				if f.ID() != want {
					t.Errorf("healthy subscriber %d: got %s, want event %d", i, bmDescribe(f), want)
					got[i].Store(math.MaxInt64) // do not hold the publisher back
					return
				}
				want++
				got[i].Store(int64(f.ID()))
			}
			if err := s.Err(); err != nil {
				t.Errorf("healthy subscriber %d ended with %v", i, err)
			}
		})
	}
	stalled, err := b.Subscribe(context.Background(), SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}

	var inPublish atomic.Int64 // UnixNano when the current Publish started, 0 between calls
	var slowest atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		ev := Event{Type: "isolation", Data: map[string]int{"n": 1}}
		for i := 1; i <= n; i++ {
			t0 := time.Now()
			inPublish.Store(t0.UnixNano())
			_, err := b.Publish(ev)
			inPublish.Store(0)
			if d := int64(time.Since(t0)); d > slowest.Load() {
				slowest.Store(d)
			}
			if err != nil {
				t.Errorf("publish %d: %v", i, err)
				return
			}
			if i%64 == 0 {
				for j := range got {
					for got[j].Load() < int64(i-192) {
						time.Sleep(20 * time.Microsecond)
					}
				}
			}
		}
	}()
	watch := time.NewTicker(100 * time.Millisecond)
	defer watch.Stop()
wait:
	for {
		select {
		case <-done:
			break wait
		case <-watch.C:
			if s := inPublish.Load(); s != 0 && time.Since(time.Unix(0, s)) > 30*time.Second {
				buf := make([]byte, 1<<20)
				t.Fatalf("a Publish has been blocked for 30 s:\n%s", buf[:runtime.Stack(buf, true)])
			}
		}
	}
	_ = b.Close() // the healthy consumers drain and end
	consumers.Wait()
	for i := range got {
		if got[i].Load() != int64(n) {
			t.Errorf("healthy subscriber %d received up to %d of %d", i, got[i].Load(), n)
		}
	}

	if !errors.Is(stalled.Err(), ErrEvicted) {
		t.Fatalf("the stalled subscriber ended with %v, want eviction", stalled.Err())
	}
	var fs []Frame
	for open := true; open; {
		fs, open = stalled.AppendReady(fs)
	}
	var want []string
	for id := 1; id <= DefaultMaxQueued; id++ {
		want = append(want, "#"+strconv.Itoa(id))
		if id == DefaultMaxQueued*3/4 {
			want = append(want, TypeSlowClientWarning)
		}
	}
	want = append(want, TypeClientEvicted)
	var desc []string
	for _, f := range fs {
		if f.ID() > 0 {
			desc = append(desc, "#"+strconv.FormatUint(f.ID(), 10))
		} else {
			desc = append(desc, f.Type())
		}
	}
	if !slices.Equal(desc, want) {
		t.Fatalf("the stalled subscriber's frames:\n got  %v\n want %v", desc, want)
	}
	var evicted struct {
		Data struct {
			Reason       string `json:"reason"`
			DroppedAfter uint64 `json:"droppedAfter"`
			QueueSize    int    `json:"queueSize"`
			MaxQueued    int    `json:"maxQueued"`
		} `json:"data"`
	}
	if err := json.Unmarshal(fs[len(fs)-1].JSON(), &evicted); err != nil ||
		evicted.Data.Reason != ReasonQueueOverflow || evicted.Data.DroppedAfter != DefaultMaxQueued+1 ||
		evicted.Data.QueueSize != DefaultMaxQueued || evicted.Data.MaxQueued != DefaultMaxQueued {
		t.Errorf("client_evicted %s (%v)", fs[len(fs)-1].JSON(), err)
	}
	st := b.Stats()
	if st.Evictions.QueueOverflow != 1 || st.Warnings != 1 || st.Published != uint64(n) {
		t.Errorf("stats: %+v", st)
	}
	t.Logf("%d events to %d healthy subscribers and 1 stalled: every healthy one got all of them in order; slowest Publish %v",
		n, healthy, time.Duration(slowest.Load()))
}
