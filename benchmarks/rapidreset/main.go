// Command rapidreset drives the HTTP/2 rapid-reset attack (CVE-2023-44487)
// at a server over h2c, and in its orchestration mode measures what the
// attack leaves in the memory of a daemon it starts (issue 22: a stream
// reset before its first write kept its write deadline's timer, and the
// stream with it, for the whole write timeout).
//
// Usage, from benchmarks/:
//
//	go run ./rapidreset -addr 127.0.0.1:8080 [-path /session/h/events]
//	    [-conns 8] [-rate 31000] [-duration 20s]
//
//	go run ./rapidreset -daemon PATH/TO/sessiond [-daemon-args '-write-timeout 3s']
//	    [-create h] [-after 40s] [-sample 250ms] [-label NAME] [burst flags]
//
// # The burst
//
// -conns h2c connections (HTTP/2 with prior knowledge: the client preface,
// SETTINGS, and a WINDOW_UPDATE that opens the connection's receive window
// to 1 GiB, topped up as the server's DATA arrives). On each, a stream is
// a HEADERS frame of GET -path with END_STREAM and END_HEADERS followed at
// once, in the same write, by RST_STREAM CANCEL for it. The streams are
// paced at -rate a second in all, each connection its share, sent each
// millisecond as they fall due (streams more than 20 ms late are counted
// as missed, not sent in a catch-up burst). A stream counts toward the
// server's SETTINGS_MAX_CONCURRENT_STREAMS from its HEADERS to its reset,
// as in RFC 9113, so one at a time is open: that a reset stream no longer
// counts is what the attack uses. A goroutine per connection reads the
// server's frames with the Framer and discards them, acknowledging
// SETTINGS and PING; on a GOAWAY the connection is replaced (counted), as
// it is on an error (counted apart, the first few kept). After -duration
// each connection sends a PING and waits for its acknowledgement: the
// server has then read every reset before it (the resets "acknowledged").
// The report: resets sent and the achieved rate, acknowledged, missed,
// the server's concurrency limit, dials, GOAWAYs by code, errors, and the
// frames received by type.
//
// # The orchestration mode (-daemon)
//
// Starts the daemon binary with "-addr 127.0.0.1:0" and -daemon-args, with
// GODEBUG=gctrace=1 added to the environment, and reads the address from
// its "listening addr=..." log line. Unless -create is empty it creates
// that session with a POST of an event; after -settle it runs the burst
// against the daemon, sampling VmRSS and VmHWM from /proc/PID/status every
// -sample from the start of the burst to -after past its end. The daemon
// exposes no heap figure (no pprof, no expvar), so its live heap is read
// from outside, in the gctrace lines on its stderr: the third number of
// "A->B->C MB" is what the collection marked live (MiB). A daemon idle
// after the burst allocates too little to collect, so at the end (-nudge)
// this process makes it collect: it POSTs 1 MiB bodies that the daemon
// reads whole and refuses (400, an unknown field) until two collections
// have run, and reads the second's live heap (what a sync.Pool holds
// survives the first; an in-flight body, 1-2 MiB, may count). Then
// SIGQUIT (-dump), at which the Go runtime writes every goroutine's stack
// and exits: the report counts them (a goroutine a reset stream left
// behind would show there); -dump=false sends SIGTERM. The runtime writes
// a gctrace line in pieces and the daemon's log lines can tear it: the
// heap figures are read wherever they are. The report gives the RSS at the
// end of the burst and 1, 5, 10, 20, 30 s and -after after it, the peak
// (VmHWM, which also catches a peak between samples), the collections
// during and after the burst, and a Markdown table row. Linux only.
//
// docs/bench/rapidreset.sh builds cmd/sessiond, and from a commit before
// the fix another one, and runs the cases of issue 22 with this mode.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rapidreset:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out, progress io.Writer) error {
	fs := flag.NewFlagSet("rapidreset", flag.ContinueOnError)
	fs.SetOutput(progress)
	var (
		acfg attackConfig
		dcfg daemonConfig

		daemonArgs string
	)
	fs.StringVar(&acfg.addr, "addr", "", "the server's host:port (h2c); with -daemon, the daemon's")
	fs.StringVar(&acfg.path, "path", "/session/h/events", "the path each stream GETs")
	fs.StringVar(&acfg.authority, "authority", "", "the :authority of each stream (default: the address)")
	fs.IntVar(&acfg.conns, "conns", 8, "connections")
	fs.Float64Var(&acfg.rate, "rate", 31000, "streams opened and reset a second, over all connections")
	fs.DurationVar(&acfg.duration, "duration", 20*time.Second, "how long the burst lasts")
	fs.DurationVar(&acfg.ackTimeout, "ack-timeout", 10*time.Second, "bound of a dial, a write, the server's first SETTINGS and the final PING's acknowledgement")
	fs.StringVar(&dcfg.bin, "daemon", "", "orchestration mode: start this daemon binary (cmd/sessiond built) on a free port, and measure its memory")
	fs.StringVar(&daemonArgs, "daemon-args", "", "with -daemon: its flags, space-separated (e.g. '-write-timeout 3s')")
	fs.StringVar(&dcfg.create, "create", "h", "with -daemon: the session to create with a POST before the burst; empty: none")
	fs.DurationVar(&dcfg.settle, "settle", 2*time.Second, "with -daemon: the wait between creating the session and the burst")
	fs.DurationVar(&dcfg.after, "after", 40*time.Second, "with -daemon: how long the RSS is sampled after the burst")
	fs.DurationVar(&dcfg.sample, "sample", 250*time.Millisecond, "with -daemon: the RSS sampling interval")
	fs.BoolVar(&dcfg.nudge, "nudge", true, "with -daemon: at the end, make the daemon collect twice (POSTs of refused 1 MiB bodies) and report the live heap")
	fs.BoolVar(&dcfg.dump, "dump", true, "with -daemon: end the daemon with SIGQUIT, not SIGTERM, and count the goroutines of the runtime's stack dump")
	fs.StringVar(&dcfg.log, "daemon-log", "", "with -daemon: write the daemon's stderr (its log and gctrace) to this file")
	fs.StringVar(&dcfg.samples, "samples", "", "with -daemon: write the RSS samples to this CSV file")
	fs.StringVar(&dcfg.label, "label", "", "with -daemon: the case's name in the table row (default: the daemon's flags)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if dcfg.bin == "" {
		res, err := attack(ctx, acfg)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%d conns to %s, GET %s, %.0f streams/s for %v\n", acfg.conns, acfg.addr, acfg.path, acfg.rate, acfg.duration)
		fmt.Fprint(out, res.String())
		return nil
	}
	if acfg.addr != "" {
		return errors.New("-addr and -daemon: the daemon listens on a port of its choosing")
	}
	acfg.addr = "127.0.0.1:0" // for validate; replaced by the daemon's
	if err := acfg.validate(); err != nil {
		return err
	}
	if dcfg.sample <= 0 || dcfg.after < 0 || dcfg.settle < 0 {
		return errors.New("-sample must be positive, -after and -settle not negative")
	}
	dcfg.args = strings.Fields(daemonArgs)
	if dcfg.label == "" {
		dcfg.label = "default"
		if daemonArgs != "" {
			dcfg.label = daemonArgs
		}
	}
	r, err := runDaemon(ctx, dcfg, acfg, progress)
	if err != nil {
		return err
	}
	r.write(out, dcfg.after)
	return nil
}
