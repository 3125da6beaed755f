package eventbus

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkFanoutIter is BenchmarkFanout's eventbus case with consumers
// ranging over Events instead of AppendReady.
func BenchmarkFanoutIter(b *testing.B) {
	for _, subs := range benchSizes {
		b.Run(fmt.Sprintf("subs=%d", subs), func(b *testing.B) {
			bus, err := New(Options{MaxSubscribers: subs, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			counts := make([]atomic.Int64, subs)
			done := make(chan struct{}, subs)
			for i := range counts {
				s, err := bus.Subscribe(context.Background(), SubscribeOptions{MaxQueued: benchQueue})
				if err != nil {
					b.Fatal(err)
				}
				go func() {
					for f := range s.Events() {
						if f.ID() != 0 {
							counts[i].Add(1)
						}
					}
					done <- struct{}{}
				}()
			}
			got := func(i int) int64 { return counts[i].Load() }
			ev := Event{Type: "bench", Data: benchData}
			b.ReportAllocs()
			var n int64
			start := time.Now()
			for b.Loop() {
				if _, err := bus.Publish(ev); err != nil {
					b.Fatal(err)
				}
				n++
				if n%flowWindow == 0 {
					waitAll(n-flowLag, got, subs)
				}
			}
			waitAll(n, got, subs)
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(n*int64(subs)), "ns/delivery")
			bus.Close()
			for range subs {
				<-done
			}
		})
	}
}
