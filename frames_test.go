package eventbus

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAppendSSEEventFrameFormat(t *testing.T) {
	b := newBus(t, Options{})
	f := publishEvent(t, b, Event{Type: "session_update", Data: map[string]int{"a": 1}})
	want := "id: 1\nevent: session_update\ndata: " +
		`{"id":1,"v":1,"type":"session_update","data":{"a":1},"_meta":{"serverTimestamp":1719000000000}}` + "\n\n"
	assert.Equal(t, want, string(f.AppendSSE(nil)))
	assert.Equal(t, "prefix:"+want, string(f.AppendSSE([]byte("prefix:"))))
	assert.Equal(t, want, f.String())
}

func TestAppendSSESyntheticFrameHasNoIDLine(t *testing.T) {
	f := replayCompleteFrame(0, 0, "E", 5)
	assert.Equal(t,
		"event: replay_complete\ndata: "+`{"v":1,"type":"replay_complete","data":{"replayedCount":0,"epoch":"E"},"_meta":{"serverTimestamp":5}}`+"\n\n",
		string(f.AppendSSE(nil)))
}

func TestSyntheticFramesHaveNoID(t *testing.T) {
	c := queueCounts{liveCount: 12, maxQueued: 16, liveBytes: 100, maxBytes: 1000}
	for _, f := range []Frame{
		replayCompleteFrame(3, 9, "E", 1),
		resyncFrame(ReasonRingEvicted, "", 1, 5, "E", 1),
		warningFrame(c, 7, "frames", 1),
		evictedFrame(ReasonQueueOverflow, 8, c, -1, 1),
		StreamErrorFrame("boom", "internal"),
	} {
		assert.Equal(t, uint64(0), f.ID(), f.Type())
		assert.True(t, f.Synthetic(), f.Type())
		assert.False(t, bytes.HasPrefix(f.AppendSSE(nil), []byte("id:")), f.Type())
		var env map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(f.JSON(), &env))
		assert.NotContains(t, env, "id", f.Type())
		assert.Equal(t, "1", string(env["v"]))
		assert.Equal(t, `"`+f.Type()+`"`, string(env["type"]))
	}
}

func TestTerminalFrames(t *testing.T) {
	c := queueCounts{}
	assert.True(t, evictedFrame(ReasonQueueOverflow, 1, c, -1, 1).Terminal())
	assert.True(t, StreamErrorFrame("x", "internal").Terminal())
	assert.False(t, replayCompleteFrame(0, 0, "E", 1).Terminal())
	assert.False(t, resyncFrame(ReasonEpochReset, "", 1, 1, "E", 1).Terminal())
	assert.False(t, warningFrame(c, 1, "frames", 1).Terminal())

	b := newBus(t, Options{})
	f := publishEvent(t, b, Event{Type: "client_evicted"}) // a published event is never terminal
	assert.False(t, f.Terminal())
	assert.False(t, f.Synthetic())
}

func TestStreamErrorFrameData(t *testing.T) {
	before := time.Now().UnixMilli()
	f := StreamErrorFrame("write \"failed\"\n<now>", "internal")
	after := time.Now().UnixMilli()
	assert.Equal(t, TypeStreamError, f.Type())
	assert.Equal(t, `{"error":"write \"failed\"\n<now>","errorKind":"internal"}`, dataOf(t, f))
	var env struct {
		Meta struct {
			ServerTimestamp int64 `json:"serverTimestamp"`
		} `json:"_meta"`
	}
	require.NoError(t, json.Unmarshal(f.JSON(), &env))
	assert.GreaterOrEqual(t, env.Meta.ServerTimestamp, before)
	assert.LessOrEqual(t, env.Meta.ServerTimestamp, after)
	assert.False(t, bytes.ContainsAny(f.JSON(), "\r\n"))
}

func TestSyntheticFrameEnvelope(t *testing.T) {
	c := queueCounts{liveCount: 12, maxQueued: 16, liveBytes: 1234, maxBytes: 2097152}
	for _, tc := range []struct {
		f    Frame
		want string
	}{
		{replayCompleteFrame(0, 0, "E", 7),
			`{"v":1,"type":"replay_complete","data":{"replayedCount":0,"epoch":"E"},"_meta":{"serverTimestamp":7}}`},
		{replayCompleteFrame(3, 9, "E", 7),
			`{"v":1,"type":"replay_complete","data":{"replayedCount":3,"lastReplayedEventId":9,"lastEventId":9,"epoch":"E"},"_meta":{"serverTimestamp":7}}`},
		{resyncFrame(ReasonRingEvicted, "", 2, 5, "E", 7),
			`{"v":1,"type":"state_resync_required","data":{"reason":"ring_evicted","lastDeliveredId":2,"earliestAvailableId":5,"epoch":"E"},"_meta":{"serverTimestamp":7}}`},
		{resyncFrame(ReasonEpochReset, "epoch_mismatch", 2, 1, "E", 7),
			`{"v":1,"type":"state_resync_required","data":{"reason":"epoch_reset","detail":"epoch_mismatch","lastDeliveredId":2,"earliestAvailableId":1,"epoch":"E"},"_meta":{"serverTimestamp":7}}`},
		{warningFrame(c, 12, "frames", 7),
			`{"v":1,"type":"slow_client_warning","data":{"queueSize":12,"maxQueued":16,"lastEventId":12,"queuedBytes":1234,"maxQueuedBytes":2097152,"threshold":"frames"},"_meta":{"serverTimestamp":7}}`},
		{evictedFrame(ReasonQueueOverflow, 17, c, -1, 7),
			`{"v":1,"type":"client_evicted","data":{"reason":"queue_overflow","droppedAfter":17,"queueSize":12,"maxQueued":16,"queuedBytes":1234,"maxQueuedBytes":2097152},"_meta":{"serverTimestamp":7}}`},
		{evictedFrame(ReasonQueueBytesOverflow, 17, c, 999, 7),
			`{"v":1,"type":"client_evicted","data":{"reason":"queue_bytes_overflow","droppedAfter":17,"queueSize":12,"maxQueued":16,"queuedBytes":1234,"maxQueuedBytes":2097152,"eventBytes":999},"_meta":{"serverTimestamp":7}}`},
	} {
		assert.Equal(t, tc.want, string(tc.f.JSON()))
		assert.Equal(t, "event: "+tc.f.Type()+"\ndata: "+tc.want+"\n\n", tc.f.String())
		assert.True(t, json.Valid(tc.f.JSON()))
	}
}

// Size is the envelope, what follows "data: " on the wire, for every kind
// of frame and whatever its type: the unit of the byte caps and of the
// numbers on the wire (SPEC 2).
func TestFrameSizeIsTheEnvelope(t *testing.T) {
	b := newBus(t, Options{})
	f := publishEvent(t, b, Event{Type: "session_update", Data: json.RawMessage(`{"a":1}`)})
	assert.Equal(t, `{"id":1,"v":1,"type":"session_update","data":{"a":1},"_meta":{"serverTimestamp":1719000000000}}`, string(f.JSON()))
	assert.Equal(t, 95, f.Size())

	long := publishEvent(t, b, Event{Type: maxType(0), Data: 1})
	entry, err := entryFrame(LogEntry{ID: 7, Type: maxType(1), JSON: []byte(`{"id":7,"v":1,"type":"` + maxType(1) + `"}`)})
	require.NoError(t, err)
	for _, f := range []Frame{
		long, entry,
		replayCompleteFrame(1, 1, "E", 1),
		warningFrame(queueCounts{1, 16, 100, 1000}, 1, "bytes", 1),
		signalFrame("doc.changed", "doc/42", testStamp),
		signalFrame(maxType(2), strings.Repeat("r", 500), testStamp),
		StreamErrorFrame("boom", ErrorKindInternal),
	} {
		assert.Equal(t, len(f.JSON()), f.Size(), "%s", f.Type())
		assert.True(t, bytes.HasSuffix(f.SSE(), []byte("\ndata: "+string(f.JSON())+"\n\n")), "the envelope is what follows data: (%s)", f.Type())
	}
	assert.Equal(t, len(`{"id":7,"v":1,"type":""}`)+MaxTypeLen, entry.Size())
}

// What a frame costs beyond its envelope is at most maxFrameExtra, the
// figure the docs state (660 bytes on 64-bit), whatever the kind of frame
// and its type, a signal's resource aside; an event of the longest type
// and a one-digit id reaches it.
func TestFrameCostBeyondTheEnvelopeIsBounded(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) == 8 {
		assert.Equal(t, 660, maxFrameExtra, "the figure in Frame.Size's, Options' and HubOptions' docs")
	}
	assert.Equal(t, 2*MaxTypeLen+60+frameOverhead, maxFrameExtra, "Frame.Size's doc: 2*MaxTypeLen+148 with an 88-byte header and slot")

	b := newBus(t, Options{})
	worst := publishEvent(t, b, Event{Type: maxType(0), Data: 1})
	assert.Equal(t, maxFrameExtra, worst.held()-worst.Size(), "an event of the longest type and a one-digit id")

	escaped := strings.Repeat("\x01", MaxTypeLen) // six bytes each in JSON
	entry, err := entryFrame(LogEntry{ID: 1, Type: maxType(1), JSON: []byte(`{"id":1,"v":1,"type":"` + maxType(1) + `"}`)})
	require.NoError(t, err)
	frames := []Frame{
		worst, entry,
		publishEvent(t, b, Event{Type: "t"}),
		publishEvent(t, b, Event{Type: escaped, Data: strings.Repeat("x", 1000)}),
		warningFrame(queueCounts{1, 16, 100, 1000}, 1, "bytes", 1),
		evictedFrame(ReasonQueueBytesOverflow, 1, queueCounts{1, 16, 100, 1000}, 100, 1),
		StreamErrorFrame(strings.Repeat("\x02", 300), ErrorKindInternal),
	}
	for i := range 20 { // ids of one to eighteen digits, each on a bus of its own
		b2 := newBus(t, Options{})
		b2.nextID = uint64(1) << (3 * i)
		frames = append(frames, publishEvent(t, b2, Event{Type: maxType(i), Data: i}))
	}
	for _, f := range frames {
		require.LessOrEqual(t, f.held()-f.Size(), maxFrameExtra, "%d %q", f.ID(), f.Type())
	}
	for _, about := range []string{"doc/42", strings.Repeat("r", 5000), strings.Repeat("\n", 100)} {
		for _, typ := range []string{"doc.changed", maxType(3), escaped} {
			f := signalFrame(typ, about, testStamp)
			require.LessOrEqual(t, f.held()-len(f.About())-f.Size(), maxFrameExtra, "a signal keeps its resource beside its envelope")
			// Synthetic frames and signals are made to their exact length:
			// no slack past the frame, however much the type escapes.
			require.Equal(t, len(f.SSE()), cap(f.SSE()))
		}
	}
	for _, f := range frames[4:7] {
		require.Equal(t, len(f.SSE()), cap(f.SSE()), "%s", f.Type())
	}
}

func TestFrameJSONCannotBeGrownIntoTheWire(t *testing.T) {
	b := newBus(t, Options{})
	f := publishEvent(t, b, Event{Type: "t"})
	wire := f.String()
	j := f.JSON()
	assert.Equal(t, len(j), cap(j))
	_ = append(j, 'X', 'X')
	assert.Equal(t, wire, f.String())
}

func TestZeroFrame(t *testing.T) {
	var f Frame
	assert.Zero(t, f.ID())
	assert.Empty(t, f.Type())
	assert.Nil(t, f.JSON())
	assert.Zero(t, f.Size())
	assert.Equal(t, []byte("x"), f.AppendSSE([]byte("x")))
	assert.False(t, f.Synthetic())
	assert.False(t, f.Signal())
	assert.Empty(t, f.About())
	assert.False(t, f.Terminal())
	assert.Empty(t, f.String())
}

// A Frame is one pointer: a consumer's batch copies 8 bytes per frame, and
// every copy shares the one encoding.
func TestFrameIsOnePointer(t *testing.T) {
	assert.Equal(t, unsafe.Sizeof(uintptr(0)), unsafe.Sizeof(Frame{}))
	b := newBus(t, Options{})
	s, err := b.Subscribe(t.Context(), SubscribeOptions{})
	require.NoError(t, err)
	defer s.Close()
	f, err := b.Publish(Event{Type: "e", Data: json.RawMessage(`{"n":1}`)})
	require.NoError(t, err)
	got, _ := s.AppendReady(nil)
	require.Len(t, got, 1)
	assert.Same(t, f.frame, got[0].frame, "the consumer gets the frame Publish made")
	assert.Same(t, &f.JSON()[0], &got[0].JSON()[0])
}

// Compact pre-encoded data takes Publish's fast path, anything else the
// scratch path; both must lay out byte-identical envelopes, escapes in the
// type and the originator included.
func TestPublishAllocationsDoNotGrowWithSubscribers(t *testing.T) {
	ev := Event{Type: "e", Data: json.RawMessage(`{"session":"s1","seq":12345,"text":"hello, world"}`)}
	for _, subs := range []int{0, 1, 64} {
		b := newBus(t, Options{RingSize: 64})
		batch := make([]Frame, 0, 256)
		var ss []*Subscription
		for range subs {
			s, err := b.Subscribe(t.Context(), SubscribeOptions{})
			require.NoError(t, err)
			ss = append(ss, s)
		}
		// Fill the ring and grow each queue to hold the measured publishes,
		// then empty the queues.
		for range 150 {
			_, err := b.Publish(ev)
			require.NoError(t, err)
		}
		for _, s := range ss {
			out, _ := s.AppendReady(batch[:0])
			require.Len(t, out, 150)
		}
		allocs := testing.AllocsPerRun(100, func() { _, _ = b.Publish(ev) })
		assert.EqualValues(t, 2, allocs, "%d subscribers", subs)
	}
}

// A consumer takes and frames its events without allocating: a delivery
// costs nothing beyond the publish.
func TestDeliveryDoesNotAllocate(t *testing.T) {
	ev := Event{Type: "e", Data: json.RawMessage(`{"seq":1}`)}
	b := newBus(t, Options{RingSize: 64})
	s, err := b.Subscribe(t.Context(), SubscribeOptions{})
	require.NoError(t, err)
	batch := make([]Frame, 0, 16)
	wire := make([]byte, 0, 4096)
	for range 100 { // fill the ring, grow the queue
		_, err := b.Publish(ev)
		require.NoError(t, err)
	}
	out, _ := s.AppendReady(batch)
	require.Len(t, out, 100)
	publish := testing.AllocsPerRun(100, func() { _, _ = b.Publish(ev) })
	out, _ = s.AppendReady(batch)
	require.Len(t, out, 101)
	both := testing.AllocsPerRun(100, func() {
		_, _ = b.Publish(ev)
		out, _ := s.AppendReady(batch)
		for _, f := range out {
			wire = f.AppendSSE(wire[:0])
		}
	})
	assert.Equal(t, publish, both)
}

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
