package main

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// sink checks what one subscriber receives: every published event exactly once,
// in order. Sequence numbers are 1..total. A sink is written by exactly one
// goroutine at a time (the subscriber's, or the library's delivery goroutine
// for callback libraries); the harness reads its plain fields only after the
// adapter's stop has returned (which waits for the subscriber goroutines), and
// reads progress (atomic) while the run is live.
type sink struct {
	total uint64

	next     uint64 // next expected sequence number
	got      uint64 // deliveries seen (including duplicates)
	dup      uint64 // deliveries with seq < next (duplicate or reordered), or after completion
	missing  uint64 // sequence numbers never delivered
	warnings uint64 // library-specific non-fatal notices (eventbus slow_client_warning)
	complete bool   // saw seq == total with next > total
	ended    bool
	reason   string // why the stream ended before completion ("evicted", "closed", ...)

	progress atomic.Uint64 // got, published every progMask+1 deliveries and at completion/end
	progMask uint64        // 63, or 0 where exact live counts matter (stall scenario)
	doneOnce sync.Once
	group    *sinkGroup

	stalled bool          // this subscriber must not read until release is closed
	release chan struct{} // shared by all sinks of a run; closed by the harness

	pacing *pacing // the paced scenario's latency and pauses; nil elsewhere
}

// sinkGroup closes all when every sink is complete or ended.
type sinkGroup struct {
	left atomic.Int64
	all  chan struct{}
}

func newSinks(n int, events int, stalledIdx int) ([]*sink, *sinkGroup) {
	g := &sinkGroup{all: make(chan struct{})}
	g.left.Store(int64(n))
	release := make(chan struct{})
	sinks := make([]*sink, n)
	for i := range sinks {
		sinks[i] = &sink{total: uint64(events), next: 1, group: g, release: release, stalled: i == stalledIdx, progMask: 63}
	}
	return sinks, g
}

func (s *sink) finish() {
	s.doneOnce.Do(func() {
		s.progress.Store(s.got)
		if s.group.left.Add(-1) == 0 {
			close(s.group.all)
		}
	})
}

// see records one delivered event.
func (s *sink) see(seq uint64) {
	s.got++
	switch {
	case s.complete || s.ended:
		s.dup++
	case seq == s.next:
		s.next++
	case seq > s.next:
		s.missing += seq - s.next
		s.next = seq + 1
	default:
		s.dup++
	}
	if s.got&s.progMask == 0 {
		s.progress.Store(s.got)
	}
	if s.pacing != nil {
		s.pacing.observe(seq)
	}
	if !s.complete && !s.ended && s.next > s.total {
		s.complete = true
		s.finish()
	}
}

// end records that the library ended this subscriber's stream.
func (s *sink) end(reason string) {
	if s.complete || s.ended {
		return
	}
	s.ended = true
	s.reason = reason
	if s.next <= s.total {
		s.missing += s.total - (s.next - 1)
	}
	s.finish()
}

// waitRelease blocks a stalled subscriber until the harness releases it.
func (s *sink) waitRelease() {
	if s.stalled {
		<-s.release
	}
}

// runSink starts one subscriber's loop into s: a goroutine, counted by wg
// until it ends and by running until it runs, that waits until the harness
// releases a stalled s, then runs drain.
func runSink(wg, running *sync.WaitGroup, s *sink, drain func()) {
	wg.Add(1)
	running.Add(1)
	go func() {
		defer wg.Done()
		running.Done()
		s.waitRelease()
		drain()
	}()
}

// fanout is one library wired for the workload: one publisher, len(sinks)
// subscribers, each delivering into its sink.
type fanout interface {
	// start registers one subscriber per sink and returns once every one of
	// them is registered (an event published afterwards reaches all of them)
	// and every subscriber goroutine it starts is running: the workload is
	// subscribers that drain, and a tight publisher on 2 cores can otherwise
	// fill a goroutine that was never scheduled yet (docs/bench/NOTES.md,
	// item 16).
	start(sinks []*sink) error
	// publish publishes event seq (1-based). It may block if the library blocks.
	publish(seq uint64) error
	// stop tears everything down. The harness has already released stalled
	// subscribers and stopped the publisher. stop must not return before every
	// subscriber goroutine that touches a sink has returned.
	stop()
}

type library struct {
	name string
	new  func(cfg config) fanout
}

type config struct {
	queue int // per-subscriber buffering where the library lets us choose it
	ring  int // eventbus's RingSize (0: its default, 8000)
}

type status string

const (
	statusOK      status = "ok"
	statusLossy   status = "lossy"
	statusBlocked status = "blocked"
	statusError   status = "error"
)

type result struct {
	lib    string
	subs   int
	events int
	status status
	detail string

	wall           time.Duration
	nsPerDelivery  float64
	allocsPerEvent float64

	published uint64
	delivered uint64
	missing   uint64
	dup       uint64
	ended     int // subscribers whose stream ended early (evicted, closed)
	evicted   int // of those, ended by an eviction
	warnings  uint64
}

type runOpts struct {
	window  int           // >0: the publisher stays at most this many events ahead of the slowest subscriber
	timeout time.Duration // hard deadline for one run
	stall   time.Duration // no progress at all for this long = blocked
	stopMax time.Duration // how long stop may take before we call it hung
}

// publisher runs f.publish(1..events) in its own goroutine, stopping early when
// asked. published holds the number of publish calls that have returned.
type publisher struct {
	published atomic.Uint64
	quit      atomic.Bool
	done      chan error
}

func startPublisher(f fanout, events int, sinks []*sink, window int) *publisher {
	p := &publisher{done: make(chan error, 1)}
	go func() {
		for i := uint64(1); i <= uint64(events); i++ {
			if p.quit.Load() {
				p.done <- nil
				return
			}
			if window > 0 && i&31 == 0 {
				// Closed loop: wait (yielding) while the slowest subscriber
				// is more than window events behind. Progress is published
				// every 64 deliveries, so the window is approximate by that.
				for spins := 0; i-1 > minProgress(sinks)+uint64(window) && !p.quit.Load(); spins++ {
					if spins < 8 {
						runtime.Gosched()
					} else {
						// Do not hog a P that a library's own goroutines need.
						time.Sleep(20 * time.Microsecond)
					}
				}
			}
			if err := f.publish(i); err != nil {
				p.done <- fmt.Errorf("publish %d: %w", i, err)
				return
			}
			p.published.Store(i)
		}
		p.done <- nil
	}()
	return p
}

func minProgress(sinks []*sink) uint64 {
	m := ^uint64(0)
	for _, s := range sinks {
		if s.stalled {
			continue
		}
		if g := s.progress.Load(); g < m {
			m = g
		}
	}
	return m
}

func sumProgress(sinks []*sink) uint64 {
	var n uint64
	for _, s := range sinks {
		n += s.progress.Load()
	}
	return n
}

// runFanout runs one measured fan-out: subs subscribers, events events.
func runFanout(lib library, cfg config, subs, events int, o runOpts) result {
	r := result{lib: lib.name, subs: subs, events: events}
	f := lib.new(cfg)
	sinks, group := newSinks(subs, events, -1)
	runtime.GC()
	if err := f.start(sinks); err != nil {
		r.status, r.detail = statusError, err.Error()
		close(sinks[0].release)
		stopWithin(f, o.stopMax)
		return r
	}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	t0 := time.Now()
	p := startPublisher(f, events, sinks, o.window)

	var pubErr error
	pubDone := false
	timedOut := false
	deadline := time.NewTimer(o.timeout)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	lastProgress, lastChange := uint64(0), time.Now()
wait:
	for {
		select {
		case <-group.all:
			break wait
		case err := <-p.done:
			pubDone, pubErr = true, err
			if err != nil {
				break wait
			}
		case <-deadline.C:
			timedOut = true
			break wait
		case now := <-tick.C:
			pr := p.published.Load() + sumProgress(sinks)
			if pr != lastProgress {
				lastProgress, lastChange = pr, now
			} else if now.Sub(lastChange) >= o.stall {
				timedOut = true
				break wait
			}
		}
	}
	r.wall = time.Since(t0)
	runtime.ReadMemStats(&ms1)

	// Stop the publisher and let everything go.
	p.quit.Store(true)
	close(sinks[0].release)
	if !pubDone {
		select {
		case pubErr = <-p.done:
		case <-time.After(o.stopMax):
		}
	}
	r.published = p.published.Load()
	hung := !stopWithin(f, o.stopMax)

	r.nsPerDelivery = float64(r.wall.Nanoseconds()) / float64(events*subs)
	r.allocsPerEvent = float64(ms1.Mallocs-ms0.Mallocs) / float64(events)
	if hung {
		// Sinks may still be written to: read only the atomic progress.
		r.delivered = sumProgress(sinks)
	} else {
		for _, s := range sinks {
			r.delivered += s.got
			r.missing += s.missing
			r.dup += s.dup
			r.warnings += s.warnings
			if s.ended {
				r.ended++
				if s.reason == "evicted" {
					r.evicted++
				}
			}
		}
	}
	switch {
	case pubErr != nil:
		r.status, r.detail = statusError, pubErr.Error()
	case timedOut && r.published < uint64(events):
		r.status = statusBlocked
		r.detail = fmt.Sprintf("publisher stuck after %d/%d events", r.published, events)
	case timedOut:
		r.status = statusLossy
		r.detail = fmt.Sprintf("published all, subscribers incomplete at deadline; missing %d, dup %d", r.missing, r.dup)
	case r.missing > 0 || r.dup > 0 || r.ended > 0:
		r.status = statusLossy
		r.detail = fmt.Sprintf("missing %d, dup/reordered %d, %d subscribers ended early", r.missing, r.dup, r.ended)
	default:
		r.status = statusOK
	}
	if hung {
		r.detail += " (teardown hung)"
	}
	return r
}

// stopWithin calls f.stop and reports whether it returned within d.
func stopWithin(f fanout, d time.Duration) bool {
	done := make(chan struct{})
	go func() { f.stop(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// stallResult is the outcome of the stalled-subscriber scenario.
type stallResult struct {
	lib             string
	subs, events    int
	publisherBlock  bool
	publishedBefore uint64 // events whose publish returned before the publisher blocked (or all)
	healthyAll      int    // healthy subscribers that received every published event exactly once
	healthyTotal    int
	healthyMin      uint64 // fewest in-order events any healthy subscriber received
	healthyLossy    int    // healthy subscribers with gaps/dups/early end
	stalledEvicted  bool
	stalledGot      uint64 // events the stalled subscriber received once released
	stalledReason   string
	hung            bool
	detail          string
}

// runStall: subs subscribers, the first of which never reads until the end.
func runStall(lib library, cfg config, subs, events int, window time.Duration, stopMax time.Duration) stallResult {
	r := stallResult{lib: lib.name, subs: subs, events: events, healthyTotal: subs - 1}
	f := lib.new(cfg)
	sinks, _ := newSinks(subs, events, 0)
	for _, s := range sinks {
		s.progMask = 0 // exact counts: we report how far each one got
	}
	if err := f.start(sinks); err != nil {
		r.detail = "start: " + err.Error()
		close(sinks[0].release)
		stopWithin(f, stopMax)
		return r
	}
	p := startPublisher(f, events, nil, 0)
	healthy := sinks[1:]

	// Phase 1: until the publisher is done and the healthy subscribers are
	// complete, or nothing moves for window.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	pubDone := false
	var pubErr error
	last, lastChange := uint64(0), time.Now()
phase1:
	for {
		select {
		case err := <-p.done:
			pubDone, pubErr = true, err
		case now := <-tick.C:
			pr := p.published.Load() + sumProgress(healthy)
			if pubDone && allComplete(healthy) {
				break phase1
			}
			if pr != last {
				last, lastChange = pr, now
			} else if now.Sub(lastChange) >= window {
				break phase1
			}
		}
	}
	r.publishedBefore = p.published.Load()
	r.publisherBlock = !pubDone && r.publishedBefore < uint64(events)
	if pubErr != nil {
		r.detail = pubErr.Error()
	}
	// Snapshot the healthy subscribers now (atomic progress), before the
	// release lets a blocked publisher continue.
	r.healthyMin = ^uint64(0)
	snap := make([]uint64, len(healthy))
	for i, s := range healthy {
		snap[i] = s.progress.Load()
		if snap[i] < r.healthyMin {
			r.healthyMin = snap[i]
		}
	}
	// Phase 2: stop the publisher, release the stalled one and let it drain.
	p.quit.Store(true)
	close(sinks[0].release)
	if !pubDone {
		select {
		case <-p.done:
		case <-time.After(stopMax):
		}
	}
	// Give the stalled subscriber a moment to drain what the library kept for it.
	st := sinks[0]
	lastGot, lastChange := st.progress.Load(), time.Now()
	for time.Since(lastChange) < 300*time.Millisecond {
		time.Sleep(20 * time.Millisecond)
		if g := st.progress.Load(); g != lastGot {
			lastGot, lastChange = g, time.Now()
		}
	}
	r.hung = !stopWithin(f, stopMax)
	if r.hung {
		r.detail += " teardown hung"
		return r
	}
	for i, s := range healthy {
		// A healthy subscriber is fine if, when phase 1 ended, it had every
		// event the publisher had published, and overall it saw no gap, no
		// duplicate and was not evicted.
		if snap[i] >= r.publishedBefore && s.dup == 0 && s.gapMissing() == 0 && (!s.ended || s.reason == "closed") {
			r.healthyAll++
		} else {
			r.healthyLossy++
		}
	}
	r.stalledGot = st.got
	r.stalledReason = st.reason
	r.stalledEvicted = st.ended && st.reason == "evicted"
	return r
}

func allComplete(ss []*sink) bool {
	for _, s := range ss {
		if s.progress.Load() < s.total {
			return false
		}
	}
	return true
}

// gapMissing is the number of skipped sequence numbers seen as gaps (not the
// tail that was never delivered because the stream ended).
func (s *sink) gapMissing() uint64 {
	if s.ended && s.next <= s.total {
		return s.missing - (s.total - (s.next - 1))
	}
	return s.missing
}
