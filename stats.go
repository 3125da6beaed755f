package eventbus

import (
	"context"
	"log/slog"
	"sync/atomic"
)

// Stats is a snapshot of a bus's counters. Counters only grow; Subscribers,
// RingLen and RingBytes are current values. Fields are read one by one
// without a common lock, so a snapshot taken during a publish may be off by
// that publish between fields.
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
	// RingLen and RingBytes are the replay ring's current size.
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
	QueueOverflow      uint64
	QueueBytesOverflow uint64
	RepeatedOverflow   uint64
	CatchUpStalled     uint64 // OverflowCatchUp: took nothing for CatchUpStallTimeout while behind
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
	EpochReset           uint64
	RingEvicted          uint64
	ReplayBudgetExceeded uint64
	QueueOverflow        uint64 // resync overflow policy
	QueueBytesOverflow   uint64 // resync overflow policy
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
}

// counters are the atomics behind Stats.
type counters struct {
	published, signals, delivered, warnings                        atomic.Uint64
	rejInvalid, rejTooLarge, rejClosed                             atomic.Uint64
	evFrames, evBytes, evRepeated, evStalled                       atomic.Uint64
	rsEpoch, rsRing, rsBudget, rsFrames, rsBytes                   atomic.Uint64
	dropCoalesced, dropOverflow, dropBudget, dropCancel, dropBlock atomic.Uint64
	dropCatchUpSignal, catchUps, catchUpServed                     atomic.Uint64
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
		Evictions:       EvictionStats{c.evFrames.Load(), c.evBytes.Load(), c.evRepeated.Load(), c.evStalled.Load()},
		Warnings:        c.warnings.Load(),
		Resyncs:         ResyncStats{c.rsEpoch.Load(), c.rsRing.Load(), c.rsBudget.Load(), c.rsFrames.Load(), c.rsBytes.Load()},
		Dropped: DroppedStats{c.dropCoalesced.Load(), c.dropOverflow.Load(), c.dropBudget.Load(),
			c.dropCancel.Load(), c.dropBlock.Load(), c.dropCatchUpSignal.Load()},
		CatchUp:   CatchUpStats{c.catchUps.Load(), c.catchUpServed.Load(), int(c.behind.Load())},
		RingLen:   int(c.ringLen.Load()),
		RingBytes: int(c.ringBytes.Load()),
	}
}

func (c *counters) resync(reason string) {
	switch reason {
	case ReasonEpochReset:
		c.rsEpoch.Add(1)
	case ReasonRingEvicted:
		c.rsRing.Add(1)
	case ReasonReplayBudgetExceeded:
		c.rsBudget.Add(1)
	case ReasonQueueOverflow:
		c.rsFrames.Add(1)
	case ReasonQueueBytesOverflow:
		c.rsBytes.Add(1)
	}
}

func (c *counters) eviction(reason string) {
	switch reason {
	case ReasonQueueOverflow:
		c.evFrames.Add(1)
	case ReasonQueueBytesOverflow:
		c.evBytes.Add(1)
	case ReasonRepeatedOverflow:
		c.evRepeated.Add(1)
	case ReasonCatchUpStalled:
		c.evStalled.Add(1)
	}
}

// Diagnostic is one noteworthy thing the bus observed, handed to
// Options.OnDiagnostic and logged. Kind is one of the Diag constants;
// Message is the log message; Attrs are its structured attributes.
type Diagnostic struct {
	Kind    string
	Message string
	Attrs   []slog.Attr
}

// Diagnostic kinds.
const (
	DiagPublishRejected    = "publish_rejected"
	DiagSlowClient         = "slow_client"
	DiagEvicted            = "subscriber_evicted"
	DiagOverflowResync     = "overflow_resync"
	DiagWriteFailed        = "write_failed"
	DiagHistoryUnavailable = "history_unavailable"
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
