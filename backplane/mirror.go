package backplane

import (
	"context"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/internal/seam"
)

// A mirror is an eventbus.EventBus whose epoch and ids come from a shared
// log: this file is the seam a backplane plugs into (docs/SPEC.md section
// 8.2), with three parts:
//
//   - NewMirror makes the bus; the backplane's reader feeds it with
//     Append, in id order.
//   - Log is what the mirror asks the log for: history for a resume its
//     ring cannot answer, and the log's head when a client resumes from an
//     id this replica has not been fed yet.
//   - Encoder (encoder.go) validates and encodes an event as Publish
//     would, without an id, so the backplane can number it in the log.
//
// Everything else (queues, warnings, evictions, replay rules, the Handler)
// is the bus's own and works on a mirror unchanged. The implementation is
// package eventbus's, unexported, reached through internal/seam; a Set
// makes, feeds and closes its mirrors with these functions, and an engine
// built on a Set calls only Append (in Engine.Run).

// root is what package eventbus lends this package (internal/seam).
var root = seam.Borrow[*eventbus.EventBus, eventbus.Options, eventbus.Event]()

// ErrMirror is returned by Publish on a mirror (NewMirror): publish
// through its backplane, which numbers the event in the log. Append
// returns it on a bus that is no mirror (one made by eventbus.New or a
// Hub).
var ErrMirror = seam.ErrMirror

// LogEntry is one already-numbered event of a shared log: its id, its type
// and its complete JSON envelope, with "id" (EncodedEvent.Envelope builds
// it).
type LogEntry struct {
	ID   uint64
	Type string
	JSON []byte
}

// HistoryRequest asks a Log for the entries a resume needs.
type HistoryRequest struct {
	// After and Upto bound the ids wanted: After < id <= Upto.
	After, Upto uint64
	// MaxBytes, when positive, lets the log stop after the first entry
	// that takes the envelope bytes returned past it: the replay stops
	// there anyway (the replay budget, which counts envelopes too). 0
	// means every entry is needed (a filtered resume counts only the
	// entries that match).
	MaxBytes int
}

// Log is a shared log as a mirror sees it: the interface a backplane
// implements for NewMirror (a Set's Member is one). Its methods are called
// without any bus lock held, on the goroutine of the Subscribe that needs
// them, and may do I/O; ctx is that subscription's, bounded by
// MirrorOptions.LagTimeout for Head. They must be safe for concurrent use.
type Log interface {
	// ReadHistory returns the entries of req's range that the log still
	// holds, in id order and contiguous, and the first id the log holds
	// (0 when it holds none). An error means the history cannot be read
	// now: the subscriber gets state_resync_required (ring_evicted, detail
	// history_unavailable) and continues live.
	ReadHistory(ctx context.Context, req HistoryRequest) (entries []LogEntry, first uint64, err error)
	// Head returns the log's current epoch and the last id it assigned.
	// A mirror asks it when a client resumes, in the mirror's epoch, from
	// an id the mirror has not been fed yet (the client read it through a
	// replica whose reader is ahead): when the log holds that id,
	// Subscribe waits for the feed to deliver it instead of answering
	// epoch_reset.
	Head(ctx context.Context) (epoch string, last uint64, err error)
}

// DefaultLagTimeout is MirrorOptions.LagTimeout's default: 2 seconds.
const DefaultLagTimeout = seam.DefaultLagTimeout

// MirrorOptions configures a mirror of a shared log (NewMirror).
type MirrorOptions struct {
	// Epoch is the log's epoch: 32 lowercase hex characters
	// (eventbus.NewEpoch makes one). Every replica's mirror of the log
	// must use the same.
	Epoch string
	// NextID is the id of the next entry the mirror will be fed; 0 means
	// 1. A mirror made for a log that already holds entries 1..n starts at
	// n+1.
	NextID uint64
	// Log answers resumes the mirror's ring cannot; nil means the ring
	// only.
	Log Log
	// LagTimeout bounds how long Subscribe waits for the feed to reach a
	// client's cursor (see Log.Head); 0 means DefaultLagTimeout.
	LagTimeout time.Duration
}

// NewMirror returns a bus whose epoch and ids come from a shared log: the
// backplane feeds it with Append, and a resume its ring cannot answer is
// read from mo.Log. Its Publish returns ErrMirror for an event it would
// otherwise accept (a backplane publishes to its log, and its reader feeds
// every replica's mirror, this one included); its Signal delivers to this
// bus's subscribers only (a backplane spreads signals by calling Signal on
// every replica). Subscribe, Close, Stats and every other method behave as
// on a bus made by eventbus.New, and the eventbus Handler and MuxHandler
// serve it unchanged.
//
// It returns an error wrapping eventbus.ErrInvalidOption for invalid
// opts, an epoch that is not 32 lowercase hex characters, or a negative
// LagTimeout. The mirror's rules are docs/SPEC.md section 8.2. A Set
// makes its mirrors with it (Config.Bus.Options, Config.Timeout as
// LagTimeout, the Member as the Log).
func NewMirror(opts eventbus.Options, mo MirrorOptions) (*eventbus.EventBus, error) {
	so := seam.MirrorOptions{Epoch: mo.Epoch, NextID: mo.NextID, LagTimeout: mo.LagTimeout}
	if mo.Log != nil {
		so.Log = history{mo.Log}
	}
	return root.NewMirror(opts, so)
}

// history is a backplane's Log as package eventbus reads it.
type history struct{ log Log }

func (h history) ReadHistory(ctx context.Context, req seam.HistoryRequest) ([]seam.Entry, uint64, error) {
	entries, first, err := h.log.ReadHistory(ctx, HistoryRequest(req))
	var out []seam.Entry
	if len(entries) > 0 {
		out = make([]seam.Entry, len(entries))
		for i, e := range entries {
			out[i] = seam.Entry(e)
		}
	}
	return out, first, err
}

func (h history) Head(ctx context.Context) (string, uint64, error) { return h.log.Head(ctx) }

// Append feeds a mirror (NewMirror) one entry of its log: ring, fan-out,
// warnings and evictions exactly as Publish, with the log's id. Entries
// must come in id order from one goroutine (the backplane's reader,
// Engine.Run). An id below the mirror's next id is ignored (a reader that
// re-read after a reconnect); an id above it is a gap (the log trimmed
// entries while the reader was away): every subscriber gets
// state_resync_required (ring_evicted) first, because every one of them
// missed those entries.
//
// Append never blocks on a subscriber. It returns ErrMirror on a bus that
// is no mirror, eventbus.ErrClosed after Close, and an error wrapping
// eventbus.ErrInvalidEvent for an entry whose type Publish would refuse (a
// reserved one included) or whose envelope holds CR or LF (nothing is
// delivered then).
func Append(mirror *eventbus.EventBus, e LogEntry) error {
	return root.Append(mirror, seam.Entry(e))
}

// CloseWithError is bus.Close for a bus that ends because something
// failed, such as a backplane whose engine stayed unreachable (Set.Outage,
// through Set.Stop): every subscription receives what was queued, then a
// terminal stream_error frame {"error":message,"errorKind":kind}
// (eventbus.ErrorKindUnavailable, say), so a client learns why its stream
// ended and resumes when it reconnects; its Err wraps eventbus.ErrClosed
// and names kind and message. Like Close it is idempotent (only the first
// Close, CloseForShutdown or CloseWithError counts), does not block, and
// returns nil. With eventbus.ErrorKindShutdown the frame also carries
// eventbus.DefaultShutdownRetryAfter; bus.CloseForShutdown chooses the
// delay. It works on any bus, a mirror or not.
func CloseWithError(bus *eventbus.EventBus, kind, message string) error {
	return root.CloseWithError(bus, kind, message)
}
