package eventbus

import (
	"fmt"
	"log/slog"
)

// checkWarningLocked runs SPEC 6's warning check after an accepted live
// push with the counts c after it. It builds and force-pushes the warning
// under the lock, so the warning sits right after its triggering event even
// with concurrent publishers; the diagnostic is returned for later.
func (s *Subscription) checkWarningLocked(c queueCounts, id uint64) (Diagnostic, bool) {
	lc, lb := float64(c.liveCount), float64(c.liveBytes)
	if s.warned && lc <= s.resetFrames && lb <= s.resetBytes {
		s.warned = false
	}
	if s.warned {
		return Diagnostic{}, false
	}
	frames, bytes := s.pastWarning(c)
	var threshold string
	switch {
	case frames && bytes:
		threshold = "frames_and_bytes"
	case frames:
		threshold = "frames"
	case bytes:
		threshold = "bytes"
	default:
		return Diagnostic{}, false
	}
	s.warned = true
	s.q.forcePushMarker(warningFrame(c, id, threshold, s.bus.now()).ref())
	s.bus.stats.warnings.Add(1)
	return Diagnostic{DiagSlowClient, "eventbus: slow client", []slog.Attr{
		slog.String("threshold", threshold), slog.Uint64("lastEventId", id),
		slog.Int("queueSize", c.liveCount), slog.Int("maxQueued", c.maxQueued),
		slog.Int("queuedBytes", c.liveBytes), slog.Int("maxQueuedBytes", c.maxBytes),
	}}, true
}

// overflowResyncLocked applies OverflowResync after f was rejected: unless
// this is the third overflow within OverflowWindow (then it reports false
// and the caller evicts), the queued live frames are dropped, a
// state_resync_required frame is queued, then f. The subscriber stays.
func (s *Subscription) overflowResyncLocked(f *frame, res pushResult, lastID uint64) (Diagnostic, bool) {
	b := s.bus
	now := b.now()
	if s.noverflows == 2 && now-s.overflows[0] < OverflowWindow.Milliseconds() {
		return Diagnostic{}, false
	}
	s.overflows[0], s.overflows[1] = s.overflows[1], now
	s.noverflows = min(s.noverflows+1, 2)
	reason := res.reason()
	// The client missed everything after the last event it dequeued; what
	// it can get again starts at the rejected event (for a signal, which has
	// no id, at the next id).
	earliest := f.id
	if f.kind != kindEvent {
		earliest = lastID + 1
	}
	dropped, lastDelivered := s.q.resync(f, func(lastDelivered uint64) *frame {
		return resyncFrame(reason, "", lastDelivered, earliest, b.epoch, now).ref()
	})
	b.stats.dropOverflow.Add(uint64(dropped))
	b.stats.resync(reason)
	// Everything live is gone: the episode is over, warn again next time.
	s.warned = false
	return Diagnostic{DiagOverflowResync, "eventbus: slow client resynced", []slog.Attr{
		slog.String("reason", reason), slog.Uint64("lastDeliveredId", lastDelivered),
		slog.Uint64("earliestAvailableId", earliest), slog.Int("dropped", dropped),
	}}, true
}

// pastWarning reports whether the live counts c reach the warning
// threshold of the frame cap and of the byte cap.
func (s *Subscription) pastWarning(c queueCounts) (frames, bytes bool) {
	return float64(c.liveCount) >= s.warnFrames, float64(c.liveBytes) >= s.warnBytes
}

// anyPastWarning reports whether the live counts c reach the warning
// threshold of either cap.
func (s *Subscription) anyPastWarning(c queueCounts) bool {
	frames, bytes := s.pastWarning(c)
	return frames || bytes
}

// evict ends s after a publish unregistered it under the lock: the
// terminal frame goes behind what is queued, and the queue closes with
// drain.
func (s *Subscription) evict(ev eviction) Diagnostic {
	b := s.bus
	s.end(fmt.Errorf("%w: %s", ErrEvicted, ev.reason))
	s.q.forcePush(evictedFrame(ev.reason, ev.id, ev.counts, ev.bytes, b.now()).ref())
	s.q.close(true)
	s.release()
	b.stats.eviction(ev.reason)
	return Diagnostic{DiagEvicted, "eventbus: subscriber evicted", []slog.Attr{
		slog.String("reason", ev.reason), slog.Uint64("droppedAfter", ev.id),
		slog.Int("queueSize", ev.counts.liveCount), slog.Int("maxQueued", ev.counts.maxQueued),
		slog.Int("queuedBytes", ev.counts.liveBytes), slog.Int("maxQueuedBytes", ev.counts.maxBytes),
	}}
}
