// Package natsbus is a NATS JetStream backplane for package eventbus: a
// session's events get their ids from one shared log, so a client may
// resume with Last-Event-ID on any replica of a daemon behind a load
// balancer. It is the twin of redisbus and pgbus for daemons that already
// run NATS, built on the public backplane kit alone (package backplane:
// its Set, and the mirror's seam NewMirror, Append, Log, Encoder).
//
// Per session, one subject of one stream is the log: "<Subject>.s.<token>"
// in stream Options.Stream, where the token is the session id with every
// byte outside [A-Za-z0-9_-] escaped as %XX (so any id is a valid subject
// token, and two ids never share one). Publish (on any replica) encodes the
// event locally and appends it with JetStream's expected last subject
// sequence (Nats-Expected-Last-Subject-Sequence) set to the stream
// sequence of the subject's last message: the append succeeds only if
// nothing was appended to the session since, so the id it carries (in the
// Eventbus-Id header and the envelope: last id + 1) is the next contiguous
// one. On a conflict the publisher reads the subject's last message again
// and retries. JetStream's stream sequences are per stream, not per
// subject: the id lives in the message, and the expected-sequence check
// keeps it contiguous across replicas.
//
// Each replica keeps a local mirror eventbus.EventBus per session that has
// subscribers there, fed by a consumer of the session's subject (one
// goroutine per mirror; made again from the last message fed after a gap
// or a cut of the connection): every replica delivers the same ids in the
// same order, and queues, warnings and evictions stay local. A
// resume the mirror's ring cannot answer is answered from the stream
// (direct gets), outside the bus lock, ahead of the live frames.
//
// The stream's per-subject limit (MaxMsgsPerSubject, the ring size) trims
// each session's log: a resume from before what it holds gets
// state_resync_required (ring_evicted) with the first id it still holds.
// The epoch (32 hex characters) is carried by every message of the session
// (the Eventbus-Epoch header); a session's first use writes a marker
// message with a new epoch and id 0 (expected last subject sequence 0: one
// replica wins). Delete publishes a tombstone that rolls the subject up
// (Nats-Rollup: sub, which purges the session's messages atomically) and
// expires after a minute: every replica's reader sees it and closes its
// mirror, and the next use starts a new epoch with ids from 1.
//
// Idempotent publish is JetStream's deduplication: a keyed publish carries
// Nats-Msg-Id (the epoch and a hash of the session and the key) and the
// event's fingerprint; the stream's Duplicates window is
// Options.IdempotencyWindow. A duplicate is answered with the first
// publish's id, read from the message JetStream names.
//
// Failures are bounded and announced: Publish returns within
// Options.PublishTimeout (ErrOutcomeUnknown when the event may have been
// appended all the same: PublishIdempotent retries that at most once), and
// a reader that cannot reach JetStream for Options.OutageTimeout ends its
// mirror with a terminal stream_error (errorKind "unavailable"). Signal
// spreads change signals to every replica with core NATS publishes.
//
// Connect with ConnectOptions (nats.Connect(url,
// natsbus.ConnectOptions()...)): ReconnectBufSize -1, so that a publish
// while the connection reconnects is never buffered and sent after its
// caller gave up, and a reconnect at once after a cut, then backing off
// (ReconnectDelay). A call made while the connection reconnects (Publish,
// the epoch check of a stream that opens, a resume's reads, Info, Delete,
// Signal) waits for it: up to its own deadline (PublishTimeout), and no
// longer than a second after the connection was lost (past that, NATS is
// out rather than reconnecting), then fails with ErrUnavailable, nothing
// sent. A read that a cut interrupts is sent again on the new connection;
// a publish is sent again only when nats.go refused to send it, never
// after a cut under way (its answer lost, it is ErrOutcomeUnknown). A
// reader makes a new consumer from the last message it fed once the
// connection is back. So a cut that the server survives costs a call a
// round trip, not a refusal, and a stream nothing.
package natsbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
)

// Defaults of Options.
const (
	DefaultPublishTimeout = 2 * time.Second
	DefaultIdleTimeout    = time.Minute
	DefaultOutageTimeout  = 30 * time.Second
	// DefaultIdempotencyWindow is how long PublishIdempotent remembers a
	// key: the stream's Duplicates window.
	DefaultIdempotencyWindow = 10 * time.Minute
	// DefaultCheckInterval is how often the reader of a quiet session
	// checks the session's epoch (and so that JetStream answers).
	DefaultCheckInterval = time.Second
	DefaultStream        = "EVENTBUS"
	DefaultSubject       = "eventbus"
	DefaultReadCount     = 512
	// MaxSessionIDBytes bounds a session id: eventbus.MaxSessionIDBytes,
	// the bound of the rule every entry point applies
	// (eventbus.CheckSessionID). Its token is part of a subject: up to
	// three times as long.
	MaxSessionIDBytes = eventbus.MaxSessionIDBytes
)

var (
	// ErrUnavailable is wrapped by the errors of Publish, Delete, Info,
	// Signal and of opening a stream when JetStream did not answer in time
	// or failed. A publish error that wraps it without ErrOutcomeUnknown
	// appended nothing.
	ErrUnavailable = backplane.UnavailableError("natsbus: nats unavailable")
	// ErrOutcomeUnknown is wrapped (together with ErrUnavailable) by the
	// error of a publish that was sent but not answered within
	// PublishTimeout: the event may or may not have been appended.
	// PublishIdempotent again with the same key applies it at most once; a
	// retry of Publish may append it twice.
	ErrOutcomeUnknown = backplane.OutcomeUnknownError("natsbus: publish outcome unknown")
	// ErrInvalidSession is wrapped by the error for a session id that
	// eventbus.CheckSessionID refuses (empty, longer than
	// MaxSessionIDBytes, or not valid UTF-8); the error wraps
	// eventbus.ErrInvalidSessionID too.
	ErrInvalidSession = errors.New("natsbus: invalid session id")
)

// Options configures a Backplane. The zero value is valid.
type Options struct {
	// Bus configures every local mirror bus (and the encoding of
	// published events: MaxEventBytes, Now). Its RingSize is also the
	// stream's MaxMsgsPerSubject: the events each session's log keeps.
	// RingMaxBytes bounds the mirrors only (JetStream has no per-subject
	// byte limit).
	Bus eventbus.Options
	// RingSize, when set, overrides Bus.RingSize.
	RingSize int
	// PublishTimeout bounds each Publish, Delete, Info, Signal, session
	// creation and reader call (and the wait of a resume for a lagging
	// reader); 0 means DefaultPublishTimeout.
	PublishTimeout time.Duration
	// IdleTimeout is how long a session may have no local subscriber
	// before its mirror and reader are released; 0 means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// OutageTimeout is how long a session's reader may go without an
	// answer from JetStream before it ends the mirror with a terminal
	// stream_error (errorKind "unavailable") and releases the session; 0
	// means DefaultOutageTimeout. It must not be below CheckInterval.
	OutageTimeout time.Duration
	// IdempotencyWindow is how long PublishIdempotent remembers a key
	// after its first publish: the stream's Duplicates window, so every
	// replica shares it (the last New sets it); 0 means
	// DefaultIdempotencyWindow.
	IdempotencyWindow time.Duration
	// CheckInterval is how often the reader of a session without new
	// events asks JetStream for the session's epoch: it bounds how late a
	// lost stream is noticed, and it measures an outage; 0 means
	// DefaultCheckInterval.
	CheckInterval time.Duration
	// Stream is the JetStream stream holding every session ("" means
	// DefaultStream). New creates it when it is missing and sets the
	// limits it relies on (see New).
	Stream string
	// Subject is the prefix of the backplane's subjects ("" means
	// DefaultSubject): sessions are "<Subject>.s.<token>" (the stream's
	// subject "<Subject>.s.>"), signals "<Subject>.sig.<token>" (core
	// NATS, not stored). It must be a subject without wildcards.
	Subject string
	// Replicas is the stream's replica count when New creates it (0 means
	// 1); an existing stream keeps its own.
	Replicas int
	// ReadCount is the most messages a reader's pull asks for at once; 0
	// means DefaultReadCount.
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

// Backplane feeds local mirror buses from a JetStream stream. Create it
// with New; it is safe for concurrent use. Close ends every reader and
// mirror.
type Backplane struct {
	js   jetstream.JetStream
	nc   *nats.Conn
	opts Options
	bus  backplane.Bus // the bounds of the log
	log  *slog.Logger
	api  string // the JetStream API prefix, with its trailing dot

	// set holds the mirrors and runs every goroutine of the backplane
	// (readers, the janitor, receiveSignals) until Close.
	set *backplane.Set[*session]

	signals    *nats.Subscription // "<Subject>.sig.>", read by receiveSignals
	signalMsgs chan *nats.Msg

	link *link // the connection's state: calls wait for a reconnect

	streamMu sync.Mutex // serialises ensureStream

	pubMu sync.Mutex
	pubs  map[string]*publisher // by session: the publish lock and what it knows

	// readHook, when set (tests), runs in a reader before each message it
	// takes and before each epoch check.
	readHook atomic.Pointer[func(ctx context.Context, session string)]
}

// New returns a backplane publishing to and reading from js. It creates
// the stream when it is missing (Replicas replicas, file storage) and sets
// on it what the backplane relies on: its subject, MaxMsgsPerSubject (the
// ring size), Duplicates (IdempotencyWindow), and AllowRollup, AllowMsgTTL
// and AllowDirect; every other setting of an existing stream (MaxBytes,
// MaxAge, placement ...) stays its operator's. This is bounded by ctx: New
// fails with an error wrapping ErrUnavailable when JetStream cannot be
// reached, and with one wrapping eventbus.ErrInvalidOption for invalid
// options. The connection stays the caller's: close it after Close.
func New(ctx context.Context, js jetstream.JetStream, opts Options) (*Backplane, error) {
	if js == nil || js.Conn() == nil {
		return nil, fmt.Errorf("%w: nil JetStream", eventbus.ErrInvalidOption)
	}
	var d backplane.Durations
	d.Check("PublishTimeout", &opts.PublishTimeout, DefaultPublishTimeout, time.Millisecond)
	d.Check("IdleTimeout", &opts.IdleTimeout, DefaultIdleTimeout, time.Millisecond)
	d.Check("OutageTimeout", &opts.OutageTimeout, DefaultOutageTimeout, time.Millisecond)
	d.Check("IdempotencyWindow", &opts.IdempotencyWindow, DefaultIdempotencyWindow, 100*time.Millisecond)
	d.Check("CheckInterval", &opts.CheckInterval, DefaultCheckInterval, time.Millisecond)
	d.Check("ShutdownRetryAfter", &opts.ShutdownRetryAfter, eventbus.DefaultShutdownRetryAfter, 0)
	if err := d.Err(); err != nil {
		return nil, err
	}
	if opts.OutageTimeout < opts.CheckInterval {
		return nil, fmt.Errorf("%w: OutageTimeout %v is below CheckInterval %v", eventbus.ErrInvalidOption, opts.OutageTimeout, opts.CheckInterval)
	}
	if opts.ReadCount < 0 || opts.Replicas < 0 {
		return nil, fmt.Errorf("%w: ReadCount and Replicas must not be negative", eventbus.ErrInvalidOption)
	}
	if opts.ReadCount == 0 {
		opts.ReadCount = DefaultReadCount
	}
	if opts.Replicas == 0 {
		opts.Replicas = 1
	}
	if opts.Stream == "" {
		opts.Stream = DefaultStream
	}
	if opts.Subject == "" {
		opts.Subject = DefaultSubject
	}
	if !validStreamName(opts.Stream) {
		return nil, fmt.Errorf("%w: Stream %q is not a valid stream name", eventbus.ErrInvalidOption, opts.Stream)
	}
	if !validSubject(opts.Subject) {
		return nil, fmt.Errorf("%w: Subject %q is not a subject without wildcards", eventbus.ErrInvalidOption, opts.Subject)
	}
	bus, err := backplane.PrepareBus(&opts.Bus, opts.RingSize, opts.Logger)
	if err != nil {
		return nil, err
	}
	b := &Backplane{
		js:   js,
		nc:   js.Conn(),
		opts: opts,
		bus:  bus,
		log:  bus.Log,
		api:  apiPrefix(js.Options()),
		pubs: map[string]*publisher{},
	}
	if b.nc.Opts.ReconnectBufSize >= 0 {
		b.log.Warn("natsbus: the nats connection buffers publishes while it reconnects (ReconnectBufSize is not -1): a publish then reads as outcome unknown, and may be sent after its caller gave up")
	}
	if b.nc.Opts.CustomReconnectDelayCB == nil && b.nc.Opts.ReconnectWait >= reconnectGrace {
		b.log.Warn("natsbus: the nats connection waits ReconnectWait before it reconnects after a cut: calls meanwhile wait up to a second for it, then fail with ErrUnavailable; connect with natsbus.ConnectOptions() to reconnect at once",
			"reconnectWait", b.nc.Opts.ReconnectWait)
	}
	if err := b.ensureStream(ctx); err != nil {
		return nil, fmt.Errorf("%w: stream %s: %v", ErrUnavailable, opts.Stream, err)
	}
	b.signalMsgs = make(chan *nats.Msg, 1024)
	b.signals, err = b.nc.ChanSubscribe(opts.Subject+".sig.>", b.signalMsgs)
	if err != nil {
		return nil, fmt.Errorf("%w: subscribe to signals: %v", ErrUnavailable, err)
	}
	b.link = newLink(b.nc)
	b.set = backplane.New[*session](backplane.Config{
		Name: "natsbus", Engine: "NATS", Store: "the stream", Bus: bus,
		Timeout: opts.PublishTimeout, IdleTimeout: opts.IdleTimeout, OutageTimeout: opts.OutageTimeout,
		Valid: validSession, Unavailable: unavailable, ErrUnavailable: ErrUnavailable,
		ShutdownRetryAfter: opts.ShutdownRetryAfter,
	}, engine{b})
	b.set.Go(func() { b.link.run(b.set.Context()) })
	b.set.Go(b.receiveSignals)
	return b, nil
}

// apiPrefix is the JetStream API prefix js sends its requests to.
func apiPrefix(o jetstream.JetStreamOptions) string {
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	return jetstream.DefaultAPIPrefix
}

// Close releases every session of this replica: readers stop, mirrors
// close (their streams drain what is queued, then get stream_error
// shutdown with Options.ShutdownRetryAfter, and end), and Close returns
// when every goroutine of the backplane has ended. Afterwards Publish
// returns eventbus.ErrClosed. Idempotent. The stream stays: other replicas
// go on.
func (b *Backplane) Close() error {
	b.set.Close(func() { _ = b.signals.Unsubscribe() })
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

// validStreamName: JetStream refuses names with whitespace, '.', '*', '>'
// or path separators.
func validStreamName(s string) bool {
	return s != "" && len(s) <= 255 && !strings.ContainsAny(s, " \t\r\n.*>/\\")
}

// validSubject: dot-separated non-empty tokens without wildcards or
// whitespace.
func validSubject(s string) bool {
	if s == "" || strings.ContainsAny(s, " \t\r\n*>") {
		return false
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" {
			return false
		}
	}
	return true
}

// token returns the subject token of a session id: the id with every byte
// outside [A-Za-z0-9_-] escaped as %XX (uppercase hex). It is reversible
// (untoken), never empty for a valid id, and never holds '.', '*', '>' or
// whitespace.
func token(id string) string {
	var sb strings.Builder
	sb.Grow(len(id))
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' {
			sb.WriteByte(c)
			continue
		}
		const hexDigits = "0123456789ABCDEF"
		sb.WriteByte('%')
		sb.WriteByte(hexDigits[c>>4])
		sb.WriteByte(hexDigits[c&0xf])
	}
	return sb.String()
}

// untoken reverses token; ok is false for a string token does not make.
func untoken(t string) (id string, ok bool) {
	var sb strings.Builder
	for i := 0; i < len(t); i++ {
		c := t[i]
		if c != '%' {
			sb.WriteByte(c)
			continue
		}
		if i+2 >= len(t) {
			return "", false
		}
		hi, ok1 := unhex(t[i+1])
		lo, ok2 := unhex(t[i+2])
		if !ok1 || !ok2 {
			return "", false
		}
		sb.WriteByte(hi<<4 | lo)
		i += 2
	}
	return sb.String(), true
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// subject is the log subject of session id.
func (b *Backplane) subject(id string) string { return b.opts.Subject + ".s." + token(id) }

// unavailable wraps a JetStream failure of an operation that applied
// nothing.
func unavailable(op, session string, err error) error {
	return fmt.Errorf("%w: %s session %q: %v", ErrUnavailable, op, session, err)
}

// Delete forgets session in the stream (its events and epoch: a tombstone
// rolls its subject up) and releases this replica's mirror; the readers of
// other replicas get the tombstone and release theirs, and a new stream on
// any replica checks the epoch first. The next use of the session starts a
// new epoch with ids from 1, and its old idempotency keys are forgotten
// (they name the old epoch). Deleting an unknown session is not an error.
func (b *Backplane) Delete(ctx context.Context, session string) error {
	if err := validSession(session); err != nil {
		return err
	}
	if b.set.Closed() {
		return eventbus.ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, b.opts.PublishTimeout)
	defer cancel()
	if err := b.tombstone(ctx, b.subject(session)); err != nil {
		return unavailable("delete", session, err)
	}
	b.set.Deleted(session)
	return nil
}

// Info describes a session as the stream and this replica see it (see
// backplane.Info). Bytes is always 0: JetStream keeps no per-subject byte
// count.
type Info = backplane.Info

// Info returns what the stream and this replica hold of session (two
// reads from the stream's leader). It does not create the session.
func (b *Backplane) Info(ctx context.Context, session string) (Info, error) {
	if err := validSession(session); err != nil {
		return Info{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, b.opts.PublishTimeout)
	defer cancel()
	subj := b.subject(session)
	h, err := b.head(ctx, subj)
	if err != nil {
		return Info{}, unavailable("read", session, err)
	}
	var in Info
	if h.epoch != "" {
		in.Exists, in.Epoch, in.LastEventID = true, h.epoch, h.id
		first, ok, err := b.firstEvent(ctx, subj, h.epoch)
		if err != nil {
			return Info{}, unavailable("read", session, err)
		}
		if ok {
			in.FirstEventID = first.id
		}
	}
	in.LocalLastEventID, in.Subscribers, in.Local = b.set.Local(session)
	return in, nil
}

// Sessions returns how many sessions this replica holds a mirror of.
func (b *Backplane) Sessions() int { return b.set.Len() }

// Bus returns this replica's mirror bus of session, creating it (and its
// reader) when needed. A mirror opened before this call is first checked
// against the session's epoch in the stream (one read from its leader): a
// mirror of an epoch the stream no longer has (a Delete this replica's
// reader has not seen yet) is released and a new one made, so a stream
// never joins a dead epoch. It returns an error wrapping ErrUnavailable
// when JetStream cannot be reached for that. The mirror is
// backplane.NewMirror's: its Subscribe answers resumes from the stream;
// its Publish returns backplane.ErrMirror; its Signal reaches this
// replica's subscribers only.
func (b *Backplane) Bus(ctx context.Context, session string) (*eventbus.EventBus, error) {
	return b.set.Bus(ctx, session)
}

// Subscribe subscribes to session on this replica, as
// eventbus.EventBus.Subscribe does, on the mirror Bus returns (so a new
// subscription never joins a dead epoch): a resume its mirror cannot
// answer is answered from the stream. It returns an error wrapping
// ErrUnavailable when JetStream cannot be reached.
func (b *Backplane) Subscribe(ctx context.Context, session string, opts eventbus.SubscribeOptions) (*eventbus.Subscription, error) {
	return b.set.Subscribe(ctx, session, opts)
}

// Handler returns an SSE handler for a route such as
// "GET /session/{id}/events": its Lookup is Bus for r.PathValue("id") (an
// invalid id, see eventbus.CheckSessionID, is 400 invalid_session_id;
// JetStream unavailable is 503 unavailable and a closed Backplane 503
// shutting_down, both with Retry-After: 1, as eventbus.StatusError
// wrapping the cause). Set Retry, Heartbeat,
// WriteTimeout, Logger, CORS or Authorize on it before serving; keep
// Lookup (wrap it to add to it).
func (b *Backplane) Handler() *eventbus.Handler { return b.set.Handler() }
