package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/ssebus/eventbus/sseclient"
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

// BenchmarkReadSSE is why the HTTP scenario's clients parse with readSSE
// and not with sseclient.Parser, the reader of every other test: the cost
// of reading one event of the scenario's stream with each, in the process
// being measured. Compare with benchstat:
//
//	go test -run '^$' -bench ReadSSE -count 8 > new.txt
func BenchmarkReadSSE(b *testing.B) {
	const n = 2000
	var in []byte
	for id := uint64(1); id <= n; id++ {
		in = appendSSEFrame(in, naiveMsg{ID: id, Data: newEnvelope(id)})
	}
	for _, r := range []struct {
		name string
		read func(io.Reader, *sink) string
	}{{"readSSE", readSSE}, {"sseclient.Parser", readSSEParser}} {
		b.Run("reader="+r.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(in)))
			for b.Loop() {
				sinks, _ := newSinks(1, n, -1)
				if end := r.read(bytes.NewReader(in), sinks[0]); end != "closed" || !sinks[0].complete {
					b.Fatalf("%s, %d events", end, sinks[0].got)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
		})
	}
}

// readSSEParser is readSSE written on sseclient.Parser: BenchmarkReadSSE's
// yardstick and TestReadSSE's reference.
func readSSEParser(body io.Reader, s *sink) string {
	p := sseclient.NewParser(body)
	var evicted, errored bool
	for {
		m, err := p.Next()
		if err != nil {
			if errors.Is(err, sseclient.ErrEventTooLarge) {
				return "protocol: event too large"
			}
			break
		}
		if m.Kind != sseclient.KindEvent {
			continue
		}
		if id, err := strconv.ParseUint(m.ID, 10, 64); m.HasID && err == nil {
			s.see(id)
			continue
		}
		switch m.Type {
		case "client_evicted":
			evicted = true
		case "slow_client_warning":
			s.warnings++
		case "stream_error":
			errored = true
		}
	}
	return endReason(evicted, errored)
}
