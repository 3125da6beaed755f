package eventbus

import (
	"runtime"
	"time"
)

// The publisher's yield policy. A subscriber past 75% of a cap is often not
// slow at all: its goroutine was woken but not scheduled yet, because the
// publisher holds the processor (GOMAXPROCS is small, the publisher runs a
// tight loop). So a publish that leaves such a subscriber behind it yields
// the processor, after the bus lock, so that the consumer can run before it
// is evicted: once, and past 90% until the first such consumer is back
// under 90%, maxUrgentYields more yields went by, or the yields of this
// publish have lasted maxYieldTime. A fixed 4 yields there still lost a
// healthy consumer in about one tight stall run in sixteen once Publish got
// faster (docs/bench/NOTES.md, item 16). This never waits for anyone: with
// nothing else to run Gosched returns at once, and a consumer that runs
// drains its whole queue. But a yield lasts as long as the goroutines that
// run in its place: with 200 consumers that read once and then blocked, 1
// MB events and one CPU-bound goroutine beside them, the yields took 1.1 s
// of 3000 publishes, hence the time bound (issue 22). A subscription that
// nobody has ever read from costs one yield at most (yieldFor), never the
// wait past 90%: its consumer has not run once, so more yields do not make
// it drain (an event of half the byte cap takes it from below 75% to past
// 90% in one publish, which cost 17 yields per reconnect). Under
// OverflowCatchUp an overflow loses nothing, so there is nothing to yield
// for.
//
// The fan-out notes what it saw in a yieldPlan under the lock (note), and
// the publish runs the plan after it (run). The consumer's own yield, when
// AppendReady finds nothing, is the consumer's (Subscription.take).

// maxUrgentYields bounds the yields of one publish for a consumer past 90%.
const maxUrgentYields = 16

// maxYieldTime bounds how long the yields of one publish go on for a
// consumer past 90%: no yield starts after it (the one under way when it
// runs out ends when the scheduler gives the processor back). In the tight
// loops the yields are for, one yield lets the consumers this publish woke
// run and takes about 16 µs (docs/bench/NOTES.md), so all 17 fit well
// within it.
const maxYieldTime = 500 * time.Microsecond

// yieldProcessor is runtime.Gosched; tests count the yields through it.
var yieldProcessor = runtime.Gosched

// consumerYield is runtime.Gosched, the consumer's yield before it waits
// (Subscription.take); tests count those yields through it.
var consumerYield = runtime.Gosched

// yieldPlan is what a publish decided, under the lock, about yielding
// after it. The zero value yields nothing.
type yieldPlan struct {
	// behind is set when a subscriber's queue is past the warning
	// threshold after this publish and its yield budget is not spent.
	behind bool
	// urgent is the first such queue that is past 90% of a cap, and
	// target the live frames and bytes its consumer must have popped in
	// all for it to be back under 90% of both; nil if none.
	urgent *boundedAsyncQueue
	target [2]int64
}

// note records that a push accepted for s left its live counts at c, past
// the warning threshold of a cap (the fan-out's slow path).
func (p *yieldPlan) note(s *Subscription, c queueCounts) {
	if s.policy == OverflowCatchUp || !s.yieldFor(c) {
		return
	}
	p.behind = true
	if p.urgent == nil && nearlyFull(c) && s.q.hasLooked() {
		p.urgent = &s.q
		live, bytes := s.q.popped()
		p.target = [2]int64{
			live + int64(c.liveCount-c.maxQueued*9/10) + 1,
			bytes + int64(c.liveBytes-c.maxBytes/10*9) + 1,
		}
	}
}

// run yields as the plan says; it is called after the bus lock is
// released, never under it.
func (p *yieldPlan) run() {
	if !p.behind {
		return
	}
	q := p.urgent
	if q == nil {
		yieldProcessor()
		return
	}
	start := time.Now()
	yieldProcessor()
	for range maxUrgentYields {
		if live, bytes := q.popped(); live >= p.target[0] && bytes >= p.target[1] || time.Since(start) >= maxYieldTime {
			break
		}
		yieldProcessor()
	}
}

// nearlyFull reports whether the live counts c are past 90% of either cap.
func nearlyFull(c queueCounts) bool {
	return c.liveCount*10 >= c.maxQueued*9 || c.liveBytes*10 >= c.maxBytes*9
}

// yieldFor reports whether a publish that left s with the live counts c
// should yield the processor: s is past the warning threshold of either
// cap, and either its consumer has looked for frames at least once, or
// this is the first yield for it (then note does not wait past 90%). The
// yield is for consumers that run but were not scheduled in time, a
// goroutine started for a new subscription included: one yield lets it
// run. A subscription that nobody reads from
// at all (never iterated, or stuck before its first read) gets no more
// than that one: yielding for it on every publish until its eviction would
// make its peers' publish latency depend on it (BenchmarkPublishLatency).
// It runs under the bus lock (s.yieldedUnread is guarded by it).
func (s *Subscription) yieldFor(c queueCounts) bool {
	frames, bytes := s.pastWarning(c)
	if !frames && !bytes {
		return false
	}
	if !s.q.hasLooked() {
		if s.yieldedUnread {
			return false
		}
		s.yieldedUnread = true
	}
	return true
}
