package eventbus

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ---------------------------------------------------------------------------
// Subscribe (SPEC 5).

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

// ---------------------------------------------------------------------------
// Cancellation and Close (SPEC 8).

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
		require.NoError(t, b.CloseWithError(ErrorKindUnavailable, "backplane unreachable"))
		require.NoError(t, b.CloseWithError(ErrorKindInternal, "again"), "idempotent")
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

func TestDefaultClockStampsWallTimeBetweenRebases(t *testing.T) {
	// Without Options.Now the bus reads one monotonic clock per stamp and
	// re-reads the wall clock at least once a second; every stamp must still
	// be the wall time of the publish, to the millisecond.
	synctest.Test(t, func(t *testing.T) {
		b, err := New(Options{})
		require.NoError(t, err)
		defer b.Close()
		for _, step := range []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, 1500 * time.Millisecond, 7 * time.Millisecond} {
			time.Sleep(step)
			f, err := b.Publish(Event{Type: "t"})
			require.NoError(t, err)
			var env struct {
				Meta struct {
					ServerTimestamp int64 `json:"serverTimestamp"`
				} `json:"_meta"`
			}
			require.NoError(t, json.Unmarshal(f.JSON(), &env))
			assert.Equal(t, time.Now().UnixMilli(), env.Meta.ServerTimestamp, "after sleeping %v", step)
		}
	})
}

// A cancellation (the context, or Subscription.Close) drops what is left and
// counts it as cancelled, before a bus Close or while the subscription
// drains what Close left, whoever consumes it: the Events iterator (also
// when the cancellation comes while it yields, from its loop body), or
// AppendReady and TakeReady (SPEC 8; issue 22: Events yielded all 99 others
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
