package backplane_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
)

// store is a toy engine's storage: every session's log in this process,
// shared by the replicas. A real engine keeps it in Redis, PostgreSQL,
// JetStream...
type store struct {
	mu   sync.Mutex
	logs map[string]*toyLog
}

type toyLog struct {
	epoch   string
	entries []backplane.LogEntry // ids 1, 2, 3 ...
	changed chan struct{}        // closed and replaced by every append
}

// log returns session's log, creating it (with a new epoch) when asked;
// nil when it has none. The caller holds st.mu.
func (st *store) log(session string, create bool) *toyLog {
	l := st.logs[session]
	if l == nil && create {
		l = &toyLog{epoch: eventbus.NewEpoch(), changed: make(chan struct{})}
		st.logs[session] = l
	}
	return l
}

// session is a replica's mirror of one session: the kit's Session and the
// mirror's backplane.Log.
type session struct {
	backplane.Session
	st *store
}

func (s *session) ReadHistory(_ context.Context, req backplane.HistoryRequest) ([]backplane.LogEntry, uint64, error) {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	l := s.st.log(s.ID, false)
	if l == nil || l.epoch != s.Epoch {
		return nil, 0, fmt.Errorf("toy: session %q lost epoch %s", s.ID, s.Epoch)
	}
	var out []backplane.LogEntry
	for _, e := range l.entries {
		if e.ID > req.After && e.ID <= req.Upto {
			out = append(out, e)
		}
	}
	return out, 1, nil // this toy never trims: its first id is 1
}

func (s *session) Head(context.Context) (string, uint64, error) {
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	if l := s.st.log(s.ID, false); l != nil {
		return l.epoch, uint64(len(l.entries)), nil
	}
	return "", 0, nil
}

// engine is the toy's backplane.Engine.
type engine struct{ st *store }

func (g engine) New(string) *session { return &session{st: g.st} }

func (g engine) Open(_ context.Context, s *session) (backplane.Start, error) {
	g.st.mu.Lock()
	defer g.st.mu.Unlock()
	l := g.st.log(s.ID, true) // atomic: one epoch whichever replica opens first
	return backplane.Start{Epoch: l.epoch, Last: uint64(len(l.entries))}, nil
}

func (g engine) Run(ctx context.Context, s *session, from backplane.Start) {
	last := from.Last
	for {
		g.st.mu.Lock()
		l := g.st.log(s.ID, false)
		if l == nil || l.epoch != s.Epoch {
			g.st.mu.Unlock()
			return // a real engine calls Set.Expire here
		}
		news, changed := l.entries[last:], l.changed
		g.st.mu.Unlock()
		for _, e := range news {
			_ = backplane.Append(s.Bus, e) // in id order
			last = e.ID
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

func (g engine) Epoch(_ context.Context, s *session) (string, error) {
	epoch, _, err := s.Head(context.Background())
	return epoch, err
}

// Backplane is the toy module's API (a real one adds PublishIdempotent,
// Signal, Delete and Info, and runs package backplanetest's suite).
type Backplane struct {
	st  *store
	set *backplane.Set[*session]
}

func newBackplane(st *store) *Backplane {
	bus, err := backplane.PrepareBus(&eventbus.Options{}, 0, nil)
	if err != nil {
		panic(err)
	}
	return &Backplane{st: st, set: backplane.New[*session](backplane.Config{
		Name: "toy", Engine: "Toy", Store: "the store", Bus: bus,
		Timeout: backplane.DefaultLagTimeout, IdleTimeout: backplane.DefaultLagTimeout,
		Valid: func(id string) error {
			if err := eventbus.CheckSessionID(id); err != nil {
				return fmt.Errorf("toy: invalid session id: %w", err)
			}
			return nil
		},
		Unavailable: func(op, session string, err error) error {
			return fmt.Errorf("%w: %s %s: %v", errToyDown, op, session, err)
		},
		ErrUnavailable: errToyDown,
	}, engine{st})}
}

var errToyDown = fmt.Errorf("toy: unavailable")

// Publish assigns the next id in the session's log, whichever replica
// publishes.
func (b *Backplane) Publish(ctx context.Context, session string, e eventbus.Event) (uint64, string, error) {
	p, err := b.set.Prepare(ctx, session, "", e)
	if err != nil {
		return 0, "", err
	}
	b.st.mu.Lock()
	l := b.st.log(session, true)
	id := uint64(len(l.entries)) + 1
	l.entries = append(l.entries, backplane.LogEntry{ID: id, Type: p.Event.Type, JSON: p.Event.Envelope(id)})
	close(l.changed)
	l.changed = make(chan struct{})
	epoch := l.epoch
	b.st.mu.Unlock()
	p.Appended(epoch)
	return id, epoch, nil
}

// take returns the next n frames of sub (fewer if it ends first). Ready
// is signalled when the queue goes from empty to non-empty, so it is
// waited on only after a take found nothing.
func take(sub *eventbus.Subscription, n int) []eventbus.Frame {
	var out []eventbus.Frame
	for open := true; open && len(out) < n; {
		before := len(out)
		out, open = sub.AppendReady(out)
		if open && len(out) == before {
			<-sub.Ready()
		}
	}
	return out
}

// Two replicas of a toy backplane share one store: an event published on
// A reaches a subscriber on B, and a client that read id 1 on B resumes
// on A.
func Example() {
	st := &store{logs: map[string]*toyLog{}}
	a, b := newBackplane(st), newBackplane(st)
	defer a.set.Close(nil)
	defer b.set.Close(nil)
	ctx := context.Background()

	onB, err := b.set.Subscribe(ctx, "s1", eventbus.SubscribeOptions{})
	if err != nil {
		panic(err)
	}
	a.Publish(ctx, "s1", eventbus.Event{Type: "note", Data: "hello"})
	a.Publish(ctx, "s1", eventbus.Event{Type: "note", Data: "again"})
	for _, f := range take(onB, 2) {
		fmt.Println("B live:", f.ID(), f.Type())
	}
	onB.Close()

	onA, err := a.set.Subscribe(ctx, "s1", eventbus.SubscribeOptions{Resume: true, LastEventID: 1, Epoch: b.set.Get("s1").Epoch})
	if err != nil {
		panic(err)
	}
	for _, f := range take(onA, 2) {
		fmt.Println("A resumed:", f.ID(), f.Type())
	}
	onA.Close()
	// Output:
	// B live: 1 note
	// B live: 2 note
	// A resumed: 2 note
	// A resumed: 0 replay_complete
}
