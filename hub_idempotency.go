package eventbus

import (
	"errors"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Idempotent publish on a Hub (Hub.PublishIdempotent): each session keeps
// the idempotency keys of its bus's publishes, and the Hub's byte budget
// counts them (docs/SPEC.md sections 7 and 8.3).
//
// A session's records form a list, oldest first (the order in which the
// window and the cap forget them), each record one object, and, past
// idemLinear records, an index: an open-addressing table of pointers to
// them, at most half full after an insert and at least an eighth full
// after a removal (else it is made again at a quarter), dropped again at
// idemLinear/2 records. So what a record holds is bounded whatever its
// session's history: its object (64 bytes), its key (cloned, in an object
// of at most its length rounded up to 16), and at most 8 index slots of 8
// bytes. The budget counts each record at that bound, idemCost: 128 bytes
// plus its key rounded up to 16 (176 for a UUID). A session with no record
// holds nothing but the store's fixed fields in its hubSession. Measured
// in the heap after a collection (TestHubIdempotencyCostMeasured, and
// TestHubIdempotencyIssueMeasurement: 25,600 UUID keys over 100 sessions),
// a record holds 96 bytes plus its key's copy at 256 records a session,
// 144 with a UUID, and at no fill more than idemCost.

// Defaults of a Hub's idempotency keys (HubOptions).
const (
	// DefaultIdempotencyWindow is how long a Hub's session remembers an
	// idempotency key after its first publish, as the backplanes'
	// DefaultIdempotencyWindow.
	DefaultIdempotencyWindow = 10 * time.Minute
	// DefaultMaxIdempotencyKeys is the most idempotency keys a Hub's
	// session remembers; past it the oldest is forgotten first.
	DefaultMaxIdempotencyKeys = 256
)

// What the budget counts for a record (see idemCost), and the index.
const (
	// idemRecordBytes is a record's object: idemRecord is 64 bytes on
	// 64-bit, a size class of its own.
	idemRecordBytes = 64
	// idemIndexBytes is a record's share of its session's index at most:
	// 8 slots of a pointer each (the index is at least an eighth full).
	idemIndexBytes = 64
	// idemLinear is the most records a session holds without an index: a
	// lookup walks them.
	idemLinear = 8
	// idemMinSlots is the smallest index, plus one (see reindexLocked).
	idemMinSlots = 32
)

// idemCost is what the budget counts for the record of key: its object,
// its share of the index at most, and its key's bytes rounded up to 16,
// at least what the allocator gives a string of that length (up to
// MaxIdempotencyKeyBytes). Measured: TestHubIdempotencyCostMeasured.
func idemCost(key string) int64 {
	return idemRecordBytes + idemIndexBytes + int64(len(key)+15)&^15
}

// idemRecord is one key of a session: its first publish's id and the
// fingerprint of its event.
type idemRecord struct {
	key  string
	hash uint64 // of key, with the hub's seed
	id   uint64
	at   int64 // Unix ms of the first publish
	fp   [16]byte
	next *idemRecord // the next newer record
}

// idemStore is a session's idempotency records. Everything but the atomics
// is under mu, which Hub.PublishIdempotent holds across its lookup, its
// bus's Publish and its record (never under the bus lock: mu comes first).
// The budget's reclaim only ever TryLocks it.
type idemStore struct {
	mu         sync.Mutex
	head, tail *idemRecord // oldest, newest
	n          int
	index      []*idemRecord // nil up to idemLinear records; len a power of 2 less 1
	// keys and bytes mirror n and what the records cost (idemCost), and
	// oldest the head's at (0: none), for Stats, the sweep and the budget
	// to read without mu.
	keys, bytes, oldest atomic.Int64
}

// findLocked returns the record of key, whose hash is hash, or nil.
func (st *idemStore) findLocked(key string, hash uint64) *idemRecord {
	if st.index == nil {
		for r := st.head; r != nil; r = r.next {
			if r.key == key {
				return r
			}
		}
		return nil
	}
	n := uint64(len(st.index))
	for i := hash % n; st.index[i] != nil; i = (i + 1) % n {
		if r := st.index[i]; r.hash == hash && r.key == key {
			return r
		}
	}
	return nil
}

// pushLocked appends r, the newest record, and counts its cost.
func (st *idemStore) pushLocked(r *idemRecord, cost int64) {
	if st.tail == nil {
		st.head = r
		st.oldest.Store(r.at)
	} else {
		st.tail.next = r
	}
	st.tail = r
	st.n++
	switch {
	case st.index != nil && st.n > (len(st.index)+1)/2:
		st.reindexLocked()
	case st.index != nil:
		st.insertLocked(r)
	case st.n > idemLinear:
		st.reindexLocked()
	}
	st.keys.Store(int64(st.n))
	st.bytes.Add(cost)
}

// popLocked forgets the oldest record and returns what it cost.
func (st *idemStore) popLocked() int64 {
	r := st.head
	st.head = r.next
	r.next = nil
	if st.head == nil {
		st.tail = nil
		st.oldest.Store(0)
	} else {
		st.oldest.Store(st.head.at)
	}
	st.n--
	switch {
	case st.index == nil:
	case st.n <= idemLinear/2:
		st.index = nil
	case len(st.index)+1 > idemMinSlots && st.n < (len(st.index)+1)/8:
		st.reindexLocked()
	default:
		st.deleteLocked(r)
	}
	cost := idemCost(r.key)
	st.keys.Store(int64(st.n))
	st.bytes.Add(-cost)
	return cost
}

// clearLocked forgets every record and returns what they cost.
func (st *idemStore) clearLocked() int64 {
	cost := st.bytes.Load()
	for r := st.head; r != nil; {
		next := r.next
		r.next = nil
		r = next
	}
	st.head, st.tail, st.n, st.index = nil, nil, 0, nil
	st.keys.Store(0)
	st.bytes.Store(0)
	st.oldest.Store(0)
	return cost
}

// reindexLocked makes the index again for n records: the smallest power
// of 2 of at least 4n, idemMinSlots at least, less one slot (at most a
// quarter full, at most 8 slots per record). One less than a power of 2:
// an array of pointers larger than 512 bytes carries an 8-byte header,
// which would take a power of 2 of them into the next size class (2048
// bytes into 2304, and 32 KiB into 40 KiB); this way it fills its class.
func (st *idemStore) reindexLocked() {
	size := idemMinSlots
	for size < 4*st.n {
		size *= 2
	}
	st.index = make([]*idemRecord, size-1)
	for r := st.head; r != nil; r = r.next {
		st.insertLocked(r)
	}
}

// insertLocked puts r in the index (linear probing).
func (st *idemStore) insertLocked(r *idemRecord) {
	n := uint64(len(st.index))
	i := r.hash % n
	for st.index[i] != nil {
		i = (i + 1) % n
	}
	st.index[i] = r
}

// deleteLocked takes r out of the index, shifting back the records after
// it in its probe run so that no lookup stops short of them.
func (st *idemStore) deleteLocked(r *idemRecord) {
	n := uint64(len(st.index))
	i := r.hash % n
	for st.index[i] != r {
		i = (i + 1) % n
	}
	for j := i; ; {
		j = (j + 1) % n
		q := st.index[j]
		if q == nil {
			break
		}
		// q stays when its home slot lies cyclically in (i, j].
		if home := q.hash % n; (j+n-home)%n < (j+n-i)%n {
			continue
		}
		st.index[i] = q
		i = j
	}
	st.index[i] = nil
}

// PublishIdempotent is Publish with an idempotency key: within
// IdempotencyWindow (from its first publish) a key already used on the
// session's bus (its epoch) with the same event (the fingerprint of every
// backplane's idempotent publish too: backplane.Encoder.Fingerprint)
// appends nothing and returns the first publish's id, with duplicate true;
// used with another event, it returns an error wrapping
// ErrIdempotencyKeyReused and appends nothing. Otherwise it publishes e,
// creating the session if needed (see GetOrCreate), and records the key.
// It returns the event's id and the epoch of the bus that holds it (for a
// duplicate the first publish's, whose frame may have left the ring).
//
// The lookup, the publish and the record are atomic per session: two
// concurrent publishes with one key append once. They hold the session's
// idempotency lock (never a hub-wide one), taken before the bus lock and
// never under it, so PublishIdempotent never blocks: it may wait for that
// lock, which another PublishIdempotent of the session holds across one
// Publish (which never blocks), and the sweep or the bus's close only to
// forget records. A new bus of the session (after Delete, idle expiry, or
// its owner's Close) forgets its keys; a session keeps at most
// MaxIdempotencyKeys of them, forgetting the oldest first, and the byte
// budget may forget the oldest sooner (docs/SPEC.md section 7).
//
// It returns CheckSessionID's error (ErrInvalidSessionID),
// CheckIdempotencyKey's (ErrInvalidIdempotencyKey) and the error Publish
// would return for an invalid event (ErrInvalidEvent, ErrEventTooLarge),
// all before creating anything, then what GetOrCreate (ErrHubFull,
// ErrClosed) and EventBus.Publish return; on any error nothing is
// recorded. Like Publish, it retries once on a new bus when the session
// ended between its lookup and its publish.
func (h *Hub) PublishIdempotent(id, key string, e Event) (eventID uint64, epoch string, duplicate bool, err error) {
	if err := CheckSessionID(id); err != nil {
		return 0, "", false, err
	}
	if err := CheckIdempotencyKey(key); err != nil {
		return 0, "", false, err
	}
	fp, err := h.enc.fingerprint(e)
	if err != nil {
		return 0, "", false, err
	}
	for retried := false; ; retried = true {
		s, err := h.getOrCreate(id)
		if err != nil {
			return 0, "", false, err
		}
		eventID, duplicate, err = s.publishIdempotent(key, fp, e)
		if errors.Is(err, ErrClosed) && !retried && !h.closed.Load() {
			continue
		}
		if err != nil {
			return 0, "", false, err
		}
		return eventID, s.bus.epoch, duplicate, nil
	}
}

// publishIdempotent is PublishIdempotent on s's bus, for an event of
// fingerprint fp. It returns ErrClosed when the bus is closed.
func (s *hubSession) publishIdempotent(key string, fp [16]byte, e Event) (uint64, bool, error) {
	h := s.hub
	bg := h.budget
	st := &s.idem
	hash := maphash.String(h.seed, key)
	now := h.nowMillis()
	st.mu.Lock()
	// Under mu: once closed() has forgotten the records, none is looked
	// up or made again (Publish would refuse too).
	if s.bus.isClosed.Load() {
		st.mu.Unlock()
		return 0, false, ErrClosed
	}
	s.expireLocked(now)
	if r := st.findLocked(key, hash); r != nil {
		first, same := r.id, r.fp == fp
		st.mu.Unlock()
		if !same {
			return 0, false, fmt.Errorf("%w: the key's first publish has id %d", ErrIdempotencyKeyReused, first)
		}
		return first, true, nil
	}
	// The record is counted before the publish, so that the publish's own
	// admission to the budget sees it.
	cost := idemCost(key)
	bg.used.Add(cost)
	f, err := s.bus.Publish(e)
	if err != nil {
		bg.used.Add(-cost)
		st.mu.Unlock()
		return 0, false, err
	}
	for st.n >= h.idemMax {
		bg.giveBackRecords(st.popLocked())
	}
	st.pushLocked(&idemRecord{key: strings.Clone(key), hash: hash, id: f.ID(), at: now, fp: fp}, cost)
	bg.records.Add(cost)
	st.mu.Unlock()
	if bg.used.Load()+bg.unshedPins() > bg.max {
		// As a ring's growth: the budget makes room, and when another trim
		// runs (or it could not take enough), the session gives back from
		// its own ring, then its own records, as a publish's settle does.
		bg.reclaim()
		if over := bg.used.Load() - bg.max; over > 0 {
			if freed := bg.trim(s, 0, over); freed < over {
				s.forgetRecords(0, over-freed, false)
			}
		}
	}
	return f.ID(), false, nil
}

// expireLocked forgets the records older than the window at now.
func (s *hubSession) expireLocked(now int64) {
	st := &s.idem
	deadline := now - s.hub.idemWindow
	for st.head != nil && st.head.at <= deadline {
		s.hub.budget.giveBackRecords(st.popLocked())
	}
}

// expireRecords is expireLocked for the sweep, which skips a session
// whose oldest record is within its window without taking its lock.
func (s *hubSession) expireRecords(now int64) {
	if o := s.idem.oldest.Load(); o == 0 || o > now-s.hub.idemWindow {
		return
	}
	s.idem.mu.Lock()
	s.expireLocked(now)
	s.idem.mu.Unlock()
}

// forgetRecords forgets s's oldest records while they cost more than
// level and less than limit was freed, and returns what it freed. With
// try set (the budget's reclaim) it does nothing when the session's lock
// is taken: its holder may be a publish of this session under which the
// budget runs.
func (s *hubSession) forgetRecords(level, limit int64, try bool) (freed int64) {
	st := &s.idem
	if try {
		if !st.mu.TryLock() {
			return 0
		}
	} else {
		st.mu.Lock()
	}
	for st.head != nil && st.bytes.Load() > level && freed < limit {
		freed += st.popLocked()
	}
	st.mu.Unlock()
	s.hub.budget.giveBackRecords(freed)
	return freed
}

// clearRecords forgets every record of s, whose bus closed (the owner's
// closed hook). No record is added after it: PublishIdempotent finds the
// bus closed under the same lock.
func (s *hubSession) clearRecords() {
	st := &s.idem
	st.mu.Lock()
	freed := st.clearLocked()
	st.mu.Unlock()
	s.hub.budget.giveBackRecords(freed)
}
