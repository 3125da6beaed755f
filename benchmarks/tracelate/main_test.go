package main

import (
	"bytes"
	"regexp"
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
