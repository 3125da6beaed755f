package eventbus

// enterCatchUpLocked puts s behind after its queue rejected f under
// OverflowCatchUp: f and everything after it stay in the ring for its
// consumer to read. A rejected signal, which is in no ring, is dropped and
// counted; s then needs the next id.
func (s *Subscription) enterCatchUpLocked(f *frame, lastID uint64, now int64) {
	b := s.bus
	cursor := f.id
	if f.kind != kindEvent {
		cursor = lastID + 1
		b.stats.dropCatchUpSignal.Add(1)
	}
	s.cursor.Store(cursor)
	s.progress.Store(now)
	s.behind = true
	s.lagging.Store(true)
	b.stats.catchUps.Add(1)
	b.stats.behind.Add(1)
}

// enterCatchUpAtLocked puts s behind with its cursor at id: a Hub's
// budget dropped its queued live frames, the first of them id (see
// hubSession.shed). Its consumer reads them again from the ring.
func (s *Subscription) enterCatchUpAtLocked(id uint64, now int64) {
	b := s.bus
	s.cursor.Store(id)
	s.progress.Store(now)
	s.behind = true
	s.lagging.Store(true)
	s.warned = false // its live frames are gone: the episode is over
	b.stats.catchUps.Add(1)
	b.stats.behind.Add(1)
	if s.q.claimWake() {
		s.q.wake() // a consumer waiting on an empty queue has the ring to read
	}
}

// leaveCatchUpLocked ends s's catch-up: it caught up.
func (s *Subscription) leaveCatchUpLocked() {
	if s.behind {
		s.behind = false
		s.lagging.Store(false)
		s.bus.stats.behind.Add(-1)
		// Live again: what it comes to hold is the budget's to count and
		// act on again (hubSession.shed put it behind).
		s.shed.Store(false)
	}
}

// dropCatchUpLocked ends s's catch-up because s is being unregistered, and
// returns its cursor (0 if it was not behind). The cursor is swapped for 0,
// which no claim matches: a consumer reading the ring without the lock
// stops before its next frame, so the cursor returned is exactly where it
// stopped (see catchUpFast).
func (s *Subscription) dropCatchUpLocked() uint64 {
	if !s.behind {
		return 0
	}
	s.leaveCatchUpLocked()
	return s.cursor.Swap(0)
}

// rejoinLocked is the publisher's half of the hand-over: s is behind, f is
// the event just published, and when s's consumer has read everything
// before f (its cursor is f's id), the publisher claims f for the live
// fan-out and s rejoins it. The consumer claims each id with the same
// compare-and-swap (catchUpFast), so exactly one of the two takes f: no
// gap, no duplicate, and no lock for the consumer.
func (s *Subscription) rejoinLocked(f *frame) bool {
	if f.kind != kindEvent || !s.cursor.CompareAndSwap(f.id, f.id+1) {
		return false
	}
	s.leaveCatchUpLocked()
	return true
}

// stalledLocked reports whether s, behind, has something to read and its
// consumer has taken nothing for longer than its bound; lastID is the last
// id published.
func (s *Subscription) stalledLocked(now int64, lastID uint64) bool {
	return s.cursor.Load() <= lastID && now-s.progress.Load() > s.stallMillis
}

// maxCatchUpScan bounds the ring entries one catch-up step examines (a
// filter may skip most of them), so that a read under the bus lock is
// short and a batch comes back soon.
const maxCatchUpScan = 512

// catchUp appends to dst the events the subscriber needs from the ring,
// once its consumer has drained its queue: the frames its filter passes,
// from its cursor, while its caps admit them as they would admit live
// pushes, counting the frames the consumer has taken and not yet yielded
// (unyielded) and those taken for this batch already (taken). As for the
// queue, the first frame is admitted whatever its size when nothing is
// held. With sizes set (the Events iterator), the frames count toward the
// caps until yielded (see boundedAsyncQueue.take).
//
// It reads without the bus lock (catchUpFast) while the ring holds what it
// needs, and takes the lock only when the ring dropped its cursor: then a
// ring_evicted resync goes first and it goes on from the ring's oldest
// event (catchUpStep). Having read up to the newest event it stays behind
// until the next publish, which hands it over to the live fan-out
// (rejoinLocked).
func (s *Subscription) catchUp(dst []Frame, sizes *[]int, taken queueCounts) []Frame {
	for {
		var ok bool
		if dst, taken, ok = s.catchUpFast(dst, sizes, taken); ok {
			return dst
		}
		var more bool
		if dst, more = s.catchUpStep(dst, sizes, taken); !more {
			return dst
		}
	}
}

// catchUpFast is catchUp without the bus lock. It reads the frames from
// its cursor up to the bus's last id, then moves the cursor past them
// with one compare-and-swap. The only other claims on a cursor are the
// publisher's (rejoinLocked), which needs the cursor at the id it is
// publishing, so it can meet a pass only over that one id, and then one
// of the two swaps wins; and dropCatchUpLocked's, unregistering s. A pass
// whose swap fails delivers nothing. A consumer that finds nothing to read
// waits: it declared itself waiting before it loaded the last id, and the
// bus stores the last id before its fan-out checks for waiting consumers
// behind, so either it sees the new id or the fan-out wakes it. It returns
// taken with what it added (when sizes is nil, for the batch's caps), and
// ok false when the ring no longer holds the cursor: the locked step takes
// it from there.
func (s *Subscription) catchUpFast(dst []Frame, sizes *[]int, taken queueCounts) (out []Frame, counts queueCounts, ok bool) {
	b, q := s.bus, &s.q
	if !s.lagging.Load() || q.isHeld() {
		// Rejoined, or a backplane resume holds the queue until its
		// history is in front: the ring must not go ahead of it.
		return dst, taken, true
	}
	last := b.lastID.Load() // first: the ring holds every frame up to it
	from := s.cursor.Load()
	s.progress.Store(b.now())
	if from == 0 || from > last {
		return dst, taken, true // unregistered, or read up to the newest: the next publish hands it over
	}
	// Behind, s gets no live push but signals (and forced frames), which
	// the queue takes under its lock, and the one event of a hand-over,
	// which ends this pass: reserveBatch counts what is queued exactly, and
	// reserves what this read may take, so a signal pushed to s meanwhile
	// sees the caps as they will be once the batch is in, never below.
	c, reserved := q.reserveBatch(taken, sizes != nil)
	start, sizesStart := len(dst), 0
	if sizes != nil {
		sizesStart = len(*sizes)
	}
	held := queueCounts{}
	x, dropped := from, false
	for ; x <= last; x++ {
		f := b.ring.load(x)
		if f == nil {
			dropped = true // the ring dropped it: the locked step resyncs
			break
		}
		if !s.filter.match(f.typ) {
			continue
		}
		size := f.size()
		if q.admit(c, size) != pushAccepted || sizes != nil && held.liveBytes >= maxBatchBytes {
			break
		}
		dst = append(dst, Frame{f})
		if sizes != nil {
			*sizes = append(*sizes, size)
		}
		held.liveCount++
		held.liveBytes += size
		c.liveCount++
		c.liveBytes += size
	}
	ok = !dropped
	if x != from && !s.cursor.CompareAndSwap(from, x) {
		// Unregistered meanwhile (evicted, cancelled, the bus closed),
		// announced from the cursor it had: none of this pass goes out.
		clear(dst[start:])
		dst = dst[:start]
		if sizes != nil {
			*sizes = (*sizes)[:sizesStart]
		}
		held, ok = queueCounts{}, true
	}
	if sizes != nil {
		q.addUnyielded(held.liveCount, held.liveBytes, reserved)
	} else {
		taken.liveCount += held.liveCount
		taken.liveBytes += held.liveBytes
	}
	b.stats.catchUpServed.Add(uint64(held.liveCount))
	return dst, taken, ok
}

// catchUpStep is catchUp under the bus lock, for a cursor the ring
// dropped: the resync, then what follows; reaching the newest event it
// rejoins the live fan-out in the same lock hold. more reports that it
// examined maxCatchUpScan entries, all filtered out, and should go on.
func (s *Subscription) catchUpStep(dst []Frame, sizes *[]int, taken queueCounts) (out []Frame, more bool) {
	b := s.bus
	q := &s.q
	now := b.now() // the clock is read outside the lock
	b.mu.Lock()
	defer b.mu.Unlock()
	if !s.behind || q.isHeld() {
		return dst, false
	}
	s.progress.Store(now)
	c := q.liveCounts()
	c.liveCount += taken.liveCount
	c.liveBytes += taken.liveBytes
	first := b.ring.firstID()
	if first == 0 {
		first = b.nextID // empty
	}
	cursor := s.cursor.Load()
	// The ring dropped the cursor: the resync goes right before the first
	// frame read after it, so that the next event the client gets is the
	// one it announces. With its caps full it waits, cursor unmoved: by
	// the next read the ring may have moved on again, and one resync, with
	// the ids of then, is what the client must see.
	missedFrom := uint64(0) // the cursor of a resync not appended yet
	if cursor < first {
		missedFrom, cursor = cursor, first
	}
	resync := func() {
		dst = append(dst, resyncFrame(ReasonRingEvicted, "", missedFrom-1, first, b.epoch, now))
		if sizes != nil {
			*sizes = append(*sizes, -1)
		}
		b.stats.resync(ReasonRingEvicted)
		missedFrom = 0
	}
	var served uint64
	heldLive, heldBytes := 0, 0
	full, skipped := false, false
	for n := 0; n < maxCatchUpScan && cursor < b.nextID; n++ {
		f := b.ring.at(int(cursor - first))
		if !s.filter.match(f.typ) {
			cursor++
			skipped = true
			continue
		}
		size := f.size()
		if q.admit(c, size) != pushAccepted || sizes != nil && heldBytes >= maxBatchBytes {
			full = true
			break
		}
		if missedFrom != 0 {
			resync()
		}
		dst = append(dst, Frame{f})
		if sizes != nil {
			*sizes = append(*sizes, size)
			heldLive++
			heldBytes += size
		}
		c.liveCount++
		c.liveBytes += size
		served++
		cursor++
	}
	if missedFrom != 0 {
		if skipped || cursor >= b.nextID {
			resync() // the cursor moved on: the gap is announced now
		} else {
			cursor = missedFrom
		}
	}
	s.cursor.Store(cursor)
	if heldLive > 0 {
		// Before the lock is released: the next push must see them.
		q.addUnyielded(heldLive, heldBytes, 0)
	}
	b.stats.catchUpServed.Add(served)
	if cursor >= b.nextID {
		s.leaveCatchUpLocked()
		return dst, false
	}
	return dst, !full && served == 0
}

// sweepStalled evicts every subscriber catching up whose consumer has
// taken nothing for its stall bound (Subscribe calls it at the subscriber
// limit).
func (b *EventBus) sweepStalled() {
	now := b.now()
	var out []eviction
	b.mu.Lock()
	for i, s := range b.subs {
		if s.behind && s.stalledLocked(now, b.nextID-1) {
			out = append(out, eviction{s: s, reason: ReasonCatchUpStalled, id: s.dropCatchUpLocked(), counts: s.q.liveCounts(), bytes: -1})
			b.subs[i] = nil
			b.detachLocked(s)
		}
	}
	if out != nil {
		b.compactSubsLocked()
	}
	b.mu.Unlock()
	for _, ev := range out {
		b.emit(ev.s.evict(ev))
	}
}

// reached reports whether frames hold maxBytes of envelopes: a bounded take
// that stopped there may have left frames queued.
func reached(frames []Frame, maxBytes int) bool {
	n := 0
	for _, f := range frames {
		n += f.Size()
	}
	return n >= maxBytes
}

// takeBehind is take for a subscriber that is behind: its queue first
// (what was queued before it fell behind, forced frames, signals), then
// the ring, within its caps for the whole batch.
func (s *Subscription) takeBehind(dst []Frame, maxBytes int, sizes *[]int) (frames []Frame, open bool) {
	q := &s.q
	live0, bytes0 := q.popped()
	// The consumer declares itself waiting when its queue is empty even
	// though the ring fills its batch: a signal pushed meanwhile then
	// wakes it, whatever the ring gave.
	frames, open = q.take(dst, true, maxBytes, sizes)
	if open && !reached(frames[len(dst):], maxBytes) {
		// The queue is drained: the ring comes after it.
		var taken queueCounts
		if sizes == nil {
			// Returned to the caller, they count no more, but this batch
			// stays within the caps.
			live, bytes := q.popped()
			taken.liveCount = int(live - live0)
			taken.liveBytes = int(bytes - bytes0)
		}
		n := len(frames)
		frames = s.catchUp(frames, sizes, taken)
		s.holdRead(frames[n:])
	} else if sizes == nil {
		s.release() // the Events iterator releases it itself (see take)
	}
	return frames, open
}
