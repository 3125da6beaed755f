package eventbus

import (
	"bytes"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ssebus/eventbus/internal/seam"
)

// A backplane shares one session's events between the replicas of a daemon:
// a log in a real engine (Redis Streams, PostgreSQL, ...) numbers them, and
// each replica feeds a local bus, its mirror, from that log. This file is
// the mirror's half that needs the bus's internals, unexported: package
// backplane exposes it (docs/SPEC.md section 8.2), reaching it through
// package seam (internal/seam), to which init lends it:
//
//   - newMirror makes a bus whose epoch and ids come from the log
//     (backplane.NewMirror); the backplane's reader feeds it with
//     appendEntry (backplane.Append), in id order.
//   - feed.log is what the bus asks the log for (backplane.Log): history
//     for a resume its ring cannot answer (replay.go), and the log's head
//     when a client resumes from an id this replica has not been fed yet.
//   - the encoder (encode.go) validates and encodes an event as Publish
//     would, without an id, so the backplane can number it in the log
//     (backplane.Encoder); closeWithError (eventbus.go) ends a mirror whose
//     engine stayed unreachable (backplane.CloseWithError).
//
// Everything else (queues, warnings, evictions, replay rules, the Handler)
// is the bus's own and works on a mirror unchanged. Package backplane is
// also the kit a backplane module is built on (section 8.7).

func init() {
	seam.Lend(seam.Root[*EventBus, Options, Event]{
		NewMirror:      newMirror,
		Append:         (*EventBus).appendEntry,
		CloseWithError: (*EventBus).closeWithError,
		NewEncoder: func(opts Options) (seam.Encoder[Event], error) {
			enc, err := newEncoder(opts)
			if err != nil {
				return nil, err // no typed nil in the interface
			}
			return enc, nil
		},
	})
}

// feed is a mirror's owner (owner.go): the log it answers resumes from,
// and the Subscribes waiting for the feed to reach their cursor
// (awaitFeed). appendEntry and the replay reach it through fed.
type feed struct {
	log seam.Log
	lag time.Duration

	mu sync.Mutex
	// fed is closed at the next appendEntry (or Close) and then forgotten;
	// nil while nobody waits for the feed (awaitFeed).
	fed chan struct{}
}

// newMirror returns a bus whose epoch and ids come from a shared log
// (backplane.NewMirror, whose doc is the contract): fed with appendEntry,
// its Publish refuses a valid event with seam.ErrMirror. It returns an
// error wrapping ErrInvalidOption for invalid opts, an epoch that is not
// 32 lowercase hex characters, or a negative LagTimeout (0 means
// seam.DefaultLagTimeout).
func newMirror(opts Options, fo seam.MirrorOptions) (*EventBus, error) {
	if !validEpoch(fo.Epoch) {
		return nil, fmt.Errorf("%w: mirror epoch %q is not 32 lowercase hex characters", ErrInvalidOption, truncate(fo.Epoch, 64))
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
		f.lag = seam.DefaultLagTimeout
	}
	b := new(EventBus)
	b.init(o, f)
	b.epoch = fo.Epoch
	b.nextID = max(fo.NextID, 1)
	b.lastID.Store(b.nextID - 1)
	return b, nil
}

// fed returns the bus's feed, nil for a bus that is no mirror (newMirror).
func (b *EventBus) fed() *feed {
	f, _ := b.owner.(*feed)
	return f
}

// publishing refuses Publish: a backplane publishes to its log, and its
// reader feeds every replica's bus with appendEntry.
func (*feed) publishing(_, _ int64) (int64, error) { return 0, seam.ErrMirror }

// ringChangedLocked and used have nothing to do: the log, not the feed,
// keeps the history, and a mirror's use is its backplane's to watch.
func (*feed) ringChangedLocked(int64) {}

func (*feed) used() {}

// heldLocked and releasedLocked have nothing to do: a mirror has no
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
func entryFrame(e seam.Entry) (Frame, error) {
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

// appendEntry feeds a mirror one entry of its log (backplane.Append, whose
// doc is the contract): ring, fan-out, warnings and evictions exactly as
// Publish, with the log's id; an id below the next one is ignored, an id
// above it is a gap that every subscriber is told of first. It returns
// seam.ErrMirror on a bus that is no mirror, ErrClosed after Close, and an
// error wrapping ErrInvalidEvent for an entry Publish would refuse or whose
// envelope holds CR or LF.
func (b *EventBus) appendEntry(e seam.Entry) error {
	fd := b.fed()
	if fd == nil {
		if b.closedOrZero() {
			return ErrClosed
		}
		return seam.ErrMirror
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

// next returns a channel closed at the next appendEntry or Close.
func (f *feed) next() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fed == nil {
		f.fed = make(chan struct{})
	}
	return f.fed
}
