package eventbus

import (
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"
)

// budget is a Hub's one byte budget over every ring of its buses
// (HubOptions.MaxTotalBytes). It counts what a frame costs (frame.held:
// its buffer, its type string, its header and ring slot), not only its
// envelope.
//
// used counts the bytes every ring holds plus the bytes publishes have
// reserved and not yet appended: a publish reserves its frame's bytes
// before it takes its bus lock and converts the reservation into ring
// bytes under it; every byte that leaves a ring (its own bounds, age,
// this budget, Close) is given back. So used is never below the sum of the
// rings, and a frame enters a ring only while used is at most max: the sum
// of every ring's bytes never exceeds max.
//
// The rule that keeps it. A reservation that takes used over max makes
// room before its publish takes its own lock: the largest rings lose their
// oldest events first, rings above a common level down towards it, the
// largest first and no more than needed, so that used falls to max minus
// a sixteenth (so that the
// scan over the sessions is paid once per sixteenth of the budget, not per
// publish). Each ring is trimmed under its own bus lock, one at a time,
// never two at once, and no publish waits for another's trimming: one
// whose reservation finds a trim under way, or finds used still over max
// under its lock (other publishes' reservations), drops its own ring's
// oldest events instead, and when its ring is empty its event is delivered
// live but not kept for replay. A resume past any of them gets
// ring_evicted with exact ids (the ring's oldest id says where it
// starts), and a subscriber catching up from the ring finds the slot
// emptied and is told the same.
type budget struct {
	used    atomic.Int64
	max     int64
	low     int64 // what a trim aims for: max - max/16
	trimmed atomic.Uint64

	hub *Hub
	mu  sync.Mutex // one trim at a time; publishes only TryLock it
	// rings is the trim's scratch: the buses with bytes, largest first.
	rings []ringSize
}

type ringSize struct {
	b     *EventBus
	bytes int64
}

func newBudget(h *Hub, max int64) *budget {
	return &budget{max: max, low: max - max/16, hub: h}
}

// release gives n bytes back. It is a no-op on a nil budget (a bus on its
// own), so the ring calls it unconditionally.
func (bg *budget) release(n int64) {
	if bg != nil && n != 0 {
		bg.used.Add(-n)
	}
}

// reserve charges n bytes for a frame about to enter a ring and, when that
// takes the budget over, makes room (see budget). It returns n, for
// appendCharged. It is called without any bus lock held.
func (bg *budget) reserve(n int64) int64 {
	if bg.used.Add(n) > bg.max {
		bg.reclaim()
	}
	return n
}

// reclaim trims the largest rings down to a common level until used is at
// low, unless another trim is running (then it does nothing: its caller
// falls back on its own ring, see appendCharged).
func (bg *budget) reclaim() {
	if !bg.mu.TryLock() {
		return
	}
	defer bg.mu.Unlock()
	over := bg.used.Load() - bg.low
	if over <= 0 {
		return
	}
	rings := bg.rings[:0]
	for _, e := range bg.hub.snapshot() {
		if n := e.bus.ring.heldNow.Load(); n > 0 {
			rings = append(rings, ringSize{e.bus, n})
		}
	}
	slices.SortFunc(rings, func(x, y ringSize) int {
		switch {
		case x.bytes > y.bytes:
			return -1
		case x.bytes < y.bytes:
			return 1
		}
		return 0
	})
	// The level: trimming the k largest rings to the size of the next one
	// frees sum(k) - k*next; the first k for which that covers over sets
	// the level between the two, (sum(k) - over) / k.
	var sum, level int64
	k := 0
	for k < len(rings) {
		sum += rings[k].bytes
		k++
		next := int64(0)
		if k < len(rings) {
			next = rings[k].bytes
		}
		if sum-int64(k)*next >= over {
			level = (sum - over) / int64(k)
			break
		}
	}
	// Largest first, and no more than needed: rings of the same size do
	// not all go down at once.
	for _, r := range rings[:k] {
		if over <= 0 {
			break
		}
		over -= r.b.trimTo(level, over)
	}
	clear(rings)
	bg.rings = rings[:0]
}

// trimTo drops b's oldest events while its ring holds more than level
// bytes (the newest too, for level 0) and it has freed less than limit,
// under b's lock only. It returns the bytes freed.
func (b *EventBus) trimTo(level, limit int64) (freed int64) {
	n := 0
	b.mu.Lock()
	for b.ring.n > 0 && int64(b.ring.held) > level && freed < limit {
		freed += int64(b.ring.at(0).held())
		b.ring.dropOldest()
		n++
	}
	if n > 0 {
		b.storeRingStatsLocked()
	}
	b.mu.Unlock()
	b.ring.budget.trimmed.Add(uint64(n))
	return freed
}

// appendCharged is append for a ring under a budget, under the bus lock:
// f's reservation (reserved, made by reserve) becomes its bytes. While the
// budget is still over (other publishes' reservations), the ring drops its
// own oldest events first; if it has none left, f is not kept (it is
// delivered live only) and the budget holds.
func (r *ring) appendCharged(f *frame, reserved int64) {
	bg := r.budget
	size := int64(f.held())
	trimmed := uint64(0)
	used := bg.used.Load()
	if size != reserved { // only for a frame not made by build
		used = bg.used.Add(size - reserved)
	}
	for used > bg.max && r.n > 0 {
		r.dropOldest()
		trimmed++
		used = bg.used.Load()
	}
	if used > bg.max {
		bg.used.Add(-size)
		trimmed++
	} else {
		r.append(f)
	}
	if trimmed > 0 {
		bg.trimmed.Add(trimmed)
	}
}

// frameOverhead is what a frame costs beyond its bytes: its header and
// its slot in the ring.
const frameOverhead = int(unsafe.Sizeof(frame{})) + int(unsafe.Sizeof((*frame)(nil)))

// held is every byte a frame in a ring costs, the unit of a Hub's budget:
// its buffer (the whole SSE encoding: envelope, id, event and data lines,
// the type's second copy among them, and for an event the room the
// encoder left for the longest id), the strings it keeps beside it (its
// type, a signal's resource) and its header and ring slot, so that many
// small events count as what they cost. The bus's own byte caps count
// envelopes (size): held is at most size + maxFrameExtra for an event.
func (f *frame) held() int {
	return len(f.wire) + int(f.room) + len(f.typ) + len(f.about) + frameOverhead
}

// maxSize is the held of the frame p becomes, whatever its id: p.buf is
// the frame's buffer, with room for the id lines of the longest id (see
// assemble).
func (p *encoded) maxSize() int64 { return int64(len(p.buf) + len(p.typ) + frameOverhead) }

// maxFrameSize is the largest held of an event whose envelope has
// maxEventBytes bytes: the envelope, the id and event lines with room for
// the longest id and type, the data line, the type again and the header.
func maxFrameSize(maxEventBytes int) int {
	return len(headID) + 2*maxDigits + len(headEvent) + 2*MaxTypeLen + len(headData) + maxEventBytes + 2 + frameOverhead
}
