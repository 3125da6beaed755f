package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/ssebus/eventbus/internal/benchkit"
)

// The paced scenario (issue 13): the publisher holds a rate in events/s
// instead of publishing as fast as Publish returns, paced by a spin-wait
// (each event at its time; the publisher never leaves its processor, as a
// busy daemon does), by sleeping between bursts (every millisecond's events
// at once, then a sleep), by sleeping until each event is due, or by
// yielding (runtime.Gosched) until then (issue 26). Subscribers may pause a few
// milliseconds now and then, as the scheduler and the garbage collector
// make them. Every delivery is checked; losses (missing, duplicated,
// streams ended early) are reported apart from speed; delivery latency is
// measured from just before publish to the subscriber, on every 8th event.
// A run sustains its rate when it loses nothing and the publisher achieved
// at least 95% of the rate (a blocking bus slows its publisher instead of
// losing).

type pacedOpts struct {
	rate     int
	pacer    benchkit.Pacer
	pause    bool
	duration time.Duration // events = rate x duration (at least 2000)
	settle   time.Duration // how long subscribers may take to finish after the last publish
}

// pacing is a sink's share of the paced scenario: publish times, its
// latency histogram, and its pause schedule.
type pacing struct {
	sent    []atomic.Int64 // ns since base, by seq
	base    time.Time
	lat     benchkit.Hist
	pause   bool
	rng     *rand.Rand
	pauseAt time.Duration
}

// observe records the latency of seq and pauses when it is time to.
func (p *pacing) observe(seq uint64) {
	if seq&7 == 0 && seq < uint64(len(p.sent)) {
		p.lat.Add(int64(time.Since(p.base)) - p.sent[seq].Load())
	}
	if p.pause && seq&63 == 0 {
		if now := time.Since(p.base); now >= p.pauseAt {
			time.Sleep(time.Duration(2+p.rng.IntN(4)) * time.Millisecond)
			p.pauseAt = time.Since(p.base) + time.Duration(20+p.rng.IntN(60))*time.Millisecond
		}
	}
}

type pacedResult struct {
	lib      string
	subs     int
	rate     int
	events   int
	achieved float64 // events/s the publisher managed
	missing  uint64
	dup      uint64
	ended    int // subscriber streams that ended early (evicted, errors)
	lat      benchkit.Hist
	err      string
}

func (r pacedResult) lossless() bool {
	return r.err == "" && r.missing == 0 && r.dup == 0 && r.ended == 0
}

func (r pacedResult) keptPace() bool { return r.achieved >= 0.95*float64(r.rate) }

func (r pacedResult) sustained() bool { return r.lossless() && r.keptPace() }

// why says what went wrong in a run that did not sustain its rate.
func (r pacedResult) why() string {
	switch {
	case r.err != "":
		return r.err
	case !r.lossless():
		return fmt.Sprintf("lost %d, dup %d, %d of %d streams ended early", r.missing, r.dup, r.ended, r.subs)
	case !r.keptPace():
		return fmt.Sprintf("publisher held back to %.0f/s", r.achieved)
	}
	return ""
}

// runPacedOnce runs lib at one rate.
func runPacedOnce(lib library, cfg config, subs int, o pacedOpts) pacedResult {
	events := max(2000, int(float64(o.rate)*o.duration.Seconds()))
	r := pacedResult{lib: lib.name, subs: subs, rate: o.rate, events: events}
	f := lib.new(cfg)
	sinks, group := newSinks(subs, events, -1)
	sent := make([]atomic.Int64, events+1)
	base := time.Now()
	for i, s := range sinks {
		s.pacing = &pacing{sent: sent, base: base, pause: o.pause, rng: rand.New(rand.NewPCG(uint64(i), 17)),
			pauseAt: time.Duration(rand.IntN(50)) * time.Millisecond}
	}
	runtime.GC()
	if err := f.start(sinks); err != nil {
		r.err = "start: " + err.Error()
		close(sinks[0].release)
		stopWithin(f, 5*time.Second)
		return r
	}
	interval := time.Second / time.Duration(o.rate)
	start := time.Since(base)
	pubDone := make(chan error, 1)
	var published atomic.Uint64
	go func() {
		for seq := uint64(1); seq <= uint64(events); seq++ {
			benchkit.Wait(base, start+time.Duration(seq-1)*interval, o.pacer)
			sent[seq].Store(int64(time.Since(base)))
			if err := f.publish(seq); err != nil {
				pubDone <- err
				return
			}
			published.Store(seq)
		}
		pubDone <- nil
	}()
	// The publisher may block (a blocking bus behind a slow subscriber):
	// give it its duration plus settle, then report it held back.
	var pubErr error
	pubFinished := false
	select {
	case pubErr = <-pubDone:
		pubFinished = true
	case <-time.After(o.duration*4 + o.settle):
	}
	elapsed := time.Since(base) - start
	if pubFinished {
		select {
		case <-group.all:
		case <-time.After(o.settle):
		}
	}
	close(sinks[0].release)
	hung := !stopWithin(f, 5*time.Second)
	if !pubFinished {
		select {
		case pubErr = <-pubDone:
		case <-time.After(5 * time.Second):
		}
	}
	r.achieved = float64(published.Load()) / elapsed.Seconds()
	if pubErr != nil && pubFinished {
		// (A publish that fails after the teardown of a publisher that was
		// held back is the teardown's doing: the run is reported held back.)
		r.err = pubErr.Error()
	}
	if hung {
		r.err = "teardown hung"
		r.missing = uint64(events*subs) - sumProgress(sinks)
		return r
	}
	for _, s := range sinks {
		r.missing += s.missing
		r.dup += s.dup
		if s.ended && !s.complete {
			r.ended++
		}
		if !s.ended && !s.complete && s.next <= s.total {
			r.missing += s.total - (s.next - 1)
		}
		r.lat.Merge(&s.pacing.lat)
	}
	return r
}

// pacedRow is one library's sweep: the highest rate sustained, and the
// first rate that was not.
type pacedRow struct {
	best, fail pacedResult
	runs       int
}

// sweepPaced runs lib at each rate, count times, from the lowest, until a
// rate is not sustained in every run.
func sweepPaced(lib library, cfg config, subs int, rates []int, count int, o pacedOpts) pacedRow {
	var row pacedRow
	for _, rate := range rates {
		o.rate = rate
		var worst, agg pacedResult
		ok := true
		for range count {
			r := runPacedOnce(lib, cfg, subs, o)
			row.runs++
			if agg.lib == "" {
				agg = r
			} else {
				agg.lat.Merge(&r.lat)
				agg.achieved = min(agg.achieved, r.achieved)
			}
			if !r.sustained() {
				ok = false
				worst = r
				break
			}
		}
		if !ok {
			row.fail = worst
			return row
		}
		row.best = agg
	}
	return row
}

func printPaced(w io.Writer, rows []pacedRow, libs []string) {
	fmt.Fprintf(w, "| library | highest rate sustained losslessly | latency there p50 / p99 / p99.9 | next rate tried | what happened there |\n")
	fmt.Fprintf(w, "|---|---:|---|---:|---|\n")
	for i, row := range rows {
		best, lat := "none", ""
		if row.best.rate > 0 {
			best = fmt.Sprintf("%d/s", row.best.rate)
			lat = fmt.Sprintf("%s / %s / %s", fmtDur(row.best.lat.Quantile(0.5)), fmtDur(row.best.lat.Quantile(0.99)), fmtDur(row.best.lat.Quantile(0.999)))
		}
		next, what := "-", "sustained every rate tried"
		if row.fail.rate > 0 {
			next = fmt.Sprintf("%d/s", row.fail.rate)
			what = row.fail.why()
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", libs[i], best, lat, next, what)
	}
	fmt.Fprintln(w)
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%d µs", d.Microseconds())
	}
}
