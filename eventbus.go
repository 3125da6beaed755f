package eventbus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Limits and defaults of SPEC section 2.
const (
	// SchemaVersion is stamped into every envelope's "v".
	SchemaVersion = 1
	// DefaultRingSize is the replay ring depth, in events.
	DefaultRingSize = 8000
	// MaxRingSize is the largest RingSize New accepts.
	MaxRingSize = 1_000_000
	// DefaultRingMaxBytes bounds the ring's encoded bytes.
	DefaultRingMaxBytes = 64 << 20
	// DefaultMaxEventBytes is the largest encoded event Publish accepts.
	DefaultMaxEventBytes = 16 << 20
	// DefaultMaxQueued is a subscriber's live frame cap.
	DefaultMaxQueued = 256
	// DefaultMaxQueuedBytes is a subscriber's live byte cap.
	DefaultMaxQueuedBytes = 2 << 20
	// DefaultMaxSubscribers is a bus's subscriber cap.
	DefaultMaxSubscribers = 64
	// DefaultReplayBudgetBytes is how many bytes one resume may replay.
	DefaultReplayBudgetBytes = 8 << 20
	// WarnThresholdRatio is the fill of either cap at which a subscriber is
	// warned.
	WarnThresholdRatio = 0.75
	// WarnResetRatio is the fill of both caps at or below which the warning
	// re-arms.
	WarnResetRatio = 0.375
	// MinClientMaxQueued and MaxClientMaxQueued bound the maxQueued a remote
	// client may ask for.
	MinClientMaxQueued = 16
	MaxClientMaxQueued = 2048
	// MaxEventID is the largest id a client may present (2^53-1, the largest
	// integer a JSON number holds exactly in every client).
	MaxEventID = 1<<53 - 1
	// DefaultRetry is the SSE retry: directive.
	DefaultRetry = 3 * time.Second
	// DefaultHeartbeat is how long a stream may be idle before a comment.
	DefaultHeartbeat = 15 * time.Second
	// DefaultWriteTimeout bounds one write and flush of a batch.
	DefaultWriteTimeout = 30 * time.Second
)

// Options configures a bus. The zero value is valid: every field that is 0
// takes its default. A negative value, RingSize above MaxRingSize, or an
// option New cannot honour makes New fail with ErrInvalidOption.
type Options struct {
	// RingSize is how many recent events the bus keeps for resuming clients.
	RingSize int
	// RingMaxBytes bounds the ring's encoded bytes; the oldest events are
	// dropped past it (the newest always stays).
	RingMaxBytes int
	// MaxEventBytes is the largest encoded envelope Publish accepts.
	MaxEventBytes int
	// MaxSubscribers caps concurrent subscriptions.
	MaxSubscribers int
	// MaxQueued is the default live frame cap of a subscription whose
	// SubscribeOptions.MaxQueued is 0.
	MaxQueued int
	// MaxQueuedBytes is every subscription's live byte cap. It is an
	// embedder's setting only: a remote client can never raise it.
	MaxQueuedBytes int
	// ReplayBudgetBytes is how many encoded bytes one resume may replay.
	ReplayBudgetBytes int
	// Logger receives diagnostics; nil means slog.Default() at the time of
	// logging. It is never called with the bus lock held.
	Logger *slog.Logger
	// Now is the clock for serverTimestamp stamps; nil means time.Now.
	Now func() time.Time
}

func (o Options) withDefaults() (Options, error) {
	fields := []struct {
		name string
		v    *int
		def  int
	}{
		{"RingSize", &o.RingSize, DefaultRingSize},
		{"RingMaxBytes", &o.RingMaxBytes, DefaultRingMaxBytes},
		{"MaxEventBytes", &o.MaxEventBytes, DefaultMaxEventBytes},
		{"MaxSubscribers", &o.MaxSubscribers, DefaultMaxSubscribers},
		{"MaxQueued", &o.MaxQueued, DefaultMaxQueued},
		{"MaxQueuedBytes", &o.MaxQueuedBytes, DefaultMaxQueuedBytes},
		{"ReplayBudgetBytes", &o.ReplayBudgetBytes, DefaultReplayBudgetBytes},
	}
	for _, f := range fields {
		switch {
		case *f.v < 0:
			return o, fmt.Errorf("%w: %s is %d, must not be negative", ErrInvalidOption, f.name, *f.v)
		case *f.v == 0:
			*f.v = f.def
		}
	}
	if o.RingSize > MaxRingSize {
		return o, fmt.Errorf("%w: RingSize is %d, above MaxRingSize %d", ErrInvalidOption, o.RingSize, MaxRingSize)
	}
	return o, nil
}

// EventBus is one session's in-memory event bus. Create it with New.
//
// An EventBus is safe for concurrent use by multiple goroutines. Publish
// never blocks on a subscriber and never panics. Close ends every
// subscription; the bus must not be copied.
type EventBus struct {
	opts  Options
	epoch string

	mu     sync.Mutex
	nextID uint64
	ring   ring
	subs   []*Subscription
	closed bool

	// Mirrors of guarded state, for lock-free reads.
	lastID     atomic.Uint64
	isClosed   atomic.Bool
	subscribed atomic.Int64
}

// New returns an open bus configured by opts. It returns an error wrapping
// ErrInvalidOption when an option is invalid.
func New(opts Options) (*EventBus, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	var e [16]byte
	_, _ = rand.Read(e[:]) // crypto/rand.Read never fails (Go 1.24+)
	return &EventBus{
		opts:   o,
		epoch:  hex.EncodeToString(e[:]),
		nextID: 1,
		ring:   newRing(o.RingSize, o.RingMaxBytes),
	}, nil
}

// Epoch returns the bus's epoch token: 32 lowercase hex characters from
// crypto/rand, different for every bus. A client that presents another
// epoch when resuming gets an epoch_reset resync.
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
func (b *EventBus) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.isClosed.Store(true)
	subs := b.subs
	b.subs = nil
	b.subscribed.Store(0)
	b.ring.reset()
	b.mu.Unlock()
	for _, s := range subs {
		s.end(nil)
		s.q.close(true)
		// The context stays watched while the consumer drains: a later
		// cancellation must still drop the buffer (SPEC 8). The consumer
		// releases it when it reaches the end.
	}
	return nil
}

func (b *EventBus) logger() *slog.Logger {
	if b.opts.Logger != nil {
		return b.opts.Logger
	}
	return slog.Default()
}

func (b *EventBus) now() int64 { return nowMillis(b.opts.Now) }

func nowMillis(now func() time.Time) int64 {
	if now != nil {
		return now().UnixMilli()
	}
	return time.Now().UnixMilli()
}

// diagnostic is a log record decided under the lock and emitted after it.
type diagnostic struct {
	msg   string
	attrs []slog.Attr
}

func (b *EventBus) emit(ds []diagnostic) {
	if len(ds) == 0 {
		return
	}
	l := b.logger()
	for _, d := range ds {
		l.LogAttrs(context.Background(), slog.LevelWarn, d.msg, d.attrs...)
	}
}

// eviction is a subscriber rejected under the lock, ended after it.
type eviction struct {
	s      *Subscription
	result pushResult
	id     uint64
	counts queueCounts
	size   int
}

// Publish assigns the event the next id, appends it to the ring and queues
// it for every subscriber, and returns the stamped frame.
//
// Publish never blocks on a subscriber and never panics. It returns an
// error wrapping ErrInvalidEvent for an empty type, a type with CR or LF, or
// data or metadata that cannot be encoded (the diagnostic is logged too), an
// error wrapping ErrEventTooLarge above MaxEventBytes, and ErrClosed after
// Close. A rejected event uses no id and reaches nobody.
func (b *EventBus) Publish(e Event) (Frame, error) {
	if b.isClosed.Load() {
		return Frame{}, ErrClosed
	}
	p, err := b.encode(e)
	if err != nil {
		b.logger().LogAttrs(context.Background(), slog.LevelWarn, "eventbus: publish rejected",
			slog.String("type", truncate(e.Type, 64)), slog.String("error", err.Error()))
		return Frame{}, err
	}

	var (
		evicted []eviction
		diags   []diagnostic
	)
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		p.release()
		return Frame{}, ErrClosed
	}
	id := b.nextID
	b.nextID++
	f := p.frame(id)
	b.ring.append(f)
	b.lastID.Store(id)
	for i, s := range b.subs {
		res, c := s.q.push(f)
		switch res {
		case pushAccepted:
			if d, ok := s.checkWarningLocked(c, id, b.now); ok {
				diags = append(diags, d)
			}
		case pushRejectedFrames, pushRejectedBytes:
			evicted = append(evicted, eviction{s, res, id, c, f.Size()})
			b.subs[i] = nil
		}
	}
	if evicted != nil {
		b.compactSubsLocked()
	}
	b.mu.Unlock()

	for _, ev := range evicted {
		diags = append(diags, ev.s.evict(ev, b.now()))
	}
	b.emit(diags)
	return f, nil
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
}

// removeLocked unregisters s, keeping subscription order. It reports whether
// s was registered.
func (b *EventBus) removeLocked(s *Subscription) bool {
	for i, x := range b.subs {
		if x == s {
			copy(b.subs[i:], b.subs[i+1:])
			b.subs[len(b.subs)-1] = nil
			b.subs = b.subs[:len(b.subs)-1]
			b.subscribed.Store(int64(len(b.subs)))
			return true
		}
	}
	return false
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
