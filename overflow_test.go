package eventbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Overflow policies and the resync policy (SPEC 3.4, 3.5).

func TestOverflowResyncDropsLiveFramesKeepsForcedAndQueuesResync(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16, OverflowPolicy: OverflowResync})
	s := subscribe(t, b, SubscribeOptions{})
	publishTypeN(t, b, "e", 3)
	require.Equal(t, idRange(1, 3), describe(readyNow(s))) // the consumer dequeued up to #3

	publishTypeN(t, b, "e", 16) // #4..#19: the queue is full, a warning sits after #15
	require.Equal(t, 16, s.q.counts().liveCount)
	require.Equal(t, 17, s.q.len())

	f := publishType(t, b, "e") // #20 is rejected
	assert.Equal(t, 1, b.SubscriberCount(), "the subscriber stays")
	assert.NoError(t, s.Err())
	assert.Equal(t, queueCounts{1, 16, f.Size(), DefaultMaxQueuedBytes}, s.q.counts(),
		"only the rejected event is live now")

	fs := readyNow(s)
	assert.Equal(t, []string{TypeStateResyncRequired, "#20"}, describe(fs),
		"the live frames #4..#19 are dropped, and so is the warning the resync supersedes")
	assert.JSONEq(t, fmt.Sprintf(`{"reason":"queue_overflow","lastDeliveredId":3,"earliestAvailableId":20,"epoch":%q}`, b.Epoch()),
		dataOf(t, fs[0]))
	assert.False(t, fs[0].Terminal())

	st := b.Stats()
	assert.Equal(t, uint64(1), st.Warnings)
	assert.Equal(t, uint64(16), st.Dropped.Overflow, "the 16 live frames (the superseded warning is no loss)")
	assert.Equal(t, uint64(1), st.Resyncs.QueueOverflow)
	assert.Zero(t, st.Resyncs.QueueBytesOverflow)
	assert.Equal(t, EvictionStats{}, st.Evictions)

	publishType(t, b, "e")
	assert.Equal(t, []string{"#21"}, describe(readyNow(s)), "and keeps receiving")
}

func TestOverflowResyncKeepsUnconsumedReplay(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16, OverflowPolicy: OverflowResync})
	publishTypeN(t, b, "e", 3)
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 0})
	publishTypeN(t, b, "e", 17) // #4..#19 live, #20 rejected

	fs := readyNow(s)
	assert.Equal(t, seqOf(idRange(1, 3), TypeReplayComplete, TypeStateResyncRequired, "#20"), describe(fs),
		"replayed (forced) frames survive the drop")
	// lastDeliveredId is the last id the consumer dequeued (SPEC 3.5): none
	// yet, although #1..#3 sit before the resync frame in the queue.
	assert.JSONEq(t, fmt.Sprintf(`{"reason":"queue_overflow","lastDeliveredId":0,"earliestAvailableId":20,"epoch":%q}`, b.Epoch()),
		dataOf(t, fs[4]))
	assert.Equal(t, uint64(16), b.Stats().Dropped.Overflow)
}

func TestOverflowResyncBytesVariantReason(t *testing.T) {
	b := newBus(t, Options{MaxQueuedBytes: 1000, OverflowPolicy: OverflowResync})
	s := subscribe(t, b, SubscribeOptions{})
	publishSized(t, b, "e", 100)
	publishSized(t, b, "e", 100)
	require.Equal(t, idRange(1, 2), describe(readyNow(s)))
	for range 10 { // #3..#12: 1000 live bytes, the warning after #10 (800 >= 750)
		publishSized(t, b, "e", 100)
	}
	publishSized(t, b, "e", 100) // #13: 1000+100 > 1000, rejected

	assert.Equal(t, 1, b.SubscriberCount())
	fs := readyNow(s)
	assert.Equal(t, []string{TypeStateResyncRequired, "#13"}, describe(fs))
	assert.JSONEq(t, fmt.Sprintf(`{"reason":"queue_bytes_overflow","lastDeliveredId":2,"earliestAvailableId":13,"epoch":%q}`, b.Epoch()),
		dataOf(t, fs[0]))
	st := b.Stats()
	assert.Equal(t, uint64(1), st.Warnings)
	assert.Equal(t, uint64(10), st.Dropped.Overflow)
	assert.Equal(t, uint64(1), st.Resyncs.QueueBytesOverflow)
	assert.Zero(t, st.Resyncs.QueueOverflow)
}

func TestOverflowResyncOfARejectedSignal(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16, OverflowPolicy: OverflowResync})
	s := subscribe(t, b, SubscribeOptions{})
	publishTypeN(t, b, "e", 16)
	sendSignal(t, b, "x", "a") // rejected: a signal has no id, what is available starts at the next one
	publishType(t, b, "e")     // #17
	sendSignal(t, b, "x", "a") // coalesced with the queued one

	fs := readyNow(s)
	assert.Equal(t, []string{TypeStateResyncRequired, "sig:x/a", "#17"}, describe(fs))
	assert.JSONEq(t, fmt.Sprintf(`{"reason":"queue_overflow","lastDeliveredId":0,"earliestAvailableId":17,"epoch":%q}`, b.Epoch()),
		dataOf(t, fs[0]))
	st := b.Stats()
	assert.Equal(t, uint64(16), st.Dropped.Overflow)
	assert.Equal(t, uint64(1), st.Dropped.Coalesced)
}

func TestOverflowResyncRearmsTheWarning(t *testing.T) {
	clk := newFakeClock(testStamp)
	b := newBus(t, Options{MaxQueued: 16, OverflowPolicy: OverflowResync, Now: clk.now})
	s := subscribe(t, b, SubscribeOptions{})
	publishTypeN(t, b, "e", 17) // warning after #12, resync at #17
	clk.advance(time.Minute)
	publishTypeN(t, b, "e", 11) // #18..#28: live count 1+11 = 12 -> a new warning
	fs := readyNow(s)
	// The first warning was superseded by the resync; the second episode
	// warns again.
	assert.Len(t, ofType(fs, TypeSlowClientWarning), 1)
	assert.Equal(t, uint64(2), b.Stats().Warnings)
	w := ofType(fs, TypeSlowClientWarning)[0]
	assert.Contains(t, dataOf(t, w), `"queueSize":12,"maxQueued":16,"lastEventId":28`)
}

func TestOverflowResyncMemoryStaysWithinCapsUnderLongRun(t *testing.T) {
	const maxQueued, maxBytes = 16, 3500
	clk := newFakeClock(testStamp)
	b := newBus(t, Options{MaxQueued: maxQueued, MaxQueuedBytes: maxBytes, OverflowPolicy: OverflowResync, Now: clk.now})
	s := subscribe(t, b, SubscribeOptions{}) // stalled: never reads
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range pick(5_000, 20_000, 20_000) {
		// More than half the window between publishes: at most two
		// overflows per OverflowWindow, so the subscriber is never evicted.
		clk.advance(31 * time.Second)
		if i%7 == 0 {
			sendSignal(t, b, "s", strconv.Itoa(rng.IntN(30)))
		} else {
			_, err := b.Publish(Event{Type: "e", Data: strings.Repeat("x", rng.IntN(300))})
			require.NoError(t, err)
		}
		c := s.q.counts()
		require.LessOrEqual(t, c.liveCount, maxQueued, "publish %d", i)
		require.LessOrEqual(t, c.liveBytes, maxBytes, "publish %d", i)
	}
	st := b.Stats()
	assert.Equal(t, 1, b.SubscriberCount())
	assert.Equal(t, EvictionStats{}, st.Evictions)
	assert.Positive(t, st.Resyncs.QueueOverflow)
	assert.Positive(t, st.Resyncs.QueueBytesOverflow)

	// Exact accounting: every live push that was not a coalescing
	// replacement is either still queued or was dropped by a resync.
	c := s.q.counts()
	assert.Equal(t, st.Published+st.Signals-st.Dropped.Coalesced-uint64(c.liveCount), st.Dropped.Overflow)
	markersQueued := s.q.len() - c.liveCount
	// The forced frames do not pile up: a resync supersedes the markers
	// before it, so at most the last resync and one warning stay queued.
	assert.LessOrEqual(t, markersQueued, 2)
}

func TestOverflowResyncThirdOverflowWithinWindowEvicts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Options.Now is nil: the bus reads time.Now, which the bubble fakes.
		b, err := New(Options{MaxQueued: 16, OverflowPolicy: OverflowResync, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		defer b.Close()
		s := subscribe(t, b, SubscribeOptions{})

		assert.Equal(t, uint64(17), overflow11(t, b, s))
		time.Sleep(30 * time.Second)
		assert.Equal(t, uint64(33), overflow11(t, b, s))
		require.Equal(t, 1, b.SubscriberCount())
		time.Sleep(29 * time.Second) // 59 s after the first
		assert.Equal(t, uint64(49), overflow11(t, b, s))

		assert.Equal(t, 0, b.SubscriberCount())
		assert.ErrorIs(t, s.Err(), ErrEvicted)
		assert.Contains(t, s.Err().Error(), ReasonRepeatedOverflow)
		fs := collectEvents(s)
		last := fs[len(fs)-1]
		assert.True(t, last.Terminal())
		assert.Equal(t, TypeClientEvicted, last.Type())
		assert.JSONEq(t, fmt.Sprintf(`{"reason":"repeated_overflow","droppedAfter":49,"queueSize":16,"maxQueued":16,"queuedBytes":%d,"maxQueuedBytes":%d}`,
			s11SumLive(fs), DefaultMaxQueuedBytes), dataOf(t, last))
		// Each resync dropped every live frame before it (#1..#16, then
		// #17..#32); the evicted subscriber drains the third episode's.
		// Each resync superseded the markers before it: only the last
		// resync frame is left ahead of the third episode.
		assert.Equal(t, seqOf(TypeStateResyncRequired,
			idRange(33, 44), TypeSlowClientWarning, idRange(45, 48), TypeClientEvicted),
			describe(fs))

		st := b.Stats()
		assert.Equal(t, uint64(2), st.Resyncs.QueueOverflow)
		assert.Equal(t, EvictionStats{RepeatedOverflow: 1}, st.Evictions)
		assert.Equal(t, uint64(16+16), st.Dropped.Overflow)
	})
}

// s11SumLive sums the sizes of the live frames (events) of the last
// episode of TestOverflowResyncThirdOverflowWithinWindowEvicts: those after
// the last resync frame.
func s11SumLive(fs []Frame) int {
	n := 0
	for _, f := range fs {
		switch {
		case f.Type() == TypeStateResyncRequired:
			n = 0
		case f.ID() != 0:
			n += f.Size()
		}
	}
	return n
}

func TestOverflowResyncWindowWithFakeClockAtUnixEpoch(t *testing.T) {
	// A fake clock may well start at Unix time 0: an overflow at 0 ms must
	// count like any other.
	clk := newFakeClock(0)
	b := newBus(t, Options{MaxQueued: 16, OverflowPolicy: OverflowResync, Now: clk.now})
	s := subscribe(t, b, SubscribeOptions{})
	overflow11(t, b, s)
	clk.advance(10 * time.Second)
	overflow11(t, b, s)
	clk.advance(10 * time.Second)
	overflow11(t, b, s)
	assert.Equal(t, 0, b.SubscriberCount())
	assert.Equal(t, uint64(1), b.Stats().Evictions.RepeatedOverflow)
	assert.ErrorIs(t, s.Err(), ErrEvicted)
}

func TestOverflowResyncSpreadOverMoreThanWindowDoesNotEvict(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := New(Options{MaxQueued: 16, OverflowPolicy: OverflowResync, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		defer b.Close()
		s := subscribe(t, b, SubscribeOptions{})
		for i := range 6 {
			if i > 0 {
				time.Sleep(31 * time.Second) // any three overflows span 62 s
			}
			overflow11(t, b, s)
			require.Equal(t, 1, b.SubscriberCount(), "overflow %d", i+1)
		}
		st := b.Stats()
		assert.Equal(t, uint64(6), st.Resyncs.QueueOverflow)
		assert.Equal(t, EvictionStats{}, st.Evictions)
		assert.NoError(t, s.Err())
	})
}

func TestOverflowResyncDroppedCountsExactlyTheDroppedFrames(t *testing.T) {
	clk := newFakeClock(testStamp)
	b := newBus(t, Options{MaxQueued: 16, OverflowPolicy: OverflowResync, Now: clk.now})
	s := subscribe(t, b, SubscribeOptions{})
	rng := rand.New(rand.NewPCG(3, 4))
	received := map[uint64]bool{}
	var published uint64
	for range 200 {
		clk.advance(31 * time.Second)
		// At most 16 publishes per round: at most one overflow per round,
		// so never three within OverflowWindow.
		for range rng.IntN(17) {
			published = publishType(t, b, "e").ID()
		}
		if rng.IntN(4) == 0 {
			for _, f := range readyNow(s) {
				if f.ID() != 0 {
					require.False(t, received[f.ID()], "duplicate #%d", f.ID())
					received[f.ID()] = true
				}
			}
		}
	}
	for _, f := range readyNow(s) {
		if f.ID() != 0 {
			received[f.ID()] = true
		}
	}
	st := b.Stats()
	require.Positive(t, st.Resyncs.QueueOverflow)
	assert.Equal(t, published-uint64(len(received)), st.Dropped.Overflow,
		"every event the consumer never saw was counted as dropped, and nothing else")
	assert.Equal(t, EvictionStats{}, st.Evictions)
}

func TestOverflowPolicyPerSubscriptionOverridesBus(t *testing.T) {
	t.Run("bus resync, subscription evict", func(t *testing.T) {
		b := newBus(t, Options{MaxQueued: 16, OverflowPolicy: OverflowResync})
		evict := subscribe(t, b, SubscribeOptions{OverflowPolicy: OverflowEvict})
		inherit := subscribe(t, b, SubscribeOptions{})
		publishTypeN(t, b, "e", 17)
		assert.ErrorIs(t, evict.Err(), ErrEvicted)
		assert.NoError(t, inherit.Err())
		assert.Equal(t, 1, b.SubscriberCount())
		st := b.Stats()
		assert.Equal(t, uint64(1), st.Evictions.QueueOverflow)
		assert.Equal(t, uint64(1), st.Resyncs.QueueOverflow)
	})
	t.Run("bus evict, subscription resync", func(t *testing.T) {
		b := newBus(t, Options{MaxQueued: 16})
		resync := subscribe(t, b, SubscribeOptions{OverflowPolicy: OverflowResync})
		inherit := subscribe(t, b, SubscribeOptions{})
		publishTypeN(t, b, "e", 17)
		assert.NoError(t, resync.Err())
		assert.ErrorIs(t, inherit.Err(), ErrEvicted)
		assert.Equal(t, 1, b.SubscriberCount())
		assert.Equal(t, []string{TypeStateResyncRequired, "#17"}, describe(readyNow(resync)))
	})
}

func TestOverflowPolicyInvalidValueIsAnError(t *testing.T) {
	for _, p := range []OverflowPolicy{OverflowCatchUp + 1, 255} {
		b, err := New(Options{OverflowPolicy: p})
		assert.ErrorIs(t, err, ErrInvalidOption, "policy %d", p)
		assert.Nil(t, b)
	}
	b := newBus(t, Options{})
	for _, p := range []OverflowPolicy{OverflowCatchUp + 1, 255} {
		s, err := b.Subscribe(t.Context(), SubscribeOptions{OverflowPolicy: p})
		assert.ErrorIs(t, err, ErrInvalidOption, "policy %d", p)
		assert.Nil(t, s)
	}
	assert.Equal(t, 0, b.SubscriberCount())
	assert.Equal(t, 0, b.Stats().PeakSubscribers)
}

func TestOverflowPolicyDefaultIsEvict(t *testing.T) {
	b, err := New(Options{})
	require.NoError(t, err)
	assert.Equal(t, OverflowEvict, b.opts.OverflowPolicy)
	require.NoError(t, b.Close())

	b = newBus(t, Options{MaxQueued: 16})
	s := subscribe(t, b, SubscribeOptions{})
	assert.Equal(t, OverflowEvict, s.policy)
	publishTypeN(t, b, "e", 17)
	assert.Equal(t, 0, b.SubscriberCount())
	fs := collectEvents(s)
	assert.Equal(t, TypeClientEvicted, fs[len(fs)-1].Type())
	assert.Contains(t, dataOf(t, fs[len(fs)-1]), `"reason":"queue_overflow","droppedAfter":17`)
	assert.Zero(t, b.Stats().Dropped.Overflow)
}

// The publisher yields for a subscriber past the warning threshold (so a
// consumer that was woken but not scheduled can run before it overflows),
// but only once for a subscription nobody has read from yet: that one may
// not be running at all, and yielding for it on every publish until its
// eviction would make its peers' publish latency depend on it.
func TestPublishYieldsOnlyForConsumersThatRun(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 64})
	s, err := b.Subscribe(t.Context(), SubscribeOptions{})
	require.NoError(t, err)
	defer s.Close()
	yield := func(live int) bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return s.yieldFor(queueCounts{liveCount: live, maxQueued: 64, maxBytes: 1 << 20})
	}

	assert.False(t, yield(47), "below 75%: no yield")
	assert.True(t, yield(48), "one yield, in case its consumer just was not scheduled yet")
	for _, live := range []int{49, 63} {
		require.False(t, yield(live), "live %d: nobody has read from it", live)
	}
	// The consumer looks once, even finding nothing: it runs.
	out, open := s.AppendReady(nil)
	require.Empty(t, out)
	require.True(t, open)
	assert.False(t, yield(47), "below 75%: no yield")
	assert.True(t, yield(48), "at 75% of MaxQueued")
	assert.True(t, yield(63))

	// Through Publish and Events as well.
	s2, err := b.Subscribe(t.Context(), SubscribeOptions{})
	require.NoError(t, err)
	_, err = b.Publish(Event{Type: "e"})
	require.NoError(t, err)
	assert.False(t, s2.q.looked.Load())
	for range s2.Events() {
		break
	}
	assert.True(t, s2.q.looked.Load())
}

// Past 90% the publisher yields until the consumer is back under 90%, or
// maxUrgentYields more times for one that does not drain; below 90% once.
func TestPublishYieldsPastNinetyPercentUntilTheConsumerDrains(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 100})
	s, err := b.Subscribe(t.Context(), SubscribeOptions{})
	require.NoError(t, err)
	defer s.Close()
	_, _ = s.AppendReady(nil) // its consumer runs
	yields := 0
	drainAfter := -1 // the consumer drains at this yield; -1: never
	defer func(f func()) { yieldProcessor = f }(yieldProcessor)
	yieldProcessor = func() {
		yields++
		if yields == drainAfter {
			_, _ = s.AppendReady(nil)
		}
	}
	publish := func(n int) {
		t.Helper()
		for range n {
			_, err := b.Publish(Event{Type: "e"})
			require.NoError(t, err)
		}
	}

	publish(74)
	assert.Zero(t, yields, "below 75%")
	publish(1)
	assert.Equal(t, 1, yields, "at 75%: one yield")
	publish(14)
	assert.Equal(t, 15, yields, "one per publish up to 89%")
	yields = 0
	publish(1)
	assert.Equal(t, 1+maxUrgentYields, yields, "at 90%, for a consumer that does not drain")

	// It drains at the third yield: the publisher stops yielding there.
	yields, drainAfter = 0, 3
	publish(1)
	assert.Equal(t, 3, yields)
	assert.Zero(t, s.q.counts().liveCount)
	assert.NoError(t, s.Err())
}

// An unread subscription that one event takes past 90% at once (large
// events against the byte cap) is worth the one yield of an unread
// subscription, not the wait past 90%: it used to cost 17 yields, and 200
// such subscriptions reconnecting cost their peers that on every cycle
// (issue 22).
func TestPublishYieldsOnceForAnUnreadSubscriptionPastNinetyPercent(t *testing.T) {
	ev := Event{Type: "e", Data: strings.Repeat("x", 400)}
	f, err := newBus(t, Options{}).Publish(ev)
	require.NoError(t, err)
	// Two such frames fill 95% of the byte cap.
	b := newBus(t, Options{MaxQueuedBytes: 2 * f.Size() * 20 / 19})
	s := subscribe(t, b, SubscribeOptions{})
	yields := 0
	defer func(f func()) { yieldProcessor = f }(yieldProcessor)
	yieldProcessor = func() { yields++ }

	_, err = b.Publish(ev)
	require.NoError(t, err)
	assert.Zero(t, yields, "below 75%")
	_, err = b.Publish(ev)
	require.NoError(t, err)
	require.GreaterOrEqual(t, s.q.counts().liveBytes*10, 9000, "the second event takes it past 90%")
	assert.Equal(t, 1, yields, "one yield for a subscription nobody read from")
	_, err = b.Publish(ev)
	require.NoError(t, err)
	assert.Equal(t, 1, yields, "evicted: no yield")
	assert.ErrorIs(t, s.Err(), ErrEvicted)

	// One that was read from gets the wait past 90% (16 more yields when
	// it does not drain).
	s2 := subscribe(t, b, SubscribeOptions{})
	_, _ = s2.AppendReady(nil)
	yields = 0
	for range 2 {
		_, err = b.Publish(ev)
		require.NoError(t, err)
	}
	assert.Equal(t, 1+maxUrgentYields, yields)
}

// The yields of one publish past 90% stop once they have lasted
// maxYieldTime: a yield lasts as long as the goroutines that run in its
// place, and 17 of them while many goroutines are runnable took tens of
// milliseconds (issue 22).
func TestPublishYieldsForAtMostMaxYieldTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{MaxQueued: 100})
		s := subscribe(t, b, SubscribeOptions{})
		_, _ = s.AppendReady(nil) // its consumer runs
		yields := 0
		defer func(f func()) { yieldProcessor = f }(yieldProcessor)
		yieldProcessor = func() {
			yields++
			time.Sleep(100 * time.Microsecond) // others run meanwhile
		}
		for range 89 {
			_, err := b.Publish(Event{Type: "e"})
			require.NoError(t, err)
		}
		yields = 0
		start := time.Now()
		_, err := b.Publish(Event{Type: "e"})
		require.NoError(t, err)
		assert.Equal(t, int(maxYieldTime/(100*time.Microsecond)), yields, "no yield starts after maxYieldTime")
		assert.Equal(t, maxYieldTime, time.Since(start))
		assert.NoError(t, s.Err())
	})
}

// Subscribers evicted by the same publish with the same numbers share one
// client_evicted frame and one error, and warnings with the same numbers
// share one frame; each still says what its own queue held.
func TestEvictionsAndWarningsShareTheirFrames(t *testing.T) {
	logs := &logCapture{}
	b := newBus(t, logs.capture(Options{MaxQueued: 4, MaxSubscribers: 8}))
	var subs []*Subscription
	for range 3 {
		subs = append(subs, subscribe(t, b, SubscribeOptions{}))
	}
	other := subscribe(t, b, SubscribeOptions{MaxQueued: 8}) // other numbers
	for range 5 {
		_, err := b.Publish(Event{Type: "e"})
		require.NoError(t, err)
	}
	var warnings, terms []*frame
	for _, s := range subs {
		require.ErrorIs(t, s.Err(), ErrEvicted)
		assert.Equal(t, "eventbus: subscriber evicted: queue_overflow", s.Err().Error())
		fs := collectEvents(s)
		assert.Equal(t, seqOf(idRange(1, 3), TypeSlowClientWarning, "#4", TypeClientEvicted), describe(fs))
		warnings = append(warnings, fs[3].ref())
		terms = append(terms, fs[len(fs)-1].ref())
		assert.Contains(t, dataOf(t, fs[3]), `{"queueSize":3,"maxQueued":4,"lastEventId":3,`)
		assert.Contains(t, dataOf(t, fs[len(fs)-1]), `"reason":"queue_overflow","droppedAfter":5,"queueSize":4,"maxQueued":4`)
	}
	for i := 1; i < len(subs); i++ {
		assert.Same(t, warnings[0], warnings[i], "one warning frame for the same numbers")
		assert.Same(t, terms[0], terms[i], "one client_evicted frame for the same numbers")
		assert.Same(t, subs[0].Err(), subs[i].Err())
	}
	assert.NoError(t, other.Err())
	for range 4 {
		_, err := b.Publish(Event{Type: "e"})
		require.NoError(t, err)
	}
	require.ErrorIs(t, other.Err(), ErrEvicted)
	fs := collectEvents(other)
	assert.Contains(t, dataOf(t, fs[len(fs)-1]), `"droppedAfter":9,"queueSize":8,"maxQueued":8`)
	assert.NotSame(t, terms[0], fs[len(fs)-1].ref())
	assert.Len(t, logs.kind(DiagSlowClient), 4)
	assert.Len(t, logs.kind(DiagEvicted), 4)
	assert.Equal(t, uint64(4), b.Stats().Evictions.QueueOverflow)
}

func TestNearlyFullAtNinetyPercentOfEitherCap(t *testing.T) {
	c := func(live, bytes int) queueCounts {
		return queueCounts{liveCount: live, maxQueued: 100, liveBytes: bytes, maxBytes: 1000}
	}
	assert.False(t, nearlyFull(c(89, 899)))
	assert.True(t, nearlyFull(c(90, 0)), "frames")
	assert.True(t, nearlyFull(c(1, 900)), "bytes")
}

// ---------------------------------------------------------------------------
// The warning (SPEC 3.2).

func TestWarningAtThreeQuartersOfMaxQueued(t *testing.T) {
	buf := &logCapture{}
	logger := buf.logger()
	b := newBus(t, Options{Logger: logger})
	s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	live := publishNumbered(t, b, 11)
	assert.Equal(t, 11, s.q.len(), "no warning below 12")
	live = append(live, publishNumbered(t, b, 1)...)
	assert.Equal(t, 13, s.q.len(), "the warning is queued right after #12")
	fs, _ := s.AppendReady(nil)
	require.Equal(t, seqOf(idRange(1, 12), TypeSlowClientWarning), describe(fs))
	w := fs[12]
	assert.False(t, w.Terminal())
	assert.Equal(t, uint64(0), w.ID())
	assert.Equal(t,
		fmt.Sprintf(`{"queueSize":12,"maxQueued":16,"lastEventId":12,"queuedBytes":%d,"maxQueuedBytes":2097152,"threshold":"frames"}`, sumSizes(live)),
		dataOf(t, w))
	assert.Contains(t, string(w.JSON()), `"_meta":{"serverTimestamp":1719000000000}`)
	assert.Contains(t, buf.String(), "slow client")

	// Ratios are floats, not rounded: 0.75*10 = 7.5, so the warning comes at 8.
	s10 := subscribe(t, b, SubscribeOptions{MaxQueued: 10})
	publishNumbered(t, b, 7)
	assert.Equal(t, 7, s10.q.len())
	publishNumbered(t, b, 1)
	assert.Equal(t, 9, s10.q.len())
}

func TestWarningOncePerEpisode(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	publishNumbered(t, b, 16)
	fs, open := s.AppendReady(nil)
	assert.True(t, open)
	assert.Equal(t, seqOf(idRange(1, 12), TypeSlowClientWarning, idRange(13, 16)), describe(fs))
}

func TestWarningRearmsOnlyWhenFramesAndBytesAtOrBelowResetRatio(t *testing.T) {
	// MaxQueued 16: warn at 12, re-arm at <= 6 frames. MaxQueuedBytes 8000:
	// warn at 6000, re-arm at <= 3000 bytes. Small events are ~80 bytes.
	setup := func(t *testing.T) (*EventBus, *Subscription) {
		b := newBus(t, Options{MaxQueuedBytes: 8000})
		s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
		publishNumbered(t, b, 12)
		require.Equal(t, 13, s.q.len(), "12 live frames and the first warning")
		return b, s
	}
	warnings := func(s *Subscription) int {
		fs, _ := s.AppendReady(nil)
		return len(ofType(fs, TypeSlowClientWarning))
	}

	t.Run("frames above reset", func(t *testing.T) {
		b, s := setup(t)
		popN(t, s, 6) // 6 left
		publishNumbered(t, b, 1)
		assert.Equal(t, 7, s.q.counts().liveCount)
		publishNumbered(t, b, 5) // back at 12
		assert.Equal(t, 1, warnings(s), "7 > 6 frames: still the same episode")
	})
	t.Run("frames at reset", func(t *testing.T) {
		b, s := setup(t)
		popN(t, s, 7) // 5 left
		publishNumbered(t, b, 1)
		assert.Equal(t, 6, s.q.counts().liveCount)
		publishNumbered(t, b, 6) // back at 12
		assert.Equal(t, 2, warnings(s), "6 <= 6 frames and few bytes: re-armed")
	})
	t.Run("bytes above reset", func(t *testing.T) {
		b, s := setup(t)
		popN(t, s, 12)
		publishSized(t, b, "t", 3001) // 1 frame, 3001 bytes: frames low, bytes high
		publishNumbered(t, b, 11)     // 12 frames, well under 6000 bytes
		assert.Equal(t, 12, s.q.counts().liveCount)
		assert.Less(t, s.q.counts().liveBytes, 6000)
		assert.Equal(t, 1, warnings(s), "3001 > 3000 bytes: not re-armed")
	})
	t.Run("bytes at reset", func(t *testing.T) {
		b, s := setup(t)
		popN(t, s, 12)
		publishSized(t, b, "t", 3000)
		publishNumbered(t, b, 11)
		assert.Equal(t, 2, warnings(s), "3000 <= 3000 bytes and 1 frame: re-armed")
	})
}

// popN pops n entries, whatever they are, one by one.
func popN(t *testing.T, s *Subscription, n int) {
	t.Helper()
	for range n {
		_, st := s.q.pop()
		require.Equal(t, popOK, st)
	}
}

func warnedLocked(b *EventBus, s *Subscription) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return s.warned
}

func TestWarningRearmIsEvaluatedOnlyOnPublish(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	publishNumbered(t, b, 12)
	fs, _ := s.AppendReady(nil) // drained to empty
	require.Equal(t, seqOf(idRange(1, 12), TypeSlowClientWarning), describe(fs))
	assert.True(t, warnedLocked(b, s), "a dequeue never re-arms by itself")

	publishNumbered(t, b, 1)
	assert.False(t, warnedLocked(b, s), "the next publish re-arms")
	live := publishNumbered(t, b, 11)
	fs, _ = s.AppendReady(nil)
	require.Equal(t, seqOf(idRange(13, 24), TypeSlowClientWarning), describe(fs))
	assert.Contains(t, dataOf(t, fs[12]), fmt.Sprintf(`"queueSize":12,"maxQueued":16,"lastEventId":24,"queuedBytes":%d,`, fs[0].Size()+sumSizes(live)))
}

func TestWarningThresholdFrames(t *testing.T) {
	b := newBus(t, Options{MaxQueuedBytes: 1 << 20})
	s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	publishNumbered(t, b, 12)
	fs, _ := s.AppendReady(nil)
	require.Len(t, fs, 13)
	assert.Contains(t, dataOf(t, fs[12]), `"threshold":"frames"`)
}

func TestWarningThresholdBytes(t *testing.T) {
	// MaxQueuedBytes 4000: warn at 3000 bytes.
	b := newBus(t, Options{MaxQueuedBytes: 4000})
	s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	publishSized(t, b, "t", 1000)
	publishSized(t, b, "t", 1000)
	publishSized(t, b, "t", 999)
	assert.Equal(t, 3, s.q.len(), "2999 bytes: no warning")

	s2 := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	publishSized(t, b, "t", 1000)
	publishSized(t, b, "t", 1000)
	publishSized(t, b, "t", 1000)
	fs, _ := s2.AppendReady(nil)
	require.Equal(t, seqOf(idRange(4, 6), TypeSlowClientWarning), describe(fs))
	assert.Equal(t, `{"queueSize":3,"maxQueued":16,"lastEventId":6,"queuedBytes":3000,"maxQueuedBytes":4000,"threshold":"bytes"}`, dataOf(t, fs[3]))
}

func TestWarningThresholdFramesAndBytes(t *testing.T) {
	b := newBus(t, Options{MaxQueuedBytes: 4000})
	s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	for range 11 {
		publishSized(t, b, "t", 250)
	}
	assert.Equal(t, 11, s.q.len(), "11 frames, 2750 bytes: no warning")
	publishSized(t, b, "t", 250)
	fs, _ := s.AppendReady(nil)
	require.Equal(t, seqOf(idRange(1, 12), TypeSlowClientWarning), describe(fs))
	assert.Equal(t, `{"queueSize":12,"maxQueued":16,"lastEventId":12,"queuedBytes":3000,"maxQueuedBytes":4000,"threshold":"frames_and_bytes"}`, dataOf(t, fs[12]))
}

func TestForcedFramesDoNotSkewLiveCount(t *testing.T) {
	b := newBus(t, Options{})
	publishNumbered(t, b, 10)
	s := subscribe(t, b, SubscribeOptions{Resume: true, MaxQueued: 16})
	require.Equal(t, 11, s.q.len(), "10 replayed + replay_complete, all forced")
	publishNumbered(t, b, 11)
	assert.Equal(t, 11, s.q.counts().liveCount)
	assert.Equal(t, 22, s.q.len(), "no warning at 11 live frames")
	live := publishNumbered(t, b, 1)
	c := s.q.counts()
	assert.Equal(t, 12, c.liveCount)
	assert.Equal(t, 24, s.q.len(), "warning at 12 live frames")
	// The warning at the tail is forced too: 4 more fit, the 5th evicts.
	publishNumbered(t, b, 4)
	assert.Equal(t, 16, s.q.counts().liveCount)
	assert.NoError(t, s.Err())
	publishNumbered(t, b, 1)
	require.ErrorIs(t, s.Err(), ErrEvicted)
	fs, _ := s.AppendReady(nil)
	require.Equal(t, seqOf(idRange(1, 10), TypeReplayComplete, idRange(11, 22), TypeSlowClientWarning, idRange(23, 26), TypeClientEvicted), describe(fs))
	assert.Contains(t, dataOf(t, fs[23]), `"queueSize":12,"maxQueued":16,"lastEventId":22,`)
	assert.Contains(t, dataOf(t, fs[len(fs)-1]), `"droppedAfter":27,"queueSize":16,"maxQueued":16,`)
	_ = live
}

// ---------------------------------------------------------------------------
// Eviction (SPEC 3.3).

func TestEvictionOnFrameCap(t *testing.T) {
	buf := &logCapture{}
	logger := buf.logger()
	b := newBus(t, Options{Logger: logger})
	s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	live := publishNumbered(t, b, 16)
	assert.NoError(t, s.Err())
	publishNumbered(t, b, 1)
	fs, open := s.AppendReady(nil)
	assert.False(t, open)
	require.Equal(t, seqOf(idRange(1, 12), TypeSlowClientWarning, idRange(13, 16), TypeClientEvicted), describe(fs))
	ev := fs[len(fs)-1]
	assert.True(t, ev.Terminal())
	assert.Equal(t, uint64(0), ev.ID())
	assert.Equal(t,
		fmt.Sprintf(`{"reason":"queue_overflow","droppedAfter":17,"queueSize":16,"maxQueued":16,"queuedBytes":%d,"maxQueuedBytes":2097152}`, sumSizes(live)),
		dataOf(t, ev))
	assert.Contains(t, string(ev.JSON()), `"_meta":{"serverTimestamp":1719000000000}`)
	assert.Contains(t, buf.String(), "subscriber evicted")
	assert.Contains(t, buf.String(), `"reason":"queue_overflow"`)
}

func TestEvictionOnByteCap(t *testing.T) {
	b := newBus(t, Options{MaxQueuedBytes: 4000})
	s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	publishSized(t, b, "t", 1000)
	publishSized(t, b, "t", 1000)
	publishSized(t, b, "t", 2500)
	fs, open := s.AppendReady(nil)
	assert.False(t, open)
	require.Equal(t, []string{"#1", "#2", TypeClientEvicted}, describe(fs))
	assert.Equal(t,
		`{"reason":"queue_bytes_overflow","droppedAfter":3,"queueSize":2,"maxQueued":16,"queuedBytes":2000,"maxQueuedBytes":4000,"eventBytes":2500}`,
		dataOf(t, fs[2]))
	assert.ErrorIs(t, s.Err(), ErrEvicted)
	assert.Contains(t, s.Err().Error(), ReasonQueueBytesOverflow)
}

func TestEvictedConsumerGetsQueuedFramesThenTerminalThenEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
		gate := make(chan struct{})
		var got []Frame
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			for f := range s.Events() {
				got = append(got, f)
				if len(got) == 1 {
					<-gate // a slow consumer
				}
			}
		}()
		publishNumbered(t, b, 1)
		synctest.Wait() // the consumer holds #1 and stalls
		publishNumbered(t, b, 17)
		require.ErrorIs(t, s.Err(), ErrEvicted)
		close(gate)
		<-ended
		assert.Equal(t, seqOf(idRange(1, 13), TypeSlowClientWarning, idRange(14, 17), TypeClientEvicted), describe(got))
	})
}

func TestEvictedErrWrapsErrEvicted(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	assert.NoError(t, s.Err())
	publishNumbered(t, b, 17)
	err := s.Err()
	require.ErrorIs(t, err, ErrEvicted)
	assert.Contains(t, err.Error(), ReasonQueueOverflow)
	s.Close() // a later Close does not change why it ended
	assert.ErrorIs(t, s.Err(), ErrEvicted)
}

func TestEvictionDecrementsSubscriberCount(t *testing.T) {
	b := newBus(t, Options{})
	subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	subscribe(t, b, SubscribeOptions{MaxQueued: 100})
	assert.Equal(t, 2, b.SubscriberCount())
	publishNumbered(t, b, 17)
	assert.Equal(t, 1, b.SubscriberCount())
	b.mu.Lock()
	assert.Len(t, b.subs, 1)
	b.mu.Unlock()
}

func TestEvictionStopsWatchingContext(t *testing.T) {
	ctx := newWatchCtx()
	b := newBus(t, Options{})
	s, err := b.Subscribe(ctx, SubscribeOptions{MaxQueued: 16})
	require.NoError(t, err)
	assert.Equal(t, 1, ctx.watchers())
	publishNumbered(t, b, 17)
	require.ErrorIs(t, s.Err(), ErrEvicted)
	assert.Equal(t, 0, ctx.watchers(), "the evicted subscriber's context is no longer watched")

	// With a real context: cancelling it after the eviction changes nothing,
	// the consumer still gets the queued frames and the terminal one.
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		ctx, cancel := context.WithCancel(context.Background())
		s, err := b.Subscribe(ctx, SubscribeOptions{MaxQueued: 16})
		require.NoError(t, err)
		publishNumbered(t, b, 17)
		cancel()
		synctest.Wait()
		assert.ErrorIs(t, s.Err(), ErrEvicted)
		fs, open := s.AppendReady(nil)
		assert.False(t, open)
		assert.Equal(t, seqOf(idRange(1, 12), TypeSlowClientWarning, idRange(13, 16), TypeClientEvicted), describe(fs))
	})
}

func TestEvictionDoesNotAffectSiblings(t *testing.T) {
	b := newBus(t, Options{})
	before := subscribe(t, b, SubscribeOptions{MaxQueued: 2048})
	slow := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	slow2 := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	fast := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	after := subscribe(t, b, SubscribeOptions{MaxQueued: 2048})
	var fastGot []Frame
	for range 100 {
		publishNumbered(t, b, 1)
		fs, _ := fast.AppendReady(nil)
		fastGot = append(fastGot, fs...)
	}
	assert.ErrorIs(t, slow.Err(), ErrEvicted)
	assert.ErrorIs(t, slow2.Err(), ErrEvicted, "two evictions in one publish")
	assert.Equal(t, 3, b.SubscriberCount())
	assert.Equal(t, idRange(1, 100), describe(fastGot))
	for _, s := range []*Subscription{before, after} {
		fs, open := s.AppendReady(nil)
		assert.True(t, open)
		assert.Equal(t, idRange(1, 100), describe(fs))
	}
	b.mu.Lock()
	assert.Equal(t, []*Subscription{before, fast, after}, b.subs, "subscription order kept")
	b.mu.Unlock()
}

// The TypeScript daemon's numbers (SPEC's preamble, 1.3, 3.2, 3.3). A byte is
// a byte of the event's JSON envelope: Buffer.byteLength(JSON.stringify(event),
// 'utf8') in the TypeScript daemon, what follows "data: " on the wire here. These
// are its queue scenarios with their exact numbers: session_update events
// whose envelopes have a known length, small byte caps, and the frames
// each push produces, with the warning's and the eviction's counts in
// that unit and its thresholds at 0.75 and 0.375 of the caps, unrounded.

// sessionUpdate publishes the next session_update event with an envelope
// of exactly size bytes (its data a string of x's, one fewer for each
// further digit of its id) and checks the envelope literally.
func sessionUpdate(t *testing.T, b *EventBus, size int) Frame {
	t.Helper()
	id := b.LastEventID() + 1
	data := strings.Repeat("x", size-89-len(strconv.FormatUint(id, 10)))
	want := `{"id":` + strconv.FormatUint(id, 10) + `,"v":1,"type":"session_update","data":"` + data + `","_meta":{"serverTimestamp":1719000000000}}`
	require.Len(t, want, size)
	f := publishEvent(t, b, Event{Type: "session_update", Data: data})
	require.Equal(t, want, string(f.JSON()))
	require.Equal(t, size, f.Size())
	return f
}

// wantWarning and wantEvicted are the envelopes of slow_client_warning and
// client_evicted with the given data, stamped by newBus's clock.
func wantWarning(data string) string {
	return `{"v":1,"type":"slow_client_warning","data":` + data + `,"_meta":{"serverTimestamp":1719000000000}}`
}

func wantEvicted(data string) string {
	return `{"v":1,"type":"client_evicted","data":` + data + `,"_meta":{"serverTimestamp":1719000000000}}`
}

// Envelopes of one size pushed to a subscriber that never reads: each
// accepted push counts its envelope, the push that reaches 0.75 of a cap
// warns, and the first one a cap rejects evicts with the counts before it.
//
//   - maxQueuedBytes 1000, envelopes of 100 bytes: the 8th push (800 >=
//     750) warns, the 10th fills the cap exactly and is accepted, the 11th
//     (1100 > 1000) evicts;
//   - the thresholds are floats: maxQueuedBytes 1001 warns at 750.75, so
//     six envelopes of 125 bytes (750) do not warn and the seventh does;
//     maxQueued 17 warns at 12.75 frames, so the 13th frame does.
func TestOriginalWarningAndEvictionNumbers(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		maxBytes, maxQueued    int
		size, quiet, more      int // envelope size, pushes without a warning, pushes after them
		want                   []string
		warning, evicted       int // their indexes in want
		warningJSON, evictJSON string
	}{
		{"byte cap", 1000, 256, 100, 7, 4,
			seqOf(idRange(1, 8), TypeSlowClientWarning, idRange(9, 10), TypeClientEvicted), 8, 11,
			`{"queueSize":8,"maxQueued":256,"lastEventId":8,"queuedBytes":800,"maxQueuedBytes":1000,"threshold":"bytes"}`,
			`{"reason":"queue_bytes_overflow","droppedAfter":11,"queueSize":10,"maxQueued":256,"queuedBytes":1000,"maxQueuedBytes":1000,"eventBytes":100}`},
		{"byte threshold 750.75", 1001, 256, 125, 6, 3,
			seqOf(idRange(1, 7), TypeSlowClientWarning, idRange(8, 8), TypeClientEvicted), 7, 9,
			`{"queueSize":7,"maxQueued":256,"lastEventId":7,"queuedBytes":875,"maxQueuedBytes":1001,"threshold":"bytes"}`,
			`{"reason":"queue_bytes_overflow","droppedAfter":9,"queueSize":8,"maxQueued":256,"queuedBytes":1000,"maxQueuedBytes":1001,"eventBytes":125}`},
		{"frame threshold 12.75", DefaultMaxQueuedBytes, 17, 100, 12, 6,
			seqOf(idRange(1, 13), TypeSlowClientWarning, idRange(14, 17), TypeClientEvicted), 13, 18,
			`{"queueSize":13,"maxQueued":17,"lastEventId":13,"queuedBytes":1300,"maxQueuedBytes":2097152,"threshold":"frames"}`,
			`{"reason":"queue_overflow","droppedAfter":18,"queueSize":17,"maxQueued":17,"queuedBytes":1700,"maxQueuedBytes":2097152}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBus(t, Options{MaxQueuedBytes: tc.maxBytes})
			s := subscribe(t, b, SubscribeOptions{MaxQueued: tc.maxQueued})
			for i := 1; i < tc.quiet+tc.more; i++ {
				sessionUpdate(t, b, tc.size)
				require.Equal(t, queueCounts{i, tc.maxQueued, tc.size * i, tc.maxBytes}, s.q.counts(), "push %d", i)
				if i == tc.quiet {
					require.Equal(t, tc.quiet, s.q.len(), "no warning yet")
				}
			}
			require.NoError(t, s.Err())
			sessionUpdate(t, b, tc.size)
			fs, open := s.AppendReady(nil)
			require.False(t, open)
			require.Equal(t, tc.want, describe(fs))
			assert.Equal(t, wantWarning(tc.warningJSON), string(fs[tc.warning].JSON()))
			assert.Equal(t, wantEvicted(tc.evictJSON), string(fs[tc.evicted].JSON()))
		})
	}
}

// One warning per episode: maxQueuedBytes 1000 warns at 750 and re-arms at
// 375 bytes or less (and 96 frames or less) after a push. With envelopes of
// 125 bytes the 6th push warns; a consumer that takes four leaves 250, the
// next push makes 375 and re-arms, so the 10th warns again; one that takes
// three leaves 375, the next push makes 500, and the episode goes on to
// the eviction without a second warning.
func TestOriginalWarningRearmsAtThreeEighths(t *testing.T) {
	for _, tc := range []struct {
		name      string
		pop       int // frames the consumer takes after the warning
		afterPush int // live bytes after the next push
		more      int // pushes after that one
		open      bool
		want      []string
		last      int    // index of the frame whose envelope is lastJSON
		lastJSON  string // the second warning, or the eviction
	}{
		{"at reset", 4, 375, 3, true,
			seqOf(idRange(5, 6), TypeSlowClientWarning, idRange(7, 10), TypeSlowClientWarning),
			7, wantWarning(`{"queueSize":6,"maxQueued":256,"lastEventId":10,"queuedBytes":750,"maxQueuedBytes":1000,"threshold":"bytes"}`)},
		{"above reset", 3, 500, 5, false,
			seqOf(idRange(4, 6), TypeSlowClientWarning, idRange(7, 11), TypeClientEvicted),
			9, wantEvicted(`{"reason":"queue_bytes_overflow","droppedAfter":12,"queueSize":8,"maxQueued":256,"queuedBytes":1000,"maxQueuedBytes":1000,"eventBytes":125}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBus(t, Options{MaxQueuedBytes: 1000})
			s := subscribe(t, b, SubscribeOptions{})
			for range 6 {
				sessionUpdate(t, b, 125)
			}
			require.Equal(t, 7, s.q.len(), "750 >= 750: warned")
			popN(t, s, tc.pop)
			sessionUpdate(t, b, 125)
			require.Equal(t, tc.afterPush, s.q.counts().liveBytes)
			for range tc.more {
				sessionUpdate(t, b, 125)
			}
			fs, open := s.AppendReady(nil)
			require.Equal(t, tc.open, open)
			require.Equal(t, tc.want, describe(fs))
			first := 6 - tc.pop
			assert.Equal(t, wantWarning(`{"queueSize":6,"maxQueued":256,"lastEventId":6,"queuedBytes":750,"maxQueuedBytes":1000,"threshold":"bytes"}`), string(fs[first].JSON()))
			assert.Equal(t, tc.lastJSON, string(fs[tc.last].JSON()))
		})
	}
}

// A single event larger than the byte cap is accepted when nothing live is
// queued (and warns at once, 300 >= 150); the next live push evicts.
func TestOriginalOversizedEventAloneIsAccepted(t *testing.T) {
	b := newBus(t, Options{MaxQueuedBytes: 200})
	s := subscribe(t, b, SubscribeOptions{})
	sessionUpdate(t, b, 300)
	require.NoError(t, s.Err())
	sessionUpdate(t, b, 100)
	fs, _ := s.AppendReady(nil)
	require.Equal(t, seqOf(idRange(1, 1), TypeSlowClientWarning, TypeClientEvicted), describe(fs))
	assert.Equal(t, wantWarning(`{"queueSize":1,"maxQueued":256,"lastEventId":1,"queuedBytes":300,"maxQueuedBytes":200,"threshold":"bytes"}`), string(fs[1].JSON()))
	assert.Equal(t, wantEvicted(`{"reason":"queue_bytes_overflow","droppedAfter":2,"queueSize":1,"maxQueued":256,"queuedBytes":300,"maxQueuedBytes":200,"eventBytes":100}`), string(fs[2].JSON()))
}

// Replayed frames are forced: 20 replayed envelopes of 100 bytes (2000,
// twice the cap) count 0, so the live pushes after them warn at the 8th
// with 800 queued bytes and nobody is evicted.
func TestOriginalReplayCountsZeroTowardTheByteCap(t *testing.T) {
	b := newBus(t, Options{MaxQueuedBytes: 1000})
	for range 20 {
		sessionUpdate(t, b, 100)
	}
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 0})
	require.Equal(t, queueCounts{0, 256, 0, 1000}, s.q.counts())
	for range 8 {
		sessionUpdate(t, b, 100)
	}
	fs, open := s.AppendReady(nil)
	require.True(t, open)
	require.Equal(t, seqOf(idRange(1, 20), TypeReplayComplete, idRange(21, 28), TypeSlowClientWarning), describe(fs))
	assert.Equal(t, wantWarning(`{"queueSize":8,"maxQueued":256,"lastEventId":28,"queuedBytes":800,"maxQueuedBytes":1000,"threshold":"bytes"}`), string(fs[29].JSON()))
}

// The same numbers on the Handler's wire: a stream whose writer is held at
// its first flush while eleven 100-byte events are published under
// maxQueuedBytes 1000 carries, once let go, events 1..8 (each data: line
// 100 bytes), the warning at 800, events 9 and 10, and client_evicted
// with queuedBytes 1000 and eventBytes 100.
func TestOriginalNumbersOnTheWire(t *testing.T) {
	logs := &logCapture{}
	b := newBus(t, logs.capture(Options{MaxQueuedBytes: 1000}))
	w := newMemWriter()
	reached, release := gateFirstFlush(w)
	defer release()
	cancel, done := serveMem(busHandler(b, logs), w, "/session/s/events", nil)
	defer cancel()
	waitClosed(t, reached, "handler did not reach its first flush")
	var pub []Frame
	for range 11 {
		pub = append(pub, sessionUpdate(t, b, 100))
	}
	release()
	waitClosed(t, done, "the evicted stream did not end")

	recs := parseBody(t, w.state().body)
	require.Len(t, recs, 1+12)
	var got []sseEvent
	for _, r := range recs[1:] {
		got = append(got, r.Event)
	}
	event := func(i int) sseEvent {
		return sseEvent{Type: "session_update", Data: string(pub[i-1].JSON()), ID: strconv.Itoa(i)}
	}
	want := []sseEvent{event(1), event(2), event(3), event(4), event(5), event(6), event(7), event(8),
		wantSynth(TypeSlowClientWarning, `{"queueSize":8,"maxQueued":256,"lastEventId":8,"queuedBytes":800,"maxQueuedBytes":1000,"threshold":"bytes"}`, "8"),
		event(9), event(10),
		wantSynth(TypeClientEvicted, `{"reason":"queue_bytes_overflow","droppedAfter":11,"queueSize":10,"maxQueued":256,"queuedBytes":1000,"maxQueuedBytes":1000,"eventBytes":100}`, "10"),
	}
	require.Equal(t, want, got)
	for i := range 10 {
		require.Len(t, got[i+i/8].Data, 100, "the data: line of event %d", i+1)
	}
	assert.Contains(t, w.state().body, "\ndata: "+wantWarning(`{"queueSize":8,"maxQueued":256,"lastEventId":8,"queuedBytes":800,"maxQueuedBytes":1000,"threshold":"bytes"}`)+"\n\n")
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

// ---------------------------------------------------------------------------
// Memory stays bounded whatever stalled subscribers do.

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
