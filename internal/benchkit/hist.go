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
