package daemon

import (
	"log/slog"
	"runtime/debug"

	"github.com/ssebus/eventbus"
)

// MemoryReserve is what MemoryBudget.Limit adds for what no flag bounds:
// the runtime's own memory (goroutine stacks, GC metadata), the
// connections' buffers and the sessions' fixed costs.
const MemoryReserve = 32 << 20

// MemoryBudget is what a daemon's flags let its clients make it hold in
// memory, in bytes, from which Server.Run sets the Go runtime's soft memory
// limit (see Limit). The zero value of a field counts nothing.
type MemoryBudget struct {
	// Rings bounds the replay rings' bytes together, at what each frame
	// costs: sessiond's -max-total-bytes (HubOptions.MaxTotalBytes), which
	// also counts what streams hold beyond the rings (a frame queued for a
	// stream after the budget trimmed it from its ring), however many
	// streams there are, and the sessions' Idempotency-Keys (docs/SPEC.md
	// section 7). A replica has no such bound: it keeps a ring for every
	// session it mirrors, so it counts one full ring (Options.RingMaxBytes).
	Rings int64
	// Subscribers and QueuedBytes are, for a replica, the streams provided
	// for and one stream's byte cap (-max-subscribers, the cap of one
	// session, and Options.MaxQueuedBytes): a frame its ring dropped lives
	// on until the stream takes it, up to QueuedBytes per stream. A Hub's
	// daemon counts none: its budget holds them (see Rings).
	Subscribers int
	QueuedBytes int64
	// Bodies bounds the request body bytes read at once (Limits.BodyBudget,
	// its default when 0 in Server.Run). A body is held once until its
	// event is encoded; the frame it becomes counts toward Rings.
	Bodies int64
}

// Limit returns the soft memory limit of the budget: its sum, an eighth
// more, and MemoryReserve,
//
//	sum   = Rings + Subscribers*QueuedBytes + Bodies
//	limit = sum + sum/8 + MemoryReserve
//
// The eighth is the collector's room: a live heap at the sum leaves it
// that much to allocate before it must collect again. The limit is no cap
// (debug.SetMemoryLimit): past it the collector runs more often, never more
// than about half the CPU, and the heap grows on. Below it the collector
// paces itself as GOGC says, so the heap, which without a limit grows to
// twice what is live, stays under the limit.
func (m MemoryBudget) Limit() int64 {
	sum := m.Rings + int64(m.Subscribers)*m.QueuedBytes + m.Bodies
	return sum + sum/8 + MemoryReserve
}

// HubMemoryBudget returns the memory budget of a daemon whose sessions live
// in a Hub of budget bytes (HubOptions.MaxTotalBytes): the budget, which
// counts the rings and what streams hold beyond them, and -body-budget (0:
// Server.Run's default). What each stream costs by itself (its goroutine,
// its buffers, a batch it holds while its write blocks: at most 256 KiB of
// envelopes or one larger frame) is outside: the reserve's.
func (f *Flags) HubMemoryBudget(budget int64) *MemoryBudget {
	return &MemoryBudget{Rings: budget, Bodies: f.BodyBudget}
}

// MemoryBudget returns the memory budget of a replica's flags with rings as
// its Rings: -max-subscribers (its default when 0), the default per-stream
// byte cap (no flag sets it), and -body-budget (0: Server.Run's default).
func (f *Flags) MemoryBudget(rings int64) *MemoryBudget {
	subs := f.MaxSubscribers
	if subs == 0 {
		subs = eventbus.DefaultMaxSubscribers
	}
	return &MemoryBudget{Rings: rings, Subscribers: subs, QueuedBytes: eventbus.DefaultMaxQueuedBytes, Bodies: f.BodyBudget}
}

// setMemoryLimit sets the runtime's soft memory limit to m's Limit unless
// GOMEMLIMIT is set in the environment (lookupEnv), in which case the
// runtime has applied it and it stays. It logs the limit and where it came
// from, and returns a func that puts the previous limit back.
func setMemoryLimit(logger *slog.Logger, m MemoryBudget, lookupEnv func(string) (string, bool)) (restore func()) {
	if v, ok := lookupEnv("GOMEMLIMIT"); ok && v != "" {
		logger.Info("memory limit from GOMEMLIMIT", "GOMEMLIMIT", v, "bytes", debug.SetMemoryLimit(-1))
		return func() {}
	}
	limit := m.Limit()
	prev := debug.SetMemoryLimit(limit)
	logger.Info("memory limit from the budget", "bytes", limit, "MiB", limit>>20,
		"rings", m.Rings, "subscribers", m.Subscribers, "queuedBytes", m.QueuedBytes, "bodies", m.Bodies,
		"formula", "sum = rings + subscribers*queuedBytes + bodies; limit = sum + sum/8 + 32 MiB")
	return func() { debug.SetMemoryLimit(prev) }
}
