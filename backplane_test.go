package eventbus

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ssebus/eventbus/internal/seam"
)

const testEpoch = "0123456789abcdef0123456789abcdef"

func newFed(t *testing.T, opts Options, next uint64, log seam.Log) *EventBus {
	t.Helper()
	b, err := newMirror(opts, seam.MirrorOptions{Epoch: testEpoch, NextID: next, Log: log})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	return b
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

func TestFedBusTakesEpochAndIDsFromTheLog(t *testing.T) {
	b := newFed(t, Options{Logger: quiet}, 41, nil)
	assert.Equal(t, testEpoch, b.Epoch())
	assert.Equal(t, uint64(40), b.LastEventID())

	_, err := b.Publish(Event{Type: "x"})
	assert.ErrorIs(t, err, seam.ErrMirror, "ids come from the log, not from Publish")
	_, err = b.Publish(Event{})
	assert.ErrorIs(t, err, ErrInvalidEvent, "an event Publish refuses anyway says why")

	s := subscribe(t, b, SubscribeOptions{})
	log := &memLog{}
	for range 41 {
		log.add(t, "tick")
	}
	require.NoError(t, b.appendEntry(log.entries[40]))
	require.NoError(t, b.appendEntry(log.entries[40]), "a duplicate is ignored")
	fs := readyNow(s)
	require.Len(t, fs, 1)
	assert.Equal(t, uint64(41), fs[0].ID())
	assert.Equal(t, "id: 41\nevent: tick\ndata: "+string(log.entries[40].JSON)+"\n\n", fs[0].String())
	assert.Equal(t, uint64(41), b.LastEventID())
}

func TestNewMirrorValidates(t *testing.T) {
	for _, fo := range []seam.MirrorOptions{{}, {Epoch: "short"}, {Epoch: strings.ToUpper(testEpoch)}, {Epoch: testEpoch, LagTimeout: -1}} {
		_, err := newMirror(Options{}, fo)
		assert.ErrorIs(t, err, ErrInvalidOption, "%+v", fo)
	}
	_, err := newMirror(Options{RingSize: -1}, seam.MirrorOptions{Epoch: testEpoch})
	assert.ErrorIs(t, err, ErrInvalidOption)

	b, err := New(Options{})
	require.NoError(t, err)
	assert.ErrorIs(t, b.appendEntry(seam.Entry{ID: 1, Type: "x", JSON: []byte(`{"id":1}`)}), seam.ErrMirror, "a bus made by New numbers its own events")
	b.Close()
	assert.ErrorIs(t, b.appendEntry(seam.Entry{ID: 1, Type: "x", JSON: []byte(`{"id":1}`)}), ErrClosed)

	f := newFed(t, Options{}, 1, nil)
	assert.ErrorIs(t, f.appendEntry(seam.Entry{ID: 1, Type: "", JSON: []byte(`{}`)}), ErrInvalidEvent)
	assert.ErrorIs(t, f.appendEntry(seam.Entry{ID: 1, Type: "x", JSON: []byte("{\n}")}), ErrInvalidEvent)
	assert.Zero(t, f.LastEventID(), "a refused entry is not delivered")
}

func TestFedAppendGapSendsRingEvictedResync(t *testing.T) {
	b := newFed(t, Options{}, 1, nil)
	s := subscribe(t, b, SubscribeOptions{})
	log := &memLog{}
	for range 5 {
		log.add(t, "tick")
	}
	require.NoError(t, b.appendEntry(log.entries[0]))
	require.NoError(t, b.appendEntry(log.entries[4])) // 2..4 lost by the log
	fs := readyNow(s)
	assert.Equal(t, []string{"1", TypeStateResyncRequired, "5"}, summary(fs))
	assert.Contains(t, string(fs[1].JSON()), `"reason":"ring_evicted","lastDeliveredId":1,"earliestAvailableId":5`)
	assert.Equal(t, 1, b.ring.Len(), "the ring restarts at the gap so its ids stay contiguous")
}

func TestFedAppendGapWhileCatchingUpSendsOneResyncFromTheCursor(t *testing.T) {
	b := newFed(t, Options{MaxQueued: 2, OverflowPolicy: OverflowCatchUp}, 1, nil)
	s := subscribe(t, b, SubscribeOptions{})
	log := &memLog{}
	for range 10 {
		log.add(t, "tick")
	}
	for _, e := range log.entries[:4] {
		require.NoError(t, b.appendEntry(e)) // 1, 2 queued; behind at 3
	}
	require.NoError(t, b.appendEntry(log.entries[8])) // 5..8 lost by the log
	require.NoError(t, b.appendEntry(log.entries[9]))
	var fs []Frame
	for {
		more := readyNow(s)
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
	log := &memLog{epoch: testEpoch}
	for range 10 {
		log.add(t, "tick")
	}
	// This replica saw only 9 and 10.
	b := newFed(t, Options{}, 9, log)
	require.NoError(t, b.appendEntry(log.entries[8]))
	require.NoError(t, b.appendEntry(log.entries[9]))

	// A live event arrives while the history is being read: it must come
	// after the replay, once.
	log.onRead = func() {
		log.onRead = nil
		log.add(t, "tick")
		require.NoError(t, b.appendEntry(log.entries[10]))
	}
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 3})
	fs := readyNow(s)
	assert.Equal(t, []string{"4", "5", "6", "7", "8", "9", "10", TypeReplayComplete, "11"}, summary(fs))
	require.Len(t, log.reqs, 1)
	assert.Equal(t, seam.HistoryRequest{After: 3, Upto: 10, MaxBytes: DefaultReplayBudgetBytes}, log.reqs[0])

	log.reqs = nil
	s = subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 3, Types: []string{"tick"}})
	assert.Equal(t, []string{"4", "5", "6", "7", "8", "9", "10", "11", TypeReplayComplete}, summary(readyNow(s)))
	assert.Equal(t, []seam.HistoryRequest{{After: 3, Upto: 11}}, log.reqs, "a filtered resume needs every entry")
}

func TestResumeAheadOfTheFeedWaitsForIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := &memLog{epoch: testEpoch}
		for range 6 {
			log.add(t, "tick")
		}
		b := newFed(t, Options{}, 1, log)
		for _, e := range log.entries[:3] {
			require.NoError(t, b.appendEntry(e))
		}
		// The client read 1..5 through a replica whose reader is ahead:
		// this one's reader delivers 4 and 5 while the resume waits. No
		// epoch_reset: the resume gets the live 6 after replay_complete.
		var s *Subscription
		go func() {
			var err error
			s, err = b.Subscribe(context.Background(), SubscribeOptions{Resume: true, LastEventID: 5, Epoch: testEpoch})
			assert.NoError(t, err)
		}()
		synctest.Wait()
		require.Nil(t, s, "Subscribe waits for the feed")
		require.NoError(t, b.appendEntry(log.entries[3]))
		synctest.Wait()
		require.Nil(t, s, "4 is not the cursor yet")
		require.NoError(t, b.appendEntry(log.entries[4]))
		synctest.Wait()
		require.NotNil(t, s)
		require.NoError(t, b.appendEntry(log.entries[5]))
		assert.Equal(t, []string{TypeReplayComplete, "6"}, summary(readyNow(s)))

		// A cursor the log does not hold is of an older epoch: answered
		// at once, without waiting.
		start := time.Now()
		s = subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 50})
		assert.Zero(t, time.Since(start))
		assert.Equal(t, TypeStateResyncRequired, readyNow(s)[0].Type())
	})
}

func TestResumeAheadOfTheFeedGivesUpAfterLagTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := &memLog{epoch: testEpoch}
		for range 6 {
			log.add(t, "tick")
		}
		b, err := newMirror(Options{}, seam.MirrorOptions{Epoch: testEpoch, NextID: 1, Log: log, LagTimeout: time.Second})
		require.NoError(t, err)
		defer b.Close()
		start := time.Now()
		s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 5})
		assert.Equal(t, time.Second, time.Since(start), "waited LagTimeout for a reader that never came")
		assert.Equal(t, TypeStateResyncRequired, readyNow(s)[0].Type())

		// Close releases a waiting Subscribe at once.
		go func() {
			time.Sleep(100 * time.Millisecond)
			b.Close()
		}()
		start = time.Now()
		s = subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 5})
		assert.Equal(t, 100*time.Millisecond, time.Since(start))
		_, open := s.AppendReady(nil)
		assert.False(t, open, "an ended subscription")
	})
}

func TestRemoteResumeAnswersResyncRulesFromTheLog(t *testing.T) {
	log := &memLog{epoch: testEpoch}
	for range 10 {
		log.add(t, "tick")
	}
	b := newFed(t, Options{}, 10, log)
	require.NoError(t, b.appendEntry(log.entries[9]))
	log.trim(4) // the log holds 7..10

	t.Run("ring_evicted", func(t *testing.T) {
		s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 2})
		fs := readyNow(s)
		assert.Equal(t, []string{TypeStateResyncRequired, "7", "8", "9", "10", TypeReplayComplete}, summary(fs))
		assert.Contains(t, string(fs[0].JSON()), `"reason":"ring_evicted","lastDeliveredId":2,"earliestAvailableId":7`)
		s.Close()
	})
	t.Run("no resync at the boundary", func(t *testing.T) {
		s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 6})
		assert.Equal(t, []string{"7", "8", "9", "10", TypeReplayComplete}, summary(readyNow(s)))
		s.Close()
	})
	t.Run("epoch_reset by cursor", func(t *testing.T) {
		s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 50})
		fs := readyNow(s)
		assert.Equal(t, []string{TypeStateResyncRequired, "7", "8", "9", "10", TypeReplayComplete}, summary(fs))
		assert.Contains(t, string(fs[0].JSON()), `"reason":"epoch_reset","lastDeliveredId":50,"earliestAvailableId":7`)
		s.Close()
	})
	t.Run("epoch mismatch", func(t *testing.T) {
		s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 8, Epoch: "other"})
		fs := readyNow(s)
		assert.Equal(t, []string{TypeStateResyncRequired, "7", "8", "9", "10", TypeReplayComplete}, summary(fs))
		assert.Contains(t, string(fs[0].JSON()), `"detail":"epoch_mismatch"`)
		s.Close()
	})
	t.Run("the local ring answers when it covers the cursor", func(t *testing.T) {
		calls := log.calls
		s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 9})
		assert.Equal(t, []string{"10", TypeReplayComplete}, summary(readyNow(s)))
		assert.Equal(t, calls, log.calls, "no remote read")
		s.Close()
	})
}

func TestRemoteResumeHistoryErrorIsAnExplicitResync(t *testing.T) {
	log := &memLog{err: errors.New("connection refused")}
	var diags []Diagnostic
	b := newFed(t, Options{OnDiagnostic: func(d Diagnostic) bool { diags = append(diags, d); return true }}, 5, log)
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 1})
	fs := readyNow(s)
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

// The Handler subscribes detached from the request (subscribeRequest), but
// the request still bounds the subscribing: a resume ahead of a mirror's
// feed waits for the feed only until the client leaves, not for the whole
// LagTimeout.
func TestHandlerRequestBoundsTheWaitForTheFeed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := &memLog{epoch: testEpoch}
		for range 6 {
			log.add(t, "tick")
		}
		b, err := newMirror(Options{Logger: quiet}, seam.MirrorOptions{Epoch: testEpoch, NextID: 1, Log: log, LagTimeout: time.Hour})
		require.NoError(t, err)
		defer b.Close()
		h := busHandler(b, &logCapture{})
		start := time.Now()
		cancel, done := serveMem(h, newMemWriter(), "/session/s/events", http.Header{"Last-Event-Id": {"5"}})
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("the stream ended before its client left")
		default:
		}
		cancel()
		<-done
		assert.Equal(t, 100*time.Millisecond, time.Since(start), "the wait for the feed ends when the client leaves")
		assert.Equal(t, 0, b.SubscriberCount())
	})
}
