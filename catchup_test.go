package eventbus

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// OverflowCatchUp (issue 13): a subscriber whose caps reject a live push
// falls behind and reads what follows from the ring, within its caps.

// drainReady takes frames with AppendReady until a call returns none (or
// the end), checking that no call returns more live frames than the caps
// hold.
func drainReady(t testing.TB, s *Subscription) []Frame {
	t.Helper()
	var out []Frame
	for {
		n := len(out)
		var open bool
		out, open = s.AppendReady(out)
		live, bytes := 0, 0
		for _, f := range out[n:] {
			if f.ID() != 0 || f.Signal() {
				live++
				bytes += f.Size()
			}
		}
		c := s.q.counts()
		require.LessOrEqual(t, live, c.maxQueued, "one batch holds more live frames than the frame cap")
		if live > 1 {
			require.LessOrEqual(t, bytes, c.maxBytes, "one batch holds more live bytes than the byte cap")
		}
		if len(out) == n || !open {
			return out
		}
	}
}

// nonEvents returns the types of the synthetic frames among fs, in order.
func nonEvents(fs []Frame) []string {
	var out []string
	for _, f := range fs {
		if f.Synthetic() {
			out = append(out, f.Type())
		}
	}
	return out
}

func TestCatchUpConsumerThatStopsThenResumesGetsEverything(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16, OverflowPolicy: OverflowCatchUp})
	s := subscribe(t, b, SubscribeOptions{})
	publishTypeN(t, b, "e", 1000) // the consumer is not reading: 16 fill its queue
	assert.Equal(t, queueCounts{16, 16, 16 * pub11Size(b, 1), DefaultMaxQueuedBytes}.liveCount, s.q.counts().liveCount,
		"it holds its cap, no more")
	assert.Equal(t, 17, s.q.len(), "the 16 events and the warning")
	st := b.Stats()
	assert.Equal(t, CatchUpStats{Entered: 1, Behind: 1}, st.CatchUp)

	fs := drainReady(t, s)
	requireIDs(t, seqIDs(1, 1000), eventIDs(fs), "every event, in order, once")
	assert.Equal(t, []string{TypeSlowClientWarning}, nonEvents(fs), "the warning of the episode, nothing else")
	assert.Equal(t, []string{"#12", TypeSlowClientWarning, "#13"}, describe(fs[11:14]), "the warning sits after its triggering event")
	assert.NoError(t, s.Err())

	st = b.Stats()
	assert.Equal(t, EvictionStats{}, st.Evictions)
	assert.Equal(t, CatchUpStats{Entered: 1, Served: 984, Behind: 1}, st.CatchUp,
		"it has read everything; the next publish hands it over")
	assert.Equal(t, uint64(1001), st.FramesDelivered)

	publishType(t, b, "e")
	assert.Equal(t, 0, b.Stats().CatchUp.Behind)
	assert.Equal(t, 1, s.q.counts().liveCount, "caught up, it is pushed to live again")
	assert.Equal(t, []string{"#1001"}, describe(readyNow(s)))
}

func TestCatchUpRingMovedPastCursorGetsOneExactRingEvicted(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16, RingSize: 100, OverflowPolicy: OverflowCatchUp})
	s := subscribe(t, b, SubscribeOptions{})
	publishTypeN(t, b, "e", 500) // the ring now holds #401..#500; the subscriber needs #17

	fs := drainReady(t, s)
	requireIDs(t, append(seqIDs(1, 16), seqIDs(401, 500)...), eventIDs(fs))
	assert.Equal(t, []string{TypeSlowClientWarning, TypeStateResyncRequired}, nonEvents(fs), "exactly one resync")
	resync := ofType(fs, TypeStateResyncRequired)[0]
	assert.JSONEq(t, fmt.Sprintf(`{"reason":"ring_evicted","lastDeliveredId":16,"earliestAvailableId":401,"epoch":%q}`, b.Epoch()),
		dataOf(t, resync))
	assert.Equal(t, "#401", describe(fs[18:19])[0], "right before the ring's oldest")
	st := b.Stats()
	assert.Equal(t, uint64(1), st.Resyncs.RingEvicted)
	assert.Equal(t, uint64(100), st.CatchUp.Served)
	assert.Equal(t, EvictionStats{}, st.Evictions)
}

func TestCatchUpRingEvictedWhileReading(t *testing.T) {
	// The consumer reads a batch from the ring, then stops while the ring
	// moves on: the next batch starts with the resync at its own cursor.
	b := newBus(t, Options{MaxQueued: 8, RingSize: 40, OverflowPolicy: OverflowCatchUp})
	s := subscribe(t, b, SubscribeOptions{})
	publishTypeN(t, b, "e", 30)
	first := readyNow(s) // #1..#8 queued, then #9..#16 from the ring... within 8 for the batch
	assert.Equal(t, seqIDs(1, 8), eventIDs(first), "one batch, within the frame cap")
	second := readyNow(s)
	assert.Equal(t, seqIDs(9, 16), eventIDs(second))
	publishTypeN(t, b, "e", 100) // the ring holds #91..#130
	fs := drainReady(t, s)
	assert.Equal(t, TypeStateResyncRequired, fs[0].Type())
	assert.JSONEq(t, fmt.Sprintf(`{"reason":"ring_evicted","lastDeliveredId":16,"earliestAvailableId":91,"epoch":%q}`, b.Epoch()),
		dataOf(t, fs[0]))
	requireIDs(t, seqIDs(91, 130), eventIDs(fs))
}

func TestCatchUpBytesCapEntersCatchUpAndBatchesStayWithinIt(t *testing.T) {
	b := newBus(t, Options{MaxQueuedBytes: 1000, OverflowPolicy: OverflowCatchUp})
	s := subscribe(t, b, SubscribeOptions{})
	for range 50 {
		publishSized(t, b, "e", 100)
	}
	assert.Equal(t, 10, s.q.counts().liveCount, "10 x 100 bytes fill the byte cap")
	assert.Equal(t, uint64(1), b.Stats().CatchUp.Entered)
	fs := drainReady(t, s) // checks every batch against the byte cap
	requireIDs(t, seqIDs(1, 50), eventIDs(fs))
}

func TestCatchUpOversizedEventReachesAConsumerThatHoldsNothing(t *testing.T) {
	// As for a live push, the first frame of a batch is admitted whatever
	// its size when nothing is held.
	b := newBus(t, Options{MaxQueuedBytes: 1000, MaxQueued: 4, OverflowPolicy: OverflowCatchUp})
	s := subscribe(t, b, SubscribeOptions{})
	publishTypeN(t, b, "e", 5) // #5 is rejected: behind at #5
	publishSized(t, b, "e", 3000)
	publishSized(t, b, "e", 3000)
	assert.Equal(t, seqIDs(1, 4), eventIDs(readyNow(s)))
	assert.Equal(t, []uint64{5}, eventIDs(readyNow(s)))
	assert.Equal(t, []uint64{6}, eventIDs(readyNow(s)), "alone, above the byte cap")
	assert.Equal(t, []uint64{7}, eventIDs(readyNow(s)))
	publishTypeN(t, b, "e", 1)
	assert.Equal(t, 0, b.Stats().CatchUp.Behind, "handed over by #8")
	assert.Equal(t, []uint64{8}, eventIDs(readyNow(s)))
}

func TestCatchUpFilterDuringCatchUp(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 8, OverflowPolicy: OverflowCatchUp})
	s := subscribe(t, b, SubscribeOptions{Types: []string{"a.*"}})
	var want []uint64
	for i := range 2000 {
		typ := "b"
		if i%3 == 0 {
			typ = "a.x"
		}
		if id := publishType(t, b, typ).ID(); typ == "a.x" {
			want = append(want, id)
		}
	}
	assert.Equal(t, 8, s.q.counts().liveCount, "filtered-out events never count")
	fs := drainReady(t, s)
	requireIDs(t, want, eventIDs(fs), "exactly the matching events, in order")
	for _, f := range fs {
		if f.ID() != 0 {
			assert.Equal(t, "a.x", f.Type())
		}
	}
	// 2000 ring entries, two thirds filtered out: a step examines at most
	// maxCatchUpScan of them under the lock, and no batch comes back empty
	// while the subscriber is behind.
	assert.Equal(t, uint64(len(want)-8), b.Stats().CatchUp.Served)
}

func TestCatchUpFilterMatchingNothingInTheRingCatchesUp(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 4, OverflowPolicy: OverflowCatchUp})
	s := subscribe(t, b, SubscribeOptions{Types: []string{"a"}})
	publishTypeN(t, b, "a", 5) // behind at #5
	publishTypeN(t, b, "b", 3000)
	fs := drainReady(t, s)
	assert.Equal(t, seqIDs(1, 5), eventIDs(fs))
	publishType(t, b, "a")
	assert.Equal(t, 0, b.Stats().CatchUp.Behind, "3000 filtered-out entries read, then handed over by #3006")
	assert.Equal(t, []uint64{3006}, eventIDs(readyNow(s)))
}

func TestCatchUpSignalsWhileBehind(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 4, OverflowPolicy: OverflowCatchUp})
	s := subscribe(t, b, SubscribeOptions{})
	publishTypeN(t, b, "e", 5) // #1..#4 queued, behind at #5
	require.NoError(t, b.Signal("doc.changed", "7"))
	st := b.Stats()
	assert.Equal(t, uint64(1), st.Dropped.CatchUpSignals, "the caps are full: dropped, counted")

	fs := readyNow(s) // #1..#4
	assert.Equal(t, seqIDs(1, 4), eventIDs(fs))
	// Its queue is empty now, the caps take signals again; a second one
	// about the same resource coalesces with it.
	require.NoError(t, b.Signal("doc.changed", "7"))
	require.NoError(t, b.Signal("doc.changed", "7"))
	assert.Equal(t, uint64(1), b.Stats().Dropped.Coalesced)
	fs = drainReady(t, s)
	assert.Equal(t, []string{"sig:doc.changed/7", "#5"}, describe(fs),
		"a signal the caps take goes live, ahead of the ring events published before it")
	assert.Equal(t, uint64(1), b.Stats().Dropped.CatchUpSignals)
}

func TestCatchUpRejectedSignalPutsSubscriberBehindAtTheNextID(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 2, OverflowPolicy: OverflowCatchUp})
	s := subscribe(t, b, SubscribeOptions{})
	publishTypeN(t, b, "e", 2)
	require.NoError(t, b.Signal("s", "x")) // rejected: behind at #3, nothing missed yet
	assert.Equal(t, CatchUpStats{Entered: 1, Behind: 1}, b.Stats().CatchUp)
	assert.Equal(t, uint64(1), b.Stats().Dropped.CatchUpSignals)
	publishTypeN(t, b, "e", 3)
	assert.Equal(t, seqIDs(1, 5), eventIDs(drainReady(t, s)))
}

func TestCatchUpHandOverUnderConcurrentPublishers(t *testing.T) {
	// Four publishers; consumers with tiny caps that pause at random, so
	// they fall behind and catch up over and over. Every consumer must see
	// every id exactly once, in increasing order: the hand-over from the
	// ring to the live fan-out has no gap and no duplicate.
	const publishers, perPublisher, consumers = 4, 3000, 4
	b := newBus(t, Options{MaxQueued: 8, RingSize: publishers * perPublisher, MaxSubscribers: 16, OverflowPolicy: OverflowCatchUp})
	var wg sync.WaitGroup
	results := make([][]uint64, consumers)
	got := make([]atomic.Uint64, consumers) // events seen, for the end
	for c := range consumers {
		s := subscribe(t, b, SubscribeOptions{})
		iter := c%2 == 0
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			pause := func() {
				if rng.IntN(64) == 0 {
					time.Sleep(time.Duration(rng.IntN(300)) * time.Microsecond)
				}
			}
			if iter {
				for f := range s.Events() {
					if f.ID() != 0 {
						results[c] = append(results[c], f.ID())
						got[c].Add(1)
					}
					pause()
				}
				return
			}
			for {
				fs, open := s.AppendReady(nil)
				results[c] = append(results[c], eventIDs(fs)...)
				got[c].Add(uint64(len(eventIDs(fs))))
				if !open {
					return
				}
				if len(fs) == 0 {
					<-s.Ready()
				}
				pause()
			}
		})
	}
	var pubs sync.WaitGroup
	for range publishers {
		pubs.Go(func() {
			for range perPublisher {
				if _, err := b.Publish(Event{Type: "e"}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	pubs.Wait()
	total := uint64(publishers * perPublisher)
	// Close once every consumer has everything: a Close while one is still
	// behind would end it with a resync instead.
	require.Eventually(t, func() bool {
		for c := range got {
			if got[c].Load() < total {
				return false
			}
		}
		return true
	}, 30*time.Second, time.Millisecond)
	require.NoError(t, b.Close())
	wg.Wait()
	for c, ids := range results {
		requireIDs(t, seqIDs(1, total), ids, "consumer %d", c)
	}
	st := b.Stats()
	assert.Equal(t, EvictionStats{}, st.Evictions)
	assert.Zero(t, st.Resyncs.RingEvicted, "the ring held everything")
	assert.Positive(t, st.CatchUp.Entered, "the consumers did fall behind")
	t.Logf("catch-ups %d, frames served from the ring %d of %d delivered", st.CatchUp.Entered, st.CatchUp.Served, st.FramesDelivered)
}

func TestCatchUpStalledConsumerIsEvictedAfterTheBoundAndHeldNoMoreThanItsCaps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{MaxQueued: 16, MaxQueuedBytes: 4096, OverflowPolicy: OverflowCatchUp,
			CatchUpStallTimeout: 10 * time.Second, Now: time.Now})
		s := subscribe(t, b, SubscribeOptions{})
		healthy := subscribe(t, b, SubscribeOptions{})
		var got []uint64
		start := time.Now()
		// A publish every 10 ms; the stalled one never reads.
		for i := 0; ; i++ {
			publishType(t, b, "e")
			got = append(got, eventIDs(readyNow(healthy))...)
			c := s.q.counts()
			require.LessOrEqual(t, c.liveCount, 16)
			require.LessOrEqual(t, c.liveBytes, 4096)
			if s.Err() != nil {
				break
			}
			require.LessOrEqual(t, s.q.len(), 17, "16 events and the warning")
			require.Less(t, i, 2000)
			time.Sleep(10 * time.Millisecond)
		}
		elapsed := time.Since(start)
		// It fell behind at the 17th publish (160 ms); the first publish
		// more than 10 s later evicts it.
		assert.Equal(t, 10*time.Second+170*time.Millisecond, elapsed)
		assert.ErrorIs(t, s.Err(), ErrEvicted)
		fs := readyNow(s)
		assert.Equal(t, seqIDs(1, 16), eventIDs(fs), "what was queued, then the terminal frame")
		last := fs[len(fs)-1]
		assert.Equal(t, TypeClientEvicted, last.Type())
		assert.JSONEq(t, fmt.Sprintf(`{"reason":"catch_up_stalled","droppedAfter":17,"queueSize":16,"maxQueued":16,"queuedBytes":%d,"maxQueuedBytes":4096}`,
			sumSizes(fs[:len(fs)-1])-sumSizes(ofType(fs, TypeSlowClientWarning))), dataOf(t, last))
		st := b.Stats()
		assert.Equal(t, uint64(1), st.Evictions.CatchUpStalled)
		assert.Equal(t, 0, st.CatchUp.Behind)
		assert.Equal(t, 1, b.SubscriberCount())
		requireIDs(t, seqIDs(1, uint64(len(got))), got, "the healthy one got everything meanwhile")
	})
}

func TestCatchUpSlowButReadingConsumerIsNotEvicted(t *testing.T) {
	// Progress is a take: a consumer that takes a batch every 5 s with a 10
	// s bound stays, however far behind it is.
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{MaxQueued: 4, OverflowPolicy: OverflowCatchUp, CatchUpStallTimeout: 10 * time.Second, Now: time.Now})
		s := subscribe(t, b, SubscribeOptions{})
		var got []uint64
		for range 12 {
			publishTypeN(t, b, "e", 50)
			got = append(got, eventIDs(readyNow(s))...)
			time.Sleep(5 * time.Second)
		}
		assert.NoError(t, s.Err())
		got = append(got, eventIDs(drainReady(t, s))...)
		requireIDs(t, seqIDs(1, 600), got)
	})
}

func TestCatchUpSubscribeAtTheLimitSweepsAStalledSubscriber(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{MaxQueued: 4, MaxSubscribers: 1, OverflowPolicy: OverflowCatchUp,
			CatchUpStallTimeout: 10 * time.Second, Now: time.Now})
		stalled := subscribe(t, b, SubscribeOptions{})
		publishTypeN(t, b, "e", 10) // behind; then the bus is quiet
		_, err := b.Subscribe(context.Background(), SubscribeOptions{})
		require.ErrorIs(t, err, ErrSubscriberLimitExceeded, "not stalled long enough yet")
		time.Sleep(10*time.Second + time.Millisecond)
		s, err := b.Subscribe(context.Background(), SubscribeOptions{})
		require.NoError(t, err, "the stalled one freed its slot")
		t.Cleanup(s.Close)
		assert.ErrorIs(t, stalled.Err(), ErrEvicted)
		fs := readyNow(stalled)
		assert.Equal(t, TypeClientEvicted, fs[len(fs)-1].Type())
		assert.Contains(t, dataOf(t, fs[len(fs)-1]), `"reason":"catch_up_stalled","droppedAfter":5`)
		assert.Equal(t, uint64(1), b.Stats().Evictions.CatchUpStalled)
	})
}

func TestCatchUpStallTimeoutOptions(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, time.Microsecond} {
		_, err := New(Options{CatchUpStallTimeout: d})
		assert.ErrorIs(t, err, ErrInvalidOption, "%s", d)
		b := newBus(t, Options{})
		_, err = b.Subscribe(context.Background(), SubscribeOptions{CatchUpStallTimeout: d})
		assert.ErrorIs(t, err, ErrInvalidOption, "%s", d)
	}
	synctest.Test(t, func(t *testing.T) {
		// The subscription's bound overrides the bus's.
		b := newBus(t, Options{MaxQueued: 2, OverflowPolicy: OverflowCatchUp, Now: time.Now})
		s := subscribe(t, b, SubscribeOptions{CatchUpStallTimeout: time.Second})
		publishTypeN(t, b, "e", 3)
		time.Sleep(time.Second + time.Millisecond)
		publishType(t, b, "e")
		assert.ErrorIs(t, s.Err(), ErrEvicted)
		b2 := newBus(t, Options{MaxQueued: 2, OverflowPolicy: OverflowCatchUp, Now: time.Now})
		s2 := subscribe(t, b2, SubscribeOptions{})
		publishTypeN(t, b2, "e", 3)
		time.Sleep(DefaultCatchUpStallTimeout)
		publishType(t, b2, "e")
		assert.NoError(t, s2.Err(), "the default is 30 s, and not past it")
		time.Sleep(time.Millisecond)
		publishType(t, b2, "e")
		assert.ErrorIs(t, s2.Err(), ErrEvicted)
	})
}

func TestCatchUpPerSubscriptionPolicy(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 4}) // the bus evicts
	evict := subscribe(t, b, SubscribeOptions{})
	catchUp := subscribe(t, b, SubscribeOptions{OverflowPolicy: OverflowCatchUp})
	publishTypeN(t, b, "e", 10)
	assert.ErrorIs(t, evict.Err(), ErrEvicted)
	assert.NoError(t, catchUp.Err())
	assert.Equal(t, seqIDs(1, 10), eventIDs(drainReady(t, catchUp)))
}

func TestCatchUpBusCloseWhileBehindAnnouncesWhatItDidNotGet(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 4, OverflowPolicy: OverflowCatchUp})
	s := subscribe(t, b, SubscribeOptions{})
	publishTypeN(t, b, "e", 10) // behind at #5
	require.NoError(t, b.Close())
	fs, open := s.AppendReady(nil)
	assert.False(t, open)
	assert.Equal(t, seqOf(idRange(1, 3), TypeSlowClientWarning, "#4", TypeStateResyncRequired), describe(fs),
		"what was queued, then the ids it did not get (the ring is gone), then the end")
	assert.JSONEq(t, fmt.Sprintf(`{"reason":"ring_evicted","lastDeliveredId":4,"earliestAvailableId":11,"epoch":%q}`, b.Epoch()),
		dataOf(t, fs[len(fs)-1]))
	st := b.Stats()
	assert.Equal(t, uint64(1), st.Resyncs.RingEvicted)
	assert.Equal(t, 0, st.CatchUp.Behind)
	assert.NoError(t, s.Err())
}

func TestCatchUpCancelWhileBehind(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 4, OverflowPolicy: OverflowCatchUp})
	s := subscribe(t, b, SubscribeOptions{})
	publishTypeN(t, b, "e", 10)
	s.Close()
	fs, open := s.AppendReady(nil)
	assert.False(t, open)
	assert.Empty(t, fs)
	st := b.Stats()
	assert.Equal(t, 0, st.CatchUp.Behind)
	assert.Equal(t, 0, b.SubscriberCount())
	assert.Equal(t, uint64(5), st.Dropped.Cancelled, "the 4 queued events and the warning")
	publishTypeN(t, b, "e", 1) // nothing reaches it, nothing breaks
}

func TestCatchUpOverHTTPSlowClientGetsEverything(t *testing.T) {
	// The handler takes its batches through the same path: a client that
	// is not reading while 3000 events of 2 KB go out (more than the
	// socket buffers hold, so the handler blocks in its write and its queue
	// of 16 fills), gets every one of them.
	e := newEnv(t, envOptions{})
	b := e.bus(t, "s", Options{MaxQueued: 16, OverflowPolicy: OverflowCatchUp})
	c := e.stream(t, "/session/s/events", nil)
	for range 3000 {
		_, err := b.Publish(Event{Type: "e", Data: strings.Repeat("x", 2000)})
		require.NoError(t, err)
	}
	for want := uint64(1); want <= 3000; {
		ev := c.nextEvent()
		if ev.Type != "e" {
			require.Equal(t, TypeSlowClientWarning, ev.Type)
			continue
		}
		require.Equal(t, strconv.FormatUint(want, 10), ev.ID)
		want++
	}
	st := b.Stats()
	assert.Equal(t, EvictionStats{}, st.Evictions)
	assert.Positive(t, st.CatchUp.Entered)
	t.Logf("catch-ups %d, served from the ring %d", st.CatchUp.Entered, st.CatchUp.Served)
}

func TestCatchUpConsumerWaitingAtTheNewestIsWokenByTheNextPublish(t *testing.T) {
	// A consumer behind that has read up to the newest id waits; the next
	// publish must reach it (from the ring or, handed over, live) whatever
	// the interleaving, with no later publish to wake it. Two races this
	// caught: the bus storing its last id after its fan-out (the consumer
	// loads it after declaring itself waiting, the fan-out looks for
	// waiting consumers: one must see the other); and a hand-over whose
	// push the caps reject because the consumer had reserved them for a
	// read the hand-over cut short: the subscriber falls behind again, and
	// its consumer, waiting, must be woken; and a take that found the queue
	// empty while the caps were full of a batch the consumer held, the
	// subscriber falling behind meanwhile: after declaring itself waiting
	// the take must look whether it is behind. Many rounds of a burst that
	// puts it behind, each of whose last event it must get.
	b := newBus(t, Options{MaxQueued: 1, OverflowPolicy: OverflowCatchUp})
	s := subscribe(t, b, SubscribeOptions{})
	var got atomic.Uint64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for f := range s.Events() {
			if f.ID() != 0 {
				got.Store(f.ID())
			}
		}
	}()
	rounds := pick(500, 3000, 3000)
	for range rounds {
		last := publishTypeN(t, b, "e", 1+rand.IntN(3))
		deadline := time.Now().Add(10 * time.Second)
		for got.Load() != last {
			if time.Now().After(deadline) {
				t.Fatalf("the consumer has %d, the last event is %d, and no publish comes to wake it", got.Load(), last)
			}
			runtime.Gosched()
		}
	}
	s.Close()
	<-done
}
