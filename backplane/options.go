package backplane

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/ssebus/eventbus"
)

// Durations defaults and checks the duration options of a backplane's
// constructor, in the order they are given; Err reports the first invalid
// one. The zero value is ready; it is not safe for concurrent use.
type Durations struct{ err error }

// Check sets *v to def when it is 0, then records an error wrapping
// eventbus.ErrInvalidOption when *v is negative or (with min set) below
// min.
func (d *Durations) Check(name string, v *time.Duration, def, min time.Duration) {
	if d.err != nil {
		return
	}
	switch {
	case *v < 0:
		d.err = fmt.Errorf("%w: %s is %v, must not be negative", eventbus.ErrInvalidOption, name, *v)
		return
	case *v == 0:
		*v = def
	}
	if *v < min {
		d.err = fmt.Errorf("%w: %s is %v, below %v", eventbus.ErrInvalidOption, name, *v, min)
	}
}

// Err returns the first error Check recorded, or nil.
func (d *Durations) Err() error { return d.err }

// Bus is what a backplane derives from its bus options (PrepareBus): the
// options of every mirror, its logger, the encoder of published events,
// and the bounds of its log, which the engine trims a session's log to.
type Bus struct {
	Options  eventbus.Options // every mirror's; Logger is set
	Log      *slog.Logger
	Encoder  *Encoder
	MaxLen   int // events a session's log keeps (the ring's RingSize)
	MaxBytes int // bytes a session's log keeps (RingMaxBytes)
	MaxEvent int // the largest encoded event (MaxEventBytes)
}

// PrepareBus completes a backplane's bus options in place and returns
// what the backplane derives from them: ringSize, when set, overrides
// opts.RingSize (a module's Options.RingSize); logger, else opts.Logger,
// else slog.Default() is the backplane's logger and the default of
// opts.Logger. It fails with NewEncoder's error (wrapping
// eventbus.ErrInvalidOption) when opts is invalid.
func PrepareBus(opts *eventbus.Options, ringSize int, logger *slog.Logger) (Bus, error) {
	if ringSize != 0 {
		opts.RingSize = ringSize
	}
	log := logger
	if log == nil {
		log = opts.Logger
	}
	if log == nil {
		log = slog.Default()
	}
	if opts.Logger == nil {
		opts.Logger = log
	}
	enc, err := NewEncoder(*opts) // validates opts
	if err != nil {
		return Bus{}, err
	}
	return Bus{
		Options:  *opts,
		Log:      log,
		Encoder:  enc,
		MaxLen:   orInt(opts.RingSize, eventbus.DefaultRingSize),
		MaxBytes: orInt(opts.RingMaxBytes, eventbus.DefaultRingMaxBytes),
		MaxEvent: orInt(opts.MaxEventBytes, eventbus.DefaultMaxEventBytes),
	}, nil
}

func orInt(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}
