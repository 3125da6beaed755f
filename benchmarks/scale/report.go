//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"time"
)

// metric is one row of the report.
type metric struct {
	name string
	val  func(*implResult) float64 // what the ratio and the spread compare
	fmt  func(float64) string
	// show, when set, is the cell of one run (val and fmt make the spread's).
	show    func(*implResult) string
	noRatio bool // a count whose ratio says nothing (losses)
}

func fmtKiB(b float64) string { return fmt.Sprintf("%.1f KiB", b/1024) }

func fmtMicros(us float64) string {
	if us < 1000 {
		return fmt.Sprintf("%.0f µs", us)
	}
	return fmt.Sprintf("%.1f ms", us/1000)
}

func fmtFloat(prec int, unit string) func(float64) string {
	return func(v float64) string { return fmt.Sprintf("%.*f%s", prec, v, unit) }
}

var metrics = []metric{
	{name: "goroutine stacks per conn (StackInuse, after GCs)", val: func(r *implResult) float64 { return r.StackPerConn }, fmt: fmtKiB},
	{name: "goroutine stacks per conn (StackInuse, as found)", val: func(r *implResult) float64 { return r.StackBeforeGCPerConn }, fmt: fmtKiB},
	{name: "heap per conn (HeapInuse, after GCs)", val: func(r *implResult) float64 { return r.HeapPerConn }, fmt: fmtKiB},
	{name: "RSS per conn, after GCs", val: func(r *implResult) float64 { return r.RSSPerConn }, fmt: fmtKiB},
	{name: "RSS per conn, after FreeOSMemory", val: func(r *implResult) float64 { return r.RSSFreedPerConn }, fmt: fmtKiB},
	{name: "goroutine stacks per conn after the fan-outs (after GCs)", val: func(r *implResult) float64 { return r.StackAfterFanoutPerConn }, fmt: fmtKiB},
	{name: "heap per conn after the fan-outs (after GCs)", val: func(r *implResult) float64 { return r.HeapAfterFanoutPerConn }, fmt: fmtKiB},
	{name: "goroutines per conn", val: func(r *implResult) float64 { return r.GoroutinesPerConn }, fmt: fmtFloat(2, "")},
	{name: "heartbeat CPU, µs/s per 1000 conns", val: func(r *implResult) float64 { return r.HeartbeatCPU }, fmt: fmtFloat(0, "")},
	{
		name: "heartbeats per conn in the idle window, mean (min-max)",
		val:  func(r *implResult) float64 { return r.HeartbeatsMean }, fmt: fmtFloat(2, ""),
		show: func(r *implResult) string {
			return fmt.Sprintf("%.2f (%d-%d)", r.HeartbeatsMean, r.HeartbeatsMin, r.HeartbeatsMax)
		},
	},
	{name: "fan-out: first client reached", val: func(r *implResult) float64 { return r.FirstMicros }, fmt: fmtMicros},
	{name: "fan-out: p50", val: func(r *implResult) float64 { return r.P50Micros }, fmt: fmtMicros},
	{name: "fan-out: p99", val: func(r *implResult) float64 { return r.P99Micros }, fmt: fmtMicros},
	{name: "fan-out: last client reached", val: func(r *implResult) float64 { return r.LastMicros }, fmt: fmtMicros},
	{name: "fan-out: the server's publish loop", val: func(r *implResult) float64 { return r.LoopMicros }, fmt: fmtMicros},
	{name: "fan-out: heartbeats received during a round", val: func(r *implResult) float64 { return r.HeartbeatsPerRound }, fmt: fmtFloat(0, ""), noRatio: true},
	{name: "bytes per event frame on the wire", val: func(r *implResult) float64 { return r.BytesPerFrame }, fmt: fmtFloat(1, " B")},
	{name: "lost deliveries (missing after the timeout)", val: func(r *implResult) float64 { return float64(r.Lost) }, fmt: fmtFloat(0, ""), noRatio: true},
	{name: "streams ended early", val: func(r *implResult) float64 { return float64(r.Ended) }, fmt: fmtFloat(0, ""), noRatio: true},
}

func (m metric) cell(r *implResult) string {
	if m.show != nil {
		return m.show(r)
	}
	return m.fmt(m.val(r))
}

// ratio is a/b as "1.23x", or "-" when it means nothing.
func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

// hasPair reports whether the runs measured both implementations, which
// the ratio column needs.
func hasPair(impls []string) bool {
	return slices.Contains(impls, "eventbus") && slices.Contains(impls, "naive")
}

// columns is the implementations in report order: eventbus first.
func columns(impls []string) []string {
	var out []string
	for _, name := range []string{"eventbus", "naive"} {
		if slices.Contains(impls, name) {
			out = append(out, name)
		}
	}
	return out
}

func writeRun(w io.Writer, cfg config, rr runResult) {
	cols := columns(rr.Order)
	pair := hasPair(rr.Order)
	fmt.Fprintf(w, "\n### Run %d of %d (%s)\n\n", rr.Index, cfg.runs, strings.Join(rr.Order, " first, then "))
	fmt.Fprintf(w, "%s; %d connections over %d sessions, heartbeat %v, idle window %v, %d fan-outs; %s/%s, %d CPUs, %s.\n",
		time.Now().Format("2006-01-02 15:04"), cfg.conns, cfg.sessions, cfg.heartbeat, cfg.idle, cfg.fanouts,
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version())
	for _, impl := range rr.Order {
		r := rr.Results[impl]
		fmt.Fprintf(w, "%s: load average %s at its start, %s at its end; connected in %.1f s; %d GCs before the memory figures.\n",
			impl, r.LoadStart, r.LoadEnd, r.ConnectSeconds, r.Connected.GCs)
	}
	fmt.Fprintln(w)

	head := "| per connection, or per fan-out (median of the rounds) |"
	rule := "|---|"
	for _, c := range cols {
		head += " " + c + " |"
		rule += "---:|"
	}
	if pair {
		head += " eventbus/naive |"
		rule += "---:|"
	}
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, rule)
	for _, m := range metrics {
		row := "| " + m.name + " |"
		for _, c := range cols {
			row += " " + m.cell(rr.Results[c]) + " |"
		}
		if pair {
			cell := "-"
			if !m.noRatio {
				cell = ratio(m.val(rr.Results["eventbus"]), m.val(rr.Results["naive"]))
			}
			row += " " + cell + " |"
		}
		fmt.Fprintln(w, row)
	}

	fmt.Fprintf(w, "\nFan-out rounds (first / p50 / p99 / last client; the publish loop; heartbeats received during the round; missing):\n\n")
	head, rule = "| round |", "|---:|"
	for _, c := range cols {
		head += " " + c + " |"
		rule += "---|"
	}
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, rule)
	for k := range cfg.fanouts {
		row := fmt.Sprintf("| %d |", k+1)
		for _, c := range cols {
			rd := rr.Results[c].Rounds[k]
			row += fmt.Sprintf(" %s / %s / %s / %s; %s; %d; %d |", fmtMicros(rd.FirstMicros), fmtMicros(rd.P50Micros),
				fmtMicros(rd.P99Micros), fmtMicros(rd.LastMicros), fmtMicros(rd.LoopMicros), rd.Heartbeats, rd.Missing)
		}
		fmt.Fprintln(w, row)
	}
	if cfg.jsonLines {
		fmt.Fprintln(w)
		for _, c := range cols {
			b, err := json.Marshal(rr.Results[c])
			if err != nil {
				panic(err) // plain numbers and strings
			}
			fmt.Fprintln(w, string(b))
		}
	}
}

// writeSpread writes, for every metric, the smallest and largest value of
// each implementation over the runs, and of the ratio, with the medians.
func writeSpread(w io.Writer, cfg config, runs []runResult) {
	cols := columns(cfg.impls)
	pair := hasPair(cfg.impls)
	fmt.Fprintf(w, "\n### Spread over %d runs: min-max (median)\n\n", len(runs))
	head, rule := "| metric |", "|---|"
	for _, c := range cols {
		head += " " + c + " |"
		rule += "---:|"
	}
	if pair {
		head += " eventbus/naive |"
		rule += "---:|"
	}
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, rule)
	spread := func(v []float64, f func(float64) string) string {
		return fmt.Sprintf("%s-%s (%s)", f(slices.Min(v)), f(slices.Max(v)), f(median(v)))
	}
	for _, m := range metrics {
		row := "| " + m.name + " |"
		for _, c := range cols {
			v := make([]float64, len(runs))
			for i, rr := range runs {
				v[i] = m.val(rr.Results[c])
			}
			row += " " + spread(v, m.fmt) + " |"
		}
		if pair {
			cell := "-"
			if !m.noRatio {
				var v []float64
				for _, rr := range runs {
					if b := m.val(rr.Results["naive"]); b != 0 {
						v = append(v, m.val(rr.Results["eventbus"])/b)
					}
				}
				if len(v) > 0 {
					cell = spread(v, fmtFloat(2, "x"))
				}
			}
			row += " " + cell + " |"
		}
		fmt.Fprintln(w, row)
	}
}
