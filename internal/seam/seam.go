// Package seam is the one door between package eventbus and package
// backplane: what a backplane does to a bus and no daemon does (make a
// mirror of a shared log, feed it, close it with an error kind, encode an
// event without an id). docs/SPEC.md section 8.2 is its contract.
//
// Package eventbus keeps all of it unexported, where it was (a mirror's
// owner, the feed, the append's ring logic, the encoder), and at init it
// lends its functions over those internals (Lend). Package backplane
// borrows them once (Borrow) and exposes them as its own typed, documented
// API: NewMirror, Append, CloseWithError, Encoder, and the types of this
// package under their public names (LogEntry, HistoryRequest, Log,
// MirrorOptions, EncodedEvent). Nothing else imports this package; the
// engines (redisbus, pgbus, natsbus) build on package backplane's
// exported API only (.ci/no-internal.sh).
//
// This package can import neither side (package eventbus imports it, and
// package backplane imports eventbus), so the root's own types (its bus,
// its options, its event) are type parameters here: fixed by the one call
// to Lend, and checked by Borrow, which panics at backplane's init when
// they differ. The data types below have no such parameter: backplane
// declares its own with the same fields and converts.
package seam

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Entry is one already-numbered event of a shared log (backplane.LogEntry).
type Entry struct {
	ID   uint64
	Type string
	JSON []byte
}

// HistoryRequest asks a Log for the entries of a resume
// (backplane.HistoryRequest).
type HistoryRequest struct {
	After, Upto uint64
	MaxBytes    int
}

// Log is a shared log as a mirror reads it (backplane.Log; backplane
// adapts an engine's Log to this one).
type Log interface {
	ReadHistory(ctx context.Context, req HistoryRequest) (entries []Entry, first uint64, err error)
	Head(ctx context.Context) (epoch string, last uint64, err error)
}

// DefaultLagTimeout is what a LagTimeout of 0 means
// (backplane.DefaultLagTimeout).
const DefaultLagTimeout = 2 * time.Second

// MirrorOptions configures a mirror (backplane.MirrorOptions). Log nil
// means the ring only (backplane passes a nil Log as nil, never as an
// adapter of nil).
type MirrorOptions struct {
	Epoch      string
	NextID     uint64
	Log        Log
	LagTimeout time.Duration
}

// Encoded is an event encoded without its id (backplane.EncodedEvent).
type Encoded struct {
	Type string
	Tail []byte
}

// Envelope returns the complete JSON envelope of e numbered id:
// {"id":id followed by Tail.
func (e Encoded) Envelope(id uint64) []byte {
	const head = `{"id":`
	b := make([]byte, 0, len(head)+20+len(e.Tail))
	b = strconv.AppendUint(append(b, head...), id, 10)
	return append(b, e.Tail...)
}

// Encoder is package eventbus's encoder of events (backplane.Encoder),
// over its Event type.
type Encoder[Event any] interface {
	Encode(e Event) (Encoded, error)
	Fingerprint(e Event) (string, error)
	CheckSignal(typ, about string) error
}

// ErrMirror is what a mirror's Publish returns, and Append on a bus that
// is no mirror (backplane.ErrMirror, which is this value).
var ErrMirror = errors.New("backplane: bus is a mirror of a shared log; publish through its backplane")

// Root is what package eventbus lends package backplane, over its bus,
// options and event types. Each function is the unexported implementation
// of the backplane function of the same name; their contracts are in
// package backplane.
type Root[Bus, Options, Event any] struct {
	NewMirror      func(opts Options, mo MirrorOptions) (Bus, error)
	Append         func(mirror Bus, e Entry) error
	CloseWithError func(bus Bus, kind, message string) error
	NewEncoder     func(opts Options) (Encoder[Event], error)
}

var lent any // a Root, set once by Lend

// Lend is called once, by package eventbus's init.
func Lend[Bus, Options, Event any](r Root[Bus, Options, Event]) {
	if lent != nil {
		panic("seam: Lend called twice")
	}
	lent = r
}

// Borrow returns what package eventbus lent, for package backplane's
// package-level variables: package eventbus, which backplane imports, has
// run its init by then. It panics when nothing was lent or the types
// differ from those of Lend.
func Borrow[Bus, Options, Event any]() Root[Bus, Options, Event] {
	r, ok := lent.(Root[Bus, Options, Event])
	if !ok {
		panic(fmt.Sprintf("seam: Borrow[%T, %T, %T] finds %T lent", *new(Bus), *new(Options), *new(Event), lent))
	}
	return r
}
