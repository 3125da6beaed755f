package eventbus

import (
	"math/bits"
	"sync/atomic"
)

// ring is the replay buffer: a slice ring of published frames whose ids are
// contiguous, bounded by a count and by a number of bytes: the sum of the
// frames' JSON envelopes (Frame.Size, SPEC 1.3). What a frame costs beyond
// its envelope is at most maxFrameExtra, so the count bounds it; the ring
// also sums what its frames cost in memory (frame.held), which a Hub's
// budget counts. The bus guards the ring with its lock; only load reads it
// without (see below). The ring knows nothing of who owns its bus: what
// leaves it, the bus tells its owner (EventBus.ringChangedLocked).
//
// The frame with id x sits in slot x&(len(slots)-1): ids in the ring are
// contiguous (each append is the next id) and the slots are a power of two
// at least as many as the ring holds, so lookup by id is O(1) and a slot
// never holds two frames of the ring at once. The slots grow by doubling
// up to the power of two at or above maxLen, so a quiet session does not
// pay for a full ring up front, and append stays amortised O(1).
//
// It holds pointers to the frames Publish made, the same ones every
// subscriber's queue holds: a frame is stored once however many places
// refer to it, and a replay queues pointers without copying or allocating.
// A frame is never modified after it is made.
//
// A subscriber catching up reads the ring without the bus lock (load): the
// slots are atomic, the current slice is published in view, and a frame
// names its own id, so a reader that finds a slot empty or holding another
// id knows the ring no longer holds the one it wants.
type ring struct {
	slots []atomic.Pointer[frame]
	view  atomic.Pointer[ringSlots] // slots, for load
	first uint64                    // id of the oldest frame, when n > 0
	n     int
	bytes int
	held  int // the frames' frame.held, summed
	// cum is frame.held summed over every frame ever appended: the pin of
	// the newest one. What the ring dropped ends at cum-held (see start).
	cum      uint64
	maxLen   int
	maxBytes int
}

// ringSlots is a published slice of slots. A grown or reset ring publishes
// a new one; a reader holding the old one finds no frame it wants there
// that the ring does not still hold, or finds an id mismatch and reloads.
type ringSlots struct{ s []atomic.Pointer[frame] }

func newRing(maxLen, maxBytes int) ring {
	return ring{maxLen: maxLen, maxBytes: maxBytes}
}

// Len returns the number of frames held.
func (r *ring) Len() int { return r.n }

// Bytes returns the bytes held, the sum of the frames' envelopes (size).
func (r *ring) Bytes() int { return r.bytes }

// Held returns what the frames held cost in memory, the sum of their
// frame.held.
func (r *ring) Held() int { return r.held }

// start is where the ring's history starts: what it dropped, in the pins
// of its frames (frame.pin). A frame whose pin is at most start is no
// longer in the ring.
func (r *ring) start() uint64 { return r.cum - uint64(r.held) }

// firstID returns the oldest id held, or 0 when empty.
func (r *ring) firstID() uint64 {
	if r.n == 0 {
		return 0
	}
	return r.first
}

// lastID returns the newest id held, or 0 when empty.
func (r *ring) lastID() uint64 {
	if r.n == 0 {
		return 0
	}
	return r.first + uint64(r.n) - 1
}

func (r *ring) slot(id uint64) *atomic.Pointer[frame] {
	return &r.slots[id&uint64(len(r.slots)-1)]
}

// at returns the i-th oldest frame.
func (r *ring) at(i int) *frame { return r.slot(r.first + uint64(i)).Load() }

// append adds f, the next id, then drops the oldest frames while the ring
// holds more than maxLen frames or maxBytes bytes; the newest always stays.
// A frame whose id does not follow the newest one restarts the ring, so the
// ids held stay contiguous. The bus stores its last id after append, so a
// reader that loads that id first finds every frame up to it stored.
func (r *ring) append(f *frame) {
	if r.n > 0 && f.id != r.lastID()+1 {
		r.reset()
	}
	if r.n == len(r.slots) {
		r.grow()
	}
	if r.n == r.maxLen {
		// Full: the oldest goes first, so that its slot is free.
		r.dropOldest()
	}
	if r.n == 0 {
		r.first = f.id
	}
	h := f.held()
	r.cum += uint64(h)
	f.pin = r.cum
	r.slot(f.id).Store(f)
	r.n++
	r.bytes += f.size()
	r.held += h
	for r.n > 1 && r.bytes > r.maxBytes {
		r.dropOldest()
	}
}

func (r *ring) grow() {
	limit := 1 << bits.Len(uint(max(r.maxLen, 1)-1)) // the power of two at or above maxLen
	if len(r.slots) >= limit {
		return
	}
	size := min(max(2*len(r.slots), 16), limit)
	old := r.slots
	r.slots = make([]atomic.Pointer[frame], size)
	for id := r.first; id != r.first+uint64(r.n); id++ {
		r.slot(id).Store(old[id&uint64(len(old)-1)].Load())
	}
	r.view.Store(&ringSlots{r.slots})
}

func (r *ring) dropOldest() {
	s := r.slot(r.first)
	f := s.Load()
	r.bytes -= f.size()
	r.held -= f.held()
	s.Store(nil) // clear, so the ring does not pin evicted bytes
	r.first++
	r.n--
}

// dropOlder drops the oldest frames appended before cutoff (Unix ms), the
// newest included: Options.MaxAge. It returns how many it dropped.
func (r *ring) dropOlder(cutoff int64) int {
	n := 0
	for r.n > 0 && r.slot(r.first).Load().at < cutoff {
		r.dropOldest()
		n++
	}
	return n
}

// reset empties the ring and releases its memory.
func (r *ring) reset() {
	r.slots, r.first, r.n, r.bytes, r.held = nil, 0, 0, 0, 0
	r.view.Store(nil)
}

// load returns the frame with id without the bus lock, or nil when the
// ring does not hold it (any more). Only for ids up to the bus's last id.
func (r *ring) load(id uint64) *frame {
	for {
		v := r.view.Load()
		if v == nil {
			return nil
		}
		if f := v.s[id&uint64(len(v.s)-1)].Load(); f != nil && f.id == id {
			return f
		}
		if r.view.Load() == v {
			return nil
		}
		// Grown meanwhile: the frame may be in the new slots only.
	}
}
