package eventbus

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What subscribers hold beyond their rings is counted in a Hub's budget
// and taken back from them, never from a healthy session's ring (issue
// 32: 8 stalled multiplexed streams of 32 sessions took a daemon with a
// 16 MiB budget to 535 MB).

// pinsEvent is an event whose frame costs about n bytes.
func pinsEvent(n int) Event { return Event{Type: "t", Data: sizedData(n)} }

// frameHeld is what the frame of an event costs in the budget.
func frameHeld(f Frame) int64 { return int64(f.frame.held()) }

// evictedData decodes a client_evicted frame's data.
func evictedData(t *testing.T, f Frame) (reason string, droppedAfter uint64) {
	t.Helper()
	require.Equal(t, TypeClientEvicted, f.Type())
	var env struct {
		Data struct {
			Reason       string `json:"reason"`
			DroppedAfter uint64 `json:"droppedAfter"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal(f.JSON(), &env))
	return env.Data.Reason, env.Data.DroppedAfter
}

// A subscriber that never reads holds what its ring drops: the session
// counts it as pinned, once per frame whoever else holds it, and the
// budget sees it.
func TestHubPinsCountWhatTheRingDropped(t *testing.T) {
	h := newTestHub(t, HubOptions{Bus: Options{RingSize: 2}})
	b, err := h.GetOrCreate("s")
	require.NoError(t, err)
	s1, err := b.Subscribe(t.Context(), SubscribeOptions{}) // never read
	require.NoError(t, err)
	s2, err := b.Subscribe(t.Context(), SubscribeOptions{}) // never read either: the same frames
	require.NoError(t, err)
	var held []int64
	for range 5 {
		f, err := h.Publish("s", pinsEvent(1000))
		require.NoError(t, err)
		held = append(held, frameHeld(f))
	}
	// The ring holds 4 and 5; 1..3 live on in both queues, counted once.
	want := held[0] + held[1] + held[2]
	b.mu.Lock()
	hs := b.owner.(*hubSession)
	hs.lookLocked(nil)
	b.mu.Unlock()
	assert.Equal(t, want, hs.pinned.Load())
	assert.Equal(t, want, h.Stats().PinnedBytes)
	assert.Equal(t, held[3]+held[4], h.Stats().RingBytes)
	// The estimate between looks only errs high.
	_, err = h.Publish("s", pinsEvent(1000))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, h.Stats().PinnedBytes, want+held[3])
	s1.Close()
	s2.Close()
	assert.Zero(t, h.Stats().PinnedBytes, "the holders let go")
}

// A stalled subscriber whose frames take the budget over is evicted with
// client_evicted memory_budget, whose droppedAfter is the first event it
// did not get; its queue is let go, and the ring of a healthy session is
// not touched.
func TestHubPinsEvictTheStalledSubscriberNotAHealthyRing(t *testing.T) {
	const budget = 64 << 10
	h := newTestHub(t, HubOptions{MaxTotalBytes: budget, Bus: Options{RingSize: 2, MaxEventBytes: 8 << 10}})
	for range 10 {
		_, err := h.Publish("healthy", pinsEvent(1000))
		require.NoError(t, err)
	}
	healthy, _ := h.Lookup("healthy")
	ringBefore := healthy.Stats().RingLen
	b, err := h.GetOrCreate("slow")
	require.NoError(t, err)
	s, err := b.Subscribe(t.Context(), SubscribeOptions{}) // never reads
	require.NoError(t, err)
	for i := 0; h.Stats().BudgetShed == 0; i++ {
		require.Less(t, i, 200, "the stalled subscriber was never shed")
		_, err := h.Publish("slow", pinsEvent(2000))
		require.NoError(t, err)
	}
	st := h.Stats()
	assert.Equal(t, uint64(1), st.Buses.Evictions.MemoryBudget)
	assert.Equal(t, ringBefore, healthy.Stats().RingLen, "the healthy session's ring is untouched")
	assert.Zero(t, st.BudgetTrimmed, "no ring was trimmed for the stalled subscriber")
	assert.LessOrEqual(t, st.RingBytes+st.PinnedBytes, int64(budget))
	assert.Positive(t, st.Buses.Dropped.MemoryBudget)

	frames, open := s.AppendReady(nil)
	require.False(t, open, "evicted: the end follows the terminal frame")
	require.Len(t, frames, 1, "its queue was let go: only the terminal frame is left")
	reason, droppedAfter := evictedData(t, frames[0])
	assert.Equal(t, ReasonMemoryBudget, reason)
	assert.Equal(t, uint64(1), droppedAfter, "it had taken nothing: it needs event 1")
	assert.ErrorIs(t, s.Err(), ErrEvicted)
	assert.Zero(t, h.Stats().PinnedBytes)
}

// A subscriber that reads some of its events before it stalls is told
// exactly where its stream stops: droppedAfter is the first event it did
// not take.
func TestHubPinsDroppedAfterIsExact(t *testing.T) {
	const budget = 64 << 10
	h := newTestHub(t, HubOptions{MaxTotalBytes: budget, Bus: Options{RingSize: 2, MaxEventBytes: 8 << 10}})
	b, err := h.GetOrCreate("slow")
	require.NoError(t, err)
	s, err := b.Subscribe(t.Context(), SubscribeOptions{})
	require.NoError(t, err)
	for range 3 {
		_, err := h.Publish("slow", pinsEvent(2000))
		require.NoError(t, err)
	}
	got, open := s.AppendReady(nil)
	require.True(t, open)
	require.Len(t, got, 3)
	for i := 0; h.Stats().BudgetShed == 0; i++ {
		require.Less(t, i, 200, "the stalled subscriber was never shed")
		_, err := h.Publish("slow", pinsEvent(2000))
		require.NoError(t, err)
	}
	frames, _ := s.AppendReady(nil)
	require.Len(t, frames, 1)
	_, droppedAfter := evictedData(t, frames[0])
	assert.Equal(t, uint64(4), droppedAfter)
}

// Under OverflowCatchUp nothing is evicted: the subscriber whose queued
// frames the budget takes back is put behind, and reads on from the ring,
// told exactly what the ring no longer holds.
func TestHubPinsPutACatchUpSubscriberBehind(t *testing.T) {
	const budget = 64 << 10
	h := newTestHub(t, HubOptions{MaxTotalBytes: budget, Bus: Options{RingSize: 4, MaxEventBytes: 8 << 10, OverflowPolicy: OverflowCatchUp}})
	b, err := h.GetOrCreate("slow")
	require.NoError(t, err)
	s, err := b.Subscribe(t.Context(), SubscribeOptions{})
	require.NoError(t, err)
	n := uint64(0)
	for h.Stats().BudgetShed == 0 {
		require.Less(t, n, uint64(200), "the stalled subscriber was never put behind")
		f, err := h.Publish("slow", pinsEvent(2000))
		require.NoError(t, err)
		n = f.ID()
	}
	st := h.Stats()
	assert.Zero(t, st.Buses.Evictions.MemoryBudget, "catch-up: nothing evicted")
	assert.Equal(t, 1, st.Buses.CatchUp.Behind)
	for range 3 {
		f, err := h.Publish("slow", pinsEvent(2000))
		require.NoError(t, err)
		n = f.ID()
	}
	var got []Frame
	for len(got) == 0 || got[len(got)-1].ID() != n {
		frames, open := s.AppendReady(nil)
		require.True(t, open)
		require.NotEmpty(t, frames, "it reads on from the ring")
		got = append(got, frames...)
	}
	events, resyncs := checkExact(t, got, 0)
	assert.Equal(t, 1, resyncs, "one ring_evicted for what the ring dropped")
	assert.Positive(t, events)
	assert.Zero(t, h.Stats().PinnedBytes)
}

// A subscriber evicted for its caps that never drains (its consumer is
// stuck) holds its queue beyond the ring: the budget drops it, and its
// terminal frame says memory_budget, from the first event it lost.
func TestHubPinsShedADrainingSubscriber(t *testing.T) {
	const budget = 64 << 10
	h := newTestHub(t, HubOptions{MaxTotalBytes: budget, Bus: Options{RingSize: 2, MaxQueued: 4, MaxEventBytes: 8 << 10}})
	b, err := h.GetOrCreate("slow")
	require.NoError(t, err)
	s, err := b.Subscribe(t.Context(), SubscribeOptions{})
	require.NoError(t, err)
	for range 5 { // the 5th overflows: evicted, 4 left to drain
		_, err := h.Publish("slow", pinsEvent(4000))
		require.NoError(t, err)
	}
	require.Equal(t, uint64(1), b.Stats().Evictions.QueueOverflow)
	require.Zero(t, h.Stats().BudgetShed, "the budget had room so far")
	// Other sessions' rings press on the budget: the frames the evicted
	// subscriber will never drain go first.
	for i := 0; h.Stats().BudgetShed == 0; i++ {
		require.Less(t, i, 200, "the draining subscriber was never shed")
		_, err := h.Publish("o"+strconv.Itoa(i), pinsEvent(4000))
		require.NoError(t, err)
	}
	frames, open := s.AppendReady(nil)
	require.False(t, open)
	for _, f := range frames {
		assert.Zero(t, f.ID(), "no event is left: only synthetic frames (its warning) and the terminal one")
	}
	reason, droppedAfter := evictedData(t, frames[len(frames)-1])
	assert.Equal(t, ReasonMemoryBudget, reason, "its client_evicted replaced")
	assert.Equal(t, uint64(1), droppedAfter)
	assert.Zero(t, h.Stats().PinnedBytes)
}

// A session deleted while a stalled subscriber drains stays counted until
// it lets go: the hub forgot the session, the budget did not.
func TestHubPinsOfAClosedSession(t *testing.T) {
	const budget = 64 << 10
	h := newTestHub(t, HubOptions{MaxTotalBytes: budget, Bus: Options{MaxEventBytes: 8 << 10}})
	b, err := h.GetOrCreate("gone")
	require.NoError(t, err)
	s, err := b.Subscribe(t.Context(), SubscribeOptions{})
	require.NoError(t, err)
	var held int64
	for range 5 {
		f, err := h.Publish("gone", pinsEvent(2000))
		require.NoError(t, err)
		held += frameHeld(f)
	}
	require.True(t, h.Delete("gone"))
	st := h.Stats()
	assert.Zero(t, st.RingBytes)
	assert.Equal(t, held, st.PinnedBytes, "its queue outlives the ring")
	for i := 0; h.Stats().BudgetShed == 0; i++ {
		require.Less(t, i, 200, "the closed session's subscriber was never shed")
		_, err := h.Publish("o"+strconv.Itoa(i), pinsEvent(4000))
		require.NoError(t, err)
	}
	frames, open := s.AppendReady(nil)
	require.False(t, open)
	assert.Empty(t, frames, "a plain close has no terminal frame; the queue was let go")
	assert.Zero(t, h.Stats().PinnedBytes)
	h.budget.retireMu.Lock()
	assert.Empty(t, h.budget.retired, "forgotten once it let go")
	h.budget.retireMu.Unlock()
}

// A transport that took a batch and is blocked writing it (TakeReady,
// without MarkWritten) is interrupted when the budget evicts it, once, and
// the frames it holds count as residual, never as a reason to trim rings.
func TestHubPinsInterruptATransportInAWrite(t *testing.T) {
	const budget = 64 << 10
	h := newTestHub(t, HubOptions{MaxTotalBytes: budget, Bus: Options{RingSize: 2, MaxEventBytes: 8 << 10}})
	b, err := h.GetOrCreate("slow")
	require.NoError(t, err)
	var interrupts atomic.Int32
	s, err := b.Subscribe(t.Context(), SubscribeOptions{Interrupt: func() { interrupts.Add(1) }})
	require.NoError(t, err)
	_, err = h.Publish("slow", pinsEvent(2000))
	require.NoError(t, err)
	batch, _ := s.TakeReady(nil) // its write blocks: never reported
	require.Len(t, batch, 1)
	for i := 0; h.Stats().BudgetShed == 0; i++ {
		require.Less(t, i, 200, "never shed")
		_, err := h.Publish("slow", pinsEvent(2000))
		require.NoError(t, err)
	}
	assert.Equal(t, int32(1), interrupts.Load())
	for range 20 { // more pressure: the residual batch triggers nothing
		_, err := h.Publish("healthy", pinsEvent(2000))
		require.NoError(t, err)
	}
	assert.Equal(t, int32(1), interrupts.Load(), "interrupted once")
	assert.Equal(t, uint64(1), h.Stats().BudgetShed)
	s.CloseBlocked(len(batch), nil)
	assert.Zero(t, h.Stats().PinnedBytes)
}

// TakeReady takes at most 256 KiB of envelopes (and at least one frame),
// so that a transport blocked in a write holds no more than that outside
// its caps; what it did not take stays queued, under the caps.
func TestTakeReadyIsBounded(t *testing.T) {
	b := newBus(t, Options{MaxQueuedBytes: 4 << 20})
	s, err := b.Subscribe(t.Context(), SubscribeOptions{})
	require.NoError(t, err)
	for range 20 {
		_, err := b.Publish(pinsEvent(80 << 10))
		require.NoError(t, err)
	}
	batch, open := s.TakeReady(nil)
	require.True(t, open)
	size := 0
	for _, f := range batch {
		size += f.Size()
	}
	assert.Len(t, batch, 4, "the frame that reaches 256 KiB ends the take")
	assert.GreaterOrEqual(t, size, takeReadyBytes)
	s.MarkWritten(len(batch))
	rest, _ := s.TakeReady(nil)
	assert.Len(t, rest, 4)
	assert.Equal(t, uint64(5), rest[0].ID(), "in order")
	s.MarkWritten(len(rest))
	for range 3 {
		more, _ := s.TakeReady(nil)
		s.MarkWritten(len(more))
	}
	_, err = b.Publish(pinsEvent(600 << 10)) // larger than the bound alone
	require.NoError(t, err)
	last, _ := s.TakeReady(nil)
	require.Len(t, last, 1, "a frame larger than the bound is taken alone")
	assert.Equal(t, uint64(21), last[0].ID())
}

// Many stalled subscribers over many sessions: what the daemon holds stays
// within the budget, whatever their number (the attack, without
// HTTP): the live heap grows by the budget and a small overhead, not by
// subscribers x MaxQueuedBytes.
func TestHubPinsHoldTheHeapWithManyStalledSubscribers(t *testing.T) {
	sessions, subsPer, eventBytes := pick(16, 32, 64), 8, pick(64<<10, 256<<10, 256<<10)
	if raceEnabled() && !proveLong() {
		eventBytes = 64 << 10
	}
	const budget, overhead = 16 << 20, 8 << 20
	base := liveHeap()
	h, err := NewHub(HubOptions{MaxTotalBytes: budget, Bus: Options{MaxEventBytes: eventBytes + 1024}})
	require.NoError(t, err)
	var subs []*Subscription
	for i := range sessions {
		b, err := h.GetOrCreate("s" + strconv.Itoa(i))
		require.NoError(t, err)
		for range subsPer {
			s, err := b.Subscribe(context.Background(), SubscribeOptions{}) // never read
			require.NoError(t, err)
			subs = append(subs, s)
		}
	}
	ev := pinsEvent(eventBytes)
	var peak int64
	// Four budgets' worth of events: every ring is trimmed, and every
	// subscriber holds what its ring dropped, up to its caps.
	rounds := 4*budget/(sessions*eventBytes) + 1
	for round := range rounds {
		for i := range sessions {
			_, err := h.Publish("s"+strconv.Itoa(i), ev)
			require.NoError(t, err)
		}
		st := h.Stats()
		require.LessOrEqual(t, st.RingBytes+st.PinnedBytes, int64(budget)+int64(eventBytes)+4096, "round %d", round)
		peak = max(peak, int64(liveHeap())-int64(base))
	}
	st := h.Stats()
	unbounded := int64(len(subs)) * int64(DefaultMaxQueuedBytes)
	t.Logf("%d sessions x %d stalled subscribers, %d KiB events: rings %.1f MiB, pinned %.1f MiB, shed %d; live heap grew by at most %.1f MiB (budget %d MiB; without the budget up to %d MiB)",
		sessions, subsPer, eventBytes>>10, float64(st.RingBytes)/(1<<20), float64(st.PinnedBytes)/(1<<20), st.BudgetShed,
		float64(peak)/(1<<20), budget>>20, unbounded>>20)
	assert.Positive(t, st.BudgetShed)
	assert.LessOrEqual(t, peak, int64(budget+overhead))
	for _, s := range subs {
		s.Close()
	}
	require.NoError(t, h.Close())
}

// Over HTTP: a multiplexed stream whose client never reads is blocked in a
// write when the budget sheds its subscriptions; the MuxHandler's
// Interrupt makes that write fail at once, and the handler returns and
// lets go of what it held, long before its write deadline.
func TestHubPinsInterruptAStalledMultiplexedStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const budget = 64 << 10
		hub, err := NewHub(HubOptions{MaxTotalBytes: budget, Bus: Options{Now: testNow, RingSize: 2, MaxEventBytes: 8 << 10}})
		require.NoError(t, err)
		defer hub.Close()
		for _, id := range []string{"a", "b"} {
			_, err := hub.GetOrCreate(id)
			require.NoError(t, err)
		}
		returned := make(chan struct{})
		m := &MuxHandler{Handler: withLookup(&Handler{RetryJitter: -1, WriteTimeout: time.Minute}, hub.LookupSession)}
		mux := http.NewServeMux()
		mux.HandleFunc("GET /events", func(w http.ResponseWriter, r *http.Request) {
			defer close(returned)
			m.ServeHTTP(w, r)
		})
		ln, srv, client, served := pipeHTTP(mux, false)
		defer func() {
			client.CloseIdleConnections()
			_ = srv.Close()
			<-served
		}()
		// The client reads the response's head and the retry: line, then
		// stops: the handler's next write blocks with a batch in hand.
		stuck := neverReads(t, ln, "/events?session=a&session=b")
		defer stuck.Close()
		head := make([]byte, 0, 1024)
		for !strings.HasSuffix(string(head), "retry: 3000\n\r\n") { // the first chunk, read whole
			buf := make([]byte, 1)
			_, err := stuck.Read(buf)
			require.NoError(t, err)
			head = append(head, buf...)
		}
		synctest.Wait()
		a, _ := hub.Lookup("a")
		require.Equal(t, 1, a.SubscriberCount())
		start := time.Now()
		_, err = hub.Publish("a", pinsEvent(2000))
		require.NoError(t, err)
		synctest.Wait() // the handler took it and blocks writing it
		for i := 0; hub.Stats().BudgetShed == 0; i++ {
			require.Less(t, i, 200, "never shed")
			_, err := hub.Publish("a", pinsEvent(2000))
			require.NoError(t, err)
		}
		synctest.Wait()
		select {
		case <-returned:
		default:
			t.Fatal("the handler is still blocked in its write")
		}
		assert.Equal(t, start, time.Now(), "at once, not at the write deadline")
		assert.Zero(t, a.SubscriberCount())
		b, _ := hub.Lookup("b")
		assert.Zero(t, b.SubscriberCount(), "the whole stream ended")
		assert.Zero(t, hub.Stats().PinnedBytes)
	})
}
