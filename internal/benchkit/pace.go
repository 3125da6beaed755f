package benchkit

import (
	"os"
	"runtime"
	"strings"
	"time"
)

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
