package daemon

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/ssebus/eventbus"
)

// NewFlags returns a flag set named name with the shared flags defined on
// it, described as docs says where the daemons differ, and the Flags they
// are stored in; the daemon defines its own flags on fs, then calls Parse.
// The flag set returns parse errors (and flag.ErrHelp for -h) instead of
// exiting, and writes its messages to out; its Usage prints usage, then
// the defaults of every flag.
func NewFlags(name, usage string, out io.Writer, docs FlagDocs) (fs *flag.FlagSet, f *Flags) {
	fs = flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	f = new(Flags)
	f.register(fs, docs)
	return fs, f
}

// Parse parses args with fs. Positional arguments are refused: Parse
// prints the usage and returns an error naming them. A -h returns
// flag.ErrHelp, as fs.Parse does.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	return nil
}

// Flags are the flags both daemons take, as NewFlags defines them; their
// values are valid once the flag set has parsed the arguments.
// A zero size or duration means the default of package eventbus or of its
// Handler.
type Flags struct {
	Addr            string        // -addr: listen address
	RingSize        int           // -ring: events kept per session for resumes
	MaxSubscribers  int           // -max-subscribers: concurrent streams per session
	MaxQueued       int           // -max-queued: per-stream live frame backlog
	MaxEventBytes   int           // -max-event-bytes: largest encoded event a POST may publish
	Heartbeat       time.Duration // -heartbeat: SSE heartbeat interval
	Retry           time.Duration // -retry: SSE retry: directive
	WriteTimeout    time.Duration // -write-timeout: deadline of one SSE write+flush
	Demo            bool          // -demo: publish "tick" events to session DemoSession
	DemoInterval    time.Duration // -demo-interval: interval between demo ticks
	ShutdownTimeout time.Duration // -shutdown-timeout: how long shutdown waits for open requests
	// -idempotency-window: how long an Idempotency-Key of a POST is
	// remembered (0: DefaultIdempotencyWindow)
	IdempotencyWindow time.Duration
	Verbose           bool // -v: debug logging
}

// FlagDocs is what the daemons say differently about the shared flags.
type FlagDocs struct {
	DefaultAddr    string // default of -addr
	Ring           string // help of -ring
	MaxSubscribers string // help of -max-subscribers
	WriteTimeout   string // help of -write-timeout
}

// register defines the shared flags on fs, storing into f.
func (f *Flags) register(fs *flag.FlagSet, docs FlagDocs) {
	fs.StringVar(&f.Addr, "addr", docs.DefaultAddr, "listen address")
	fs.IntVar(&f.RingSize, "ring", 0, docs.Ring)
	fs.IntVar(&f.MaxSubscribers, "max-subscribers", 0, docs.MaxSubscribers)
	fs.IntVar(&f.MaxQueued, "max-queued", 0, "per-stream live frame backlog (0: eventbus default 256)")
	fs.IntVar(&f.MaxEventBytes, "max-event-bytes", 0, "largest encoded event a POST may publish (0: eventbus default 16 MiB)")
	fs.DurationVar(&f.Heartbeat, "heartbeat", 0, "SSE heartbeat after this long without a write (0: handler default 15s)")
	fs.DurationVar(&f.Retry, "retry", 0, "SSE retry: directive sent to clients (0: handler default 3s)")
	fs.DurationVar(&f.WriteTimeout, "write-timeout", 0, docs.WriteTimeout)
	fs.BoolVar(&f.Demo, "demo", false, `publish "tick" events to session "`+DemoSession+`"`)
	fs.DurationVar(&f.DemoInterval, "demo-interval", 500*time.Millisecond, "interval between demo ticks")
	fs.DurationVar(&f.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "how long shutdown waits for open requests")
	fs.DurationVar(&f.IdempotencyWindow, "idempotency-window", 0, "how long a POST's Idempotency-Key is remembered (0: 10m)")
	fs.BoolVar(&f.Verbose, "v", false, "debug logging")
}

// Logger returns a text logger writing to out: at Debug level with -v,
// else at Info.
func (f *Flags) Logger(out io.Writer) *slog.Logger {
	level := slog.LevelInfo
	if f.Verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level}))
}

// BusOptions returns the bus options the flags set (ring size, subscriber
// and queue limits, event size limit), logging to logger. The options are
// not validated here; eventbus.New does that.
func (f *Flags) BusOptions(logger *slog.Logger) eventbus.Options {
	return eventbus.Options{
		RingSize:       f.RingSize,
		MaxSubscribers: f.MaxSubscribers,
		MaxQueued:      f.MaxQueued,
		MaxEventBytes:  f.MaxEventBytes,
		Logger:         logger,
	}
}
