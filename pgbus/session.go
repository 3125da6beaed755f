package pgbus

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/ssebus/eventbus"
)

// session is this replica's mirror of one session: a mirror bus fed by one
// reader goroutine, which the listener wakes. It is created by the first
// lookup (which runs open); concurrent lookups wait for ready.
type session struct {
	b   *Backplane
	id  string
	key []byte // id, as the bytea parameter of every query

	ready chan struct{} // closed when open has finished
	// Set by open, under b.mu (dispatch reads bus and epoch under it),
	// before ready is closed.
	err    error
	bus    *eventbus.EventBus
	epoch  string
	cancel context.CancelFunc

	// wake tells the reader to read the table: a notification for the
	// session, or a change of the listener's state. One pending wake is
	// enough: a read reads everything there is.
	wake chan struct{}

	lastActive time.Time // guarded by b.mu
}

// errReleased is the error of a session released (Delete, a new epoch)
// while it was being opened; a waiting lookup tries again.
var errReleased = errors.New("pgbus: session released while opening")

func (s *session) isReady() bool {
	select {
	case <-s.ready:
		return s.err == nil
	default:
		return false
	}
}

// poke wakes the reader without blocking.
func (s *session) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// readySession returns this replica's ready mirror of id, or nil.
func (b *Backplane) readySession(id string) *session {
	b.mu.Lock()
	s := b.sessions[id]
	b.mu.Unlock()
	if s == nil || !s.isReady() {
		return nil
	}
	return s
}

// session returns the ready session id, creating it when needed; created
// reports whether this call made it.
func (b *Backplane) session(ctx context.Context, id string) (s *session, created bool, err error) {
	if err := validSession(id); err != nil {
		return nil, false, err
	}
	for attempt := 0; ; attempt++ {
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return nil, false, eventbus.ErrClosed
		}
		s = b.sessions[id]
		created = s == nil
		if created {
			s = &session{b: b, id: id, key: []byte(id), ready: make(chan struct{}), wake: make(chan struct{}, 1)}
			b.sessions[id] = s
			s.lastActive = time.Now()
			b.mu.Unlock()
			s.open()
		} else {
			s.lastActive = time.Now()
			b.mu.Unlock()
			select {
			case <-s.ready:
			case <-ctx.Done():
				return nil, false, ctx.Err()
			}
		}
		if errors.Is(s.err, errReleased) && attempt < 3 {
			continue
		}
		if s.err != nil {
			return nil, false, s.err
		}
		b.mu.Lock()
		current := b.sessions[id] == s
		b.mu.Unlock()
		if !current && attempt < 3 {
			continue // released meanwhile (idle, a new epoch, Delete)
		}
		return s, created, nil
	}
}

// open reads (or creates) the session's epoch and last id, builds the
// mirror and starts the reader. It runs detached from the request that
// asked for it: other lookups wait for it too.
func (s *session) open() {
	b := s.b
	defer close(s.ready)
	fail := func(err error) {
		s.err = err
		b.mu.Lock()
		if b.sessions[s.id] == s {
			delete(b.sessions, s.id)
		}
		b.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(b.ctx, b.opts.PublishTimeout)
	var epoch string
	var last int64
	err := b.pool.QueryRow(ctx, b.q.ensure, s.key, eventbus.NewEpoch()).Scan(&epoch, &last)
	cancel()
	if err != nil {
		fail(unavailable("open", s.id, err))
		return
	}
	bus, err := eventbus.NewFed(b.opts.Bus, eventbus.FeedOptions{
		Epoch: epoch, NextID: uint64(last) + 1, Log: s, LagTimeout: b.opts.PublishTimeout})
	if err != nil {
		fail(unavailable("open", s.id, err)) // a corrupt epoch; the options were validated by New
		return
	}
	rctx, rcancel := context.WithCancel(b.ctx)
	b.mu.Lock()
	if b.closed || b.sessions[s.id] != s {
		b.mu.Unlock()
		rcancel()
		bus.Close()
		if b.closed {
			s.err = eventbus.ErrClosed
		} else {
			s.err = errReleased
		}
		return
	}
	s.bus, s.epoch, s.cancel = bus, epoch, rcancel
	b.wg.Add(1)
	b.mu.Unlock()
	// The session is in the map before the reader's first read, so a
	// publish committed after that read is notified to a listener that
	// finds the session: none falls between the read and the map.
	go s.run(rctx, uint64(last))
}

// stop ends the reader and closes the mirror (its streams drain, then end).
// The session must already be out of the backplane's map. Idempotent.
func (s *session) stop() {
	s.close(nil)
}

// close is stop; with why set, the mirror ends every stream with a
// stream_error of errorKind unavailable saying why.
func (s *session) close(why error) {
	s.b.mu.Lock()
	cancel, bus := s.cancel, s.bus
	s.b.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if bus == nil {
		return
	}
	if why != nil {
		bus.CloseWithError(eventbus.ErrorKindUnavailable, why.Error())
	} else {
		bus.Close()
	}
}

// remove takes s out of the backplane's map; it reports whether s was
// still there.
func (b *Backplane) remove(s *session) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sessions[s.id] == s {
		delete(b.sessions, s.id)
		return true
	}
	return false
}

// expire removes s from the backplane and stops it.
func (b *Backplane) expire(s *session, why string) {
	b.remove(s)
	b.log.Info("pgbus: session released", "session", s.id, "epoch", s.epoch, "reason", why)
	s.stop()
}

// outage removes s from the backplane and ends its streams with a
// stream_error of errorKind unavailable: its reader could not reach
// PostgreSQL for OutageTimeout. The next lookup opens it anew.
func (b *Backplane) outage(s *session, down time.Duration, err error) {
	b.remove(s)
	b.log.Error("pgbus: postgresql unreachable past OutageTimeout; ending the session's streams",
		"session", s.id, "epoch", s.epoch, "down", down.Round(time.Millisecond), "error", err)
	s.close(fmt.Errorf("pgbus: PostgreSQL unreachable for %v; reconnect with backoff and resume", down.Round(time.Second)))
}

// Reader backoff after a PostgreSQL error.
const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = 2 * time.Second
)

func nextBackoff(d time.Duration) time.Duration {
	d = min(max(2*d, minBackoff), maxBackoff)
	return d/2 + rand.N(d/2+1) // jitter, so replicas do not retry in step
}

// run is the session's reader: it reads the rows after the last id it fed
// into the mirror whenever the listener wakes it (and every PollInterval
// while the listener is down), until ctx ends, the session is lost (its
// epoch changed or it was deleted: the mirror is released), or PostgreSQL
// stays unreachable for OutageTimeout (the mirror's streams end with a
// stream_error, errorKind unavailable).
func (s *session) run(ctx context.Context, last uint64) {
	b := s.b
	defer b.wg.Done()
	lastOK := time.Now()
	var failingSince time.Time // zero while reads succeed
	var delay time.Duration
	for {
		if h := b.readHook.Load(); h != nil {
			(*h)(ctx, s.id)
		}
		if ctx.Err() != nil {
			return
		}
		n, lost, err := s.catchUp(ctx, &last)
		if ctx.Err() != nil {
			return
		}
		var wait <-chan time.Time
		switch {
		case err != nil:
			now := time.Now()
			if failingSince.IsZero() {
				// The session was fine until the later of this reader's last
				// read and the listener's last word from PostgreSQL (a quiet
				// session relies on the listener).
				failingSince = later(lastOK, b.listenerOK())
				b.log.Warn("pgbus: reader lost postgresql; retrying with backoff", "session", s.id, "error", err)
			}
			if down := now.Sub(failingSince); down >= b.opts.OutageTimeout {
				b.outage(s, down, err)
				return
			}
			delay = nextBackoff(delay)
			wait = time.After(delay)
		case lost:
			b.expire(s, "the session was deleted or has a new epoch")
			return
		default:
			if !failingSince.IsZero() {
				failingSince = time.Time{}
				b.log.Info("pgbus: reader reconnected", "session", s.id, "lastEventId", last)
			}
			lastOK, delay = time.Now(), 0
			if n == b.opts.ReadCount {
				continue // there may be more
			}
			if !b.listening.Load() {
				wait = time.After(b.opts.PollInterval)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-wait:
		}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// catchUp reads the rows after *last (at most ReadCount) and feeds them to
// the mirror, moving *last. lost reports that the table no longer holds
// the mirror's epoch.
func (s *session) catchUp(ctx context.Context, last *uint64) (n int, lost bool, err error) {
	b := s.b
	ctx, cancel := context.WithTimeout(ctx, b.opts.PublishTimeout)
	defer cancel()
	rows, err := b.pool.Query(ctx, b.q.catchUp, s.key, int64(*last), b.opts.ReadCount)
	if err != nil {
		return 0, false, err
	}
	defer rows.Close()
	seen := false
	var epoch string
	var id pgtype.Int8
	var typ, env pgtype.DriverBytes // Append copies what it keeps
	for rows.Next() {
		seen = true
		if err := rows.Scan(&epoch, &id, &typ, &env); err != nil {
			return n, false, err
		}
		if epoch != s.epoch {
			return n, true, nil
		}
		if !id.Valid {
			break // nothing new
		}
		e := eventbus.LogEntry{ID: uint64(id.Int64), Type: string(typ), JSON: env}
		if err := s.bus.Append(e); err != nil {
			if errors.Is(err, eventbus.ErrClosed) {
				return n, false, nil // stopped; ctx ends the reader
			}
			// Skipped: the next entry is a gap, which resyncs.
			b.log.Error("pgbus: row refused by the mirror", "session", s.id, "id", e.ID, "error", err)
		}
		*last = e.ID
		n++
	}
	if err := rows.Err(); err != nil {
		return n, false, err
	}
	return n, !seen, nil
}

// Head implements eventbus.Log: the session's epoch and last id in the
// table ("" and 0 when it has none).
func (s *session) Head(ctx context.Context) (epoch string, last uint64, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.b.opts.PublishTimeout)
	defer cancel()
	var l int64
	err = s.b.pool.QueryRow(ctx, s.b.q.head, s.key).Scan(&epoch, &l)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, nil
	}
	return epoch, uint64(l), err
}

// historyBatch is the most rows one query of a resume reads.
const historyBatch = 1000

// ReadHistory implements eventbus.Log: the mirror's epoch's rows in req's
// range, and the first id the table holds. With req.MaxBytes it stops
// after the first entry past it (the replay stops there anyway), so a
// resume from far back does not read the whole ring.
func (s *session) ReadHistory(ctx context.Context, req eventbus.HistoryRequest) ([]eventbus.LogEntry, uint64, error) {
	if req.Upto <= req.After {
		return nil, 0, nil
	}
	b := s.b
	ctx, cancel := context.WithTimeout(ctx, b.opts.PublishTimeout)
	defer cancel()
	var out []eventbus.LogEntry
	spent := 0
	for from := req.After; from < req.Upto; {
		rows, err := b.pool.Query(ctx, b.q.history, s.key, s.epoch, int64(from), int64(req.Upto), historyBatch)
		if err != nil {
			return nil, 0, err
		}
		got := 0
		full := false
		for rows.Next() {
			var id int64
			var typ pgtype.DriverBytes
			var env []byte // kept: a copy
			if err := rows.Scan(&id, &typ, &env); err != nil {
				rows.Close()
				return nil, 0, err
			}
			out = append(out, eventbus.LogEntry{ID: uint64(id), Type: string(typ), JSON: env})
			got++
			from = uint64(id)
			spent += len(env)
			if req.MaxBytes > 0 && len(out) > 1 && spent > req.MaxBytes {
				full = true
				break
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, 0, err
		}
		if full || got < historyBatch {
			break
		}
	}
	if len(out) > 0 {
		return out, out[0].ID, nil
	}
	// Nothing in (After, Upto]: trimmed away, or the epoch is gone.
	var first pgtype.Int8
	if err := b.pool.QueryRow(ctx, b.q.first, s.key, s.epoch).Scan(&first); err != nil {
		return nil, 0, err
	}
	if !first.Valid {
		return nil, 0, fmt.Errorf("pgbus: session %q holds no events of epoch %s: deleted or replaced", s.id, s.epoch)
	}
	return nil, uint64(first.Int64), nil
}
