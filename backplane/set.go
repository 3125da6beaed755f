package backplane

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/ssebus/eventbus"
)

// Session is the engine-independent state of one session's mirror on this
// replica. An engine's session type embeds it (see Member); the Set fills
// it in. Its fields are read-only for the engine.
type Session struct {
	// ID is the session's id; set before Engine.Open sees the session.
	ID string
	// Bus and Epoch are the mirror and its epoch, set before Engine.Run
	// starts (Set.Peek may see them zero while the session opens). A
	// session's Bus is a mirror (NewMirror): Run feeds it with Append.
	Bus   *eventbus.EventBus
	Epoch string

	ready      chan struct{} // closed when open has finished
	err        error         // set by open before ready is closed
	opened     time.Time     // when open asked the engine for the epoch
	cancel     context.CancelFunc
	lastActive time.Time // guarded by the set's lock
}

// Mirror returns s; an engine's session type gets it by embedding Session.
func (s *Session) Mirror() *Session { return s }

// Ready reports whether the session was opened without error.
func (s *Session) Ready() bool {
	select {
	case <-s.ready:
		return s.err == nil
	default:
		return false
	}
}

// Member is an engine's session type: a pointer to a struct embedding
// Session, which is also the mirror's Log (ReadHistory answers a resume
// the mirror's ring cannot, Head tells a lagging mirror how far the log
// is; see Log). Its ReadHistory and Head may read the
// embedded Session's Epoch: they run only once the mirror exists.
type Member interface {
	comparable
	Log
	Mirror() *Session
}

// Start is where a session's mirror begins: what Engine.Open read from
// the log, for the mirror (Epoch, Last) and for the engine's reader
// (Cursor).
type Start struct {
	// Epoch is the session's epoch in the log (32 hex characters,
	// eventbus.NewEpoch), created by Open when the session had none.
	Epoch string
	// Last is the last id the log assigned in Epoch (0: none yet): the
	// mirror delivers from Last+1.
	Last uint64
	// Cursor is the engine's own position of Last in its log (a stream
	// sequence, an offset, an LSN), for Run to read from; the Set never
	// reads it. An engine whose ids are its positions leaves it 0.
	Cursor uint64
}

// Engine is what a backplane module supplies for its sessions of type S:
// the engine half of a backplane. The Set calls its methods from its own
// goroutines, for different sessions at once: they must be safe for
// concurrent use. None is called with the Set's lock held.
type Engine[S Member] interface {
	// New returns a new session named id, with its Session part zero (the
	// Set fills it in). It must not block or do I/O: it runs once per
	// session, before Open, while other lookups of id wait.
	New(id string) S
	// Open reads the session's epoch and the last id its log assigned,
	// creating the epoch when the log has none (the session is new, or
	// was deleted or lost): every replica that opens the session must get
	// the same epoch, so the creation must be atomic in the engine (one
	// replica wins, the others read its epoch). ctx bounds it
	// (Config.Timeout); an error is wrapped by Config.Unavailable and
	// answered 503 unavailable, and the next lookup calls Open again.
	// Open runs before the mirror exists: it may set fields of s that Run
	// and the Log methods read.
	Open(ctx context.Context, s S) (Start, error)
	// Run is the session's reader: it appends to s.Bus (Append), in id
	// order, every entry of the log after from.Last (from from.Cursor, in
	// the engine's terms), until ctx ends, and returns then. An id gap it cannot fill is no error: Append tells the
	// subscribers (state_resync_required, ring_evicted). When the log no
	// longer holds the mirror's epoch (deleted, lost), Run calls
	// Set.Expire and returns; when it cannot reach the engine for the
	// outage bound, Set.Outage and returns; between failures it waits a
	// Backoff. The Set starts Run once the session is in the set (so an
	// engine that wakes readers by session finds it) and waits for it in
	// Close.
	Run(ctx context.Context, s S, from Start)
	// Epoch returns the session's current epoch in the engine ("" when
	// it has none), within ctx. Set.Bus calls it before a new stream
	// joins a mirror opened earlier, so that the stream never joins an
	// epoch the log no longer has; an error refuses the stream (503).
	Epoch(ctx context.Context, s S) (string, error)
}

// Config configures a Set.
type Config struct {
	Name   string // the module's name, e.g. "pgbus": prefixes log lines and messages
	Engine string // e.g. "PostgreSQL": in the Handler's 503 message and the outage message
	Store  string // e.g. "the table": where Bus found another epoch, in a log line
	// Bus is the module's bus options as PrepareBus completed them: every
	// mirror's options, the logger of the Set's log lines, and the
	// encoder of Prepare and PrepareSignal.
	Bus Bus
	// Timeout bounds Open and a Bus epoch check, and is each mirror's
	// LagTimeout (how long a resume waits for a lagging reader).
	Timeout time.Duration
	// IdleTimeout is how long a mirror may have no subscriber before it
	// is released.
	IdleTimeout time.Duration
	// OutageTimeout is the engine's outage bound, named in Outage's
	// messages.
	OutageTimeout time.Duration
	// Valid checks a session id, failing with the module's
	// ErrInvalidSession. It must refuse every id eventbus.CheckSessionID
	// refuses, wrapping both errors (fmt.Errorf("%w: %w",
	// ErrInvalidSession, err)), so that every backplane and the Hub accept
	// the same ids; it may refuse more. The Set applies CheckSessionID
	// after it too: an id the shared rule refuses never reaches the
	// engine, whatever Valid says.
	Valid func(id string) error
	// Unavailable wraps an engine failure of operation op (the module's
	// ErrUnavailable, which ErrUnavailable must be).
	Unavailable    func(op, session string, err error) error
	ErrUnavailable error
	// ShutdownRetryAfter is the retryAfter of the stream_error shutdown
	// that Close gives every stream (eventbus.EventBus.CloseForShutdown);
	// 0 means eventbus.DefaultShutdownRetryAfter.
	ShutdownRetryAfter time.Duration
}

// Set is a backplane's mirrors on this replica, one per session with
// subscribers here: it opens a mirror once however many lookups ask at
// once, checks a reused mirror's epoch with the engine before a stream
// joins it, answers the SSE Handler's lookups, releases idle mirrors, and
// holds what every backplane's Publish, Signal and Delete do around the
// engine's call (Prepare, PrepareSignal, DeliverSignal, Deleted). Create
// it with New; it is safe for concurrent use. Close ends every goroutine
// started by it or through Go.
type Set[S Member] struct {
	cfg    Config
	eng    Engine[S]
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	sessions map[string]S
}

// errReleased is the error of a session released (Delete, a new epoch)
// while it was being opened; a waiting lookup tries again.
var errReleased = errors.New("backplane: session released while opening")

// New returns an empty set of eng's sessions and starts its idle
// janitor; Close stops it. cfg's Valid, Unavailable and ErrUnavailable
// must be set.
func New[S Member](cfg Config, eng Engine[S]) *Set[S] {
	t := &Set[S]{cfg: cfg, eng: eng, sessions: make(map[string]S)}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.Go(t.releaseIdle)
	return t
}

// Context is done once Close has begun.
func (t *Set[S]) Context() context.Context { return t.ctx }

// Go runs f in a goroutine that Close waits for; f must return once
// Context is done.
func (t *Set[S]) Go(f func()) {
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		f()
	}()
}

// Closed reports whether Close was called.
func (t *Set[S]) Closed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// Close releases every session, because this replica is going away:
// Context ends, then (when set) runs, then every mirror closes with
// eventbus.EventBus.CloseForShutdown (its streams get what was queued, then
// stream_error shutdown with Config.ShutdownRetryAfter, and end), and Close
// returns when every goroutine of the set has ended. It does not wait for
// the streams to drain. Idempotent.
func (t *Set[S]) Close(then func()) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		t.wg.Wait()
		return
	}
	t.closed = true
	all := t.sessions
	t.sessions = nil
	t.mu.Unlock()
	t.cancel()
	if then != nil {
		then()
	}
	for _, s := range all {
		if bus := t.halt(s); bus != nil {
			bus.CloseForShutdown(t.cfg.ShutdownRetryAfter)
		}
	}
	t.wg.Wait()
}

// Len returns how many sessions the set holds.
func (t *Set[S]) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.sessions)
}

// Get returns the set's session id, ready or still opening, or the zero S.
func (t *Set[S]) Get(id string) S {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.sessions[id]
}

// Ready returns the set's ready session id, or the zero S.
func (t *Set[S]) Ready(id string) S {
	var zero S
	s := t.Get(id)
	if s == zero || !s.Mirror().Ready() {
		return zero
	}
	return s
}

// Peek returns the set's session id, ready or still opening, with its
// mirror and epoch as they are now (nil and "" before they are set).
func (t *Set[S]) Peek(id string) (s S, bus *eventbus.EventBus, epoch string, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok = t.sessions[id]
	if ok {
		bus, epoch = s.Mirror().Bus, s.Mirror().Epoch
	}
	return s, bus, epoch, ok
}

// Each calls f for every session, under the set's lock: f must not block.
func (t *Set[S]) Each(f func(S)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range t.sessions {
		f(s)
	}
}

// Local returns the last id delivered and the subscriber count of the
// ready mirror of id; ok is false when there is none.
func (t *Set[S]) Local(id string) (last uint64, subscribers int, ok bool) {
	s := t.Get(id)
	var zero S
	if s == zero || !s.Mirror().Ready() {
		return 0, 0, false
	}
	bus := s.Mirror().Bus
	return bus.LastEventID(), bus.SubscriberCount(), true
}

// valid checks a session id: Config.Valid (the module's error), then the
// shared rule, for a Valid that lets through an id it refuses.
func (t *Set[S]) valid(id string) error {
	if err := t.cfg.Valid(id); err != nil {
		return err
	}
	return eventbus.CheckSessionID(id)
}

// session returns the ready session id, creating it when needed.
func (t *Set[S]) session(ctx context.Context, id string) (S, error) {
	var zero S
	if err := t.valid(id); err != nil {
		return zero, err
	}
	for attempt := 0; ; attempt++ {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return zero, eventbus.ErrClosed
		}
		s, ok := t.sessions[id]
		if !ok {
			s = t.eng.New(id)
			m := s.Mirror()
			m.ID, m.ready = id, make(chan struct{})
			t.sessions[id] = s
			m.lastActive = time.Now()
			t.mu.Unlock()
			t.open(s)
		} else {
			s.Mirror().lastActive = time.Now()
			t.mu.Unlock()
			select {
			case <-s.Mirror().ready:
			case <-ctx.Done():
				return zero, ctx.Err()
			}
		}
		m := s.Mirror()
		if errors.Is(m.err, errReleased) && attempt < 3 {
			continue
		}
		if m.err != nil {
			return zero, m.err
		}
		t.mu.Lock()
		current := t.sessions[id] == s
		t.mu.Unlock()
		if !current && attempt < 3 {
			continue // released meanwhile (idle, a new epoch, Delete)
		}
		return s, nil
	}
}

// open reads (or creates) the session's epoch and last id, builds the
// mirror and starts the reader. It runs detached from the request that
// asked for it: other lookups wait for it too.
func (t *Set[S]) open(s S) {
	m := s.Mirror()
	defer close(m.ready)
	fail := func(err error) {
		m.err = t.cfg.Unavailable("open", m.ID, err)
		t.mu.Lock()
		if t.sessions[m.ID] == s {
			delete(t.sessions, m.ID)
		}
		t.mu.Unlock()
	}
	m.opened = time.Now()
	ctx, cancel := context.WithTimeout(t.ctx, t.cfg.Timeout)
	from, err := t.eng.Open(ctx, s)
	cancel()
	if err != nil {
		fail(err)
		return
	}
	bus, err := NewMirror(t.cfg.Bus.Options, MirrorOptions{
		Epoch: from.Epoch, NextID: from.Last + 1, Log: s, LagTimeout: t.cfg.Timeout})
	if err != nil {
		fail(err) // a corrupt epoch; the options were validated by the module's New
		return
	}
	rctx, rcancel := context.WithCancel(t.ctx)
	t.mu.Lock()
	if t.closed || t.sessions[m.ID] != s {
		t.mu.Unlock()
		rcancel()
		bus.Close()
		if t.closed {
			m.err = eventbus.ErrClosed
		} else {
			m.err = errReleased
		}
		return
	}
	m.Bus, m.Epoch, m.cancel = bus, from.Epoch, rcancel
	t.wg.Add(1)
	t.mu.Unlock()
	// The session is in the set before the reader's first read, so an
	// engine that wakes readers by session finds it: no event falls
	// between the read and the set.
	go func() {
		defer t.wg.Done()
		t.eng.Run(rctx, s, from)
	}()
}

// Stop ends the reader of s and closes its mirror (its streams drain, then
// end); with a kind, the streams end with a terminal stream_error of that
// kind and message (CloseWithError). s must already be out of the set.
// Idempotent.
func (t *Set[S]) Stop(s S, kind, message string) {
	bus := t.halt(s)
	switch {
	case bus == nil:
	case kind != "":
		CloseWithError(bus, kind, message)
	default:
		bus.Close()
	}
}

// halt ends the reader of s and returns its mirror, for the caller to
// close (nil while s is still opening).
func (t *Set[S]) halt(s S) *eventbus.EventBus {
	m := s.Mirror()
	t.mu.Lock()
	cancel, bus := m.cancel, m.Bus
	t.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	return bus
}

// Remove takes s out of the set, so that the next lookup of its session
// makes a new one; it reports whether s was still there.
func (t *Set[S]) Remove(s S) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	id := s.Mirror().ID
	if t.sessions[id] == s {
		delete(t.sessions, id)
		return true
	}
	return false
}

// Expire removes s from the set and stops it, logging why: the engine no
// longer has its epoch (a lost log, or a Delete made on another replica;
// an engine cannot always tell which). Its streams end, after what was
// queued, with stream_error unavailable: their clients reconnect and
// resume, and learn there whether the session lives on in a new epoch
// (epoch_reset) or is gone (404). A Delete on this replica (Deleted) ends
// them with stream_error closed instead.
func (t *Set[S]) Expire(s S, why string) {
	t.release(s, why, eventbus.ErrorKindUnavailable, "the session's epoch ended ("+why+"): reconnect and resume from your cursor")
}

// release removes s from the set and stops it (Stop: kind and message as
// there), logging why.
func (t *Set[S]) release(s S, why, kind, message string) {
	t.Remove(s)
	m := s.Mirror()
	t.cfg.Bus.Log.Info(t.cfg.Name+": session released", "session", m.ID, "epoch", m.Epoch, "reason", why)
	t.Stop(s, kind, message)
}

// Bus returns the mirror bus of session, creating it (and its reader)
// when needed. A mirror opened before this call is first checked against
// the session's epoch in the engine (Engine.Epoch): a mirror of an epoch
// the engine no longer has is released and a new one made, so a stream
// never joins a dead epoch. Errors: Config.Valid's (or
// eventbus.CheckSessionID's), eventbus.ErrClosed, ctx's, or ones made by
// Config.Unavailable.
func (t *Set[S]) Bus(ctx context.Context, session string) (*eventbus.EventBus, error) {
	start := time.Now()
	for attempt := 0; attempt < 3; attempt++ {
		s, err := t.session(ctx, session)
		if err != nil {
			return nil, err
		}
		m := s.Mirror()
		if !m.opened.Before(start) {
			return m.Bus, nil // opened by this call or after it: its epoch is fresh
		}
		// The mirror may be of an epoch the engine no longer has (a Delete
		// or a lost log its reader has not noticed yet): a stream that
		// joined it would miss the new epoch's events.
		ectx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
		cur, err := t.eng.Epoch(ectx, s)
		cancel()
		if err != nil {
			return nil, t.cfg.Unavailable("check the epoch of", session, err)
		}
		if cur == m.Epoch {
			return m.Bus, nil
		}
		// The next session opens after start, so this runs once unless
		// another lookup's older session got in between.
		t.Expire(s, "a new stream found another epoch in "+t.cfg.Store)
	}
	return nil, t.cfg.Unavailable("open", session, errors.New("its epoch kept changing while the stream opened"))
}

// Subscribe subscribes to session on the mirror Bus returns.
func (t *Set[S]) Subscribe(ctx context.Context, session string, opts eventbus.SubscribeOptions) (*eventbus.Subscription, error) {
	bus, err := t.Bus(ctx, session)
	if err != nil {
		return nil, err
	}
	return bus.Subscribe(ctx, opts)
}

// Handler returns a new SSE handler whose Lookup is Lookup and whose
// Logger is Config.Bus.Log; the caller sets the rest of it before serving.
func (t *Set[S]) Handler() *eventbus.Handler {
	return &eventbus.Handler{Lookup: t.Lookup, Logger: t.cfg.Bus.Log}
}

// Lookup is an eventbus.Handler's Lookup: Bus for session id, within the
// request's context; an invalid id is an error wrapping
// eventbus.ErrInvalidSessionID (400 invalid_session_id), the engine
// unavailable 503 unavailable and a closed set 503 shutting_down, both
// with Retry-After: 1, as eventbus.StatusError wrapping the cause.
func (t *Set[S]) Lookup(r *http.Request, id string) (*eventbus.EventBus, error) {
	if err := t.valid(id); err != nil {
		if !errors.Is(err, eventbus.ErrInvalidSessionID) {
			// A rule of the module's own, stricter than the shared one.
			err = fmt.Errorf("%w: %w", eventbus.ErrInvalidSessionID, err)
		}
		return nil, err
	}
	bus, err := t.Bus(r.Context(), id)
	switch {
	case errors.Is(err, t.cfg.ErrUnavailable):
		se := eventbus.Unavailable(time.Second, t.cfg.Engine+" unavailable; retry after Retry-After")
		se.Err = err
		return nil, se
	case errors.Is(err, eventbus.ErrClosed):
		return nil, &eventbus.StatusError{Status: http.StatusServiceUnavailable, Code: "shutting_down",
			Message: "the daemon is shutting down", RetryAfter: time.Second, Err: err}
	}
	return bus, err
}

// releaseIdle releases sessions without local subscribers for
// IdleTimeout.
func (t *Set[S]) releaseIdle() {
	tick := time.NewTicker(max(t.cfg.IdleTimeout/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-t.ctx.Done():
			return
		case now := <-tick.C:
			// Idle sessions leave the set under the lock that lookups take
			// (a lookup refreshes lastActive), so a lookup either keeps a
			// session or creates a new one.
			var idle []S
			t.mu.Lock()
			for id, s := range t.sessions {
				m := s.Mirror()
				if !m.Ready() {
					continue
				}
				if m.Bus.SubscriberCount() > 0 {
					m.lastActive = now
				} else if now.Sub(m.lastActive) >= t.cfg.IdleTimeout {
					delete(t.sessions, id)
					idle = append(idle, s)
				}
			}
			t.mu.Unlock()
			for _, s := range idle {
				t.cfg.Bus.Log.Debug(t.cfg.Name+": idle session released", "session", s.Mirror().ID, "epoch", s.Mirror().Epoch)
				t.Stop(s, "", "")
			}
		}
	}
}
