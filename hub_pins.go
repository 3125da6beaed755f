package eventbus

import (
	"cmp"
	"log/slog"
	"slices"
)

// What subscribers pin beyond the rings.
//
// A frame leaves its ring (the ring's bounds, age, the budget's trims, a
// Close) while a subscriber may still hold it: queued for it, or taken by
// its consumer and not yet written. Such a frame lives on, and the rings
// no longer count it: a client that stops reading holds up to its caps
// (MaxQueuedBytes, and a replay's frames) for as long as its write
// deadline lets it, on every session of every stream it opens. So a
// Hub's budget counts these bytes too, its pins, and when they take it
// over its bound it acts on the subscribers that pin the oldest frames,
// never on a healthy session's ring (budget.shedPins).
//
// Counting them. Every frame appended to a ring gets its pin: where it
// ends in that ring's history, the sum of what every frame appended
// before it costs (frame.held) plus its own. The ring's history before
// ring.start() is what it dropped. A subscriber holds events in id order,
// so it holds a span of that history: from the start of the oldest event
// it holds (queued, or taken and not reported done) to the end of the
// newest (boundedAsyncQueue.heldSpanLocked). What it pins is the part of
// its span before ring.start(), and a session's pins are the union of
// its holders' parts: a frame that two subscribers hold is counted once.
// Events inside a span that a filter or a resync kept from the subscriber
// are counted as held: an upper bound, never an under-count.
//
// Looking at every holder costs a lock of each queue, so a session looks
// only when the ring drops history that a holder may hold: below the
// lowest position any holder held at the last look (floor; a live push
// is newer than the ring's end then, and a replay lowers it, see
// heldLocked). Between looks it counts every byte the ring drops past
// floor as pinned, so that the estimate only errs high; it looks again
// once that estimate has grown by recheck bytes, when a holder lets go,
// and before the budget acts.
//
// Holders are the bus's registered subscribers and the ones it
// unregistered with frames left to drain (EventBus.detached: evicted, or
// closed with the bus). A closed bus's session stays known to the budget
// while its holders pin anything (budget.retired).

// pinState is a session's count of what its subscribers pin, under its
// bus lock.
type pinState struct {
	base  uint64 // what the holders pinned at the last look, in bytes
	shed  uint64 // of base, what shed holders pinned (see Subscription.shed)
	at    uint64 // ring.start() at the last look
	floor uint64 // the lowest history position a holder may hold since the last look
	spans []pinSpan
}

// pinSpan is the part of a holder's span that lies beyond the ring;
// residual when acting on the holder cannot free it (see lookLocked).
type pinSpan struct {
	lo, hi uint64
	shed   bool
}

// pinHolder is a holder that pins something, for the budget to act on.
type pinHolder struct {
	sess   *hubSession
	sub    *Subscription
	oldest int64  // Unix ms of the publish of the oldest event it holds
	bytes  uint64 // what its span holds beyond the ring
}

// recheckBytes is how far a session's estimate may grow past its last
// look before it looks again: a sixty-fourth of the budget, at least 64 KiB.
func (bg *budget) recheckBytes() uint64 { return uint64(max(bg.max/64, 64<<10)) }

// pinsChangedLocked is called after every change of the ring (under the
// bus lock): when the ring dropped history a holder may hold, the session
// counts it as pinned, and looks at its holders when that is new or has
// grown by recheckBytes.
func (s *hubSession) pinsChangedLocked() {
	p := &s.pins
	start := s.bus.ring.start()
	from := max(p.at, p.floor)
	if start <= from {
		return // everything dropped since the last look was held by nobody
	}
	extra := start - from
	if p.base == 0 || extra >= s.hub.budget.recheckBytes() {
		s.lookLocked(nil)
		return
	}
	s.publishPins(p.base+extra, p.shed)
}

// heldLocked lowers the floor to from: a subscriber now holds ring history
// from there (a replay), which a later drop may leave beyond the ring.
func (s *hubSession) heldLocked(from uint64) {
	s.pins.floor = min(s.pins.floor, from)
}

// releasedLocked is called when a holder let go of what it held (it ended,
// was cancelled or shed): the session looks again if it counted pins.
func (s *hubSession) releasedLocked() {
	if s.pins.base != 0 || s.pinned.Load() != 0 {
		s.lookLocked(nil)
	}
}

// lookLocked counts what the holders pin now, under the bus lock (and each
// holder's queue lock in turn), and resets the estimate to it. With out
// set it appends every holder that pins something and is not shed yet.
func (s *hubSession) lookLocked(out *[]pinHolder) {
	b := &s.bus
	p := &s.pins
	r := &b.ring
	start := r.start()
	floor := r.cum // a live push is newer than this
	spans := p.spans[:0]
	look := func(h *Subscription) {
		if h.behind {
			// It reads the ring from its cursor: a later drop may leave
			// what it reads in flight beyond the ring.
			if c := h.cursor.Load(); c != 0 && r.Len() > 0 && c >= r.firstID() && c <= r.lastID() {
				f := r.at(int(c - r.firstID()))
				floor = min(floor, f.pin-uint64(f.held()))
			} else {
				floor = min(floor, start)
			}
		}
		h.q.mu.Lock()
		sp, ok := h.q.heldSpanLocked()
		h.q.mu.Unlock()
		if !ok {
			return
		}
		floor = min(floor, sp.lo)
		if sp.lo >= start {
			return
		}
		hi := min(sp.hi, start)
		// Only what is queued can be taken back; a batch the consumer took
		// is let go when its write ends (residual).
		actionable := !h.shed.Load() && sp.queuedBefore(start)
		spans = append(spans, pinSpan{sp.lo, hi, !actionable})
		if out != nil && actionable {
			*out = append(*out, pinHolder{sess: s, sub: h, oldest: sp.oldest.at, bytes: hi - sp.lo})
		}
	}
	for _, h := range b.subs {
		look(h)
	}
	for _, h := range b.detached {
		look(h)
	}
	slices.SortFunc(spans, func(x, y pinSpan) int { return cmp.Compare(x.lo, y.lo) })
	p.base, p.shed = unionBytes(spans, false), unionBytes(spans, true)
	p.at, p.floor = start, floor
	clear(spans)
	p.spans = spans[:0]
	s.publishPins(p.base, p.shed)
	if p.base == 0 && b.closed {
		s.hub.budget.unretire(s) // a closed session's holders let go
	}
}

// unionBytes returns the bytes the spans cover together (sorted by lo),
// or with shedOnly those of the shed holders alone.
func unionBytes(spans []pinSpan, shedOnly bool) uint64 {
	var total, end uint64
	for _, sp := range spans {
		if shedOnly && !sp.shed {
			continue
		}
		lo := max(sp.lo, end)
		if sp.hi > lo {
			total += sp.hi - lo
			end = sp.hi
		}
	}
	return total
}

// publishPins makes pinned (shed of it) the session's count, and moves the
// budget's totals by the difference.
func (s *hubSession) publishPins(pinned, shed uint64) {
	bg := s.hub.budget
	if d := int64(pinned) - s.pinned.Swap(int64(pinned)); d != 0 {
		bg.pinned.Add(d)
	}
	if d := int64(shed) - s.pinnedShed.Swap(int64(shed)); d != 0 {
		bg.pinnedShed.Add(d)
	}
}

// shedPins acts on the subscribers that pin frames beyond the rings, the
// one pinning the oldest frame first, until the budget is back at low or
// none is left (reclaim calls it, with bg.mu held). What a subscriber
// gets is said in shed.
func (bg *budget) shedPins() {
	var holders []pinHolder
	look := func(s *hubSession) {
		if s.pinned.Load() > s.pinnedShed.Load() {
			s.bus.mu.Lock()
			s.lookLocked(&holders)
			s.bus.mu.Unlock()
		}
	}
	for _, e := range bg.hub.snapshot() {
		look(e.s)
	}
	for _, s := range bg.retiredSessions() {
		look(s)
	}
	slices.SortFunc(holders, func(x, y pinHolder) int {
		if c := cmp.Compare(x.oldest, y.oldest); c != 0 {
			return c
		}
		return cmp.Compare(y.bytes, x.bytes)
	})
	for _, h := range holders {
		if bg.used.Load()+bg.unshedPins() <= bg.low {
			break
		}
		h.sess.shed(h.sub)
	}
}

// putBehindLocked drops sub's queued live frames, from the first live
// event id, and has its consumer read them again from the ring: it puts
// sub behind, or, behind already (it had not drained its queue yet),
// moves its cursor back to id. It reports false, dropping nothing, when
// the consumer moved meanwhile.
func (s *hubSession) putBehindLocked(sub *Subscription, id uint64) bool {
	if !sub.behind {
		if !sub.q.dropLiveFrom(id) {
			return false
		}
		sub.enterCatchUpAtLocked(id, s.bus.now())
		return true
	}
	// The consumer reads the ring only once its queue is drained, and a
	// subscriber behind gets no live event: with id queued, its cursor is
	// where its queue ends. The swap wins against a read that would move
	// it, or the read wins and nothing is dropped.
	c := sub.cursor.Load()
	if c <= id || !sub.cursor.CompareAndSwap(c, id) {
		return false
	}
	if !sub.q.dropLiveFrom(id) {
		sub.cursor.CompareAndSwap(id, c) // taken meanwhile: as it was
		return false
	}
	if sub.q.claimWake() {
		sub.q.wake() // it may wait for the event after c: it has id to read
	}
	return true
}

// shed takes back what sub holds: the frames it pins beyond the ring, and
// whatever else is queued for it.
//
//   - Registered under OverflowCatchUp: it is put behind (or stays so), at
//     the first live event it had queued. Its live frames are dropped and
//     its consumer reads the events again from the ring, or is told what
//     the ring no longer holds (ring_evicted); nothing is evicted.
//   - Registered otherwise (or holding replayed frames): it is evicted, its
//     queue dropped, with client_evicted {reason:"memory_budget"} whose
//     droppedAfter is the first event it did not get.
//   - Already unregistered (evicted, or its bus closed), its frames
//     draining: they are dropped, and its terminal frame stays, a
//     client_evicted replaced by one saying memory_budget.
//
// Either way it is marked shed, and a transport that registered an
// Interrupt and holds a batch it took is told to abandon its write.
func (s *hubSession) shed(sub *Subscription) {
	b := &s.bus
	b.mu.Lock()
	if sub.shed.Load() {
		b.mu.Unlock()
		return
	}
	registered := slices.Contains(b.subs, sub)
	detached := !registered && slices.Contains(b.detached, sub)
	if !registered && !detached {
		b.mu.Unlock()
		return // it ended meanwhile
	}
	sub.q.mu.Lock()
	sp, ok := sub.q.heldSpanLocked()
	sub.q.mu.Unlock()
	if !ok || !sp.queuedBefore(b.ring.start()) {
		// Its consumer took what it queued since the look: what it holds
		// now is a batch in flight, which its write lets go.
		b.mu.Unlock()
		return
	}
	if registered && sub.policy == OverflowCatchUp {
		switch id, replayed := sub.q.firstLiveEvent(); {
		case replayed:
			// A ring read would overtake the replay: evicted below.
		case id == 0:
			b.mu.Unlock()
			return // taken meanwhile
		default:
			if !s.putBehindLocked(sub, id) {
				b.mu.Unlock()
				return
			}
			sub.shed.Store(true)
			s.lookLocked(nil)
			b.mu.Unlock()
			s.hub.budget.shed.Add(1)
			b.emit(Diagnostic{DiagMemoryBudget, "eventbus: subscriber put behind by the memory budget", []slog.Attr{
				slog.Uint64("cursor", id)}})
			return
		}
	}
	sub.shed.Store(true)
	if registered {
		b.removeLocked(sub)
		b.detachLocked(sub)
	}
	b.mu.Unlock()

	first, dropped, evicted := sub.q.shed()
	b.stats.dropShed.Add(uint64(dropped))
	c := sub.q.liveCounts()
	if first == 0 {
		first = sub.q.nextID()
	}
	if registered || evicted {
		// The eviction's frame, or one in place of the frame shed: its
		// droppedAfter is where the client's stream now stops.
		if registered {
			sub.end(evictedError(ReasonMemoryBudget))
			b.stats.eviction(ReasonMemoryBudget)
		}
		sub.q.forcePushClosed(evictedFrame(ReasonMemoryBudget, first, c, -1, b.now()).ref())
		sub.q.close(true)
		sub.release()
	}
	if sub.q.taken.Load() != nil && sub.interrupt != nil {
		sub.interrupt()
	}
	b.mu.Lock()
	s.lookLocked(nil)
	b.mu.Unlock()
	s.hub.budget.shed.Add(1)
	b.emit(Diagnostic{DiagMemoryBudget, "eventbus: subscriber shed by the memory budget", []slog.Attr{
		slog.Uint64("droppedAfter", first), slog.Int("dropped", dropped), slog.Bool("evicted", registered)}})
}
