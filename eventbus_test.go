package eventbus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ssebus/eventbus/sseclient"
)

// ---------------------------------------------------------------------------
// Publish (SPEC 2.1; the envelope, 5.1).

func TestPublishAssignsContiguousIDsFromOne(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	fs := publishNumbered(t, b, 3)
	assert.Equal(t, []string{"#1", "#2", "#3"}, describe(fs))
	got, _ := s.AppendReady(nil)
	assert.Equal(t, []string{"#1", "#2", "#3"}, describe(got))
	for i, f := range fs {
		assert.True(t, bytes.HasPrefix(f.JSON(), fmt.Appendf(nil, `{"id":%d,`, i+1)), "%s", f.JSON())
	}
}

func TestPublishReturnsTheStampedFrame(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	f := publishEvent(t, b, Event{Type: "t", Data: 1})
	assert.Equal(t, uint64(1), f.ID())
	assert.Equal(t, "t", f.Type())
	assert.False(t, f.Synthetic())
	assert.False(t, f.Terminal())
	got, _ := s.AppendReady(nil)
	require.Len(t, got, 1)
	assert.Equal(t, f.String(), got[0].String())
}

func TestPublishOnClosedBusReturnsErrClosed(t *testing.T) {
	buf := &logCapture{}
	logger := buf.logger()
	b := newBus(t, Options{Logger: logger})
	publishNumbered(t, b, 2)
	require.NoError(t, b.Close())

	f, err := b.Publish(Event{Type: "t"})
	assert.ErrorIs(t, err, ErrClosed)
	assert.Equal(t, Frame{}, f)
	// Even an invalid event: the closed check comes first and is silent.
	_, err = b.Publish(Event{Type: ""})
	assert.ErrorIs(t, err, ErrClosed)
	assert.Equal(t, uint64(2), b.LastEventID(), "no id used")
	assert.Empty(t, buf.String())
}

func TestPublishNeverBlocksOnSubscriberThatNeverReads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{MaxQueued: 16})
		stuck := subscribe(t, b, SubscribeOptions{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for range 10_000 {
				if _, err := b.Publish(Event{Type: "t", Data: "x"}); err != nil {
					panic(err)
				}
			}
		}()
		synctest.Wait() // every goroutine is done or durably blocked
		select {
		case <-done:
		default:
			t.Fatal("Publish blocked")
		}
		assert.Equal(t, uint64(10_000), b.LastEventID())
		assert.Equal(t, 0, b.SubscriberCount())
		assert.ErrorIs(t, stuck.Err(), ErrEvicted)
	})
}

// ---------------------------------------------------------------------------
// Accessors.

func TestLastEventIDIsZeroBeforeFirstPublish(t *testing.T) {
	b := newBus(t, Options{})
	assert.Equal(t, uint64(0), b.LastEventID())
	publishNumbered(t, b, 3)
	assert.Equal(t, uint64(3), b.LastEventID())
	_, _ = b.Publish(Event{}) // rejected: no change
	assert.Equal(t, uint64(3), b.LastEventID())
}

func TestEpochIs32LowercaseHexAndDiffersBetweenBuses(t *testing.T) {
	hex32 := regexp.MustCompile(`^[0-9a-f]{32}$`)
	seen := map[string]bool{}
	for range 20 {
		b := newBus(t, Options{})
		assert.Regexp(t, hex32, b.Epoch())
		assert.Equal(t, b.Epoch(), b.Epoch(), "stable for the bus")
		assert.False(t, seen[b.Epoch()], "epoch repeated")
		seen[b.Epoch()] = true
	}
}

func TestSubscriberCountTracksSubscriptions(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16})
	assert.Equal(t, 0, b.SubscriberCount())
	s1 := subscribe(t, b, SubscribeOptions{})
	s2 := subscribe(t, b, SubscribeOptions{})
	s3 := subscribe(t, b, SubscribeOptions{MaxQueued: 100})
	assert.Equal(t, 3, b.SubscriberCount())
	s1.Close()
	assert.Equal(t, 2, b.SubscriberCount())
	publishNumbered(t, b, 17) // evicts s2
	assert.ErrorIs(t, s2.Err(), ErrEvicted)
	assert.Equal(t, 1, b.SubscriberCount())
	require.NoError(t, b.Close())
	assert.Equal(t, 0, b.SubscriberCount())
	assert.NoError(t, s3.Err())
}

// ---------------------------------------------------------------------------
// Publish under load: concurrent publishers, allocations, a stalled subscriber.

func TestConcurrentPublishersDeliverIncreasingIDs(t *testing.T) {
	b := newBus(t, Options{})
	const publishers, each = 8, 500
	subs := []*Subscription{
		subscribe(t, b, SubscribeOptions{MaxQueued: 10_000}),
		subscribe(t, b, SubscribeOptions{MaxQueued: 10_000}),
		subscribe(t, b, SubscribeOptions{MaxQueued: 10_000}),
	}
	var wg sync.WaitGroup
	for range publishers {
		wg.Go(func() {
			for range each {
				if _, err := b.Publish(Event{Type: "t"}); err != nil {
					panic(err)
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, uint64(publishers*each), b.LastEventID())
	for _, s := range subs {
		fs, _ := s.AppendReady(nil)
		assert.Equal(t, idRange(1, publishers*each), describe(coreEventsOnly(fs)))
	}
}

func coreEventsOnly(fs []Frame) []Frame {
	var out []Frame
	for _, f := range fs {
		if !f.Synthetic() {
			out = append(out, f)
		}
	}
	return out
}

// Publish makes two allocations for a pre-encoded event, the envelope's
// bytes and the frame, and the same number at any subscriber count: the
// frame is shared, and a push into a queue that has room allocates
// nothing.
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

// TestPublisherIsolationHealthyReceiveEverything is the correctness side of
// BenchmarkPublishLatency's healthy=63,stalled=1 case: with 63 healthy
// subscribers and one that never reads (default MaxQueued 256), every
// healthy one receives every event, in order, with no synthetic frame (no
// warning, no eviction), and the stalled one is evicted with exactly its
// first 256 events, one warning after the 192nd, and client_evicted naming
// the 257th. Publish never blocks: a watchdog fails the test if one call
// is still running after 30 s (a hang detector, not a timing check; the
// slowest call is logged). The publisher waits, every 64 events, for every
// healthy consumer to be within 192 events, so on a loaded machine the
// healthy ones stay below the warning threshold (768 of 1024) by
// construction.
func TestPublisherIsolationHealthyReceiveEverything(t *testing.T) {
	n := pick(2_000, 10_000, 500_000)
	const healthy = DefaultMaxSubscribers - 1
	b, err := New(Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	got := make([]atomic.Int64, healthy)
	var consumers sync.WaitGroup
	for i := range healthy {
		s, err := b.Subscribe(context.Background(), SubscribeOptions{MaxQueued: 1024})
		if err != nil {
			t.Fatal(err)
		}
		consumers.Go(func() {
			want := uint64(1)
			for f := range s.Events() {
				if f.ID() != want {
					t.Errorf("healthy subscriber %d: got %s, want event %d", i, bmDescribe(f), want)
					got[i].Store(math.MaxInt64) // do not hold the publisher back
					return
				}
				want++
				got[i].Store(int64(f.ID()))
			}
			if err := s.Err(); err != nil {
				t.Errorf("healthy subscriber %d ended with %v", i, err)
			}
		})
	}
	stalled, err := b.Subscribe(context.Background(), SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}

	var inPublish atomic.Int64 // UnixNano when the current Publish started, 0 between calls
	var slowest atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		ev := Event{Type: "isolation", Data: map[string]int{"n": 1}}
		for i := 1; i <= n; i++ {
			t0 := time.Now()
			inPublish.Store(t0.UnixNano())
			_, err := b.Publish(ev)
			inPublish.Store(0)
			if d := int64(time.Since(t0)); d > slowest.Load() {
				slowest.Store(d)
			}
			if err != nil {
				t.Errorf("publish %d: %v", i, err)
				return
			}
			if i%64 == 0 {
				for j := range got {
					for got[j].Load() < int64(i-192) {
						time.Sleep(20 * time.Microsecond)
					}
				}
			}
		}
	}()
	watch := time.NewTicker(100 * time.Millisecond)
	defer watch.Stop()
wait:
	for {
		select {
		case <-done:
			break wait
		case <-watch.C:
			if s := inPublish.Load(); s != 0 && time.Since(time.Unix(0, s)) > 30*time.Second {
				buf := make([]byte, 1<<20)
				t.Fatalf("a Publish has been blocked for 30 s:\n%s", buf[:runtime.Stack(buf, true)])
			}
		}
	}
	_ = b.Close() // the healthy consumers drain and end
	consumers.Wait()
	for i := range got {
		if got[i].Load() != int64(n) {
			t.Errorf("healthy subscriber %d received up to %d of %d", i, got[i].Load(), n)
		}
	}

	if !errors.Is(stalled.Err(), ErrEvicted) {
		t.Fatalf("the stalled subscriber ended with %v, want eviction", stalled.Err())
	}
	var fs []Frame
	for open := true; open; {
		fs, open = stalled.AppendReady(fs)
	}
	var want []string
	for id := 1; id <= DefaultMaxQueued; id++ {
		want = append(want, "#"+strconv.Itoa(id))
		if id == DefaultMaxQueued*3/4 {
			want = append(want, TypeSlowClientWarning)
		}
	}
	want = append(want, TypeClientEvicted)
	var desc []string
	for _, f := range fs {
		if f.ID() > 0 {
			desc = append(desc, "#"+strconv.FormatUint(f.ID(), 10))
		} else {
			desc = append(desc, f.Type())
		}
	}
	if !slices.Equal(desc, want) {
		t.Fatalf("the stalled subscriber's frames:\n got  %v\n want %v", desc, want)
	}
	var evicted struct {
		Data struct {
			Reason       string `json:"reason"`
			DroppedAfter uint64 `json:"droppedAfter"`
			QueueSize    int    `json:"queueSize"`
			MaxQueued    int    `json:"maxQueued"`
		} `json:"data"`
	}
	if err := json.Unmarshal(fs[len(fs)-1].JSON(), &evicted); err != nil ||
		evicted.Data.Reason != ReasonQueueOverflow || evicted.Data.DroppedAfter != DefaultMaxQueued+1 ||
		evicted.Data.QueueSize != DefaultMaxQueued || evicted.Data.MaxQueued != DefaultMaxQueued {
		t.Errorf("client_evicted %s (%v)", fs[len(fs)-1].JSON(), err)
	}
	st := b.Stats()
	if st.Evictions.QueueOverflow != 1 || st.Warnings != 1 || st.Published != uint64(n) {
		t.Errorf("stats: %+v", st)
	}
	t.Logf("%d events to %d healthy subscribers and 1 stalled: every healthy one got all of them in order; slowest Publish %v",
		n, healthy, time.Duration(slowest.Load()))
}

// ---------------------------------------------------------------------------
// Options.MaxAge at publish and resume (the hub's sweep: hub_test.go).

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

// ---------------------------------------------------------------------------
// Signals (SPEC 3.8).

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
	assert.Equal(t, "pre:"+want, string(append([]byte("pre:"), f.SSE()...)))
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
// Close, closeWithError (backplane.CloseWithError), CloseForShutdown, and
// the zero EventBus (what a subscription does once its bus is closed:
// subscription_test.go).

func TestBusCloseEndsEverySubscriptionWithDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		never := subscribe(t, b, SubscribeOptions{}) // never iterated
		polled := subscribe(t, b, SubscribeOptions{})
		ranged := subscribe(t, b, SubscribeOptions{})
		got := make(chan []Frame)
		go func() { got <- collectEvents(ranged) }()
		publishNumbered(t, b, 3)
		fs, _ := polled.AppendReady(nil)
		require.Len(t, fs, 3)
		publishNumbered(t, b, 2)

		require.NoError(t, b.Close())
		assert.Equal(t, 0, b.SubscriberCount())
		assert.Equal(t, idRange(1, 5), describe(<-got))
		fs, open := polled.AppendReady(nil)
		assert.Equal(t, idRange(4, 5), describe(fs))
		assert.False(t, open)
		assert.Equal(t, idRange(1, 5), describe(collectEvents(never)))
		for _, s := range []*Subscription{never, polled, ranged} {
			assert.NoError(t, s.Err(), "a closed bus is no error")
		}
	})
}

func TestBusCloseWithErrorEndsEverySubscriptionWithATerminalFrame(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		never := subscribe(t, b, SubscribeOptions{})
		polled := subscribe(t, b, SubscribeOptions{})
		publishNumbered(t, b, 2)
		require.NoError(t, b.closeWithError(ErrorKindUnavailable, "backplane unreachable"))
		require.NoError(t, b.closeWithError(ErrorKindInternal, "again"), "idempotent")
		require.NoError(t, b.Close(), "a later Close changes nothing")
		for _, s := range []*Subscription{never, polled} {
			fs := collectEvents(s)
			require.Len(t, fs, 3, "what was queued, then the terminal frame")
			last := fs[2]
			assert.True(t, last.Terminal())
			assert.Equal(t, TypeStreamError, last.Type())
			assert.Contains(t, string(last.JSON()), `"data":{"error":"backplane unreachable","errorKind":"unavailable"}`)
			assert.ErrorIs(t, s.Err(), ErrClosed)
			assert.Contains(t, s.Err().Error(), "unavailable")
		}
		_, err := b.Publish(Event{Type: "x"})
		assert.ErrorIs(t, err, ErrClosed)
	})
}

func TestBusCloseForShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		never := subscribe(t, b, SubscribeOptions{})
		polled := subscribe(t, b, SubscribeOptions{})
		behind := subscribe(t, b, SubscribeOptions{Types: []string{"nothing"}})
		publishNumbered(t, b, 2)
		require.NoError(t, b.CloseForShutdown(1500*time.Millisecond))
		require.NoError(t, b.CloseForShutdown(time.Second), "idempotent")
		require.NoError(t, b.closeWithError(ErrorKindInternal, "again"), "only the first close counts")
		require.NoError(t, b.Close())
		want := `"data":` + shutdownData(1500) + `,`
		for name, s := range map[string]*Subscription{"never iterated": never, "polled": polled} {
			fs := collectEvents(s)
			require.Len(t, fs, 3, "%s: what was queued, then the terminal frame", name)
			assert.Equal(t, idRange(1, 2), describe(fs[:2]), name)
			assert.True(t, fs[2].Terminal(), name)
			assert.Contains(t, string(fs[2].JSON()), want, name)
			assert.ErrorIs(t, s.Err(), ErrClosed, name)
			assert.Contains(t, s.Err().Error(), `"errorKind":"shutdown"`, name)
		}
		fs := collectEvents(behind)
		require.Len(t, fs, 1, "a filter that took nothing still gets the end")
		assert.Contains(t, string(fs[0].JSON()), want)
		_, err := b.Publish(Event{Type: "x"})
		assert.ErrorIs(t, err, ErrClosed)
		assert.Equal(t, uint64(7), b.Stats().FramesDelivered, "4 events and 3 terminal frames")
	})
}

func TestBusCloseIsIdempotent(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	publishNumbered(t, b, 1)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { assert.NoError(t, b.Close()) })
	}
	wg.Wait()
	assert.NoError(t, b.Close())
	assert.Equal(t, []string{"#1"}, describe(collectEvents(s)))
}

func TestAfterClosePublishErrClosedAndSubscribeEnded(t *testing.T) {
	b := newBus(t, Options{})
	publishNumbered(t, b, 2)
	require.NoError(t, b.Close())
	_, err := b.Publish(Event{Type: "t"})
	assert.ErrorIs(t, err, ErrClosed)
	s, err := b.Subscribe(context.Background(), SubscribeOptions{Resume: true})
	require.NoError(t, err)
	assert.Empty(t, collectEvents(s))
	assert.Equal(t, 0, b.SubscriberCount())
	assert.Equal(t, uint64(2), b.LastEventID())
}

func TestZeroEventBusBehavesAsClosed(t *testing.T) {
	var b EventBus
	_, err := b.Publish(Event{Type: "x"})
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, b.Signal("x", "a"), ErrClosed)
	s, err := b.Subscribe(context.Background(), SubscribeOptions{Resume: true})
	require.NoError(t, err)
	fs, open := s.AppendReady(nil)
	assert.Empty(t, fs)
	assert.False(t, open)
	assert.Zero(t, b.LastEventID())
	assert.NoError(t, b.Close())
}
