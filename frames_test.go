package eventbus

import (
	"bytes"
	"context"
	"encoding/json"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ssebus/eventbus/internal/seam"
)

func TestAppendSSEEventFrameFormat(t *testing.T) {
	b := newBus(t, Options{})
	f := publishEvent(t, b, Event{Type: "session_update", Data: map[string]int{"a": 1}})
	want := "id: 1\nevent: session_update\ndata: " +
		`{"id":1,"v":1,"type":"session_update","data":{"a":1},"_meta":{"serverTimestamp":1719000000000}}` + "\n\n"
	assert.Equal(t, want, string(f.SSE()))
	assert.Equal(t, "prefix:"+want, string(append([]byte("prefix:"), f.SSE()...)))
	assert.Equal(t, want, f.String())
}

func TestAppendSSESyntheticFrameHasNoIDLine(t *testing.T) {
	f := replayCompleteFrame(0, 0, "E", 5)
	assert.Equal(t,
		"event: replay_complete\ndata: "+`{"v":1,"type":"replay_complete","data":{"replayedCount":0,"epoch":"E"},"_meta":{"serverTimestamp":5}}`+"\n\n",
		string(f.SSE()))
}

func TestSyntheticFramesHaveNoID(t *testing.T) {
	c := queueCounts{liveCount: 12, maxQueued: 16, liveBytes: 100, maxBytes: 1000}
	for _, f := range []Frame{
		replayCompleteFrame(3, 9, "E", 1),
		resyncFrame(ReasonRingEvicted, "", 1, 5, "E", 1),
		warningFrame(c, 7, "frames", 1),
		evictedFrame(ReasonQueueOverflow, 8, c, -1, 1),
		streamErrorFrameNow("boom", "internal"),
	} {
		assert.Equal(t, uint64(0), f.ID(), f.Type())
		assert.True(t, f.Synthetic(), f.Type())
		assert.False(t, bytes.HasPrefix(f.SSE(), []byte("id:")), f.Type())
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
	assert.True(t, streamErrorFrameNow("x", "internal").Terminal())
	assert.False(t, replayCompleteFrame(0, 0, "E", 1).Terminal())
	assert.False(t, resyncFrame(ReasonEpochReset, "", 1, 1, "E", 1).Terminal())
	assert.False(t, warningFrame(c, 1, "frames", 1).Terminal())

	b := newBus(t, Options{})
	f := publishEvent(t, b, Event{Type: "note"}) // a published event is never terminal
	assert.False(t, f.Terminal())
	assert.False(t, f.Synthetic())
	_, err := b.Publish(Event{Type: TypeClientEvicted})
	assert.ErrorIs(t, err, ErrInvalidEvent, "nor named like a terminal frame (ReservedTypes)")
}

func TestStreamErrorFrameData(t *testing.T) {
	before := time.Now().UnixMilli()
	f := streamErrorFrameNow("write \"failed\"\n<now>", "internal")
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
// numbers on the wire (SPEC 1.3).
func TestFrameSizeIsTheEnvelope(t *testing.T) {
	b := newBus(t, Options{})
	f := publishEvent(t, b, Event{Type: "session_update", Data: json.RawMessage(`{"a":1}`)})
	assert.Equal(t, `{"id":1,"v":1,"type":"session_update","data":{"a":1},"_meta":{"serverTimestamp":1719000000000}}`, string(f.JSON()))
	assert.Equal(t, 95, f.Size())

	long := publishEvent(t, b, Event{Type: maxType(0), Data: 1})
	entry, err := entryFrame(seam.Entry{ID: 7, Type: maxType(1), JSON: []byte(`{"id":7,"v":1,"type":"` + maxType(1) + `"}`)})
	require.NoError(t, err)
	for _, f := range []Frame{
		long, entry,
		replayCompleteFrame(1, 1, "E", 1),
		warningFrame(queueCounts{1, 16, 100, 1000}, 1, "bytes", 1),
		signalFrame("doc.changed", "doc/42", testStamp),
		signalFrame(maxType(2), strings.Repeat("r", 500), testStamp),
		streamErrorFrameNow("boom", ErrorKindInternal),
	} {
		assert.Equal(t, len(f.JSON()), f.Size(), "%s", f.Type())
		assert.True(t, bytes.HasSuffix(f.SSE(), []byte("\ndata: "+string(f.JSON())+"\n\n")), "the envelope is what follows data: (%s)", f.Type())
	}
	assert.Equal(t, len(`{"id":7,"v":1,"type":""}`)+MaxTypeLen, entry.Size())
}

// What a frame costs beyond its envelope is at most maxFrameExtra, the
// figure the docs state (668 bytes on 64-bit), whatever the kind of frame
// and its type, a signal's resource aside; an event of the longest type
// and a one-digit id reaches it.
func TestFrameCostBeyondTheEnvelopeIsBounded(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) == 8 {
		assert.Equal(t, 668, maxFrameExtra, "the figure in Frame.Size's, Options' and HubOptions' docs")
	}
	assert.Equal(t, 2*MaxTypeLen+60+frameOverhead, maxFrameExtra, "Frame.Size's doc: 2*MaxTypeLen+156 with a 96-byte header and slot")

	b := newBus(t, Options{})
	worst := publishEvent(t, b, Event{Type: maxType(0), Data: 1})
	assert.Equal(t, maxFrameExtra, worst.held()-worst.Size(), "an event of the longest type and a one-digit id")

	escaped := strings.Repeat("\x01", MaxTypeLen) // six bytes each in JSON
	entry, err := entryFrame(seam.Entry{ID: 1, Type: maxType(1), JSON: []byte(`{"id":1,"v":1,"type":"` + maxType(1) + `"}`)})
	require.NoError(t, err)
	frames := []Frame{
		worst, entry,
		publishEvent(t, b, Event{Type: "t"}),
		publishEvent(t, b, Event{Type: escaped, Data: strings.Repeat("x", 1000)}),
		warningFrame(queueCounts{1, 16, 100, 1000}, 1, "bytes", 1),
		evictedFrame(ReasonQueueBytesOverflow, 1, queueCounts{1, 16, 100, 1000}, 100, 1),
		streamErrorFrameNow(strings.Repeat("\x02", 300), ErrorKindInternal),
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

// The zero Frame (what Publish returns with an error) has no type and
// encodes to nothing: every method answers without a frame behind it.
func TestZeroFrame(t *testing.T) {
	var f Frame
	assert.Zero(t, f.ID())
	assert.Empty(t, f.Type())
	assert.Nil(t, f.JSON())
	assert.Zero(t, f.Size())
	assert.Equal(t, []byte("x"), append([]byte("x"), f.SSE()...))
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

// ---------------------------------------------------------------------------
// The shutdown frame, what a frame holds, and fuzzed frames.

func TestShutdownFrameWire(t *testing.T) {
	for _, c := range []struct {
		retry time.Duration
		ms    int
	}{
		{1500 * time.Millisecond, 1500},
		{0, 2000},             // the default
		{-time.Second, 2000},  // likewise
		{time.Microsecond, 1}, // at least 1 ms: 0 would mean at once
		{time.Minute, 60000},
	} {
		f := shutdownFrame(c.retry, testStamp)
		assert.True(t, f.Terminal())
		assert.True(t, f.Synthetic())
		assert.Zero(t, f.ID())
		assert.Equal(t, TypeStreamError, f.Type())
		assert.Equal(t, "event: stream_error\ndata: "+wantSynth(TypeStreamError, shutdownData(c.ms), "").Data+"\n\n", f.String(), "retry %v", c.retry)
	}
	// StreamErrorFrame and closeWithError with the kind carry the default;
	// every other kind keeps the wire it had: no retryAfter.
	assert.Contains(t, string(streamErrorFrameNow("bye", ErrorKindShutdown).JSON()),
		`"data":{"error":"bye","errorKind":"shutdown","retryAfter":2000}`)
	for _, kind := range []string{ErrorKindInternal, ErrorKindUnavailable, ErrorKindReauthenticate, ErrorKindRevoked} {
		assert.Contains(t, string(streamErrorFrameNow("m", kind).JSON()), `"data":{"error":"m","errorKind":"`+kind+`"},`)
	}
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
		wire := f.SSE()
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

// The byte caps count envelopes; what a frame costs beyond its envelope is
// at most maxFrameExtra (668 bytes on 64-bit), so the caps and the count
// caps together bound the heap. Events of the longest type, each a fresh
// string as a daemon decoding requests holds it, are the worst case: their
// envelopes are ~340 bytes and each costs twice that again. Measured with
// runtime.ReadMemStats after a collection:
//
//   - ring: buses whose RingMaxBytes (8 KiB) holds 24 such events grow by
//     at most the sum of RingBytes + RingLen*maxFrameExtra, an eighth more
//     for the allocator's size classes, and each ring's slot array;
//   - queue: buses that keep one event (RingSize 1), each with a
//     subscriber that never reads, whose queue (MaxQueued 12,
//     MaxQueuedBytes 4 KiB) is full: at most MaxQueuedBytes +
//     MaxQueued*maxFrameExtra per subscriber, plus its one warning (a
//     forced frame, outside the caps), an eighth, and the queue's slots.
func TestMemoryWithinEnvelopeCapsPlusPerFrameExtra(t *testing.T) {
	buses := pick(64, 400, 1000)
	measure := func(t *testing.T, opts Options, subscribe bool, events int) (grown int64, bs []*EventBus, subs []*Subscription) {
		bs = make([]*EventBus, buses)
		for i := range bs {
			bs[i] = newBus(t, opts)
			if subscribe {
				s, err := bs[i].Subscribe(context.Background(), SubscribeOptions{MaxQueued: 12})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(s.Close)
				subs = append(subs, s)
			}
		}
		before := liveHeap()
		for _, b := range bs {
			for i := range events {
				typ := string([]byte(maxType(i))) // a fresh copy per event
				if _, err := b.Publish(Event{Type: typ, Data: json.RawMessage(`{"n":1}`)}); err != nil {
					t.Fatal(err)
				}
			}
		}
		return int64(liveHeap()) - int64(before), bs, subs
	}

	t.Run("ring", func(t *testing.T) {
		const ringCap = 8 << 10
		grown, bs, _ := measure(t, Options{RingMaxBytes: ringCap}, false, 40)
		var envelopes, frames, bound int64
		for _, b := range bs {
			st := b.Stats()
			require.LessOrEqual(t, st.RingBytes, ringCap)
			require.Equal(t, 24, st.RingLen, "8 KiB of ~340-byte envelopes")
			envelopes += int64(st.RingBytes)
			frames += int64(st.RingLen)
			bound += int64(len(b.ring.slots)) * 8
		}
		bound += (envelopes + frames*int64(maxFrameExtra)) * 9 / 8
		t.Logf("%d buses x 24 events of a %d-byte type: heap +%d bytes (%d per frame) for %d envelope bytes (%d per frame); bound %d",
			buses, MaxTypeLen, grown, grown/frames, envelopes, envelopes/frames, bound)
		assert.LessOrEqual(t, grown, bound)
		runtime.KeepAlive(bs)
	})

	t.Run("queue", func(t *testing.T) {
		const queueCap = 4 << 10
		grown, bs, subs := measure(t, Options{RingSize: 1, MaxQueuedBytes: queueCap}, true, 12)
		var bound int64
		for i, s := range subs {
			c := s.q.counts()
			require.Equal(t, queueCounts{12, 12, c.liveBytes, queueCap}, c, "a full queue")
			require.NoError(t, s.Err())
			require.Equal(t, 13, s.q.len(), "12 events and the warning")
			warning := s.q.entry(9).f
			require.Equal(t, TypeSlowClientWarning, warning.typ)
			bound += int64(queueCap+12*maxFrameExtra+warning.size()+maxFrameExtra) * 9 / 8
			bound += int64(len(s.q.buf))*9 + int64(len(bs[i].ring.slots))*8
		}
		t.Logf("%d stalled subscribers with 12 events of a %d-byte type queued: heap +%d bytes (%d per subscriber); bound %d",
			buses, MaxTypeLen, grown, grown/int64(buses), bound)
		assert.LessOrEqual(t, grown, bound)
		runtime.KeepAlive(bs)
		runtime.KeepAlive(subs)
	})
}

// jsonRoundTrip is what a JSON client reads back for s: encoding/json
// coerces invalid UTF-8 to U+FFFD.
func jsonRoundTrip(t *testing.T, s string) string {
	b, err := json.Marshal(s)
	require.NoError(t, err)
	var out string
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

func FuzzFrameRoundTrip(f *testing.F) {
	for _, seed := range [][3]string{
		{"session_update", `{"a":1}`, "c1"},
		{"e", "", ""},
		{" leading space", "line1\nline2\r\nline3\rend", "client\nwith newline"},
		{"a: b", "data: injected\n\nid: 99\n\n", "\r\n"},
		{":colon", "\x00\x01\x1f\"\\", "\u2028\u2029"},
		{"id: 7", "\xff\xfe invalid utf-8", "\xc3"},
		{"tab\there", "<html>&amp;</html>", "é"},
		{"nul\x00type", strings.Repeat("z", 4096), ""},
		{"\u2028", "\u2028\u2029", "x"},
		{"\xff", "", ""},
		{"", "rejected: empty", ""},
		{"a\nb", "rejected: LF", ""},
		{"a\rb", "rejected: CR", ""},
		{"a\r\nevent: evil", "rejected: CRLF", ""},
		{"client_evicted", "rejected: reserved", ""},
		{"client_evicted ", "", ""},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	f.Fuzz(func(t *testing.T, typ, data, orig string) {
		logs := &logCapture{}
		b, err := New(Options{Now: testNow, Logger: logs.logger(), OnDiagnostic: logs.diag})
		require.NoError(t, err)
		defer b.Close()

		injectable := typ == "" || strings.ContainsAny(typ, "\r\n")
		refused := injectable || len(typ) > MaxTypeLen || slices.Contains(ReservedTypes(), typ)
		fr, err := b.Publish(Event{Type: typ, Data: data, OriginatorClientID: orig})
		if err != nil {
			require.ErrorIs(t, err, ErrInvalidEvent)
			require.True(t, refused, "only an empty, long or reserved type or one with CR or LF is rejected: %q: %v", typ, err)
			require.Zero(t, b.LastEventID())
			return
		}
		require.False(t, injectable, "a type that could inject SSE lines was accepted: %q", typ)
		require.False(t, refused, "a type Publish must refuse was accepted: %q", typ)

		wire := fr.SSE()
		require.Equal(t, fr.String(), string(wire))
		js := fr.JSON()
		require.NotContains(t, string(js), "\n")
		require.NotContains(t, string(js), "\r")
		require.True(t, json.Valid(js), "%q", js)
		require.Equal(t, len(js), fr.Size())

		recs, err := parseSSE(wire)
		require.NoError(t, err, "a frame ends on an event boundary: %q", wire)
		require.Len(t, recs, 1, "exactly one record: %q", wire)
		require.Equal(t, sseEventRecord, recs[0].Kind)
		ev := recs[0].Event
		require.Equal(t, typ, ev.Type)
		require.Equal(t, string(js), ev.Data)
		require.Equal(t, strconv.FormatUint(fr.ID(), 10), ev.ID)
		require.Equal(t, uint64(1), fr.ID())

		var env struct {
			ID   uint64  `json:"id"`
			V    int     `json:"v"`
			Type string  `json:"type"`
			Data *string `json:"data"`
			Meta struct {
				ServerTimestamp int64 `json:"serverTimestamp"`
			} `json:"_meta"`
			Orig *string `json:"originatorClientId"`
		}
		dec := json.NewDecoder(strings.NewReader(ev.Data))
		dec.DisallowUnknownFields()
		require.NoError(t, dec.Decode(&env))
		require.Equal(t, fr.ID(), env.ID)
		require.Equal(t, SchemaVersion, env.V)
		require.Equal(t, jsonRoundTrip(t, typ), env.Type)
		require.NotNil(t, env.Data)
		require.Equal(t, jsonRoundTrip(t, data), *env.Data)
		require.Equal(t, int64(testStamp), env.Meta.ServerTimestamp)
		if orig == "" {
			require.Nil(t, env.Orig)
		} else {
			require.NotNil(t, env.Orig)
			require.Equal(t, jsonRoundTrip(t, orig), *env.Orig)
		}
	})
}

func FuzzStreamErrorFrame(f *testing.F) {
	f.Add("internal error", "internal")
	f.Add("line\nbreak\r\n", "kind\r")
	f.Add("\xff\x00\"", "")
	f.Fuzz(func(t *testing.T, msg, kind string) {
		fr := streamErrorFrameNow(msg, kind)
		require.True(t, fr.Terminal())
		require.True(t, fr.Synthetic())
		require.Zero(t, fr.ID())
		recs, err := parseSSE(fr.SSE())
		require.NoError(t, err)
		require.Len(t, recs, 1)
		ev := recs[0].Event
		require.Equal(t, TypeStreamError, ev.Type)
		require.Empty(t, ev.ID, "no id line")
		var env struct {
			V    int    `json:"v"`
			Type string `json:"type"`
			Data struct {
				Error     *string `json:"error"`
				ErrorKind *string `json:"errorKind"`
			} `json:"data"`
		}
		require.NoError(t, json.Unmarshal([]byte(ev.Data), &env))
		require.Equal(t, TypeStreamError, env.Type)
		require.NotNil(t, env.Data.Error)
		require.NotNil(t, env.Data.ErrorKind)
		require.Equal(t, jsonRoundTrip(t, msg), *env.Data.Error)
		require.Equal(t, jsonRoundTrip(t, kind), *env.Data.ErrorKind)
	})
}
