package eventbus

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ---------------------------------------------------------------------------
// Resume (SPEC 4.1 - 4.4).

func TestResumeWithoutLastIDIsLiveOnly(t *testing.T) {
	b := newBus(t, Options{})
	publishNumbered(t, b, 3)
	s := subscribe(t, b, SubscribeOptions{})
	fs, open := s.AppendReady(nil)
	assert.True(t, open)
	assert.Empty(t, fs, "no replay, no replay_complete")
	publishNumbered(t, b, 1)
	fs, _ = s.AppendReady(nil)
	assert.Equal(t, []string{"#4"}, describe(fs))
}

func TestResumeReplaysContiguousEventsThenReplayComplete(t *testing.T) {
	b := newBus(t, Options{})
	published := publishNumbered(t, b, 5)
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 2})
	publishNumbered(t, b, 1)
	fs, _ := s.AppendReady(nil)
	require.Equal(t, seqOf(idRange(3, 5), TypeReplayComplete, "#6"), describe(fs))
	for i, f := range fs[:3] {
		assert.Equal(t, published[i+2].String(), f.String(), "replayed frames are the published bytes")
	}
	rc := fs[3]
	assert.True(t, rc.Synthetic())
	assert.Equal(t, uint64(0), rc.ID())
	assert.Equal(t, withEpoch(b, `{"replayedCount":3,"lastReplayedEventId":5,"lastEventId":5,"epoch":"EPOCH"}`), dataOf(t, rc))
	assert.Equal(t,
		withEpoch(b, `{"v":1,"type":"replay_complete","data":{"replayedCount":3,"lastReplayedEventId":5,"lastEventId":5,"epoch":"EPOCH"},"_meta":{"serverTimestamp":1719000000000}}`),
		string(rc.JSON()))
}

func TestResumeAtLatestSendsReplayedCountZero(t *testing.T) {
	b := newBus(t, Options{})
	publishNumbered(t, b, 5)
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 5})
	fs, _ := s.AppendReady(nil)
	require.Equal(t, []string{TypeReplayComplete}, describe(fs))
	assert.Equal(t, withEpoch(b, `{"replayedCount":0,"epoch":"EPOCH"}`), dataOf(t, fs[0]))

	// From the start on a bus that has published nothing: the same.
	empty := newBus(t, Options{})
	s = subscribe(t, empty, SubscribeOptions{Resume: true, LastEventID: 0})
	fs, _ = s.AppendReady(nil)
	require.Equal(t, []string{TypeReplayComplete}, describe(fs))
	assert.Equal(t, withEpoch(empty, `{"replayedCount":0,"epoch":"EPOCH"}`), dataOf(t, fs[0]))
}

func TestResumeAfterRingEvictionSendsRingEvictedResync(t *testing.T) {
	b := newBus(t, Options{RingSize: 3})
	publishNumbered(t, b, 10) // the ring holds 8..10
	for _, n := range []uint64{0, 5, 6} {
		s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: n})
		fs, _ := s.AppendReady(nil)
		require.Equal(t, seqOf(TypeStateResyncRequired, idRange(8, 10), TypeReplayComplete), describe(fs), "N=%d", n)
		assert.Equal(t,
			withEpoch(b, fmt.Sprintf(`{"reason":"ring_evicted","lastDeliveredId":%d,"earliestAvailableId":8,"epoch":"EPOCH"}`, n)),
			dataOf(t, fs[0]))
		assert.Equal(t, withEpoch(b, `{"replayedCount":3,"lastReplayedEventId":10,"lastEventId":10,"epoch":"EPOCH"}`), dataOf(t, fs[4]))
		s.Close()
	}
}

func TestResumeAtRingBoundaryDoesNotResync(t *testing.T) {
	b := newBus(t, Options{RingSize: 3})
	publishNumbered(t, b, 10)
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 7}) // N == ring[0].id-1
	fs, _ := s.AppendReady(nil)
	assert.Equal(t, seqOf(idRange(8, 10), TypeReplayComplete), describe(fs))
}

func TestResumeAfterRingMaxBytesEvictionSendsRingEvictedResync(t *testing.T) {
	b := newBus(t, Options{RingMaxBytes: 1000})
	for range 10 {
		publishSized(t, b, "t", 300)
	}
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 3})
	fs, _ := s.AppendReady(nil)
	require.Equal(t, seqOf(TypeStateResyncRequired, idRange(8, 10), TypeReplayComplete), describe(fs))
	assert.Equal(t, withEpoch(b, `{"reason":"ring_evicted","lastDeliveredId":3,"earliestAvailableId":8,"epoch":"EPOCH"}`), dataOf(t, fs[0]))

	s = subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 7})
	fs, _ = s.AppendReady(nil)
	assert.Equal(t, seqOf(idRange(8, 10), TypeReplayComplete), describe(fs))
}

func TestResumeFromLaterEpochSendsEpochReset(t *testing.T) {
	b := newBus(t, Options{})
	publishNumbered(t, b, 5)
	for _, n := range []uint64{6, 7, 1000, math.MaxUint64} { // N >= nextID
		s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: n})
		fs, _ := s.AppendReady(nil)
		require.Equal(t, seqOf(TypeStateResyncRequired, idRange(1, 5), TypeReplayComplete), describe(fs), "N=%d", n)
		assert.Equal(t,
			withEpoch(b, fmt.Sprintf(`{"reason":"epoch_reset","lastDeliveredId":%d,"earliestAvailableId":1,"epoch":"EPOCH"}`, n)),
			dataOf(t, fs[0]))
		assert.Equal(t, withEpoch(b, `{"replayedCount":5,"lastReplayedEventId":5,"lastEventId":5,"epoch":"EPOCH"}`), dataOf(t, fs[6]))
		s.Close()
	}

	// With an evicting ring, earliestAvailableId is the ring's first id and
	// the whole ring is replayed.
	small := newBus(t, Options{RingSize: 3})
	publishNumbered(t, small, 10)
	s := subscribe(t, small, SubscribeOptions{Resume: true, LastEventID: 50})
	fs, _ := s.AppendReady(nil)
	require.Equal(t, seqOf(TypeStateResyncRequired, idRange(8, 10), TypeReplayComplete), describe(fs))
	assert.Equal(t, withEpoch(small, `{"reason":"epoch_reset","lastDeliveredId":50,"earliestAvailableId":8,"epoch":"EPOCH"}`), dataOf(t, fs[0]))
}

func TestResumeAtLastEventIDIsNotEpochReset(t *testing.T) {
	b := newBus(t, Options{})
	publishNumbered(t, b, 5)
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 5}) // N == nextID-1
	publishNumbered(t, b, 1)
	fs, _ := s.AppendReady(nil)
	assert.Equal(t, []string{TypeReplayComplete, "#6"}, describe(fs))
}

func TestResumeEpochResetOnEmptyRingUsesNextID(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 5})
	publishNumbered(t, b, 1)
	fs, _ := s.AppendReady(nil)
	require.Equal(t, []string{TypeStateResyncRequired, TypeReplayComplete, "#1"}, describe(fs))
	assert.Equal(t, withEpoch(b, `{"reason":"epoch_reset","lastDeliveredId":5,"earliestAvailableId":1,"epoch":"EPOCH"}`), dataOf(t, fs[0]))
	assert.Equal(t, withEpoch(b, `{"replayedCount":0,"epoch":"EPOCH"}`), dataOf(t, fs[1]))
}

func TestResumeWithDifferentEpochSendsEpochMismatch(t *testing.T) {
	b := newBus(t, Options{})
	other := newBus(t, Options{})
	publishNumbered(t, b, 5)
	for _, n := range []uint64{0, 3, 5} { // all below nextID
		s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: n, Epoch: other.Epoch()})
		fs, _ := s.AppendReady(nil)
		require.Equal(t, seqOf(TypeStateResyncRequired, idRange(1, 5), TypeReplayComplete), describe(fs), "N=%d", n)
		assert.Equal(t,
			withEpoch(b, fmt.Sprintf(`{"reason":"epoch_reset","detail":"epoch_mismatch","lastDeliveredId":%d,"earliestAvailableId":1,"epoch":"EPOCH"}`, n)),
			dataOf(t, fs[0]))
		s.Close()
	}

	// The bus's own epoch is no mismatch.
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 3, Epoch: b.Epoch()})
	fs, _ := s.AppendReady(nil)
	assert.Equal(t, seqOf(idRange(4, 5), TypeReplayComplete), describe(fs))
}

func TestResumeIgnoresEmptyOrOversizedEpoch(t *testing.T) {
	b := newBus(t, Options{})
	publishNumbered(t, b, 5)
	for _, epoch := range []string{"", strings.Repeat("a", 65), strings.Repeat("z", 1000)} {
		s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 3, Epoch: epoch})
		fs, _ := s.AppendReady(nil)
		assert.Equal(t, seqOf(idRange(4, 5), TypeReplayComplete), describe(fs), "epoch of %d bytes", len(epoch))
		s.Close()
	}
	// 64 bytes is still a presented epoch.
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 3, Epoch: strings.Repeat("a", 64)})
	fs, _ := s.AppendReady(nil)
	require.NotEmpty(t, fs)
	assert.Equal(t, TypeStateResyncRequired, fs[0].Type())
	assert.Contains(t, dataOf(t, fs[0]), `"detail":"epoch_mismatch"`)
}

func TestEpochIgnoredWithoutResume(t *testing.T) {
	b := newBus(t, Options{})
	publishNumbered(t, b, 3)
	s := subscribe(t, b, SubscribeOptions{Epoch: "different", LastEventID: 1})
	publishNumbered(t, b, 1)
	fs, _ := s.AppendReady(nil)
	assert.Equal(t, []string{"#4"}, describe(fs))
}

func TestResumeReplayBudgetExceeded(t *testing.T) {
	b := newBus(t, Options{ReplayBudgetBytes: 900})
	for range 6 {
		publishSized(t, b, "t", 300)
	}
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 1})
	publishNumbered(t, b, 1)
	fs, _ := s.AppendReady(nil)
	// 2, 3, 4 are exactly the budget; 5 would exceed it.
	require.Equal(t, seqOf(idRange(2, 4), TypeStateResyncRequired, TypeReplayComplete, "#7"), describe(fs))
	assert.Equal(t, withEpoch(b, `{"reason":"replay_budget_exceeded","lastDeliveredId":4,"earliestAvailableId":5,"epoch":"EPOCH"}`), dataOf(t, fs[3]))
	assert.Equal(t, withEpoch(b, `{"replayedCount":3,"lastReplayedEventId":4,"lastEventId":4,"epoch":"EPOCH"}`), dataOf(t, fs[4]))

	// Within the budget: no resync.
	s = subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 4})
	fs, _ = s.AppendReady(nil)
	assert.Equal(t, seqOf(idRange(5, 7), TypeReplayComplete), describe(fs), "2*300 + the small #7 fit in 900")
}

func TestResumeReplayBudgetAfterRingEvictedResync(t *testing.T) {
	b := newBus(t, Options{RingSize: 4, ReplayBudgetBytes: 600})
	for range 10 {
		publishSized(t, b, "t", 300)
	}
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 2})
	fs, _ := s.AppendReady(nil)
	require.Equal(t, seqOf(TypeStateResyncRequired, idRange(7, 8), TypeStateResyncRequired, TypeReplayComplete), describe(fs))
	assert.Contains(t, dataOf(t, fs[0]), `"reason":"ring_evicted","lastDeliveredId":2,"earliestAvailableId":7`)
	assert.Contains(t, dataOf(t, fs[3]), `"reason":"replay_budget_exceeded","lastDeliveredId":8,"earliestAvailableId":9`)
}

func TestResumeReplaysFirstFrameEvenAboveBudget(t *testing.T) {
	b := newBus(t, Options{ReplayBudgetBytes: 100})
	publishSized(t, b, "t", 300)
	publishSized(t, b, "t", 300)
	s := subscribe(t, b, SubscribeOptions{Resume: true})
	fs, _ := s.AppendReady(nil)
	require.Equal(t, []string{"#1", TypeStateResyncRequired, TypeReplayComplete}, describe(fs))
	assert.Equal(t, withEpoch(b, `{"reason":"replay_budget_exceeded","lastDeliveredId":1,"earliestAvailableId":2,"epoch":"EPOCH"}`), dataOf(t, fs[1]))
	assert.Equal(t, withEpoch(b, `{"replayedCount":1,"lastReplayedEventId":1,"lastEventId":1,"epoch":"EPOCH"}`), dataOf(t, fs[2]))

	s = subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 1})
	fs, _ = s.AppendReady(nil)
	assert.Equal(t, []string{"#2", TypeReplayComplete}, describe(fs), "a single oversized frame needs no resync")
}

func TestReplayFramesDoNotCountTowardLiveCaps(t *testing.T) {
	b := newBus(t, Options{MaxQueuedBytes: 4096})
	published := publishNumbered(t, b, 1000)
	require.Greater(t, sumSizes(published), 4096)
	s := subscribe(t, b, SubscribeOptions{Resume: true, MaxQueued: 16})
	assert.Equal(t, 1001, s.q.len())
	assert.Equal(t, 0, s.q.counts().liveCount)
	assert.Equal(t, 0, s.q.counts().liveBytes)
	assert.NoError(t, s.Err())
	assert.Equal(t, 1, b.SubscriberCount())
	fs, open := s.AppendReady(nil)
	assert.True(t, open)
	assert.Equal(t, seqOf(idRange(1, 1000), TypeReplayComplete), describe(fs))
}

func TestLivePublishAfterLargeReplayDoesNotEvict(t *testing.T) {
	b := newBus(t, Options{MaxQueuedBytes: 4096})
	publishNumbered(t, b, 1000)
	s := subscribe(t, b, SubscribeOptions{Resume: true, MaxQueued: 16})
	live := publishNumbered(t, b, 12) // nothing consumed: 1001 forced frames still queued
	assert.NoError(t, s.Err())
	assert.Equal(t, 1, b.SubscriberCount())
	c := s.q.counts()
	assert.Equal(t, 12, c.liveCount)
	assert.Equal(t, sumSizes(live), c.liveBytes)
	fs, open := s.AppendReady(nil)
	assert.True(t, open)
	assert.Equal(t, seqOf(idRange(1, 1000), TypeReplayComplete, idRange(1001, 1012), TypeSlowClientWarning), describe(fs))
	assert.Contains(t, dataOf(t, fs[len(fs)-1]), `"queueSize":12,`)
}

func TestResumeUnderConcurrentPublishHasNoGapOrDuplicate(t *testing.T) {
	b := newBus(t, Options{MaxSubscribers: 1000})
	total := pick(500, 2000, 2000)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range total {
			if _, err := b.Publish(Event{Type: "t"}); err != nil {
				panic(err)
			}
		}
	}()
	var subs []*Subscription
	var cursors []uint64
	for range 40 {
		n := b.LastEventID()
		n -= min(n, uint64(len(subs)%7))
		subs = append(subs, subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: n, MaxQueued: 2 * total}))
		cursors = append(cursors, n)
	}
	<-done
	for i, s := range subs {
		fs, _ := s.AppendReady(nil)
		want := cursors[i] + 1
		completes := 0
		for _, f := range fs {
			if f.Type() == TypeReplayComplete {
				completes++
				continue
			}
			require.Equal(t, "t", f.Type(), "subscriber %d: %s", i, f.Type())
			require.Equal(t, want, f.ID(), "subscriber %d resumed after %d", i, cursors[i])
			want++
		}
		assert.Equal(t, 1, completes)
		assert.Equal(t, uint64(total+1), want)
	}
}

// ---------------------------------------------------------------------------
// Allocations.

// A resume replays from the ring with the same allocations for 100 events
// as for 4000: none per replayed event.
func TestResumeAllocationsDoNotGrowWithEvents(t *testing.T) {
	resume := func(events int) float64 {
		b := newBus(t, Options{RingSize: 4000})
		ev := Event{Type: "e", Data: json.RawMessage(`{"seq":1}`)}
		for range events {
			_, err := b.Publish(ev)
			require.NoError(t, err)
		}
		batch := make([]Frame, 0, events+8)
		return testing.AllocsPerRun(20, func() {
			s, err := b.Subscribe(context.Background(), SubscribeOptions{Resume: true, LastEventID: 0})
			require.NoError(t, err)
			out, _ := s.AppendReady(batch)
			require.Len(t, out, events+1, "the events and replay_complete")
			s.Close()
		})
	}
	assert.Equal(t, resume(100), resume(4000))
}
