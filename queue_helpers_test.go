package eventbus

// Queue operations that only tests need: the library itself consumes with
// popAll and sizes replays with reserveLocked under its own locking.

func newQueue(maxQueued, maxBytes int) *boundedAsyncQueue {
	q := &boundedAsyncQueue{}
	q.init(maxQueued, maxBytes)
	return q
}

// reserve is reserveLocked with the lock taken.
func (q *boundedAsyncQueue) reserve(n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.reserveLocked(n)
}

// poppedEntry is a dequeued entry with its frame by value (the zero Frame
// when nothing was dequeued), for comparisons.
type poppedEntry struct {
	f              Frame
	forced, marker bool
}

// popState is the outcome of a pop.
type popState uint8

const (
	popOK    popState = iota // an entry was returned
	popEmpty                 // nothing ready now; wait on ready
	popEnded                 // closed and nothing left: the end of the stream
)

// pop removes the oldest entry: popAll limited to one.
func (q *boundedAsyncQueue) pop() (poppedEntry, popState) {
	q.mu.Lock()
	var e queueEntry
	n := q.length()
	if n > 0 {
		e = q.entry(0) // its tags; take returns the frame only
	}
	ended := n == 0 && q.closed.Load()
	q.mu.Unlock()
	if ended {
		return poppedEntry{}, popEnded
	}
	if fs, _ := q.take(nil, true, 1, nil); len(fs) == 1 {
		return poppedEntry{fs[0], e.forced, e.marker}, popOK
	}
	return poppedEntry{}, popEmpty
}

// refs returns pointers to copies of fs, the form unhold takes.
func refs(fs []Frame) []*frame {
	out := make([]*frame, len(fs))
	for i, f := range fs {
		out[i] = f.ref()
	}
	return out
}

// counts returns the live counts and caps.
func (q *boundedAsyncQueue) counts() queueCounts {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.liveCounts()
}

// len returns the number of buffered entries, live and forced.
func (q *boundedAsyncQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.length()
}

// queueEntry is one buffered frame with its tags, as the tests see it.
type queueEntry struct {
	f      *frame
	forced bool
	marker bool
}

// entry returns the i-th queued entry from the head (under mu).
func (q *boundedAsyncQueue) entry(i int) queueEntry {
	j := (q.head.Load() + uint64(i)) & uint64(len(q.buf)-1)
	fl := q.flags[j]
	return queueEntry{f: q.buf[j], forced: fl&entryForced != 0, marker: fl&entryMarker != 0}
}

// freeSlotsClear reports the first slot outside [head, next) that holds a
// frame or a tag, or -1: a free slot must neither pin a frame nor hand its
// tags to the live entry that a push writes there without touching flags.
func (q *boundedAsyncQueue) freeSlotsClear() int {
	used := make(map[uint64]bool)
	mask := uint64(len(q.buf) - 1)
	for p := q.head.Load(); p != q.next; p++ {
		used[p&mask] = true
	}
	for i := range q.buf {
		if !used[uint64(i)] && (q.buf[i] != nil || q.flags[i] != 0) {
			return i
		}
	}
	return -1
}

// pushNow is push followed at once by the wake it asks for: the order every
// caller of push keeps, with nothing in between.
func (q *boundedAsyncQueue) pushNow(f *frame) (pushResult, queueCounts) {
	res, c, wake := q.push(f)
	if wake {
		q.wake()
	}
	return res, c
}
