package eventbus

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// EventBus is one session's in-memory event bus. Create it with New (a
// backplane's replica makes its mirrors with backplane.NewMirror). The model, the ids and the ring are
// docs/SPEC.md sections 1 and 2; the queues and what a slow subscriber
// gets, section 3.
//
// An EventBus is safe for concurrent use by multiple goroutines. Publish
// never blocks on a subscriber and never panics. Close ends every
// subscription; the bus must not be copied. The zero EventBus is not
// usable but is safe: it behaves as a closed bus (Publish returns
// ErrClosed, Subscribe an ended subscription).
type EventBus struct {
	opts  Options
	epoch string

	mu     sync.Mutex
	nextID uint64
	ring   ring
	subs   []*Subscription
	closed bool
	// detached are the subscriptions unregistered with frames left for
	// their consumer (evicted, or closed with the bus), until it drains
	// them or cancels: an owner's budget counts what they hold
	// (hub_pins.go). Kept only on a bus with an owner.
	detached []*Subscription

	// Mirrors of guarded state, for lock-free reads.
	lastID     atomic.Uint64
	isClosed   atomic.Bool
	subscribed atomic.Int64

	stats counters
	enc   encoder // Publish's; its clock stamps synthetic frames too

	// owner is what the bus belongs to (owner.go): a Hub's session, a
	// shared log's feed (a mirror: newMirror), nil for a bus of its own. Set when the
	// bus is built, never changed.
	owner owner
}

// New returns an open bus configured by opts. It returns an error wrapping
// ErrInvalidOption when an option is invalid.
func New(opts Options) (*EventBus, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	b := new(EventBus)
	b.init(o, nil)
	return b, nil
}

// init makes b an open bus with options o (with defaults, validated) that
// belongs to own (nil: to nobody), in place: a Hub allocates a session and
// its bus as one.
func (b *EventBus) init(o Options, own owner) {
	*b = EventBus{
		opts:   o,
		epoch:  NewEpoch(),
		nextID: 1,
		ring:   newRing(o.RingSize, o.RingMaxBytes),
		enc:    encoder{maxEventBytes: o.MaxEventBytes, now: o.Now},
		owner:  own,
	}
}

// NewEpoch returns a new epoch token: 32 lowercase hex characters from
// crypto/rand. New gives every bus one; a backplane makes one per session
// log and hands it to backplane.NewMirror. It is safe for concurrent use.
func NewEpoch() string {
	var e [16]byte
	_, _ = rand.Read(e[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(e[:])
}

// Epoch returns the bus's epoch token: 32 lowercase hex characters from
// crypto/rand, different for every bus. A client that presents another
// epoch when resuming gets an epoch_reset resync (docs/SPEC.md section
// 4.2). It does not block.
func (b *EventBus) Epoch() string { return b.epoch }

// LastEventID returns the id of the last published event, 0 before the
// first publish. It does not block.
func (b *EventBus) LastEventID() uint64 { return b.lastID.Load() }

// SubscriberCount returns the number of live subscriptions. It does not
// block.
func (b *EventBus) SubscriberCount() int { return int(b.subscribed.Load()) }

// Close ends the bus: every subscription is closed with drain (its consumer
// receives what was queued, then the end), including subscriptions never
// iterated; afterwards Publish returns ErrClosed and Subscribe returns an
// ended subscription. Close is idempotent, does not block, and returns nil.
// Close and its two variants below are docs/SPEC.md section 2.5.
func (b *EventBus) Close() error { return b.close(nil) }

// closeWithError is Close for a bus that ends because something failed
// (backplane.CloseWithError, whose doc is the contract): every
// subscription receives what was queued, then a terminal stream_error
// frame {"error":message,"errorKind":kind}; its Err wraps ErrClosed and
// names kind and message. Only the first close of any kind counts.
func (b *EventBus) closeWithError(kind, message string) error {
	f := streamErrorFrame(message, kind, b.now())
	return b.close(&f)
}

// CloseForShutdown is Close for a bus that ends because its process, or
// its replica, is going away: every subscription receives what was queued,
// then a terminal stream_error {"error":...,"errorKind":"shutdown",
// "retryAfter":<ms>} (ErrorKindShutdown), which tells its client that the
// end is no failure and when to come back and resume (docs/SPEC.md section
// 5.2). retryAfter <= 0 means DefaultShutdownRetryAfter; it is sent in
// whole milliseconds, at least 1. A subscription's Err then wraps
// ErrClosed. Hub.Shutdown and Hub.Close close their buses this way. Like
// Close it is idempotent (only the first Close, CloseForShutdown or
// backplane.CloseWithError counts), does not block, and returns nil.
func (b *EventBus) CloseForShutdown(retryAfter time.Duration) error {
	f := shutdownFrame(retryAfter, b.now())
	return b.close(&f)
}

// StreamErrorFrame is the package's StreamErrorFrame stamped with the
// bus's clock (Options.Now), for a transport that ends a stream of this
// bus by itself (a lifetime that ended, a revocation). It does not touch
// the bus and is safe for concurrent use.
func (b *EventBus) StreamErrorFrame(msg, kind string) Frame {
	return streamErrorFrame(msg, kind, b.now())
}

// close is Close, with an optional terminal frame for every subscription.
func (b *EventBus) close(terminal *Frame) error {
	b.closeIf(terminal, nil)
	return nil
}

// closeIf is close when the bus is open and allow (nil: always), called
// under the lock, agrees: a Hub's idle expiry closes a bus only if nobody
// subscribed meanwhile. It returns the subscriptions it closed (with
// drain) and whether it closed the bus.
func (b *EventBus) closeIf(terminal *Frame, allow func() bool) ([]*Subscription, bool) {
	b.mu.Lock()
	if b.closed || allow != nil && !allow() {
		b.mu.Unlock()
		return nil, false
	}
	b.closed = true
	b.isClosed.Store(true)
	subs := b.subs
	b.subs = nil
	for _, s := range subs {
		b.detachLocked(s)
	}
	b.subscribed.Store(0)
	// A subscriber catching up had the ring for the rest of its queue. The
	// ring goes now, so it is told what it did not get: after its queued
	// frames, a ring_evicted resync from its cursor to the end.
	var missed []uint64
	for i, s := range subs {
		if s.behind {
			if missed == nil {
				missed = make([]uint64, len(subs))
			}
			missed[i] = s.dropCatchUpLocked()
		}
	}
	next := b.nextID
	b.ring.reset()
	b.ringChangedLocked(0)
	b.mu.Unlock()
	if b.owner != nil {
		b.owner.closed()
	}
	var why error
	if terminal != nil {
		why = fmt.Errorf("%w: %s", ErrClosed, terminal.JSON())
	}
	now := int64(0)
	for i, s := range subs {
		s.end(why)
		if missed != nil && missed[i] != 0 && missed[i] < next {
			if now == 0 {
				now = b.now()
			}
			if s.q.forcePush(resyncFrame(ReasonRingEvicted, "", missed[i]-1, next, b.epoch, now).ref()) {
				b.stats.resync(ReasonRingEvicted)
			}
		}
		if terminal != nil {
			s.q.forcePush(terminal.ref())
		}
		s.q.close(true)
		// The context stays watched while the consumer drains: a later
		// cancellation must still drop the buffer (SPEC 2.5). The consumer
		// releases it when it reaches the end.
	}
	return subs, true
}

// closedOrZero reports whether the bus is closed or was not made by New
// (the epoch is set by New and never changes, so reading it needs no lock).
func (b *EventBus) closedOrZero() bool { return b.isClosed.Load() || b.epoch == "" }

func (b *EventBus) logger() *slog.Logger {
	if b.opts.Logger != nil {
		return b.opts.Logger
	}
	return slog.Default()
}

// now returns the current Unix milliseconds for stamps and the overflow
// window: Options.Now when set, else the bus's wall clock.
func (b *EventBus) now() int64 { return b.enc.millis() }

// eviction is a subscriber rejected under the lock, ended after it.
type eviction struct {
	s      *Subscription
	reason string
	id     uint64
	counts queueCounts
	bytes  int // eventBytes for the bytes reason, else -1
}

// fanout collects what a publish decided under the lock and acts on after.
type fanout struct {
	// now is the publish's clock reading (Unix ms), read before the lock,
	// for the catch-up stall check; 0 when there was none (the fan-out
	// reads the clock itself then, if a subscriber is behind).
	now int64
	// lists holds the diagnostics and evictions, from listsPool, nil if
	// none.
	lists *fanoutLists
	// warning is the last warning frame built (see checkWarningLocked).
	warning warningCache
	// yield is the publisher's yield after the lock (see yield.go).
	yield yieldPlan
	// wake holds the queues whose consumers push reported waiting, woken
	// by finish (see boundedAsyncQueue.push); from wakePool, nil if none.
	wake *[]*boundedAsyncQueue
}

// fanoutLists are a fan-out's diagnostics and evictions. They are pooled:
// a publish that evicts 200 subscribers would otherwise grow them under
// the lock, allocating as it goes.
type fanoutLists struct {
	notes   []diagNote
	evicted []eviction
}

// diagNote is a diagnostic the fan-out decided on under the lock: a
// warning, kept as its numbers (threshold set) so that its Diagnostic is
// built after the lock, or another one, built already (d).
type diagNote struct {
	d         Diagnostic
	threshold string
	counts    queueCounts
	id        uint64
}

var listsPool = sync.Pool{New: func() any { return new(fanoutLists) }}

// list returns out's lists, taking them from the pool on first use.
func (out *fanout) list() *fanoutLists {
	if out.lists == nil {
		out.lists = listsPool.Get().(*fanoutLists)
	}
	return out.lists
}

// addDiag adds a diagnostic built under the lock.
func (out *fanout) addDiag(d Diagnostic) {
	l := out.list()
	l.notes = append(l.notes, diagNote{d: d})
}

// addEviction adds a subscriber that the fan-out unregistered, for finish
// to end.
func (out *fanout) addEviction(ev eviction) {
	l := out.list()
	l.evicted = append(l.evicted, ev)
}

// addWake adds q to the consumers finish wakes.
func (out *fanout) addWake(q *boundedAsyncQueue) {
	if out.wake == nil {
		out.wake = wakePool.Get().(*[]*boundedAsyncQueue)
	}
	*out.wake = append(*out.wake, q)
}

// wakePool recycles fanout.wake lists, so a publish allocates nothing for
// them at any subscriber count.
var wakePool = sync.Pool{New: func() any { return new([]*boundedAsyncQueue) }}

// Publish assigns the event the next id, appends it to the ring and queues
// it for every subscriber whose filter matches, and returns the stamped
// frame. It encodes the event once, outside the bus lock; the frame's bytes
// are shared by the ring and every subscriber (docs/SPEC.md section 2.1;
// the envelope is section 5.1).
//
// Publish never blocks on a subscriber and never panics. It returns an
// error wrapping ErrInvalidEvent for an empty type, a type with CR or LF or
// longer than MaxTypeLen, a type reserved for the synthetic frames
// (ReservedTypes), or data or metadata that cannot be encoded (the
// diagnostic is logged too; Stats counts it in Rejected.Invalid), an
// error wrapping ErrEventTooLarge above MaxEventBytes, backplane.ErrMirror
// for a valid event on a backplane's mirror (backplane.NewMirror), and
// ErrClosed after Close. A rejected
// event uses no id and reaches nobody.
func (b *EventBus) Publish(e Event) (Frame, error) {
	if b.closedOrZero() {
		b.stats.rejClosed.Add(1)
		return Frame{}, ErrClosed
	}
	p, err := b.enc.encode(e, b.lastID.Load()+1)
	if err != nil {
		b.rejected(e.Type, err)
		return Frame{}, err
	}
	now := p.now
	if now == 0 && b.opts.MaxAge > 0 {
		now = b.now()
	}
	var reserved int64
	if b.owner != nil {
		// Before the lock: a Hub stamps the session's use and makes room
		// in its budget here, where it may take other buses' locks.
		if reserved, err = b.owner.publishing(p.maxSize(), now); err != nil {
			return Frame{}, err
		}
	}

	out := fanout{now: p.now}
	// The frame is shared by the ring and every queue. Allocate it before
	// the lock: an allocation can stall on GC assist, and nobody should
	// wait on the lock for that.
	f := new(frame)
	b.mu.Lock()
	if b.closed {
		b.ringChangedLocked(reserved) // the owner takes its reservation back
		b.mu.Unlock()
		b.stats.rejClosed.Add(1)
		return Frame{}, ErrClosed
	}
	id := b.nextID
	b.nextID++
	*f = p.build(id)
	f.at = now
	if b.opts.MaxAge > 0 {
		b.ring.dropOlder(now - b.opts.MaxAge.Milliseconds())
	}
	b.ring.append(f)
	if b.owner != nil {
		b.owner.ringChangedLocked(reserved) // a Hub settles with its budget
	}
	b.storeRingStatsLocked()
	// Before the fan-out: a consumer catching up reads the ring up to it
	// without the lock, and either it sees this id or the fan-out sees it
	// waiting (see catchUpFast).
	b.lastID.Store(id)
	b.stats.published.Add(1)
	b.fanOutLocked(f, id, &out)
	b.mu.Unlock()

	b.finish(&out)
	return Frame{f}, nil
}

// Signal publishes a change signal: a type and the resource it is about,
// without data and without an id. A signal never enters the ring and is
// never replayed (a reconnecting client refetches); a queued, undelivered
// signal with the same (type, about) is replaced in place by the newer one,
// so it can reach a client before events published after the one it
// replaced. The rules are docs/SPEC.md section 3.8.
//
// Signal never blocks and never panics. It returns an error wrapping
// ErrInvalidEvent for an invalid type (as Publish's, a reserved one
// included), ErrEventTooLarge above MaxEventBytes, and ErrClosed after
// Close.
func (b *EventBus) Signal(typ, about string) error {
	if b.closedOrZero() {
		b.stats.rejClosed.Add(1)
		return ErrClosed
	}
	f, err := b.enc.signal(typ, about)
	if err != nil {
		b.rejected(typ, err)
		return err
	}
	if b.owner != nil {
		b.owner.used() // a signal is a use of the session too
	}
	var out fanout // the fan-out reads the clock if a subscriber is behind
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		b.stats.rejClosed.Add(1)
		return ErrClosed
	}
	b.stats.signals.Add(1)
	b.fanOutLocked(f, b.nextID-1, &out)
	b.mu.Unlock()
	b.finish(&out)
	return nil
}

// ringChangedLocked is called under the lock whenever the ring changed:
// it tells the owner (see owner.ringChangedLocked; reserved is what its
// publishing reserved for the frame just appended, else 0), which may drop
// more of the ring, then mirrors the ring's size for Stats.
func (b *EventBus) ringChangedLocked(reserved int64) {
	if b.owner != nil {
		b.owner.ringChangedLocked(reserved)
	}
	b.storeRingStatsLocked()
}

// storeRingStatsLocked mirrors the ring's size for Stats.
func (b *EventBus) storeRingStatsLocked() {
	b.stats.ringLen.Store(int64(b.ring.Len()))
	b.stats.ringBytes.Store(int64(b.ring.Bytes()))
}

// rejected counts and reports a publish that failed before the lock.
func (b *EventBus) rejected(typ string, err error) {
	if errors.Is(err, ErrEventTooLarge) {
		b.stats.rejTooLarge.Add(1)
	} else {
		b.stats.rejInvalid.Add(1)
	}
	b.emit(Diagnostic{DiagPublishRejected, "eventbus: publish rejected", []slog.Attr{
		slog.String("type", truncate(typ, 64)), slog.String("error", err.Error())}})
}

// fanOutLocked pushes f to every subscriber whose filter matches, in
// subscription order. lastID is the id of f, or for a signal the last id
// published. Accepted pushes run the warning check; rejected ones follow
// the subscriber's overflow policy; evicted subscribers are unregistered
// here and ended by finish. A subscriber catching up costs a flag test:
// f is in the ring, where its consumer will read it (see catchUp).
func (b *EventBus) fanOutLocked(f *frame, lastID uint64, out *fanout) {
	removed := false
	now := out.now
	for i, s := range b.subs {
		if s.behind && !s.rejoinLocked(f) {
			if s.q.claimWake() {
				// Its consumer read up to the last id it saw and waits:
				// f is for it to read from the ring.
				out.addWake(&s.q)
			}
			if now == 0 {
				now = b.now()
			}
			if s.stalledLocked(now, b.nextID-1) {
				out.addEviction(eviction{s: s, reason: ReasonCatchUpStalled, id: s.dropCatchUpLocked(), counts: s.q.liveCounts(), bytes: -1})
				b.subs[i] = nil
				b.detachLocked(s)
				removed = true
				continue
			}
			if f.kind != kindSignal || !s.filter.match(f.typ) {
				continue // f is in the ring, for its consumer to read
			}
			// Signals are not in the ring: one that the caps take goes
			// live (it may then reach the consumer ahead of ring events
			// published before it, like a coalesced one); otherwise it is
			// dropped and counted.
		} else if !s.filter.match(f.typ) {
			continue
		}
		res, c, wake := s.q.push(f)
		if wake {
			out.addWake(&s.q)
		}
		switch res {
		case pushAccepted:
			// Almost every push leaves a subscriber below its warning
			// threshold and unwarned: then there is nothing to check. The
			// test is inline because setting up checkWarningLocked's
			// frame, sized for building a diagnostic, cost more than the
			// push itself (8-10% of the profiles at 1 and 1000
			// subscribers; docs/bench/NOTES.md, item 15).
			if !s.warned && !s.anyPastWarning(c) {
				continue
			}
			if th := s.checkWarningLocked(c, lastID, &out.warning); th != "" {
				l := out.list()
				l.notes = append(l.notes, diagNote{threshold: th, counts: c, id: lastID})
			}
			out.yield.note(s, c)
		case pushCoalesced:
			b.stats.dropCoalesced.Add(1)
		case pushRejectedFrames, pushRejectedBytes:
			if s.behind {
				b.stats.dropCatchUpSignal.Add(1)
				continue
			}
			if s.policy == OverflowCatchUp {
				if now == 0 {
					now = b.now()
				}
				s.enterCatchUpLocked(f, lastID, now)
				if s.q.claimWake() {
					// A hand-over whose push the caps rejected (its
					// consumer had reserved them for a read the hand-over
					// cut short): it waits, and f is in the ring for it.
					out.addWake(&s.q)
				}
				continue
			}
			ev := eviction{s: s, reason: res.reason(), id: lastID, counts: c, bytes: -1}
			if res == pushRejectedBytes {
				ev.bytes = f.size()
			}
			if s.policy == OverflowResync {
				if d, ok := s.overflowResyncLocked(f, res, lastID); ok {
					out.addDiag(d)
					continue
				}
				ev.reason, ev.bytes = ReasonRepeatedOverflow, -1
			}
			out.addEviction(ev)
			b.subs[i] = nil
			b.detachLocked(s)
			removed = true
		}
	}
	if removed {
		b.compactSubsLocked()
	}
}

// finish wakes the consumers a publish queued frames for, ends the
// subscribers it evicted, emits its diagnostics and yields the processor
// if its plan says so (see yield.go), after the lock is released.
//
// Evictions come before any diagnostic, so that a slow logger does not
// delay the end of a stream, and evictions with the same numbers share
// one client_evicted frame: when a publish evicts 200 subscribers that
// never read, they all overflowed on the same event with the same counts.
func (b *EventBus) finish(out *fanout) {
	if w := out.wake; w != nil {
		for _, q := range *w {
			q.wake()
		}
		clear(*w)
		*w = (*w)[:0]
		wakePool.Put(w)
	}
	if l := out.lists; l != nil {
		var last *eviction
		var term *frame
		now := int64(0)
		for i := range l.evicted {
			ev := &l.evicted[i]
			if last == nil || !ev.sameTerminal(last) {
				if now == 0 {
					now = b.now()
				}
				term = evictedFrame(ev.reason, ev.id, ev.counts, ev.bytes, now).ref()
				last = ev
			}
			ev.s.evictWith(*ev, term)
		}
		for i := range l.notes {
			n := &l.notes[i]
			if n.threshold != "" {
				b.emit(slowClientDiagnostic(n.counts, n.id, n.threshold))
			} else {
				b.emit(n.d)
			}
		}
		for i := range l.evicted {
			b.emit(l.evicted[i].diagnostic())
		}
		// Pooled lists must not pin subscriptions or attributes; a huge one
		// is left to the collector.
		if cap(l.notes)+cap(l.evicted) <= 1024 {
			clear(l.notes)
			clear(l.evicted)
			l.notes, l.evicted = l.notes[:0], l.evicted[:0]
			listsPool.Put(l)
		}
	}
	out.yield.run()
}

// compactSubsLocked removes the nil slots Publish left for evicted
// subscribers, keeping subscription order.
func (b *EventBus) compactSubsLocked() {
	n := 0
	for _, s := range b.subs {
		if s != nil {
			b.subs[n] = s
			n++
		}
	}
	clear(b.subs[n:])
	b.subs = b.subs[:n]
	b.subscribed.Store(int64(n))
	b.leftLocked()
}

// leftLocked tells the owner when the last subscriber has left: a Hub's
// session starts its idle time then.
func (b *EventBus) leftLocked() {
	if b.owner != nil && len(b.subs) == 0 {
		b.owner.used()
	}
}

// addLocked registers s.
func (b *EventBus) addLocked(s *Subscription) {
	b.subs = append(b.subs, s)
	n := int64(len(b.subs))
	b.subscribed.Store(n)
	if n > b.stats.peak.Load() {
		b.stats.peak.Store(n)
	}
}

// detachLocked records s, just unregistered with frames left to drain,
// as a holder until it drains them (see detached).
func (b *EventBus) detachLocked(s *Subscription) {
	if b.owner != nil {
		b.detached = append(b.detached, s)
	}
}

// undetachLocked forgets s as a holder, if it was one, and tells the
// owner.
func (b *EventBus) undetachLocked(s *Subscription) {
	if i := slices.Index(b.detached, s); i >= 0 {
		b.detached = slices.Delete(b.detached, i, i+1)
		b.owner.releasedLocked()
	}
}

// drained is called when s's consumer has taken its last frame: it holds
// nothing more in the queue.
func (b *EventBus) drained(s *Subscription) {
	if b.owner == nil {
		return
	}
	b.mu.Lock()
	b.undetachLocked(s)
	b.mu.Unlock()
}

// removeLocked unregisters s, keeping subscription order. It reports whether
// s was registered.
func (b *EventBus) removeLocked(s *Subscription) bool {
	for i, x := range b.subs {
		if x == s {
			s.dropCatchUpLocked()
			copy(b.subs[i:], b.subs[i+1:])
			b.subs[len(b.subs)-1] = nil
			b.subs = b.subs[:len(b.subs)-1]
			b.subscribed.Store(int64(len(b.subs)))
			b.leftLocked()
			return true
		}
	}
	return false
}
