package eventbus

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Overflow policy (SPEC 11).

func TestOverflowResyncDropsLiveFramesKeepsForcedAndQueuesResync(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16, OverflowPolicy: OverflowResync})
	s := subscribe(t, b, SubscribeOptions{})
	pubN11(t, b, "e", 3)
	require.Equal(t, coreIDs(1, 3), coreDescribe(readyNow(s))) // the consumer dequeued up to #3

	pubN11(t, b, "e", 16) // #4..#19: the queue is full, a warning sits after #15
	require.Equal(t, 16, s.q.counts().liveCount)
	require.Equal(t, 17, s.q.len())

	f := pub11(t, b, "e") // #20 is rejected
	assert.Equal(t, 1, b.SubscriberCount(), "the subscriber stays")
	assert.NoError(t, s.Err())
	assert.Equal(t, queueCounts{1, 16, f.Size(), DefaultMaxQueuedBytes}, s.q.counts(),
		"only the rejected event is live now")

	fs := readyNow(s)
	assert.Equal(t, []string{TypeStateResyncRequired, "#20"}, coreDescribe(fs),
		"the live frames #4..#19 are dropped, and so is the warning the resync supersedes")
	assert.JSONEq(t, fmt.Sprintf(`{"reason":"queue_overflow","lastDeliveredId":3,"earliestAvailableId":20,"epoch":%q}`, b.Epoch()),
		coreData(t, fs[0]))
	assert.False(t, fs[0].Terminal())

	st := b.Stats()
	assert.Equal(t, uint64(1), st.Warnings)
	assert.Equal(t, uint64(16), st.Dropped.Overflow, "the 16 live frames (the superseded warning is no loss)")
	assert.Equal(t, uint64(1), st.Resyncs.QueueOverflow)
	assert.Zero(t, st.Resyncs.QueueBytesOverflow)
	assert.Equal(t, EvictionStats{}, st.Evictions)

	pub11(t, b, "e")
	assert.Equal(t, []string{"#21"}, coreDescribe(readyNow(s)), "and keeps receiving")
}

func TestOverflowResyncKeepsUnconsumedReplay(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16, OverflowPolicy: OverflowResync})
	pubN11(t, b, "e", 3)
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 0})
	pubN11(t, b, "e", 17) // #4..#19 live, #20 rejected

	fs := readyNow(s)
	assert.Equal(t, coreSeq(coreIDs(1, 3), TypeReplayComplete, TypeStateResyncRequired, "#20"), coreDescribe(fs),
		"replayed (forced) frames survive the drop")
	// lastDeliveredId is the last id the consumer dequeued (SPEC 11): none
	// yet, although #1..#3 sit before the resync frame in the queue.
	assert.JSONEq(t, fmt.Sprintf(`{"reason":"queue_overflow","lastDeliveredId":0,"earliestAvailableId":20,"epoch":%q}`, b.Epoch()),
		coreData(t, fs[4]))
	assert.Equal(t, uint64(16), b.Stats().Dropped.Overflow)
}

func TestOverflowResyncBytesVariantReason(t *testing.T) {
	b := newBus(t, Options{MaxQueuedBytes: 1000, OverflowPolicy: OverflowResync})
	s := subscribe(t, b, SubscribeOptions{})
	pubSized11(t, b, "e", 100)
	pubSized11(t, b, "e", 100)
	require.Equal(t, coreIDs(1, 2), coreDescribe(readyNow(s)))
	for range 10 { // #3..#12: 1000 live bytes, the warning after #10 (800 >= 750)
		pubSized11(t, b, "e", 100)
	}
	pubSized11(t, b, "e", 100) // #13: 1000+100 > 1000, rejected

	assert.Equal(t, 1, b.SubscriberCount())
	fs := readyNow(s)
	assert.Equal(t, []string{TypeStateResyncRequired, "#13"}, coreDescribe(fs))
	assert.JSONEq(t, fmt.Sprintf(`{"reason":"queue_bytes_overflow","lastDeliveredId":2,"earliestAvailableId":13,"epoch":%q}`, b.Epoch()),
		coreData(t, fs[0]))
	st := b.Stats()
	assert.Equal(t, uint64(1), st.Warnings)
	assert.Equal(t, uint64(10), st.Dropped.Overflow)
	assert.Equal(t, uint64(1), st.Resyncs.QueueBytesOverflow)
	assert.Zero(t, st.Resyncs.QueueOverflow)
}

func TestOverflowResyncOfARejectedSignal(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16, OverflowPolicy: OverflowResync})
	s := subscribe(t, b, SubscribeOptions{})
	pubN11(t, b, "e", 16)
	sig11(t, b, "x", "a") // rejected: a signal has no id, what is available starts at the next one
	pub11(t, b, "e")      // #17
	sig11(t, b, "x", "a") // coalesced with the queued one

	fs := readyNow(s)
	assert.Equal(t, []string{TypeStateResyncRequired, "sig:x/a", "#17"}, coreDescribe(fs))
	assert.JSONEq(t, fmt.Sprintf(`{"reason":"queue_overflow","lastDeliveredId":0,"earliestAvailableId":17,"epoch":%q}`, b.Epoch()),
		coreData(t, fs[0]))
	st := b.Stats()
	assert.Equal(t, uint64(16), st.Dropped.Overflow)
	assert.Equal(t, uint64(1), st.Dropped.Coalesced)
}

func TestOverflowResyncRearmsTheWarning(t *testing.T) {
	clk := newFakeClock(testStamp)
	b := newBus(t, Options{MaxQueued: 16, OverflowPolicy: OverflowResync, Now: clk.now})
	s := subscribe(t, b, SubscribeOptions{})
	pubN11(t, b, "e", 17) // warning after #12, resync at #17
	clk.advance(time.Minute)
	pubN11(t, b, "e", 11) // #18..#28: live count 1+11 = 12 -> a new warning
	fs := readyNow(s)
	// The first warning was superseded by the resync; the second episode
	// warns again.
	assert.Len(t, coreOfType(fs, TypeSlowClientWarning), 1)
	assert.Equal(t, uint64(2), b.Stats().Warnings)
	w := coreOfType(fs, TypeSlowClientWarning)[0]
	assert.Contains(t, coreData(t, w), `"queueSize":12,"maxQueued":16,"lastEventId":28`)
}

func TestOverflowResyncMemoryStaysWithinCapsUnderLongRun(t *testing.T) {
	const maxQueued, maxBytes = 16, 3500
	clk := newFakeClock(testStamp)
	b := newBus(t, Options{MaxQueued: maxQueued, MaxQueuedBytes: maxBytes, OverflowPolicy: OverflowResync, Now: clk.now})
	s := subscribe(t, b, SubscribeOptions{}) // stalled: never reads
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20_000 {
		// More than half the window between publishes: at most two
		// overflows per OverflowWindow, so the subscriber is never evicted.
		clk.advance(31 * time.Second)
		if i%7 == 0 {
			sig11(t, b, "s", strconv.Itoa(rng.IntN(30)))
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

// overflow11 publishes events until the subscriber's next overflow (or
// eviction) and returns the id of the rejected one.
func overflow11(t testing.TB, b *EventBus, s *Subscription) uint64 {
	t.Helper()
	before := b.Stats()
	for range 10_000 {
		id := pub11(t, b, "e").ID()
		st := b.Stats()
		if st.Resyncs != before.Resyncs || st.Evictions != before.Evictions {
			return id
		}
	}
	t.Fatal("no overflow")
	return 0
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
		fs := coreCollect(s)
		last := fs[len(fs)-1]
		assert.True(t, last.Terminal())
		assert.Equal(t, TypeClientEvicted, last.Type())
		assert.JSONEq(t, fmt.Sprintf(`{"reason":"repeated_overflow","droppedAfter":49,"queueSize":16,"maxQueued":16,"queuedBytes":%d,"maxQueuedBytes":%d}`,
			s11SumLive(fs), DefaultMaxQueuedBytes), coreData(t, last))
		// Each resync dropped every live frame before it (#1..#16, then
		// #17..#32); the evicted subscriber drains the third episode's.
		// Each resync superseded the markers before it: only the last
		// resync frame is left ahead of the third episode.
		assert.Equal(t, coreSeq(TypeStateResyncRequired,
			coreIDs(33, 44), TypeSlowClientWarning, coreIDs(45, 48), TypeClientEvicted),
			coreDescribe(fs))

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
			published = pub11(t, b, "e").ID()
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
		pubN11(t, b, "e", 17)
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
		pubN11(t, b, "e", 17)
		assert.NoError(t, resync.Err())
		assert.ErrorIs(t, inherit.Err(), ErrEvicted)
		assert.Equal(t, 1, b.SubscriberCount())
		assert.Equal(t, []string{TypeStateResyncRequired, "#17"}, coreDescribe(readyNow(resync)))
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
	pubN11(t, b, "e", 17)
	assert.Equal(t, 0, b.SubscriberCount())
	fs := coreCollect(s)
	assert.Equal(t, TypeClientEvicted, fs[len(fs)-1].Type())
	assert.Contains(t, coreData(t, fs[len(fs)-1]), `"reason":"queue_overflow","droppedAfter":17`)
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

func TestNearlyFullAtNinetyPercentOfEitherCap(t *testing.T) {
	c := func(live, bytes int) queueCounts {
		return queueCounts{liveCount: live, maxQueued: 100, liveBytes: bytes, maxBytes: 1000}
	}
	assert.False(t, nearlyFull(c(89, 899)))
	assert.True(t, nearlyFull(c(90, 0)), "frames")
	assert.True(t, nearlyFull(c(1, 900)), "bytes")
}
