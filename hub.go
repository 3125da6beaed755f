package eventbus

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"iter"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Hub defaults.
const (
	// DefaultMaxSessions is a hub's session cap.
	DefaultMaxSessions = 1000
	// DefaultIdleTimeout is how long a session may go without a publish
	// and without a subscriber before its hub closes it.
	DefaultIdleTimeout = 10 * time.Minute
	// DefaultMaxTotalBytes bounds the sum of every session's ring bytes
	// and idempotency records.
	DefaultMaxTotalBytes = 256 << 20
)

// ErrHubFull is returned by Hub.GetOrCreate (and Hub.Publish) for a new
// session when the hub holds MaxSessions sessions and none of them is idle
// past IdleTimeout. Daemons answer 503 too_many_sessions with Retry-After.
var ErrHubFull = errors.New("eventbus: hub is full")

// HubOptions configures a Hub. The zero value is valid: every field that is
// 0 takes its default.
type HubOptions struct {
	// Bus is every session's bus options, validated by NewHub as New
	// validates them. Bus.Logger nil means Logger.
	Bus Options
	// MaxSessions caps the live sessions; 0 means DefaultMaxSessions,
	// negative is an error.
	MaxSessions int
	// IdleTimeout is how long a session may have no subscriber and no
	// publish (or signal) before the hub closes and forgets it, counted
	// from the later of its last publish and its last subscriber leaving;
	// 0 means DefaultIdleTimeout, negative means sessions never expire.
	IdleTimeout time.Duration
	// MaxTotalBytes bounds the sum of every session's ring bytes, of what
	// subscribers hold beyond the rings (frames a ring dropped that a queue
	// or a transport's batch still holds) and of the sessions' idempotency
	// records (PublishIdempotent: 128 bytes each plus its key rounded up
	// to 16, an upper bound of what one holds), counting what each frame
	// costs in memory, not only its envelope as Options.RingMaxBytes does
	// (Frame.Size): its buffer with the whole SSE encoding and room for a
	// longer id, the type string kept beside it, its header and ring slot,
	// at most 2*MaxTypeLen+156 bytes (668 on 64-bit) more than its envelope
	// (docs/SPEC.md sections 1.3 and 7); 0 means DefaultMaxTotalBytes.
	// Negative, or too small for one event of Bus.MaxEventBytes with the
	// longest type, is an error.
	MaxTotalBytes int64
	// Logger receives the hub's diagnostics; nil means slog.Default().
	Logger *slog.Logger
	// ShutdownRetryAfter is the retryAfter of the stream_error shutdown
	// that Shutdown and Close give every stream after what was queued for
	// it (see EventBus.CloseForShutdown): its clients come back after at
	// least that long. 0 means DefaultShutdownRetryAfter; negative is an
	// error.
	ShutdownRetryAfter time.Duration
	// IdempotencyWindow is how long a session remembers an idempotency
	// key of PublishIdempotent after its first publish; 0 means
	// DefaultIdempotencyWindow, negative is an error.
	IdempotencyWindow time.Duration
	// MaxIdempotencyKeys is the most idempotency keys a session remembers:
	// a new key forgets the oldest first when it holds that many. 0 means
	// DefaultMaxIdempotencyKeys, negative is an error.
	MaxIdempotencyKeys int
}

// HubStats is a snapshot of a hub's counters, read field by field without
// a common lock.
type HubStats struct {
	Sessions int // live sessions now
	// RingBytes is the sum of every ring's bytes now, as the budget
	// counts them (see MaxTotalBytes): more than Buses.RingBytes, which
	// counts envelopes (Frame.Size), by at most 668 bytes per frame on
	// 64-bit. With PinnedBytes and IdempotencyBytes, at most MaxTotalBytes.
	RingBytes     int64
	MaxTotalBytes int64
	Created       uint64 // sessions created since NewHub
	Expired       uint64 // closed by idle expiry
	Deleted       uint64 // closed by Delete
	Refused       uint64 // GetOrCreate answered ErrHubFull
	BudgetTrimmed uint64 // events removed from rings to keep MaxTotalBytes
	// PinnedBytes is what subscribers hold beyond their sessions' rings
	// now (frames the rings dropped that a queue or a transport's batch
	// still holds), as the budget counts it: an upper bound, itself
	// counted against MaxTotalBytes (docs/SPEC.md section 7).
	PinnedBytes int64
	// BudgetShed counts the subscribers the budget acted on for what they
	// pinned: evicted (memory_budget), put behind under OverflowCatchUp,
	// or their draining frames dropped.
	BudgetShed uint64
	// IdempotencyKeys is the number of idempotency keys the live sessions
	// remember now (PublishIdempotent), and IdempotencyBytes what the
	// budget counts for them (see MaxTotalBytes).
	IdempotencyKeys  int
	IdempotencyBytes int64
	// Buses sums the buses' Stats. Its counters cover every bus since
	// NewHub (one that ended counts as it was when the hub let it go), so
	// they never go down; its current values (Subscribers, CatchUp.Behind,
	// RingLen, RingBytes, and PeakSubscribers, the sum of each session's
	// peak) cover the live buses only.
	Buses Stats
}

// Hub holds a daemon's per-session buses, keyed by session id: lookup
// without creating (a GET for an unknown session is a 404, never a new
// bus), get-or-create where the embedder decides (on publish), a session
// cap, idle expiry, idempotent publish (PublishIdempotent), one byte
// budget over every ring and every idempotency record, and graceful
// shutdown. The rules are docs/SPEC.md section 7.
//
// A session with no subscriber and no publish for IdleTimeout is closed
// and forgotten; one that has a subscriber never expires. One goroutine,
// owned by the hub and ended by Close or Shutdown, sweeps the sessions; no
// goroutine runs per session. A session's next use after expiry makes a
// new bus with a new epoch, so a resume across it gets epoch_reset. The
// sum of every ring's bytes and every idempotency record's never exceeds
// MaxTotalBytes; a publish that takes it over trims the oldest events of
// the largest rings, each under its own bus lock, and never blocks for
// it; a resume that lost events to it gets ring_evicted with exact ids.
// Only when the rings are empty does it forget idempotency records, the
// oldest of the sessions that hold the most. A session's records go with
// its bus (Delete, idle expiry, Shutdown, Close). The budget also counts
// what subscribers hold beyond the rings, however many streams hold it:
// when that takes it over, the subscribers holding the oldest frames are
// put behind (OverflowCatchUp) or evicted (client_evicted memory_budget)
// first, and no ring is trimmed for them (docs/SPEC.md section 7).
//
// A Hub is safe for concurrent use. Lookup and the publish path of one
// session take no hub-wide lock (the sessions are sharded); a bus's own
// Publish takes only its bus lock. The zero Hub is not usable: make one
// with NewHub, and end it with Shutdown or Close.
//
// A daemon shuts its HTTP server and its Hub down in this order, within
// one deadline (docs/hub.md, "Shutting down", says why): http.Server.Shutdown
// closes the listeners; then Shutdown runs beside it (register it with
// http.Server.RegisterOnShutdown), so every stream writes what was queued
// and a stream_error shutdown, and ends, which is what the server's
// Shutdown waits for; when that returns the deadline's error,
// http.Server.Close closes the connections left (a client that does not
// read); then the daemon waits for Shutdown to return.
type Hub struct {
	opts        Options // every bus's, with defaults
	maxSessions int64
	retryAfter  time.Duration // of the shutdown frame; 0: the default
	idle        int64         // ms; <= 0: never
	logger      *slog.Logger
	budget      *budget
	enc         encoder // for the fingerprints of PublishIdempotent
	idemWindow  int64   // ms
	idemMax     int

	seed   maphash.Seed
	shards [hubShards]hubShard
	n      atomic.Int64 // sessions in the map
	closed atomic.Bool

	sweepMu sync.Mutex // one sweep at a time (the goroutine's, a full GetOrCreate's)
	// nextEligible is a lower bound, in Unix ms, of when a session can
	// next be idle past IdleTimeout (set by each sweep): before it, a full
	// GetOrCreate knows a sweep would free nothing and answers ErrHubFull
	// without one, so a flood of new sessions against a full hub costs no
	// scan per request.
	nextEligible atomic.Int64

	created, expired, deleted, refused atomic.Uint64

	// retireMu orders a session leaving the map, its counters moving to
	// ended, against Stats, so that the summed counters never go down.
	// Taken before a shard lock; on no publish path.
	retireMu sync.RWMutex
	ended    Stats // the counters of the buses no longer held, as they left

	stop     chan struct{} // closed by Close/Shutdown; nil without a goroutine
	done     chan struct{} // closed when the goroutine has ended
	stopOnce sync.Once
}

// hubShards spreads the sessions over locks, so that lookups and creations
// of different sessions rarely meet.
const hubShards = 64

type hubShard struct {
	mu sync.RWMutex
	m  map[string]*hubSession
	_  [40]byte // a shard per cache line
}

// hubSession is one session of a hub: its bus, and what the hub keeps of
// it. It is the bus's owner (owner.go), the one way the bus reaches its
// hub: Publish stamps the session's use and settles its frame with the
// budget (hub_budget.go) through it. One allocation holds both.
type hubSession struct {
	bus EventBus
	hub *Hub
	// activity is the Unix ms of the last publish or signal, or of the
	// last subscriber leaving, which idle expiry reads.
	activity atomic.Int64
	// held is what the ring held when it last settled with the budget
	// (ring.Held), for the budget's trim and Stats to read without the bus
	// lock; written under it.
	held atomic.Int64
	// pins counts what the subscribers hold beyond the ring, under the bus
	// lock; pinned and pinnedShed are its estimate as the budget counts it
	// (hub_pins.go), written under the bus lock.
	pins               pinState
	pinned, pinnedShed atomic.Int64
	// idem is the idempotency keys of the bus's PublishIdempotent calls
	// (hub_idempotency.go), under their own lock, taken before the bus
	// lock, never under it.
	idem idemStore
}

// newSession makes a session with a new bus, used as of now.
func (h *Hub) newSession() *hubSession {
	s := &hubSession{hub: h}
	s.bus.init(h.opts, s)
	s.activity.Store(h.nowMillis())
	return s
}

// publishing stamps the session's use and admits the frame to the budget.
// Before the bus lock: an idle expiry that closes the bus first makes this
// publish fail with ErrClosed (Hub.Publish then retries on a new bus); one
// that comes later sees the session used.
func (s *hubSession) publishing(size, now int64) (int64, error) {
	if now == 0 {
		now = s.hub.nowMillis()
	}
	s.activity.Store(now)
	return s.hub.budget.admit(size), nil
}

// ringChangedLocked settles the ring's change with the budget. At a ring's
// bound, a publish whose event costs what the ring dropped for it has
// nothing to settle: no atomic write.
func (s *hubSession) ringChangedLocked(reserved int64) {
	if reserved != 0 || int64(s.bus.ring.Held()) != s.held.Load() {
		s.hub.budget.settleLocked(s, reserved)
	}
	s.pinsChangedLocked()
}

// used stamps the session's use: a signal, or its last subscriber leaving
// (then its idle time starts).
func (s *hubSession) used() { s.activity.Store(s.hub.nowMillis()) }

// closed forgets the session's idempotency records, giving their bytes
// back to the budget, and keeps the session known to the budget while its
// subscribers pin frames (hub_pins.go): Close gave the ring's bytes back
// as it reset the ring (ringChangedLocked), and the hub forgets a closed
// bus at its next sweep, or when GetOrCreate finds it. Every way a bus of
// the hub ends comes here (Delete, idle expiry, Shutdown, Close, its
// owner's Close).
func (s *hubSession) closed() {
	s.clearRecords()
	if s.pinned.Load() != 0 {
		s.hub.budget.retire(s)
	}
}

// NewHub returns an open hub. It returns an error wrapping ErrInvalidOption
// for an invalid option (of the hub or of its buses). When IdleTimeout or
// Bus.MaxAge is in use it starts the hub's sweeping goroutine, which Close
// and Shutdown end.
func NewHub(opts HubOptions) (*Hub, error) {
	bo, err := opts.Bus.withDefaults()
	if err != nil {
		return nil, err
	}
	if opts.MaxSessions < 0 {
		return nil, fmt.Errorf("%w: MaxSessions is %d, must not be negative", ErrInvalidOption, opts.MaxSessions)
	}
	if opts.MaxTotalBytes < 0 {
		return nil, fmt.Errorf("%w: MaxTotalBytes is %d, must not be negative", ErrInvalidOption, opts.MaxTotalBytes)
	}
	if opts.ShutdownRetryAfter < 0 {
		return nil, fmt.Errorf("%w: ShutdownRetryAfter is %v, must not be negative", ErrInvalidOption, opts.ShutdownRetryAfter)
	}
	if opts.IdempotencyWindow < 0 {
		return nil, fmt.Errorf("%w: IdempotencyWindow is %v, must not be negative", ErrInvalidOption, opts.IdempotencyWindow)
	}
	if opts.MaxIdempotencyKeys < 0 {
		return nil, fmt.Errorf("%w: MaxIdempotencyKeys is %d, must not be negative", ErrInvalidOption, opts.MaxIdempotencyKeys)
	}
	if opts.IdempotencyWindow == 0 {
		opts.IdempotencyWindow = DefaultIdempotencyWindow
	}
	if opts.MaxIdempotencyKeys == 0 {
		opts.MaxIdempotencyKeys = DefaultMaxIdempotencyKeys
	}
	if opts.MaxSessions == 0 {
		opts.MaxSessions = DefaultMaxSessions
	}
	if opts.IdleTimeout == 0 {
		opts.IdleTimeout = DefaultIdleTimeout
	}
	if opts.MaxTotalBytes == 0 {
		opts.MaxTotalBytes = DefaultMaxTotalBytes
	}
	if least := int64(maxFrameSize(bo.MaxEventBytes)); opts.MaxTotalBytes < least {
		return nil, fmt.Errorf("%w: MaxTotalBytes is %d, below the %d bytes one event of MaxEventBytes %d holds",
			ErrInvalidOption, opts.MaxTotalBytes, least, bo.MaxEventBytes)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if bo.Logger == nil {
		bo.Logger = opts.Logger
	}
	h := &Hub{
		opts:        bo,
		maxSessions: int64(opts.MaxSessions),
		retryAfter:  opts.ShutdownRetryAfter,
		logger:      opts.Logger,
		seed:        maphash.MakeSeed(),
		enc:         encoder{maxEventBytes: bo.MaxEventBytes, now: bo.Now},
		idemWindow:  max(opts.IdempotencyWindow.Milliseconds(), 1),
		idemMax:     opts.MaxIdempotencyKeys,
	}
	if opts.IdleTimeout > 0 {
		h.idle = max(opts.IdleTimeout.Milliseconds(), 1)
	}
	h.budget = newBudget(h, opts.MaxTotalBytes)
	for i := range h.shards {
		h.shards[i].m = make(map[string]*hubSession)
	}
	if period := h.sweepPeriod(opts.IdleTimeout); period > 0 {
		h.stop, h.done = make(chan struct{}), make(chan struct{})
		go h.run(period)
	}
	return h, nil
}

// sweepPeriod is how often the goroutine sweeps: an eighth of the shortest
// of IdleTimeout and MaxAge in use, within [10ms, 30s]; 0 when neither is.
func (h *Hub) sweepPeriod(idle time.Duration) time.Duration {
	d := time.Duration(0)
	if idle > 0 {
		d = idle
	}
	if a := h.opts.MaxAge; a > 0 && (d == 0 || a < d) {
		d = a
	}
	if d == 0 {
		return 0
	}
	return min(max(d/8, 10*time.Millisecond), 30*time.Second)
}

func (h *Hub) run(period time.Duration) {
	defer close(h.done)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
			h.sweep()
		}
	}
}

func (h *Hub) shard(id string) *hubShard {
	return &h.shards[maphash.String(h.seed, id)%hubShards]
}

// nowMillis is the clock of the buses' activity (Options.Now, else the
// wall clock), in Unix ms.
func (h *Hub) nowMillis() int64 { return nowMillis(h.opts.Now) }

// Lookup returns the live bus of session id, without creating one. It
// takes only a read lock of the session's shard and does not count as a
// use of the session. An id that CheckSessionID refuses names no session:
// Lookup reports false for it.
func (h *Hub) Lookup(id string) (*EventBus, bool) {
	if CheckSessionID(id) != nil {
		return nil, false
	}
	return h.lookup(id)
}

// lookup is Lookup of an id already checked.
func (h *Hub) lookup(id string) (*EventBus, bool) {
	sh := h.shard(id)
	sh.mu.RLock()
	s := sh.m[id]
	sh.mu.RUnlock()
	if s == nil || s.bus.isClosed.Load() {
		return nil, false
	}
	return &s.bus, true
}

// GetOrCreate returns the live bus of session id, creating it (with a new
// epoch) when there is none. A new session needs room: when the hub holds
// MaxSessions sessions, GetOrCreate first closes every session idle past
// IdleTimeout (synchronously), and answers ErrHubFull only if none was.
// It returns ErrClosed after Shutdown or Close, and CheckSessionID's error
// (wrapping ErrInvalidSessionID) for an id the rule refuses, which never
// becomes a session. A new bus is not counted as used until it is
// published to or subscribed: a session created and left alone expires
// IdleTimeout after its creation.
func (h *Hub) GetOrCreate(id string) (*EventBus, error) {
	if err := CheckSessionID(id); err != nil {
		return nil, err
	}
	s, err := h.getOrCreate(id)
	if err != nil {
		return nil, err
	}
	return &s.bus, nil
}

// getOrCreate is GetOrCreate of an id already checked, returning the
// session.
func (h *Hub) getOrCreate(id string) (*hubSession, error) {
	sh := h.shard(id)
	sh.mu.RLock()
	s := sh.m[id]
	sh.mu.RUnlock()
	if s != nil && !s.bus.isClosed.Load() {
		return s, nil
	}
	if h.closed.Load() {
		return nil, ErrClosed
	}
	// Made before the shard lock (New draws an epoch from crypto/rand),
	// dropped if another GetOrCreate of id wins.
	fresh := h.newSession()
	for swept := false; ; {
		sh.mu.Lock()
		// Under the shard lock: end, which takes every shard lock after
		// setting closed, either sees the new bus or is seen here.
		if h.closed.Load() {
			sh.mu.Unlock()
			return nil, ErrClosed
		}
		if old := sh.m[id]; old != nil {
			sh.mu.Unlock()
			if !old.bus.isClosed.Load() {
				return old, nil // fresh holds nothing: the collector takes it
			}
			// Closed by its owner, or expired and not yet forgotten: it
			// gives its place to the new one.
			h.forget(hubEntry{id, old})
			continue
		}
		if h.n.Add(1) <= h.maxSessions {
			sh.m[id] = fresh
			sh.mu.Unlock()
			h.created.Add(1)
			return fresh, nil
		}
		h.n.Add(-1)
		sh.mu.Unlock()
		if swept || h.idle <= 0 || h.nowMillis() < h.nextEligible.Load() {
			h.refused.Add(1)
			return nil, ErrHubFull
		}
		h.sweep()
		swept = true
	}
}

// Publish publishes e to session id, creating the session if needed (see
// GetOrCreate), and returns the stamped frame. If the session expires or is
// deleted between the lookup and the publish, it retries once on a new
// session. It returns what GetOrCreate (ErrInvalidSessionID, ErrHubFull,
// ErrClosed) and EventBus.Publish return.
func (h *Hub) Publish(id string, e Event) (Frame, error) {
	f, _, err := h.publish(id, e)
	return f, err
}

// publish is Publish, also returning the bus that took the event (nil
// when none did).
func (h *Hub) publish(id string, e Event) (Frame, *EventBus, error) {
	for retried := false; ; retried = true {
		b, err := h.GetOrCreate(id)
		if err != nil {
			return Frame{}, nil, err
		}
		f, err := b.Publish(e)
		if errors.Is(err, ErrClosed) && !retried && !h.closed.Load() {
			continue
		}
		return f, b, err
	}
}

// Delete closes session id's bus (every subscriber gets what is queued,
// then its end) and forgets it. It reports whether the session existed:
// false for an id CheckSessionID refuses, which names no session.
func (h *Hub) Delete(id string) bool {
	if CheckSessionID(id) != nil {
		return false
	}
	h.retireMu.Lock()
	sh := h.shard(id)
	sh.mu.Lock()
	s := sh.m[id]
	if s != nil {
		delete(sh.m, id)
		h.n.Add(-1)
	}
	sh.mu.Unlock()
	if s != nil {
		h.ended.addCounters(s.bus.Stats())
	}
	h.retireMu.Unlock()
	if s == nil || s.bus.isClosed.Load() {
		return false
	}
	_ = s.bus.Close()
	h.deleted.Add(1)
	return true
}

// Len returns the number of sessions held. It does not block.
func (h *Hub) Len() int { return int(h.n.Load()) }

// hubEntry is one session of a snapshot.
type hubEntry struct {
	id string
	s  *hubSession
}

// snapshot returns the sessions, reading one shard at a time.
func (h *Hub) snapshot() []hubEntry {
	out := make([]hubEntry, 0, h.n.Load())
	for i := range h.shards {
		sh := &h.shards[i]
		sh.mu.RLock()
		for id, s := range sh.m {
			out = append(out, hubEntry{id, s})
		}
		sh.mu.RUnlock()
	}
	return out
}

// Sessions returns an iterator over the live sessions: a snapshot taken
// shard by shard, yielded with no lock held (a session created meanwhile
// may be missing, one closed meanwhile may still be yielded).
func (h *Hub) Sessions() iter.Seq2[string, *EventBus] {
	return func(yield func(string, *EventBus) bool) {
		for _, e := range h.snapshot() {
			if e.s.bus.isClosed.Load() {
				continue
			}
			if !yield(e.id, &e.s.bus) {
				return
			}
		}
	}
}

// Stats returns a snapshot of the hub's counters and the sum of its live
// buses' Stats. It takes each shard's read lock in turn and no bus lock.
func (h *Hub) Stats() HubStats {
	h.retireMu.RLock()
	defer h.retireMu.RUnlock()
	st := HubStats{
		MaxTotalBytes: h.budget.max,
		Created:       h.created.Load(),
		Expired:       h.expired.Load(),
		Deleted:       h.deleted.Load(),
		Refused:       h.refused.Load(),
		BudgetTrimmed: h.budget.trimmed.Load(),
		PinnedBytes:   h.budget.pinned.Load(),
		BudgetShed:    h.budget.shed.Load(),
		Buses:         h.ended,
	}
	for _, e := range h.snapshot() {
		// A bus closed and not yet forgotten still counts (its current
		// values are 0), or the counters would dip until it is.
		if !e.s.bus.isClosed.Load() {
			st.Sessions++
		}
		st.Buses.add(e.s.bus.Stats())
		st.RingBytes += e.s.held.Load()
		st.IdempotencyKeys += int(e.s.idem.keys.Load())
		st.IdempotencyBytes += e.s.idem.bytes.Load()
	}
	return st
}

// LookupSession is Lookup for the stream handlers (it fits Handler.Lookup,
// which a MuxHandler sharing that Handler calls too): the live bus of
// session id, never creating one, so nobody fills the hub by reading. An
// id CheckSessionID refuses is its error (wrapping ErrInvalidSessionID: 400
// invalid_session_id); an unknown session is an error wrapping
// ErrSessionNotFound (404 session_not_found). It does not block.
func (h *Hub) LookupSession(_ *http.Request, id string) (*EventBus, error) {
	if err := CheckSessionID(id); err != nil {
		return nil, err
	}
	if b, ok := h.lookup(id); ok {
		return b, nil
	}
	return nil, fmt.Errorf("%w: %q", ErrSessionNotFound, truncate(id, 64))
}

// Shutdown refuses new sessions (GetOrCreate returns ErrClosed), ends the
// hub's goroutine, forgets every session and closes its bus with drain
// (EventBus.CloseForShutdown with ShutdownRetryAfter: each subscriber gets
// what was queued, then a stream_error shutdown), then waits until every
// subscriber has taken what was queued for it, the shutdown frame
// included, or until ctx is done: then the remaining subscriptions are
// closed without drain and Shutdown returns ctx.Err(). It returns nil once
// everything drained. A subscriber that never reads holds Shutdown until
// ctx is done, never the others: each drains at its own pace. (A
// transport blocked writing to such a client stays blocked when Shutdown
// gives up: close its connection at the same deadline, as http.Server.Close
// does, or let its write deadline pass.) The order a daemon calls it in,
// beside http.Server.Shutdown, is in the Hub's doc. Safe to call more than
// once, and with Close.
func (h *Hub) Shutdown(ctx context.Context) error {
	var subs []*Subscription
	for _, b := range h.end() {
		s, _ := h.closeBus(b)
		subs = append(subs, s...)
	}
	drained := func() bool {
		for len(subs) > 0 {
			s := subs[len(subs)-1]
			if s.q.head.Load() != s.q.tail.Load() {
				return false
			}
			subs = subs[:len(subs)-1]
		}
		return true
	}
	if drained() {
		return nil
	}
	// The consumers are not ours to wait on: look every few milliseconds.
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			for _, s := range subs {
				s.cancel(ctx.Err(), false)
			}
			return ctx.Err()
		case <-t.C:
			if drained() {
				return nil
			}
		}
	}
}

// Close closes every session's bus as Shutdown does (its subscribers get
// what is queued, then the stream_error shutdown, at their own pace),
// forgets them, refuses new ones and ends the hub's goroutine. It does not
// wait for subscribers. Idempotent; it returns nil.
func (h *Hub) Close() error {
	for _, b := range h.end() {
		_, _ = h.closeBus(b)
	}
	return nil
}

// closeBus closes b for the hub's end: with drain, then the shutdown frame.
func (h *Hub) closeBus(b *EventBus) ([]*Subscription, bool) {
	f := shutdownFrame(h.retryAfter, b.now())
	return b.closeIf(&f, nil)
}

// end marks the hub closed, stops its goroutine and empties the map,
// returning the buses it held.
func (h *Hub) end() []*EventBus {
	h.closed.Store(true)
	h.stopOnce.Do(func() {
		if h.stop != nil {
			close(h.stop)
			<-h.done
		}
	})
	var out []*EventBus
	h.retireMu.Lock()
	defer h.retireMu.Unlock()
	for i := range h.shards {
		sh := &h.shards[i]
		sh.mu.Lock()
		for id, s := range sh.m {
			out = append(out, &s.bus)
			delete(sh.m, id)
			h.n.Add(-1)
			h.ended.addCounters(s.bus.Stats())
		}
		sh.mu.Unlock()
	}
	return out
}

// sweep closes and forgets every session idle past IdleTimeout, forgets
// the buses closed by their owners, drops aged events (Options.MaxAge)
// from the rings of quiet sessions, and forgets the idempotency records
// past their window.
func (h *Hub) sweep() {
	h.sweepMu.Lock()
	defer h.sweepMu.Unlock()
	now := h.nowMillis()
	deadline := now - h.idle
	maxAge := h.opts.MaxAge.Milliseconds()
	// Activity only moves forward, and a session busy now (or new) can be
	// idle past IdleTimeout no sooner than now + IdleTimeout.
	soonest := now + h.idle
	defer func() { h.nextEligible.Store(soonest) }()
	for _, e := range h.snapshot() {
		s, b := e.s, &e.s.bus
		if a := s.activity.Load(); a > deadline && b.SubscriberCount() == 0 {
			soonest = min(soonest, a+h.idle)
		}
		switch {
		case b.isClosed.Load():
			h.forget(e)
		case h.idle > 0 && b.SubscriberCount() == 0 && s.activity.Load() <= deadline:
			// Decided again under the bus lock, atomically with Subscribe:
			// a subscriber that came meanwhile keeps the session.
			if _, ok := b.closeIf(nil, func() bool { return len(b.subs) == 0 && s.activity.Load() <= deadline }); ok {
				h.forget(e) // unless a GetOrCreate replaced it already
				h.expired.Add(1)
				h.logger.LogAttrs(context.Background(), slog.LevelDebug, "eventbus: session expired", slog.String("session", truncate(e.id, 64)))
			}
		case maxAge > 0:
			b.mu.Lock()
			if b.ring.dropOlder(now-maxAge) > 0 {
				b.ringChangedLocked(0)
			}
			b.mu.Unlock()
		}
		s.expireRecords(now)
	}
}

// forget removes e from the map if it still holds e's bus, and keeps its
// counters in ended.
func (h *Hub) forget(e hubEntry) {
	h.retireMu.Lock()
	sh := h.shard(e.id)
	sh.mu.Lock()
	gone := sh.m[e.id] == e.s
	if gone {
		delete(sh.m, e.id)
		h.n.Add(-1)
	}
	sh.mu.Unlock()
	if gone {
		h.ended.addCounters(e.s.bus.Stats())
	}
	h.retireMu.Unlock()
}

// add adds every field of o to s.
func (s *Stats) add(o Stats) {
	s.addCounters(o)
	s.Subscribers += o.Subscribers
	s.PeakSubscribers += o.PeakSubscribers
	s.CatchUp.Behind += o.CatchUp.Behind
	s.RingLen += o.RingLen
	s.RingBytes += o.RingBytes
}

// addCounters adds the counters of o to s, leaving the current values
// (Subscribers, PeakSubscribers, CatchUp.Behind, RingLen, RingBytes).
func (s *Stats) addCounters(o Stats) {
	s.Published += o.Published
	s.Rejected.Invalid += o.Rejected.Invalid
	s.Rejected.TooLarge += o.Rejected.TooLarge
	s.Rejected.Closed += o.Rejected.Closed
	s.Signals += o.Signals
	s.FramesDelivered += o.FramesDelivered
	s.Evictions.QueueOverflow += o.Evictions.QueueOverflow
	s.Evictions.QueueBytesOverflow += o.Evictions.QueueBytesOverflow
	s.Evictions.RepeatedOverflow += o.Evictions.RepeatedOverflow
	s.Evictions.CatchUpStalled += o.Evictions.CatchUpStalled
	s.Evictions.MemoryBudget += o.Evictions.MemoryBudget
	s.Warnings += o.Warnings
	s.Resyncs.EpochReset += o.Resyncs.EpochReset
	s.Resyncs.RingEvicted += o.Resyncs.RingEvicted
	s.Resyncs.ReplayBudgetExceeded += o.Resyncs.ReplayBudgetExceeded
	s.Resyncs.QueueOverflow += o.Resyncs.QueueOverflow
	s.Resyncs.QueueBytesOverflow += o.Resyncs.QueueBytesOverflow
	s.Resyncs.CursorInvalid += o.Resyncs.CursorInvalid
	s.Dropped.Coalesced += o.Dropped.Coalesced
	s.Dropped.Overflow += o.Dropped.Overflow
	s.Dropped.ReplayBudget += o.Dropped.ReplayBudget
	s.Dropped.Cancelled += o.Dropped.Cancelled
	s.Dropped.Blocked += o.Dropped.Blocked
	s.Dropped.CatchUpSignals += o.Dropped.CatchUpSignals
	s.Dropped.MemoryBudget += o.Dropped.MemoryBudget
	s.CatchUp.Entered += o.CatchUp.Entered
	s.CatchUp.Served += o.CatchUp.Served
}
