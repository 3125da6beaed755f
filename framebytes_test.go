package eventbus

import (
	"encoding/json"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// maxType is a fresh type of MaxTypeLen bytes: a new string each call, as a
// daemon that decodes types from requests holds one per event.
func maxType(i int) string {
	s := strconv.Itoa(i)
	return strings.Repeat("t", MaxTypeLen-len(s)) + s
}

// sseAndType is what a frame holds that grows with its event, computed
// from its parts: its SSE bytes, its type string and a signal's resource.
func sseAndType(fs ...Frame) int {
	n := 0
	for _, f := range fs {
		n += len(f.SSE()) + len(f.Type()) + len(f.About())
	}
	return n
}

// Events of the longest type under small byte caps: the ring, a queue and
// a replay hold within their caps counting every byte a frame holds that
// grows with the event (its SSE encoding, so the type's copy in the event
// line, and its type string), not only its envelope, which is a third of
// such a frame.
func TestByteCapsCountEveryByteOfMaxTypeEvents(t *testing.T) {
	const ringCap, queueCap = 4096, 3000
	b := newBus(t, Options{RingMaxBytes: ringCap, MaxQueuedBytes: queueCap, ReplayBudgetBytes: 2000})
	s := subscribe(t, b, SubscribeOptions{}) // never reads until evicted
	var pub []Frame
	for i := range 24 {
		f := publishEvent(t, b, Event{Type: maxType(i), Data: i})
		pub = append(pub, f)
		require.Equal(t, sseAndType(f), f.Size())
		require.Greater(t, f.Size(), 2*MaxTypeLen+len(f.JSON()), "the type counts in the event line and as a string")

		st := b.Stats()
		held := pub[len(pub)-st.RingLen:]
		require.Equal(t, sseAndType(held...), st.RingBytes, "RingBytes sums what the ring's frames hold")
		require.LessOrEqual(t, st.RingBytes, ringCap)
		if len(held) < len(pub) {
			require.Greater(t, sseAndType(pub[len(pub)-st.RingLen-1:]...), ringCap, "the ring drops only what it must")
		}
	}
	// 24 frames of ~870 bytes: the ring holds 4 (it held 12 when the cap
	// counted envelopes, ~330 bytes each).
	assert.Equal(t, 4, b.Stats().RingLen)

	// The queue: 3 frames fit in 3000 bytes (the warning at 2250), the 4th
	// is rejected; the warning's and the eviction's counts are in the same
	// unit.
	fs := readyNow(s)
	require.Equal(t, seqOf(idRange(1, 3), TypeSlowClientWarning, TypeClientEvicted), describe(fs))
	var warn, ev struct {
		Data struct{ QueuedBytes, MaxQueuedBytes, EventBytes int }
	}
	require.NoError(t, json.Unmarshal(fs[3].JSON(), &warn))
	assert.Equal(t, sseAndType(pub[:3]...), warn.Data.QueuedBytes)
	require.NoError(t, json.Unmarshal(fs[4].JSON(), &ev))
	assert.Equal(t, sseAndType(pub[:3]...), ev.Data.QueuedBytes)
	assert.LessOrEqual(t, ev.Data.QueuedBytes, queueCap)
	assert.Equal(t, queueCap, ev.Data.MaxQueuedBytes)
	assert.Equal(t, sseAndType(pub[3]), ev.Data.EventBytes)
	assert.Greater(t, ev.Data.QueuedBytes+ev.Data.EventBytes, queueCap)

	// A live queue's bytes after a signal of the longest type: its
	// resource counts too.
	s2 := subscribe(t, b, SubscribeOptions{})
	about := strings.Repeat("r", 500)
	require.NoError(t, b.Signal(maxType(99), about))
	f := publishEvent(t, b, Event{Type: maxType(100), Data: 1})
	c := s2.q.counts()
	assert.Equal(t, 2, c.liveCount)
	assert.Equal(t, len(signalFrame(maxType(99), about, testStamp).SSE())+MaxTypeLen+len(about)+sseAndType(f), c.liveBytes)

	// The replay budget (the ring holds #22..#25): 2000 bytes replay two
	// such frames, not the four the ring holds (six by envelopes).
	r := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 21})
	got := readyNow(r)
	require.Equal(t, seqOf(idRange(22, 23), TypeStateResyncRequired, TypeReplayComplete), describe(got))
	assert.Equal(t, sseAndType(pub[21:23]...), sseAndType(got[:2]...))
	assert.LessOrEqual(t, sseAndType(got[:2]...), 2000)
	assert.Greater(t, sseAndType(pub[21:24]...), 2000)
}

// The probe, at the type limit: events of the longest type, each a
// fresh string as a daemon decoding requests holds it, on buses whose ring
// cap would have held all 24 when it counted envelopes. The heap grows by
// at most the ring caps plus a fixed amount per frame held (header, ring
// slot, id room, allocator rounding) and each ring's slot array, measured
// with runtime.ReadMemStats after a collection.
func TestMemoryMaxTypeEventsStayWithinTheRingCap(t *testing.T) {
	const events = 24
	// Big enough for 24 envelopes (~330 bytes), not for 24 frames
	// (~870): a third of what the envelope count would have let in.
	const ringCap = 8 << 10
	buses := pick(64, 400, 1000)
	bs := make([]*EventBus, buses)
	for i := range bs {
		bs[i] = newBus(t, Options{RingMaxBytes: ringCap})
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, b := range bs {
		for i := range events {
			typ := string([]byte(maxType(i))) // a fresh copy per event
			if _, err := b.Publish(Event{Type: typ, Data: json.RawMessage(`{"n":1}`)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held, frames := 0, 0
	for _, b := range bs {
		st := b.Stats()
		require.LessOrEqual(t, st.RingBytes, ringCap)
		held += st.RingBytes
		frames += st.RingLen
	}
	// Per frame: its header and ring slot (frameOverhead), at most
	// 2*maxDigits of id room and the allocator's rounding of its buffer
	// and its type (size classes are at most 1/8 apart here: ~110 bytes);
	// per bus, its 16 ring slots.
	perFrame := frameOverhead + 2*maxDigits + 128
	bound := int64(buses)*(ringCap+16*8) + int64(frames)*int64(perFrame)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d buses x %d events of a %d-byte type: heap +%d bytes for %d frames (%d bytes by Size, %d per bus); bound %d; envelope-counted rings would hold %d frames",
		buses, events, MaxTypeLen, grown, frames, held, grown/int64(buses), bound, buses*events)
	assert.LessOrEqual(t, grown, bound)
	runtime.KeepAlive(bs)
}
