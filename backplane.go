package eventbus

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// A backplane shares one session's events between the replicas of a daemon:
// a log in a real engine (Redis Streams, PostgreSQL, ...) numbers them, and
// each replica feeds a local bus from that log. This file is the seam it
// plugs into, with three parts:
//
//   - NewFed makes a bus whose epoch and ids come from the log; the
//     backplane's reader feeds it with Append, in id order.
//   - Log is what the bus asks the log for: history for a resume its ring
//     cannot answer, and the log's head when a client resumes from an id
//     this replica has not been fed yet.
//   - Encoder validates and encodes an event as Publish would, without an
//     id, so the backplane can number it in the log.
//
// Everything else (queues, warnings, evictions, replay rules, the Handler)
// is the bus's own and works on a fed bus unchanged. The rules are
// docs/SPEC.md section 8.2; package backplane is the kit a backplane
// module is built on (section 8.7).

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

// Log is a shared log as a fed bus sees it: the interface a backplane
// implements for NewFed. Its methods are called without any bus lock held,
// on the goroutine of the Subscribe that needs them, and may do I/O; ctx is
// that subscription's, bounded by FeedOptions.LagTimeout for Head. They
// must be safe for concurrent use.
type Log interface {
	// ReadHistory returns the entries of req's range that the log still
	// holds, in id order and contiguous, and the first id the log holds
	// (0 when it holds none). An error means the history cannot be read
	// now: the subscriber gets state_resync_required (ring_evicted, detail
	// history_unavailable) and continues live.
	ReadHistory(ctx context.Context, req HistoryRequest) (entries []LogEntry, first uint64, err error)
	// Head returns the log's current epoch and the last id it assigned.
	// A fed bus asks it when a client resumes, in the bus's epoch, from an
	// id the bus has not been fed yet (the client read it through a
	// replica whose reader is ahead): when the log holds that id, Subscribe
	// waits for the feed to deliver it instead of answering epoch_reset.
	Head(ctx context.Context) (epoch string, last uint64, err error)
}

// DefaultLagTimeout is FeedOptions.LagTimeout's default.
const DefaultLagTimeout = 2 * time.Second

// FeedOptions configures a bus fed by a shared log (NewFed).
type FeedOptions struct {
	// Epoch is the log's epoch: 32 lowercase hex characters (NewEpoch
	// makes one). Every replica's bus of the log must use the same.
	Epoch string
	// NextID is the id of the next entry the bus will be fed; 0 means 1.
	// A bus made for a log that already holds entries 1..n starts at n+1.
	NextID uint64
	// Log answers resumes the bus's ring cannot; nil means the ring only.
	Log Log
	// LagTimeout bounds how long Subscribe waits for the feed to reach a
	// client's cursor (see Log.Head); 0 means DefaultLagTimeout.
	LagTimeout time.Duration
}

// feed is a fed bus's owner (owner.go): the log it answers resumes from,
// and the Subscribes waiting for the feed to reach their cursor
// (awaitFeed). Append and the replay reach it through fed.
type feed struct {
	log Log
	lag time.Duration

	mu sync.Mutex
	// fed is closed at the next Append (or Close) and then forgotten; nil
	// while nobody waits for the feed (awaitFeed).
	fed chan struct{}
}

// NewFed returns a bus whose epoch and ids come from a shared log: the
// backplane feeds it with Append, and a resume its ring cannot answer is
// read from fo.Log. Its Publish returns ErrFed for an event it would
// otherwise accept (a backplane publishes to its log, and its reader feeds
// every replica's bus, this one included);
// Signal delivers to this bus's subscribers only (a backplane spreads
// signals by calling Signal on every replica). Subscribe, Close, Stats and
// every other method behave as on a bus made by New.
//
// It returns an error wrapping ErrInvalidOption for invalid opts, an epoch
// that is not 32 lowercase hex characters, or a negative LagTimeout. The
// fed bus's rules are docs/SPEC.md section 8.2.
func NewFed(opts Options, fo FeedOptions) (*EventBus, error) {
	if !validEpoch(fo.Epoch) {
		return nil, fmt.Errorf("%w: feed epoch %q is not 32 lowercase hex characters", ErrInvalidOption, truncate(fo.Epoch, 64))
	}
	if fo.LagTimeout < 0 {
		return nil, fmt.Errorf("%w: LagTimeout is %v, must not be negative", ErrInvalidOption, fo.LagTimeout)
	}
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	f := &feed{log: fo.Log, lag: fo.LagTimeout}
	if f.lag == 0 {
		f.lag = DefaultLagTimeout
	}
	b := new(EventBus)
	b.init(o, f)
	b.epoch = fo.Epoch
	b.nextID = max(fo.NextID, 1)
	b.lastID.Store(b.nextID - 1)
	return b, nil
}

// fed returns the bus's feed, nil for a bus not made by NewFed.
func (b *EventBus) fed() *feed {
	f, _ := b.owner.(*feed)
	return f
}

// publishing refuses Publish: a backplane publishes to its log, and its
// reader feeds every replica's bus with Append.
func (*feed) publishing(_, _ int64) (int64, error) { return 0, ErrFed }

// ringChangedLocked and used have nothing to do: the log, not the feed,
// keeps the history, and a fed bus's use is its backplane's to watch.
func (*feed) ringChangedLocked(int64) {}

func (*feed) used() {}

// heldLocked and releasedLocked have nothing to do: a fed bus has no
// budget over what its subscribers hold.
func (*feed) heldLocked(uint64) {}

func (*feed) releasedLocked() {}

// closed releases the Subscribes waiting for the feed: they give up.
func (f *feed) closed() { f.wake() }

// validEpoch reports whether e is an epoch token as NewEpoch makes them.
func validEpoch(e string) bool {
	if len(e) != 32 {
		return false
	}
	for i := 0; i < len(e); i++ {
		if c := e[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// entryFrame builds the frame of an already-numbered log entry.
func entryFrame(e LogEntry) (Frame, error) {
	if err := validType(e.Type); err != nil {
		return Frame{}, err
	}
	if bytes.ContainsAny(e.JSON, "\r\n") {
		return Frame{}, fmt.Errorf("%w: envelope of id %d contains CR or LF", ErrInvalidEvent, e.ID)
	}
	var d [maxDigits]byte
	digits := strconv.AppendUint(d[:0], e.ID, 10)
	b := make([]byte, 0, len(headID)+len(digits)+len(headEvent)+len(e.Type)+len(headData)+len(e.JSON)+2)
	b = append(b, headID...)
	b = append(b, digits...)
	b = append(b, headEvent...)
	b = append(b, e.Type...)
	b = append(b, headData...)
	j := len(b)
	b = append(b, e.JSON...)
	b = append(b, "\n\n"...)
	return Frame{&frame{wire: b, json: int32(j), kind: kindEvent, id: e.ID, typ: e.Type}}, nil
}

// Append feeds a fed bus (NewFed) one entry of its log: ring, fan-out,
// warnings and evictions exactly as Publish, with the log's id. Entries
// must come in id order from one goroutine (the backplane's reader). An id
// below the bus's next id is ignored (a reader that re-read after a
// reconnect); an id above it is a gap (the log trimmed entries while the
// reader was away): every subscriber gets state_resync_required
// (ring_evicted) first, because every one of them missed those entries.
//
// Append never blocks on a subscriber. It returns ErrFed on a bus made by
// New, ErrClosed after Close, and an error wrapping ErrInvalidEvent for an
// entry whose type Publish would refuse (a reserved one included) or whose
// envelope holds CR or LF (nothing is delivered then).
func (b *EventBus) Append(e LogEntry) error {
	fd := b.fed()
	if fd == nil {
		if b.closedOrZero() {
			return ErrClosed
		}
		return ErrFed
	}
	v, err := entryFrame(e)
	if err != nil {
		return err
	}
	f := v.ref() // before the lock, as in Publish
	var out fanout
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ErrClosed
	}
	if e.ID < b.nextID {
		b.mu.Unlock()
		return nil
	}
	if e.ID > b.nextID {
		now := b.now()
		for _, s := range b.subs {
			if s.behind {
				// Catching up, it reads the gap from the restarted ring
				// and is told from its own cursor (see catchUp).
				continue
			}
			if s.q.forcePush(resyncFrame(ReasonRingEvicted, "", b.nextID-1, e.ID, b.epoch, now).ref()) {
				b.stats.resync(ReasonRingEvicted)
			}
		}
	}
	b.nextID = e.ID + 1
	b.ring.append(f)     // restarts itself on a gap, keeping ids contiguous
	b.lastID.Store(e.ID) // before the fan-out, as in Publish
	b.stats.published.Add(1)
	b.ringChangedLocked(0)
	b.fanOutLocked(f, e.ID, &out)
	b.mu.Unlock()
	b.finish(&out)
	fd.wake()
	return nil
}

// wake releases the Subscribes waiting for the feed (awaitFeed).
func (f *feed) wake() {
	f.mu.Lock()
	if f.fed != nil {
		close(f.fed)
		f.fed = nil
	}
	f.mu.Unlock()
}

// next returns a channel closed at the next Append or Close.
func (f *feed) next() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fed == nil {
		f.fed = make(chan struct{})
	}
	return f.fed
}
