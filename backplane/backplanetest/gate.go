package backplanetest

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Gate holds a replica's readers, so that a check can make the replica
// lag behind the log (a resume on it, a trim past its reader, a Delete or
// a lost log it has not noticed). A harness installs one Gate per replica:
// its Wait is the hook every reader of the backplane calls before it
// reads the log, before it appends what it read, and before it checks the
// session's epoch. Create it with NewGate; it is open until Hold, and
// safe for concurrent use.
type Gate struct {
	// Poke, when set, wakes the reader of session (one that sleeps until
	// the engine notifies it of a new event), so that Hold need not wait
	// for one. Set it before the gate is used.
	Poke func(session string)

	mu     sync.Mutex
	ch     chan struct{} // nil: open
	parked chan string
}

// NewGate returns an open gate.
func NewGate() *Gate { return &Gate{parked: make(chan string, 64)} }

// Wait is the readers' hook: while the gate is held it blocks until
// Release or until ctx ends (the reader is stopping); it returns at once
// while the gate is open.
func (g *Gate) Wait(ctx context.Context, session string) {
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case g.parked <- session:
	default:
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// Hold closes the gate and returns once a reader of session has parked
// in Wait: from then on that reader feeds its mirror nothing and checks
// no epoch until Release. It fails t when no reader of session parks
// within 10 s.
func (g *Gate) Hold(t testing.TB, session string) {
	t.Helper()
	g.mu.Lock()
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
	g.mu.Unlock()
	for drained := false; !drained; {
		select {
		case <-g.parked:
		default:
			drained = true
		}
	}
	if g.Poke != nil {
		g.Poke(session)
	}
	deadline := time.After(wait)
	for {
		select {
		case p := <-g.parked:
			if p == session {
				return
			}
		case <-deadline:
			t.Fatalf("the reader of session %q did not park in the gate within %v", session, wait)
		}
	}
}

// Release opens the gate: every parked reader goes on. Idempotent.
func (g *Gate) Release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
}
