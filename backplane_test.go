package eventbus

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ssebus/eventbus/internal/seam"
)

// fakeLog is a backplane log in memory: entries first..last, numbered by it.
type fakeLog struct {
	entries []seam.Entry
	calls   int
	err     error
}

func (l *fakeLog) add(t *testing.T, b *EventBus, typ string) seam.Entry {
	t.Helper()
	_, tail, err := seam.EncodeTail(b, Event{Type: typ})
	require.NoError(t, err)
	id := uint64(1)
	if n := len(l.entries); n > 0 {
		id = l.entries[n-1].ID + 1
	}
	e := seam.Entry{ID: id, Type: typ, JSON: append([]byte(`{"id":`+strconv.FormatUint(id, 10)), tail...)}
	l.entries = append(l.entries, e)
	return e
}

func (l *fakeLog) trim(keep int) { l.entries = l.entries[len(l.entries)-keep:] }

func (l *fakeLog) history(_ context.Context, after, upto uint64) ([]seam.Entry, uint64, error) {
	l.calls++
	if l.err != nil {
		return nil, 0, l.err
	}
	var out []seam.Entry
	for _, e := range l.entries {
		if e.ID > after && e.ID <= upto {
			out = append(out, e)
		}
	}
	first := uint64(0)
	if len(l.entries) > 0 {
		first = l.entries[0].ID
	}
	return out, first, nil
}

func newMirror(t *testing.T, opts Options, epoch string, next uint64) *EventBus {
	t.Helper()
	b, err := seam.NewMirror(opts, epoch, next)
	require.NoError(t, err)
	t.Cleanup(func() { b.(*EventBus).Close() })
	return b.(*EventBus)
}

func subscribeRemote(t *testing.T, b *EventBus, opts SubscribeOptions, h seam.History) *Subscription {
	t.Helper()
	s, err := seam.Subscribe(b, context.Background(), opts, h)
	require.NoError(t, err)
	return s.(*Subscription)
}

// drainNow returns every frame ready now.
func drainNow(s *Subscription) []Frame {
	out, _ := s.AppendReady(nil)
	return out
}

func summary(fs []Frame) []string {
	var out []string
	for _, f := range fs {
		if f.ID() != 0 {
			out = append(out, strconv.FormatUint(f.ID(), 10))
		} else {
			out = append(out, f.Type())
		}
	}
	return out
}

func TestMirrorTakesEpochAndIDsFromTheLog(t *testing.T) {
	epoch := "0123456789abcdef0123456789abcdef"
	b := newMirror(t, Options{}, epoch, 41)
	assert.Equal(t, epoch, b.Epoch())
	assert.Equal(t, uint64(40), b.LastEventID())

	_, err := b.Publish(Event{Type: "x"})
	assert.ErrorIs(t, err, errMirror, "ids come from the log, not from Publish")

	s, err := b.Subscribe(context.Background(), SubscribeOptions{})
	require.NoError(t, err)
	log := &fakeLog{}
	log.entries = []seam.Entry{}
	for range 41 {
		log.add(t, b, "tick")
	}
	require.NoError(t, seam.Append(b, log.entries[40]))
	require.NoError(t, seam.Append(b, log.entries[40]), "a duplicate is ignored")
	fs := drainNow(s)
	require.Len(t, fs, 1)
	assert.Equal(t, uint64(41), fs[0].ID())
	assert.Equal(t, "id: 41\nevent: tick\ndata: "+string(log.entries[40].JSON)+"\n\n", fs[0].String())
	assert.Equal(t, uint64(41), b.LastEventID())
}

func TestMirrorAppendGapSendsRingEvictedResync(t *testing.T) {
	b := newMirror(t, Options{}, "", 1)
	s, err := b.Subscribe(context.Background(), SubscribeOptions{})
	require.NoError(t, err)
	log := &fakeLog{}
	for range 5 {
		log.add(t, b, "tick")
	}
	require.NoError(t, seam.Append(b, log.entries[0]))
	require.NoError(t, seam.Append(b, log.entries[4])) // 2..4 lost by the log
	fs := drainNow(s)
	assert.Equal(t, []string{"1", TypeStateResyncRequired, "5"}, summary(fs))
	assert.Contains(t, string(fs[1].JSON()), `"reason":"ring_evicted","lastDeliveredId":1,"earliestAvailableId":5`)
	assert.Equal(t, 1, b.ring.Len(), "the ring restarts at the gap so its ids stay contiguous")
}

func TestMirrorAppendGapWhileCatchingUpSendsOneResyncFromTheCursor(t *testing.T) {
	b := newMirror(t, Options{MaxQueued: 2, OverflowPolicy: OverflowCatchUp}, "", 1)
	s, err := b.Subscribe(context.Background(), SubscribeOptions{})
	require.NoError(t, err)
	log := &fakeLog{}
	for range 10 {
		log.add(t, b, "tick")
	}
	for _, e := range log.entries[:4] {
		require.NoError(t, seam.Append(b, e)) // 1, 2 queued; behind at 3
	}
	require.NoError(t, seam.Append(b, log.entries[8])) // 5..8 lost by the log
	require.NoError(t, seam.Append(b, log.entries[9]))
	var fs []Frame
	for {
		more := drainNow(s)
		if len(more) == 0 {
			break
		}
		fs = append(fs, more...)
	}
	assert.Equal(t, []string{"1", "2", TypeSlowClientWarning, TypeStateResyncRequired, "9", "10"}, summary(fs),
		"3 and 4 went with the ring's restart: one resync, from the cursor")
	assert.Contains(t, string(fs[3].JSON()), `"reason":"ring_evicted","lastDeliveredId":2,"earliestAvailableId":9`)
	assert.Equal(t, uint64(1), b.Stats().Resyncs.RingEvicted)
}

func TestRemoteResumeReplaysFromTheLogAheadOfLiveFrames(t *testing.T) {
	b := newMirror(t, Options{}, "", 1)
	log := &fakeLog{}
	for range 10 {
		log.add(t, b, "tick")
	}
	// This replica saw only 9 and 10.
	b.nextID = 9
	require.NoError(t, seam.Append(b, log.entries[8]))
	require.NoError(t, seam.Append(b, log.entries[9]))

	// A live event arrives while the history is being read: it must come
	// after the replay, once.
	hist := func(ctx context.Context, after, upto uint64) ([]seam.Entry, uint64, error) {
		assert.Equal(t, uint64(3), after)
		assert.Equal(t, uint64(10), upto)
		log.add(t, b, "tick")
		require.NoError(t, seam.Append(b, log.entries[10]))
		return log.history(ctx, after, upto)
	}
	s := subscribeRemote(t, b, SubscribeOptions{Resume: true, LastEventID: 3}, hist)
	fs := drainNow(s)
	assert.Equal(t, []string{"4", "5", "6", "7", "8", "9", "10", TypeReplayComplete, "11"}, summary(fs))
}

func TestRemoteResumeAnswersResyncRulesFromTheLog(t *testing.T) {
	b := newMirror(t, Options{}, "", 1)
	log := &fakeLog{}
	for range 10 {
		log.add(t, b, "tick")
	}
	b.nextID = 10
	require.NoError(t, seam.Append(b, log.entries[9]))
	log.trim(4) // the log holds 7..10

	t.Run("ring_evicted", func(t *testing.T) {
		s := subscribeRemote(t, b, SubscribeOptions{Resume: true, LastEventID: 2}, log.history)
		fs := drainNow(s)
		assert.Equal(t, []string{TypeStateResyncRequired, "7", "8", "9", "10", TypeReplayComplete}, summary(fs))
		assert.Contains(t, string(fs[0].JSON()), `"reason":"ring_evicted","lastDeliveredId":2,"earliestAvailableId":7`)
		s.Close()
	})
	t.Run("no resync at the boundary", func(t *testing.T) {
		s := subscribeRemote(t, b, SubscribeOptions{Resume: true, LastEventID: 6}, log.history)
		assert.Equal(t, []string{"7", "8", "9", "10", TypeReplayComplete}, summary(drainNow(s)))
		s.Close()
	})
	t.Run("epoch_reset by cursor", func(t *testing.T) {
		s := subscribeRemote(t, b, SubscribeOptions{Resume: true, LastEventID: 50}, log.history)
		fs := drainNow(s)
		assert.Equal(t, []string{TypeStateResyncRequired, "7", "8", "9", "10", TypeReplayComplete}, summary(fs))
		assert.Contains(t, string(fs[0].JSON()), `"reason":"epoch_reset","lastDeliveredId":50,"earliestAvailableId":7`)
		s.Close()
	})
	t.Run("epoch mismatch", func(t *testing.T) {
		s := subscribeRemote(t, b, SubscribeOptions{Resume: true, LastEventID: 8, Epoch: "other"}, log.history)
		fs := drainNow(s)
		assert.Equal(t, []string{TypeStateResyncRequired, "7", "8", "9", "10", TypeReplayComplete}, summary(fs))
		assert.Contains(t, string(fs[0].JSON()), `"detail":"epoch_mismatch"`)
		s.Close()
	})
	t.Run("the local ring answers when it covers the cursor", func(t *testing.T) {
		calls := log.calls
		s := subscribeRemote(t, b, SubscribeOptions{Resume: true, LastEventID: 9}, log.history)
		assert.Equal(t, []string{"10", TypeReplayComplete}, summary(drainNow(s)))
		assert.Equal(t, calls, log.calls, "no remote read")
		s.Close()
	})
}

func TestRemoteResumeHistoryErrorIsAnExplicitResync(t *testing.T) {
	b := newMirror(t, Options{}, "", 5)
	log := &fakeLog{err: errors.New("connection refused")}
	var diags []Diagnostic
	b.opts.OnDiagnostic = func(d Diagnostic) bool { diags = append(diags, d); return true }
	s := subscribeRemote(t, b, SubscribeOptions{Resume: true, LastEventID: 1}, log.history)
	fs := drainNow(s)
	assert.Equal(t, []string{TypeStateResyncRequired, TypeReplayComplete}, summary(fs))
	assert.Contains(t, string(fs[0].JSON()), `"reason":"ring_evicted","detail":"history_unavailable","lastDeliveredId":1,"earliestAvailableId":5`)
	require.Len(t, diags, 1)
	assert.Equal(t, DiagHistoryUnavailable, diags[0].Kind)
}

func TestHeldQueueHidesLiveFramesUntilReplayIsQueued(t *testing.T) {
	q := newQueue(16, 1<<20)
	q.hold()
	_, _ = q.pushNow(testFrame(7, 10).ref())
	out, open := q.popAll(nil)
	assert.Empty(t, out)
	assert.True(t, open)
	q.unhold(refs([]Frame{testFrame(5, 10), testFrame(6, 10)}))
	out, open = q.popAll(nil)
	assert.True(t, open)
	assert.Equal(t, []string{"5", "6", "7"}, summary(out))
	assert.Equal(t, 0, q.counts().liveCount, "replayed frames are forced, the live one was dequeued")
}

// testFrame is an event frame with id and a JSON envelope of size bytes.
func testFrame(id uint64, size int) Frame {
	json := make([]byte, size)
	for i := range json {
		json[i] = 'x'
	}
	f, _ := entryFrame(seam.Entry{ID: id, Type: "t", JSON: json})
	return f
}
