package eventbus

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"math"
	"sync/atomic"
)

// Subscription is one subscriber's view of a bus: a bounded queue of frames
// that the bus fills and one consumer drains.
//
// Consume it either with Events, a blocking iterator, or with Ready and
// AppendReady, for a writer that must also wait on timers or a request
// context; a transport that reports what it wrote uses TakeReady instead
// of AppendReady (see there). Only one goroutine may consume at a time; Close and Err are safe
// to call from any goroutine. No goroutine runs per subscription.
// Subscriptions are made by Subscribe; a zero Subscription is not usable.
type Subscription struct {
	// Set by Subscribe before s is shared, never changed (q's own fields
	// say who guards them).
	bus    *EventBus
	q      boundedAsyncQueue
	filter *typeFilter
	policy OverflowPolicy

	// Guarded by bus.mu.
	warned    bool
	cancelled bool
	// yieldedUnread is set once a publish yielded for s before its consumer
	// first looked for frames (see yieldFor).
	yieldedUnread bool
	overflows     [2]int64 // Unix ms of the last two overflows under OverflowResync, newest last
	// noverflows is how many of overflows are set (0..2). A zero time
	// cannot mean "unset": a fake clock at the Unix epoch stamps 0 ms.
	noverflows int
	// Catch-up (OverflowCatchUp). While behind, publishers push s no
	// events; cursor is the next id its consumer needs from the ring, and
	// progress the Unix ms of its last take (or of falling behind), which
	// a publish compares with stallMillis.
	behind      bool
	stallMillis int64
	// The consumer reads the ring without the lock while behind, so these
	// two are atomic (see catchUpFast).
	cursor   atomic.Uint64
	progress atomic.Int64
	// lagging mirrors behind for the consumer's look without the lock.
	lagging atomic.Bool

	// Set by Subscribe, never changed.
	warnFrames, resetFrames, warnBytes, resetBytes float64

	// batching is the consumer's own (see take): its last take that
	// found frames found more than one.
	batching bool

	// shed is set when a Hub's budget took back what s held (hub_pins.go);
	// interrupt is SubscribeOptions.Interrupt.
	shed      atomic.Bool
	interrupt func() // set by Subscribe, never changed

	stop     func() bool // stops watching the context; nil if none; set by Subscribe before s is shared
	released atomic.Bool
	endErr   atomic.Pointer[error]
	iterated atomic.Bool
}

// Subscribe registers a subscription and, when opts.Resume is set, queues
// the replay ahead of the live frames, with no gap and no duplicate
// between them (what a resume replays: docs/SPEC.md section 4; the check
// order: section 2.3); with opts.CursorInvalid it queues the
// cursor_invalid notice ahead of them instead. Registration is
// synchronous: an event published after Subscribe returns is delivered.
//
// When ctx is done the subscription is cancelled (its buffer dropped),
// unless opts.Detached is set: then ctx bounds Subscribe alone. On a
// closed bus Subscribe returns an ended subscription and no error; with a
// ctx already done, an ended subscription that was never registered. It
// returns an error wrapping ErrInvalidOption for a negative MaxQueued, an
// unknown OverflowPolicy, CursorInvalid with Resume or a full Group, one wrapping ErrInvalidFilter for an invalid
// Types entry, and a *SubscriberLimitError when the bus is full. Subscribe does not block on
// other subscribers.
//
// On a backplane's mirror of a shared log (backplane.NewMirror), a resume
// the ring cannot answer is answered from the log: Subscribe reads it
// (MirrorOptions.Log) outside the bus lock, and queues it ahead of the live
// frames that arrived meanwhile; a resume from an id the log holds but the
// bus has not been fed yet first waits for the feed, at most
// MirrorOptions.LagTimeout. Both block on the log's I/O, bounded by ctx.
func (b *EventBus) Subscribe(ctx context.Context, opts SubscribeOptions) (*Subscription, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	set, err := opts.resolve(b.opts)
	if err != nil {
		return nil, err
	}
	maxQueued := set.maxQueued
	s := &Subscription{bus: b, filter: set.filter, policy: set.policy, stallMillis: set.stall.Milliseconds(), interrupt: opts.Interrupt}
	s.q.init(maxQueued, b.opts.MaxQueuedBytes)
	_, s.q.trackTaken = b.owner.(*hubSession)
	s.warnFrames = WarnThresholdRatio * float64(maxQueued)
	s.resetFrames = WarnResetRatio * float64(maxQueued)
	s.warnBytes = WarnThresholdRatio * float64(b.opts.MaxQueuedBytes)
	s.resetBytes = WarnResetRatio * float64(b.opts.MaxQueuedBytes)
	if opts.Group != nil {
		if err := opts.Group.join(s); err != nil {
			return nil, err
		}
	}

	if b.closedOrZero() {
		s.end(nil)
		s.q.close(true)
		return s, nil
	}
	if err := ctx.Err(); err != nil {
		s.end(err)
		s.q.close(false)
		return s, nil
	}
	if !opts.Detached && ctx.Done() != nil {
		// Set before the lock: publishers that evict s read it after
		// acquiring the lock, so they see it.
		s.stop = context.AfterFunc(ctx, func() { s.cancel(ctx.Err(), true) })
	}

	b.awaitFeed(ctx, opts)

	if b.SubscriberCount() >= b.opts.MaxSubscribers {
		// On a quiet bus no publish comes to evict a stalled subscriber
		// catching up: the slot it holds is freed here.
		b.sweepStalled()
	}
	var now, noticeAt int64
	if b.opts.MaxAge > 0 {
		now = b.now() // read outside the lock
	}
	if opts.CursorInvalid {
		noticeAt = b.now() // the clock is user code: not under the lock
	}
	b.mu.Lock()
	if now != 0 && b.ring.dropOlder(now-b.opts.MaxAge.Milliseconds()) > 0 {
		b.ringChangedLocked(0)
	}
	switch {
	case b.closed:
		b.mu.Unlock()
		s.end(nil)
		s.q.close(true)
		s.release()
		return s, nil
	case s.cancelled:
		// ctx ended between the check above and the lock.
		b.mu.Unlock()
		return s, nil
	case len(b.subs) >= b.opts.MaxSubscribers:
		b.mu.Unlock()
		s.end(ErrSubscriberLimitExceeded)
		s.q.close(false)
		s.release()
		if opts.Group != nil {
			opts.Group.leave(s)
		}
		return nil, &SubscriberLimitError{Limit: b.opts.MaxSubscribers}
	}
	b.addLocked(s)
	remote := opts.Resume && b.fed() != nil && b.fed().log != nil && !b.ringCoversLocked(opts)
	upto := b.nextID - 1
	switch {
	case opts.CursorInvalid:
		// Under the lock that publishers take: the notice is the first
		// frame, ahead of every live one, and its earliestAvailableId is
		// the first id this subscription can be delivered.
		s.q.forcePush(resyncFrame(ReasonCursorInvalid, "", 0, b.nextID, b.epoch, noticeAt).ref())
		b.stats.resync(ReasonCursorInvalid)
	case remote:
		// Live frames queue up behind the hold while history is read;
		// the replay goes in front of them.
		s.q.hold()
	case opts.Resume:
		// One queue lock for the whole replay: thousands of frames cost
		// one buffer allocation and no per-frame locking.
		s.q.beginReplay(b.ring.Len() + 3)
		b.replay(s, opts, &b.ring, b.ring.firstID(), b.nextID, s.q.forceAppendLocked)
		s.q.endReplay()
		if b.owner != nil && b.ring.Len() > 0 {
			// It may hold any of the ring's history now.
			b.owner.heldLocked(b.ring.start())
		}
	}
	b.mu.Unlock()
	if remote {
		b.replayRemote(ctx, s, opts, upto)
	}
	return s, nil
}

// cancel ends s without drain and unregisters it. fromCtx is set when the
// context's AfterFunc calls it, which needs no stopping.
func (s *Subscription) cancel(err error, fromCtx bool) int {
	b := s.bus
	b.mu.Lock()
	s.cancelled = true
	if b.removeLocked(s) {
		if b.owner != nil {
			b.owner.releasedLocked()
		}
	} else {
		b.undetachLocked(s)
	}
	b.mu.Unlock()
	s.end(err)
	dropped := s.q.close(false)
	if !fromCtx {
		s.release()
	}
	if err != errWriteBlocked {
		b.stats.dropCancel.Add(uint64(dropped))
	}
	return dropped
}

// end records why s ended; the first reason wins.
func (s *Subscription) end(err error) { s.endErr.CompareAndSwap(nil, &err) }

// release stops watching the context, once.
func (s *Subscription) release() {
	if s.stop != nil && s.released.CompareAndSwap(false, true) {
		s.stop()
	}
}

// Close cancels the subscription: buffered frames are dropped, the consumer
// sees the end, and the bus forgets it. Close is idempotent, does not block
// and may be called from any goroutine.
func (s *Subscription) Close() { s.cancel(context.Canceled, false) }

// Err returns why the subscription ended: an error wrapping ErrEvicted after
// an eviction, the context's error (or context.Canceled after Close) after a
// cancellation, one wrapping ErrClosed after CloseForShutdown (which
// Hub.Shutdown and Hub.Close use) or backplane.CloseWithError, and nil
// while it is open or when the bus was closed by Close.
func (s *Subscription) Err() error {
	if p := s.endErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Ready returns a channel that receives a value when frames may be ready or
// the subscription has ended. Call AppendReady until it returns no frames
// before waiting on Ready again: the channel is signalled when the queue
// goes from empty to non-empty, not for every frame. The channel is never
// closed. For a member of a ReadyGroup it is the group's channel.
func (s *Subscription) Ready() <-chan struct{} { return s.q.ready }

// AppendReady appends every frame that is ready, without waiting, to dst and
// returns the extended slice. open is false once the subscription has ended
// and every frame it will deliver has been returned; dst then holds its last
// frames (possibly a terminal one). The frames returned are the caller's
// from then on: they count no longer toward the subscription's caps, so a
// consumer that holds on to many of them holds them outside its caps (a
// Hub counts them as held until the next call). One consumer at a time.
//
// AppendReady never blocks. When nothing is ready and its last call that
// found frames found several (its publisher outpaces its wake-ups), it
// yields the processor once (runtime.Gosched) and looks again before it
// returns no frames, so that it takes frames in batches instead of being
// woken for every one; a consumer that finds one frame at a time returns
// at once, to wait for the next. Under OverflowCatchUp a subscriber that is
// behind gets, once its queue is drained, the next events from the ring, up
// to its caps per call.
func (s *Subscription) AppendReady(dst []Frame) (frames []Frame, open bool) {
	s.q.releaseTaken() // the caller is done with what it took before
	frames, open = s.take(dst, true, math.MaxInt, nil)
	s.bus.stats.delivered.Add(uint64(len(frames) - len(dst)))
	return frames, open
}

// TakeReady is AppendReady for a transport, which writes the frames it
// takes to a connection and reports each batch's fate itself: it appends
// the frames that are ready to dst, without waiting, up to 256 KiB of
// envelopes (the frame that reaches the bound included, so at least one),
// and returns the extended slice and open as AppendReady does, but it
// counts nothing. The
// caller reports every frame it took exactly once: MarkWritten once the
// frames are written and flushed (Stats.FramesDelivered), MarkDiscarded for
// frames it decided not to write (Stats.Dropped.Cancelled), or
// CloseBlocked when the write failed or blocked (Stats.Dropped.Blocked).
// The Handler is written this way (docs/SPEC.md section 6.6).
//
// TakeReady never blocks, and unlike AppendReady it does not yield the
// processor when nothing is ready: a transport that writes and flushes
// between takes gives publishers time to queue more anyway. Only the
// subscription's one consumer may call it. dst is the caller's, before and
// after: TakeReady only appends to it, and keeps no reference to it; reuse
// it (dst[:0]) to take batches without allocating. The frames taken count
// no longer toward the subscription's caps, as with AppendReady, but the
// bus's Hub counts them as held until they are reported (see
// SubscribeOptions.Interrupt). Under
// OverflowCatchUp a subscriber that is behind gets the next events from
// the ring once its queue is drained, as with AppendReady.
func (s *Subscription) TakeReady(dst []Frame) (frames []Frame, open bool) {
	return s.take(dst, false, takeReadyBytes, nil)
}

// takeReadyBytes bounds a TakeReady: it stops after the frame that brings
// the envelopes it took to this many bytes. A transport holds what it took
// outside the caps until it has written it, so a bounded take bounds what
// a stream blocked in a write holds; what it did not take stays queued,
// under the caps.
const takeReadyBytes = 256 << 10

// MarkWritten reports n frames taken with TakeReady as delivered: written
// and flushed to the client (Stats.FramesDelivered). It never blocks and
// is safe for concurrent use.
func (s *Subscription) MarkWritten(n int) {
	s.q.releaseTaken()
	s.bus.stats.delivered.Add(uint64(n))
}

// MarkDiscarded reports n frames taken with TakeReady that the transport
// chose not to write, such as what was queued for a stream whose access was
// revoked: they count as dropped (Stats.Dropped.Cancelled). It never
// blocks and is safe for concurrent use.
func (s *Subscription) MarkDiscarded(n int) {
	s.q.releaseTaken()
	s.bus.stats.dropCancel.Add(uint64(n))
}

// take is TakeReady and AppendReady (with yield), and with sizes set the
// Events iterator's take, whose frames stay counted toward the caps until
// yielded (see boundedAsyncQueue.take).
func (s *Subscription) take(dst []Frame, yield bool, maxBytes int, sizes *[]int) (frames []Frame, open bool) {
	if s.lagging.Load() {
		if frames, open = s.takeBehind(dst, maxBytes, sizes); !open {
			s.bus.drained(s)
		}
		return frames, open
	}
	if !yield || !s.batching {
		// A consumer whose takes find one frame at a time keeps up with
		// its publisher: it declares itself waiting as soon as a take
		// finds nothing, and the next push hands it the processor, as a
		// channel send hands it to a waiting receiver. Yielding first (as
		// below) would send it through the global run queue after every
		// frame, where the other processor may take a batch of such
		// consumers and run them late: with 64 consumers of 10,000
		// events/s and a publisher that yields while it waits, 5-20% of
		// deliveries took over a millisecond (issue 26).
		frames, open = s.q.take(dst, true, maxBytes, sizes)
	} else if frames, open = s.q.take(dst, false, maxBytes, sizes); len(frames) == len(dst) && open {
		// Nothing ready, for a consumer whose last take found several
		// frames: its publisher is faster than its wake-ups. Declaring it
		// waiting now would make the next push wake it, once per frame: a
		// park and a wake-up cost more than the frame. Yield once instead,
		// so the publisher (or the other consumers) can run, and look
		// again; only a second empty look declares it waiting. With
		// nothing else to run, Gosched returns at once. This halved the
		// cost per delivery at 64 and 1000 subscribers (docs/bench/NOTES.md,
		// item 8).
		consumerYield()
		frames, open = s.q.take(dst, true, maxBytes, sizes)
	}
	if n := len(frames) - len(dst); n > 0 {
		s.batching = n > 1
	}
	if open && len(frames) == len(dst) && s.lagging.Load() {
		// It fell behind while this take found its queue empty (a batch
		// it held filled the caps): it declared itself waiting, then looks
		// here; the fan-out that put it behind set lagging, then looked for
		// a waiting consumer to wake. One of the two sees the other. The
		// caps it filled may have been its queue's, filled since that take
		// (frames taken by AppendReady count no more): what was queued
		// before the event that put it behind comes first, then the ring.
		frames, open = s.takeBehind(frames, maxBytes, sizes)
		if !open {
			s.bus.drained(s)
		}
	}
	// Fallen behind meanwhile with frames taken: the next take goes on
	// from the ring.
	if !open {
		s.bus.drained(s)
	}
	if !open && sizes == nil {
		// The last frames are the caller's. The Events iterator's are not
		// until yielded: it releases the context when it stops, so that a
		// cancellation while it yields what a bus Close left still drops
		// the rest (SPEC 2.5).
		s.release()
	}
	return frames, open
}

// holdRead records the events of frames, which the consumer read from the
// ring while catching up, as held until it reports them done (see
// boundedAsyncQueue.taken).
func (s *Subscription) holdRead(frames []Frame) {
	if !s.q.trackTaken {
		return
	}
	var first, last *frame
	for _, f := range frames {
		if f.frame != nil && f.pin != 0 {
			if first == nil {
				first = f.frame
			}
			last = f.frame
		}
	}
	if first != nil {
		s.q.holdTaken(first, last)
	}
}

// Events returns an iterator over the subscription's frames, in order,
// including synthetic ones. It blocks waiting for frames and stops when the
// subscription ends (cancellation, eviction after its terminal frame, or
// bus Close after the queued frames). Breaking out of the loop closes the
// subscription. The iterator is single-use: ranging over it again yields
// nothing.
//
// The iterator takes frames in batches, but a frame counts toward the
// subscription's caps until it has been yielded, so a slow loop body never
// holds more than MaxQueued frames and MaxQueuedBytes bytes unconsumed.
// After a cancellation or Close (from any goroutine, the loop body
// included) it yields nothing more; the frames it had taken and not
// yielded are counted as Dropped.Cancelled. This holds while it yields what
// a bus Close left too: the subscription's context stays watched until the
// iterator stops, so a cancellation then drops the rest (docs/SPEC.md
// section 2.5).
func (s *Subscription) Events() iter.Seq[Frame] {
	return func(yield func(Frame) bool) {
		if s.iterated.Swap(true) {
			return
		}
		var it iterBatch
		defer func() {
			s.Close()
			it.drop(s)
		}()
		for {
			open := it.fill(s)
			for {
				f, ok := it.next(&s.q)
				if !ok {
					break
				}
				if !yield(f) {
					return
				}
			}
			if it.i < len(it.frames) {
				return // cancelled
			}
			n := it.done(s)
			if !open {
				return
			}
			if n == 0 {
				<-s.q.ready
			}
		}
	}
}

// iterBatch is the Events iterator's batch: the frames it took, and how
// far it has yielded them. The ones not yet yielded still count toward the
// caps (boundedAsyncQueue.unyielded, of which unyielded is the consumer's
// copy).
type iterBatch struct {
	frames    []Frame
	sizes     []int // per frame: its size if it counts toward the caps, else -1
	i         int   // frames yielded
	unyielded uint64
}

// fill takes the next batch, as AppendReady would (ring frames included
// when the subscriber is behind). open is false when the subscription has
// ended and the batch holds its last frames.
func (it *iterBatch) fill(s *Subscription) (open bool) {
	it.frames, open = s.take(it.frames[:0], true, math.MaxInt, &it.sizes)
	it.unyielded = s.q.heldUnyielded()
	return open
}

// next returns the next frame to yield and stops counting it toward the
// caps, or false when the batch is done or the subscription was cancelled.
func (it *iterBatch) next(q *boundedAsyncQueue) (Frame, bool) {
	if it.i == len(it.frames) || q.isDiscarded() {
		return Frame{}, false
	}
	f := it.frames[it.i]
	if n := it.sizes[it.i]; n >= 0 {
		it.unyielded -= unyieldedOf(1, n)
		q.setUnyielded(it.unyielded)
	}
	it.i++
	return f, true
}

// done counts a batch yielded in full as delivered and empties it; it
// returns how many frames it had.
func (it *iterBatch) done(s *Subscription) int {
	n := len(it.frames)
	s.q.releaseTaken()
	s.bus.stats.delivered.Add(uint64(n))
	clear(it.frames) // do not pin delivered frames while waiting
	it.frames, it.sizes, it.i = it.frames[:0], it.sizes[:0], 0
	return n
}

// drop ends the batch when the iterator stops early: the frames yielded
// are delivered (the one the loop broke out on included), the others
// dropped, counted as cancelled, and nothing counts toward the caps any
// more.
func (it *iterBatch) drop(s *Subscription) {
	s.bus.stats.delivered.Add(uint64(it.i))
	s.bus.stats.dropCancel.Add(uint64(len(it.frames) - it.i))
	s.q.setUnyielded(0)
	s.q.releaseTaken()
}

// errWriteBlocked ends a subscription whose transport's write failed or
// blocked (CloseBlocked).
var errWriteBlocked = errors.New("eventbus: stream write failed or blocked")

// CloseBlocked is Close for a transport that could not deliver: its write
// failed or blocked past its deadline, so the connection is unusable. The
// subscription is cancelled without drain and without a terminal frame;
// unwritten, the number of frames taken with TakeReady that did not reach
// the client, and every frame still queued are counted as dropped
// (Stats.Dropped.Blocked, never also as delivered or cancelled); a
// DiagWriteFailed diagnostic names cause (nil: none given). Err then
// returns an error saying the write failed or blocked, unless the
// subscription had ended before. A client that simply went away is a
// plain Close instead. Call it once, in place of Close; a Close after it
// is harmless. CloseBlocked does not block (it logs, through
// Options.Logger unless OnDiagnostic suppresses it) and is safe to call
// from any goroutine.
func (s *Subscription) CloseBlocked(unwritten int, cause error) {
	if cause == nil {
		cause = errWriteBlocked
	}
	dropped := s.cancel(errWriteBlocked, false)
	b := s.bus
	b.stats.dropBlock.Add(uint64(unwritten + dropped))
	b.emit(Diagnostic{DiagWriteFailed, "eventbus: stream write failed, subscriber dropped", []slog.Attr{
		slog.String("error", cause.Error()), slog.Int("dropped", unwritten+dropped)}})
}
