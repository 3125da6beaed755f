package eventbus

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ---------------------------------------------------------------------------
// Coalescing at the queue level.

// events11 publishes n events of type "e" on a bus without subscribers and
// returns their frames, for queue-level tests.
func events11(t testing.TB, n int) []Frame {
	b := newBus(t, Options{})
	fs := make([]Frame, n)
	for i := range fs {
		fs[i] = publishType(t, b, "e")
	}
	return fs
}

func TestQueueCoalesceAdjustsLiveBytesBySizeDifference(t *testing.T) {
	evs := events11(t, 2)
	q := newQueue(16, 1<<20)
	old := signalFrame("x", "a", 5)
	newer := signalFrame("x", "a", 123456789)
	require.Equal(t, 8, newer.Size()-old.Size())

	res, _ := q.pushNow(evs[0].ref())
	require.Equal(t, pushAccepted, res)
	res, _ = q.pushNow(old.ref())
	require.Equal(t, pushAccepted, res)
	res, _ = q.pushNow(evs[1].ref())
	require.Equal(t, pushAccepted, res)
	before := q.counts()
	require.Equal(t, 3, before.liveCount)
	require.Equal(t, evs[0].Size()+old.Size()+evs[1].Size(), before.liveBytes)

	res, c := q.pushNow(newer.ref())
	assert.Equal(t, pushCoalesced, res)
	assert.Equal(t, 3, c.liveCount)
	assert.Equal(t, before.liveBytes+8, c.liveBytes)
	assert.Equal(t, c, q.counts())
	assert.Equal(t, 3, q.len())

	// Back to a shorter one: the difference is negative.
	res, c = q.pushNow(old.ref())
	assert.Equal(t, pushCoalesced, res)
	assert.Equal(t, before.liveBytes, c.liveBytes)

	fs, open := q.popAll(nil)
	assert.True(t, open)
	assert.Equal(t, []string{"#1", "sig:x/a", "#2"}, describe(fs))
	assert.Equal(t, old.JSON(), fs[1].JSON())
	assert.Equal(t, queueCounts{0, 16, 0, 1 << 20}, q.counts())
}

func TestQueueCoalesceFindsPositionAfterWrapAndGrowth(t *testing.T) {
	evs := events11(t, 40)
	q := newQueue(64, 1<<20)
	// Move the head so the slice ring wraps, then grow it while a signal
	// is queued: its recorded position must still find it.
	for i := range 6 {
		q.pushNow(evs[i].ref())
	}
	for range 5 {
		_, st := q.pop()
		require.Equal(t, popOK, st)
	}
	q.pushNow(signalFrame("x", "a", 1).ref())
	for i := 6; i < 30; i++ {
		q.pushNow(evs[i].ref())
	}
	q.pushNow(signalFrame("x", "b", 1).ref())
	res, _ := q.pushNow(signalFrame("x", "a", 2).ref())
	require.Equal(t, pushCoalesced, res)
	res, _ = q.pushNow(signalFrame("x", "b", 2).ref())
	require.Equal(t, pushCoalesced, res)

	fs, _ := q.popAll(nil)
	want := seqOf("#6", "sig:x/a", idRange(7, 30), "sig:x/b")
	assert.Equal(t, want, describe(fs))
	for _, f := range ofType(fs, "x") {
		assert.Equal(t, int64(2), stampOf(t, f))
	}
	assert.Equal(t, 0, q.counts().liveBytes)
}

func TestQueueSignalPoppedIsForgotten(t *testing.T) {
	q := newQueue(16, 1<<20)
	q.pushNow(signalFrame("x", "a", 1).ref())
	e, st := q.pop()
	require.Equal(t, popOK, st)
	require.True(t, e.f.Signal())
	res, c := q.pushNow(signalFrame("x", "a", 2).ref())
	assert.Equal(t, pushAccepted, res, "a delivered signal is not coalesced")
	assert.Equal(t, 1, c.liveCount)
	res, _ = q.pushNow(signalFrame("x", "a", 3).ref())
	assert.Equal(t, pushCoalesced, res)
}

func TestQueueSignalCoalescingIgnoredWhenClosed(t *testing.T) {
	q := newQueue(16, 1<<20)
	q.pushNow(signalFrame("x", "a", 1).ref())
	q.close(true)
	res, _ := q.pushNow(signalFrame("x", "a", 2).ref())
	assert.Equal(t, pushIgnored, res)
	fs, open := q.popAll(nil)
	assert.False(t, open)
	require.Len(t, fs, 1)
	assert.Equal(t, int64(1), stampOf(t, fs[0]))
}
