package main

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkFanout runs the in-process fan-out workload for every library and
// subscriber count: one b.Loop iteration is one whole run of benchEvents
// events, every delivery checked. Compare with benchstat:
//
//	go test -run '^$' -bench Fanout -count 6 > new.txt
func BenchmarkFanout(b *testing.B) { benchFanout(b, 0) }

// BenchmarkFanoutWindow is BenchmarkFanout with the closed-loop publisher
// (at most 512 events ahead of the slowest subscriber), the fair setting for
// a bus whose Publish never blocks.
func BenchmarkFanoutWindow(b *testing.B) { benchFanout(b, 512) }

func benchFanout(b *testing.B, window int) {
	const benchEvents = 2000
	o := runOpts{window: window, timeout: 30 * time.Second, stall: 3 * time.Second, stopMax: 5 * time.Second}
	cfg := config{queue: 1024}
	for _, subs := range []int{1, 64, 1000} {
		for _, lib := range libraries {
			b.Run(fmt.Sprintf("subs=%d/lib=%s", subs, benchName(lib.name)), func(b *testing.B) {
				b.ReportAllocs()
				var ns, allocs float64
				runs := 0
				for b.Loop() {
					r := runFanout(lib, cfg, subs, benchEvents, o)
					if r.status != statusOK {
						b.Fatalf("%s: %s %s", lib.name, r.status, r.detail)
					}
					ns += r.nsPerDelivery
					allocs += r.allocsPerEvent
					runs++
				}
				b.ReportMetric(ns/float64(runs), "ns/delivery")
				b.ReportMetric(allocs/float64(runs), "allocs/event")
			})
		}
	}
}

// benchName makes a library name usable as a sub-benchmark name.
func benchName(s string) string {
	out := make([]rune, 0, len(s))
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '.':
			out = append(out, r)
		case r == '/' || r == ' ' || r == '+':
			if len(out) > 0 && out[len(out)-1] != '_' {
				out = append(out, '_')
			}
		}
	}
	return string(out)
}
