package backplane

import (
	"context"
	"math/rand/v2"
	"time"
)

// Defaults of Backoff.
const (
	DefaultMinBackoff = 50 * time.Millisecond
	DefaultMaxBackoff = 2 * time.Second
)

// Backoff is a reader's wait between attempts to reach its engine: it
// doubles from Min to Max, and each wait is drawn from [d/2, d] so that
// the replicas' readers do not retry in step. The zero value waits from
// DefaultMinBackoff to DefaultMaxBackoff. It is not safe for concurrent
// use: each reader has its own.
type Backoff struct {
	Min, Max time.Duration // 0: the defaults
	d        time.Duration
}

// Next returns the next wait and doubles the one after it.
func (b *Backoff) Next() time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = DefaultMinBackoff
	}
	if hi <= 0 {
		hi = DefaultMaxBackoff
	}
	b.d = min(max(2*b.d, lo), hi)
	return b.d/2 + rand.N(b.d/2+1)
}

// Reset starts the next wait from Min again: call it after a success.
func (b *Backoff) Reset() { b.d = 0 }

// Sleep waits Next, at most limit when limit is positive (what is left of
// an outage bound, say). It reports false, at once, when ctx ends first.
func (b *Backoff) Sleep(ctx context.Context, limit time.Duration) bool {
	d := b.Next()
	if limit > 0 {
		d = min(d, limit)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
