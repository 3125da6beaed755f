package eventbus

import (
	"slices"
	"sync"
	"sync/atomic"
)

// budget is a Hub's one byte budget over every ring of its buses
// (HubOptions.MaxTotalBytes). It counts what a frame costs (frame.held:
// its buffer, its type string, its header and ring slot), not only its
// envelope. The Hub's sessions (hubSession, hub.go) call it from their
// owner hooks; the bus and its ring know nothing of it.
//
// used counts the bytes every ring holds, as each session last settled
// them (hubSession.held), plus what publishes reserved and have not
// settled yet. A publish settles under its bus lock, after its append:
// what its ring grew by (its frame, less what the ring dropped for it by
// its own bounds or by age) minus its reservation goes into used, and
// every byte that leaves a ring otherwise (age, this budget, Close) is
// given back the same way. used also counts the sessions' idempotency
// records (hub_idempotency.go), each from just before its publish to its
// forgetting (its window, its session's cap, the bus's close, this
// budget). So used is never below the sum of the rings and records, and a
// ring that grew keeps its growth only while used is at most max: the sum
// of every ring's bytes and every record's never exceeds max, but for the
// records being made at that moment, whose publishes each make room right
// after (see Hub.PublishIdempotent).
//
// The rule that keeps it. A publish whose frame would take used over max
// reserves it and makes room before it takes its own lock: the largest
// rings lose their oldest events first, rings above a common level down
// towards it, the largest first and no more than needed, so that used
// falls to max minus a sixteenth (so that the scan over the sessions is
// paid once per sixteenth of the budget, not per publish). A publish
// with room reserves nothing: at a ring's own bound its frame costs what
// the ring drops for it, and its settle touches used only for the
// difference (nothing at all for same-sized events). Each ring is trimmed
// under its own bus lock, one at a time, never two at once, and no publish
// waits for another's trimming: one that finds a trim under way, or finds
// used over max when it settles (other publishes' reservations and
// growth), drops its own ring's oldest events instead, and when only its
// own event is left, that event is delivered live but not kept for
// replay. A resume past any of them gets ring_evicted with exact ids (the
// ring's oldest id says where it starts), and a subscriber catching up
// from the ring finds the slot emptied and is told the same.
//
// Idempotency records press on the budget as a ring's growth does: a
// record that takes used over max makes room the same way, rings first.
// Only when every ring is empty and the records alone keep used over low
// are records forgotten, the oldest of the sessions that hold the most
// (reclaim), and a publish that finds another trim under way gives back
// from its own ring, then its own records. Records past their window go
// before anything else.
type budget struct {
	used    atomic.Int64
	max     int64
	low     int64 // what a trim aims for: max - max/16
	trimmed atomic.Uint64

	// pinned is what subscribers hold beyond the rings, summed over the
	// sessions' estimates, and pinnedShed the part of it that shed
	// subscribers still hold (a batch their transport has in flight),
	// which acting again cannot free (hub_pins.go). shed counts the
	// subscribers shed.
	pinned, pinnedShed atomic.Int64
	shed               atomic.Uint64
	// records is what the sessions' idempotency records cost
	// (hub_idempotency.go), summed; used counts it too.
	records atomic.Int64
	// retired are closed sessions whose subscribers still pin frames: the
	// hub has forgotten them, the budget has not. Under retireMu, taken
	// after a bus lock, never before one.
	retireMu sync.Mutex
	retired  map[*hubSession]struct{}

	hub *Hub
	mu  sync.Mutex // one trim at a time; publishes only TryLock it
	// rings is the trim's scratch: the sessions with bytes, largest first.
	rings []ringSize
}

// ringSize is a session and what its ring (or its records) holds, for a
// trim.
type ringSize struct {
	s     *hubSession
	bytes int64
}

func newBudget(h *Hub, max int64) *budget {
	return &budget{max: max, low: max - max/16, hub: h}
}

// admit is a publish's call before its bus lock, for a frame of at most n
// bytes. While the budget has room for it, it reserves nothing and returns
// 0: the publish's settle counts what its ring grew by. Otherwise it
// reserves n, makes room (see budget) and returns n, which the settle
// takes back.
func (bg *budget) admit(n int64) int64 {
	if bg.used.Load()+bg.unshedPins()+n <= bg.max {
		return 0
	}
	return bg.reserve(n)
}

// reserve charges n bytes for a frame about to enter a ring and makes room
// when that takes the budget over. It returns n.
func (bg *budget) reserve(n int64) int64 {
	if bg.used.Add(n)+bg.unshedPins() > bg.max {
		bg.reclaim()
	}
	return n
}

// unshedPins is what subscribers pin beyond the rings that shedding them
// could free (see pinned).
func (bg *budget) unshedPins() int64 { return max(bg.pinned.Load()-bg.pinnedShed.Load(), 0) }

// retire keeps s, a closed session whose subscribers pin frames, known to
// the budget until they let go (hubSession.unretireLocked).
func (bg *budget) retire(s *hubSession) {
	bg.retireMu.Lock()
	if s.pinned.Load() != 0 {
		if bg.retired == nil {
			bg.retired = make(map[*hubSession]struct{})
		}
		bg.retired[s] = struct{}{}
	}
	bg.retireMu.Unlock()
}

// unretire forgets s once nothing it pins is left.
func (bg *budget) unretire(s *hubSession) {
	bg.retireMu.Lock()
	delete(bg.retired, s)
	bg.retireMu.Unlock()
}

// retiredSessions returns a snapshot of the retired sessions.
func (bg *budget) retiredSessions() []*hubSession {
	bg.retireMu.Lock()
	defer bg.retireMu.Unlock()
	out := make([]*hubSession, 0, len(bg.retired))
	for s := range bg.retired {
		out = append(out, s)
	}
	return out
}

// settleLocked brings used up to date with s's ring, under s's bus lock:
// what the ring grew by since s last settled, less reserved (what admit
// reserved for the frame just appended; 0 for any other change). A ring
// that grew while used is over max drops its own oldest events, and the
// newest one too when nothing else is left: then it is delivered live but
// not kept. The session calls it only when there is something to settle
// (see hubSession.ringChangedLocked).
func (bg *budget) settleLocked(s *hubSession, reserved int64) {
	r := &s.bus.ring
	held := int64(r.Held())
	grown := held - s.held.Load()
	var used int64
	if d := grown - reserved; d != 0 {
		used = bg.used.Add(d)
	} else {
		used = bg.used.Load()
	}
	if grown > 0 && used > bg.max {
		n := uint64(0)
		for r.Len() > 0 && used > bg.max {
			f := int64(r.at(0).held())
			r.dropOldest()
			used = bg.used.Add(-f)
			held -= f
			n++
		}
		bg.trimmed.Add(n)
	}
	s.held.Store(held)
}

// reclaim trims the largest rings down to a common level until used is at
// low, unless another trim is running (then it does nothing: its caller
// falls back on its own ring when it settles). Idempotency records past
// their window are forgotten first, and when the rings are empty and used
// is still over low, the oldest records of the sessions holding the most
// record bytes go, down to a common level too.
func (bg *budget) reclaim() {
	if !bg.mu.TryLock() {
		return
	}
	defer bg.mu.Unlock()
	if bg.unshedPins() > 0 {
		// What slow subscribers pin goes first: trimming a ring whose
		// frames a queue still holds would free nothing, and the rings of
		// healthy sessions must not pay for them.
		bg.shedPins()
	}
	var sessions []hubEntry
	if bg.records.Load() > 0 {
		// Records past their window answer nothing any more: they go
		// before any event.
		sessions = bg.hub.snapshot()
		now := bg.hub.nowMillis()
		for _, e := range sessions {
			if o := e.s.idem.oldest.Load(); o != 0 && o <= now-bg.hub.idemWindow && e.s.idem.mu.TryLock() {
				e.s.expireLocked(now)
				e.s.idem.mu.Unlock()
			}
		}
	}
	over := bg.used.Load() + bg.unshedPins() - bg.low
	if over <= 0 {
		return
	}
	if sessions == nil {
		sessions = bg.hub.snapshot()
	}
	rings := bg.rings[:0]
	for _, e := range sessions {
		if n := e.s.held.Load(); n > 0 {
			rings = append(rings, ringSize{e.s, n})
		}
	}
	k, level := cutLevel(rings, over)
	// Largest first, and no more than needed: rings of the same size do
	// not all go down at once.
	for _, r := range rings[:k] {
		if over <= 0 {
			break
		}
		over -= bg.trim(r.s, level, over)
	}
	if over > 0 && k == len(rings) && bg.records.Load() > 0 {
		// Every ring was cut (to 0 when they could not cover over) and the
		// records keep the budget over: the oldest records of the sessions
		// holding the most go, as the rings did. (With rings left uncut,
		// over is what concurrent publishes added meanwhile, which their
		// own settles give back.) A session whose publish holds its lock
		// (the budget may run under it) is skipped; that publish gives
		// back from its own records after.
		recs := rings[:0]
		for _, e := range sessions {
			if n := e.s.idem.bytes.Load(); n > 0 {
				recs = append(recs, ringSize{e.s, n})
			}
		}
		k, level := cutLevel(recs, over)
		for _, r := range recs[:k] {
			if over <= 0 {
				break
			}
			over -= r.s.forgetRecords(level, over, true)
		}
		rings = recs
	}
	clear(rings)
	bg.rings = rings[:0]
}

// cutLevel sorts sizes largest first and returns how many of them to cut
// and the level to cut them down to, so that together they free over: the
// k largest cut to the size of the next one free sum(k) - k*next; the
// first k for which that covers over sets the level between the two,
// (sum(k) - over) / k. When even all of them do not cover it, all of them
// go to 0.
func cutLevel(sizes []ringSize, over int64) (k int, level int64) {
	slices.SortFunc(sizes, func(x, y ringSize) int {
		switch {
		case x.bytes > y.bytes:
			return -1
		case x.bytes < y.bytes:
			return 1
		}
		return 0
	})
	var sum int64
	for k < len(sizes) {
		sum += sizes[k].bytes
		k++
		next := int64(0)
		if k < len(sizes) {
			next = sizes[k].bytes
		}
		if sum-int64(k)*next >= over {
			return k, (sum - over) / int64(k)
		}
	}
	return k, 0
}

// giveBackRecords gives back what forgotten idempotency records cost.
func (bg *budget) giveBackRecords(cost int64) {
	if cost != 0 {
		bg.used.Add(-cost)
		bg.records.Add(-cost)
	}
}

// trim drops s's oldest events while its ring holds more than level bytes
// (the newest too, for level 0) and it has freed less than limit, under
// s's bus lock only. It returns the bytes freed.
func (bg *budget) trim(s *hubSession, level, limit int64) (freed int64) {
	b := &s.bus
	n := 0
	b.mu.Lock()
	for b.ring.Len() > 0 && int64(b.ring.Held()) > level && freed < limit {
		freed += int64(b.ring.at(0).held())
		b.ring.dropOldest()
		n++
	}
	if n > 0 {
		b.ringChangedLocked(0) // settles: used gives back what was freed
	}
	b.mu.Unlock()
	bg.trimmed.Add(uint64(n))
	return freed
}
