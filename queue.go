package eventbus

import (
	"slices"
	"sync"
	"sync/atomic"
)

// pushResult is the outcome of boundedAsyncQueue.push.
type pushResult uint8

const (
	pushAccepted       pushResult = iota
	pushIgnored                   // the queue is closed: never an eviction
	pushRejectedFrames            // liveCount >= maxQueued: queue_overflow
	pushRejectedBytes             // liveBytes + size > maxQueuedBytes: queue_bytes_overflow
	pushCoalesced                 // a signal replaced a queued one with the same (type, about)
)

// reason returns the wire reason of a rejection.
func (r pushResult) reason() string {
	if r == pushRejectedBytes {
		return ReasonQueueBytesOverflow
	}
	return ReasonQueueOverflow
}

// entryFlags tag a buffered frame, live (0) or forced. Forced entries
// (replay and synthetic frames) count 0 toward both caps. A marker is a
// forced entry about the queue's own overflow (slow_client_warning, an
// overflow resync): a later overflow resync supersedes it.
//
// The queue keeps the frame pointers in buf and their tags in flags, at the
// same index. One published frame is shared by the ring and every queue,
// and a live push, the hot path, writes only its 8-byte pointer: the tags
// of a free slot are always 0, so there is nothing else to write
// (docs/bench/NOTES.md, item 18). Frames are immutable once made.
type entryFlags uint8

const (
	entryForced entryFlags = 1 << iota
	entryMarker
)

// boundedAsyncQueue is the per-subscriber queue of SPEC section 3.1 (the
// TypeScript daemon's BoundedAsyncQueue, SPEC's preamble): a ring of frames
// that caps live frames and their bytes, the sum of their JSON envelopes
// (Frame.Size: the TypeScript daemon's
// Buffer.byteLength(JSON.stringify(event)), SPEC 1.3), separately from forced
// frames. What a frame costs beyond its envelope is at most maxFrameExtra
// (a signal's resource aside), so maxQueued bounds it.
//
// One producer, one consumer. The producer is whoever holds the bus lock
// while the subscription is registered (Publish, Signal, Subscribe's
// replay, the warning and resync of a publish), or the goroutine that ended
// the subscription after unregistering it (eviction, cancellation, Close):
// so there is never more than one at a time, and the producer's own fields
// need no lock. The consumer is the one goroutine that pops.
//
// Entries have positions: the one at position p sits at buf[p&(len(buf)-1)],
// its tags at the same index of flags, and entries live in [head, tail). Both grow (modulo 2^64), except that
// unhold moves head back and an overflow resync moves tail back, both under
// mu and with no push in flight (they are producer operations). The live
// push of an event, the hot path, takes no lock: it writes the slot past
// tail and then publishes tail; the consumer reads up to the tail it
// loaded and publishes its head after clearing the slots it took. Every
// pop, and every rarer producer operation (a forced frame, a signal, which
// may replace a queued one in place, an overflow resync, which drops queued
// entries, growing the ring, close, hold, unhold) runs under mu, so none of
// them races a consumer copying a batch. The caps count live entries only:
// liveCount and liveBytes are the producer's pushed totals minus the
// consumer's popped totals, never derived from positions (a forced frame at
// the tail must not skew them).
//
// The consumer learns that entries may be ready from the ready channel. A
// pop that finds nothing marks the consumer waiting, then looks once more;
// a push publishes its entry, then clears waiting if set and owes one token.
// With sequentially consistent atomics at least one of the two sees the
// other, so a consumer never waits on an entry nobody will tell it about. A
// consumer must pop until a pop comes back empty before it waits on ready,
// and a busy consumer costs pushers no channel operation at all. A token
// can be stale (see wake): waking finds nothing and waits again. No
// goroutine is involved.
type boundedAsyncQueue struct {
	// The producer's side, written only by the producer, which holds its
	// bus's lock for every push (SPEC 4). tail is what the consumer sees;
	// next is the producer's own copy, ahead of it only while a replay is
	// appended under mu (published once, at its end: see publishLocked).
	tail        atomic.Uint64 // position after the newest entry
	next        uint64
	pushedLive  int // live entries appended, minus those a resync or close dropped
	pushedBytes int

	// The consumer's side, written only by the one consuming goroutine,
	// published for the producer.
	head        atomic.Uint64 // position of the oldest entry, once the slots before it are cleared
	poppedLive  atomic.Int64
	poppedBytes atomic.Int64
	// unyielded is what the consumer took and has not handed on yet (the
	// Events iterator's batch), which still counts toward the caps: live
	// frames<<unyieldedShift | their bytes. One word, so that the consumer
	// stores it once for every frame it yields (see Subscription.Events).
	unyielded atomic.Uint64
	waiting   atomic.Bool // the consumer found nothing and may be blocked on ready
	looked    atomic.Bool // the consumer has popped at least once (Subscription.yieldFor)
	// taken and takenLast are the oldest and the newest event the consumer
	// took and has not reported done yet (releaseTaken): a batch in
	// flight, which a Hub's budget counts as held (hub_pins.go). Set under
	// mu by take, as it moves head, so that a look under mu sees every
	// event either queued or here; cleared by the consumer.
	taken, takenLast atomic.Pointer[frame]
	// trackTaken: the bus's owner counts what subscribers hold (a Hub),
	// so take records taken; on any other bus it costs nothing. Set
	// before the queue is shared, never changed.
	trackTaken bool

	mu  sync.Mutex
	buf []*frame // power-of-two length; replaced by the producer under mu only
	// flags holds the tags of the entries in buf, at the same index; a
	// slot outside [head, tail) is always 0 (see entryFlags).
	flags  []entryFlags
	closed atomic.Bool // set under mu; read without it by the lock-free push
	// discarded is set by a close without drain: the consumer stops before
	// it hands on another frame it took.
	discarded atomic.Bool
	held      atomic.Bool // the consumer sees nothing until unhold (backplane replay); set under mu
	// signals maps a queued signal's (type, about) to its position, for
	// in-place coalescing (SPEC 11). Under mu.
	signals map[signalKey]uint64
	// lastID is the id of the last event the consumer dequeued. Under mu.
	lastID uint64

	// Set before the queue is shared (init, ReadyGroup.join), never
	// changed.
	maxQueued int
	maxBytes  int
	ready     chan struct{}
	// group, when set, is the ReadyGroup the consumer waits on: ready is
	// its channel, and wake marks member there first.
	group  *ReadyGroup
	member int
}

type signalKey struct{ typ, about string }

func (q *boundedAsyncQueue) init(maxQueued, maxBytes int) {
	q.maxQueued, q.maxBytes = maxQueued, maxBytes
	q.ready = make(chan struct{}, 1)
	// A consumer may wait on ready before its first pop.
	q.waiting.Store(true)
}

// liveCounts returns the live counts and caps as the producer sees them:
// what is queued and what the consumer took and has not yielded. The
// consumer stores unyielded, then adds its popped bytes, then its popped
// count, and this reads them in the opposite order, so a pop seen in the
// count is seen in the bytes and in unyielded too: the counts are exact
// or, during a take, too high, never too low.
func (q *boundedAsyncQueue) liveCounts() queueCounts {
	live := q.pushedLive - int(q.poppedLive.Load())
	bytes := q.pushedBytes - int(q.poppedBytes.Load())
	u := q.unyielded.Load()
	live += int(u >> unyieldedShift)
	bytes += int(u & unyieldedBytesMask)
	return queueCounts{live, q.maxQueued, bytes, q.maxBytes}
}

// queuedLiveLocked counts the live entries queued and their bytes from the
// entries, without the producer's totals (under mu, for a consumer that is
// not the producer: see Subscription.catchUpFast).
func (q *boundedAsyncQueue) queuedLiveLocked() queueCounts {
	c := queueCounts{maxQueued: q.maxQueued, maxBytes: q.maxBytes}
	mask := uint64(len(q.buf) - 1)
	for p, t := q.head.Load(), q.tail.Load(); p != t; p++ {
		if q.flags[p&mask] == 0 {
			c.liveCount++
			c.liveBytes += q.buf[p&mask].size()
		}
	}
	return c
}

// popped returns the live frames and bytes the consumer has popped in all,
// the count first (see liveCounts for why the order matters). Anyone may
// call it.
func (q *boundedAsyncQueue) popped() (live, bytes int64) {
	return q.poppedLive.Load(), q.poppedBytes.Load()
}

// isHeld reports whether a backplane replay holds the queue (hold).
func (q *boundedAsyncQueue) isHeld() bool { return q.held.Load() }

// isDiscarded reports whether the queue was closed without drain: the
// consumer hands on nothing more that it took.
func (q *boundedAsyncQueue) isDiscarded() bool { return q.discarded.Load() }

// hasLooked reports whether the consumer has popped at least once.
func (q *boundedAsyncQueue) hasLooked() bool { return q.looked.Load() }

// heldUnyielded returns unyielded (consumer only, like the two below).
func (q *boundedAsyncQueue) heldUnyielded() uint64 { return q.unyielded.Load() }

// setUnyielded sets unyielded to u.
func (q *boundedAsyncQueue) setUnyielded(u uint64) { q.unyielded.Store(u) }

// addUnyielded counts live frames of bytes more as taken and not yielded,
// and gives back reserved (see reserveBatch). Only the consumer stores
// unyielded, so a load and a store are enough.
func (q *boundedAsyncQueue) addUnyielded(live, bytes int, reserved uint64) {
	q.unyielded.Store(q.unyielded.Load() - reserved + unyieldedOf(live, bytes))
}

// reserveBatch is the consumer's first step before it fills a batch from
// elsewhere than the queue (the ring, while catching up) within the caps,
// while the producer may still push signals and forced frames. Under mu,
// it counts the live entries queued from the entries themselves
// (queuedLiveLocked), plus unyielded, plus taken (what the batch holds
// already); with reserve set (a batch that stays counted until yielded) it
// also counts the room left as unyielded before mu is let go, so a push
// meanwhile sees the caps as they will be once the batch is in, never
// below. It returns the counts and what it reserved, which the consumer
// gives back with addUnyielded once it knows what it took.
func (q *boundedAsyncQueue) reserveBatch(taken queueCounts, reserve bool) (c queueCounts, reserved uint64) {
	q.mu.Lock()
	c = q.queuedLiveLocked()
	u := q.unyielded.Load()
	c.liveCount += taken.liveCount + int(u>>unyieldedShift)
	c.liveBytes += taken.liveBytes + int(u&unyieldedBytesMask)
	if reserve && c.liveCount < c.maxQueued {
		reserved = unyieldedOf(c.maxQueued-c.liveCount, max(c.maxBytes-c.liveBytes, 0))
		q.unyielded.Store(q.unyielded.Load() + reserved)
	}
	q.mu.Unlock()
	return c, reserved
}

// unyielded packs a count of frames and their bytes. A batch holds fewer
// than 2^24 frames (a take into one takes at most maxBatchFrames, a
// catch-up step maxCatchUpScan) and fewer than 2^40 bytes (the caps admit
// what the queue and the ring give it, and both stop at maxBatchBytes).
const (
	unyieldedShift     = 40
	unyieldedBytesMask = 1<<unyieldedShift - 1
	maxBatchFrames     = 1 << 22
	maxBatchBytes      = 1 << 38
)

// unyieldedOf packs live frames of bytes for unyielded.
func unyieldedOf(live, bytes int) uint64 { return uint64(live)<<unyieldedShift | uint64(bytes) }

// push appends f as a live entry unless a cap rejects it, and returns the
// live counts: after the push when accepted, before it when rejected. Only
// the producer may call it (see the type).
//
// wake reports that the consumer was waiting: the caller must call wake,
// once it has done the rest of its work (Publish does it after the bus
// lock, for every subscriber at once). push does not send the token itself:
// waking each consumer in the middle of a fan-out lets another processor
// run it at once, drain a single frame and wait again, before the next
// event wakes it again: one wake-up per delivery. Woken together after the
// fan-out, consumers are still queued to run when the next event comes, so
// that event needs no wake-up and they drain batches (docs/bench/NOTES.md,
// item 7).
//
// A single frame larger than the byte cap is accepted when no live entry is
// queued, so an oversized event still reaches a keeping-up consumer; the next
// live push behind it is rejected.
//
// A signal with the same (type, about) as a queued, undelivered signal
// replaces it in place instead (pushCoalesced): it takes the older one's
// position, liveCount is unchanged and liveBytes moves by the difference.
func (q *boundedAsyncQueue) push(f *frame) (res pushResult, c queueCounts, wake bool) {
	if f.kind == kindSignal {
		return q.pushSignal(f)
	}
	size := f.size()
	c = q.liveCounts()
	if res = q.admit(c, size); res != pushAccepted {
		return res, c, false
	}
	t := q.next
	if t-q.head.Load() >= uint64(len(q.buf)) {
		q.mu.Lock()
		q.growLocked(1)
		q.mu.Unlock()
	}
	q.buf[t&uint64(len(q.buf)-1)] = f // its flags are 0 already: live
	q.next = t + 1
	q.tail.Store(t + 1)
	q.pushedLive++
	q.pushedBytes += size
	c.liveCount++
	c.liveBytes += size
	return pushAccepted, c, q.claimWake()
}

// admit applies the caps to a live frame of size bytes, given the counts c.
func (q *boundedAsyncQueue) admit(c queueCounts, size int) pushResult {
	switch {
	case q.closed.Load():
		return pushIgnored
	case c.liveCount >= q.maxQueued:
		return pushRejectedFrames
	case c.liveCount > 0 && c.liveBytes+size > q.maxBytes:
		return pushRejectedBytes
	}
	return pushAccepted
}

// pushSignal is push for a signal: under mu, because it may replace a
// queued signal in place.
func (q *boundedAsyncQueue) pushSignal(f *frame) (res pushResult, c queueCounts, wake bool) {
	size := f.size()
	q.mu.Lock()
	defer q.mu.Unlock()
	c = q.liveCounts()
	if !q.closed.Load() {
		if pos, ok := q.signals[signalKey{f.typ, f.about}]; ok {
			slot := &q.buf[pos&uint64(len(q.buf)-1)]
			q.pushedBytes += size - (*slot).size()
			c.liveBytes += size - (*slot).size()
			*slot = f
			return pushCoalesced, c, false
		}
	}
	if res = q.admit(c, size); res != pushAccepted {
		return res, c, false
	}
	q.appendLiveLocked(f)
	c.liveCount++
	c.liveBytes += size
	return pushAccepted, c, q.claimWake()
}

// claimWake clears waiting if it was set and reports whether it did: then
// the caller owes the consumer a token.
func (q *boundedAsyncQueue) claimWake() bool {
	return q.waiting.Load() && q.waiting.CompareAndSwap(true, false)
}

// wake leaves a token in ready for a consumer that push reported waiting.
// The send never blocks: a token already there is enough. Sent after the
// push, the token may reach a consumer that has popped the frame meanwhile;
// that consumer finds nothing, waits again, and is woken by the next push
// or close: a spurious wake-up, never a lost one, because push clears
// waiting only when it hands its caller this send.
func (q *boundedAsyncQueue) wake() {
	if q.group != nil {
		q.group.mark(q.member) // before the token: see ReadyGroup.Woken
	}
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// forcePush appends f as a forced entry, bypassing both caps. It reports
// false when the queue is closed and f was dropped. Producer only.
func (q *boundedAsyncQueue) forcePush(f *frame) bool {
	return q.forcePushEntry(f, entryForced)
}

// forcePushMarker is forcePush for a marker entry (see entryFlags).
func (q *boundedAsyncQueue) forcePushMarker(f *frame) bool {
	return q.forcePushEntry(f, entryForced|entryMarker)
}

func (q *boundedAsyncQueue) forcePushEntry(f *frame, fl entryFlags) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed.Load() {
		return false
	}
	q.appendLocked(f, fl)
	q.signalLocked()
	return true
}

// forcePushClosed is forcePush for a queue closed with drain: a shed puts
// its new terminal frame there. It reports false when the queue was closed
// without drain (its consumer wants nothing more).
func (q *boundedAsyncQueue) forcePushClosed(f *frame) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.discarded.Load() {
		return false
	}
	q.appendLocked(f, entryForced)
	q.signalLocked()
	if q.closed.Load() {
		q.wake() // a consumer that saw the end may wait on ready no more
	}
	return true
}

// nextID returns the id of the event after the last one the consumer
// took: the first a client of this queue has not been given.
func (q *boundedAsyncQueue) nextID() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.lastID + 1
}

// firstLiveEvent returns the id of the first live event queued (0: none),
// and whether a replayed event is queued, for a subscriber that a Hub's
// budget puts behind (hubSession.shed). Under the bus lock: the queue
// then has no producer but the caller.
func (q *boundedAsyncQueue) firstLiveEvent() (id uint64, replayed bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	mask := uint64(len(q.buf) - 1)
	for p, t := q.head.Load(), q.next; p != t; p++ {
		f, fl := q.buf[p&mask], q.flags[p&mask]
		if f.kind != kindEvent {
			continue
		}
		if fl&entryForced != 0 {
			return 0, true
		}
		if id == 0 {
			id = f.id
		}
	}
	return id, false
}

// dropLiveFrom drops the live entries and the markers, as a resync does,
// if the first live event queued is still id (the consumer may have taken
// it meanwhile), and reports whether it did. Producer, under the bus lock.
func (q *boundedAsyncQueue) dropLiveFrom(id uint64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	mask := uint64(len(q.buf) - 1)
	for p, t := q.head.Load(), q.next; p != t; p++ {
		if f := q.buf[p&mask]; f.kind == kindEvent {
			if f.id != id {
				return false
			}
			q.dropLiveLocked()
			return true
		}
	}
	return false
}

// beginReplay locks the queue for a replay of up to n frames, which the
// producer appends with forceAppendLocked; endReplay shows them to the
// consumer and unlocks. One lock hold and one buffer allocation for the
// whole replay, however many frames (Subscribe, under the bus lock).
func (q *boundedAsyncQueue) beginReplay(n int) {
	q.mu.Lock()
	q.reserveLocked(n)
}

// endReplay ends beginReplay.
func (q *boundedAsyncQueue) endReplay() {
	q.publishLocked()
	q.signalLocked()
	q.mu.Unlock()
}

// forceAppendLocked appends f as forced without publishing it; a caller
// that appends many (a replay) holds q.mu (beginReplay), then publishes
// and signals once at the end (endReplay). The consumer reads only under q.mu, so it
// cannot see the appended entries before then anyway; publishing the tail
// once saves an atomic store per replayed frame.
func (q *boundedAsyncQueue) forceAppendLocked(f *frame) {
	if !q.closed.Load() {
		q.putLocked(f, entryForced)
	}
}

// publishLocked shows the consumer what forceAppendLocked appended.
func (q *boundedAsyncQueue) publishLocked() { q.tail.Store(q.next) }

// hold hides the queue from the consumer until unhold; pushes go on.
func (q *boundedAsyncQueue) hold() {
	q.mu.Lock()
	q.held.Store(true)
	q.mu.Unlock()
}

// unhold puts front, as forced entries, ahead of everything queued, and
// shows the queue to the consumer again. On a closed queue front is
// dropped: a cancelled consumer wants nothing, and a drained one gets what
// was queued. It moves head back, so it is a producer operation that must
// not overlap a push: the caller holds the bus lock.
func (q *boundedAsyncQueue) unhold(front []*frame) {
	q.mu.Lock()
	q.held.Store(false)
	if !q.closed.Load() && len(front) > 0 {
		q.growLocked(len(front))
		// Positions before head are free: the front takes the ones right
		// before it, and every queued entry, signals included, keeps its
		// position (modular arithmetic makes a wrap below 0 harmless).
		head := q.head.Load() - uint64(len(front))
		mask := uint64(len(q.buf) - 1)
		for i, f := range front {
			j := (head + uint64(i)) & mask
			q.buf[j], q.flags[j] = f, entryForced
		}
		q.head.Store(head)
	}
	q.signalLocked()
	q.mu.Unlock()
}

// reserveLocked grows the buffer to hold n more entries, so a replay of
// thousands of frames costs one allocation, not a doubling series.
func (q *boundedAsyncQueue) reserveLocked(n int) {
	q.growLocked(n)
}

// appendLocked adds f, tagged fl, at the tail and publishes it (producer,
// under mu).
func (q *boundedAsyncQueue) appendLocked(f *frame, fl entryFlags) {
	q.putLocked(f, fl)
	q.publishLocked()
}

// putLocked writes f, tagged fl, at next, without publishing it (producer,
// under mu).
func (q *boundedAsyncQueue) putLocked(f *frame, fl entryFlags) {
	q.growLocked(1)
	i := q.next & uint64(len(q.buf)-1)
	q.buf[i], q.flags[i] = f, fl
	q.next++
}

// appendLiveLocked appends f as live, counts it, and, for a signal,
// records its position for coalescing.
func (q *boundedAsyncQueue) appendLiveLocked(f *frame) {
	pos := q.next
	q.appendLocked(f, 0)
	q.pushedLive++
	q.pushedBytes += f.size()
	if f.kind == kindSignal {
		if q.signals == nil {
			q.signals = make(map[signalKey]uint64)
		}
		q.signals[signalKey{f.typ, f.about}] = pos
	}
}

// length returns the number of queued entries (under mu).
func (q *boundedAsyncQueue) length() int { return int(q.next - q.head.Load()) }

// growLocked makes room for n more entries (producer, under mu). An idle
// subscription has no buffer at all; the first frame gets room for 32, so
// a subscription that receives anything skips the first doublings
// (profiles of short-lived streams showed them). Entries keep their
// positions.
func (q *boundedAsyncQueue) growLocked(n int) {
	used := q.length()
	if used+n <= len(q.buf) {
		return
	}
	size := max(2*len(q.buf), 32)
	for size < used+n {
		size *= 2
	}
	buf, flags := make([]*frame, size), make([]entryFlags, size)
	oldMask, mask := uint64(len(q.buf)-1), uint64(size-1)
	for p := q.head.Load(); p != q.next; p++ {
		buf[p&mask], flags[p&mask] = q.buf[p&oldMask], q.flags[p&oldMask]
	}
	q.buf, q.flags = buf, flags
}

// signalLocked leaves a token in ready if the consumer declared itself
// waiting. The rare pushes (forced frames, replay, resync, unhold) wake at
// once; only live pushes defer it (see push).
func (q *boundedAsyncQueue) signalLocked() {
	if q.claimWake() {
		q.wake()
	}
}

// dropLiveLocked removes every live entry and every marker, keeping the
// other forced entries (replay) in order, and returns how many live entries
// it removed: the frames the consumer will never see (SPEC 11's resync
// overflow policy; a superseded marker is no loss). Dropping the markers too keeps a
// stalled consumer's queue bounded however many overflows it goes through:
// the newest resync supersedes the older ones and their warnings. Producer,
// under mu: the consumer is not copying meanwhile.
func (q *boundedAsyncQueue) dropLiveLocked() int {
	_, live := q.retainLocked(func(_ *frame, fl entryFlags) bool {
		return fl&entryForced != 0 && fl&entryMarker == 0
	})
	return live
}

// retainLocked keeps, in order, the queued entries keep accepts and drops
// the others, and returns how many it dropped, and how many of them were
// live. Every queued signal is dropped with the live entries or kept with
// its position lost, so the coalescing index is cleared; only the two
// callers below use it, and both drop every live entry. Producer, under
// mu: the consumer is not copying meanwhile.
func (q *boundedAsyncQueue) retainLocked(keep func(f *frame, fl entryFlags) bool) (dropped, live int) {
	mask := uint64(len(q.buf) - 1)
	kept, liveBytes := q.head.Load(), 0
	tail := q.next
	for p := q.head.Load(); p != tail; p++ {
		f, fl := q.buf[p&mask], q.flags[p&mask]
		if keep(f, fl) {
			q.buf[kept&mask], q.flags[kept&mask] = f, fl
			kept++
			continue
		}
		dropped++
		if fl&entryForced == 0 {
			live++
			liveBytes += f.size()
		}
	}
	for p := kept; p != tail; p++ {
		q.buf[p&mask], q.flags[p&mask] = nil, 0
	}
	q.next = kept
	q.tail.Store(kept)
	q.pushedLive -= live
	q.pushedBytes -= liveBytes
	clear(q.signals)
	return dropped, live
}

// shed drops what a Hub's budget takes back from the queue: every entry
// that holds ring history (an event, replayed or live) and every live
// entry (a signal), keeping the synthetic frames in order, but a
// client_evicted, which a shed replaces: its droppedAfter no longer says
// where the stream stops. It returns the id of the first event dropped (0:
// none), how many entries it dropped and whether it dropped a
// client_evicted. The queue must have no producer (its subscription is
// unregistered), so that nothing is pushed meanwhile; the consumer may
// take, under mu.
func (q *boundedAsyncQueue) shed() (firstID uint64, dropped int, evicted bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	dropped, _ = q.retainLocked(func(f *frame, fl entryFlags) bool {
		switch {
		case f.kind == kindEvent:
			if firstID == 0 {
				firstID = f.id
			}
			return false
		case fl&entryForced == 0: // a signal
			return false
		case f.kind == kindTerminal && f.typ == TypeClientEvicted:
			evicted = true
			return false
		}
		return true
	})
	return firstID, dropped, evicted
}

// resync applies the resync overflow policy after f was rejected: drop the
// live entries, force-push the marker that mark builds from the id of the
// last event the consumer dequeued, then append f as live (the queue now
// holds no live entry, so the caps admit it). It returns the number of
// entries dropped and that id. On a closed queue it does nothing.
func (q *boundedAsyncQueue) resync(f *frame, mark func(lastDelivered uint64) *frame) (dropped int, lastDelivered uint64) {
	q.mu.Lock()
	if q.closed.Load() {
		q.mu.Unlock()
		return 0, 0
	}
	dropped = q.dropLiveLocked()
	lastDelivered = q.lastID
	q.appendLocked(mark(lastDelivered), entryForced|entryMarker)
	q.appendLiveLocked(f)
	q.signalLocked()
	q.mu.Unlock()
	return dropped, lastDelivered
}

// take appends buffered frames to dst, up to the first that brings their
// envelopes to maxBytes (at least one frame: 0 takes exactly one). open is false once the queue is
// closed and empty: dst then holds the last frames of the stream.
// With wait, a take that finds nothing declares the consumer waiting (see
// the type); without, a push then sends no wake-up. With sizes
// set, the live frames taken stay counted toward the caps (unyielded)
// until the consumer yields them: *sizes gets each frame's size, or -1 for
// a forced one, which does not count.
func (q *boundedAsyncQueue) take(dst []Frame, wait bool, maxBytes int, sizes *[]int) (out []Frame, open bool) {
	if !q.looked.Load() {
		q.looked.Store(true)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.held.Load() && !q.closed.Load() {
		if wait {
			q.waiting.Store(true)
		}
		return dst, true
	}
	h, t := q.head.Load(), q.tail.Load()
	if t == h {
		if !wait {
			return dst, !q.closed.Load()
		}
		q.waiting.Store(true)
		if t = q.tail.Load(); t == h {
			return dst, !q.closed.Load()
		}
		// A push landed in between. Take it; if that push already claimed
		// the wake-up, its token will find nothing, which is harmless.
		q.waiting.CompareAndSwap(true, false)
	}
	mask := uint64(len(q.buf) - 1)
	if sizes != nil {
		t = q.sizesLocked(h, t, sizes)
	}
	// One pass over the buffered entries: this is the consumer's whole
	// per-frame cost.
	dst = slices.Grow(dst, int(t-h))
	live, liveBytes, taken := 0, 0, 0
	var first, last *frame
	for p := h; p != t; p++ {
		i := p & mask
		f := q.buf[i]
		if taken >= maxBytes && p != h {
			t = p // a bounded take (TakeReady) leaves the rest queued
			break
		}
		taken += f.size()
		if f.pin != 0 {
			if first == nil {
				first = f
			}
			last = f
		}
		dst = append(dst, Frame{f})
		if fl := q.flags[i]; fl == 0 {
			live++
			liveBytes += f.size()
		} else {
			q.flags[i] = 0 // a free slot's tags are 0 (see entryFlags)
		}
		switch f.kind {
		case kindEvent:
			q.lastID = f.id
		case kindSignal:
			if k := (signalKey{f.typ, f.about}); q.signals[k] == p {
				delete(q.signals, k)
			}
		}
		q.buf[i] = nil // clear, so the queue does not pin the frame
	}
	if first != nil && q.trackTaken {
		q.holdTaken(first, last)
	}
	if sizes != nil && live > 0 {
		// They stay counted (see liveCounts for the order).
		q.unyielded.Store(q.unyielded.Load() + unyieldedOf(live, liveBytes))
	}
	// Bytes before the count (see liveCounts), and both before the head,
	// whose slots the producer may then reuse.
	q.poppedBytes.Add(int64(liveBytes))
	q.poppedLive.Add(int64(live))
	q.head.Store(t)
	// A bounded take that left frames of a closed queue is not its end.
	return dst, !q.closed.Load() || t != q.next
}

// holdTaken records that the consumer took the events first..last and
// holds them (see taken); an earlier batch it has not reported stays
// held too. Under mu, or by the consumer for frames it read from the ring.
func (q *boundedAsyncQueue) holdTaken(first, last *frame) {
	if q.taken.Load() == nil {
		q.taken.Store(first)
	}
	q.takenLast.Store(last)
}

// releaseTaken forgets what the consumer took: it is done with it.
func (q *boundedAsyncQueue) releaseTaken() {
	if q.taken.Load() != nil {
		q.taken.Store(nil)
		q.takenLast.Store(nil)
	}
}

// heldSpan is the span of ring history (frame.pin) a subscriber holds.
type heldSpan struct {
	lo, hi uint64 // from the start of the oldest event held to the end of the newest
	queued uint64 // where the oldest event in the queue starts, when hasQueued
	oldest *frame // the oldest event held
	// hasQueued: an event is queued (not only taken).
	hasQueued bool
}

// queuedBefore reports whether the span has a queued event that starts
// before start: one the ring dropped.
func (sp heldSpan) queuedBefore(start uint64) bool { return sp.hasQueued && sp.queued < start }

// heldSpanLocked returns the span of ring history that the subscriber
// holds: from the start of the oldest event it holds to the end of the
// newest, counting what its consumer took and has not reported done; ok
// is false when it holds none. The events between the two are held too,
// or were never pushed to it (a filter, a resync), which only makes the
// span an upper bound. Under mu: take moves events from the queue to
// taken under it.
func (q *boundedAsyncQueue) heldSpanLocked() (sp heldSpan, ok bool) {
	if f := q.taken.Load(); f != nil {
		last := q.takenLast.Load()
		if last == nil { // released meanwhile: it holds at most f..f
			last = f
		}
		sp = heldSpan{lo: f.pin - uint64(f.held()), hi: last.pin, oldest: f}
	}
	mask := uint64(len(q.buf) - 1)
	h, t := q.head.Load(), q.next
	for p := h; p != t; p++ {
		if f := q.buf[p&mask]; f.pin != 0 {
			sp.queued, sp.hasQueued = f.pin-uint64(f.held()), true
			if sp.oldest == nil {
				sp.oldest, sp.lo = f, sp.queued
			}
			break
		}
	}
	if sp.oldest == nil {
		return heldSpan{}, false
	}
	for p := t; p != h; p-- {
		if f := q.buf[(p-1)&mask]; f.pin != 0 {
			sp.hi = max(sp.hi, f.pin)
			break
		}
	}
	return sp, true
}

// sizesLocked appends to *sizes the size of each entry in [h, t) that
// counts toward the caps, -1 for the others, and returns where a batch
// that stays counted must end: after maxBatchFrames entries or
// maxBatchBytes bytes (see unyielded). A pass of its own, so that the
// take of AppendReady, which needs none of it, is not slowed down by it.
func (q *boundedAsyncQueue) sizesLocked(h, t uint64, sizes *[]int) uint64 {
	mask := uint64(len(q.buf) - 1)
	bytes := 0
	for p := h; p != t; p++ {
		n := -1
		if i := p & mask; q.flags[i] == 0 {
			n = q.buf[i].size()
			bytes += n
		}
		*sizes = append(*sizes, n)
		if p-h+1 >= maxBatchFrames || bytes >= maxBatchBytes {
			return p + 1
		}
	}
	return t
}

// close ends the queue; later pushes are ignored. With drain the consumer
// still receives what is buffered, then the end; without drain the buffer is
// dropped at once (and a close without drain after a close with drain still
// drops it). It returns the number of frames dropped. Idempotent. Only the
// producer may close (see the type): the bus closes a subscription after
// unregistering it.
func (q *boundedAsyncQueue) close(drain bool) (dropped int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed.Store(true)
	if !drain {
		q.discarded.Store(true)
		dropped = q.length()
		clear(q.buf)
		q.buf, q.flags = nil, nil
		q.head.Store(q.next)
		q.pushedLive = int(q.poppedLive.Load())
		q.pushedBytes = int(q.poppedBytes.Load())
		q.signals = nil
	}
	// The end must reach a consumer blocked on ready whatever it did
	// before, so close always leaves a token.
	q.wake()
	q.waiting.Store(false)
	return dropped
}

// queueCounts is a snapshot of a queue's live counts and caps.
type queueCounts struct {
	liveCount, maxQueued, liveBytes, maxBytes int
}
