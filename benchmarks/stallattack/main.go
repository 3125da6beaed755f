// Command stallattack is issue 32's memory attack on a daemon's
// multiplexed streams: clients open GET /events?session=s0…s(n-1) with a
// small receive buffer and never read, and after each one opens, events
// are published to every session; it prints the daemon's peak resident
// memory after each round. Run it against a running cmd/sessiond:
//
//	go run ./stallattack -addr 127.0.0.1:8080 -pid $(pgrep sessiond) [-h2]
//
// The test (stallattack_test.go) starts the daemon itself with the issue's
// flags and checks the peak against the memory limit the daemon logs.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"
)

func main() {
	var c config
	addr := flag.String("addr", "127.0.0.1:8080", "the daemon's address")
	flag.IntVar(&c.pid, "pid", 0, "the daemon's process id (for its RSS; required)")
	flag.IntVar(&c.sessions, "sessions", 32, "sessions per stream")
	flag.IntVar(&c.rounds, "rounds", 8, "stalled streams, one per round")
	flag.IntVar(&c.perRound, "events", 5, "events published to every session per round")
	flag.IntVar(&c.eventBytes, "event-bytes", 500_000, "bytes of each event")
	flag.BoolVar(&c.h2, "h2", false, "open the streams on one h2c connection")
	flag.BoolVar(&c.single, "single", false, "open single-session streams of s0 instead")
	flag.IntVar(&c.rcvbuf, "rcvbuf", 4096, "the clients' SO_RCVBUF")
	flag.DurationVar(&c.settle, "settle", time.Second, "RSS watched after each round's publishes")
	flag.Parse()
	if c.pid == 0 {
		fmt.Fprintln(os.Stderr, "stallattack: -pid is required")
		os.Exit(2)
	}
	c.base = "http://" + *addr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := run(ctx, c)
	for _, r := range res.Rounds {
		fmt.Printf("round %d: peak RSS %d MiB\n", r.Round, r.PeakRSS>>20)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "stallattack:", err)
		os.Exit(1)
	}
	fmt.Printf("peak RSS %d MiB\n", res.PeakRSS>>20)
}
