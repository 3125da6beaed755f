package backplanetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
)

// The suite's own engine: every session's log in process memory, shared
// by the replicas of one memStore. It keeps the whole contract (the suite
// passes on it, TestMemory) and can be broken on purpose (memFaults), for
// the tests that the suite catches a broken engine.

var (
	errMemDown           = errors.New("mem: unavailable")
	errMemInvalidSession = errors.New("mem: invalid session id")
)

// memFaults break the engine for the suite's own tests.
type memFaults struct {
	skipID    uint64 // the publish that would get this id gets the next one
	newEpochs bool   // every Open makes a new epoch instead of reading it
	// reservedTypes appends an event of a reserved type (an engine that
	// encodes events itself, without the Encoder's checks).
	reservedTypes bool
	// bytesOnlyIDs makes the module's rule the length alone (not UTF-8):
	// the Set still refuses what the shared rule does, with eventbus's
	// error, not the module's.
	bytesOnlyIDs bool
}

// memStore is the engine: the logs, and whether it is reachable.
type memStore struct {
	faults memFaults
	down   atomic.Bool

	mu       sync.Mutex
	logs     map[string]*memLog
	replicas []*memBackplane // for signals
}

type memLog struct {
	epoch   string
	entries []backplane.LogEntry // the ids it still holds, in order
	last    uint64
	bytes   int
	keys    map[string]memKey
	changed chan struct{} // closed and replaced on every change
}

type memKey struct {
	id uint64
	fp string
	at time.Time
}

func newMemStore(f memFaults) *memStore { return &memStore{faults: f, logs: map[string]*memLog{}} }

// log returns session's log, creating it when create is set; the caller
// holds st.mu.
func (st *memStore) log(session string, create bool) *memLog {
	l := st.logs[session]
	if l == nil && create {
		l = &memLog{epoch: eventbus.NewEpoch(), keys: map[string]memKey{}, changed: make(chan struct{})}
		st.logs[session] = l
	}
	return l
}

func (l *memLog) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// forget removes session's log, waking its readers.
func (st *memStore) forget(session string) {
	if l := st.logs[session]; l != nil {
		delete(st.logs, session)
		l.notify()
	}
}

// lose forgets every log, as a restart without persistence does.
func (st *memStore) lose() {
	st.mu.Lock()
	defer st.mu.Unlock()
	for id := range st.logs {
		st.forget(id)
	}
}

// memOptions are a memBackplane's options.
type memOptions struct {
	Bus                                                           eventbus.Options
	PublishTimeout, OutageTimeout, IdleTimeout, IdempotencyWindow time.Duration
}

// memBackplane is one replica: the module's Backplane.
type memBackplane struct {
	st   *memStore
	opts memOptions
	bus  backplane.Bus
	set  *backplane.Set[*memSession]
	gate *Gate
}

func newMemBackplane(st *memStore, opts memOptions) (*memBackplane, error) {
	bus, err := backplane.PrepareBus(&opts.Bus, 0, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	b := &memBackplane{st: st, opts: opts, bus: bus, gate: NewGate()}
	b.set = backplane.New[*memSession](backplane.Config{
		Name: "mem", Engine: "Memory", Store: "memory", Bus: bus,
		Timeout: opts.PublishTimeout, IdleTimeout: opts.IdleTimeout, OutageTimeout: opts.OutageTimeout,
		Valid: st.valid,
		Unavailable: func(op, session string, err error) error {
			return fmt.Errorf("%w: %s session %q: %v", errMemDown, op, session, err)
		},
		ErrUnavailable: errMemDown,
	}, memEngine{b})
	st.mu.Lock()
	st.replicas = append(st.replicas, b)
	st.mu.Unlock()
	return b, nil
}

// valid is the module's session id rule: eventbus.CheckSessionID, its
// error wrapped with the module's.
func (st *memStore) valid(id string) error {
	if st.faults.bytesOnlyIDs {
		if id == "" || len(id) > eventbus.MaxSessionIDBytes {
			return fmt.Errorf("%w: %d bytes", errMemInvalidSession, len(id))
		}
		return nil
	}
	if err := eventbus.CheckSessionID(id); err != nil {
		return fmt.Errorf("%w: %w", errMemInvalidSession, err)
	}
	return nil
}

// reach fails when the engine is down.
func (b *memBackplane) reach() error {
	if b.st.down.Load() {
		return errors.New("the engine is down")
	}
	return nil
}

func (b *memBackplane) Publish(ctx context.Context, session string, e eventbus.Event) (uint64, string, error) {
	id, epoch, _, err := b.publish(ctx, session, "", e)
	return id, epoch, err
}

func (b *memBackplane) PublishIdempotent(ctx context.Context, session, key string, e eventbus.Event) (uint64, string, bool, error) {
	if err := eventbus.CheckIdempotencyKey(key); err != nil {
		return 0, "", false, err
	}
	return b.publish(ctx, session, key, e)
}

func (b *memBackplane) publish(ctx context.Context, session, key string, e eventbus.Event) (uint64, string, bool, error) {
	forged := ""
	if b.st.faults.reservedTypes && slices.Contains(eventbus.ReservedTypes(), e.Type) {
		// Encoded under a stand-in type, then given the reserved one.
		forged, e.Type = e.Type, "forged"
	}
	p, err := b.set.Prepare(ctx, session, key, e)
	if err != nil {
		return 0, "", false, err
	}
	if forged != "" {
		p.Event.Type = forged
		p.Event.Tail = bytes.Replace(p.Event.Tail, []byte(`"type":"forged"`), []byte(`"type":"`+forged+`"`), 1)
	}
	if err := b.reach(); err != nil {
		return 0, "", false, fmt.Errorf("%w: publish to %q: %v", errMemDown, session, err)
	}
	st := b.st
	st.mu.Lock()
	l := st.log(session, true)
	if k, ok := l.keys[key]; key != "" && ok && time.Since(k.at) < b.opts.IdempotencyWindow {
		st.mu.Unlock()
		if k.fp != p.Fingerprint {
			return 0, "", false, fmt.Errorf("%w: the key's first publish has id %d", eventbus.ErrIdempotencyKeyReused, k.id)
		}
		p.Appended(l.epoch)
		return k.id, l.epoch, true, nil
	}
	id := l.last + 1
	if id == st.faults.skipID {
		id++
	}
	env := p.Event.Envelope(id)
	if len(env) > b.bus.MaxEvent {
		st.mu.Unlock()
		return 0, "", false, fmt.Errorf("%w: %d bytes with id %d", eventbus.ErrEventTooLarge, len(env), id)
	}
	l.entries = append(l.entries, backplane.LogEntry{ID: id, Type: p.Event.Type, JSON: env})
	l.last, l.bytes = id, l.bytes+len(env)
	for len(l.entries) > b.bus.MaxLen || len(l.entries) > 1 && l.bytes > b.bus.MaxBytes {
		l.bytes -= len(l.entries[0].JSON)
		l.entries = l.entries[1:]
	}
	if key != "" {
		l.keys[key] = memKey{id: id, fp: p.Fingerprint, at: time.Now()}
	}
	l.notify()
	epoch := l.epoch
	st.mu.Unlock()
	p.Appended(epoch)
	return id, epoch, false, nil
}

func (b *memBackplane) Signal(_ context.Context, session, typ, about string) error {
	if err := b.set.PrepareSignal(session, typ, about); err != nil {
		return err
	}
	if err := b.reach(); err != nil {
		return fmt.Errorf("%w: signal %q: %v", errMemDown, session, err)
	}
	b.st.mu.Lock()
	replicas := b.st.replicas
	b.st.mu.Unlock()
	for _, r := range replicas {
		r.set.DeliverSignal(session, typ, about)
	}
	return nil
}

func (b *memBackplane) Delete(_ context.Context, session string) error {
	if err := b.st.valid(session); err != nil {
		return err
	}
	if err := b.reach(); err != nil {
		return fmt.Errorf("%w: delete %q: %v", errMemDown, session, err)
	}
	b.st.mu.Lock()
	b.st.forget(session)
	b.st.mu.Unlock()
	b.set.Deleted(session)
	return nil
}

func (b *memBackplane) Info(_ context.Context, session string) (backplane.Info, error) {
	if err := b.st.valid(session); err != nil {
		return backplane.Info{}, err
	}
	if err := b.reach(); err != nil {
		return backplane.Info{}, fmt.Errorf("%w: read %q: %v", errMemDown, session, err)
	}
	var in backplane.Info
	b.st.mu.Lock()
	if l := b.st.log(session, false); l != nil {
		in.Exists, in.Epoch, in.LastEventID, in.Bytes = true, l.epoch, l.last, uint64(l.bytes)
		if len(l.entries) > 0 {
			in.FirstEventID = l.entries[0].ID
		}
	}
	b.st.mu.Unlock()
	in.LocalLastEventID, in.Subscribers, in.Local = b.set.Local(session)
	return in, nil
}

func (b *memBackplane) Subscribe(ctx context.Context, session string, opts eventbus.SubscribeOptions) (*eventbus.Subscription, error) {
	return b.set.Subscribe(ctx, session, opts)
}

func (b *memBackplane) Bus(ctx context.Context, session string) (*eventbus.EventBus, error) {
	return b.set.Bus(ctx, session)
}

func (b *memBackplane) Sessions() int              { return b.set.Len() }
func (b *memBackplane) Handler() *eventbus.Handler { return b.set.Handler() }
func (b *memBackplane) Close() error               { b.set.Close(nil); return nil }

// memSession is a replica's mirror of one session, and its backplane.Log.
type memSession struct {
	backplane.Session
	b *memBackplane
}

func (s *memSession) ReadHistory(_ context.Context, req backplane.HistoryRequest) ([]backplane.LogEntry, uint64, error) {
	if err := s.b.reach(); err != nil {
		return nil, 0, err
	}
	s.b.st.mu.Lock()
	defer s.b.st.mu.Unlock()
	l := s.b.st.log(s.ID, false)
	if l == nil || l.epoch != s.Epoch {
		return nil, 0, fmt.Errorf("mem: session %q no longer has epoch %s", s.ID, s.Epoch)
	}
	var out []backplane.LogEntry
	for _, e := range l.entries {
		if e.ID > req.After && e.ID <= req.Upto {
			out = append(out, e)
		}
	}
	if len(l.entries) == 0 {
		return out, 0, nil
	}
	return out, l.entries[0].ID, nil
}

func (s *memSession) Head(context.Context) (string, uint64, error) {
	if err := s.b.reach(); err != nil {
		return "", 0, err
	}
	s.b.st.mu.Lock()
	defer s.b.st.mu.Unlock()
	if l := s.b.st.log(s.ID, false); l != nil {
		return l.epoch, l.last, nil
	}
	return "", 0, nil
}

// memEngine is the memory's backplane.Engine.
type memEngine struct{ b *memBackplane }

func (g memEngine) New(string) *memSession { return &memSession{b: g.b} }

func (g memEngine) Open(_ context.Context, s *memSession) (backplane.Start, error) {
	if err := g.b.reach(); err != nil {
		return backplane.Start{}, err
	}
	st := g.b.st
	st.mu.Lock()
	defer st.mu.Unlock()
	l := st.log(s.ID, true)
	if st.faults.newEpochs {
		l.epoch = eventbus.NewEpoch()
	}
	return backplane.Start{Epoch: l.epoch, Last: l.last, Cursor: uint64(len(l.entries))}, nil
}

// memCheck is how often a quiet reader checks that the engine answers.
const memCheck = 20 * time.Millisecond

func (g memEngine) Run(ctx context.Context, s *memSession, from backplane.Start) {
	b, st := g.b, g.b.st
	last := from.Last
	heard := time.Now()
	var backoff backplane.Backoff
	for {
		b.gate.Wait(ctx, s.ID)
		if ctx.Err() != nil {
			return
		}
		if err := b.reach(); err != nil {
			left := time.Until(heard.Add(b.opts.OutageTimeout))
			if left <= 0 {
				b.set.Outage(s, heard, err)
				return
			}
			if !backoff.Sleep(ctx, left) {
				return
			}
			continue
		}
		heard = time.Now()
		backoff.Reset()
		st.mu.Lock()
		l := st.log(s.ID, false)
		if l == nil || l.epoch != s.Epoch {
			st.mu.Unlock()
			b.set.Expire(s, "the session was deleted or lost")
			return
		}
		var news []backplane.LogEntry
		for _, e := range l.entries {
			if e.ID > last {
				news = append(news, e)
			}
		}
		changed := l.changed
		st.mu.Unlock()
		for _, e := range news {
			if err := backplane.Append(s.Bus, e); errors.Is(err, eventbus.ErrClosed) {
				return
			}
			last = e.ID
		}
		t := time.NewTimer(memCheck)
		select {
		case <-ctx.Done():
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}

func (g memEngine) Epoch(ctx context.Context, s *memSession) (string, error) {
	epoch, _, err := s.Head(ctx)
	return epoch, err
}

// memHarness is the suite's Harness on a memory engine with faults f.
func memHarness(f memFaults) Harness {
	return Harness{
		Start: func(t testing.TB, n int, o Options) Cluster {
			st := newMemStore(f)
			opts := memOptions{PublishTimeout: time.Second, OutageTimeout: 30 * time.Second,
				IdleTimeout: time.Hour, IdempotencyWindow: 10 * time.Minute}
			o.Apply(&opts.Bus, &opts.PublishTimeout, &opts.OutageTimeout, &opts.IdleTimeout, &opts.IdempotencyWindow)
			var c Cluster
			for range n {
				b, err := newMemBackplane(st, opts)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { b.Close() })
				c.Replicas = append(c.Replicas, b)
				c.Gates = append(c.Gates, b.gate)
			}
			c.Down = func() { st.down.Store(true) }
			c.Up = func() { st.down.Store(false) }
			c.Lose = st.lose
			return c
		},
		ErrUnavailable:    errMemDown,
		ErrInvalidSession: errMemInvalidSession,
		TrimsBytes:        true,
	}
}
