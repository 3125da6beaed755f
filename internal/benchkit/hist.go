// Package benchkit is what the paced benchmarks (the root package's and the
// peer harness's) share: a latency histogram and the publisher's pace.
package benchkit

import (
	"math/bits"
	"os"
	"runtime"
	"strings"
	"time"
)

// Hist counts durations in nanoseconds: log-linear, 8 buckets per power of
// two, so a percentile is read to within 12%, in a fixed array that a hot
// loop adds to without allocating. The zero Hist is empty and ready to use;
// a Hist is not safe for concurrent use.
type Hist struct{ b [64 * 8]uint64 }

// Add counts ns (at least 1).
func (h *Hist) Add(ns int64) {
	v := uint64(max(ns, 1))
	e := bits.Len64(v) - 1
	var m uint64
	if e >= 3 {
		m = (v >> (e - 3)) & 7
	} else {
		m = (v << (3 - e)) & 7
	}
	h.b[e*8+int(m)]++
}

// Merge adds o's counts to h.
func (h *Hist) Merge(o *Hist) {
	for i := range h.b {
		h.b[i] += o.b[i]
	}
}

// Quantile returns the lower bound of the bucket that holds quantile q
// (0 < q < 1), or 0 when h is empty.
func (h *Hist) Quantile(q float64) time.Duration {
	var n uint64
	for _, c := range h.b {
		n += c
	}
	if n == 0 {
		return 0
	}
	want, acc := uint64(q*float64(n)), uint64(0)
	for i, c := range h.b {
		if acc += c; acc > want {
			return lower(i)
		}
	}
	return 0
}

// lower returns the lower bound of bucket i.
func lower(i int) time.Duration {
	e, m := i/8, uint64(i%8)
	if e < 3 {
		return time.Duration(1) << e
	}
	return time.Duration((8 + m) << (e - 3))
}

// Max returns the lower bound of the highest bucket that counts anything,
// or 0 when h is empty.
func (h *Hist) Max() time.Duration {
	for i := len(h.b) - 1; i >= 0; i-- {
		if h.b[i] != 0 {
			return lower(i)
		}
	}
	return 0
}

// Above returns the share of the counts (0 to 1) in buckets whose lower
// bound is at least d, or 0 when h is empty.
func (h *Hist) Above(d time.Duration) float64 {
	var n, above uint64
	for i, c := range h.b {
		n += c
		if lower(i) >= d {
			above += c
		}
	}
	if n == 0 {
		return 0
	}
	return float64(above) / float64(n)
}

// Pace waits until due (the time since base an event is due): spinning, the
// way a publisher that never leaves its processor does, or with burst set
// sleeping to the next millisecond after due, so that every event due by
// then goes out at once (about rate/1000 at a time).
func Pace(base time.Time, due time.Duration, burst bool) {
	if burst {
		Wait(base, due, Burst)
	} else {
		Wait(base, due, Spin)
	}
}

// Pacer is how a paced publisher waits for its next event.
type Pacer uint8

const (
	// Spin busy-waits: the publisher never leaves its processor.
	Spin Pacer = iota
	// Burst sleeps to the next millisecond after the event is due: every
	// event due by then goes out at once.
	Burst
	// Sleep sleeps until the event is due, one event at a time: a
	// publisher that is woken for each event (a timer, a request).
	Sleep
	// Yield calls runtime.Gosched until the event is due: the publisher
	// keeps its processor busy, but lets every runnable goroutine run
	// between its looks at the clock.
	Yield
)

// String is the pacer's name in benchmark names.
func (p Pacer) String() string {
	switch p {
	case Spin:
		return "spin"
	case Burst:
		return "burst"
	case Sleep:
		return "sleep"
	case Yield:
		return "yield"
	}
	return "unknown"
}

// Wait waits until due (the time since base an event is due) as p says.
func Wait(base time.Time, due time.Duration, p Pacer) {
	switch p {
	case Burst:
		if now := time.Since(base); now < due {
			time.Sleep(due - now + time.Millisecond - (due-now)%time.Millisecond)
		}
	case Sleep:
		if now := time.Since(base); now < due {
			time.Sleep(due - now)
		}
	case Yield:
		for time.Since(base) < due {
			runtime.Gosched()
		}
	default:
		for time.Since(base) < due {
		}
	}
}

// LoadAvg returns the first three fields of /proc/loadavg (Linux), to print
// beside a measurement: a busy machine moves the numbers by 2x and more. It
// returns "n/a" where there is no /proc/loadavg.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "n/a"
	}
	return strings.Join(f[:3], " ")
}
