package eventbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/ssebus/eventbus/internal/seam"
)

// replaySource is a contiguous run of published frames: the ring, or
// entries a backplane read from its log.
type replaySource interface {
	Len() int
	at(i int) *frame
}

type frameSlice []Frame

// Len is the number of frames held.
func (f frameSlice) Len() int        { return len(f) }
func (f frameSlice) at(i int) *frame { return f[i].frame }

// ringCoversLocked reports whether the ring alone can answer a resume:
// same epoch, a cursor in this epoch, and nothing after it evicted.
func (b *EventBus) ringCoversLocked(opts SubscribeOptions) bool {
	n := opts.LastEventID
	if epochMismatch(opts, b.epoch) || n >= b.nextID {
		return false
	}
	return n == b.nextID-1 || b.ring.Len() > 0 && b.ring.firstID() <= n+1
}

func epochMismatch(opts SubscribeOptions, epoch string) bool {
	return opts.Epoch != "" && len(opts.Epoch) <= 64 && opts.Epoch != epoch
}

// replay produces SPEC 4.1's replay for s through push: resync frames, the
// events of src after the cursor that pass its filter, within the replay
// budget, and replay_complete. first is the oldest id the log holds (0 when
// none) and nextID the id the next event will get; the resync rules go by
// ids, whatever the filter. Every frame is forced: replay never counts
// toward the live caps. For the ring it runs under the bus lock, so no live
// event slips between the replay and the live stream.
func (b *EventBus) replay(s *Subscription, opts SubscribeOptions, src replaySource, first, nextID uint64, push func(*frame)) {
	n := opts.LastEventID
	now := b.now()
	earliest := first
	if first == 0 {
		earliest = nextID
	}
	mismatch := epochMismatch(opts, b.epoch)

	start := 0 // position in src of the first frame to replay
	switch {
	case mismatch || n >= nextID:
		detail := ""
		if mismatch {
			detail = "epoch_mismatch"
		}
		push(resyncFrame(ReasonEpochReset, detail, n, earliest, b.epoch, now).ref())
		b.stats.resync(ReasonEpochReset)
	case first > n+1 || first == 0 && n+1 < nextID:
		// The ring lost events after the cursor: to its bounds, to a
		// Hub's budget, to age (it may then hold nothing at all).
		push(resyncFrame(ReasonRingEvicted, "", n, earliest, b.epoch, now).ref())
		b.stats.resync(ReasonRingEvicted)
	default:
		start = src.Len()
		if src.Len() > 0 {
			if i := n + 1 - src.at(0).id; n+1 >= src.at(0).id && i < uint64(src.Len()) {
				start = int(i)
			}
		}
	}

	budget := b.opts.ReplayBudgetBytes
	replayed, spent := 0, 0
	var last uint64
	for i := start; i < src.Len(); i++ {
		f := src.at(i)
		if !s.filter.match(f.typ) {
			continue
		}
		if replayed > 0 && spent+f.size() > budget {
			push(resyncFrame(ReasonReplayBudgetExceeded, "", last, f.id, b.epoch, now).ref())
			b.stats.resync(ReasonReplayBudgetExceeded)
			for ; i < src.Len(); i++ {
				if s.filter.match(src.at(i).typ) {
					b.stats.dropBudget.Add(1)
				}
			}
			break
		}
		push(f)
		spent += f.size()
		replayed++
		last = f.id
	}
	push(replayCompleteFrame(replayed, last, b.epoch, now).ref())
}

// awaitFeed waits, at most the feed's LagTimeout, until the bus has been
// fed the cursor of a resume in its own epoch that it has not reached yet,
// when the log says it holds that id: the client read it through a replica
// whose reader is ahead of this one's, and must not get an epoch_reset
// that it would not get a moment later. A cursor the log does not hold (of
// an older epoch, or a Head that fails) is left to the replay rules.
func (b *EventBus) awaitFeed(ctx context.Context, opts SubscribeOptions) {
	f := b.fed()
	n := opts.LastEventID
	if f == nil || f.log == nil || !opts.Resume || n <= b.lastID.Load() || epochMismatch(opts, b.epoch) {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, f.lag)
	defer cancel()
	epoch, last, err := f.log.Head(ctx)
	if err != nil || epoch != b.epoch || last < n {
		return
	}
	for b.lastID.Load() < n && !b.closedOrZero() {
		ch := f.next()
		if b.lastID.Load() >= n || b.closedOrZero() {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

// replayRemote answers a resume from the feed's log, outside the lock, for
// a subscription registered (and held) when the bus's next id was upto+1.
// The replay goes ahead of the live frames queued meanwhile, so the
// hand-over has no gap and no duplicate.
func (b *EventBus) replayRemote(ctx context.Context, s *Subscription, opts SubscribeOptions, upto uint64) {
	var front []*frame
	push := func(f *frame) { front = append(front, f) }
	after := opts.LastEventID
	if epochMismatch(opts, b.epoch) || after > upto {
		after = 0 // an epoch reset replays the whole log
	}
	req := seam.HistoryRequest{After: after, Upto: upto}
	if len(opts.Types) == 0 {
		req.MaxBytes = b.opts.ReplayBudgetBytes
	}
	var entries []seam.Entry
	var first uint64
	var err error
	if upto > after {
		entries, first, err = b.fed().log.ReadHistory(ctx, req)
	}
	frames := make([]Frame, 0, len(entries))
	for _, e := range entries {
		f, ferr := entryFrame(e)
		if ferr == nil && len(frames) > 0 && e.ID != frames[len(frames)-1].id+1 {
			ferr = fmt.Errorf("eventbus: history not contiguous at id %d", e.ID)
		}
		if ferr == nil && (e.ID <= after || e.ID > upto) {
			ferr = fmt.Errorf("eventbus: history entry %d outside (%d, %d]", e.ID, after, upto)
		}
		if ferr != nil {
			err = errors.Join(err, ferr)
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
