package eventbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ---------------------------------------------------------------------------
// Subscribe (SPEC 2.3).

func TestSubscribeRegistersSynchronously(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	publishEvent(t, b, Event{Type: "t"})
	fs, open := s.AppendReady(nil)
	assert.True(t, open)
	assert.Equal(t, []string{"#1"}, describe(fs))

	// The same holds for a concurrent publisher: whatever is published after
	// Subscribe returns is delivered.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				_, _ = b.Publish(Event{Type: "bg"})
			}
		}
	})
	for range 50 {
		s := subscribe(t, b, SubscribeOptions{MaxQueued: 2048})
		after := b.LastEventID()
		f := publishEvent(t, b, Event{Type: "mine"})
		fs, _ := s.AppendReady(nil)
		require.NotEmpty(t, fs)
		assert.LessOrEqual(t, fs[0].ID(), after+1)
		if errors.Is(s.Err(), ErrEvicted) {
			// A descheduled test goroutine can let the background
			// publisher fill 2048 frames first; that is a legitimate end.
			s.Close()
			continue
		}
		// Background events may follow mine; mine must be among them.
		assert.True(t, slices.ContainsFunc(fs, func(x Frame) bool { return x.ID() == f.ID() }),
			"#%d published after Subscribe returned was not delivered", f.ID())
		s.Close()
	}
	close(stop)
	wg.Wait()
}

func TestSubscribeLimitReturnsSubscriberLimitError(t *testing.T) {
	b := newBus(t, Options{MaxSubscribers: 3})
	for range 3 {
		subscribe(t, b, SubscribeOptions{})
	}
	s, err := b.Subscribe(context.Background(), SubscribeOptions{})
	assert.Nil(t, s)
	require.ErrorIs(t, err, ErrSubscriberLimitExceeded)
	var lim *SubscriberLimitError
	require.ErrorAs(t, err, &lim)
	assert.Equal(t, 3, lim.Limit)
	assert.Contains(t, err.Error(), "3")
	assert.Equal(t, 3, b.SubscriberCount())
}

func TestSubscribeLimitReleasesTheContextWatch(t *testing.T) {
	b := newBus(t, Options{MaxSubscribers: 1})
	subscribe(t, b, SubscribeOptions{})
	ctx := newWatchCtx()
	_, err := b.Subscribe(ctx, SubscribeOptions{})
	require.ErrorIs(t, err, ErrSubscriberLimitExceeded)
	assert.Equal(t, 0, ctx.watchers())
}

func TestSubscribeOnClosedBusReturnsEndedSubscription(t *testing.T) {
	b := newBus(t, Options{})
	publishNumbered(t, b, 3)
	require.NoError(t, b.Close())
	ctx := newWatchCtx()
	s, err := b.Subscribe(ctx, SubscribeOptions{Resume: true})
	require.NoError(t, err)
	require.NotNil(t, s)
	assert.Empty(t, collectEvents(s))
	assert.NoError(t, s.Err())
	assert.Equal(t, 0, b.SubscriberCount())
	assert.Equal(t, 0, ctx.watchers())
	fs, open := s.AppendReady(nil)
	assert.Empty(t, fs)
	assert.False(t, open)
}

func TestSubscribeWithDoneContextReturnsEndedSubscription(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		subscribe(t, b, SubscribeOptions{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		s, err := b.Subscribe(ctx, SubscribeOptions{Resume: true})
		require.NoError(t, err)
		require.NotNil(t, s)
		assert.Equal(t, 1, b.SubscriberCount())
		publishNumbered(t, b, 2)
		assert.Empty(t, collectEvents(s))
		assert.ErrorIs(t, s.Err(), context.Canceled)
		synctest.Wait()
		assert.Equal(t, 1, b.SubscriberCount())

		// A done context is not even watched.
		wc := newWatchCtx()
		wc.cancel()
		s, err = b.Subscribe(wc, SubscribeOptions{})
		require.NoError(t, err)
		assert.Equal(t, 0, wc.watchers())
		assert.Empty(t, collectEvents(s))
		assert.Equal(t, 1, b.SubscriberCount())
	})
}

func TestSubscribeChecksInSpecOrder(t *testing.T) {
	done, cancel := context.WithCancel(context.Background())
	cancel()

	// Options come before a closed bus.
	closed := newBus(t, Options{})
	require.NoError(t, closed.Close())
	_, err := closed.Subscribe(context.Background(), SubscribeOptions{MaxQueued: -1})
	assert.ErrorIs(t, err, ErrInvalidOption)

	// A closed bus comes before a done context (either way: ended, no error).
	s, err := closed.Subscribe(done, SubscribeOptions{})
	require.NoError(t, err)
	assert.NoError(t, s.Err(), "ended by the closed bus, not by the context")

	// A done context comes before the subscriber limit.
	full := newBus(t, Options{MaxSubscribers: 1})
	subscribe(t, full, SubscribeOptions{})
	s, err = full.Subscribe(done, SubscribeOptions{})
	require.NoError(t, err)
	assert.Empty(t, collectEvents(s))
}

func TestSubscribeResumeFalseDiffersFromResumeFromZero(t *testing.T) {
	b := newBus(t, Options{})
	publishNumbered(t, b, 3)
	live := subscribe(t, b, SubscribeOptions{LastEventID: 0})
	fromStart := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 0})
	// LastEventID without Resume is ignored.
	ignored := subscribe(t, b, SubscribeOptions{LastEventID: 1})
	publishEvent(t, b, Event{Type: "t"})

	fs, _ := live.AppendReady(nil)
	assert.Equal(t, []string{"#4"}, describe(fs))
	fs, _ = ignored.AppendReady(nil)
	assert.Equal(t, []string{"#4"}, describe(fs))
	fs, _ = fromStart.AppendReady(nil)
	assert.Equal(t, seqOf(idRange(1, 3), TypeReplayComplete, "#4"), describe(fs))
}

// SubscribeOptions.CursorInvalid: a live subscription whose first frame is
// state_resync_required cursor_invalid, whose earliestAvailableId is the
// first event it gets, whatever publishers do meanwhile; no
// replay_complete; counted; not with Resume.
func TestSubscribeCursorInvalid(t *testing.T) {
	b := newBus(t, Options{})
	publishNumbered(t, b, 3)
	_, err := b.Subscribe(context.Background(), SubscribeOptions{Resume: true, CursorInvalid: true})
	require.ErrorIs(t, err, ErrInvalidOption)

	stop := make(chan struct{})
	published := make(chan struct{})
	go func() {
		defer close(published)
		for {
			select {
			case <-stop:
				return
			default:
				if _, err := b.Publish(Event{Type: "t"}); err != nil {
					return
				}
			}
		}
	}()
	const n = 100
	for i := range n {
		opts := SubscribeOptions{CursorInvalid: true, MaxQueued: MaxClientMaxQueued}
		if i%2 == 1 {
			opts.Types = []string{"nothing.*"} // the notice passes any filter
		}
		sub := subscribe(t, b, opts)
		want := 2 // the notice and the first live event
		if opts.Types != nil {
			want = 1 // the notice alone passes
		}
		var fs []Frame
		for {
			fs, _ = sub.AppendReady(fs)
			if len(fs) >= want {
				break
			}
			<-sub.Ready()
		}
		require.Equal(t, TypeStateResyncRequired, fs[0].Type(), "the notice first")
		var env struct {
			Data struct {
				Reason              string
				LastDeliveredID     *uint64
				EarliestAvailableID uint64
				Epoch               string
			}
		}
		require.NoError(t, json.Unmarshal(fs[0].JSON(), &env))
		d := env.Data
		require.Equal(t, ReasonCursorInvalid, d.Reason)
		require.NotNil(t, d.LastDeliveredID)
		require.Zero(t, *d.LastDeliveredID)
		require.Equal(t, b.Epoch(), d.Epoch)
		if want == 2 {
			require.Equal(t, d.EarliestAvailableID, fs[1].ID(), "earliestAvailableId is the first live event")
			for _, f := range fs[1:] {
				require.NotEqual(t, TypeReplayComplete, f.Type())
			}
		}
		sub.Close()
	}
	close(stop)
	<-published
	require.Equal(t, uint64(n), b.Stats().Resyncs.CursorInvalid)
}

// ---------------------------------------------------------------------------
// Cancellation and Close (SPEC 2.5).

func TestContextCancelDropsBufferAndEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		ctx, cancel := context.WithCancel(context.Background())
		s, err := b.Subscribe(ctx, SubscribeOptions{})
		require.NoError(t, err)
		publishNumbered(t, b, 5)
		cancel()
		synctest.Wait()
		fs, open := s.AppendReady(nil)
		assert.Empty(t, fs, "the buffer is dropped at once")
		assert.False(t, open)
		assert.ErrorIs(t, s.Err(), context.Canceled)
		assert.Equal(t, 0, b.SubscriberCount())
		publishNumbered(t, b, 1)
		assert.Equal(t, 0, s.q.len())

		// A consumer blocked in Events returns.
		ctx, cancel = context.WithCancel(context.Background())
		s, err = b.Subscribe(ctx, SubscribeOptions{})
		require.NoError(t, err)
		ended := make(chan []Frame)
		go func() { ended <- collectEvents(s) }()
		publishNumbered(t, b, 1)
		synctest.Wait()
		cancel()
		assert.Equal(t, []string{"#7"}, describe(<-ended))
	})
}

// A detached subscription (SubscribeOptions.Detached): its context bounds
// Subscribe only. It is not watched once Subscribe returns, its
// cancellation ends nothing, and Close ends the subscription as usual; a
// context done already still gets an ended subscription, never registered.
func TestDetachedSubscriptionOutlivesItsContext(t *testing.T) {
	b := newBus(t, Options{})
	ctx := newWatchCtx()
	s, err := b.Subscribe(ctx, SubscribeOptions{Detached: true})
	require.NoError(t, err)
	assert.Equal(t, 0, ctx.watchers(), "a detached subscription does not watch its context")
	ctx.cancel()
	publishNumbered(t, b, 3)
	fs, open := s.AppendReady(nil)
	assert.True(t, open, "the context's cancellation does not end it")
	assert.Equal(t, []string{"#1", "#2", "#3"}, describe(fs))
	assert.NoError(t, s.Err())
	assert.Equal(t, 1, b.SubscriberCount())
	publishNumbered(t, b, 2)
	s.Close()
	fs, open = s.AppendReady(nil)
	assert.Empty(t, fs, "Close drops what was queued")
	assert.False(t, open)
	assert.ErrorIs(t, s.Err(), context.Canceled)
	assert.Equal(t, 0, b.SubscriberCount())
	assert.Equal(t, uint64(2), b.Stats().Dropped.Cancelled)

	done := newWatchCtx()
	done.cancel()
	s, err = b.Subscribe(done, SubscribeOptions{Detached: true})
	require.NoError(t, err)
	assert.Empty(t, collectEvents(s))
	assert.ErrorIs(t, s.Err(), context.Canceled)
	assert.Equal(t, 0, b.SubscriberCount(), "a context done already: never registered")
}

func TestSubscriptionCloseDropsBufferAndEnds(t *testing.T) {
	ctx := newWatchCtx()
	b := newBus(t, Options{})
	s, err := b.Subscribe(ctx, SubscribeOptions{})
	require.NoError(t, err)
	publishNumbered(t, b, 5)
	s.Close()
	fs, open := s.AppendReady(nil)
	assert.Empty(t, fs)
	assert.False(t, open)
	assert.ErrorIs(t, s.Err(), context.Canceled)
	assert.Equal(t, 0, b.SubscriberCount())
	assert.Equal(t, 0, ctx.watchers(), "the context is no longer watched")
	assert.Empty(t, collectEvents(s))
}

func TestCancellationIsIdempotent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		other := subscribe(t, b, SubscribeOptions{})
		ctx, cancel := context.WithCancel(context.Background())
		s, err := b.Subscribe(ctx, SubscribeOptions{})
		require.NoError(t, err)
		s.Close()
		s.Close()
		cancel()
		synctest.Wait()
		s.Close()
		assert.ErrorIs(t, s.Err(), context.Canceled)
		assert.Equal(t, 1, b.SubscriberCount())
		publishNumbered(t, b, 1)
		fs, open := other.AppendReady(nil)
		assert.True(t, open)
		assert.Equal(t, []string{"#1"}, describe(fs))
	})
}

func TestBreakingOutOfEventsClosesSubscription(t *testing.T) {
	ctx := newWatchCtx()
	b := newBus(t, Options{})
	s, err := b.Subscribe(ctx, SubscribeOptions{})
	require.NoError(t, err)
	publishNumbered(t, b, 3)
	var got []Frame
	for f := range s.Events() {
		got = append(got, f)
		break
	}
	assert.Equal(t, []string{"#1"}, describe(got))
	assert.Equal(t, 0, b.SubscriberCount())
	assert.ErrorIs(t, s.Err(), context.Canceled)
	assert.Equal(t, 0, ctx.watchers())
	fs, open := s.AppendReady(nil)
	assert.Empty(t, fs, "#2 and #3 were dropped")
	assert.False(t, open)
}

func TestEventsIsSingleUse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		s := subscribe(t, b, SubscribeOptions{})
		first := make(chan []Frame)
		go func() { first <- collectEvents(s) }()
		publishNumbered(t, b, 2)
		synctest.Wait() // the first iterator took both and waits

		n := 0
		for range s.Events() {
			n++
		}
		assert.Zero(t, n, "a second range yields nothing")
		assert.Equal(t, 1, b.SubscriberCount(), "and does not end the subscription")

		publishNumbered(t, b, 1)
		require.NoError(t, b.Close())
		assert.Equal(t, []string{"#1", "#2", "#3"}, describe(<-first))

		for range s.Events() {
			n++
		}
		assert.Zero(t, n)
	})
}

func TestEventsDeliversToABlockedConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		s := subscribe(t, b, SubscribeOptions{})
		got := make(chan Frame, 100)
		go func() {
			for f := range s.Events() {
				got <- f
			}
			close(got)
		}()
		for i := range 5 {
			synctest.Wait() // the consumer is blocked waiting
			publishNumbered(t, b, 1)
			f := <-got
			assert.Equal(t, uint64(i+1), f.ID())
		}
		s.Close()
		_, ok := <-got
		assert.False(t, ok)
	})
}

func TestReadyAndAppendReady(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	select {
	case <-s.Ready():
		t.Fatal("token before any frame")
	default:
	}
	publishNumbered(t, b, 2)
	select {
	case <-s.Ready():
	default:
		t.Fatal("no token after a frame")
	}
	dst := make([]Frame, 1, 8)
	fs, open := s.AppendReady(dst)
	assert.True(t, open)
	require.Len(t, fs, 3, "appended after what dst held")
	assert.Equal(t, []string{"#1", "#2"}, describe(fs[1:]))
	fs, open = s.AppendReady(nil)
	assert.Empty(t, fs)
	assert.True(t, open)
	require.NoError(t, b.Close())
	select {
	case <-s.Ready():
	default:
		t.Fatal("no token at the end")
	}
	fs, open = s.AppendReady(nil)
	assert.Empty(t, fs)
	assert.False(t, open)
}

func TestCancellationAfterCloseDropsDrainingBuffer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		ctx, cancel := context.WithCancel(context.Background())
		viaCtx, err := b.Subscribe(ctx, SubscribeOptions{})
		require.NoError(t, err)
		viaClose := subscribe(t, b, SubscribeOptions{})
		publishNumbered(t, b, 3)
		require.NoError(t, b.Close())

		cancel()
		viaClose.Close()
		synctest.Wait()
		for _, s := range []*Subscription{viaCtx, viaClose} {
			fs, open := s.AppendReady(nil)
			assert.Empty(t, fs)
			assert.False(t, open)
		}
	})
}

func TestBusCloseReleasesContextWatchWhenDrained(t *testing.T) {
	b := newBus(t, Options{})
	polled, ranged := newWatchCtx(), newWatchCtx()
	s1, err := b.Subscribe(polled, SubscribeOptions{})
	require.NoError(t, err)
	s2, err := b.Subscribe(ranged, SubscribeOptions{})
	require.NoError(t, err)
	publishNumbered(t, b, 2)
	require.NoError(t, b.Close())
	// Still watched while draining, so a cancellation can drop the buffer.
	assert.Equal(t, 1, polled.watchers())
	assert.Equal(t, 1, ranged.watchers())

	fs, open := s1.AppendReady(nil)
	assert.Len(t, fs, 2)
	assert.False(t, open)
	assert.Equal(t, 0, polled.watchers(), "released at the end of the stream")
	assert.Len(t, collectEvents(s2), 2)
	assert.Equal(t, 0, ranged.watchers())
}

// A cancellation (the context, or Subscription.Close) drops what is left and
// counts it as cancelled, before a bus Close or while the subscription
// drains what Close left, whoever consumes it: the Events iterator (also
// when the cancellation comes while it yields, from its loop body), or
// AppendReady and TakeReady (SPEC 2.5; issue 22: Events yielded all 99 others
// after a cancel that came once the bus was closed).
func TestCancellationWhileDrainingDropsTheRest(t *testing.T) {
	const n = 100
	type consumer struct {
		name string
		// consume takes what is there, calling end after the first frame
		// when endAt is set; it returns how many frames it got.
		consume func(s *Subscription, end func()) int
	}
	consumers := []consumer{
		{"Events", func(s *Subscription, end func()) int {
			got := 0
			for range s.Events() {
				got++
				if got == 1 && end != nil {
					end()
				}
			}
			return got
		}},
		{"AppendReady", func(s *Subscription, _ func()) int {
			fs, open := s.AppendReady(nil)
			if open {
				panic("still open")
			}
			return len(fs)
		}},
		{"TakeReady", func(s *Subscription, _ func()) int {
			fs, open := s.TakeReady(nil)
			if open {
				panic("still open")
			}
			s.MarkWritten(len(fs))
			return len(fs)
		}},
	}
	for _, c := range consumers {
		for _, how := range []string{"context", "Subscription.Close"} {
			for _, when := range []string{"before bus Close", "after bus Close", "while yielding after bus Close"} {
				if when == "while yielding after bus Close" && c.name != "Events" {
					continue // AppendReady and TakeReady hand over all at once
				}
				t.Run(c.name+"/"+how+"/"+when, func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) {
						b := newBus(t, Options{})
						ctx, cancel := context.WithCancel(context.Background())
						defer cancel()
						s, err := b.Subscribe(ctx, SubscribeOptions{})
						require.NoError(t, err)
						publishNumbered(t, b, n)
						end := func() {
							if how == "context" {
								cancel()
							} else {
								s.Close()
							}
							synctest.Wait() // the context's callback has run
						}
						var endInLoop func()
						switch when {
						case "before bus Close":
							end()
							require.NoError(t, b.Close())
						case "after bus Close":
							require.NoError(t, b.Close())
							end()
						default:
							require.NoError(t, b.Close())
							endInLoop = end
						}
						got := c.consume(s, endInLoop)
						want := 0
						if endInLoop != nil {
							want = 1 // the frame the loop body ended on
						}
						require.Equal(t, want, got)
						st := b.Stats()
						require.EqualValues(t, n-want, st.Dropped.Cancelled, "what was left is dropped, counted as cancelled")
						require.EqualValues(t, want, st.FramesDelivered)
						fs, open := s.AppendReady(nil)
						require.Empty(t, fs)
						require.False(t, open)
					})
				})
			}
		}
	}
}

// ---------------------------------------------------------------------------
// Delivery allocates nothing.

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
			wire = append(wire[:0], f.SSE()...)
		}
	})
	assert.Equal(t, publish, both)
}

// ---------------------------------------------------------------------------
// The Events iterator's caps are exact, and cancellation is prompt.

func TestEventsBatchCountsTowardTheCapsUntilYielded(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16})
	s := subscribe(t, b, SubscribeOptions{})
	publishTypeN(t, b, "e", 10)
	inBody := make(chan uint64)
	release := make(chan struct{})
	done := make(chan []Frame)
	go func() {
		var fs []Frame
		for f := range s.Events() {
			fs = append(fs, f)
			if len(fs) == 1 {
				inBody <- f.ID()
				<-release
			}
		}
		done <- fs
	}()
	require.Equal(t, uint64(1), <-inBody)
	// The iterator took #1..#10 and yielded #1: 9 still count.
	assert.Equal(t, 9, s.q.counts().liveCount)
	publishTypeN(t, b, "e", 7) // #11..#17: 16 unconsumed
	assert.Equal(t, 16, s.q.counts().liveCount)
	assert.NoError(t, s.Err())
	publishType(t, b, "e") // #18: past the cap
	assert.ErrorIs(t, s.Err(), ErrEvicted)
	close(release)
	fs := <-done
	// The warning fired once, at 12 unconsumed (#2..#10 in the batch,
	// #11..#13 queued), so right after #13.
	assert.Equal(t, seqOf(idRange(1, 13), TypeSlowClientWarning, idRange(14, 17), TypeClientEvicted), describe(fs))
	assert.Equal(t, uint64(1), b.Stats().Warnings)
	assert.JSONEq(t, fmt.Sprintf(`{"reason":"queue_overflow","droppedAfter":18,"queueSize":16,"maxQueued":16,"queuedBytes":%d,"maxQueuedBytes":%d}`,
		16*pub11Size(b, 10)-8, DefaultMaxQueuedBytes), dataOf(t, fs[len(fs)-1]), "#2..#9 are a byte shorter than #10..#17")
}

func TestEventsSlowBodyNeverHoldsMoreThanTheCaps(t *testing.T) {
	// A loop body that takes a while per frame, a publisher faster than it
	// under OverflowCatchUp: at no point do the frames it has not consumed
	// (queued, or taken and not yielded) exceed either cap.
	const maxQueued, maxBytes = 32, 3000
	b := newBus(t, Options{MaxQueued: maxQueued, MaxQueuedBytes: maxBytes, OverflowPolicy: OverflowCatchUp})
	s := subscribe(t, b, SubscribeOptions{})
	var maxSeen atomic.Int64
	var got []uint64
	n := pick(500, 2000, 2000)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for f := range s.Events() {
			if f.ID() != 0 {
				got = append(got, f.ID())
			}
			if len(got) == n {
				return
			}
			time.Sleep(20 * time.Microsecond)
		}
	}()
	for range n {
		publishSized(t, b, "e", 90)
		c := s.q.counts()
		if int64(c.liveCount) > maxSeen.Load() {
			maxSeen.Store(int64(c.liveCount))
		}
		require.LessOrEqual(t, c.liveCount, maxQueued)
		require.LessOrEqual(t, c.liveBytes, maxBytes)
	}
	<-done
	requireIDs(t, seqIDs(1, uint64(n)), got)
	t.Logf("most frames unconsumed at once: %d (cap %d); catch-ups %d", maxSeen.Load(), maxQueued, b.Stats().CatchUp.Entered)
}

func TestEventsCancelMidBatchYieldsNothingMore(t *testing.T) {
	for _, how := range []string{"Close", "context"} {
		t.Run(how, func(t *testing.T) {
			b := newBus(t, Options{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := b.Subscribe(ctx, SubscribeOptions{})
			require.NoError(t, err)
			publishTypeN(t, b, "e", 100)
			var got []Frame
			for f := range s.Events() {
				got = append(got, f)
				if len(got) == 1 {
					if how == "Close" {
						s.Close()
					} else {
						cancel()
						// The context's AfterFunc runs on its own goroutine.
						require.Eventually(t, s.q.discarded.Load, 5*time.Second, time.Millisecond)
					}
				}
			}
			assert.Len(t, got, 1, "nothing after the cancellation")
			st := b.Stats()
			assert.Equal(t, uint64(1), st.FramesDelivered)
			assert.Equal(t, uint64(99), st.Dropped.Cancelled, "the 99 taken and not yielded")
			assert.Zero(t, s.q.counts().liveCount)
		})
	}
}

func TestEventsCancelRightAfterTheFirstReplayedFrame(t *testing.T) {
	b := newBus(t, Options{})
	publishTypeN(t, b, "e", DefaultRingSize)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := b.Subscribe(ctx, SubscribeOptions{Resume: true, LastEventID: 0})
	require.NoError(t, err)
	n := 0
	for range s.Events() {
		n++
		cancel()
		require.Eventually(t, s.q.discarded.Load, 5*time.Second, time.Millisecond)
	}
	assert.Equal(t, 1, n)
	st := b.Stats()
	assert.Equal(t, uint64(1), st.FramesDelivered)
	assert.Equal(t, uint64(DefaultRingSize), st.Dropped.Cancelled, "7999 replayed events and replay_complete")
}

func TestEventsBusCloseMidBatchStillDrains(t *testing.T) {
	// Close with drain is not a cancellation: the batch is yielded in full.
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	publishTypeN(t, b, "e", 50)
	var ids []uint64
	for f := range s.Events() {
		ids = append(ids, f.ID())
		if len(ids) == 1 {
			require.NoError(t, b.Close())
		}
	}
	requireIDs(t, seqIDs(1, 50), ids)
	assert.Zero(t, b.Stats().Dropped.Cancelled)
}

func TestEventsCatchUpCountsRingFramesUntilYielded(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 8, OverflowPolicy: OverflowCatchUp})
	s := subscribe(t, b, SubscribeOptions{})
	publishTypeN(t, b, "e", 100) // #1..#8 queued, behind at #9
	var it iterBatch
	require.True(t, it.fill(s))
	assert.Equal(t, seqIDs(1, 8), eventIDs(it.frames), "the queue first")
	for range 9 { // #1..#8 and the warning
		_, ok := it.next(&s.q)
		require.True(t, ok)
	}
	it.done(s)
	require.True(t, it.fill(s))
	assert.Equal(t, seqIDs(9, 16), eventIDs(it.frames), "then the ring, within the frame cap")
	assert.Equal(t, 8, s.q.counts().liveCount, "taken from the ring, not yielded: they count")
	f, _ := it.next(&s.q)
	assert.Equal(t, uint64(9), f.ID())
	assert.Equal(t, 7, s.q.counts().liveCount)
	it.drop(s)
	assert.Equal(t, 0, s.q.counts().liveCount)
}

// A consumer yields before it waits only while its takes find several
// frames (its publisher outpaces its wake-ups); one that takes a frame at a
// time declares itself waiting at once, so the next push wakes it (issue
// 26). AppendReady here; the Events iterator takes the same way (take with
// yield).
func TestConsumerYieldsOnlyWhileItsTakesFindSeveralFrames(t *testing.T) {
	yields := 0
	defer func(f func()) { consumerYield = f }(consumerYield)
	consumerYield = func() { yields++ }

	b := newBus(t, Options{})
	s, err := b.Subscribe(context.Background(), SubscribeOptions{})
	require.NoError(t, err)
	take := func() int {
		frames, open := s.AppendReady(nil)
		require.True(t, open)
		return len(frames)
	}
	woken := func() bool {
		select {
		case <-s.Ready():
			return true
		default:
			return false
		}
	}
	require.Zero(t, take(), "nothing yet")
	require.Zero(t, yields, "no take has found frames: no yield")

	publishN(t, b, 1)
	require.Equal(t, 1, take())
	woken() // the token of the first push, which found the consumer waiting
	require.Zero(t, take())
	require.Zero(t, yields, "one frame at a time: it waits without yielding")
	require.False(t, woken())
	publishN(t, b, 1)
	require.True(t, woken(), "the empty take declared it waiting: the next push wakes it")

	publishN(t, b, 2)
	require.Equal(t, 3, take())
	require.Zero(t, take())
	require.Equal(t, 1, yields, "several frames: one yield before it waits")
	require.Zero(t, take())
	require.Equal(t, 2, yields, "still batching until a take finds one frame")

	publishN(t, b, 1)
	require.Equal(t, 1, take())
	require.Zero(t, take())
	require.Equal(t, 2, yields, "back to one frame at a time")
}
