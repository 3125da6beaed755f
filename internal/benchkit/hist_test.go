package benchkit

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestQuantiles(t *testing.T) {
	var h Hist
	if h.Quantile(0.5) != 0 {
		t.Fatal("an empty histogram has no quantile")
	}
	for i := 1; i <= 1000; i++ {
		h.Add(int64(i) * int64(time.Microsecond))
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 500 * time.Microsecond}, {0.99, 990 * time.Microsecond}, {0.999, 999 * time.Microsecond}} {
		got := h.Quantile(c.q)
		if got > c.want || float64(got) < 0.88*float64(c.want) {
			t.Errorf("q%.3f = %v, want %v within 12%% below", c.q, got, c.want)
		}
	}
	var o Hist
	o.Add(0) // counts as 1 ns
	o.Merge(&h)
	if o.Quantile(0.0001) != 1 {
		t.Errorf("the smallest bucket: %v", o.Quantile(0.0001))
	}
}

func TestMaxAndAbove(t *testing.T) {
	var h Hist
	if h.Max() != 0 || h.Above(time.Millisecond) != 0 {
		t.Fatal("an empty Hist has no max and nothing above")
	}
	for range 99 {
		h.Add(int64(50 * time.Microsecond))
	}
	h.Add(int64(3 * time.Millisecond))
	if m := h.Max(); m > 3*time.Millisecond || m < 3*time.Millisecond*7/8 {
		t.Errorf("Max %v, want 3ms within a bucket", m)
	}
	if a := h.Above(time.Millisecond); a != 0.01 {
		t.Errorf("Above(1ms) %v, want 0.01", a)
	}
}

func TestPace(t *testing.T) {
	base := time.Now()
	Pace(base, 2*time.Millisecond, false)
	if time.Since(base) < 2*time.Millisecond {
		t.Fatal("spin returned early")
	}
	base = time.Now()
	Pace(base, 1500*time.Microsecond, true)
	if time.Since(base) < 2*time.Millisecond {
		t.Fatal("a burst pace sleeps to the next millisecond after due")
	}
	for _, p := range []Pacer{Spin, Burst, Sleep, Yield} {
		base = time.Now()
		Wait(base, time.Millisecond, p)
		if time.Since(base) < time.Millisecond {
			t.Fatalf("%v returned early", p)
		}
	}
}
