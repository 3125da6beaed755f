// Command charts draws the charts of BENCHMARKS.md from the raw results in
// docs/bench, as SVG files in docs/bench/charts:
//
//   - fanout-peers.svg: ns per delivery against subscribers for every
//     library of the peer harness (docs/bench/peers-default.md), with a
//     tight and a closed-loop publisher;
//   - fanout-baselines.svg: BenchmarkFanout, eventbus against the naive
//     channel bus and the naive bus that encodes (fanout.txt,
//     fanout-final.txt);
//   - http-peers.svg: ns per delivered event over loopback HTTP against
//     clients for every handler (peers-default.md);
//   - memory-per-connection.svg: goroutine stacks, heap and RSS per idle
//     connection at 10,000 connections for each implementation of the
//     scale program (stream-cost-scale-floors.txt,
//     stream-cost-scale-detached.txt).
//
// Usage, from benchmarks/:
//
//	go run ./charts            # writes ../docs/bench/charts/*.svg
//	go run ./charts -check     # fails if a committed chart differs
//
// The charts are never edited by hand: the test of this package renders
// them from the committed raw files and compares them with the committed
// SVGs. A figure charted here is a median of the runs in its raw file;
// a run that lost events or blocked is left out of its line, never drawn
// as a speed.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

func main() {
	raw := flag.String("raw", "../docs/bench", "the directory of the raw results")
	out := flag.String("out", "../docs/bench/charts", "where the SVG files go")
	check := flag.Bool("check", false, "compare with the files in -out instead of writing them")
	flag.Parse()
	var err error
	if *check {
		err = checkCharts(*raw, *out)
	} else {
		err = writeCharts(*raw, *out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "charts:", err)
		os.Exit(1)
	}
}

// writeCharts renders every chart into out, and removes an SVG there that
// no chart makes any more.
func writeCharts(raw, out string) error {
	names, svgs, err := render(raw)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(out, n), svgs[n], 0o644); err != nil {
			return err
		}
		fmt.Println(filepath.Join(out, n))
	}
	stale, err := staleCharts(out, names)
	if err != nil {
		return err
	}
	for _, s := range stale {
		if err := os.Remove(filepath.Join(out, s)); err != nil {
			return err
		}
		fmt.Println("removed", filepath.Join(out, s))
	}
	return nil
}

// checkCharts reports every chart in out that is not exactly what the
// program makes from raw, and every SVG there that no chart makes.
func checkCharts(raw, out string) error {
	names, svgs, err := render(raw)
	if err != nil {
		return err
	}
	var bad []string
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(out, n))
		if err != nil || !bytes.Equal(b, svgs[n]) {
			bad = append(bad, n)
		}
	}
	stale, err := staleCharts(out, names)
	if err != nil {
		return err
	}
	for _, s := range stale {
		bad = append(bad, s+" (made by no chart)")
	}
	if len(bad) > 0 {
		return fmt.Errorf("not what the raw files give: %s; run `go run ./charts` in benchmarks/", strings.Join(bad, ", "))
	}
	return nil
}

// staleCharts lists the SVG files in dir that are not among names.
func staleCharts(dir string, names []string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var stale []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".svg") && !slices.Contains(names, e.Name()) {
			stale = append(stale, e.Name())
		}
	}
	return stale, nil
}
