package eventbus

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/ssebus/eventbus/internal/seam"
)

// The backplane seams (see internal/seam): a mirror bus takes its ids and
// epoch from a shared log instead of assigning them, and answers resumes
// its ring cannot from that log.
func init() {
	seam.NewMirror = func(opts any, epoch string, next uint64) (any, error) {
		b, err := New(opts.(Options))
		if err != nil {
			return nil, err
		}
		if epoch != "" {
			b.epoch = epoch
		}
		b.mirror = true
		b.nextID = max(next, 1)
		b.lastID.Store(b.nextID - 1)
		return b, nil
	}
	seam.EncodeTail = func(bus, event any) (string, []byte, error) {
		b := bus.(*EventBus)
		e := event.(Event)
		p, err := b.encode(e)
		if err != nil {
			b.rejected(e.Type, err)
			return "", nil, err
		}
		return e.Type, p.buf[p.head : len(p.buf)-2], nil
	}
	seam.Append = func(bus any, e seam.Entry) error { return bus.(*EventBus).appendEntry(e) }
	seam.Subscribe = func(bus any, ctx context.Context, opts any, h seam.History) (any, error) {
		return bus.(*EventBus).subscribe(ctx, opts.(SubscribeOptions), h)
	}
}

// errMirror is returned by Publish on a bus fed by a backplane. Signal
// still works there and delivers locally: signals carry no id, so a
// backplane spreads them by calling Signal on every replica's bus.
var errMirror = errors.New("eventbus: this bus is fed by a backplane; publish through the backplane")

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

// appendEntry is Publish for an id the backplane assigned.
func (b *EventBus) appendEntry(e seam.Entry) error {
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
		return nil // already delivered: the reader re-read after a reconnect
	}
	if e.ID > b.nextID {
		// The log lost entries this bus never saw (trimmed while the reader
		// was away): every subscriber missed them, and must be told.
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
	b.stats.ringLen.Store(int64(b.ring.Len()))
	b.stats.ringBytes.Store(int64(b.ring.Bytes()))
	b.fanOutLocked(f, e.ID, &out)
	b.mu.Unlock()
	b.finish(&out)
	return nil
}

// replayRemote answers a resume from the backplane's log, outside the lock,
// for a subscription registered (and held) when the bus's next id was
// upto+1. The replay goes ahead of the live frames queued meanwhile, so the
// hand-over has no gap and no duplicate.
func (b *EventBus) replayRemote(ctx context.Context, s *Subscription, opts SubscribeOptions, h seam.History, upto uint64) {
	var front []*frame
	push := func(f *frame) { front = append(front, f) }
	after := opts.LastEventID
	if epochMismatch(opts, b.epoch) || after > upto {
		after = 0 // an epoch reset replays the whole log
	}
	entries, first, err := h(ctx, after, upto)
	frames := make([]Frame, 0, len(entries))
	for _, e := range entries {
		f, ferr := entryFrame(e)
		if ferr != nil || (len(frames) > 0 && e.ID != frames[len(frames)-1].id+1) {
			err = errors.Join(err, ferr, fmt.Errorf("eventbus: history not contiguous at id %d", e.ID))
			break
		}
		frames = append(frames, f)
	}
	if err != nil {
		// What the client missed cannot be read now: say so, and carry on
		// live from upto+1.
		now := b.now()
		push(resyncFrame(ReasonRingEvicted, "history_unavailable", opts.LastEventID, upto+1, b.epoch, now).ref())
		b.stats.resync(ReasonRingEvicted)
		push(replayCompleteFrame(0, 0, b.epoch, now).ref())
		b.emit(Diagnostic{DiagHistoryUnavailable, "eventbus: resume history unavailable",
			[]slog.Attr{slog.String("error", err.Error()), slog.Uint64("lastEventId", opts.LastEventID)}})
	} else {
		b.replay(s, opts, frameSlice(frames), first, upto+1, push)
	}
	// unhold moves the queue's head back, which must not overlap a live
	// push: the bus lock keeps publishers out meanwhile.
	now := b.now()
	b.mu.Lock()
	s.q.unhold(front)
	if s.behind {
		// Its consumer could take nothing while held: its stall bound
		// starts now.
		s.progress.Store(now)
	}
	b.mu.Unlock()
}
