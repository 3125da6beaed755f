package eventbus

import (
	"fmt"
	"log/slog"
)

// checkWarningLocked runs SPEC 3.2's warning check after an accepted live
// push with the counts c after it. It force-pushes the warning under the
// lock, so the warning sits right after its triggering event even with
// concurrent publishers, and returns the threshold it crossed ("" for
// none) for the diagnostic, which finish builds after the lock. Warnings
// with the same numbers in one fan-out share one frame (cache): when one
// publish takes 200 subscribers that never read past the threshold at
// once, it builds one warning, not 200, under the lock (issue 22).
func (s *Subscription) checkWarningLocked(c queueCounts, id uint64, cache *warningCache) string {
	lc, lb := float64(c.liveCount), float64(c.liveBytes)
	if s.warned && lc <= s.resetFrames && lb <= s.resetBytes {
		s.warned = false
	}
	if s.warned {
		return ""
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
		return ""
	}
	s.warned = true
	s.q.forcePushMarker(cache.frame(c, id, threshold, s.bus))
	s.bus.stats.warnings.Add(1)
	return threshold
}

// warningCache is the last warning frame a fan-out built, for the next
// warning with the same numbers. The zero value is empty.
type warningCache struct {
	f         *frame
	c         queueCounts
	id        uint64
	threshold string
}

// frame returns the warning frame for c, id and threshold, built with b's
// clock unless the last one had the same numbers. Frames are immutable, so
// queues share them.
func (w *warningCache) frame(c queueCounts, id uint64, threshold string, b *EventBus) *frame {
	if w.f == nil || w.c != c || w.id != id || w.threshold != threshold {
		*w = warningCache{warningFrame(c, id, threshold, b.now()).ref(), c, id, threshold}
	}
	return w.f
}

// slowClientDiagnostic is the diagnostic of a warning that the fan-out
// force-pushed (checkWarningLocked), built after the lock.
func slowClientDiagnostic(c queueCounts, id uint64, threshold string) Diagnostic {
	return Diagnostic{DiagSlowClient, "eventbus: slow client", []slog.Attr{
		slog.String("threshold", threshold), slog.Uint64("lastEventId", id),
		slog.Int("queueSize", c.liveCount), slog.Int("maxQueued", c.maxQueued),
		slog.Int("queuedBytes", c.liveBytes), slog.Int("maxQueuedBytes", c.maxBytes),
	}}
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

// evict ends s after a publish unregistered it under the lock (see
// evictWith), with its own client_evicted frame, and returns its
// diagnostic.
func (s *Subscription) evict(ev eviction) Diagnostic {
	s.evictWith(ev, evictedFrame(ev.reason, ev.id, ev.counts, ev.bytes, s.bus.now()).ref())
	return ev.diagnostic()
}

// evictWith ends s after a publish unregistered it under the lock: term,
// its client_evicted frame, goes behind what is queued, and the queue
// closes with drain. Evictions with the same numbers may share term (see
// EventBus.finish).
func (s *Subscription) evictWith(ev eviction, term *frame) {
	s.end(evictedError(ev.reason))
	s.q.forcePush(term)
	s.q.close(true)
	s.release()
	s.bus.stats.eviction(ev.reason)
}

// sameTerminal reports whether ev's client_evicted frame says what o's
// does (its clock stamp aside).
func (ev *eviction) sameTerminal(o *eviction) bool {
	return ev.reason == o.reason && ev.id == o.id && ev.counts == o.counts && ev.bytes == o.bytes
}

// diagnostic is ev's DiagEvicted diagnostic.
func (ev *eviction) diagnostic() Diagnostic {
	return Diagnostic{DiagEvicted, "eventbus: subscriber evicted", []slog.Attr{
		slog.String("reason", ev.reason), slog.Uint64("droppedAfter", ev.id),
		slog.Int("queueSize", ev.counts.liveCount), slog.Int("maxQueued", ev.counts.maxQueued),
		slog.Int("queuedBytes", ev.counts.liveBytes), slog.Int("maxQueuedBytes", ev.counts.maxBytes),
	}}
}

// evictedErrors are what Err returns after an eviction, one per reason:
// they say the same for every subscriber, so an eviction allocates none.
var evictedErrors = func() map[string]error {
	m := make(map[string]error)
	for _, r := range []string{ReasonQueueOverflow, ReasonQueueBytesOverflow, ReasonRepeatedOverflow, ReasonCatchUpStalled, ReasonMemoryBudget} {
		m[r] = fmt.Errorf("%w: %s", ErrEvicted, r)
	}
	return m
}()

// evictedError returns the error of an eviction for reason.
func evictedError(reason string) error {
	if err, ok := evictedErrors[reason]; ok {
		return err
	}
	return fmt.Errorf("%w: %s", ErrEvicted, reason)
}
