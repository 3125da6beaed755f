package eventbus

// Helpers that only tests use, kept out of the library (issue 14). Owned
// by helper "layout"; the same names and behaviour they had in queue.go
// and ring.go.

import (
	"math"
	"time"
)

// popAll appends every buffered frame to dst. open is false once the queue
// is closed and empty: dst then holds the last frames of the stream. A pop
// that finds nothing declares the consumer waiting (see the type).
func (q *boundedAsyncQueue) popAll(dst []Frame) (out []Frame, open bool) {
	return q.take(dst, true, math.MaxInt, nil)
}

// tryPopAll is popAll, except that finding nothing does not declare the
// consumer waiting: a push then sends no wake-up (see Subscription.take).
func (q *boundedAsyncQueue) tryPopAll(dst []Frame) (out []Frame, open bool) {
	return q.take(dst, false, math.MaxInt, nil)
}

// indexOf returns the position of id in the ring, or -1 when not held.
func (r *ring) indexOf(id uint64) int {
	first := r.firstID()
	if r.n == 0 || id < first || id-first >= uint64(r.n) {
		return -1
	}
	return int(id - first)
}

// orDefault is d when positive, else def: a Handler's duration setting.
func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
