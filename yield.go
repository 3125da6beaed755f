package eventbus

import "runtime"

// maxUrgentYields bounds the yields of one publish for a consumer past 90%.
const maxUrgentYields = 16

// yieldProcessor is runtime.Gosched; tests count the yields through it.
var yieldProcessor = runtime.Gosched

// nearlyFull reports whether the live counts c are past 90% of either cap.
func nearlyFull(c queueCounts) bool {
	return c.liveCount*10 >= c.maxQueued*9 || c.liveBytes*10 >= c.maxBytes*9
}

// yieldFor reports whether a publish that left s with the live counts c
// should yield the processor (see EventBus.finish): s is past the warning
// threshold of either cap, and either its consumer has looked for frames
// at least once, or this is the first yield for it. The yield is for
// consumers that run but were not scheduled in time, a goroutine started
// for a new subscription included: one yield lets it run. A subscription
// that nobody reads from at all (never iterated, or stuck before its first
// read) gets no more than that one: yielding for it on every publish until
// its eviction would make its peers' publish latency depend on it
// (BenchmarkPublishLatency).
func (s *Subscription) yieldFor(c queueCounts) bool {
	frames, bytes := s.pastWarning(c)
	if !frames && !bytes {
		return false
	}
	if !s.q.looked.Load() {
		if s.yieldedUnread {
			return false
		}
		s.yieldedUnread = true
	}
	return true
}
