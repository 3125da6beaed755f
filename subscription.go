package eventbus

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"runtime"
	"sync/atomic"
)

// SubscribeOptions configures one subscription. The zero value subscribes
// live only, with the bus's default caps.
type SubscribeOptions struct {
	// Resume reports whether LastEventID is set. Without it the subscription
	// is live only; with it, LastEventID 0 means "from the start".
	Resume bool
	// LastEventID is the id of the last event the client received; the
	// subscription replays what came after it (SPEC 5.1).
	LastEventID uint64
	// Epoch is the bus epoch the client saw. When Resume is set and Epoch
	// differs from the bus's, the client gets an epoch_reset resync. Empty or
	// longer than 64 bytes: ignored.
	Epoch string
	// MaxQueued is the live frame cap; 0 means Options.MaxQueued, negative
	// is an error wrapping ErrInvalidOption.
	MaxQueued int
	// Types restricts the subscription to event types (SPEC 11): up to
	// MaxTypeFilters filters of up to MaxTypeFilterBytes, each an exact type
	// or a trailing wildcard such as "plugin.tool.github.*" (segments of
	// [a-z0-9_]+; it matches "plugin.tool.github.pr_opened" but neither
	// "plugin.tool.github" nor "plugin.tool.gitlab.x"). Empty means every
	// type. Synthetic frames always pass; filtered-out events never count
	// toward the caps. On a filtered stream ids increase but are not
	// contiguous: a client must not treat such gaps as loss.
	Types []string
	// OverflowPolicy overrides the bus's Options.OverflowPolicy for this
	// subscription; 0 keeps the bus's. It is the embedder's choice, never a
	// remote client's.
	OverflowPolicy OverflowPolicy
}

// Subscription is one subscriber's view of a bus: a bounded queue of frames
// that the bus fills and one consumer drains.
//
// Consume it either with Events, a blocking iterator, or with Ready and
// AppendReady, for a writer that must also wait on timers or a request
// context. Only one goroutine may consume at a time; Close and Err are safe
// to call from any goroutine. No goroutine runs per subscription.
// Subscriptions are made by Subscribe; a zero Subscription is not usable.
type Subscription struct {
	bus *EventBus
	q   boundedAsyncQueue

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

	warnFrames, resetFrames, warnBytes, resetBytes float64

	stop     func() bool // stops watching the context; nil if none
	released atomic.Bool
	endErr   atomic.Pointer[error]
	iterated atomic.Bool
}

// Subscribe registers a subscription and, when opts.Resume is set, queues
// the replay of SPEC 5.1 ahead of the live frames. Registration is
// synchronous: an event published after Subscribe returns is delivered.
//
// When ctx is done the subscription is cancelled (its buffer dropped). On a
// closed bus Subscribe returns an ended subscription and no error; with a
// ctx already done, an ended subscription that was never registered. It
// returns an error wrapping ErrInvalidOption for a negative MaxQueued or an
// unknown OverflowPolicy, one wrapping ErrInvalidFilter for an invalid
// Types entry, and a *SubscriberLimitError when the bus is full. Subscribe does not block on
// other subscribers.
//
// On a bus fed by a shared log (NewFed), a resume the ring cannot answer
// is answered from the log: Subscribe reads it (FeedOptions.Log) outside
// the bus lock, and queues it ahead of the live frames that arrived
// meanwhile; a resume from an id the log holds but the bus has not been fed
// yet first waits for the feed, at most FeedOptions.LagTimeout. Both block
// on the log's I/O, bounded by ctx.
func (b *EventBus) Subscribe(ctx context.Context, opts SubscribeOptions) (*Subscription, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if opts.MaxQueued < 0 {
		return nil, fmt.Errorf("%w: MaxQueued is %d, must not be negative", ErrInvalidOption, opts.MaxQueued)
	}
	if opts.OverflowPolicy > OverflowResync {
		return nil, fmt.Errorf("%w: unknown OverflowPolicy %d", ErrInvalidOption, opts.OverflowPolicy)
	}
	filter, err := compileFilters(opts.Types)
	if err != nil {
		return nil, err
	}
	maxQueued := opts.MaxQueued
	if maxQueued == 0 {
		maxQueued = b.opts.MaxQueued
	}
	s := &Subscription{bus: b, filter: filter, policy: opts.OverflowPolicy}
	if s.policy == 0 {
		s.policy = b.opts.OverflowPolicy
	}
	s.q.init(maxQueued, b.opts.MaxQueuedBytes)
	s.warnFrames = WarnThresholdRatio * float64(maxQueued)
	s.resetFrames = WarnResetRatio * float64(maxQueued)
	s.warnBytes = WarnThresholdRatio * float64(b.opts.MaxQueuedBytes)
	s.resetBytes = WarnResetRatio * float64(b.opts.MaxQueuedBytes)

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
	if ctx.Done() != nil {
		// Set before the lock: publishers that evict s read it after
		// acquiring the lock, so they see it.
		s.stop = context.AfterFunc(ctx, func() { s.cancel(ctx.Err(), true) })
	}

	b.awaitFeed(ctx, opts)

	b.mu.Lock()
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
		return nil, &SubscriberLimitError{Limit: b.opts.MaxSubscribers}
	}
	b.addLocked(s)
	remote := opts.Resume && b.feed != nil && b.feed.log != nil && !b.ringCoversLocked(opts)
	upto := b.nextID - 1
	switch {
	case remote:
		// Live frames queue up behind the hold while history is read;
		// the replay goes in front of them.
		s.q.hold()
	case opts.Resume:
		// One queue lock for the whole replay: thousands of frames cost
		// one buffer allocation and no per-frame locking.
		s.q.mu.Lock()
		s.q.reserveLocked(b.ring.Len() + 3)
		b.replay(s, opts, &b.ring, b.ring.firstID(), b.nextID, s.q.forceAppendLocked)
		s.q.publishLocked()
		s.q.signalLocked()
		s.q.mu.Unlock()
	}
	b.mu.Unlock()
	if remote {
		b.replayRemote(ctx, s, opts, upto)
	}
	return s, nil
}

// replaySource is a contiguous run of published frames: the ring, or
// entries a backplane read from its log.
type replaySource interface {
	Len() int
	at(i int) *frame
}

type frameSlice []Frame

// Len is the number of frames held.
func (f frameSlice) Len() int        { return len(f) }
func (f frameSlice) at(i int) *frame { return f[i].frame }

// ringCoversLocked reports whether the ring alone can answer a resume:
// same epoch, a cursor in this epoch, and nothing after it evicted.
func (b *EventBus) ringCoversLocked(opts SubscribeOptions) bool {
	n := opts.LastEventID
	if epochMismatch(opts, b.epoch) || n >= b.nextID {
		return false
	}
	return n == b.nextID-1 || b.ring.Len() > 0 && b.ring.firstID() <= n+1
}

func epochMismatch(opts SubscribeOptions, epoch string) bool {
	return opts.Epoch != "" && len(opts.Epoch) <= 64 && opts.Epoch != epoch
}

// replay produces SPEC 5.1's replay for s through push: resync frames, the
// events of src after the cursor that pass its filter, within the replay
// budget, and replay_complete. first is the oldest id the log holds (0 when
// none) and nextID the id the next event will get; the resync rules go by
// ids, whatever the filter. Every frame is forced: replay never counts
// toward the live caps. For the ring it runs under the bus lock, so no live
// event slips between the replay and the live stream.
func (b *EventBus) replay(s *Subscription, opts SubscribeOptions, src replaySource, first, nextID uint64, push func(*frame)) {
	n := opts.LastEventID
	now := b.now()
	earliest := first
	if first == 0 {
		earliest = nextID
	}
	mismatch := epochMismatch(opts, b.epoch)

	start := 0 // position in src of the first frame to replay
	switch {
	case mismatch || n >= nextID:
		detail := ""
		if mismatch {
			detail = "epoch_mismatch"
		}
		push(resyncFrame(ReasonEpochReset, detail, n, earliest, b.epoch, now).ref())
		b.stats.resync(ReasonEpochReset)
	case first > n+1:
		push(resyncFrame(ReasonRingEvicted, "", n, first, b.epoch, now).ref())
		b.stats.resync(ReasonRingEvicted)
	default:
		start = src.Len()
		if src.Len() > 0 {
			if i := n + 1 - src.at(0).id; n+1 >= src.at(0).id && i < uint64(src.Len()) {
				start = int(i)
			}
		}
	}

	budget := b.opts.ReplayBudgetBytes
	replayed, spent := 0, 0
	var last uint64
	for i := start; i < src.Len(); i++ {
		f := src.at(i)
		if !s.filter.match(f.typ) {
			continue
		}
		if replayed > 0 && spent+f.size() > budget {
			push(resyncFrame(ReasonReplayBudgetExceeded, "", last, f.id, b.epoch, now).ref())
			b.stats.resync(ReasonReplayBudgetExceeded)
			for ; i < src.Len(); i++ {
				if s.filter.match(src.at(i).typ) {
					b.stats.dropBudget.Add(1)
				}
			}
			break
		}
		push(f)
		spent += f.size()
		replayed++
		last = f.id
	}
	push(replayCompleteFrame(replayed, last, b.epoch, now).ref())
}

// checkWarningLocked runs SPEC 6's warning check after an accepted live
// push with the counts c after it. It builds and force-pushes the warning
// under the lock, so the warning sits right after its triggering event even
// with concurrent publishers; the diagnostic is returned for later.
func (s *Subscription) checkWarningLocked(c queueCounts, id uint64) (Diagnostic, bool) {
	lc, lb := float64(c.liveCount), float64(c.liveBytes)
	if s.warned && lc <= s.resetFrames && lb <= s.resetBytes {
		s.warned = false
	}
	if s.warned {
		return Diagnostic{}, false
	}
	frames, bytes := s.pastWarning(c)
	var threshold string
	switch {
	case frames && bytes:
		threshold = "frames_and_bytes"
	case frames:
		threshold = "frames"
	case bytes:
		threshold = "bytes"
	default:
		return Diagnostic{}, false
	}
	s.warned = true
	s.q.forcePushMarker(warningFrame(c, id, threshold, s.bus.now()).ref())
	s.bus.stats.warnings.Add(1)
	return Diagnostic{DiagSlowClient, "eventbus: slow client", []slog.Attr{
		slog.String("threshold", threshold), slog.Uint64("lastEventId", id),
		slog.Int("queueSize", c.liveCount), slog.Int("maxQueued", c.maxQueued),
		slog.Int("queuedBytes", c.liveBytes), slog.Int("maxQueuedBytes", c.maxBytes),
	}}, true
}

// overflowResyncLocked applies OverflowResync after f was rejected: unless
// this is the third overflow within OverflowWindow (then it reports false
// and the caller evicts), the queued live frames are dropped, a
// state_resync_required frame is queued, then f. The subscriber stays.
func (s *Subscription) overflowResyncLocked(f *frame, res pushResult, lastID uint64) (Diagnostic, bool) {
	b := s.bus
	now := b.now()
	if s.noverflows == 2 && now-s.overflows[0] < OverflowWindow.Milliseconds() {
		return Diagnostic{}, false
	}
	s.overflows[0], s.overflows[1] = s.overflows[1], now
	s.noverflows = min(s.noverflows+1, 2)
	reason := res.reason()
	// The client missed everything after the last event it dequeued; what
	// it can get again starts at the rejected event (for a signal, which has
	// no id, at the next id).
	earliest := f.id
	if f.kind != kindEvent {
		earliest = lastID + 1
	}
	dropped, lastDelivered := s.q.resync(f, func(lastDelivered uint64) *frame {
		return resyncFrame(reason, "", lastDelivered, earliest, b.epoch, now).ref()
	})
	b.stats.dropOverflow.Add(uint64(dropped))
	b.stats.resync(reason)
	// Everything live is gone: the episode is over, warn again next time.
	s.warned = false
	return Diagnostic{DiagOverflowResync, "eventbus: slow client resynced", []slog.Attr{
		slog.String("reason", reason), slog.Uint64("lastDeliveredId", lastDelivered),
		slog.Uint64("earliestAvailableId", earliest), slog.Int("dropped", dropped),
	}}, true
}

// pastWarning reports whether the live counts c reach the warning
// threshold of the frame cap and of the byte cap.
func (s *Subscription) pastWarning(c queueCounts) (frames, bytes bool) {
	return float64(c.liveCount) >= s.warnFrames, float64(c.liveBytes) >= s.warnBytes
}

// anyPastWarning reports whether the live counts c reach the warning
// threshold of either cap.
func (s *Subscription) anyPastWarning(c queueCounts) bool {
	frames, bytes := s.pastWarning(c)
	return frames || bytes
}

// yieldFor reports whether a publish that left s with the live counts c
// should yield the processor (see EventBus.finish): s is past the warning
// threshold of either cap, and either its consumer has looked for frames
// at least once, or this is the first yield for it. The yield is for
// consumers that run but were not scheduled in time, a goroutine started
// for a new subscription included: one yield lets it run. A subscription
// that nobody reads from at all (never iterated, or stuck before its first
// read) gets no more than that one: yielding for it on every publish until
// its eviction would make its peers' publish latency depend on it
// (BenchmarkPublishLatency).
func (s *Subscription) yieldFor(c queueCounts) bool {
	frames, bytes := s.pastWarning(c)
	if !frames && !bytes {
		return false
	}
	if !s.q.looked.Load() {
		if s.yieldedUnread {
			return false
		}
		s.yieldedUnread = true
	}
	return true
}

// evict ends s after a publish unregistered it under the lock: the
// terminal frame goes behind what is queued, and the queue closes with
// drain.
func (s *Subscription) evict(ev eviction) Diagnostic {
	b := s.bus
	s.end(fmt.Errorf("%w: %s", ErrEvicted, ev.reason))
	s.q.forcePush(evictedFrame(ev.reason, ev.id, ev.counts, ev.bytes, b.now()).ref())
	s.q.close(true)
	s.release()
	b.stats.eviction(ev.reason)
	return Diagnostic{DiagEvicted, "eventbus: subscriber evicted", []slog.Attr{
		slog.String("reason", ev.reason), slog.Uint64("droppedAfter", ev.id),
		slog.Int("queueSize", ev.counts.liveCount), slog.Int("maxQueued", ev.counts.maxQueued),
		slog.Int("queuedBytes", ev.counts.liveBytes), slog.Int("maxQueuedBytes", ev.counts.maxBytes),
	}}
}

// cancel ends s without drain and unregisters it. fromCtx is set when the
// context's AfterFunc calls it, which needs no stopping.
func (s *Subscription) cancel(err error, fromCtx bool) int {
	b := s.bus
	b.mu.Lock()
	s.cancelled = true
	b.removeLocked(s)
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
// cancellation, one wrapping ErrClosed after EventBus.CloseWithError, and
// nil while it is open or when the bus was closed by Close.
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
// closed.
func (s *Subscription) Ready() <-chan struct{} { return s.q.ready }

// AppendReady appends every frame that is ready, without waiting, to dst and
// returns the extended slice. open is false once the subscription has ended
// and every frame it will deliver has been returned; dst then holds its last
// frames (possibly a terminal one). Frames taken count no longer toward the
// caps. One consumer at a time.
//
// AppendReady never blocks. When nothing is ready it yields the processor
// once (runtime.Gosched) and looks again before it returns no frames, so a
// consumer that keeps up with its publisher takes frames in batches instead
// of being woken for every one.
func (s *Subscription) AppendReady(dst []Frame) (frames []Frame, open bool) {
	frames, open = s.takeReady(dst, true)
	s.bus.stats.delivered.Add(uint64(len(frames) - len(dst)))
	return frames, open
}

// takeReady is AppendReady without counting the frames as delivered: the
// HTTP handler counts them only once they are written and flushed, so the
// frames of a failed batch are counted once, as dropped (blocked).
//
// With yield set, a look that finds nothing yields the processor once and
// looks again before declaring the consumer waiting (see AppendReady).
func (s *Subscription) takeReady(dst []Frame, yield bool) (frames []Frame, open bool) {
	if !yield {
		frames, open = s.q.popAll(dst)
	} else if frames, open = s.q.tryPopAll(dst); len(frames) == len(dst) && open {
		// Nothing ready. Declaring the consumer waiting now would make the
		// next push wake it, and a consumer that keeps up would be woken
		// once per frame: a park and a wake-up cost more than the frame.
		// Yield once instead, so the publisher (or the other consumers)
		// can run, and look again; only a second empty look declares it
		// waiting. With nothing else to run, Gosched returns at once.
		// This halved the cost per delivery at 64 and 1000 subscribers
		// (BENCHMARKS.md).
		runtime.Gosched()
		frames, open = s.q.popAll(dst)
	}
	if !open {
		s.release()
	}
	return frames, open
}

// Events returns an iterator over the subscription's frames, in order,
// including synthetic ones. It blocks waiting for frames and stops when the
// subscription ends (cancellation, eviction after its terminal frame, or
// bus Close after the queued frames). Breaking out of the loop closes the
// subscription. The iterator is single-use: ranging over it again yields
// nothing.
func (s *Subscription) Events() iter.Seq[Frame] {
	return func(yield func(Frame) bool) {
		if s.iterated.Swap(true) {
			return
		}
		defer s.Close()
		var batch []Frame
		for {
			var open bool
			batch, open = s.takeReady(batch[:0], true)
			for i, f := range batch {
				if !yield(f) {
					// Only what the loop received is delivered; the rest
					// of the batch was still buffered, from the loop's
					// view, when it broke out: dropped, reason cancelled.
					s.bus.stats.delivered.Add(uint64(i + 1))
					s.bus.stats.dropCancel.Add(uint64(len(batch) - i - 1))
					return
				}
			}
			s.bus.stats.delivered.Add(uint64(len(batch)))
			clear(batch) // do not pin delivered frames while waiting
			if !open {
				return
			}
			if len(batch) == 0 {
				<-s.q.ready
			}
		}
	}
}

// errWriteBlocked ends a subscription whose HTTP write failed or blocked.
var errWriteBlocked = errors.New("eventbus: stream write failed or blocked")

// cancelBlocked cancels s because its writer could not deliver: no drain,
// no terminal frame. lost is the number of frames of the failed batch; they
// and the buffered ones are counted as dropped, reason blocked.
func (s *Subscription) cancelBlocked(lost int, cause error) {
	dropped := s.cancel(errWriteBlocked, false)
	b := s.bus
	b.stats.dropBlock.Add(uint64(lost + dropped))
	b.emit(Diagnostic{DiagWriteFailed, "eventbus: stream write failed, subscriber dropped", []slog.Attr{
		slog.String("error", cause.Error()), slog.Int("dropped", lost+dropped)}})
}
