//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"slices"
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
	// measured, when set, says whether an implementation has the figure
	// ("-" where it has not).
	measured func(*implResult) bool
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
	{
		name: "RSS per conn, after FreeOSMemory", val: func(r *implResult) float64 { return r.RSSFreedPerConn }, fmt: fmtKiB,
		// sessiond has no route that runs debug.FreeOSMemory.
		measured: func(r *implResult) bool { return r.Connected.RSSFreed != 0 },
	},
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
	{name: "fan-out: the publish loop (sessiond: the parent's POSTs)", val: func(r *implResult) float64 { return r.LoopMicros }, fmt: fmtMicros},
	{name: "fan-out: server CPU per delivery (sessiond: /proc, 10 ms ticks)", val: func(r *implResult) float64 { return r.ServerCPUPerDelivery }, fmt: fmtFloat(2, " µs")},
	{name: "fan-out: client CPU per delivery (this process)", val: func(r *implResult) float64 { return r.ClientCPUPerDelivery }, fmt: fmtFloat(2, " µs")},
	{name: "fan-out: heartbeats received during a round", val: func(r *implResult) float64 { return r.HeartbeatsPerRound }, fmt: fmtFloat(0, ""), noRatio: true},
	{name: "bytes per event frame on the wire", val: func(r *implResult) float64 { return r.BytesPerFrame }, fmt: fmtFloat(1, " B")},
	{name: "lost deliveries (missing after the timeout)", val: func(r *implResult) float64 { return float64(r.Lost) }, fmt: fmtFloat(0, ""), noRatio: true},
	{name: "streams ended early", val: func(r *implResult) float64 { return float64(r.Ended) }, fmt: fmtFloat(0, ""), noRatio: true},
}

func (m metric) has(r *implResult) bool { return m.measured == nil || m.measured(r) }

func (m metric) cell(r *implResult) string {
	switch {
	case !m.has(r):
		return "-"
	case m.show != nil:
		return m.show(r)
	}
	return m.fmt(m.val(r))
}

// ratioCell is the ratio of a's figure to b's, or "-".
func (m metric) ratioCell(a, b *implResult) string {
	if m.noRatio || !m.has(a) || !m.has(b) {
		return "-"
	}
	return ratio(m.val(a), m.val(b))
}

// ratio is a/b as "1.23x", or "-" when it means nothing.
func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

// columns is the implementations measured, in report order (eventbus,
// sessiond, naive), and those with a ratio column against naive: each of
// the others, when naive was measured.
func columns(measured []string) (cols, ratioed []string) {
	for _, name := range impls {
		if slices.Contains(measured, name) {
			cols = append(cols, name)
		}
	}
	if slices.Contains(cols, "naive") {
		ratioed = slices.DeleteFunc(slices.Clone(cols), func(c string) bool { return c == "naive" })
	}
	return cols, ratioed
}

// tableHead returns the head and the rule of a table whose first column is
// first, then one per implementation and one per ratio.
func tableHead(first string, cols, ratioed []string) (head, rule string) {
	head, rule = "| "+first+" |", "|---|"
	for _, c := range cols {
		head += " " + c + " |"
		rule += "---:|"
	}
	for _, c := range ratioed {
		head += " " + c + "/naive |"
		rule += "---:|"
	}
	return head, rule
}

func writeRun(w io.Writer, cfg config, rr runResult) {
	cols, ratioed := columns(rr.Order)
	order := rr.Order[0] + " first"
	for _, impl := range rr.Order[1:] {
		order += ", then " + impl
	}
	fmt.Fprintf(w, "\n### Run %d of %d (%s)\n\n", rr.Index, cfg.runs, order)
	fmt.Fprintf(w, "%s; %d connections over %d sessions, heartbeat %v, idle window %v, %d fan-outs; %s/%s, %d CPUs, %s.\n",
		time.Now().Format("2006-01-02 15:04"), cfg.conns, cfg.sessions, cfg.heartbeat, cfg.idle, cfg.fanouts,
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version())
	for _, impl := range rr.Order {
		r := rr.Results[impl]
		fmt.Fprintf(w, "%s: load average %s at its start, %s at its end; connected in %.1f s; %d GCs before the memory figures.\n",
			impl, r.LoadStart, r.LoadEnd, r.ConnectSeconds, r.Connected.GCs)
	}
	if r, ok := rr.Results["sessiond"]; ok {
		fmt.Fprintf(w, "sessiond: `%s`, its figures read from outside it (RSS and CPU in /proc, the rest from -debug-addr: "+
			"/debug/vars, /debug/pprof/goroutine, each collection a GET of /debug/pprof/heap?gc=1; no RSS after FreeOSMemory); "+
			"its publish loop is this process's POSTs, one per session, one after another on one keep-alive connection, HTTP round trips included.\n",
			r.Binary)
	}
	fmt.Fprintln(w)

	head, rule := tableHead("per connection, or per fan-out (median of the rounds)", cols, ratioed)
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, rule)
	for _, m := range metrics {
		row := "| " + m.name + " |"
		for _, c := range cols {
			row += " " + m.cell(rr.Results[c]) + " |"
		}
		for _, c := range ratioed {
			row += " " + m.ratioCell(rr.Results[c], rr.Results["naive"]) + " |"
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
	cols, ratioed := columns(cfg.impls)
	fmt.Fprintf(w, "\n### Spread over %d runs: min-max (median)\n\n", len(runs))
	head, rule := tableHead("metric", cols, ratioed)
	fmt.Fprintln(w, head)
	fmt.Fprintln(w, rule)
	spread := func(v []float64, f func(float64) string) string {
		if len(v) == 0 {
			return "-"
		}
		return fmt.Sprintf("%s-%s (%s)", f(slices.Min(v)), f(slices.Max(v)), f(median(v)))
	}
	for _, m := range metrics {
		row := "| " + m.name + " |"
		for _, c := range cols {
			var v []float64
			for _, rr := range runs {
				if r := rr.Results[c]; m.has(r) {
					v = append(v, m.val(r))
				}
			}
			row += " " + spread(v, m.fmt) + " |"
		}
		for _, c := range ratioed {
			var v []float64
			for _, rr := range runs {
				a, b := rr.Results[c], rr.Results["naive"]
				if !m.noRatio && m.has(a) && m.has(b) && m.val(b) != 0 {
					v = append(v, m.val(a)/m.val(b))
				}
			}
			row += " " + spread(v, fmtFloat(2, "x")) + " |"
		}
		fmt.Fprintln(w, row)
	}
}
