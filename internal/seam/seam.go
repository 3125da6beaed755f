// Package seam holds the two small seams of package eventbus that a
// backplane (such as the redisbus module) needs and that are not part of the
// public API: where an event's id is assigned, and where replay history is
// read. Package eventbus fills the hooks at init; a backplane imports this
// package (it is internal, so only modules under github.com/ssebus/eventbus
// can) and asserts the concrete types.
//
// Every hook takes and returns package eventbus types as any, because this
// package cannot import eventbus without an import cycle:
//
//	bus   *eventbus.EventBus
//	opts  eventbus.Options
//	event eventbus.Event
//	sub   eventbus.SubscribeOptions, *eventbus.Subscription
package seam

import "context"

// Entry is one already-numbered event of a backplane's log: its id, its
// type and its complete JSON envelope (with "id").
type Entry struct {
	ID   uint64
	Type string
	JSON []byte
}

// History reads a backplane's log for a resume. It returns the entries with
// after < id <= upto that the log still holds, in id order and contiguous,
// and the first id the log holds (0 when it holds none). It is called
// without any bus lock held and may do I/O; ctx is the subscription's.
type History func(ctx context.Context, after, upto uint64) (entries []Entry, first uint64, err error)

var (
	// NewMirror returns a bus (opts eventbus.Options) whose epoch is fixed
	// by the backplane and whose ids are assigned by it: its next id is
	// next. Its own Publish and Signal return an error; the backplane feeds
	// it with Append.
	NewMirror func(opts any, epoch string, next uint64) (bus any, err error)

	// EncodeTail validates and encodes event (eventbus.Event) for bus the
	// way Publish does, without an id: tail is the envelope after its
	// leading `{"id":N`, so `{"id":` + N + tail is the envelope of id N.
	EncodeTail func(bus any, event any) (typ string, tail []byte, err error)

	// Append feeds an already-numbered event to a mirror bus: ring, fan-out,
	// warnings and evictions exactly as Publish. An id below the bus's next
	// id is ignored (a duplicate); an id above it is a gap: every
	// subscriber gets state_resync_required (ring_evicted) first.
	Append func(bus any, e Entry) error

	// Subscribe is EventBus.Subscribe (ctx, opts eventbus.SubscribeOptions)
	// for a resume the bus's ring cannot answer: it registers the
	// subscription, reads history outside the lock, and queues the replay
	// ahead of the live frames that arrived meanwhile, with the resync rules
	// of SPEC 5 answered from the log.
	Subscribe func(bus any, ctx context.Context, opts any, h History) (sub any, err error)
)
