package eventbus

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The hub's byte budget (hub_budget.go): the sum of the rings never
// exceeds it, the largest rings lose their oldest events first, and every
// loss is announced with exact ids.

// sizedData is JSON data of about n bytes.
func sizedData(n int) json.RawMessage {
	return json.RawMessage(`"` + strings.Repeat("a", max(n-2, 0)) + `"`)
}

// ringsHeld sums what the rings hold, frame by frame, under each bus lock.
func ringsHeld(h *Hub) int64 {
	var sum int64
	for _, b := range h.Sessions() {
		b.mu.Lock()
		for i := range b.ring.Len() {
			sum += int64(b.ring.at(i).held())
		}
		b.mu.Unlock()
	}
	return sum
}

func TestHubBudgetNeverExceeded(t *testing.T) {
	const budgetBytes = 64 << 10
	h := newTestHub(t, HubOptions{MaxTotalBytes: budgetBytes, Bus: Options{MaxEventBytes: 16 << 10}})
	for i := range 2000 {
		id := "s" + strconv.Itoa(i%37)
		_, err := h.Publish(id, Event{Type: "t", Data: sizedData(100 + i*7919%(15<<10))})
		require.NoError(t, err)
		held := ringsHeld(h)
		require.LessOrEqual(t, held, int64(budgetBytes), "after publish %d", i)
		require.Equal(t, held, h.budget.used.Load(), "the budget counts the rings exactly")
	}
	st := h.Stats()
	assert.Positive(t, st.BudgetTrimmed)
	assert.Equal(t, ringsHeld(h), st.RingBytes)
	t.Logf("ring bytes %d of %d, %d events trimmed", st.RingBytes, st.MaxTotalBytes, st.BudgetTrimmed)
}

// A ring at its own bounds (RingSize, RingMaxBytes, MaxAge) drops its
// oldest for each publish: the budget counts the ring's net change, so it
// stays exact, and those drops are not the budget's trims.
func TestHubBudgetCountsTheRingsOwnDrops(t *testing.T) {
	h := newTestHub(t, HubOptions{Bus: Options{RingSize: 4, RingMaxBytes: 3000}})
	for i := range 40 {
		// Same-sized events, then sizes that make RingMaxBytes drop more
		// than one at a time.
		_, err := h.Publish("s", Event{Type: "t", Data: sizedData(100 + (i/10)*(i%3)*400)})
		require.NoError(t, err)
		require.Equal(t, ringsHeld(h), h.budget.used.Load(), "after publish %d", i)
	}
	b, _ := h.Lookup("s")
	assert.LessOrEqual(t, b.Stats().RingLen, 4)
	assert.Equal(t, ringsHeld(h), h.Stats().RingBytes)
	assert.Zero(t, h.Stats().BudgetTrimmed, "the ring's own bounds are not the budget's")
	require.NoError(t, b.Close())
	assert.Zero(t, h.budget.used.Load(), "Close gives every byte back")
}

// Concurrent publishers: once they stop, the rings are within the budget
// and the budget's count is exact (no reservation leaked).
func TestHubBudgetConcurrent(t *testing.T) {
	const budgetBytes = 256 << 10
	h := newTestHub(t, HubOptions{MaxTotalBytes: budgetBytes, Bus: Options{MaxEventBytes: 32 << 10}})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				_, err := h.Publish("s"+strconv.Itoa((g*500+i)%50), Event{Type: "t", Data: sizedData(1000 + (g*i*31)%(30<<10))})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	held := ringsHeld(h)
	assert.LessOrEqual(t, held, int64(budgetBytes))
	assert.Equal(t, held, h.budget.used.Load())
}

func TestHubBudgetTrimsTheLargestRingsFirst(t *testing.T) {
	// Room for about ten 1 KiB events.
	h := newTestHub(t, HubOptions{MaxTotalBytes: 10 << 10, Bus: Options{MaxEventBytes: 2 << 10}})
	ev := Event{Type: "t", Data: sizedData(900)}
	for range 6 {
		_, err := h.Publish("big", ev)
		require.NoError(t, err)
	}
	for range 2 {
		_, err := h.Publish("small", ev)
		require.NoError(t, err)
	}
	for range 3 {
		_, err := h.Publish("new", ev)
		require.NoError(t, err)
	}
	big, _ := h.Lookup("big")
	small, _ := h.Lookup("small")
	assert.Equal(t, 2, small.Stats().RingLen, "the small ring keeps its events")
	assert.Less(t, big.Stats().RingLen, 6, "the largest ring lost its oldest")
	assert.Equal(t, uint64(6), big.ring.lastID(), "oldest first: the newest stays")
	assert.LessOrEqual(t, ringsHeld(h), int64(10<<10))
}

// checkExact checks that a stream's frames lose nothing silently: each
// event follows the previous one or a ring_evicted resync whose ids are
// exactly those of the gap.
func checkExact(t *testing.T, fs []Frame, from uint64) (events, resyncs int) {
	t.Helper()
	last := from
	var announced uint64 // the earliestAvailableId of a resync just seen
	for _, f := range fs {
		switch {
		case f.ID() != 0:
			want := last + 1
			if announced != 0 {
				want = announced
			}
			require.Equal(t, want, f.ID(), "after %d (announced %d)", last, announced)
			last, announced = f.ID(), 0
			events++
		case f.Type() == TypeStateResyncRequired:
			var env struct {
				Data struct {
					Reason              string `json:"reason"`
					LastDeliveredID     uint64 `json:"lastDeliveredId"`
					EarliestAvailableID uint64 `json:"earliestAvailableId"`
				} `json:"data"`
			}
			require.NoError(t, json.Unmarshal(f.JSON(), &env))
			d := env.Data
			require.Equal(t, ReasonRingEvicted, d.Reason)
			if announced != 0 && d.LastDeliveredID == announced-1 {
				// A resync right after another one, before any event (the
				// budget put the subscriber behind again): it goes on from
				// where the first one said the stream resumes, and the
				// client's gap is the union of both.
				last = d.LastDeliveredID
			}
			require.Equal(t, last, d.LastDeliveredID, "the resync names the last event delivered")
			require.Greater(t, d.EarliestAvailableID, last+1, "a resync announces a real gap")
			announced = d.EarliestAvailableID
			resyncs++
		}
	}
	return events, resyncs
}

func TestHubBudgetResumeGetsExactRingEvicted(t *testing.T) {
	h := newTestHub(t, HubOptions{MaxTotalBytes: 10 << 10, Bus: Options{MaxEventBytes: 2 << 10}})
	ev := Event{Type: "t", Data: sizedData(900)}
	for range 15 {
		_, err := h.Publish("a", ev) // the largest ring: it loses its oldest
		require.NoError(t, err)
	}
	for range 3 {
		_, err := h.Publish("b", ev) // and again for b's
		require.NoError(t, err)
	}
	a, _ := h.Lookup("a")
	first := a.ring.firstID()
	require.True(t, first == 0 || first > 2, "a lost events to the budget (first %d)", first)
	earliest := first
	if first == 0 {
		earliest = a.LastEventID() + 1 // all of them
	}
	s, err := a.Subscribe(t.Context(), SubscribeOptions{Resume: true, LastEventID: 1})
	require.NoError(t, err)
	fs, _ := s.AppendReady(nil)
	require.Equal(t, TypeStateResyncRequired, fs[0].Type())
	assert.Contains(t, string(fs[0].JSON()), fmt.Sprintf(`"reason":"ring_evicted","lastDeliveredId":1,"earliestAvailableId":%d,`, earliest))
	checkExact(t, fs, 1)
	s.Close()

	// Through the Handler, with Last-Event-ID.
	mux := http.NewServeMux()
	mux.Handle("GET /s/{id}/events", &Handler{Lookup: h.LookupSession})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	got := hubStream(t, srv.URL+"/s/a/events", http.Header{"Last-Event-Id": {"1"}}, TypeReplayComplete)
	require.Equal(t, TypeStateResyncRequired, got[0].Type)
	assert.Contains(t, got[0].Data, fmt.Sprintf(`"reason":"ring_evicted","lastDeliveredId":1,"earliestAvailableId":%d,`, earliest))
}

// A budget that must empty a ring (events larger than what is left) still
// announces what a resume lost: the ring holds nothing, ring_evicted from
// the next id.
func TestHubBudgetEmptiedRingResume(t *testing.T) {
	h := newTestHub(t, HubOptions{MaxTotalBytes: 4 << 10, Bus: Options{MaxEventBytes: 3 << 10}})
	_, err := h.Publish("a", Event{Type: "t", Data: sizedData(2900)})
	require.NoError(t, err)
	_, err = h.Publish("b", Event{Type: "t", Data: sizedData(2900)})
	require.NoError(t, err)
	a, _ := h.Lookup("a")
	require.Zero(t, a.Stats().RingLen, "a's only event made room for b's")
	s, err := a.Subscribe(t.Context(), SubscribeOptions{Resume: true, LastEventID: 0})
	require.NoError(t, err)
	fs, _ := s.AppendReady(nil)
	require.Len(t, fs, 2)
	assert.Contains(t, string(fs[0].JSON()), `"reason":"ring_evicted","lastDeliveredId":0,"earliestAvailableId":2,`)
	assert.Equal(t, TypeReplayComplete, fs[1].Type())
}

// A subscriber catching up (OverflowCatchUp) reads its ring without the
// lock while the budget trims it: it still gets every event or an exact
// ring_evicted for the ones it lost.
func TestHubBudgetTrimsUnderACatchUpReader(t *testing.T) {
	h := newTestHub(t, HubOptions{MaxTotalBytes: 64 << 10, Bus: Options{
		MaxEventBytes: 4 << 10, MaxQueued: 4, OverflowPolicy: OverflowCatchUp,
	}})
	a, err := h.GetOrCreate("a")
	require.NoError(t, err)
	s, err := a.Subscribe(t.Context(), SubscribeOptions{})
	require.NoError(t, err)
	const n = 3000
	var got []Frame
	done := make(chan struct{})
	go func() {
		defer close(done)
		var buf []Frame
		for {
			var open bool
			buf, open = s.AppendReady(buf[:0])
			got = append(got, buf...)
			if !open {
				return
			}
			if len(buf) == 0 {
				<-s.Ready()
			}
			// The last event may be followed by a synthetic frame (its
			// slow_client_warning), so look for it in the whole batch:
			// waiting for more after it would wait for good.
			for _, f := range buf {
				if f.ID() == n {
					return
				}
			}
			if len(buf) > 0 && len(got)%7 == 0 {
				time.Sleep(50 * time.Microsecond) // a slow consumer falls behind
			}
		}
	}()
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range n {
			_, err := a.Publish(Event{Type: "t", Data: sizedData(200 + i%700)})
			if err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Go(func() { // other sessions press on the budget
		for i := range n {
			if _, err := h.Publish("o"+strconv.Itoa(i%5), Event{Type: "t", Data: sizedData(2000)}); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the consumer did not reach the last event")
	}
	s.Close()
	events, resyncs := checkExact(t, got, 0)
	st := a.Stats()
	t.Logf("%d events, %d ring_evicted resyncs, caught up %d times, %d trimmed", events, resyncs, st.CatchUp.Entered, h.Stats().BudgetTrimmed)
	lastID := uint64(0)
	for _, f := range got {
		lastID = max(lastID, f.ID())
	}
	assert.Equal(t, uint64(n), lastID)
	assert.Positive(t, st.CatchUp.Entered, "the consumer fell behind")
}

// The check: 1,000 sessions publishing 1 MiB events keep the heap
// within the budget plus the per-subscriber caps plus a small overhead.
func TestHubBudgetHoldsTheHeap(t *testing.T) {
	type size struct {
		sessions, eventBytes int
		budgetBytes          int64
		rounds               int
	}
	sz := pick(size{200, 256 << 10, 16 << 20, 1}, size{1000, 1 << 20, 64 << 20, 2}, size{1000, 1 << 20, 64 << 20, 10})
	if raceEnabled() && !proveLong() {
		// The detector checks every byte the JSON validator reads: 1 MiB
		// costs ~50 ms to publish (see TestMemoryBoundStalledSubscribers).
		sz.eventBytes, sz.budgetBytes, sz.rounds = 256<<10, 16<<20, 1
	}
	sessions, eventBytes, budgetBytes, rounds := sz.sessions, sz.eventBytes, sz.budgetBytes, sz.rounds
	const subscribers, overhead = 10, 8 << 20
	queueBytes := 2 * eventBytes // a subscriber holds up to its cap, at least one event
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	h, err := NewHub(HubOptions{MaxSessions: sessions, MaxTotalBytes: budgetBytes,
		Bus: Options{MaxEventBytes: eventBytes + 1024, MaxQueuedBytes: queueBytes}})
	require.NoError(t, err)
	data := sizedData(eventBytes)
	var subs []*Subscription
	peak := uint64(0)
	for round := range rounds {
		for i := range sessions {
			id := "s" + strconv.Itoa(i)
			_, err := h.Publish(id, Event{Type: "blob", Data: data})
			require.NoError(t, err)
			if round == 0 && i < subscribers {
				b, _ := h.Lookup(id)
				s, err := b.Subscribe(context.Background(), SubscribeOptions{}) // never read
				require.NoError(t, err)
				subs = append(subs, s)
			}
			if i%250 == 249 {
				var m runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&m)
				peak = max(peak, m.HeapAlloc)
			}
		}
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	peak = max(peak, after.HeapAlloc)
	st := h.Stats()
	grown := int64(peak) - int64(before.HeapAlloc) - int64(len(data))
	bound := budgetBytes + int64(subscribers*queueBytes) + overhead
	t.Logf("%d sessions x %d KiB events, %d rounds: budget %d MiB, rings hold %.1f MiB (%d events, %d trimmed); heap after GC grew by at most %.1f MiB (bound %.1f MiB = budget + %d subscribers x %d KiB + %d MiB)",
		sessions, eventBytes>>10, rounds, budgetBytes>>20, float64(st.RingBytes)/(1<<20), st.Buses.RingLen, st.BudgetTrimmed,
		float64(grown)/(1<<20), float64(bound)/(1<<20), subscribers, queueBytes>>10, overhead>>20)
	assert.LessOrEqual(t, st.RingBytes, budgetBytes)
	// Rings of one event each, all the same size: a trim takes what it
	// needs (down to a sixteenth below the budget), not every ring.
	assert.GreaterOrEqual(t, st.RingBytes, budgetBytes-budgetBytes/16-int64(eventBytes)-4096)
	assert.LessOrEqual(t, grown, bound)
	for _, s := range subs {
		s.Close()
	}
	require.NoError(t, h.Close())
}

// Small events: the budget counts what a frame costs (its header and ring
// slot too), so many small events stay within it as well.
func TestHubBudgetHoldsTheHeapWithSmallEvents(t *testing.T) {
	sessions, perSession := pick(100, 500, 1000), pick(200, 400, 2000)
	const budgetBytes, overhead = 8 << 20, 4 << 20
	base := liveHeap()
	h, err := NewHub(HubOptions{MaxSessions: sessions, MaxTotalBytes: budgetBytes, Bus: Options{MaxEventBytes: 4096}})
	require.NoError(t, err)
	ev := Event{Type: "t", Data: sizedData(200)}
	for range perSession {
		for s := range sessions {
			_, err := h.Publish("s"+strconv.Itoa(s), ev)
			require.NoError(t, err)
		}
	}
	heap := liveHeap()
	st := h.Stats()
	// The rings' slot arrays are not in the budget: 8 bytes a slot, the
	// power of two at or above the most events a ring held.
	slots := int64(0)
	for _, b := range h.Sessions() {
		b.mu.Lock()
		slots += int64(len(b.ring.slots)) * 8
		b.mu.Unlock()
	}
	grown := int64(heap) - int64(base)
	bound := int64(budgetBytes) + slots + overhead
	t.Logf("%d sessions x %d events of ~%d bytes: rings hold %.1f MiB of %d MiB (%d events, %d trimmed, held %d bytes each), slot arrays %.1f MiB; live heap grew by %.1f MiB (bound %.1f MiB)",
		sessions, perSession, len(ev.Data.(json.RawMessage)), float64(st.RingBytes)/(1<<20), budgetBytes>>20, st.Buses.RingLen, st.BudgetTrimmed,
		st.RingBytes/int64(max(st.Buses.RingLen, 1)), float64(slots)/(1<<20), float64(grown)/(1<<20), float64(bound)/(1<<20))
	assert.LessOrEqual(t, st.RingBytes, int64(budgetBytes))
	assert.LessOrEqual(t, grown, bound)
	require.NoError(t, h.Close())
}
