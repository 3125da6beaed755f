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

// queueEntry is one buffered frame, tagged live or forced. Forced entries
// (replay and synthetic frames) count 0 toward both caps. A marker is a
// forced entry about the queue's own overflow (slow_client_warning, an
// overflow resync): a later overflow resync supersedes it.
//
// The entry points to the frame instead of holding it: one published frame
// is shared by the ring and every queue, so an entry is 16 bytes, not 80.
// Fan-out to 1000 subscribers writes, and each consumer reads and clears,
// a fifth of the memory; that halved the cost per delivery at 1000
// subscribers (BENCHMARKS.md). Frames are immutable once made.
type queueEntry struct {
	f      *Frame
	forced bool
	marker bool
}

// boundedAsyncQueue is the per-subscriber queue of SPEC section 6 (the
// original's BoundedAsyncQueue): a slice ring of frames that caps live frames
// and live encoded bytes, separately from forced frames.
//
// Any number of goroutines may push; one consumer at a time may pop. The
// consumer learns that entries may be ready from the ready channel. A pop
// that finds nothing marks the consumer waiting; the next push (or close)
// then leaves one token in ready. So a consumer must pop until a pop comes
// back empty before it waits on ready, and a busy consumer costs pushers no
// channel operation at all. A token can be stale (see wake): waking finds
// nothing and waits again. No goroutine is involved.
//
// liveCount and liveBytes are fields, updated on push and on dequeue, never
// derived from positions: a forced frame at the tail must not skew them.
type boundedAsyncQueue struct {
	mu        sync.Mutex
	buf       []queueEntry
	head      int
	n         int
	liveCount int
	liveBytes int
	maxQueued int
	maxBytes  int
	closed    bool
	held      bool // the consumer sees nothing until unhold (backplane replay)
	waiting   bool // the consumer found nothing and may be blocked on ready
	ready     chan struct{}

	// popped counts entries ever removed from the head, so popped+i is the
	// stable position of the i-th entry; signals maps a queued signal's
	// (type, about) to its position, for in-place coalescing (SPEC 11).
	popped  uint64
	signals map[signalKey]uint64
	// lastID is the id of the last event the consumer dequeued.
	lastID uint64
	// looked is set by the consumer's first pop, and read without q.mu by
	// the publisher's yield decision (Subscription.yieldFor).
	looked atomic.Bool
}

type signalKey struct{ typ, about string }

func (q *boundedAsyncQueue) init(maxQueued, maxBytes int) {
	q.maxQueued, q.maxBytes = maxQueued, maxBytes
	q.ready = make(chan struct{}, 1)
	// A consumer may wait on ready before its first pop.
	q.waiting = true
}

// push appends f as a live entry unless a cap rejects it, and returns the
// live counts: after the push when accepted, before it when rejected.
//
// wake reports that the consumer was waiting: the caller must call wake,
// once it has done the rest of its work (Publish does it after the bus
// lock, for every subscriber at once). push does not send the token itself:
// waking each consumer in the middle of a fan-out lets another processor
// run it at once, drain a single frame and wait again, before the next
// event wakes it again: one wake-up per delivery. Woken together after the
// fan-out, consumers are still queued to run when the next event comes, so
// that event needs no wake-up and they drain batches (BENCHMARKS.md).
//
// A single frame larger than the byte cap is accepted when no live entry is
// queued, so an oversized event still reaches a keeping-up consumer; the next
// live push behind it is rejected.
//
// A signal with the same (type, about) as a queued, undelivered signal
// replaces it in place instead (pushCoalesced): it takes the older one's
// position, liveCount is unchanged and liveBytes moves by the difference.
func (q *boundedAsyncQueue) push(f *Frame) (res pushResult, c queueCounts, wake bool) {
	size := f.Size()
	q.mu.Lock()
	c = queueCounts{q.liveCount, q.maxQueued, q.liveBytes, q.maxBytes}
	if f.kind == kindSignal && !q.closed {
		if pos, ok := q.signals[signalKey{f.typ, f.about}]; ok {
			j := q.index(int(pos - q.popped))
			q.liveBytes += size - q.buf[j].f.Size()
			q.buf[j].f = f
			c.liveBytes = q.liveBytes
			q.mu.Unlock()
			return pushCoalesced, c, false
		}
	}
	switch {
	case q.closed:
		q.mu.Unlock()
		return pushIgnored, c, false
	case q.liveCount >= q.maxQueued:
		q.mu.Unlock()
		return pushRejectedFrames, c, false
	case q.liveCount > 0 && q.liveBytes+size > q.maxBytes:
		q.mu.Unlock()
		return pushRejectedBytes, c, false
	}
	q.appendLiveLocked(f)
	q.liveCount++
	q.liveBytes += size
	c.liveCount, c.liveBytes = q.liveCount, q.liveBytes
	wake = q.waiting
	q.waiting = false
	q.mu.Unlock()
	return pushAccepted, c, wake
}

// wake leaves a token in ready for a consumer that push reported waiting.
// The send never blocks: a token already there is enough. Sent after
// q.mu is released, the token may reach a consumer that has popped the
// frame meanwhile; that consumer finds nothing, waits again, and is woken
// by the next push or close: a spurious wake-up, never a lost one, because
// push clears waiting only when it hands its caller this send.
func (q *boundedAsyncQueue) wake() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// forcePush appends f as a forced entry, bypassing both caps. It reports
// false when the queue is closed and f was dropped.
func (q *boundedAsyncQueue) forcePush(f *Frame) bool {
	return q.forcePushEntry(queueEntry{f: f, forced: true})
}

// forcePushMarker is forcePush for a marker entry (see queueEntry).
func (q *boundedAsyncQueue) forcePushMarker(f *Frame) bool {
	return q.forcePushEntry(queueEntry{f: f, forced: true, marker: true})
}

func (q *boundedAsyncQueue) forcePushEntry(e queueEntry) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false
	}
	q.appendLocked(e)
	q.signalLocked()
	return true
}

// forceAppendLocked appends f as forced without signalling; a caller that
// appends many (a replay) holds q.mu and signals once at the end.
func (q *boundedAsyncQueue) forceAppendLocked(f *Frame) {
	if !q.closed {
		q.appendLocked(queueEntry{f: f, forced: true})
	}
}

// hold hides the queue from the consumer until unhold; pushes go on.
func (q *boundedAsyncQueue) hold() {
	q.mu.Lock()
	q.held = true
	q.mu.Unlock()
}

// unhold puts front, as forced entries, ahead of everything queued, and
// shows the queue to the consumer again. On a closed queue front is
// dropped: a cancelled consumer wants nothing, and a drained one gets what
// was queued.
func (q *boundedAsyncQueue) unhold(front []*Frame) {
	q.mu.Lock()
	q.held = false
	if !q.closed && len(front) > 0 {
		buf := make([]queueEntry, max(len(front)+q.n, 8))
		for i, f := range front {
			buf[i] = queueEntry{f: f, forced: true}
		}
		for i := range q.n {
			buf[len(front)+i] = q.buf[q.index(i)]
		}
		q.buf, q.head = buf, 0
		q.n += len(front)
		// Positions are popped+index; the old entries moved back by
		// len(front), so moving the base keeps signal positions right
		// (modular arithmetic makes a wrap harmless).
		q.popped -= uint64(len(front))
	}
	q.signalLocked()
	q.mu.Unlock()
}

// reserveLocked grows the buffer to hold n more entries, so a replay of
// thousands of frames costs one allocation, not a doubling series.
func (q *boundedAsyncQueue) reserveLocked(n int) {
	if q.n+n > len(q.buf) {
		q.resizeLocked(q.n + n)
	}
}

// appendLocked adds e at the tail. An idle subscription has no buffer at
// all; the first frame gets room for 32, so a subscription that receives
// anything skips the first doublings (profiles of short-lived streams showed
// them).
func (q *boundedAsyncQueue) appendLocked(e queueEntry) {
	if q.n == len(q.buf) {
		q.resizeLocked(max(2*len(q.buf), 32))
	}
	q.buf[q.index(q.n)] = e
	q.n++
}

// appendLiveLocked appends f as live and, for a signal, records its
// position for coalescing. The caller updates the live counts.
func (q *boundedAsyncQueue) appendLiveLocked(f *Frame) {
	q.appendLocked(queueEntry{f: f})
	if f.kind == kindSignal {
		if q.signals == nil {
			q.signals = make(map[signalKey]uint64)
		}
		q.signals[signalKey{f.typ, f.about}] = q.popped + uint64(q.n-1)
	}
}

// index maps the i-th entry from the head to its slot.
func (q *boundedAsyncQueue) index(i int) int {
	j := q.head + i
	if j >= len(q.buf) {
		j -= len(q.buf)
	}
	return j
}

func (q *boundedAsyncQueue) resizeLocked(size int) {
	buf := make([]queueEntry, size)
	for i := range q.n {
		buf[i] = q.buf[q.index(i)]
	}
	q.buf, q.head = buf, 0
}

// signalLocked leaves a token in ready if the consumer declared itself
// waiting. The rare pushes (forced frames, replay, resync, unhold) wake at
// once, under q.mu; only live pushes defer it (see push).
func (q *boundedAsyncQueue) signalLocked() {
	if q.waiting {
		q.waiting = false
		q.wake()
	}
}

// popState is the outcome of a pop.
type popState uint8

const (
	popOK    popState = iota // an entry was returned
	popEmpty                 // nothing ready now; wait on ready
	popEnded                 // closed and nothing left: the end of the stream
)

func (q *boundedAsyncQueue) popLocked() queueEntry {
	e := q.buf[q.head]
	q.buf[q.head] = queueEntry{} // clear, so the queue does not pin the frame
	q.head++
	if q.head == len(q.buf) {
		q.head = 0
	}
	q.n--
	if !e.forced {
		q.liveCount--
		q.liveBytes -= e.f.Size()
	}
	switch e.f.kind {
	case kindEvent:
		q.lastID = e.f.id
	case kindSignal:
		if k := (signalKey{e.f.typ, e.f.about}); q.signals[k] == q.popped {
			delete(q.signals, k)
		}
	}
	q.popped++
	return e
}

// dropLiveLocked removes every live entry and every marker, keeping the
// other forced entries (replay) in order, and returns how many live entries
// it removed: the frames the consumer will never see (SPEC 11's resync
// overflow policy; a superseded marker is no loss). Dropping the markers too keeps a
// stalled consumer's queue bounded however many overflows it goes through:
// the newest resync supersedes the older ones and their warnings.
func (q *boundedAsyncQueue) dropLiveLocked() int {
	kept, dropped := 0, 0
	for i := range q.n {
		e := q.buf[q.index(i)]
		switch {
		case !e.forced:
			dropped++
		case !e.marker:
			q.buf[q.index(kept)] = e
			kept++
		}
	}
	for i := kept; i < q.n; i++ {
		q.buf[q.index(i)] = queueEntry{}
	}
	q.n, q.liveCount, q.liveBytes = kept, 0, 0
	// Every queued signal was live and is gone; positions are re-based.
	clear(q.signals)
	return dropped
}

// resync applies the resync overflow policy after f was rejected: drop the
// live entries, force-push the marker that mark builds from the id of the
// last event the consumer dequeued, then append f as live (the queue now
// holds no live entry, so the caps admit it). It returns the number of
// entries dropped and that id. On a closed queue it does nothing.
func (q *boundedAsyncQueue) resync(f *Frame, mark func(lastDelivered uint64) *Frame) (dropped int, lastDelivered uint64) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return 0, 0
	}
	dropped = q.dropLiveLocked()
	lastDelivered = q.lastID
	q.appendLocked(queueEntry{f: mark(lastDelivered), forced: true, marker: true})
	q.appendLiveLocked(f)
	q.liveCount, q.liveBytes = 1, f.Size()
	q.signalLocked()
	q.mu.Unlock()
	return dropped, lastDelivered
}

// popAll appends every buffered frame to dst. open is false once the queue
// is closed and empty: dst then holds the last frames of the stream. A pop
// that finds nothing declares the consumer waiting (see the type).
func (q *boundedAsyncQueue) popAll(dst []Frame) (out []Frame, open bool) {
	return q.take(dst, true)
}

// tryPopAll is popAll, except that finding nothing does not declare the
// consumer waiting: a push then sends no wake-up (see Subscription.takeReady).
func (q *boundedAsyncQueue) tryPopAll(dst []Frame) (out []Frame, open bool) {
	return q.take(dst, false)
}

func (q *boundedAsyncQueue) take(dst []Frame, wait bool) (out []Frame, open bool) {
	if !q.looked.Load() {
		q.looked.Store(true)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if (q.held && !q.closed) || q.n == 0 {
		if wait {
			q.waiting = true
		}
		return dst, !q.closed
	}
	// One pass over the buffered entries with the bookkeeping of popLocked
	// folded in: this is the consumer's whole per-frame cost.
	dst = slices.Grow(dst, q.n)
	live, liveBytes := 0, 0
	for i := range q.n {
		e := &q.buf[q.index(i)]
		dst = append(dst, *e.f)
		if !e.forced {
			live++
			liveBytes += e.f.Size()
		}
		switch e.f.kind {
		case kindEvent:
			q.lastID = e.f.id
		case kindSignal:
			if k := (signalKey{e.f.typ, e.f.about}); q.signals[k] == q.popped+uint64(i) {
				delete(q.signals, k)
			}
		}
		*e = queueEntry{} // clear, so the queue does not pin the frame
	}
	q.popped += uint64(q.n)
	q.liveCount -= live
	q.liveBytes -= liveBytes
	q.head, q.n = 0, 0
	return dst, !q.closed
}

// close ends the queue; later pushes are ignored. With drain the consumer
// still receives what is buffered, then the end; without drain the buffer is
// dropped at once (and a close without drain after a close with drain still
// drops it). It returns the number of frames dropped. Idempotent.
func (q *boundedAsyncQueue) close(drain bool) (dropped int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	if !drain {
		dropped = q.n
		clear(q.buf)
		q.buf, q.head, q.n, q.liveCount, q.liveBytes = nil, 0, 0, 0, 0
		q.signals = nil
	}
	// The end must reach a consumer blocked on ready whatever it did
	// before, so close always leaves a token.
	q.wake()
	q.waiting = false
	return dropped
}
