package main

import (
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/ssebus/eventbus/internal/daemontest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Issue 32: with -max-event-bytes 1 MiB and -max-total-bytes 16 MiB,
// clients that open multiplexed streams of 32 sessions with a 4 KiB
// receive buffer and never read, while 5 events of 500 KB are published
// to every session after each stream opens, took the daemon from 102 to
// 535 MB of RSS over 8 HTTP/1.1 connections (285 MB over one h2c
// connection with 4 streams), against a logged limit of 203 MiB: the
// budget counted rings, while every stalled stream's queues held frames
// the rings had dropped. The budget now counts them and sheds the
// subscribers that hold them, so the peak stays under the limit the
// daemon logs, however many streams stall.
func TestStalledMultiplexedStreamsStayWithinTheLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := daemontest.Build(ctx, t, "../..", false) // RSS of the daemon as shipped, not of a race build
	rounds := 8
	if testing.Short() {
		rounds = 4
	}
	for _, tc := range []struct {
		name string
		h2   bool
	}{{"http1", false}, {"h2c", true}} {
		t.Run(tc.name, func(t *testing.T) {
			d := daemontest.Start(ctx, t, bin, "-max-event-bytes", "1048576", "-max-total-bytes", "16777216")
			limit := loggedLimit(t, d.LogText())
			res, err := run(ctx, config{
				base: d.Base, pid: d.PID(), sessions: 32, rounds: rounds, perRound: 5, eventBytes: 500_000,
				h2: tc.h2, rcvbuf: 4096, settle: 500 * time.Millisecond,
			})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range res.Rounds {
				t.Logf("round %d: peak RSS %d MiB", r.Round, r.PeakRSS>>20)
			}
			t.Logf("peak RSS %d MiB against the logged limit of %d MiB", res.PeakRSS>>20, limit>>20)
			if res.PeakRSS > limit {
				t.Errorf("peak RSS %d MiB, above the daemon's memory limit of %d MiB", res.PeakRSS>>20, limit>>20)
			}
			if !regexp.MustCompile(`subscriber shed by the memory budget`).MatchString(d.LogText()) {
				t.Error("no subscriber was shed: the attack did not press on the budget")
			}
			d.Stop(10 * time.Second)
		})
	}
}

// loggedLimit returns the memory limit the daemon logged at start.
func loggedLimit(t *testing.T, logs string) int64 {
	m := regexp.MustCompile(`msg="memory limit from the budget" bytes=(\d+)`).FindStringSubmatch(logs)
	if m == nil {
		t.Fatalf("no memory limit in the daemon's log:\n%s", logs)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
