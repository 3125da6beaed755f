package eventbus

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"math"
	"runtime"
	"sync/atomic"
	"time"
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
	// CatchUpStallTimeout overrides the bus's Options.CatchUpStallTimeout
	// for this subscription; 0 keeps the bus's, below a millisecond is an
	// error wrapping ErrInvalidOption.
	CatchUpStallTimeout time.Duration
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
	if opts.OverflowPolicy > OverflowCatchUp {
		return nil, fmt.Errorf("%w: unknown OverflowPolicy %d", ErrInvalidOption, opts.OverflowPolicy)
	}
	if opts.CatchUpStallTimeout != 0 && opts.CatchUpStallTimeout < time.Millisecond {
		return nil, fmt.Errorf("%w: CatchUpStallTimeout is %s, must be at least 1ms", ErrInvalidOption, opts.CatchUpStallTimeout)
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
	stall := opts.CatchUpStallTimeout
	if stall == 0 {
		stall = b.opts.CatchUpStallTimeout
	}
	s.stallMillis = stall.Milliseconds()
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

	if b.SubscriberCount() >= b.opts.MaxSubscribers {
		// On a quiet bus no publish comes to evict a stalled subscriber
		// catching up: the slot it holds is freed here.
		b.sweepStalled()
	}
	var now int64
	if b.opts.MaxAge > 0 {
		now = b.now() // read outside the lock
	}
	b.mu.Lock()
	if now != 0 && b.ring.dropOlder(now-b.opts.MaxAge.Milliseconds()) > 0 {
		b.storeRingStatsLocked()
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
	case first > n+1 || first == 0 && n+1 < nextID:
		// The ring lost events after the cursor: to its bounds, to a
		// Hub's budget, to age (it may then hold nothing at all).
		push(resyncFrame(ReasonRingEvicted, "", n, earliest, b.epoch, now).ref())
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

// enterCatchUpLocked puts s behind after its queue rejected f under
// OverflowCatchUp: f and everything after it stay in the ring for its
// consumer to read. A rejected signal, which is in no ring, is dropped and
// counted; s then needs the next id.
func (s *Subscription) enterCatchUpLocked(f *frame, lastID uint64, now int64) {
	b := s.bus
	cursor := f.id
	if f.kind != kindEvent {
		cursor = lastID + 1
		b.stats.dropCatchUpSignal.Add(1)
	}
	s.cursor.Store(cursor)
	s.progress.Store(now)
	s.behind = true
	s.lagging.Store(true)
	b.stats.catchUps.Add(1)
	b.stats.behind.Add(1)
}

// leaveCatchUpLocked ends s's catch-up: it caught up.
func (s *Subscription) leaveCatchUpLocked() {
	if s.behind {
		s.behind = false
		s.lagging.Store(false)
		s.bus.stats.behind.Add(-1)
	}
}

// dropCatchUpLocked ends s's catch-up because s is being unregistered, and
// returns its cursor (0 if it was not behind). The cursor is swapped for 0,
// which no claim matches: a consumer reading the ring without the lock
// stops before its next frame, so the cursor returned is exactly where it
// stopped (see catchUpFast).
func (s *Subscription) dropCatchUpLocked() uint64 {
	if !s.behind {
		return 0
	}
	s.leaveCatchUpLocked()
	return s.cursor.Swap(0)
}

// rejoinLocked is the publisher's half of the hand-over: s is behind, f is
// the event just published, and when s's consumer has read everything
// before f (its cursor is f's id), the publisher claims f for the live
// fan-out and s rejoins it. The consumer claims each id with the same
// compare-and-swap (catchUpFast), so exactly one of the two takes f: no
// gap, no duplicate, and no lock for the consumer.
func (s *Subscription) rejoinLocked(f *frame) bool {
	if f.kind != kindEvent || !s.cursor.CompareAndSwap(f.id, f.id+1) {
		return false
	}
	s.leaveCatchUpLocked()
	return true
}

// stalledLocked reports whether s, behind, has something to read and its
// consumer has taken nothing for longer than its bound; lastID is the last
// id published.
func (s *Subscription) stalledLocked(now int64, lastID uint64) bool {
	return s.cursor.Load() <= lastID && now-s.progress.Load() > s.stallMillis
}

// maxCatchUpScan bounds the ring entries one catch-up step examines (a
// filter may skip most of them), so that a read under the bus lock is
// short and a batch comes back soon.
const maxCatchUpScan = 512

// catchUp appends to dst the events the subscriber needs from the ring,
// once its consumer has drained its queue: the frames its filter passes,
// from its cursor, while its caps admit them as they would admit live
// pushes, counting the frames the consumer has taken and not yet yielded
// (unyielded) and those taken for this batch already (taken). As for the
// queue, the first frame is admitted whatever its size when nothing is
// held. With sizes set (the Events iterator), the frames count toward the
// caps until yielded (see boundedAsyncQueue.take).
//
// It reads without the bus lock (catchUpFast) while the ring holds what it
// needs, and takes the lock only when the ring dropped its cursor: then a
// ring_evicted resync goes first and it goes on from the ring's oldest
// event (catchUpStep). Having read up to the newest event it stays behind
// until the next publish, which hands it over to the live fan-out
// (rejoinLocked).
func (s *Subscription) catchUp(dst []Frame, sizes *[]int, taken queueCounts) []Frame {
	for {
		var ok bool
		if dst, taken, ok = s.catchUpFast(dst, sizes, taken); ok {
			return dst
		}
		var more bool
		if dst, more = s.catchUpStep(dst, sizes, taken); !more {
			return dst
		}
	}
}

// catchUpFast is catchUp without the bus lock. It reads the frames from
// its cursor up to the bus's last id, then moves the cursor past them
// with one compare-and-swap. The only other claims on a cursor are the
// publisher's (rejoinLocked), which needs the cursor at the id it is
// publishing, so it can meet a pass only over that one id, and then one
// of the two swaps wins; and dropCatchUpLocked's, unregistering s. A pass
// whose swap fails delivers nothing. A consumer that finds nothing to read
// waits: it declared itself waiting before it loaded the last id, and the
// bus stores the last id before its fan-out checks for waiting consumers
// behind, so either it sees the new id or the fan-out wakes it. It returns
// taken with what it added (when sizes is nil, for the batch's caps), and
// ok false when the ring no longer holds the cursor: the locked step takes
// it from there.
func (s *Subscription) catchUpFast(dst []Frame, sizes *[]int, taken queueCounts) (out []Frame, counts queueCounts, ok bool) {
	b, q := s.bus, &s.q
	if !s.lagging.Load() || q.held.Load() {
		// Rejoined, or a backplane resume holds the queue until its
		// history is in front: the ring must not go ahead of it.
		return dst, taken, true
	}
	last := b.lastID.Load() // first: the ring holds every frame up to it
	from := s.cursor.Load()
	s.progress.Store(b.now())
	if from == 0 || from > last {
		return dst, taken, true // unregistered, or read up to the newest: the next publish hands it over
	}
	// Behind, s gets no live push but signals (and forced frames), which
	// take q.mu, and the one event of a hand-over, which ends this pass:
	// under q.mu, what is queued is counted exactly from the entries
	// themselves. What this read may take is counted (reserved) before
	// q.mu is let go: a signal pushed to s meanwhile then sees the caps as
	// they will be once the batch is in, never below.
	q.mu.Lock()
	c := q.queuedLiveLocked()
	u := q.unyielded.Load()
	c.liveCount += taken.liveCount + int(u>>unyieldedShift)
	c.liveBytes += taken.liveBytes + int(u&unyieldedBytesMask)
	var reserved uint64
	if sizes != nil && c.liveCount < c.maxQueued {
		reserved = unyieldedOf(c.maxQueued-c.liveCount, max(c.maxBytes-c.liveBytes, 0))
		q.unyielded.Store(q.unyielded.Load() + reserved)
	}
	q.mu.Unlock()
	start, sizesStart := len(dst), 0
	if sizes != nil {
		sizesStart = len(*sizes)
	}
	held := queueCounts{}
	x, dropped := from, false
	for ; x <= last; x++ {
		f := b.ring.load(x)
		if f == nil {
			dropped = true // the ring dropped it: the locked step resyncs
			break
		}
		if !s.filter.match(f.typ) {
			continue
		}
		size := f.size()
		if q.admit(c, size) != pushAccepted || sizes != nil && held.liveBytes >= maxBatchBytes {
			break
		}
		dst = append(dst, Frame{f})
		if sizes != nil {
			*sizes = append(*sizes, size)
		}
		held.liveCount++
		held.liveBytes += size
		c.liveCount++
		c.liveBytes += size
	}
	ok = !dropped
	if x != from && !s.cursor.CompareAndSwap(from, x) {
		// Unregistered meanwhile (evicted, cancelled, the bus closed),
		// announced from the cursor it had: none of this pass goes out.
		clear(dst[start:])
		dst = dst[:start]
		if sizes != nil {
			*sizes = (*sizes)[:sizesStart]
		}
		held, ok = queueCounts{}, true
	}
	if sizes != nil {
		q.unyielded.Store(q.unyielded.Load() - reserved + unyieldedOf(held.liveCount, held.liveBytes))
	} else {
		taken.liveCount += held.liveCount
		taken.liveBytes += held.liveBytes
	}
	b.stats.catchUpServed.Add(uint64(held.liveCount))
	return dst, taken, ok
}

// catchUpStep is catchUp under the bus lock, for a cursor the ring
// dropped: the resync, then what follows; reaching the newest event it
// rejoins the live fan-out in the same lock hold. more reports that it
// examined maxCatchUpScan entries, all filtered out, and should go on.
func (s *Subscription) catchUpStep(dst []Frame, sizes *[]int, taken queueCounts) (out []Frame, more bool) {
	b := s.bus
	q := &s.q
	now := b.now() // the clock is read outside the lock
	b.mu.Lock()
	defer b.mu.Unlock()
	if !s.behind || q.held.Load() {
		return dst, false
	}
	s.progress.Store(now)
	c := q.liveCounts()
	c.liveCount += taken.liveCount
	c.liveBytes += taken.liveBytes
	first := b.ring.firstID()
	if first == 0 {
		first = b.nextID // empty
	}
	cursor := s.cursor.Load()
	// The ring dropped the cursor: the resync goes right before the first
	// frame read after it, so that the next event the client gets is the
	// one it announces. With its caps full it waits, cursor unmoved: by
	// the next read the ring may have moved on again, and one resync, with
	// the ids of then, is what the client must see.
	missedFrom := uint64(0) // the cursor of a resync not appended yet
	if cursor < first {
		missedFrom, cursor = cursor, first
	}
	resync := func() {
		dst = append(dst, resyncFrame(ReasonRingEvicted, "", missedFrom-1, first, b.epoch, now))
		if sizes != nil {
			*sizes = append(*sizes, -1)
		}
		b.stats.resync(ReasonRingEvicted)
		missedFrom = 0
	}
	var served uint64
	heldLive, heldBytes := 0, 0
	full, skipped := false, false
	for n := 0; n < maxCatchUpScan && cursor < b.nextID; n++ {
		f := b.ring.at(int(cursor - first))
		if !s.filter.match(f.typ) {
			cursor++
			skipped = true
			continue
		}
		size := f.size()
		if q.admit(c, size) != pushAccepted || sizes != nil && heldBytes >= maxBatchBytes {
			full = true
			break
		}
		if missedFrom != 0 {
			resync()
		}
		dst = append(dst, Frame{f})
		if sizes != nil {
			*sizes = append(*sizes, size)
			heldLive++
			heldBytes += size
		}
		c.liveCount++
		c.liveBytes += size
		served++
		cursor++
	}
	if missedFrom != 0 {
		if skipped || cursor >= b.nextID {
			resync() // the cursor moved on: the gap is announced now
		} else {
			cursor = missedFrom
		}
	}
	s.cursor.Store(cursor)
	if heldLive > 0 {
		// Before the lock is released: the next push must see them.
		q.unyielded.Store(q.unyielded.Load() + unyieldedOf(heldLive, heldBytes))
	}
	b.stats.catchUpServed.Add(served)
	if cursor >= b.nextID {
		s.leaveCatchUpLocked()
		return dst, false
	}
	return dst, !full && served == 0
}

// sweepStalled evicts every subscriber catching up whose consumer has
// taken nothing for its stall bound (Subscribe calls it at the subscriber
// limit).
func (b *EventBus) sweepStalled() {
	now := b.now()
	var out []eviction
	b.mu.Lock()
	for i, s := range b.subs {
		if s.behind && s.stalledLocked(now, b.nextID-1) {
			out = append(out, eviction{s: s, reason: ReasonCatchUpStalled, id: s.dropCatchUpLocked(), counts: s.q.liveCounts(), bytes: -1})
			b.subs[i] = nil
		}
	}
	if out != nil {
		b.compactSubsLocked()
	}
	b.mu.Unlock()
	for _, ev := range out {
		b.emit(ev.s.evict(ev))
	}
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
// frames (possibly a terminal one). The frames returned are the caller's
// from then on: they count no longer toward the subscription's caps, so a
// consumer that holds on to many of them holds them outside its caps. One
// consumer at a time.
//
// AppendReady never blocks. When nothing is ready it yields the processor
// once (runtime.Gosched) and looks again before it returns no frames, so a
// consumer that keeps up with its publisher takes frames in batches instead
// of being woken for every one. Under OverflowCatchUp a subscriber that is
// behind gets, once its queue is drained, the next events from the ring, up
// to its caps per call.
func (s *Subscription) AppendReady(dst []Frame) (frames []Frame, open bool) {
	frames, open = s.take(dst, true, nil)
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
	return s.take(dst, yield, nil)
}

// take is takeReady, and with sizes set the Events iterator's take, whose
// frames stay counted toward the caps until yielded (see
// boundedAsyncQueue.take).
func (s *Subscription) take(dst []Frame, yield bool, sizes *[]int) (frames []Frame, open bool) {
	if s.lagging.Load() {
		return s.takeBehind(dst, sizes)
	}
	if !yield {
		frames, open = s.q.take(dst, true, math.MaxInt, sizes)
	} else if frames, open = s.q.take(dst, false, math.MaxInt, sizes); len(frames) == len(dst) && open {
		// Nothing ready. Declaring the consumer waiting now would make the
		// next push wake it, and a consumer that keeps up would be woken
		// once per frame: a park and a wake-up cost more than the frame.
		// Yield once instead, so the publisher (or the other consumers)
		// can run, and look again; only a second empty look declares it
		// waiting. With nothing else to run, Gosched returns at once.
		// This halved the cost per delivery at 64 and 1000 subscribers
		// (BENCHMARKS.md).
		runtime.Gosched()
		frames, open = s.q.take(dst, true, math.MaxInt, sizes)
	}
	if open && len(frames) == len(dst) && s.lagging.Load() {
		// It fell behind while this take found its queue empty (a batch
		// it held filled the caps): it declared itself waiting, then looks
		// here; the fan-out that put it behind set lagging, then looked for
		// a waiting consumer to wake. One of the two sees the other.
		frames = s.catchUp(frames, sizes, queueCounts{})
	}
	// Fallen behind meanwhile with frames taken: the next take goes on
	// from the ring.
	if !open {
		s.release()
	}
	return frames, open
}

// takeBehind is take for a subscriber that is behind: its queue first
// (what was queued before it fell behind, forced frames, signals), then
// the ring, within its caps for the whole batch.
func (s *Subscription) takeBehind(dst []Frame, sizes *[]int) (frames []Frame, open bool) {
	q := &s.q
	live0, bytes0 := q.poppedLive.Load(), q.poppedBytes.Load()
	// The consumer declares itself waiting when its queue is empty even
	// though the ring fills its batch: a signal pushed meanwhile then
	// wakes it, whatever the ring gave.
	frames, open = q.take(dst, true, math.MaxInt, sizes)
	if open {
		var taken queueCounts
		if sizes == nil {
			// Returned to the caller, they count no more, but this batch
			// stays within the caps.
			taken.liveCount = int(q.poppedLive.Load() - live0)
			taken.liveBytes = int(q.poppedBytes.Load() - bytes0)
		}
		frames = s.catchUp(frames, sizes, taken)
	} else {
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
//
// The iterator takes frames in batches, but a frame counts toward the
// subscription's caps until it has been yielded, so a slow loop body never
// holds more than MaxQueued frames and MaxQueuedBytes bytes unconsumed.
// After a cancellation or Close (from any goroutine, the loop body
// included) it yields nothing more; the frames it had taken and not
// yielded are counted as Dropped.Cancelled.
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
	it.frames, open = s.take(it.frames[:0], true, &it.sizes)
	it.unyielded = s.q.unyielded.Load()
	return open
}

// next returns the next frame to yield and stops counting it toward the
// caps, or false when the batch is done or the subscription was cancelled.
func (it *iterBatch) next(q *boundedAsyncQueue) (Frame, bool) {
	if it.i == len(it.frames) || q.discarded.Load() {
		return Frame{}, false
	}
	f := it.frames[it.i]
	if n := it.sizes[it.i]; n >= 0 {
		it.unyielded -= unyieldedOf(1, n)
		q.unyielded.Store(it.unyielded)
	}
	it.i++
	return f, true
}

// done counts a batch yielded in full as delivered and empties it; it
// returns how many frames it had.
func (it *iterBatch) done(s *Subscription) int {
	n := len(it.frames)
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
	s.q.unyielded.Store(0)
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
