package main

import (
	"bytes"
	"regexp"
	"runtime"
	"runtime/trace"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// analyzed traces run, analyzes the trace (a wait over a second is late)
// and returns the numbers that pattern's groups match in the report, and
// the report.
func analyzed(t *testing.T, run func(), gap time.Duration, minWaits int, pattern string) ([]int, string) {
	t.Helper()
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Fatal(err)
	}
	run()
	trace.Stop()
	var out bytes.Buffer
	if err := analyze(&buf, &out, time.Second, gap, minWaits); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(pattern).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no match for %q in:\n%s", pattern, out.String())
	}
	n := make([]int, len(m)-1)
	for i, s := range m[1:] {
		n[i], _ = strconv.Atoi(s)
	}
	return n, out.String()
}

// TestAnalyze traces a goroutine woken 2000 times through a channel and
// checks what analyze makes of it: that goroutine listed, its wake-ups
// counted as woken from a wait, none late by a second.
func TestAnalyze(t *testing.T) {
	n, out := analyzed(t, func() {
		ch := make(chan struct{})
		done := make(chan struct{})
		go func() {
			for range ch {
			}
			close(done)
		}()
		for range 2000 {
			ch <- struct{}{}
		}
		close(ch)
		<-done
	}, time.Second, 1000, `runnable at least 1000 times: (\d+); waits \d+, late \(over 1s\) 0; woken from a wait (\d+)`)
	if gs, woken := n[0], n[1]; gs < 1 || woken < 1000 {
		t.Errorf("%d goroutines, %d wake-ups from a wait; want the receiver's 2000 or so:\n%s", gs, woken, out)
	}
	if err := analyze(bytes.NewReader([]byte("not a trace")), &bytes.Buffer{}, time.Second, time.Second, 1); err == nil {
		t.Error("no error for a file that is not a trace")
	}
}

// TestAnalyzeFindsASilentP keeps the only P busy in a loop that records
// nothing, for 30 ms, while a goroutine it started waits in its run queue:
// analyze must report a silent stretch of that P with the goroutine
// stranded in it.
func TestAnalyzeFindsASilentP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	n, out := analyzed(t, func() {
		done := make(chan struct{})
		go close(done) // runnable on our P, which it cannot have until preempted
		for start := time.Now(); time.Since(start) < 30*time.Millisecond; {
		}
		<-done
	}, 3*time.Millisecond, 1, `no event on a running P: (\d+), .*; (\d+) of them with goroutines waiting in its queue`)
	if stretches, stranding := n[0], n[1]; stretches < 1 || stranding < 1 {
		t.Errorf("%d silent stretches, %d with a goroutine waiting; want the loop's, with the goroutine it started:\n%s", stretches, stranding, out)
	}
}
