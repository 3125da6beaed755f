package eventbus

import (
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
)

// A ReadyGroup is one wake-up shared by several subscriptions, so that one
// goroutine serves all of them, waiting on a single channel instead of a
// select over their Ready channels (what the multiplexed stream,
// MuxHandler, does). A subscription joins a group when it is made, with
// SubscribeOptions.Group; its Ready then returns the group's channel.
//
// The protocol is each subscription's own, with one channel for all: a
// member signals the group when frames may be ready for it and its
// consumer had found it empty (its last TakeReady or AppendReady returned
// no frames), and when it ends. So the consumer takes from every member
// until a take returns no frames, then waits on Ready, then takes from the
// members Woken names, again until their takes return nothing. A member
// whose last take returned frames is not signalled again: take from it
// before waiting. A wake-up can be stale (the frames were taken already);
// none is ever lost. Signalling costs a member an atomic OR beside the
// channel send it does anyway, and no lock.
//
// Every member of a group must be consumed by one goroutine, the group's:
// do not use Events on a member, and do not wait on Ready for one member
// while another goroutine consumes the others. Make a group with
// NewReadyGroup; its zero value is not usable. Subscribe, Ready and Woken
// are safe to call concurrently; a group is never closed, and is
// collected with its members.
type ReadyGroup struct {
	ready chan struct{}
	marks []atomic.Uint64 // bit i of word i/64: member i signalled
	// Member i is in chunks[i/groupChunk], a chunk allocated by the first
	// join that needs it and never replaced, so that a group sized for
	// many members (a stream that sessions may be added to) costs what
	// its members use: a pointer per member it may have, a chunk per 8 it
	// has had at once.
	chunks []atomic.Pointer[[groupChunk]atomic.Pointer[Subscription]]
	size   int
	mu     sync.Mutex // joining
	n      int        // members joined, under mu
}

// groupChunk is how many members a chunk of a ReadyGroup holds.
const groupChunk = 8

// NewReadyGroup returns a group for at most size subscriptions. A
// Subscribe that would make it larger fails with ErrInvalidOption. size
// must be positive (it panics otherwise: it is the caller's constant).
func NewReadyGroup(size int) *ReadyGroup {
	if size <= 0 {
		panic("eventbus: NewReadyGroup size must be positive")
	}
	return &ReadyGroup{
		ready:  make(chan struct{}, 1),
		marks:  make([]atomic.Uint64, (size+63)/64),
		chunks: make([]atomic.Pointer[[groupChunk]atomic.Pointer[Subscription]], (size+groupChunk-1)/groupChunk),
		size:   size,
	}
}

// slot returns the place of member i, nil when its chunk has not been
// allocated (no member ever had a number in it).
func (g *ReadyGroup) slot(i int) *atomic.Pointer[Subscription] {
	if c := g.chunks[i/groupChunk].Load(); c != nil {
		return &c[i%groupChunk]
	}
	return nil
}

// Ready returns the channel that receives a value when a member may have
// frames ready or has ended (see the type for when). It is never closed.
func (g *ReadyGroup) Ready() <-chan struct{} { return g.ready }

// Woken appends to dst the number of every member that signalled since
// the last call to Woken, in increasing order, and returns the extended
// slice; it clears their signals. Members are numbered from 0 in the order
// their Subscribe calls joined the group (so a consumer that subscribes
// one after another knows each number), and Member returns the member of
// a number. Call Woken after a receive from Ready (and at any other time:
// it never blocks). A member appears at most once per call; one that
// ended is still named, once per signal, so that its consumer takes its
// last frames and learns its end.
func (g *ReadyGroup) Woken(dst []int) []int {
	for w := range g.marks {
		if g.marks[w].Load() == 0 {
			continue
		}
		for m := g.marks[w].Swap(0); m != 0; m &= m - 1 {
			if i := w*64 + bits.TrailingZeros64(m); g.Member(i) != nil {
				dst = append(dst, i)
			}
		}
	}
	return dst
}

// Member returns member i (see Woken), nil when there is none: i out of
// range, not joined yet, or given back by a Subscribe that failed.
func (g *ReadyGroup) Member(i int) *Subscription {
	if i < 0 || i >= g.size {
		return nil
	}
	if p := g.slot(i); p != nil {
		return p.Load()
	}
	return nil
}

// mark records that member i signalled. The mark is set before the token
// is sent (boundedAsyncQueue.wake), so a consumer that receives a token
// and then calls Woken sees every mark made before that token was sent.
func (g *ReadyGroup) mark(i int) { g.marks[i/64].Or(1 << (i % 64)) }

// join makes s a member, before it is registered with its bus (a push may
// signal it as soon as it is), at the lowest number no member holds. It
// returns an error wrapping ErrInvalidOption when the group is full.
func (g *ReadyGroup) join(s *Subscription) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	i := 0
	for i < g.n && g.Member(i) != nil {
		i++
	}
	if i == g.size {
		return fmt.Errorf("%w: ReadyGroup is full (%d members)", ErrInvalidOption, g.size)
	}
	p := g.slot(i)
	if p == nil {
		c := new([groupChunk]atomic.Pointer[Subscription])
		g.chunks[i/groupChunk].Store(c)
		p = &c[i%groupChunk]
	}
	s.q.group, s.q.member, s.q.ready = g, i, g.ready
	p.Store(s)
	g.n = max(g.n, i+1)
	return nil
}

// leave gives back the number of s, a member that Subscribe did not
// return (a full bus) or whose consumer is done with it (a Stream's
// Remove, once s is closed: a closed subscription signals no more), to the
// next member to join. A mark s left is a stale wake-up of that member.
func (g *ReadyGroup) leave(s *Subscription) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if p := g.slot(s.q.member); p != nil && p.Load() == s {
		p.Store(nil)
		for g.n > 0 && g.Member(g.n-1) == nil {
			g.n--
		}
	}
}
