package eventbus

import (
	"fmt"
	"log/slog"
	"time"
)

// Limits and defaults (docs/SPEC.md section 1.2).
const (
	// SchemaVersion is stamped into every envelope's "v".
	SchemaVersion = 1
	// DefaultRingSize is the replay ring depth, in events.
	DefaultRingSize = 8000
	// MaxRingSize is the largest RingSize New accepts.
	MaxRingSize = 1_000_000
	// DefaultRingMaxBytes bounds the ring's envelope bytes (Frame.Size).
	DefaultRingMaxBytes = 64 << 20
	// DefaultMaxEventBytes is the largest JSON envelope Publish accepts.
	DefaultMaxEventBytes = 16 << 20
	// DefaultMaxQueued is a subscriber's live frame cap.
	DefaultMaxQueued = 256
	// DefaultMaxQueuedBytes is a subscriber's live byte cap, in envelope
	// bytes (Frame.Size).
	DefaultMaxQueuedBytes = 2 << 20
	// DefaultMaxSubscribers is a bus's subscriber cap.
	DefaultMaxSubscribers = 64
	// DefaultReplayBudgetBytes is how many envelope bytes (Frame.Size) one
	// resume may replay.
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
	// DefaultCatchUpStallTimeout is how long a subscriber under
	// OverflowCatchUp may take nothing while behind before it is evicted.
	DefaultCatchUpStallTimeout = 30 * time.Second
)

// Options configures a bus. The zero value is valid: every field that is 0
// takes its default. A negative value, RingSize above MaxRingSize, or an
// option New cannot honour makes New fail with ErrInvalidOption.
//
// Every byte cap (RingMaxBytes, MaxEventBytes, MaxQueuedBytes,
// ReplayBudgetBytes) counts a frame's JSON envelope, what follows "data: "
// on the wire (Frame.Size), as the TypeScript daemon whose design this
// library implements does (docs/SPEC.md 1.3); so do the byte counts of
// slow_client_warning and client_evicted. What a frame costs beyond its
// envelope is bounded per frame (at most 2*MaxTypeLen+156 bytes on 64-bit
// platforms), so the byte and count caps together bound the memory a bus
// holds; a Hub's MaxTotalBytes counts every byte. The unit and the bound
// are docs/SPEC.md section 1.3; the options and their defaults, 1.2.
type Options struct {
	// RingSize is how many recent events the bus keeps for resuming clients.
	RingSize int
	// RingMaxBytes bounds the ring's bytes, the sum of its frames'
	// envelopes (Size); the oldest events are dropped past it (the newest
	// always stays).
	RingMaxBytes int
	// MaxEventBytes is the largest JSON envelope (Frame.Size) Publish and
	// Signal accept.
	MaxEventBytes int
	// MaxSubscribers caps concurrent subscriptions.
	MaxSubscribers int
	// MaxQueued is the default live frame cap of a subscription whose
	// SubscribeOptions.MaxQueued is 0.
	MaxQueued int
	// MaxQueuedBytes is every subscription's live byte cap, the sum of its
	// live frames' envelopes (Size): a live push that would take it past
	// the cap is rejected unless nothing live is queued. It is an
	// embedder's setting only: a remote client can never raise it.
	MaxQueuedBytes int
	// ReplayBudgetBytes is how many bytes (the sum of the replayed frames'
	// envelopes, Size) one resume may replay; the first frame always is.
	ReplayBudgetBytes int
	// Logger receives diagnostics; nil means slog.Default() at the time of
	// logging. It is never called with the bus lock held.
	Logger *slog.Logger
	// Now is the clock for serverTimestamp stamps, the overflow window and
	// the catch-up stall bound; nil means time.Now.
	Now func() time.Time
	// OverflowPolicy decides what a rejected live push does to a
	// subscriber; 0 means OverflowEvict. A subscription may override it.
	OverflowPolicy OverflowPolicy
	// CatchUpStallTimeout is how long a subscriber under OverflowCatchUp
	// may take nothing while it is behind before it is evicted
	// (client_evicted, reason catch_up_stalled), measured on Now; 0 means
	// DefaultCatchUpStallTimeout, below a millisecond is an error. A
	// subscription may override it.
	CatchUpStallTimeout time.Duration
	// MaxAge, when positive, also bounds the ring by age: an event
	// published more than MaxAge ago (on Now) leaves it, so a resume past
	// it gets ring_evicted with exact ids. Aged events go at the next
	// Publish or Subscribe (and at a Hub's sweep); 0 means no age bound,
	// negative is an error.
	MaxAge time.Duration
	// OnDiagnostic, when set, receives every diagnostic before it is
	// logged; returning true suppresses the log line. It is called without
	// the bus lock, on the goroutine that caused the diagnostic (Publish,
	// Signal, a stream writer), and must not block.
	OnDiagnostic func(Diagnostic) (suppress bool)
}

// OverflowPolicy decides what happens when a subscriber's live queue
// rejects a frame. The zero value means "the default": OverflowEvict for a
// bus, the bus's policy for a subscription.
type OverflowPolicy uint8

const (
	// OverflowEvict ends the subscriber with a terminal client_evicted
	// frame (docs/SPEC.md section 3.3).
	OverflowEvict OverflowPolicy = iota + 1
	// OverflowResync drops the subscriber's queued live frames, queues
	// state_resync_required and then the rejected frame, and keeps the
	// subscriber; the third overflow within OverflowWindow evicts it with
	// reason repeated_overflow (docs/SPEC.md section 3.5).
	OverflowResync
	// OverflowCatchUp keeps the subscriber and loses nothing while the ring
	// holds what it missed: its consumer, once it has drained its queue,
	// reads the rejected event and every later one from the ring, within
	// its caps, then rejoins the live stream with no gap and no duplicate;
	// meanwhile publishers push nothing to it. A ring that dropped what it
	// needs is announced (state_resync_required ring_evicted); a consumer
	// that takes nothing for CatchUpStallTimeout while behind is evicted
	// (catch_up_stalled). The rules are docs/SPEC.md section 3.6.
	OverflowCatchUp
)

// OverflowWindow is the window in which a third overflow under
// OverflowResync evicts.
const OverflowWindow = 60 * time.Second

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
	if err := checkPolicy(o.OverflowPolicy); err != nil {
		return o, err
	}
	if o.OverflowPolicy == 0 {
		o.OverflowPolicy = OverflowEvict
	}
	if err := checkStall(o.CatchUpStallTimeout); err != nil {
		return o, err
	}
	if o.CatchUpStallTimeout == 0 {
		o.CatchUpStallTimeout = DefaultCatchUpStallTimeout
	}
	if o.MaxAge < 0 {
		return o, fmt.Errorf("%w: MaxAge is %s, must not be negative", ErrInvalidOption, o.MaxAge)
	}
	if o.RingSize > MaxRingSize {
		return o, fmt.Errorf("%w: RingSize is %d, above MaxRingSize %d", ErrInvalidOption, o.RingSize, MaxRingSize)
	}
	return o, nil
}

// SubscribeOptions configures one subscription. The zero value subscribes
// live only, with the bus's default caps. What a resume (Resume,
// LastEventID, Epoch) replays is docs/SPEC.md section 4.
type SubscribeOptions struct {
	// Resume reports whether LastEventID is set. Without it the subscription
	// is live only; with it, LastEventID 0 means "from the start".
	Resume bool
	// LastEventID is the id of the last event the client received; the
	// subscription replays what came after it (docs/SPEC.md section 4).
	LastEventID uint64
	// Epoch is the bus epoch the client saw. When Resume is set and Epoch
	// differs from the bus's, the client gets an epoch_reset resync. Empty or
	// longer than 64 bytes: ignored (docs/SPEC.md section 4.2).
	Epoch string
	// MaxQueued is the live frame cap; 0 means Options.MaxQueued, negative
	// is an error wrapping ErrInvalidOption.
	MaxQueued int
	// Types restricts the subscription to event types: up to
	// MaxTypeFilters filters of up to MaxTypeFilterBytes, each an exact
	// type or a trailing wildcard such as "plugin.tool.github.*". Empty
	// means every type. Synthetic frames always pass; filtered-out events
	// never count toward the caps; on a filtered stream ids increase but
	// are not contiguous. The grammar and the rules are docs/SPEC.md
	// section 2.4; CheckTypeFilters checks a list as Subscribe does.
	Types []string
	// OverflowPolicy overrides the bus's Options.OverflowPolicy for this
	// subscription; 0 keeps the bus's. It is the embedder's choice, never a
	// remote client's.
	OverflowPolicy OverflowPolicy
	// CatchUpStallTimeout overrides the bus's Options.CatchUpStallTimeout
	// for this subscription; 0 keeps the bus's, below a millisecond is an
	// error wrapping ErrInvalidOption.
	CatchUpStallTimeout time.Duration
	// Group, when set, makes the subscription a member of g: it signals
	// the group's one channel instead of a channel of its own (its Ready
	// returns the group's), so that one goroutine waits for all the
	// members at once (see ReadyGroup). nil: the subscription has its own.
	Group *ReadyGroup
	// Detached makes Subscribe's ctx bound the call only (its wait for a
	// mirror's feed, its read of the log), not the subscription, which
	// then ends by Close, CloseBlocked, eviction or the bus's Close, never
	// by ctx. It is for a transport that watches its connection itself and
	// ends the subscription on its own terms, as the Handler does, and
	// saves it about 1 KiB of memory per subscription (what watching a
	// context for the subscription's whole life costs). false: ctx
	// cancels the subscription.
	Detached bool
	// Interrupt, when set, is called at most once, from another goroutine
	// (a publisher's) and never under a lock of the bus, when the bus's
	// Hub takes back what the subscription holds beyond its ring to keep
	// its memory budget (docs/SPEC.md section 7) while the consumer holds
	// frames it took and has not reported done (TakeReady's, before
	// MarkWritten): a transport then makes the write in progress fail at
	// once (it sets its write deadline to now), so that those frames are
	// let go. It must not block. nil: they are let go when the write ends
	// by itself.
	Interrupt func()
	// CursorInvalid tells the client, in-band, that the cursor it
	// presented could not be used (malformed, over MaxCursorEntries, two
	// epochs that disagree: docs/SPEC.md section 4.1): the subscription is
	// live only, as without Resume, and its first frame is
	// state_resync_required with reason ReasonCursorInvalid,
	// lastDeliveredId 0, earliestAvailableId the id of the first event it
	// can deliver (the bus's last id + 1 when it subscribes) and the
	// bus's epoch. Subscribe queues it under the bus lock, atomically with
	// the registration, so no live frame comes before it; no
	// replay_complete follows (nothing is replayed). A transport sets it
	// instead of failing the request, so that nothing a client sends turns
	// a resume into a silent loss. With Resume it is an error wrapping
	// ErrInvalidOption.
	CursorInvalid bool
}

// checkPolicy checks an OverflowPolicy of Options or SubscribeOptions (0
// is valid: the default).
func checkPolicy(p OverflowPolicy) error {
	if p > OverflowCatchUp {
		return fmt.Errorf("%w: unknown OverflowPolicy %d", ErrInvalidOption, p)
	}
	return nil
}

// checkStall checks a CatchUpStallTimeout of Options or SubscribeOptions
// (0 is valid: the default).
func checkStall(d time.Duration) error {
	if d != 0 && d < time.Millisecond {
		return fmt.Errorf("%w: CatchUpStallTimeout is %s, must be at least 1ms", ErrInvalidOption, d)
	}
	return nil
}

// subSettings is what Subscribe makes of SubscribeOptions: every setting
// resolved against the bus's Options.
type subSettings struct {
	maxQueued int
	policy    OverflowPolicy
	stall     time.Duration
	filter    *typeFilter
}

// resolve validates opts and fills what they leave to the bus's options o
// (already defaulted). Its errors are Subscribe's: ErrInvalidOption for
// CursorInvalid with Resume, a negative MaxQueued, an unknown
// OverflowPolicy or a CatchUpStallTimeout below a millisecond,
// ErrInvalidFilter for an invalid Types entry.
func (opts SubscribeOptions) resolve(o Options) (subSettings, error) {
	if opts.Resume && opts.CursorInvalid {
		return subSettings{}, fmt.Errorf("%w: CursorInvalid with Resume: a cursor is either used or not", ErrInvalidOption)
	}
	if opts.MaxQueued < 0 {
		return subSettings{}, fmt.Errorf("%w: MaxQueued is %d, must not be negative", ErrInvalidOption, opts.MaxQueued)
	}
	if err := checkPolicy(opts.OverflowPolicy); err != nil {
		return subSettings{}, err
	}
	if err := checkStall(opts.CatchUpStallTimeout); err != nil {
		return subSettings{}, err
	}
	filter, err := compileFilters(opts.Types)
	if err != nil {
		return subSettings{}, err
	}
	s := subSettings{maxQueued: opts.MaxQueued, policy: opts.OverflowPolicy, stall: opts.CatchUpStallTimeout, filter: filter}
	if s.maxQueued == 0 {
		s.maxQueued = o.MaxQueued
	}
	if s.policy == 0 {
		s.policy = o.OverflowPolicy
	}
	if s.stall == 0 {
		s.stall = o.CatchUpStallTimeout
	}
	return s, nil
}
