// Package pgbus is a PostgreSQL backplane for package eventbus: a
// session's events get their ids from one shared log in a table, so a
// client may resume with Last-Event-ID on any replica of a daemon behind a
// load balancer. It is the redisbus backplane's twin for daemons that
// already run PostgreSQL and would rather not add Redis, built on the
// public backplane kit alone (package backplane: its Set, and the mirror's
// seam NewMirror, Append, Log, Encoder).
//
// Per session, rows of a table are the log. Publish (on any replica)
// encodes the event locally and calls one PL/pgSQL function that takes
// the session's transaction-scoped advisory lock (pg_advisory_xact_lock),
// assigns the next contiguous id (1, 2, 3 ...), inserts the envelope,
// trims the session's rows to the ring's bounds (events and bytes), and
// sends a NOTIFY with the session and the id. The lock is held until the
// commit, so commit order is id order across replicas: no
// replica can see id n+1 before n. Each replica keeps one LISTEN
// connection; a notification wakes the reader of the local mirror
// eventbus.EventBus of that session, which reads the new rows in id order
// and feeds the mirror: every replica delivers the same ids in the same
// order, and per-subscriber queues, warnings and evictions stay local.
//
// NOTIFY is not durable: a listener that reconnects (or a mirror made
// while it was away) reads what it missed from the table, and while the
// listener is down readers poll the table. What the table no longer holds
// is announced to subscribers as state_resync_required (ring_evicted). A
// resume the mirror's ring cannot answer is answered from the table
// (backplane.Log), outside the bus lock, ahead of the live frames.
//
// The epoch (32 hex characters) lives in the sessions table. Delete
// forgets a session; its next use starts a new epoch with ids from 1, and
// every replica closes its mirror of the old one (its streams end; clients
// reconnect with the old epoch and get epoch_reset). A new stream checks
// the session's epoch in the table first, so it never joins an epoch the
// table no longer has (and fails while PostgreSQL is down).
//
// Failures are bounded and announced: Publish returns within
// Options.PublishTimeout, with an error wrapping ErrOutcomeUnknown when
// the request may have been applied (PublishIdempotent with the same key
// applies a retry at most once), and a mirror that hears nothing from
// PostgreSQL for Options.OutageTimeout ends its streams with a
// stream_error of errorKind "unavailable" (clients reconnect with backoff
// and resume). A pooled connection the server closed (a pooler bounce, a
// failover, pg_terminate_backend) is passed over, or the query is run
// again on a fresh connection where that cannot apply anything twice, and
// the pool is reset. A schema found missing (a database restarted empty)
// is created again; its sessions start new epochs.
package pgbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
)

// Defaults of Options.
const (
	DefaultPublishTimeout    = 2 * time.Second
	DefaultOutageTimeout     = 30 * time.Second
	DefaultIdempotencyWindow = 10 * time.Minute
	DefaultIdleTimeout       = time.Minute
	DefaultSchema            = "eventbus"
	DefaultPollInterval      = time.Second
	DefaultReadCount         = 512
	// MaxSessionIDBytes bounds a session id: eventbus.MaxSessionIDBytes,
	// the bound of the rule every entry point applies
	// (eventbus.CheckSessionID).
	MaxSessionIDBytes = eventbus.MaxSessionIDBytes
)

var (
	// ErrUnavailable is wrapped by the errors of Publish, Delete, Info,
	// Signal and session creation when PostgreSQL did not answer in time
	// or failed.
	ErrUnavailable = backplane.UnavailableError("pgbus: postgresql unavailable")
	// ErrOutcomeUnknown is wrapped (with ErrUnavailable) by the error of a
	// publish whose request reached PostgreSQL but whose answer did not
	// come back: the event may or may not have been appended. A retry with
	// PublishIdempotent and the same key applies it at most once.
	ErrOutcomeUnknown = backplane.OutcomeUnknownError("pgbus: publish outcome unknown")
	// ErrInvalidSession is wrapped by the error for a session id that
	// eventbus.CheckSessionID refuses (empty, longer than
	// MaxSessionIDBytes, or not valid UTF-8); the error wraps
	// eventbus.ErrInvalidSessionID too.
	ErrInvalidSession = errors.New("pgbus: invalid session id")
)

// Options configures a Backplane. The zero value is valid.
type Options struct {
	// Bus configures every local mirror bus (and the encoding of
	// published events: MaxEventBytes, Now). Its RingSize and RingMaxBytes
	// also bound the rows each session keeps in the table.
	Bus eventbus.Options
	// RingSize, when set, overrides Bus.RingSize: the events a session's
	// rows and mirrors keep for resuming clients.
	RingSize int
	// PublishTimeout bounds each Publish, Delete, Info, Signal, session
	// creation and reader query (and the wait of a resume for a lagging
	// reader); 0 means DefaultPublishTimeout.
	PublishTimeout time.Duration
	// OutageTimeout is how long a mirror may go without a word from
	// PostgreSQL (an answer to its reader, or to the listener, which
	// pings every OutageTimeout/4, at most every second) before it ends
	// every stream with a stream_error of errorKind "unavailable" and is
	// released: the streams end between OutageTimeout minus one ping
	// interval and OutageTimeout after PostgreSQL went away, whatever the
	// reader was doing (every query and backoff is cut at the bound). 0
	// means DefaultOutageTimeout; below 100ms is refused.
	OutageTimeout time.Duration
	// IdempotencyWindow is how long PublishIdempotent remembers a key,
	// from its first publish; 0 means DefaultIdempotencyWindow.
	IdempotencyWindow time.Duration
	// IdleTimeout is how long a session may have no local subscriber
	// before its mirror and reader are released; 0 means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// Schema is the PostgreSQL schema of the backplane's tables and
	// functions (New creates what is missing) and the prefix of its
	// notification channels: 1 to 48 bytes of [a-z0-9_], not starting
	// with a digit; "" means DefaultSchema.
	Schema string
	// SessionTTL, when positive, deletes a session (as Delete does) once
	// it has had no publish and no new mirror for this long; the next use
	// starts a new epoch. 0 keeps sessions until Delete.
	SessionTTL time.Duration
	// PollInterval is how often a reader reads the table while the
	// listener is disconnected (notifications are lost then); 0 means
	// DefaultPollInterval.
	PollInterval time.Duration
	// ReadCount is the most rows one reader query returns; 0 means
	// DefaultReadCount.
	ReadCount int
	// ShutdownRetryAfter is the retryAfter of the stream_error shutdown
	// that Close gives every stream of this replica after what was queued
	// for it: its clients come back after a random delay in
	// [ShutdownRetryAfter, 2*ShutdownRetryAfter], through the load
	// balancer to another replica. 0 means
	// eventbus.DefaultShutdownRetryAfter; negative is an error.
	ShutdownRetryAfter time.Duration
	// Logger receives the backplane's own log lines; nil means
	// Bus.Logger, then slog.Default().
	Logger *slog.Logger
}

// Backplane feeds local mirror buses from PostgreSQL. Create it with New;
// it is safe for concurrent use. Close ends every reader and mirror.
type Backplane struct {
	pool *pgxpool.Pool
	opts Options
	q    queries
	bus  backplane.Bus // the bounds of the log
	log  *slog.Logger

	// set holds the mirrors and runs every goroutine of the backplane
	// (readers, the listener, the janitors) until Close.
	set *backplane.Set[*session]

	// The listener's state: whether it is LISTENing now, and when it last
	// heard from PostgreSQL (Unix nanoseconds).
	listening  atomic.Bool
	listenedAt atomic.Int64

	// readHook, when set (tests), runs before every query of a reader.
	readHook atomic.Pointer[func(ctx context.Context, session string)]

	// ping is how long the listener waits for a notification before it
	// pings its connection: a quarter of OutageTimeout, at most
	// listenPing.
	ping time.Duration

	// Dead connections and a missing schema (conn.go).
	maxConns  int          // the pool's MaxConns
	resetAt   atomic.Int64 // when the pool was last reset (Unix nanoseconds)
	schemaMu  sync.Mutex   // held while the schema is created again
	schemaGen atomic.Uint64
}

// New returns a backplane publishing to and reading from pool. It creates
// the schema's tables and functions when they are missing (the pool's
// role needs CREATE on the database, or an existing schema), bounded by
// ctx, and starts the listener in the background: a PostgreSQL that is
// down later is retried. It fails with an error wrapping
// eventbus.ErrInvalidOption for invalid options, and with one wrapping
// ErrUnavailable when the schema cannot be created. The pool stays the
// caller's: close it after Close.
func New(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Backplane, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", eventbus.ErrInvalidOption)
	}
	var d backplane.Durations
	d.Check("PublishTimeout", &opts.PublishTimeout, DefaultPublishTimeout, time.Millisecond)
	d.Check("OutageTimeout", &opts.OutageTimeout, DefaultOutageTimeout, minOutageTimeout)
	d.Check("IdempotencyWindow", &opts.IdempotencyWindow, DefaultIdempotencyWindow, time.Millisecond)
	d.Check("IdleTimeout", &opts.IdleTimeout, DefaultIdleTimeout, time.Millisecond)
	d.Check("PollInterval", &opts.PollInterval, DefaultPollInterval, time.Millisecond)
	d.Check("ShutdownRetryAfter", &opts.ShutdownRetryAfter, eventbus.DefaultShutdownRetryAfter, 0)
	if err := d.Err(); err != nil {
		return nil, err
	}
	if opts.SessionTTL < 0 || opts.ReadCount < 0 {
		return nil, fmt.Errorf("%w: SessionTTL and ReadCount must not be negative", eventbus.ErrInvalidOption)
	}
	if opts.ReadCount == 0 {
		opts.ReadCount = DefaultReadCount
	}
	if opts.Schema == "" {
		opts.Schema = DefaultSchema
	}
	if !validSchema(opts.Schema) {
		return nil, fmt.Errorf("%w: Schema %q is not 1 to %d bytes of [a-z0-9_] starting with a letter or '_'",
			eventbus.ErrInvalidOption, opts.Schema, maxSchemaBytes)
	}
	bus, err := backplane.PrepareBus(&opts.Bus, opts.RingSize, opts.Logger)
	if err != nil {
		return nil, err
	}
	log := bus.Log
	if err := migrate(ctx, pool, opts.Schema); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	b := &Backplane{
		pool:     pool,
		opts:     opts,
		q:        newQueries(opts.Schema),
		bus:      bus,
		log:      log,
		ping:     min(opts.OutageTimeout/4, listenPing),
		maxConns: int(pool.Config().MaxConns),
	}
	b.set = backplane.New[*session](backplane.Config{
		Name: "pgbus", Engine: "PostgreSQL", Store: "the table", Bus: bus,
		Timeout: opts.PublishTimeout, IdleTimeout: opts.IdleTimeout, OutageTimeout: opts.OutageTimeout,
		Valid: validSession, Unavailable: unavailable, ErrUnavailable: ErrUnavailable,
		ShutdownRetryAfter: opts.ShutdownRetryAfter,
	}, engine{b})
	b.set.Go(b.listen)
	b.set.Go(b.maintain)
	return b, nil
}

// Close releases every session of this replica: readers and the listener
// stop, mirrors close (their streams drain what is queued, then get
// stream_error shutdown with Options.ShutdownRetryAfter, and end), and
// Close returns when every goroutine of the backplane has ended.
// Afterwards Publish returns eventbus.ErrClosed. Idempotent. The rows
// stay: other replicas go on.
func (b *Backplane) Close() error {
	b.set.Close(nil)
	return nil
}

// validSession is the session id rule every entry point applies
// (eventbus.CheckSessionID), its error wrapped with ErrInvalidSession.
func validSession(id string) error {
	if err := eventbus.CheckSessionID(id); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidSession, err)
	}
	return nil
}

// unavailable wraps a PostgreSQL failure of an operation that did not
// apply anything.
func unavailable(op, session string, err error) error {
	return fmt.Errorf("%w: %s session %q: %v", ErrUnavailable, op, session, err)
}

// Publish appends e to session's log and returns its id and the session's
// epoch. The event reaches the subscribers of every replica through their
// readers (this replica's too), in id order.
//
// Publish never panics and returns within PublishTimeout: an error
// wrapping ErrUnavailable when PostgreSQL fails or is too slow, which also
// wraps ErrOutcomeUnknown when the request was sent and its answer lost
// (the event may or may not have been appended: use PublishIdempotent to
// retry safely); eventbus.ErrInvalidEvent or eventbus.ErrEventTooLarge
// for an event the bus would refuse (no id is used); ErrInvalidSession;
// eventbus.ErrClosed after Close.
func (b *Backplane) Publish(ctx context.Context, session string, e eventbus.Event) (id uint64, epoch string, err error) {
	id, epoch, _, err = b.publish(ctx, session, "", false, e)
	return id, epoch, err
}

// PublishIdempotent is Publish with an idempotency key, so that a publish
// whose outcome is unknown can be retried safely: within
// IdempotencyWindow of the first publish with key in session, a publish
// with the same key and the same event (the same
// backplane.Encoder.Fingerprint: type, data, _meta but serverTimestamp,
// originatorClientId) appends nothing and returns the first publish's id
// with duplicate true; the same key with a different event is an error
// wrapping eventbus.ErrIdempotencyKeyReused. The check and the append
// happen under the session's lock: concurrent publishes with one key, on
// any replicas, append once. The window counts from the first publish on
// PostgreSQL's clock; a duplicate does not extend it. Delete forgets a
// session's keys. A key is checked by eventbus.CheckIdempotencyKey (1 to
// eventbus.MaxIdempotencyKeyBytes bytes of printable ASCII, else an error
// wrapping eventbus.ErrInvalidIdempotencyKey; nothing is sent). Otherwise
// as Publish: after an error wrapping ErrOutcomeUnknown, retry with the
// same key.
func (b *Backplane) PublishIdempotent(ctx context.Context, session, key string, e eventbus.Event) (id uint64, epoch string, duplicate bool, err error) {
	if err := eventbus.CheckIdempotencyKey(key); err != nil {
		return 0, "", false, err
	}
	return b.publish(ctx, session, key, true, e)
}

func (b *Backplane) publish(ctx context.Context, session, key string, idem bool, e eventbus.Event) (uint64, string, bool, error) {
	p, err := b.set.Prepare(ctx, session, key, e)
	if err != nil {
		return 0, "", false, err
	}
	ev := p.Event
	var keyArg, fp any // nil: SQL NULL, no key
	if idem {
		keyArg, fp = key, p.Fingerprint
	}
	ctx, cancel := context.WithTimeout(ctx, b.opts.PublishTimeout)
	defer cancel()
	var id int64
	var epoch string
	var dup bool
	// With a key, a publish may run twice (the second run finds the key
	// if the first was applied); without one, only when the first was not
	// sent.
	r := retryUnsent
	if idem {
		r = retryAlways
	}
	var unknown error // the error of an attempt that may have been applied
	err = b.withConn(ctx, r, func(conn *pgxpool.Conn) error {
		err := conn.QueryRow(ctx, b.q.publish, []byte(session), eventbus.NewEpoch(), []byte(ev.Type), ev.Tail,
			b.bus.MaxLen, b.bus.MaxBytes, b.bus.MaxEvent, keyArg, fp,
			b.opts.IdempotencyWindow.Milliseconds(), b.opts.PublishTimeout.Milliseconds()).Scan(&id, &epoch, &dup)
		if err != nil && mayHaveApplied(err) {
			unknown = err
		}
		return err
	})
	if err != nil {
		return 0, "", false, b.publishError(session, err, unknown)
	}
	p.Appended(epoch)
	return uint64(id), epoch, dup, nil
}

// mayHaveApplied reports whether a publish that failed with err may have
// been applied all the same. An ERROR aborted its transaction; pgconn
// knows when nothing was sent (no connection, a failed write). A FATAL
// (the backend terminated: a restart, pg_terminate_backend), a cut
// connection or a timeout may come after the commit.
func mayHaveApplied(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Severity == "ERROR" {
		return false
	}
	return !pgconn.SafeToRetry(err)
}

// publishError classifies the error of a publish; unknown is the error of
// an attempt that may have been applied (nil: none).
func (b *Backplane) publishError(session string, err, unknown error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "EB001":
			return fmt.Errorf("%w: %s bytes encoded, MaxEventBytes is %d", eventbus.ErrEventTooLarge, pe.Message, b.bus.MaxEvent)
		case "EB002":
			return fmt.Errorf("%w: session %q: %s", eventbus.ErrIdempotencyKeyReused, session, pe.Message)
		}
	}
	if unknown == nil {
		return unavailable("publish to", session, err) // nothing was appended
	}
	var why string
	switch {
	case deadConn(unknown):
		why = deadReason(unknown) + " after the request was sent"
	case pgconn.Timeout(unknown) || errors.Is(unknown, context.DeadlineExceeded):
		why = fmt.Sprintf("no answer within PublishTimeout %v (%v)", b.opts.PublishTimeout, unknown)
	default:
		why = fmt.Sprintf("the answer was lost (%v)", unknown)
	}
	return fmt.Errorf("%w: %w: session %q: %s", ErrUnavailable, ErrOutcomeUnknown, session, why)
}

// Delete forgets session in PostgreSQL (its epoch, events and idempotency
// keys) and releases this replica's mirror; other replicas release theirs
// when their listener hears of it (at once, or when it reconnects), and a
// new stream on any replica checks the epoch first. The next use of the
// session starts a new epoch with ids from 1. Deleting an unknown session
// is not an error.
func (b *Backplane) Delete(ctx context.Context, session string) error {
	if err := validSession(session); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, b.opts.PublishTimeout)
	defer cancel()
	var deleted bool
	err := b.withConn(ctx, retryAlways, func(c *pgxpool.Conn) error {
		return c.QueryRow(ctx, b.q.del, []byte(session), 0).Scan(&deleted)
	})
	if err != nil {
		return unavailable("delete", session, err)
	}
	b.set.Deleted(session)
	return nil
}

// Info describes a session as PostgreSQL and this replica see it (see
// backplane.Info); Bytes is the envelope bytes its rows hold.
type Info = backplane.Info

// Info returns what PostgreSQL and this replica hold of session. It does
// not create the session.
func (b *Backplane) Info(ctx context.Context, session string) (Info, error) {
	if err := validSession(session); err != nil {
		return Info{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, b.opts.PublishTimeout)
	defer cancel()
	var in Info
	var last, first, bytes int64
	err := b.withConn(ctx, retryAlways, func(c *pgxpool.Conn) error {
		return c.QueryRow(ctx, b.q.info, []byte(session)).Scan(&in.Epoch, &last, &first, &bytes)
	})
	switch {
	case err == nil:
		in.Exists = true
		in.LastEventID, in.FirstEventID, in.Bytes = uint64(last), uint64(first), uint64(bytes)
	case !errors.Is(err, pgx.ErrNoRows):
		return Info{}, unavailable("read", session, err)
	}
	in.LocalLastEventID, in.Subscribers, in.Local = b.set.Local(session)
	return in, nil
}

// Sessions returns how many sessions this replica holds a mirror of.
func (b *Backplane) Sessions() int { return b.set.Len() }

// Bus returns this replica's mirror bus of session, creating it (and its
// reader) when needed. A mirror opened before this call is first checked
// against the session's epoch in the table (one query): a mirror of an
// epoch the table no longer has (a Delete this replica has not heard of
// yet) is released and a new one made, so a stream never joins a dead
// epoch. It returns an error wrapping ErrUnavailable when PostgreSQL
// cannot be reached for that. Subscribe through the backplane (Subscribe,
// or the Handler) or on this bus: its Subscribe answers resumes from the
// table. Its Publish returns backplane.ErrMirror; Signal delivers to this
// replica's subscribers only.
func (b *Backplane) Bus(ctx context.Context, session string) (*eventbus.EventBus, error) {
	return b.set.Bus(ctx, session)
}

// Subscribe subscribes to session on this replica, as
// eventbus.EventBus.Subscribe does, on the mirror Bus returns (so a new
// subscription never joins a dead epoch): a resume its mirror cannot
// answer is answered from the table. It returns an error wrapping
// ErrUnavailable when PostgreSQL cannot be reached.
func (b *Backplane) Subscribe(ctx context.Context, session string, opts eventbus.SubscribeOptions) (*eventbus.Subscription, error) {
	return b.set.Subscribe(ctx, session, opts)
}

// Handler returns an SSE handler for a route such as
// "GET /session/{id}/events": its Lookup gets or creates the session named
// by r.PathValue("id") (an invalid id, see eventbus.CheckSessionID, is
// 400 invalid_session_id; PostgreSQL unavailable is 503 unavailable and a
// closed Backplane 503 shutting_down, both with Retry-After: 1, as
// eventbus.StatusError wrapping the cause); the mirror
// it returns answers resumes from the table. Set Retry, Heartbeat,
// WriteTimeout, Logger, CORS or Authorize on it before serving; keep
// Lookup (wrap it to add to it).
func (b *Backplane) Handler() *eventbus.Handler { return b.set.Handler() }

// maintain deletes expired idempotency keys (their rows are ignored once
// expired, and overwritten by a new use of the key; this keeps the table
// small) and, with SessionTTL, sessions untouched for that long. Every
// replica runs it; the deletes are idempotent.
func (b *Backplane) maintain() {
	every := max(min(b.opts.IdempotencyWindow/10, time.Minute), time.Second)
	if ttl := b.opts.SessionTTL; ttl > 0 {
		every = min(every, max(ttl/4, 10*time.Millisecond))
	}
	t := time.NewTicker(every)
	defer t.Stop()
	lastPurge := time.Now()
	for {
		select {
		case <-b.set.Context().Done():
			return
		case now := <-t.C:
			if now.Sub(lastPurge) >= b.opts.IdempotencyWindow/10 {
				lastPurge = now
				b.purgeKeys()
			}
			if b.opts.SessionTTL > 0 {
				b.expireSessions()
			}
		}
	}
}

func (b *Backplane) purgeKeys() {
	for b.set.Context().Err() == nil {
		ctx, cancel := context.WithTimeout(b.set.Context(), b.opts.PublishTimeout)
		var tag pgconn.CommandTag
		err := b.withConn(ctx, retryAlways, func(c *pgxpool.Conn) (err error) {
			tag, err = c.Exec(ctx, b.q.purge)
			return err
		})
		cancel()
		if err != nil {
			if b.set.Context().Err() == nil {
				b.log.Debug("pgbus: purging expired idempotency keys failed", "error", err)
			}
			return
		}
		if tag.RowsAffected() < 5000 {
			return
		}
	}
}

func (b *Backplane) expireSessions() {
	ctx, cancel := context.WithTimeout(b.set.Context(), b.opts.PublishTimeout)
	defer cancel()
	ttl := b.opts.SessionTTL.Milliseconds()
	var idle [][]byte
	err := b.withConn(ctx, retryAlways, func(c *pgxpool.Conn) error {
		idle = idle[:0]
		rows, err := c.Query(ctx, b.q.idle, ttl)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id []byte
			if err = rows.Scan(&id); err != nil {
				return err
			}
			idle = append(idle, id)
		}
		return rows.Err()
	})
	for _, id := range idle {
		if err != nil {
			break
		}
		// Under the session's lock, and only if still untouched.
		var deleted bool
		err = b.withConn(ctx, retryAlways, func(c *pgxpool.Conn) error {
			return c.QueryRow(ctx, b.q.del, id, ttl).Scan(&deleted)
		})
		if err == nil && deleted {
			b.log.Info("pgbus: session expired", "session", string(id), "ttl", b.opts.SessionTTL)
		}
	}
	if err != nil && b.set.Context().Err() == nil {
		b.log.Debug("pgbus: expiring sessions failed", "error", err)
	}
}
