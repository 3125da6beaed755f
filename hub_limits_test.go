package eventbus

import (
	"encoding/json"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Options.MaxAge, MaxTypeLen, and the hub's lifecycle over many sessions.

func TestMaxAgeResumePastItIsRingEvicted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := New(Options{MaxAge: time.Minute})
		require.NoError(t, err)
		defer b.Close()
		for i := range 3 {
			_, err := b.Publish(hubEvent(i)) // ids 1..3 at 0s
			require.NoError(t, err)
		}
		time.Sleep(30 * time.Second)
		_, err = b.Publish(hubEvent(4)) // id 4 at 30s
		require.NoError(t, err)
		assert.Equal(t, 4, b.Stats().RingLen, "nothing is a minute old yet")

		time.Sleep(30*time.Second + time.Millisecond) // ids 1..3 are past a minute
		s, err := b.Subscribe(t.Context(), SubscribeOptions{Resume: true, LastEventID: 1})
		require.NoError(t, err)
		fs, _ := s.AppendReady(nil)
		require.Len(t, fs, 3)
		assert.Contains(t, string(fs[0].JSON()), `"reason":"ring_evicted","lastDeliveredId":1,"earliestAvailableId":4,`)
		assert.Equal(t, uint64(4), fs[1].ID())
		assert.Equal(t, TypeReplayComplete, fs[2].Type())
		assert.Equal(t, 1, b.Stats().RingLen)
		s.Close()

		time.Sleep(time.Minute) // id 4 too: the ring is empty
		s, err = b.Subscribe(t.Context(), SubscribeOptions{Resume: true, LastEventID: 2})
		require.NoError(t, err)
		fs, _ = s.AppendReady(nil)
		require.Len(t, fs, 2)
		assert.Contains(t, string(fs[0].JSON()), `"reason":"ring_evicted","lastDeliveredId":2,"earliestAvailableId":5,`)
		s.Close()
		// A client that has everything is told nothing.
		s, err = b.Subscribe(t.Context(), SubscribeOptions{Resume: true, LastEventID: 4})
		require.NoError(t, err)
		fs, _ = s.AppendReady(nil)
		require.Len(t, fs, 1)
		assert.Equal(t, TypeReplayComplete, fs[0].Type())
		s.Close()
	})
}

// A publish drops what aged meanwhile, and a quiet session's ring is
// emptied by the hub's sweep.
func TestMaxAgeAtPublishAndSweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, err := NewHub(HubOptions{IdleTimeout: time.Hour, Bus: Options{MaxAge: 10 * time.Second}})
		require.NoError(t, err)
		defer h.Close()
		_, err = h.Publish("s", hubEvent(1))
		require.NoError(t, err)
		time.Sleep(11 * time.Second)
		_, err = h.Publish("s", hubEvent(2))
		require.NoError(t, err)
		b, _ := h.Lookup("s")
		assert.Equal(t, 1, b.Stats().RingLen, "the publish dropped the aged event")
		b.mu.Lock()
		assert.Equal(t, uint64(2), b.ring.firstID())
		b.mu.Unlock()
		time.Sleep(12 * time.Second) // the sweep, every 1.25s, drops id 2
		synctest.Wait()
		assert.Zero(t, b.Stats().RingLen)
		assert.Zero(t, h.Stats().RingBytes)
		assert.Zero(t, h.budget.used.Load(), "aged bytes go back to the budget")
		assert.Equal(t, 1, h.Len(), "age retention does not expire the session")
	})
}

func TestMaxTypeLen(t *testing.T) {
	b, err := New(Options{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer b.Close()
	s, err := b.Subscribe(t.Context(), SubscribeOptions{})
	require.NoError(t, err)
	at, past := strings.Repeat("a", MaxTypeLen), strings.Repeat("a", MaxTypeLen+1)

	_, err = b.Publish(Event{Type: past})
	require.ErrorIs(t, err, ErrInvalidEvent)
	assert.Contains(t, err.Error(), "MaxTypeLen")
	require.ErrorIs(t, b.Signal(past, "x"), ErrInvalidEvent)
	assert.Zero(t, b.LastEventID(), "no id used")
	fs, _ := s.AppendReady(nil)
	assert.Empty(t, fs, "nobody got it")
	assert.Equal(t, uint64(2), b.Stats().Rejected.Invalid)

	f, err := b.Publish(Event{Type: at})
	require.NoError(t, err)
	assert.Equal(t, uint64(1), f.ID(), "the first id is still free")
	require.NoError(t, b.Signal(at, "x"))
	fs, _ = s.AppendReady(nil)
	require.Len(t, fs, 2)
	assert.Equal(t, at, fs[0].Type())
	assert.Equal(t, at, fs[1].Type())

	// The encoder and a type filter agree with Publish.
	enc, err := NewEncoder(Options{})
	require.NoError(t, err)
	_, err = enc.Encode(Event{Type: past})
	require.ErrorIs(t, err, ErrInvalidEvent)
	require.ErrorIs(t, enc.CheckSignal(past, ""), ErrInvalidEvent)
}

// A frame's type is in its event: line, its envelope and its type string:
// the budget counts all three (frame.held), with the frame's buffer, header
// and ring slot; the bus's byte caps, which count the envelope, leave out a
// bounded amount per event.
func TestFrameHeldCountsEveryByte(t *testing.T) {
	b, err := New(Options{})
	require.NoError(t, err)
	defer b.Close()
	for _, typ := range []string{"t", strings.Repeat("x", MaxTypeLen)} {
		f, err := b.Publish(Event{Type: typ, Data: json.RawMessage(`{"a":1}`)})
		require.NoError(t, err)
		wire := f.AppendSSE(nil)
		room := 2 * (maxDigits - len(strconv.FormatUint(f.ID(), 10))) // before the wire, in its buffer
		assert.Equal(t, len(wire)+room+len(typ)+frameOverhead, f.held())
		assert.Equal(t, len(f.JSON()), f.Size())
		assert.LessOrEqual(t, f.held()-f.Size(), maxFrameExtra)
	}
	// The reservation a publish makes is the frame's held, whatever its id.
	for _, id := range []uint64{1, 12345, 1<<64 - 1} {
		p, err := b.enc.encode(Event{Type: "typ", Data: json.RawMessage(`[1]`)}, 1)
		require.NoError(t, err)
		fr := p.build(id)
		assert.Equal(t, p.maxSize(), int64(fr.held()), "id %d", id)
	}
	assert.Positive(t, frameOverhead)
}

// The check: 100,000 sessions created and expired leave no
// goroutine and no memory behind.
func TestHubCreateExpireCyclesLeaveNothing(t *testing.T) {
	rounds, perRound := pick(10, 100, 1000), 1000
	clock := newHubClock()
	h := newTestHub(t, HubOptions{MaxSessions: perRound, IdleTimeout: time.Minute, Bus: Options{Now: clock.now}})
	cycle := func(round int) {
		for i := range perRound {
			id := "r" + strconv.Itoa(round) + "s" + strconv.Itoa(i)
			_, err := h.Publish(id, hubEvent(i))
			require.NoError(t, err)
			if i%10 == 0 {
				b, _ := h.Lookup(id)
				s, err := b.Subscribe(t.Context(), SubscribeOptions{Resume: true})
				require.NoError(t, err)
				s.Close()
			}
		}
		require.Equal(t, perRound, h.Len())
		clock.advance(time.Minute)
		h.sweep()
		require.Zero(t, h.Len())
	}
	cycle(0) // warm up: maps and pools at their size
	goroutines := runtime.NumGoroutine()
	base := liveHeap()
	for r := 1; r < rounds; r++ {
		cycle(r)
	}
	heap := liveHeap()
	st := h.Stats()
	t.Logf("%d sessions created and expired: live heap %+.2f MiB after GC (from %.2f MiB), goroutines %d -> %d",
		st.Expired, (float64(heap)-float64(base))/(1<<20), float64(base)/(1<<20), goroutines, runtime.NumGoroutine())
	assert.Equal(t, uint64(rounds*perRound), st.Expired)
	assert.Equal(t, uint64(rounds*perRound), st.Created)
	assert.Zero(t, st.RingBytes)
	assert.Zero(t, h.budget.used.Load())
	assert.LessOrEqual(t, runtime.NumGoroutine(), goroutines)
	assert.Less(t, float64(heap), float64(base)+1<<20, "no memory left behind")
}
