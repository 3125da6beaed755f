// Package redisbus is a Redis Streams backplane for package eventbus: a
// session's events get their ids from one shared log, so a client may
// resume with Last-Event-ID on any replica of a daemon behind a load
// balancer.
//
// Per session, a Redis stream is the log. Publish (on any replica) encodes
// the event locally and runs one Lua script that assigns the next
// contiguous id (1, 2, 3 ...), XADDs the envelope as entry "<id>-0" and
// trims the stream to the ring's bounds (events and bytes), atomically.
// Each replica keeps a local mirror eventbus.EventBus per session that has
// subscribers there, fed by one reader goroutine (XREAD BLOCK from the last
// id it saw): every replica delivers the same ids in the same order, and
// per-subscriber queues, warnings and evictions stay local, in the mirror.
//
// A resume the mirror's ring cannot answer (the replica joined late, or
// restarted) is answered from the stream with XRANGE, outside the bus lock,
// ahead of the live frames; the resume rules (docs/SPEC.md section 4) hold
// with the log as the ring: ring_evicted when the stream no longer holds the
// event after the cursor, epoch_reset for a cursor above the last id or
// another epoch, the replay budget.
//
// The epoch (32 hex characters) is created with the session's keys. A lost
// stream (Redis restarted without persistence, a key evicted or expired, or
// Delete) means a new epoch with ids from 1: every replica closes its
// mirror (its streams end; clients reconnect with the old epoch and get
// epoch_reset on the new one). A new stream checks the epoch with Redis
// when it opens, so it never joins an epoch Redis no longer has.
//
// While Redis is unreachable Publish fails within Options.PublishTimeout
// (ErrOutcomeUnknown when the event may have been appended all the same:
// PublishIdempotent retries that at most once), and readers retry with
// backoff and go on from their last id: nothing is lost while the stream
// still holds it, and subscribers get state_resync_required (ring_evicted)
// for what it no longer holds. A reader that cannot reach Redis for
// Options.OutageTimeout ends its mirror with a terminal stream_error
// (errorKind "unavailable"): clients reconnect with backoff and resume from
// their cursor. Signal spreads change signals to every replica through
// Redis Pub/Sub.
//
// Give the client ContextTimeoutEnabled: true, so that a Redis that hangs
// (rather than refusing connections) cannot hold Publish past its timeout,
// and a PoolSize above the number of sessions a replica serves at once plus
// its concurrent publishers: every session's reader holds a connection in
// XREAD BLOCK.
package redisbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
)

// Defaults of Options.
const (
	DefaultPublishTimeout = 2 * time.Second
	DefaultIdleTimeout    = time.Minute
	DefaultKeyPrefix      = "eventbus:"
	DefaultReadBlock      = time.Second
	DefaultReadCount      = 512
	// DefaultIdempotencyWindow is how long PublishIdempotent remembers a
	// key.
	DefaultIdempotencyWindow = 10 * time.Minute
	// DefaultOutageTimeout is how long a reader may fail to reach Redis
	// before it ends its mirror's streams.
	DefaultOutageTimeout = 30 * time.Second
	// MaxSessionIDBytes bounds a session id: eventbus.MaxSessionIDBytes,
	// the bound of the rule every entry point applies
	// (eventbus.CheckSessionID).
	MaxSessionIDBytes = eventbus.MaxSessionIDBytes
)

var (
	// ErrUnavailable is wrapped by the errors of Publish, Delete, Info and
	// of opening a stream when Redis did not answer in time or failed. A
	// publish error that wraps it without ErrOutcomeUnknown appended
	// nothing.
	ErrUnavailable = backplane.UnavailableError("redisbus: redis unavailable")
	// ErrInvalidSession is wrapped by the error for a session id that
	// eventbus.CheckSessionID refuses (empty, longer than
	// MaxSessionIDBytes, or not valid UTF-8); the error wraps
	// eventbus.ErrInvalidSessionID too.
	ErrInvalidSession = errors.New("redisbus: invalid session id")
)

// Options configures a Backplane. The zero value is valid.
type Options struct {
	// Bus configures every local mirror bus (and the encoding of
	// published events: MaxEventBytes, Now). Its RingSize and RingMaxBytes
	// also bound each session's stream in Redis.
	Bus eventbus.Options
	// RingSize, when set, overrides Bus.RingSize: the events a session's
	// stream and mirrors keep for resuming clients.
	RingSize int
	// PublishTimeout bounds each Publish, Delete and session creation
	// (and the wait of a resume for a lagging reader); 0 means
	// DefaultPublishTimeout.
	PublishTimeout time.Duration
	// IdleTimeout is how long a session may have no local subscriber
	// before its mirror and reader are released; 0 means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// KeyPrefix starts every Redis key and the signal channel's name; ""
	// means DefaultKeyPrefix. It must not contain '{' or '}'.
	KeyPrefix string
	// KeyTTL, when positive, makes a session's keys expire after this long
	// without a publish or a new mirror; the next use starts a new epoch.
	KeyTTL time.Duration
	// ReadBlock is how long one XREAD blocks; 0 means DefaultReadBlock. It
	// bounds how late a reader notices a deleted session or Close.
	ReadBlock time.Duration
	// ReadCount is the most entries one XREAD returns; 0 means
	// DefaultReadCount.
	ReadCount int
	// IdempotencyWindow is how long PublishIdempotent remembers a key
	// after its first publish; 0 means DefaultIdempotencyWindow. Redis
	// holds one record per keyed publish for this long (about 300 bytes
	// with a 36-byte key). Give every replica the same window.
	IdempotencyWindow time.Duration
	// OutageTimeout is how long a session's reader may go without
	// reaching Redis before it ends the mirror with a terminal
	// stream_error (errorKind "unavailable") and releases the session;
	// 0 means DefaultOutageTimeout. It must not be below ReadBlock.
	OutageTimeout time.Duration
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

// Backplane feeds local mirror buses from Redis Streams. Create it with
// New; it is safe for concurrent use. Close ends every reader and mirror.
type Backplane struct {
	client redis.UniversalClient
	opts   Options
	bus    backplane.Bus // the bounds of the log
	log    *slog.Logger

	// set holds the mirrors and runs every goroutine of the backplane
	// (readers, the janitor, receiveSignals) until Close.
	set *backplane.Set[*session]

	signals *redis.PubSub // the signal channel, read by receiveSignals

	// readHook, when set (tests), runs before every XREAD of a reader.
	readHook atomic.Pointer[func(ctx context.Context, session string)]
}

// New returns a backplane publishing to and reading from client. It fails
// with an error wrapping eventbus.ErrInvalidOption for invalid options.
// The client stays the caller's: close it after Close.
func New(client redis.UniversalClient, opts Options) (*Backplane, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil redis client", eventbus.ErrInvalidOption)
	}
	var d backplane.Durations
	d.Check("PublishTimeout", &opts.PublishTimeout, DefaultPublishTimeout, 0)
	d.Check("IdleTimeout", &opts.IdleTimeout, DefaultIdleTimeout, 0)
	d.Check("ReadBlock", &opts.ReadBlock, DefaultReadBlock, time.Millisecond)
	d.Check("IdempotencyWindow", &opts.IdempotencyWindow, DefaultIdempotencyWindow, time.Millisecond)
	d.Check("OutageTimeout", &opts.OutageTimeout, DefaultOutageTimeout, 0)
	d.Check("ShutdownRetryAfter", &opts.ShutdownRetryAfter, eventbus.DefaultShutdownRetryAfter, 0)
	if err := d.Err(); err != nil {
		return nil, err
	}
	if opts.OutageTimeout < opts.ReadBlock {
		return nil, fmt.Errorf("%w: OutageTimeout %v is below ReadBlock %v", eventbus.ErrInvalidOption, opts.OutageTimeout, opts.ReadBlock)
	}
	if opts.KeyTTL < 0 || opts.ReadCount < 0 {
		return nil, fmt.Errorf("%w: KeyTTL and ReadCount must not be negative", eventbus.ErrInvalidOption)
	}
	if opts.ReadCount == 0 {
		opts.ReadCount = DefaultReadCount
	}
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = DefaultKeyPrefix
	}
	if strings.ContainsAny(opts.KeyPrefix, "{}") {
		return nil, fmt.Errorf("%w: KeyPrefix %q contains a brace", eventbus.ErrInvalidOption, opts.KeyPrefix)
	}
	bus, err := backplane.PrepareBus(&opts.Bus, opts.RingSize, opts.Logger)
	if err != nil {
		return nil, err
	}
	log := bus.Log
	b := &Backplane{
		client: client,
		opts:   opts,
		bus:    bus,
		log:    log,
	}
	if !contextTimeouts(client) {
		log.Warn("redisbus: the redis client has ContextTimeoutEnabled off: a Redis that hangs can hold Publish past PublishTimeout, up to the client's read timeout and retries")
	}
	b.set = backplane.New[*session](backplane.Config{
		Name: "redisbus", Engine: "Redis", Store: "Redis", Bus: bus,
		Timeout: opts.PublishTimeout, IdleTimeout: opts.IdleTimeout, OutageTimeout: opts.OutageTimeout,
		Valid: validSession, Unavailable: unavailable, ErrUnavailable: ErrUnavailable,
		ShutdownRetryAfter: opts.ShutdownRetryAfter,
	}, engine{b})
	// Subscribing connects in the background: a Redis that is down now is
	// retried by receiveSignals.
	b.signals = client.Subscribe(b.set.Context(), b.signalChannel())
	b.set.Go(b.receiveSignals)
	return b, nil
}

// contextTimeouts reports whether client honours context deadlines on its
// sockets (true when it cannot tell).
func contextTimeouts(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return true
}

// Close releases every session of this replica: readers stop (within
// ReadBlock), mirrors close (their streams drain what is queued, then get
// stream_error shutdown with Options.ShutdownRetryAfter, and end), and
// Close returns when every goroutine of the backplane has ended.
// Afterwards Publish returns eventbus.ErrClosed. Idempotent. The Redis keys
// stay: other replicas go on.
func (b *Backplane) Close() error {
	b.set.Close(func() { b.signals.Close() }) // unblocks receiveSignals
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

// keys returns the KEYS of every script for session id (scripts.go): the
// meta key, then the prefixes (followed by the epoch) of the stream, the
// idempotency hash and the idempotency set.
func (b *Backplane) keys(id string) []string {
	base := b.opts.KeyPrefix + "{" + id + "}:"
	return []string{base + "m", base + "s:", base + "i:", base + "x:"}
}

// unavailable wraps a Redis failure.
func unavailable(op, session string, err error) error {
	return fmt.Errorf("%w: %s session %q: %v", ErrUnavailable, op, session, err)
}

// Delete forgets session in Redis (its stream and epoch) and releases this
// replica's mirror; other replicas release theirs within ReadBlock. The next
// use of the session starts a new epoch.
func (b *Backplane) Delete(ctx context.Context, session string) error {
	if err := validSession(session); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, b.opts.PublishTimeout)
	defer cancel()
	if err := deleteScript.Run(ctx, b.client, b.keys(session)).Err(); err != nil {
		return unavailable("delete", session, err)
	}
	b.set.Deleted(session)
	return nil
}

// Info describes a session as Redis and this replica see it (see
// backplane.Info); Bytes is the envelope bytes the stream holds.
type Info = backplane.Info

// Info returns what Redis and this replica hold of session. It does not
// create the session.
func (b *Backplane) Info(ctx context.Context, session string) (Info, error) {
	if err := validSession(session); err != nil {
		return Info{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, b.opts.PublishTimeout)
	defer cancel()
	v, err := b.client.HMGet(ctx, b.keys(session)[0], "epoch", "last", "first", "bytes").Result()
	if err != nil {
		return Info{}, unavailable("read", session, err)
	}
	var in Info
	if e, ok := v[0].(string); ok {
		in.Exists, in.Epoch = true, e
		in.LastEventID = parseUint(v[1])
		in.FirstEventID = parseUint(v[2])
		in.Bytes = parseUint(v[3])
	}
	in.LocalLastEventID, in.Subscribers, in.Local = b.set.Local(session)
	return in, nil
}

func parseUint(v any) uint64 {
	s, _ := v.(string)
	n, _ := strconv.ParseUint(s, 10, 64)
	return n
}

// Sessions returns how many sessions this replica holds a mirror of.
func (b *Backplane) Sessions() int { return b.set.Len() }

// Bus returns this replica's mirror bus of session, creating it (and its
// reader) when needed, after checking with Redis that the mirror's epoch
// is the session's (see Subscribe). The mirror is backplane.NewMirror's:
// its Subscribe answers resumes from the stream, so subscribing on it
// directly is the same as Subscribe. Its Publish returns
// backplane.ErrMirror; Signal delivers to this replica's subscribers only. It returns an error wrapping ErrUnavailable
// when Redis cannot be reached.
func (b *Backplane) Bus(ctx context.Context, session string) (*eventbus.EventBus, error) {
	return b.set.Bus(ctx, session)
}

// Subscribe subscribes to session on this replica, as
// eventbus.EventBus.Subscribe does: a resume its mirror cannot answer is
// answered from the stream. It first checks the session's epoch with
// Redis (one round trip, none when it creates the mirror): a mirror of an
// epoch Redis no longer has is released and a new one made, so a new
// subscription never joins a dead epoch. It returns an error wrapping
// ErrUnavailable when Redis cannot be reached.
func (b *Backplane) Subscribe(ctx context.Context, session string, opts eventbus.SubscribeOptions) (*eventbus.Subscription, error) {
	return b.set.Subscribe(ctx, session, opts)
}

// Handler returns an SSE handler for a route such as
// "GET /session/{id}/events": its Lookup is Bus for r.PathValue("id") (an
// invalid id, see eventbus.CheckSessionID, is 400 invalid_session_id;
// Redis unavailable is 503 unavailable and a closed Backplane 503
// shutting_down, both with Retry-After: 1, as eventbus.StatusError
// wrapping the cause). Set Retry, Heartbeat,
// WriteTimeout, Logger, CORS or Authorize on it before serving; keep
// Lookup (wrap it to add to it).
func (b *Backplane) Handler() *eventbus.Handler { return b.set.Handler() }
