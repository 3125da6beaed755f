// Command tracelate reads an execution trace (go test -trace) and tells
// where goroutines waited to run: for every goroutine that became runnable
// often, how long it waited from runnable to running (mean, and how many
// waits passed -late), split by why it became runnable (woken from a wait,
// or put back by a yield or a preemption); and every stretch over -gap in
// which a P recorded no event at all, with the goroutines that sat in its
// run queue meanwhile (a P that was running; an idle P records nothing
// either). It was written for issue 26's bimodal tail with a
// yielding publisher (docs/bench/NOTES.md, "The frame's cost, apart from
// the delivery's").
//
// Usage, from benchmarks/:
//
//	go test -C .. -run '^$' -bench 'DeliveryLatency/pace=yield/impl=evict$' -benchtime 1x -trace /tmp/t.out
//	go run ./tracelate [-late 1ms] [-gap 1ms] [-min 1000] /tmp/t.out
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"golang.org/x/exp/trace"
)

func main() {
	late := flag.Duration("late", time.Millisecond, "a wait from runnable to running longer than this is late")
	gap := flag.Duration("gap", time.Millisecond, "report a P that recorded no event for longer than this")
	minWaits := flag.Int("min", 1000, "list only goroutines that became runnable at least this often")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: tracelate [-late D] [-gap D] [-min N] TRACE")
		os.Exit(2)
	}
	f, err := os.Open(flag.Arg(0))
	if err == nil {
		defer f.Close()
		err = analyze(f, os.Stdout, *late, *gap, *minWaits)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tracelate:", err)
		os.Exit(1)
	}
}

// Why a goroutine became runnable, the rows of waits.count.
const (
	anyWay  = iota // all its waits
	woken          // woken from a wait
	putBack        // put back while running (a yield, a preemption)
)

// waits is what one goroutine's waits to run added up to: count[why][0]
// waits, count[why][1] of them late.
type waits struct {
	count [3][2]int
	sum   time.Duration
}

// record adds a wait of d that began in state from.
func (x *waits) record(d time.Duration, from trace.GoState, late time.Duration) {
	isLate := 0
	if d > late {
		isLate = 1
	}
	x.sum += d
	x.count[anyWay][0]++
	x.count[anyWay][1] += isLate
	why := -1
	switch from {
	case trace.GoWaiting:
		why = woken
	case trace.GoRunning:
		why = putBack
	}
	if why >= 0 {
		x.count[why][0]++
		x.count[why][1] += isLate
	}
}

// add adds y's counts to x's.
func (x *waits) add(y *waits) {
	for r := range x.count {
		for c := range x.count[r] {
			x.count[r][c] += y.count[r][c]
		}
	}
	x.sum += y.sum
}

func analyze(r io.Reader, w io.Writer, late, gap time.Duration, minWaits int) error {
	tr, err := trace.NewReader(r)
	if err != nil {
		return err
	}
	// A goroutine that is runnable now: since when, from which state, and
	// the P that made it runnable.
	type runnable struct {
		since trace.Time
		from  trace.GoState
		p     trace.ProcID
	}
	queued := map[trace.GoID]runnable{}
	byG := map[trace.GoID]*waits{}
	lastOnP := map[trace.ProcID]trace.Time{}
	running := map[trace.ProcID]bool{}   // a P's state now
	runningAt := map[trace.ProcID]bool{} // and at its last event
	type stall struct {
		p          trace.ProcID
		start, end trace.Time
		queued     int // goroutines made runnable on p before start, still waiting at end
	}
	var stalls []stall
	for {
		ev, err := tr.ReadEvent()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if ev.Kind() == trace.EventStateTransition {
			if st := ev.StateTransition(); st.Resource.Kind == trace.ResourceProc {
				_, now := st.Proc()
				running[st.Resource.Proc()] = now == trace.ProcRunning
			}
		}
		if p := ev.Proc(); p != trace.NoProc {
			// A silence counts only while the P was running: an idle one
			// records nothing either.
			if last, ok := lastOnP[p]; ok && runningAt[p] && time.Duration(ev.Time()-last) > gap {
				s := stall{p: p, start: last, end: ev.Time()}
				for _, q := range queued {
					if q.p == p && q.since <= last {
						s.queued++
					}
				}
				stalls = append(stalls, s)
			}
			lastOnP[p] = ev.Time()
			runningAt[p] = running[p]
		}
		if ev.Kind() != trace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		g := st.Resource.Goroutine()
		old, now := st.Goroutine()
		switch {
		case now == trace.GoRunnable && old != trace.GoRunnable:
			queued[g] = runnable{ev.Time(), old, ev.Proc()}
		case now == trace.GoRunning:
			q, ok := queued[g]
			if !ok {
				continue
			}
			delete(queued, g)
			x := byG[g]
			if x == nil {
				x = &waits{}
				byG[g] = x
			}
			x.record(time.Duration(ev.Time()-q.since), q.from, late)
		}
	}
	var gs []trace.GoID
	var all waits
	for g, x := range byG {
		if x.count[anyWay][0] >= minWaits {
			gs = append(gs, g)
			all.add(x)
		}
	}
	slices.Sort(gs)
	fmt.Fprintf(w, "goroutines runnable at least %d times: %d; waits %d, late (over %v) %d; woken from a wait %d (late %d), put back while running %d (late %d)\n",
		minWaits, len(gs), all.count[anyWay][0], late, all.count[anyWay][1], all.count[woken][0], all.count[woken][1], all.count[putBack][0], all.count[putBack][1])
	for _, g := range gs {
		x := byG[g]
		fmt.Fprintf(w, "  g%d: runnable %d times, mean wait %v, late %d (woken %d of %d, put back %d of %d)\n",
			g, x.count[anyWay][0], (x.sum / time.Duration(x.count[anyWay][0])).Round(100*time.Nanosecond), x.count[anyWay][1],
			x.count[woken][1], x.count[woken][0], x.count[putBack][1], x.count[putBack][0])
	}
	var total time.Duration
	stranding, stranded := 0, 0
	for _, s := range stalls {
		total += time.Duration(s.end - s.start)
		if s.queued > 0 {
			stranding++
			stranded += s.queued
		}
	}
	fmt.Fprintf(w, "stretches over %v with no event on a running P: %d, %v in all; %d of them with goroutines waiting in its queue, %d goroutines in all\n",
		gap, len(stalls), total.Round(time.Microsecond), stranding, stranded)
	for i, s := range stalls {
		if i == 20 {
			fmt.Fprintf(w, "  ... %d more\n", len(stalls)-i)
			break
		}
		fmt.Fprintf(w, "  P%d silent for %v, %d goroutines it had made runnable waiting\n", s.p, time.Duration(s.end-s.start).Round(time.Microsecond), s.queued)
	}
	return nil
}
