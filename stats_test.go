package eventbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Stats counters and diagnostics (SPEC 1.5).

// failWriter11 is a flushable ResponseWriter whose writes succeed ok times
// and then fail, like a connection the client stopped reading.
type failWriter11 struct {
	header http.Header
	ok     int
	writes int
}

func (w *failWriter11) Header() http.Header { return w.header }
func (w *failWriter11) WriteHeader(int)     {}
func (w *failWriter11) Flush()              {}
func (w *failWriter11) Write(p []byte) (int, error) {
	if w.writes >= w.ok {
		return 0, errors.New("write tcp: broken pipe")
	}
	w.writes++
	return len(p), nil
}

// serveFailing11 serves b through Handler to a writer whose writes fail
// after ok successful ones, resuming from lastEventID when it is not
// empty, and waits for ServeHTTP to give up.
func serveFailing11(t testing.TB, b *EventBus, ok int, lastEventID string) {
	t.Helper()
	h := &Handler{
		Lookup: func(*http.Request, string) (*EventBus, error) { return b, nil },
		Logger: slog.New(slog.DiscardHandler),
	}
	w := &failWriter11{header: http.Header{}, ok: ok}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if lastEventID != "" {
		r.Header.Set("Last-Event-ID", lastEventID)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(w, r)
	}()
	waitClosed(t, done, "ServeHTTP did not return after a failed write")
}

func TestStatsPublishedAndRejectedByReason(t *testing.T) {
	b := newBus(t, Options{MaxEventBytes: 200})
	publishTypeN(t, b, "e", 3)
	for _, e := range []Event{
		{Type: ""},
		{Type: "a\nb"},
		{Type: "t", Data: make(chan int)},
		{Type: "t", Data: json.RawMessage("{nope")},
	} {
		_, err := b.Publish(e)
		require.ErrorIs(t, err, ErrInvalidEvent)
	}
	_, err := b.Publish(Event{Type: "t", Data: strings.Repeat("x", 300)})
	require.ErrorIs(t, err, ErrEventTooLarge)
	require.ErrorIs(t, b.Signal("", "x"), ErrInvalidEvent)
	require.ErrorIs(t, b.Signal("t", strings.Repeat("x", 300)), ErrEventTooLarge)

	st := b.Stats()
	assert.Equal(t, uint64(3), st.Published)
	assert.Equal(t, RejectedStats{Invalid: 5, TooLarge: 2}, st.Rejected)

	require.NoError(t, b.Close())
	_, err = b.Publish(Event{Type: "t"})
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, b.Signal("t", "x"), ErrClosed)
	st = b.Stats()
	assert.Equal(t, uint64(3), st.Published, "a rejected publish uses no id")
	assert.Equal(t, RejectedStats{Invalid: 5, TooLarge: 2, Closed: 2}, st.Rejected)
	assert.Equal(t, uint64(3), b.LastEventID())
}

func TestStatsSignalsCountsAcceptedSignals(t *testing.T) {
	b := newBus(t, Options{})
	sendSignal(t, b, "x", "a")
	sendSignal(t, b, "x", "a") // no subscriber: still accepted
	s := subscribe(t, b, SubscribeOptions{})
	sendSignal(t, b, "x", "a")
	sendSignal(t, b, "x", "a") // coalesced, still a signal sent
	_ = b.Signal("", "a")
	st := b.Stats()
	assert.Equal(t, uint64(4), st.Signals)
	assert.Zero(t, st.Published)
	assert.Len(t, readyNow(s), 1)
}

func TestStatsFramesDeliveredEqualsFramesReceived(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16})
	publishTypeN(t, b, "e", 2)
	reader := subscribe(t, b, SubscribeOptions{})
	resumed := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 0}) // replay + replay_complete
	stalled := subscribe(t, b, SubscribeOptions{})                             // warned, then evicted
	filtered := subscribe(t, b, SubscribeOptions{Types: []string{"s"}})

	received := 0
	for i := range 60 {
		if i%4 == 0 {
			sendSignal(t, b, "s", fmt.Sprint(i%3))
		} else {
			publishType(t, b, "e")
		}
		if i%5 == 0 {
			received += len(readyNow(reader)) + len(readyNow(resumed))
		}
		assert.Equal(t, uint64(received), b.Stats().FramesDelivered)
	}
	require.ErrorIs(t, stalled.Err(), ErrEvicted)
	received += len(collectEvents(stalled))
	assert.Equal(t, uint64(received), b.Stats().FramesDelivered)

	require.NoError(t, b.Close())
	for _, s := range []*Subscription{reader, resumed, filtered} {
		received += len(collectEvents(s)) // Events drains what Close left queued
	}
	assert.Equal(t, uint64(received), b.Stats().FramesDelivered)
	assert.Zero(t, b.Stats().Dropped.Cancelled)
}

func TestStatsFramesDeliveredWhenBreakingOutOfEvents(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	publishTypeN(t, b, "e", 5)
	n := 0
	for range s.Events() {
		n++
		if n == 2 {
			break
		}
	}
	st := b.Stats()
	assert.Equal(t, uint64(2), st.FramesDelivered, "the loop received 2 frames")
	assert.Equal(t, uint64(3), st.Dropped.Cancelled, "3 were still buffered, from the loop's view, when it broke out")
}

func TestStatsSubscribersAndPeak(t *testing.T) {
	b := newBus(t, Options{MaxSubscribers: 3, MaxQueued: 16})
	assert.Equal(t, 0, b.Stats().Subscribers)
	s1 := subscribe(t, b, SubscribeOptions{})
	subscribe(t, b, SubscribeOptions{Types: []string{"never"}})
	s3 := subscribe(t, b, SubscribeOptions{})
	_, err := b.Subscribe(t.Context(), SubscribeOptions{})
	require.ErrorIs(t, err, ErrSubscriberLimitExceeded)
	st := b.Stats()
	assert.Equal(t, 3, st.Subscribers)
	assert.Equal(t, 3, st.PeakSubscribers)

	s1.Close()
	st = b.Stats()
	assert.Equal(t, 2, st.Subscribers)
	assert.Equal(t, 3, st.PeakSubscribers)

	publishTypeN(t, b, "e", 17) // evicts s3
	require.ErrorIs(t, s3.Err(), ErrEvicted)
	assert.Equal(t, 1, b.Stats().Subscribers)

	ctx, cancel := context.WithCancel(t.Context())
	_, err = b.Subscribe(ctx, SubscribeOptions{})
	require.NoError(t, err)
	assert.Equal(t, 2, b.Stats().Subscribers)
	cancel()
	require.Eventually(t, func() bool { return b.Stats().Subscribers == 1 }, 5*time.Second, time.Millisecond)

	require.NoError(t, b.Close())
	st = b.Stats()
	assert.Equal(t, 0, st.Subscribers)
	assert.Equal(t, 3, st.PeakSubscribers)
}

func TestStatsEvictionsByReason(t *testing.T) {
	t.Run("queue_overflow", func(t *testing.T) {
		b := newBus(t, Options{MaxQueued: 16})
		s := subscribe(t, b, SubscribeOptions{})
		publishTypeN(t, b, "e", 17)
		assert.Contains(t, dataOf(t, ofType(collectEvents(s), TypeClientEvicted)[0]), `"reason":"queue_overflow"`)
		assert.Equal(t, EvictionStats{QueueOverflow: 1}, b.Stats().Evictions)
	})
	t.Run("queue_bytes_overflow", func(t *testing.T) {
		b := newBus(t, Options{MaxQueuedBytes: 1000})
		s := subscribe(t, b, SubscribeOptions{})
		for range 11 {
			publishSized(t, b, "e", 100)
		}
		assert.Contains(t, dataOf(t, ofType(collectEvents(s), TypeClientEvicted)[0]), `"reason":"queue_bytes_overflow"`)
		assert.Equal(t, EvictionStats{QueueBytesOverflow: 1}, b.Stats().Evictions)
	})
	t.Run("repeated_overflow", func(t *testing.T) {
		b := newBus(t, Options{MaxQueued: 16, OverflowPolicy: OverflowResync}) // fixed clock: all within the window
		s := subscribe(t, b, SubscribeOptions{})
		for range 3 {
			overflow11(t, b, s)
		}
		assert.Contains(t, dataOf(t, ofType(collectEvents(s), TypeClientEvicted)[0]), `"reason":"repeated_overflow"`)
		assert.Equal(t, EvictionStats{RepeatedOverflow: 1}, b.Stats().Evictions)
	})
}

func TestStatsWarningsCountsWarningFramesSent(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16})
	s1 := subscribe(t, b, SubscribeOptions{})
	s2 := subscribe(t, b, SubscribeOptions{})
	publishTypeN(t, b, "e", 12) // both warned
	fs1 := readyNow(s1)         // s1 catches up
	publishTypeN(t, b, "e", 1)  // s1 re-arms (1 <= 6); s2 is still in its episode
	fs1 = append(fs1, readyNow(s1)...)
	publishTypeN(t, b, "e", 2)  // s2: 15 live, no second warning
	publishTypeN(t, b, "e", 11) // s1: 2+11 = 13 live: a second warning; s2 evicted on the way
	fs1 = append(fs1, readyNow(s1)...)
	fs2 := collectEvents(s2)
	sent := len(ofType(fs1, TypeSlowClientWarning)) + len(ofType(fs2, TypeSlowClientWarning))
	assert.Equal(t, 3, sent)
	assert.Equal(t, uint64(sent), b.Stats().Warnings)
}

func TestStatsResyncsByReason(t *testing.T) {
	clk := newFakeClock(testStamp)
	b := newBus(t, Options{RingSize: 4, ReplayBudgetBytes: 250, MaxQueuedBytes: 2000, OverflowPolicy: OverflowResync, Now: clk.now})
	var subs []*Subscription
	q := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	subs = append(subs, q)
	publishTypeN(t, b, "e", 17) // queue_overflow
	// Take the first resync frame now: the next overflow would supersede it.
	early := readyNow(q)
	clk.advance(time.Minute)
	for range 7 { // 1 small live event + 6*300 = 1870, the 7th: 2170 > 2000
		publishSized(t, b, "e", 300) // queue_bytes_overflow
	}
	// The ring holds #21..#24, 300 bytes each: every replay of two or more
	// of them also exceeds the budget.
	for _, o := range []SubscribeOptions{
		{Resume: true, LastEventID: 100},                  // epoch_reset + replay_budget_exceeded
		{Resume: true, LastEventID: 22, Epoch: "another"}, // epoch_reset (mismatch) + replay_budget_exceeded
		{Resume: true, LastEventID: 1},                    // ring_evicted + replay_budget_exceeded
		{Resume: true, LastEventID: 23},                   // #24 only: no resync
	} {
		subs = append(subs, subscribe(t, b, o))
	}
	seen := map[string]uint64{}
	for i, s := range subs {
		fs := readyNow(s)
		if i == 0 {
			fs = append(early, fs...)
		}
		for _, f := range ofType(fs, TypeStateResyncRequired) {
			var d struct{ Reason string }
			require.NoError(t, json.Unmarshal([]byte(dataOf(t, f)), &d))
			seen[d.Reason]++
		}
	}
	want := ResyncStats{EpochReset: 2, RingEvicted: 1, ReplayBudgetExceeded: 3, QueueOverflow: 1, QueueBytesOverflow: 1}
	assert.Equal(t, want, b.Stats().Resyncs)
	assert.Equal(t, ResyncStats{
		EpochReset: seen[ReasonEpochReset], RingEvicted: seen[ReasonRingEvicted], ReplayBudgetExceeded: seen[ReasonReplayBudgetExceeded],
		QueueOverflow: seen[ReasonQueueOverflow], QueueBytesOverflow: seen[ReasonQueueBytesOverflow],
	}, b.Stats().Resyncs, "one count per state_resync_required frame sent")
}

func TestStatsDroppedCoalesced(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	sendSignal(t, b, "x", "a")
	sendSignal(t, b, "x", "b")
	sendSignal(t, b, "x", "a")
	sendSignal(t, b, "x", "a")
	assert.Len(t, readyNow(s), 2)
	assert.Equal(t, DroppedStats{Coalesced: 2}, b.Stats().Dropped)
}

func TestStatsDroppedOverflow(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16, OverflowPolicy: OverflowResync})
	s := subscribe(t, b, SubscribeOptions{})
	publishTypeN(t, b, "e", 5)
	assert.Len(t, readyNow(s), 5)
	publishTypeN(t, b, "e", 17) // 16 queued live frames dropped
	assert.Equal(t, DroppedStats{Overflow: 16}, b.Stats().Dropped)
}

func TestStatsDroppedReplayBudget(t *testing.T) {
	b := newBus(t, Options{ReplayBudgetBytes: 250})
	for range 5 {
		publishSized(t, b, "e", 100)
	}
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 0})
	fs := readyNow(s)
	assert.Equal(t, []string{"#1", "#2", TypeStateResyncRequired, TypeReplayComplete}, describe(fs))
	assert.Equal(t, DroppedStats{ReplayBudget: 3}, b.Stats().Dropped)
}

func TestStatsDroppedCancelledCountsFramesBufferedAtCancellation(t *testing.T) {
	b := newBus(t, Options{})
	closed := subscribe(t, b, SubscribeOptions{})
	ctx, cancel := context.WithCancel(t.Context())
	ctxSub, err := b.Subscribe(ctx, SubscribeOptions{})
	require.NoError(t, err)
	publishTypeN(t, b, "e", 5)
	readyNow(ctxSub)
	publishTypeN(t, b, "e", 3) // closed: 8 buffered, ctxSub: 3

	closed.Close()
	assert.Equal(t, uint64(8), b.Stats().Dropped.Cancelled)
	closed.Close() // idempotent: nothing counted twice
	assert.Equal(t, uint64(8), b.Stats().Dropped.Cancelled)

	cancel()
	require.Eventually(t, func() bool { return b.Stats().Dropped.Cancelled == 11 }, 5*time.Second, time.Millisecond)

	// A draining subscription of a closed bus that is then cancelled still
	// drops its buffer.
	b2 := newBus(t, Options{})
	s := subscribe(t, b2, SubscribeOptions{})
	publishTypeN(t, b2, "e", 4)
	require.NoError(t, b2.Close())
	s.Close()
	assert.Equal(t, uint64(4), b2.Stats().Dropped.Cancelled)
	assert.Empty(t, collectEvents(s))
}

func TestStatsDroppedBlockedWhenFirstWriteFails(t *testing.T) {
	b := newBus(t, Options{})
	publishTypeN(t, b, "e", 3)
	serveFailing11(t, b, 0, "0") // the retry: line fails; 3 events + replay_complete are buffered
	st := b.Stats()
	assert.Equal(t, DroppedStats{Blocked: 4}, st.Dropped)
	assert.Zero(t, st.FramesDelivered)
	assert.Equal(t, 0, b.SubscriberCount())
}

func TestStatsDroppedBlockedCountsTheFailedBatch(t *testing.T) {
	b := newBus(t, Options{})
	publishTypeN(t, b, "e", 3)
	serveFailing11(t, b, 1, "0") // the retry: line goes out, the first batch of 4 frames fails
	st := b.Stats()
	assert.Equal(t, DroppedStats{Blocked: 4}, st.Dropped, "the frames of the failed batch are lost")
	assert.Zero(t, st.FramesDelivered, "and never reached the client")
	assert.Equal(t, 0, b.SubscriberCount())
}

func TestStatsRingLenAndBytes(t *testing.T) {
	b := newBus(t, Options{RingSize: 5})
	for range 3 {
		publishSized(t, b, "e", 100)
	}
	st := b.Stats()
	assert.Equal(t, 3, st.RingLen)
	assert.Equal(t, 300, st.RingBytes)
	for range 4 {
		publishSized(t, b, "e", 120)
	}
	sendSignal(t, b, "x", "a")
	st = b.Stats()
	assert.Equal(t, 5, st.RingLen)
	assert.Equal(t, 100+4*120, st.RingBytes)

	b2 := newBus(t, Options{RingMaxBytes: 350})
	for range 5 {
		publishSized(t, b2, "e", 100)
	}
	st = b2.Stats()
	assert.Equal(t, 3, st.RingLen)
	assert.Equal(t, 300, st.RingBytes)

	require.NoError(t, b.Close())
	st = b.Stats()
	assert.Zero(t, st.RingLen)
	assert.Zero(t, st.RingBytes)
	assert.Equal(t, uint64(7), st.Published, "counters survive Close")
}

var statsSink11 Stats

func TestStatsDoesNotAllocate(t *testing.T) {
	b := newBus(t, Options{})
	subscribe(t, b, SubscribeOptions{})
	publishTypeN(t, b, "e", 3)
	assert.Zero(t, testing.AllocsPerRun(100, func() { statsSink11 = b.Stats() }))
}

func TestStatsTakesNoLock(t *testing.T) {
	b := newBus(t, Options{})
	publishTypeN(t, b, "e", 2)
	b.mu.Lock()
	got := make(chan Stats, 1)
	go func() { got <- b.Stats() }()
	select {
	case st := <-got:
		b.mu.Unlock()
		assert.Equal(t, uint64(2), st.Published)
	case <-time.After(5 * time.Second):
		b.mu.Unlock()
		<-got
		t.Fatal("Stats waited for the bus lock")
	}
}

func TestStatsConcurrentWithPublishers(t *testing.T) {
	const publishers, perPublisher = 4, 500
	b := newBus(t, Options{RingSize: 100, MaxQueued: 2048})
	s := subscribe(t, b, SubscribeOptions{})
	consumed := make(chan int)
	go func() {
		n := 0
		for range s.Events() {
			n++
		}
		consumed <- n
	}()
	stop := make(chan struct{})
	scraped := make(chan error)
	go func() {
		var last Stats
		for {
			st := b.Stats()
			if st.Published < last.Published || st.Signals < last.Signals || st.FramesDelivered < last.FramesDelivered {
				scraped <- fmt.Errorf("counters went back: %+v after %+v", st, last)
				return
			}
			last = st
			select {
			case <-stop:
				scraped <- nil
				return
			default:
			}
		}
	}()
	var wg sync.WaitGroup
	for range publishers {
		wg.Go(func() {
			for i := range perPublisher {
				_, _ = b.Publish(Event{Type: "e", Data: i})
				_ = b.Signal("s", fmt.Sprint(i%10))
			}
		})
	}
	wg.Wait()
	close(stop)
	require.NoError(t, <-scraped)
	assert.Equal(t, 100, b.Stats().RingLen)
	require.NoError(t, b.Close())
	n := <-consumed
	st := b.Stats()
	assert.Equal(t, uint64(publishers*perPublisher), st.Published)
	assert.Equal(t, uint64(publishers*perPublisher), st.Signals)
	assert.Equal(t, uint64(n), st.FramesDelivered)
	assert.Zero(t, st.RingLen, "Close empties the ring")
}

// ---------------------------------------------------------------------------
// OnDiagnostic.

// attrs11 returns a diagnostic's attributes by key.
func attrs11(d Diagnostic) map[string]any {
	m := map[string]any{}
	for _, a := range d.Attrs {
		m[a.Key] = a.Value.Any()
	}
	return m
}

// diagRecorder11 records diagnostics; suppress decides the return value.
type diagRecorder11 struct {
	mu       sync.Mutex
	got      []Diagnostic
	suppress func(Diagnostic) bool
}

func (r *diagRecorder11) on(d Diagnostic) bool {
	r.mu.Lock()
	r.got = append(r.got, d)
	r.mu.Unlock()
	return r.suppress != nil && r.suppress(d)
}

func (r *diagRecorder11) kinds() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, d := range r.got {
		out = append(out, d.Kind)
	}
	return out
}

func (r *diagRecorder11) take() []Diagnostic {
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.got
	r.got = nil
	return got
}

func TestOnDiagnosticReceivesEachDiagnosticWithAttrs(t *testing.T) {
	rec := &diagRecorder11{}
	b := newBus(t, Options{MaxQueued: 16, OnDiagnostic: rec.on})

	_, err := b.Publish(Event{Type: ""})
	require.Error(t, err)
	ds := rec.take()
	require.Len(t, ds, 1)
	assert.Equal(t, DiagPublishRejected, ds[0].Kind)
	assert.Equal(t, "eventbus: publish rejected", ds[0].Message)
	a := attrs11(ds[0])
	assert.Equal(t, "", a["type"])
	assert.Contains(t, a["error"], "empty type")

	evict := subscribe(t, b, SubscribeOptions{})
	resync := subscribe(t, b, SubscribeOptions{OverflowPolicy: OverflowResync})
	publishTypeN(t, b, "e", 12)
	ds = rec.take()
	require.Equal(t, []string{DiagSlowClient, DiagSlowClient}, []string{ds[0].Kind, ds[1].Kind})
	a = attrs11(ds[0])
	assert.Equal(t, "frames", a["threshold"])
	assert.Equal(t, uint64(12), a["lastEventId"])
	assert.Equal(t, int64(12), a["queueSize"])
	assert.Equal(t, int64(16), a["maxQueued"])
	assert.Equal(t, int64(DefaultMaxQueuedBytes), a["maxQueuedBytes"])
	assert.Positive(t, a["queuedBytes"])

	publishTypeN(t, b, "e", 5) // #13..#17: #17 overflows both
	ds = rec.take()
	require.Len(t, ds, 2)
	assert.Equal(t, DiagOverflowResync, ds[0].Kind)
	assert.Equal(t, map[string]any{"reason": "queue_overflow", "lastDeliveredId": uint64(0), "earliestAvailableId": uint64(17), "dropped": int64(16)},
		attrs11(ds[0]))
	assert.Equal(t, DiagEvicted, ds[1].Kind)
	a = attrs11(ds[1])
	assert.Equal(t, "queue_overflow", a["reason"])
	assert.Equal(t, uint64(17), a["droppedAfter"])
	assert.Equal(t, int64(16), a["queueSize"])
	assert.Equal(t, int64(16), a["maxQueued"])
	require.ErrorIs(t, evict.Err(), ErrEvicted)
	require.NoError(t, resync.Err())

	serveFailing11(t, b, 0, "0")
	ds = rec.take()
	require.Len(t, ds, 1)
	assert.Equal(t, DiagWriteFailed, ds[0].Kind)
	a = attrs11(ds[0])
	assert.Contains(t, a["error"], "broken pipe")
	assert.Equal(t, int64(18), a["dropped"], "17 replayed events + replay_complete")
}

func TestOnDiagnosticTrueSuppressesTheLogLine(t *testing.T) {
	logs := &logCapture{}
	rec := &diagRecorder11{suppress: func(d Diagnostic) bool { return d.Kind == DiagPublishRejected }}
	b := newBus(t, Options{MaxQueued: 16, OnDiagnostic: rec.on, Logger: logs.logger()})
	subscribe(t, b, SubscribeOptions{})
	_, _ = b.Publish(Event{Type: "bad\n"})
	publishTypeN(t, b, "e", 12) // slow_client, not suppressed
	assert.Equal(t, []string{DiagPublishRejected, DiagSlowClient}, rec.kinds(), "the callback sees both")
	out := logs.String()
	assert.NotContains(t, out, "publish rejected", "true suppresses the log line")
	assert.Contains(t, out, "eventbus: slow client", "false lets it through")
	assert.Contains(t, out, `"threshold":"frames"`, "with its attrs")
	assert.Equal(t, 1, strings.Count(out, "\n"))
}

func TestOnDiagnosticFalseLetsEveryLogLineThrough(t *testing.T) {
	logs := &logCapture{}
	rec := &diagRecorder11{}
	b := newBus(t, Options{MaxQueued: 16, OnDiagnostic: rec.on, Logger: logs.logger()})
	subscribe(t, b, SubscribeOptions{})
	subscribe(t, b, SubscribeOptions{OverflowPolicy: OverflowResync})
	_, _ = b.Publish(Event{Type: ""})
	publishTypeN(t, b, "e", 17)
	serveFailing11(t, b, 0, "")
	assert.ElementsMatch(t, []string{DiagPublishRejected, DiagSlowClient, DiagSlowClient, DiagOverflowResync, DiagEvicted, DiagWriteFailed},
		rec.kinds())
	out := logs.String()
	for _, msg := range []string{"publish rejected", "slow client", "slow client resynced", "subscriber evicted", "stream write failed"} {
		assert.Contains(t, out, "eventbus: "+msg)
	}
	assert.Equal(t, 6, strings.Count(out, "\n"))
}

func TestOnDiagnosticNeverCalledWithTheBusLockHeld(t *testing.T) {
	triggers := map[string]func(t *testing.T, b *EventBus){
		DiagPublishRejected: func(t *testing.T, b *EventBus) { _, _ = b.Publish(Event{}) },
		DiagSlowClient: func(t *testing.T, b *EventBus) {
			subscribe(t, b, SubscribeOptions{})
			publishTypeN(t, b, "e", 12)
		},
		DiagEvicted: func(t *testing.T, b *EventBus) {
			subscribe(t, b, SubscribeOptions{})
			publishTypeN(t, b, "e", 17)
		},
		DiagOverflowResync: func(t *testing.T, b *EventBus) {
			subscribe(t, b, SubscribeOptions{OverflowPolicy: OverflowResync})
			for range 17 {
				sendSignal(t, b, "s", fmt.Sprint(b.Stats().Signals)) // through Signal this time
			}
		},
		DiagWriteFailed: func(t *testing.T, b *EventBus) { serveFailing11(t, b, 0, "") },
	}
	for kind, trigger := range triggers {
		t.Run(kind, func(t *testing.T) {
			other := newBus(t, Options{})
			var b *EventBus
			var mu sync.Mutex
			var checked []string
			var problems []string
			on := func(d Diagnostic) bool {
				// The bus lock is free: TryLock succeeds, and every
				// method that takes it returns.
				if !b.mu.TryLock() {
					mu.Lock()
					problems = append(problems, d.Kind+": bus lock held")
					mu.Unlock()
				} else {
					b.mu.Unlock()
				}
				_ = b.SubscriberCount()
				_ = b.Stats()
				_ = b.LastEventID()
				if _, err := other.Publish(Event{Type: "from.callback"}); err != nil {
					mu.Lock()
					problems = append(problems, d.Kind+": "+err.Error())
					mu.Unlock()
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if s, err := b.Subscribe(ctx, SubscribeOptions{Types: []string{"none"}}); err == nil {
					s.Close()
				}
				mu.Lock()
				checked = append(checked, d.Kind)
				mu.Unlock()
				return true
			}
			b = newBus(t, Options{MaxQueued: 16, OnDiagnostic: on})
			done := make(chan struct{})
			go func() {
				defer close(done)
				trigger(t, b)
			}()
			waitClosed(t, done, "deadlock: a method called from OnDiagnostic waited for the bus lock")
			mu.Lock()
			defer mu.Unlock()
			assert.Empty(t, problems)
			assert.Contains(t, checked, kind)
			assert.Equal(t, uint64(len(checked)), other.Stats().Published)
		})
	}
}
