package pgbus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
)

// session is this replica's mirror of one session: a mirror bus fed by one
// reader goroutine, which the listener wakes. The mirror set (b.set) opens
// it with engine.Open on the first lookup.
type session struct {
	backplane.Session
	b   *Backplane
	key []byte // id, as the bytea parameter of every query

	// wake tells the reader to read the table: a notification for the
	// session, or a change of the listener's state. One pending wake is
	// enough: a read reads everything there is.
	wake chan struct{}
}

// poke wakes the reader without blocking.
func (s *session) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// engine is the PostgreSQL half of the mirror set (backplane.Engine).
type engine struct{ b *Backplane }

func (g engine) New(id string) *session {
	return &session{b: g.b, key: []byte(id), wake: make(chan struct{}, 1)}
}

// Open reads (or creates) the session's epoch and last id.
func (g engine) Open(ctx context.Context, s *session) (backplane.Start, error) {
	var epoch string
	var last int64
	// Safe to run twice: the second run finds the session the first made.
	err := g.b.withConn(ctx, retryAlways, func(c *pgxpool.Conn) error {
		return c.QueryRow(ctx, g.b.q.ensure, s.key, eventbus.NewEpoch()).Scan(&epoch, &last)
	})
	return backplane.Start{Epoch: epoch, Last: uint64(last)}, err // the rows' ids are the cursor
}

func (g engine) Run(ctx context.Context, s *session, from backplane.Start) { s.run(ctx, from.Last) }

func (g engine) Epoch(ctx context.Context, s *session) (string, error) {
	epoch, _, err := s.Head(ctx)
	return epoch, err
}

// run is the session's reader: it reads the rows after the last id it fed
// into the mirror whenever the listener wakes it (and, while the listener
// is down, every PollInterval, at most OutageTimeout/2), until ctx ends,
// the session is lost (its epoch changed or it was deleted: the mirror is
// released), or nothing was heard from PostgreSQL for OutageTimeout (the
// mirror's streams end with a stream_error, errorKind unavailable).
//
// The bound counts from the last word from PostgreSQL: this reader's last
// read, or the listener's (a quiet session relies on it), and, once reads
// fail, from the last word before the first failure. Every query and
// every backoff is cut at the bound, so neither a hung server nor a slow
// query stretches it; a quiet session whose listener hangs is woken when
// the listener gives up, which it does within a quarter of OutageTimeout
// after its ping was due (see receive).
func (s *session) run(ctx context.Context, last uint64) {
	b := s.b
	lastOK := time.Now()
	var failingSince time.Time // zero while reads succeed
	var backoff backplane.Backoff
	for {
		if h := b.readHook.Load(); h != nil {
			(*h)(ctx, s.ID)
		}
		if ctx.Err() != nil {
			return
		}
		heard := failingSince
		if heard.IsZero() {
			heard = later(lastOK, b.listenerOK())
		}
		left := time.Until(heard.Add(b.opts.OutageTimeout))
		if failingSince.IsZero() {
			// Reads were fine: a reader woken late (a stalled process) may
			// still try once.
			left = max(left, b.ping)
		}
		n, lost, err := s.catchUp(ctx, &last, min(b.opts.PublishTimeout, left))
		if ctx.Err() != nil {
			return
		}
		var wait <-chan time.Time
		switch {
		case err != nil:
			if failingSince.IsZero() {
				failingSince = heard
				b.log.Warn("pgbus: reader lost postgresql; retrying with backoff", "session", s.ID, "error", err)
			}
			left := time.Until(failingSince.Add(b.opts.OutageTimeout))
			if left <= 0 {
				b.set.Outage(s, failingSince, err)
				return
			}
			wait = time.After(min(backoff.Next(), left))
		case lost:
			b.set.Expire(s, "the session was deleted or has a new epoch")
			return
		default:
			if !failingSince.IsZero() {
				failingSince = time.Time{}
				b.log.Info("pgbus: reader reconnected", "session", s.ID, "lastEventId", last)
			}
			lastOK = time.Now()
			backoff.Reset()
			if n == b.opts.ReadCount {
				continue // there may be more
			}
			if !b.listening.Load() {
				wait = time.After(min(b.opts.PollInterval, b.opts.OutageTimeout/2))
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

// catchUp reads the rows after *last (at most ReadCount), within timeout,
// and feeds them to the mirror, moving *last. lost reports that the table
// no longer holds the mirror's epoch.
func (s *session) catchUp(ctx context.Context, last *uint64, timeout time.Duration) (n int, lost bool, err error) {
	b := s.b
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// A second run (on a fresh connection) goes on from where the first
	// stopped feeding.
	err = b.withConn(ctx, retryAlways, func(c *pgxpool.Conn) error {
		rows, err := c.Query(ctx, b.q.catchUp, s.key, int64(*last), b.opts.ReadCount-n)
		if err != nil {
			return err
		}
		defer rows.Close()
		seen := false
		var epoch string
		var id pgtype.Int8
		var typ, env pgtype.DriverBytes // Append copies what it keeps
		for rows.Next() {
			seen = true
			if err := rows.Scan(&epoch, &id, &typ, &env); err != nil {
				return err
			}
			if epoch != s.Epoch {
				lost = true
				return nil
			}
			if !id.Valid {
				break // nothing new
			}
			e := backplane.LogEntry{ID: uint64(id.Int64), Type: string(typ), JSON: env}
			if err := backplane.Append(s.Bus, e); err != nil {
				if errors.Is(err, eventbus.ErrClosed) {
					return nil // stopped; ctx ends the reader
				}
				// Skipped: the next entry is a gap, which resyncs.
				b.log.Error("pgbus: row refused by the mirror", "session", s.ID, "id", e.ID, "error", err)
			}
			*last = e.ID
			n++
		}
		if err := rows.Err(); err != nil {
			return err
		}
		lost = !seen
		return nil
	})
	return n, lost, err
}

// Head implements backplane.Log: the session's epoch and last id in the
// table ("" and 0 when it has none).
func (s *session) Head(ctx context.Context) (epoch string, last uint64, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.b.opts.PublishTimeout)
	defer cancel()
	var l int64
	// The epoch check of a new stream: a read, run again on a fresh
	// connection when its connection was dead.
	err = s.b.withConn(ctx, retryAlways, func(c *pgxpool.Conn) error {
		return c.QueryRow(ctx, s.b.q.head, s.key).Scan(&epoch, &l)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, nil
	}
	return epoch, uint64(l), err
}

// historyBatch is the most rows one query of a resume reads.
const historyBatch = 1000

// ReadHistory implements backplane.Log: the mirror's epoch's rows in req's
// range, and the first id the table holds. With req.MaxBytes it stops
// after the first entry past it (the replay stops there anyway), so a
// resume from far back does not read the whole ring.
func (s *session) ReadHistory(ctx context.Context, req backplane.HistoryRequest) ([]backplane.LogEntry, uint64, error) {
	if req.Upto <= req.After {
		return nil, 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.b.opts.PublishTimeout)
	defer cancel()
	var out []backplane.LogEntry
	var first uint64
	err := s.b.withConn(ctx, retryAlways, func(c *pgxpool.Conn) (err error) {
		out, first, err = s.readHistory(ctx, c, req)
		return err
	})
	return out, first, err
}

func (s *session) readHistory(ctx context.Context, c *pgxpool.Conn, req backplane.HistoryRequest) ([]backplane.LogEntry, uint64, error) {
	b := s.b
	var out []backplane.LogEntry
	spent := 0
	for from := req.After; from < req.Upto; {
		rows, err := c.Query(ctx, b.q.history, s.key, s.Epoch, int64(from), int64(req.Upto), historyBatch)
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
			out = append(out, backplane.LogEntry{ID: uint64(id), Type: string(typ), JSON: env})
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
	if err := c.QueryRow(ctx, b.q.first, s.key, s.Epoch).Scan(&first); err != nil {
		return nil, 0, err
	}
	if !first.Valid {
		return nil, 0, fmt.Errorf("pgbus: session %q holds no events of epoch %s: deleted or replaced", s.ID, s.Epoch)
	}
	return nil, uint64(first.Int64), nil
}
