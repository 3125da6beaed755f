package eventbus

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ssebus/eventbus/sseclient"
)

// ---------------------------------------------------------------------------
// Signals (SPEC 11).

func TestSignalHasNoIDAndExactEnvelope(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	sendSignal(t, b, "doc.changed", "doc/42")

	fs := readyNow(s)
	require.Len(t, fs, 1)
	f := fs[0]
	assert.Zero(t, f.ID())
	assert.True(t, f.Signal())
	assert.False(t, f.Synthetic())
	assert.False(t, f.Terminal())
	assert.Equal(t, "doc.changed", f.Type())
	assert.Equal(t, "doc/42", f.About())
	assert.Equal(t, `{"v":1,"type":"doc.changed","about":"doc/42","_meta":{"serverTimestamp":1719000000000}}`, string(f.JSON()))
	assert.Equal(t, len(f.JSON()), f.Size())

	// A signal takes no id: the next event is still #1.
	assert.Zero(t, b.LastEventID())
	assert.Equal(t, uint64(1), publishType(t, b, "e").ID())
}

func TestSignalAboutIsEscapedJSON(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	about := "a\"b\\c\nd\re\u2028</script>"
	sendSignal(t, b, "x", about)
	f := readyNow(s)[0]
	assert.NotContains(t, string(f.JSON()), "\n")
	assert.NotContains(t, string(f.JSON()), "\r")
	var env map[string]any
	require.NoError(t, json.Unmarshal(f.JSON(), &env))
	assert.Equal(t, about, env["about"])
	assert.Equal(t, about, f.About())
}

func TestSignalSSEWireHasNoIDLine(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	sendSignal(t, b, "doc.changed", "doc/42")
	f := readyNow(s)[0]
	want := "event: doc.changed\ndata: {\"v\":1,\"type\":\"doc.changed\",\"about\":\"doc/42\",\"_meta\":{\"serverTimestamp\":1719000000000}}\n\n"
	assert.Equal(t, want, f.String())
	assert.Equal(t, "pre:"+want, string(f.AppendSSE([]byte("pre:"))))
}

func TestSignalOverHTTPHasNoIDLine(t *testing.T) {
	b := newBus(t, Options{})
	srv := serveBus(t, b)
	c := openStream(t, srv, "/session/s/events", nil)
	require.Equal(t, http.StatusOK, c.resp.StatusCode)
	require.Equal(t, 1, b.SubscriberCount()) // headers come after Subscribe

	sendSignal(t, b, "doc.changed", "doc/1")
	publishType(t, b, "end")
	evs := c.messagesUntil(func(m sseclient.Message) bool { return m.Type == "end" })
	require.Len(t, evs, 2)
	assert.False(t, evs[0].HasID, "a signal has no id line")
	assert.Equal(t, "doc.changed", evs[0].Type)
	assert.Equal(t, `{"v":1,"type":"doc.changed","about":"doc/1","_meta":{"serverTimestamp":1719000000000}}`, string(evs[0].Data))
	assert.True(t, evs[1].HasID)
	assert.Equal(t, "1", evs[1].ID)
}

func TestSignalNeverEntersTheRing(t *testing.T) {
	b := newBus(t, Options{})
	publishType(t, b, "e")
	ringBytes := b.Stats().RingBytes
	for i := range 10 {
		sendSignal(t, b, "x", strconv.Itoa(i))
	}
	st := b.Stats()
	assert.Equal(t, 1, st.RingLen)
	assert.Equal(t, ringBytes, st.RingBytes)
	assert.Equal(t, uint64(1), b.LastEventID())
	b.mu.Lock()
	assert.Equal(t, 1, b.ring.Len())
	b.mu.Unlock()
}

func TestSignalNeverReplayed(t *testing.T) {
	b := newBus(t, Options{})
	sendSignal(t, b, "x", "a")
	publishType(t, b, "e")
	sendSignal(t, b, "x", "b")
	publishType(t, b, "e")
	sendSignal(t, b, "x", "c")

	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 0})
	fs := readyNow(s)
	assert.Equal(t, []string{"#1", "#2", TypeReplayComplete}, describe(fs))
	assert.JSONEq(t, fmt.Sprintf(`{"replayedCount":2,"lastReplayedEventId":2,"lastEventId":2,"epoch":%q}`, b.Epoch()), dataOf(t, fs[2]))

	s2 := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 2})
	fs = readyNow(s2)
	assert.Equal(t, []string{TypeReplayComplete}, describe(fs))
	assert.JSONEq(t, fmt.Sprintf(`{"replayedCount":0,"epoch":%q}`, b.Epoch()), dataOf(t, fs[0]))
}

func TestSignalsAloneEvictNonReaderAtFrameCap(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16})
	s := subscribe(t, b, SubscribeOptions{})
	for i := range 17 {
		sendSignal(t, b, "x", fmt.Sprintf("r%02d", i)) // distinct (type, about): no coalescing
	}
	assert.Equal(t, 0, b.SubscriberCount())
	fs := collectEvents(s)
	require.Len(t, fs, 16+2)
	want := []string{}
	for i := range 16 {
		want = append(want, fmt.Sprintf("sig:x/r%02d", i))
		if i == 11 { // 0.75 * 16 = 12 live frames
			want = append(want, TypeSlowClientWarning)
		}
	}
	want = append(want, TypeClientEvicted)
	assert.Equal(t, want, describe(fs))
	ev := fs[len(fs)-1]
	assert.True(t, ev.Terminal())
	assert.Contains(t, dataOf(t, ev), `"reason":"queue_overflow"`)
	assert.Contains(t, dataOf(t, ev), `"queueSize":16,"maxQueued":16`)
	assert.ErrorIs(t, s.Err(), ErrEvicted)
	assert.Equal(t, uint64(1), b.Stats().Evictions.QueueOverflow)
}

func TestSignalsAloneEvictNonReaderAtByteCap(t *testing.T) {
	size := signalFrame("x", "r00", testStamp).Size()
	b := newBus(t, Options{MaxQueuedBytes: 4*size - 1})
	s := subscribe(t, b, SubscribeOptions{})
	for i := range 4 {
		sendSignal(t, b, "x", fmt.Sprintf("r%02d", i))
	}
	assert.Equal(t, 0, b.SubscriberCount())
	fs := collectEvents(s)
	// 0.75 * (4*size-1) bytes is reached by the third signal.
	assert.Equal(t, []string{"sig:x/r00", "sig:x/r01", "sig:x/r02", TypeSlowClientWarning, TypeClientEvicted}, describe(fs))
	d := dataOf(t, fs[len(fs)-1])
	assert.Contains(t, d, `"reason":"queue_bytes_overflow"`)
	assert.Contains(t, d, fmt.Sprintf(`"queuedBytes":%d`, 3*size))
	assert.Contains(t, d, fmt.Sprintf(`"eventBytes":%d`, size))
	assert.Equal(t, uint64(1), b.Stats().Evictions.QueueBytesOverflow)
}

func TestSignalCoalescesInPlaceKeepingPositionAndOrder(t *testing.T) {
	clk := newFakeClock(1000)
	b := newBus(t, Options{Now: clk.now})
	s := subscribe(t, b, SubscribeOptions{})

	sendSignal(t, b, "x", "a") // ts 1000
	publishType(t, b, "e")     // #1
	sendSignal(t, b, "x", "b")
	publishType(t, b, "e") // #2
	clk.advance(5 * time.Second)
	sendSignal(t, b, "x", "a") // ts 6000: replaces the first one in place

	fs := readyNow(s)
	assert.Equal(t, []string{"sig:x/a", "#1", "sig:x/b", "#2"}, describe(fs))
	assert.Equal(t, `{"v":1,"type":"x","about":"a","_meta":{"serverTimestamp":6000}}`, string(fs[0].JSON()),
		"the consumer sees the newer signal at the older one's position")
	assert.Equal(t, int64(1000), stampOf(t, fs[2]))
	assert.Equal(t, uint64(1), b.Stats().Dropped.Coalesced)
	assert.Equal(t, uint64(3), b.Stats().Signals)
}

func TestSignalDifferentAboutOrTypeNotCoalesced(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	sendSignal(t, b, "x", "a")
	sendSignal(t, b, "x", "b") // other about
	sendSignal(t, b, "y", "a") // other type
	sendSignal(t, b, "x", "")  // empty about is a key of its own
	sendSignal(t, b, "x", "a") // coalesced with the first
	sendSignal(t, b, "y", "a") // coalesced with the third
	assert.Equal(t, []string{"sig:x/a", "sig:x/b", "sig:y/a", "sig:x/"}, describe(readyNow(s)))
	assert.Equal(t, uint64(2), b.Stats().Dropped.Coalesced)
}

func TestSignalDeliveredIsNotCoalescedWithLaterOne(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	sendSignal(t, b, "x", "a")
	assert.Equal(t, []string{"sig:x/a"}, describe(readyNow(s)))
	sendSignal(t, b, "x", "a")
	publishType(t, b, "e")
	sendSignal(t, b, "x", "a") // the second one is still queued: coalesced
	assert.Equal(t, []string{"sig:x/a", "#1"}, describe(readyNow(s)))
	sendSignal(t, b, "x", "a")
	assert.Equal(t, []string{"sig:x/a"}, describe(readyNow(s)))
	assert.Equal(t, uint64(1), b.Stats().Dropped.Coalesced)
	assert.Equal(t, uint64(4), b.Stats().FramesDelivered)
}

func TestSignalCoalescedCountsEachReplacementPerSubscriber(t *testing.T) {
	b := newBus(t, Options{})
	s1 := subscribe(t, b, SubscribeOptions{})
	s2 := subscribe(t, b, SubscribeOptions{})
	for range 5 {
		sendSignal(t, b, "x", "a")
	}
	assert.Equal(t, uint64(8), b.Stats().Dropped.Coalesced, "4 replacements in each of 2 queues")
	assert.Len(t, readyNow(s1), 1)
	assert.Len(t, readyNow(s2), 1)
	assert.Equal(t, uint64(5), b.Stats().Signals)
}

func TestSignalCoalescingDoesNotGrowTheQueue(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16})
	s := subscribe(t, b, SubscribeOptions{})
	for range 10_000 {
		sendSignal(t, b, "x", "a")
	}
	assert.Equal(t, 1, b.SubscriberCount(), "one queued signal, replaced 9,999 times, never overflows")
	c := s.q.counts()
	assert.Equal(t, 1, c.liveCount)
	assert.Equal(t, signalFrame("x", "a", testStamp).Size(), c.liveBytes)
	assert.Equal(t, []string{"sig:x/a"}, describe(readyNow(s)))
}

func TestSignalHonoursTypeFilters(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{Types: []string{"doc.*", "user"}})
	sendSignal(t, b, "doc.changed", "1")
	sendSignal(t, b, "other", "1")
	sendSignal(t, b, "user", "2")
	sendSignal(t, b, "doc", "3")
	sendSignal(t, b, "users", "4")
	assert.Equal(t, []string{"sig:doc.changed/1", "sig:user/2"}, describe(readyNow(s)))
}

func TestSignalFilteredOutNeverCountsTowardCaps(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16})
	s := subscribe(t, b, SubscribeOptions{Types: []string{"a"}})
	for i := range 1000 {
		sendSignal(t, b, "b", strconv.Itoa(i))
	}
	assert.Equal(t, 1, b.SubscriberCount())
	assert.Empty(t, readyNow(s))
}

func TestSignalRejectsInvalidType(t *testing.T) {
	var diags []Diagnostic
	b := newBus(t, Options{OnDiagnostic: func(d Diagnostic) bool { diags = append(diags, d); return true }})
	s := subscribe(t, b, SubscribeOptions{})
	for _, typ := range []string{"", "a\nb", "a\rb", "\n"} {
		err := b.Signal(typ, "x")
		assert.ErrorIs(t, err, ErrInvalidEvent, "type %q", typ)
	}
	assert.Empty(t, readyNow(s))
	st := b.Stats()
	assert.Equal(t, uint64(4), st.Rejected.Invalid)
	assert.Zero(t, st.Signals)
	require.Len(t, diags, 4)
	for _, d := range diags {
		assert.Equal(t, DiagPublishRejected, d.Kind)
	}
}

func TestSignalRejectsTooLarge(t *testing.T) {
	size := signalFrame("x", "abc", testStamp).Size()
	b := newBus(t, Options{MaxEventBytes: size})
	s := subscribe(t, b, SubscribeOptions{})
	require.NoError(t, b.Signal("x", "abc"))
	assert.ErrorIs(t, b.Signal("x", "abcd"), ErrEventTooLarge)
	assert.Equal(t, []string{"sig:x/abc"}, describe(readyNow(s)))
	assert.Equal(t, uint64(1), b.Stats().Rejected.TooLarge)
}

func TestSignalOnClosedBusReturnsErrClosed(t *testing.T) {
	b := newBus(t, Options{})
	require.NoError(t, b.Close())
	err := b.Signal("x", "a")
	assert.True(t, errors.Is(err, ErrClosed))
	assert.Equal(t, uint64(1), b.Stats().Rejected.Closed)
	assert.Zero(t, b.Stats().Signals)
}

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
