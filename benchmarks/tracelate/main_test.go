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

// TestAnalyze traces a goroutine woken 2000 times through a channel and
// checks what analyze makes of it: that goroutine listed, its wake-ups
// counted as woken from a wait, none late by a second.
func TestAnalyze(t *testing.T) {
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Fatal(err)
	}
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
	trace.Stop()

	var out bytes.Buffer
	if err := analyze(&buf, &out, time.Second, time.Second, 1000); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`runnable at least 1000 times: (\d+); waits (\d+), late \(over 1s\) 0; woken from a wait (\d+)`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no summary line in:\n%s", out.String())
	}
	gs, _ := strconv.Atoi(m[1])
	woken, _ := strconv.Atoi(m[3])
	if gs < 1 || woken < 1000 {
		t.Errorf("%d goroutines, %d wake-ups from a wait; want the receiver's 2000 or so:\n%s", gs, woken, out.String())
	}
	if err := analyze(bytes.NewReader([]byte("not a trace")), &out, time.Second, time.Second, 1); err == nil {
		t.Error("no error for a file that is not a trace")
	}
}

// TestAnalyzeFindsASilentP keeps the only P busy in a loop that records
// nothing, for 30 ms, while a goroutine it started waits in its run queue:
// analyze must report a silent stretch of that P with the goroutine
// stranded in it.
func TestAnalyzeFindsASilentP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go close(done) // runnable on our P, which it cannot have until preempted
	for start := time.Now(); time.Since(start) < 30*time.Millisecond; {
	}
	<-done
	trace.Stop()

	var out bytes.Buffer
	if err := analyze(&buf, &out, time.Second, 3*time.Millisecond, 1); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`no event on a running P: (\d+), .*; (\d+) of them with goroutines waiting in its queue, (\d+) goroutines`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no stretches line in:\n%s", out.String())
	}
	stretches, _ := strconv.Atoi(m[1])
	stranding, _ := strconv.Atoi(m[2])
	if stretches < 1 || stranding < 1 {
		t.Errorf("%d silent stretches, %d with a goroutine waiting; want the loop's, with the goroutine it started:\n%s", stretches, stranding, out.String())
	}
}
