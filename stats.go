package eventbus

import (
	"context"
	"log/slog"
	"slices"
	"sync/atomic"
)

// Stats is a snapshot of a bus's counters. Counters only grow; Subscribers,
// RingLen and RingBytes are current values. Fields are read one by one
// without a common lock, so a snapshot taken during a publish may be off by
// that publish between fields. The counters are docs/SPEC.md section 1.5.
type Stats struct {
	// Published counts events that got an id.
	Published uint64
	// Rejected counts Publish calls that returned an error, by reason.
	Rejected RejectedStats
	// Signals counts signals accepted by Signal.
	Signals uint64
	// FramesDelivered counts frames that reached their consumer: returned
	// by AppendReady, yielded by Events, or written and flushed by Handler
	// (a batch whose write fails counts as Dropped.Blocked instead).
	FramesDelivered uint64
	// Subscribers is the current number of subscriptions; PeakSubscribers
	// the highest it has been.
	Subscribers, PeakSubscribers int
	// Evictions counts evicted subscribers, by reason.
	Evictions EvictionStats
	// Warnings counts slow_client_warning frames sent.
	Warnings uint64
	// Resyncs counts state_resync_required frames sent, by reason.
	Resyncs ResyncStats
	// Dropped counts frames that were queued or due to a subscriber but
	// never reached it, by reason.
	Dropped DroppedStats
	// CatchUp counts what OverflowCatchUp did.
	CatchUp CatchUpStats
	// RingLen and RingBytes are the replay ring's current size: its
	// events, and the sum of their envelopes (Frame.Size), the unit of
	// Options.RingMaxBytes.
	RingLen, RingBytes int
}

// RejectedStats counts rejected publishes by reason.
type RejectedStats struct {
	Invalid  uint64 // invalid type or unencodable data (ErrInvalidEvent)
	TooLarge uint64 // above MaxEventBytes (ErrEventTooLarge)
	Closed   uint64 // after Close (ErrClosed)
}

// EvictionStats counts evictions by client_evicted reason.
type EvictionStats struct {
	// QueueOverflow: a live push found the subscriber's queue at MaxQueued
	// frames (client_evicted reason queue_overflow).
	QueueOverflow uint64
	// QueueBytesOverflow: a live push would have taken the queue past
	// MaxQueuedBytes (reason queue_bytes_overflow).
	QueueBytesOverflow uint64
	// RepeatedOverflow: OverflowResync's third overflow within
	// OverflowWindow (reason repeated_overflow).
	RepeatedOverflow uint64
	// CatchUpStalled: under OverflowCatchUp, the subscriber took nothing
	// for CatchUpStallTimeout while behind (reason catch_up_stalled).
	CatchUpStalled uint64
	// MemoryBudget: a Hub's budget took back the frames the subscriber
	// held beyond its ring (docs/SPEC.md section 7).
	MemoryBudget uint64
}

// CatchUpStats counts the work of OverflowCatchUp. Behind is a current
// value, the others only grow.
type CatchUpStats struct {
	Entered uint64 // times a subscriber fell behind (a cap rejected a live push)
	Served  uint64 // frames consumers read from the ring while behind
	Behind  int    // subscribers behind now
}

// ResyncStats counts state_resync_required frames by reason.
type ResyncStats struct {
	// EpochReset: a resume from another epoch, or from ahead of the bus
	// (a daemon restart, a session deleted and made again).
	EpochReset uint64
	// RingEvicted: a resume, or a subscriber catching up, that the ring
	// (or a backplane's log) no longer holds in full.
	RingEvicted uint64
	// ReplayBudgetExceeded: a resume that would replay more than
	// ReplayBudgetBytes; the client resumes again from the last replayed
	// id.
	ReplayBudgetExceeded uint64
	// QueueOverflow and QueueBytesOverflow: OverflowResync's answer to a
	// live push that a cap rejected (instead of an eviction).
	QueueOverflow      uint64
	QueueBytesOverflow uint64
	// CursorInvalid: a cursor the transport could not use (malformed, two
	// epochs that disagree); the stream is live from there.
	CursorInvalid uint64
}

// DroppedStats counts dropped frames by reason.
type DroppedStats struct {
	Coalesced    uint64 // signals replaced by a newer one in a queue
	Overflow     uint64 // live frames dropped by the resync overflow policy
	ReplayBudget uint64 // ring events a resume did not replay (budget spent)
	Cancelled    uint64 // frames buffered when a subscription was cancelled
	Blocked      uint64 // frames lost when an HTTP write failed or blocked
	// CatchUpSignals counts signals a subscriber under OverflowCatchUp
	// did not get because its caps were full (signals are in no ring).
	CatchUpSignals uint64
	// MemoryBudget counts frames a Hub's budget took back from the queue
	// of a subscriber that held frames beyond its ring (docs/SPEC.md
	// section 7).
	MemoryBudget uint64
}

// counters are the atomics behind Stats.
type counters struct {
	published, signals, delivered, warnings                        atomic.Uint64
	rejInvalid, rejTooLarge, rejClosed                             atomic.Uint64
	resyncs, evictions                                             reasonCounts
	dropCoalesced, dropOverflow, dropBudget, dropCancel, dropBlock atomic.Uint64
	dropCatchUpSignal, dropShed, catchUps, catchUpServed           atomic.Uint64
	peak, behind                                                   atomic.Int64
	ringLen, ringBytes                                             atomic.Int64
}

// Stats returns a snapshot of the bus's counters. It takes no lock and does
// not allocate, so it is cheap enough to scrape every second. It is safe
// for concurrent use, also after Close.
func (b *EventBus) Stats() Stats {
	c := &b.stats
	return Stats{
		Published:       c.published.Load(),
		Rejected:        RejectedStats{c.rejInvalid.Load(), c.rejTooLarge.Load(), c.rejClosed.Load()},
		Signals:         c.signals.Load(),
		FramesDelivered: c.delivered.Load(),
		Subscribers:     int(b.subscribed.Load()),
		PeakSubscribers: int(c.peak.Load()),
		Evictions: EvictionStats{c.evictions.get(ReasonQueueOverflow), c.evictions.get(ReasonQueueBytesOverflow),
			c.evictions.get(ReasonRepeatedOverflow), c.evictions.get(ReasonCatchUpStalled),
			c.evictions.get(ReasonMemoryBudget)},
		Warnings: c.warnings.Load(),
		Resyncs: ResyncStats{c.resyncs.get(ReasonEpochReset), c.resyncs.get(ReasonRingEvicted),
			c.resyncs.get(ReasonReplayBudgetExceeded), c.resyncs.get(ReasonQueueOverflow), c.resyncs.get(ReasonQueueBytesOverflow),
			c.resyncs.get(ReasonCursorInvalid)},
		Dropped: DroppedStats{c.dropCoalesced.Load(), c.dropOverflow.Load(), c.dropBudget.Load(),
			c.dropCancel.Load(), c.dropBlock.Load(), c.dropCatchUpSignal.Load(), c.dropShed.Load()},
		CatchUp:   CatchUpStats{c.catchUps.Load(), c.catchUpServed.Load(), int(c.behind.Load())},
		RingLen:   int(c.ringLen.Load()),
		RingBytes: int(c.ringBytes.Load()),
	}
}

// resync counts a state_resync_required frame of reason.
func (c *counters) resync(reason string) { c.resyncs.add(reason) }

// eviction counts a client_evicted frame of reason.
func (c *counters) eviction(reason string) { c.evictions.add(reason) }

// reasons are the resync and eviction reasons, in the order of
// reasonCounts.
var reasons = [...]string{ReasonEpochReset, ReasonRingEvicted, ReasonReplayBudgetExceeded,
	ReasonQueueOverflow, ReasonQueueBytesOverflow, ReasonRepeatedOverflow, ReasonCatchUpStalled,
	ReasonMemoryBudget, ReasonCursorInvalid}

// reasonCounts counts frames by reason, one counter per entry of reasons.
type reasonCounts [len(reasons)]atomic.Uint64

// add counts one frame of reason; an unknown reason counts nowhere.
func (r *reasonCounts) add(reason string) {
	if i := slices.Index(reasons[:], reason); i >= 0 {
		r[i].Add(1)
	}
}

// get returns the count of reason, one of reasons.
func (r *reasonCounts) get(reason string) uint64 { return r[slices.Index(reasons[:], reason)].Load() }

// Diagnostic is one noteworthy thing the bus observed, handed to
// Options.OnDiagnostic and logged. Kind is one of the Diag constants;
// Message is the log message; Attrs are its structured attributes.
type Diagnostic struct {
	Kind    string
	Message string
	Attrs   []slog.Attr
}

// Diagnostic kinds: Diagnostic.Kind, what Options.OnDiagnostic is told and
// the log records (docs/SPEC.md section 1.5).
const (
	// DiagPublishRejected: Publish or Signal refused an event (invalid,
	// too large); its attributes say the type and the error.
	DiagPublishRejected = "publish_rejected"
	// DiagSlowClient: a subscriber reached WarnThresholdRatio of a cap and
	// was sent slow_client_warning.
	DiagSlowClient = "slow_client"
	// DiagEvicted: a subscriber was evicted (client_evicted), with its
	// reason and counts.
	DiagEvicted = "subscriber_evicted"
	// DiagOverflowResync: under OverflowResync, a subscriber's live frames
	// were dropped for state_resync_required.
	DiagOverflowResync = "overflow_resync"
	// DiagWriteFailed: a transport's write failed or blocked past its
	// deadline (Subscription.CloseBlocked); the subscriber was dropped.
	DiagWriteFailed = "write_failed"
	// DiagHistoryUnavailable: a fed bus could not read the history a
	// resume needed from its log; the client was told ring_evicted.
	DiagHistoryUnavailable = "history_unavailable"
	// DiagMemoryBudget: a Hub's budget took back what a subscriber held
	// beyond its ring (evicted, put behind, or its draining frames
	// dropped).
	DiagMemoryBudget = "memory_budget"
)

// emit hands each diagnostic to the callback and logs the ones it does not
// suppress. It is never called with the bus lock held.
func (b *EventBus) emit(ds ...Diagnostic) {
	for _, d := range ds {
		if b.opts.OnDiagnostic != nil && b.opts.OnDiagnostic(d) {
			continue
		}
		b.logger().LogAttrs(context.Background(), slog.LevelWarn, d.Message, d.Attrs...)
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
