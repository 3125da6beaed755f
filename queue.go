package eventbus

import "sync"

// pushResult is the outcome of boundedAsyncQueue.push.
type pushResult uint8

const (
	pushAccepted       pushResult = iota
	pushIgnored                   // the queue is closed: never an eviction
	pushRejectedFrames            // liveCount >= maxQueued: queue_overflow
	pushRejectedBytes             // liveBytes + size > maxQueuedBytes: queue_bytes_overflow
)

// reason returns the wire reason of a rejection.
func (r pushResult) reason() string {
	if r == pushRejectedBytes {
		return ReasonQueueBytesOverflow
	}
	return ReasonQueueOverflow
}

// queueEntry is one buffered frame, tagged live or forced. Forced entries
// (replay and synthetic frames) count 0 toward both caps.
type queueEntry struct {
	f      Frame
	forced bool
}

// boundedAsyncQueue is the per-subscriber queue of SPEC section 6 (the
// original's BoundedAsyncQueue): a slice ring of frames that caps live frames
// and live encoded bytes, separately from forced frames.
//
// Any number of goroutines may push; one consumer at a time may pop. The
// consumer learns that entries may be ready from the ready channel, which
// receives a token when the queue goes from empty to non-empty and when it is
// closed; so a consumer must pop until the queue is empty before it waits on
// ready again. No goroutine is involved.
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
	ready     chan struct{}
}

func newQueue(maxQueued, maxBytes int) *boundedAsyncQueue {
	q := &boundedAsyncQueue{}
	q.init(maxQueued, maxBytes)
	return q
}

func (q *boundedAsyncQueue) init(maxQueued, maxBytes int) {
	q.maxQueued, q.maxBytes = maxQueued, maxBytes
	q.ready = make(chan struct{}, 1)
}

// push appends f as a live entry unless a cap rejects it, and returns the
// live counts: after the push when accepted, before it when rejected.
//
// A single frame larger than the byte cap is accepted when no live entry is
// queued, so an oversized event still reaches a keeping-up consumer; the next
// live push behind it is rejected.
func (q *boundedAsyncQueue) push(f Frame) (pushResult, queueCounts) {
	size := f.Size()
	q.mu.Lock()
	c := queueCounts{q.liveCount, q.maxQueued, q.liveBytes, q.maxBytes}
	switch {
	case q.closed:
		q.mu.Unlock()
		return pushIgnored, c
	case q.liveCount >= q.maxQueued:
		q.mu.Unlock()
		return pushRejectedFrames, c
	case q.liveCount > 0 && q.liveBytes+size > q.maxBytes:
		q.mu.Unlock()
		return pushRejectedBytes, c
	}
	wake := q.appendLocked(queueEntry{f: f})
	q.liveCount++
	q.liveBytes += size
	c.liveCount, c.liveBytes = q.liveCount, q.liveBytes
	q.mu.Unlock()
	if wake {
		q.wake()
	}
	return pushAccepted, c
}

// forcePush appends f as a forced entry, bypassing both caps. It reports
// false when the queue is closed and f was dropped.
func (q *boundedAsyncQueue) forcePush(f Frame) bool {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return false
	}
	wake := q.appendLocked(queueEntry{f: f, forced: true})
	q.mu.Unlock()
	if wake {
		q.wake()
	}
	return true
}

// reserve grows the buffer to hold n more entries, so a replay of
// thousands of frames costs one allocation, not a doubling series.
func (q *boundedAsyncQueue) reserve(n int) {
	q.mu.Lock()
	if q.n+n > len(q.buf) {
		q.resizeLocked(q.n + n)
	}
	q.mu.Unlock()
}

// appendLocked adds e at the tail and reports whether the queue was empty
// (the consumer may be waiting and needs a token).
func (q *boundedAsyncQueue) appendLocked(e queueEntry) bool {
	if q.n == len(q.buf) {
		q.resizeLocked(max(2*len(q.buf), 8))
	}
	j := q.head + q.n
	if j >= len(q.buf) {
		j -= len(q.buf)
	}
	q.buf[j] = e
	q.n++
	return q.n == 1
}

func (q *boundedAsyncQueue) resizeLocked(size int) {
	buf := make([]queueEntry, size)
	for i := range q.n {
		j := q.head + i
		if j >= len(q.buf) {
			j -= len(q.buf)
		}
		buf[i] = q.buf[j]
	}
	q.buf, q.head = buf, 0
}

// wake leaves a token in ready without blocking; a token already there is
// enough, because the consumer drains everything before waiting again.
func (q *boundedAsyncQueue) wake() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// popState is the outcome of a pop.
type popState uint8

const (
	popOK    popState = iota // an entry was returned
	popEmpty                 // nothing ready now; wait on ready
	popEnded                 // closed and nothing left: the end of the stream
)

// pop removes the oldest entry.
func (q *boundedAsyncQueue) pop() (queueEntry, popState) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == 0 {
		if q.closed {
			return queueEntry{}, popEnded
		}
		return queueEntry{}, popEmpty
	}
	return q.popLocked(), popOK
}

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
	return e
}

// popAll appends every buffered frame to dst. open is false once the queue
// is closed and empty: dst then holds the last frames of the stream.
func (q *boundedAsyncQueue) popAll(dst []Frame) (out []Frame, open bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.n > 0 {
		dst = append(dst, q.popLocked().f)
	}
	return dst, !q.closed
}

// close ends the queue; later pushes are ignored. With drain the consumer
// still receives what is buffered, then the end; without drain the buffer is
// dropped at once (and a close without drain after a close with drain still
// drops it). It returns the number of frames dropped. Idempotent.
func (q *boundedAsyncQueue) close(drain bool) (dropped int) {
	q.mu.Lock()
	was := q.closed
	q.closed = true
	if !drain {
		dropped = q.n
		clear(q.buf)
		q.buf, q.head, q.n, q.liveCount, q.liveBytes = nil, 0, 0, 0, 0
	}
	q.mu.Unlock()
	if !was || dropped > 0 {
		q.wake()
	}
	return dropped
}

// counts returns the live counts and caps.
func (q *boundedAsyncQueue) counts() queueCounts {
	q.mu.Lock()
	defer q.mu.Unlock()
	return queueCounts{q.liveCount, q.maxQueued, q.liveBytes, q.maxBytes}
}

// len returns the number of buffered entries, live and forced.
func (q *boundedAsyncQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}
