// Package benchkit is what the paced benchmarks (the root package's and the
// peer harness's) share: a latency histogram and the publisher's pace.
package benchkit

import (
	"math/bits"
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
			e, m := i/8, uint64(i%8)
			if e < 3 {
				return time.Duration(1) << e
			}
			return time.Duration((8 + m) << (e - 3))
		}
	}
	return 0
}

// Pace waits until due (the time since base an event is due): spinning, the
// way a publisher that never leaves its processor does, or with burst set
// sleeping to the next millisecond after due, so that every event due by
// then goes out at once (about rate/1000 at a time).
func Pace(base time.Time, due time.Duration, burst bool) {
	if !burst {
		for time.Since(base) < due {
		}
		return
	}
	if now := time.Since(base); now < due {
		time.Sleep(due - now + time.Millisecond - (due-now)%time.Millisecond)
	}
}
