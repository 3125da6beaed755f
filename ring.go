package eventbus

// ring is the replay buffer: a slice ring of published frames whose ids are
// contiguous, bounded by a count and by a number of encoded bytes. It is not
// safe for concurrent use; the bus guards it with its lock.
//
// Ids in the ring are contiguous (each append is the next id), so the frame
// with id x sits at offset x-first from the oldest: lookup by id is O(1).
// The backing slice grows by doubling up to maxLen, so a quiet session does
// not pay for a full ring up front, and append stays amortised O(1).
//
// It holds pointers to the frames Publish made, the same ones every
// subscriber's queue holds: a frame is stored once however many places
// refer to it, and a replay queues pointers without copying or allocating.
// A frame is never modified after it is made.
type ring struct {
	buf      []*frame
	head     int // index of the oldest frame
	n        int
	bytes    int
	maxLen   int
	maxBytes int
}

func newRing(maxLen, maxBytes int) ring {
	return ring{maxLen: maxLen, maxBytes: maxBytes}
}

// Len returns the number of frames held.
func (r *ring) Len() int { return r.n }

// Bytes returns the encoded bytes held.
func (r *ring) Bytes() int { return r.bytes }

// firstID returns the oldest id held, or 0 when empty.
func (r *ring) firstID() uint64 {
	if r.n == 0 {
		return 0
	}
	return r.buf[r.head].id
}

// lastID returns the newest id held, or 0 when empty.
func (r *ring) lastID() uint64 {
	if r.n == 0 {
		return 0
	}
	return r.at(r.n - 1).id
}

// at returns the i-th oldest frame.
func (r *ring) at(i int) *frame {
	j := r.head + i
	if j >= len(r.buf) {
		j -= len(r.buf)
	}
	return r.buf[j]
}

// append adds f, the next id, then drops the oldest frames while the ring
// holds more than maxLen frames or maxBytes bytes; the newest always stays.
// A frame whose id does not follow the newest one restarts the ring, so the
// ids held stay contiguous.
func (r *ring) append(f *frame) {
	if r.n > 0 && f.id != r.lastID()+1 {
		r.reset()
	}
	if r.n == len(r.buf) {
		r.grow()
	}
	if r.n == len(r.buf) {
		// Full at maxLen: the new frame overwrites the oldest slot.
		r.dropOldest()
	}
	j := r.head + r.n
	if j >= len(r.buf) {
		j -= len(r.buf)
	}
	r.buf[j] = f
	r.n++
	r.bytes += f.size()
	for r.n > 1 && r.bytes > r.maxBytes {
		r.dropOldest()
	}
}

func (r *ring) grow() {
	if len(r.buf) >= r.maxLen {
		return
	}
	size := max(2*len(r.buf), 16)
	size = min(size, r.maxLen)
	buf := make([]*frame, size)
	for i := range r.n {
		buf[i] = r.at(i)
	}
	r.buf, r.head = buf, 0
}

func (r *ring) dropOldest() {
	r.bytes -= r.buf[r.head].size()
	r.buf[r.head] = nil // clear, so the ring does not pin evicted bytes
	r.head++
	if r.head == len(r.buf) {
		r.head = 0
	}
	r.n--
}

// reset empties the ring and releases its memory.
func (r *ring) reset() {
	*r = ring{maxLen: r.maxLen, maxBytes: r.maxBytes}
}

// indexOf returns the position of id in the ring, or -1 when not held.
func (r *ring) indexOf(id uint64) int {
	first := r.firstID()
	if r.n == 0 || id < first || id-first >= uint64(r.n) {
		return -1
	}
	return int(id - first)
}
