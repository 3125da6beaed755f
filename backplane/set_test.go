package backplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ssebus/eventbus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errDown = errors.New("fake: down")

// fakeSession is a session of fakeEngine: its log is empty.
type fakeSession struct {
	Session
}

func (*fakeSession) ReadHistory(context.Context, HistoryRequest) ([]LogEntry, uint64, error) {
	return nil, 0, nil
}
func (*fakeSession) Head(context.Context) (string, uint64, error) { return "", 0, nil }

// fakeEngine keeps one epoch per session; down makes Open and Epoch fail.
type fakeEngine struct {
	mu     sync.Mutex
	epochs map[string]string
	opens  atomic.Int32
	down   atomic.Bool
	gate   chan struct{} // when set, Open waits for it
	runs   atomic.Int32  // readers running
}

func (e *fakeEngine) New(string) *fakeSession { return &fakeSession{} }

func (e *fakeEngine) Open(ctx context.Context, s *fakeSession) (Start, error) {
	e.opens.Add(1)
	if e.gate != nil {
		<-e.gate
	}
	if e.down.Load() {
		return Start{}, errDown
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	ep, ok := e.epochs[s.ID]
	if !ok {
		ep = eventbus.NewEpoch()
		e.epochs[s.ID] = ep
	}
	return Start{Epoch: ep}, nil
}

func (e *fakeEngine) Run(ctx context.Context, _ *fakeSession, _ Start) {
	e.runs.Add(1)
	defer e.runs.Add(-1)
	<-ctx.Done()
}

func (e *fakeEngine) Epoch(ctx context.Context, s *fakeSession) (string, error) {
	if e.down.Load() {
		return "", errDown
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.epochs[s.ID], nil
}

// renew gives session id a new epoch, as a Delete on another replica does.
func (e *fakeEngine) renew(id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.epochs[id] = eventbus.NewEpoch()
}

var (
	errUnavailable = errors.New("fake: unavailable")
	errFakeSession = errors.New("fake: invalid session")
)

func newSet(t *testing.T, idle time.Duration) (*Set[*fakeSession], *fakeEngine) {
	t.Helper()
	eng := &fakeEngine{epochs: map[string]string{}}
	bus, err := PrepareBus(&eventbus.Options{}, 0, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	set := New[*fakeSession](Config{
		Name: "fake", Engine: "Fake", Store: "the fake", Bus: bus, Timeout: time.Second, IdleTimeout: idle,
		// Stricter than eventbus.CheckSessionID on length, and blind to
		// UTF-8: the Set applies the shared rule after it.
		Valid: func(id string) error {
			if id == "" || len(id) > 8 {
				return errFakeSession
			}
			return nil
		},
		Unavailable: func(op, session string, err error) error {
			return fmt.Errorf("%w: %s session %q: %v", errUnavailable, op, session, err)
		},
		ErrUnavailable: errUnavailable,
	}, eng)
	t.Cleanup(func() { set.Close(nil) })
	return set, eng
}

func TestConcurrentLookupsOpenOnce(t *testing.T) {
	set, eng := newSet(t, time.Minute)
	eng.gate = make(chan struct{})
	var wg sync.WaitGroup
	buses := make([]*eventbus.EventBus, 8)
	for i := range buses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bus, err := set.Bus(context.Background(), "s")
			if err != nil {
				t.Errorf("Bus: %v", err)
			}
			buses[i] = bus
		}()
	}
	for set.Len() == 0 {
		time.Sleep(time.Millisecond)
	}
	close(eng.gate)
	wg.Wait()
	if n := eng.opens.Load(); n != 1 {
		t.Fatalf("%d opens, want 1", n)
	}
	for _, b := range buses {
		if b != buses[0] || b == nil {
			t.Fatal("lookups got different mirrors")
		}
	}
	if last, subs, ok := set.Local("s"); !ok || last != 0 || subs != 0 {
		t.Fatalf("Local = %d, %d, %v", last, subs, ok)
	}
}

func TestStaleEpochIsReleased(t *testing.T) {
	set, eng := newSet(t, time.Minute)
	old, err := set.Bus(context.Background(), "s")
	if err != nil {
		t.Fatal(err)
	}
	same, err := set.Bus(context.Background(), "s")
	if err != nil || same != old {
		t.Fatalf("a second lookup of an unchanged epoch: %v, new mirror %v", err, same != old)
	}
	eng.renew("s")
	fresh, err := set.Bus(context.Background(), "s")
	if err != nil {
		t.Fatal(err)
	}
	if fresh == old || fresh.Epoch() == old.Epoch() {
		t.Fatal("a lookup joined the mirror of a dead epoch")
	}
	if err := old.Signal("changed", "x"); !errors.Is(err, eventbus.ErrClosed) {
		t.Fatalf("the old mirror is not closed: %v", err)
	}
	eng.down.Store(true)
	if _, err := set.Bus(context.Background(), "s"); !errors.Is(err, errUnavailable) {
		t.Fatalf("epoch check while down: %v, want errUnavailable", err)
	}
}

func TestLookupAnswers(t *testing.T) {
	set, eng := newSet(t, time.Minute)
	lookup := func(id string) error {
		r := httptest.NewRequest(http.MethodGet, "/session/x/events", nil)
		_, err := set.Lookup(r, id)
		return err
	}
	// An id Valid refuses, and one only the shared rule refuses: both
	// 400 invalid_session_id, neither opens a mirror.
	if err := lookup("much-too-long"); !errors.Is(err, eventbus.ErrInvalidSessionID) || !errors.Is(err, errFakeSession) {
		t.Fatalf("invalid id: %v", err)
	}
	for _, id := range []string{"a\xff", "a\xfe"} {
		if err := lookup(id); !errors.Is(err, eventbus.ErrInvalidSessionID) {
			t.Fatalf("%q: %v, want eventbus.ErrInvalidSessionID", id, err)
		}
		if _, err := set.Bus(context.Background(), id); !errors.Is(err, eventbus.ErrInvalidSessionID) {
			t.Fatalf("Bus(%q): %v", id, err)
		}
		if _, err := set.Prepare(context.Background(), id, "", eventbus.Event{Type: "e"}); !errors.Is(err, eventbus.ErrInvalidSessionID) {
			t.Fatalf("Prepare(%q): %v", id, err)
		}
		if err := set.PrepareSignal(id, "t", "a"); !errors.Is(err, eventbus.ErrInvalidSessionID) {
			t.Fatalf("PrepareSignal(%q): %v", id, err)
		}
	}
	if set.Len() != 0 || eng.opens.Load() != 0 {
		t.Fatalf("invalid ids: %d sessions, %d opens, want none", set.Len(), eng.opens.Load())
	}
	eng.down.Store(true)
	var se *eventbus.StatusError
	if err := lookup("s"); !errors.As(err, &se) || se.Status != http.StatusServiceUnavailable || se.Code != "unavailable" || !errors.Is(err, errUnavailable) {
		t.Fatalf("engine down: %v", err)
	}
	if set.Len() != 0 {
		t.Fatal("a failed open stayed in the set")
	}
	eng.down.Store(false)
	if err := lookup("s"); err != nil {
		t.Fatalf("engine back: %v", err)
	}
	set.Close(nil)
	if err := lookup("t"); !errors.As(err, &se) || se.Code != "shutting_down" || !errors.Is(err, eventbus.ErrClosed) {
		t.Fatalf("closed: %v", err)
	}
	if eng.runs.Load() != 0 {
		t.Fatal("a reader outlived Close")
	}
}

func TestIdleRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		set, eng := newSet(t, time.Second)
		bus, err := set.Bus(context.Background(), "s")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		sub, err := bus.Subscribe(ctx, eventbus.SubscribeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		if set.Len() != 1 {
			t.Fatal("a mirror with a subscriber was released")
		}
		cancel()
		sub.Close()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if set.Len() != 0 || eng.runs.Load() != 0 {
			t.Fatalf("idle mirror kept: %d sessions, %d readers", set.Len(), eng.runs.Load())
		}
		set.Close(nil)
	})
}

func TestBackoffDoublesWithJitter(t *testing.T) {
	b := Backoff{Min: 10 * time.Millisecond, Max: 80 * time.Millisecond}
	for i, ceil := range []time.Duration{10, 20, 40, 80, 80} {
		ceil *= time.Millisecond
		if d := b.Next(); d < ceil/2 || d > ceil {
			t.Fatalf("wait %d: %v, want within [%v, %v]", i, d, ceil/2, ceil)
		}
	}
	b.Reset()
	if d := b.Next(); d > 10*time.Millisecond {
		t.Fatalf("after Reset: %v", d)
	}
	var zero Backoff
	if d := zero.Next(); d < DefaultMinBackoff/2 || d > DefaultMinBackoff {
		t.Fatalf("zero Backoff: %v", d)
	}
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		start := time.Now()
		if !b.Sleep(ctx, 3*time.Millisecond) || time.Since(start) > 3*time.Millisecond {
			t.Fatalf("Sleep with a limit took %v", time.Since(start))
		}
		cancel()
		if b.Sleep(ctx, 0) {
			t.Fatal("Sleep after ctx ended reported true")
		}
	})
}

// Prepare checks and encodes as Publish would; Appended releases a mirror
// of another epoch.
func TestPrepareAndAppended(t *testing.T) {
	set, eng := newSet(t, time.Minute)
	ctx := context.Background()
	if _, err := set.Prepare(ctx, "much-too-long", "", eventbus.Event{Type: "e"}); err == nil {
		t.Fatal("an invalid session was prepared")
	}
	if _, err := set.Prepare(ctx, "s", "", eventbus.Event{}); !errors.Is(err, eventbus.ErrInvalidEvent) {
		t.Fatalf("empty type: %v", err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := set.Prepare(done, "s", "", eventbus.Event{Type: "e"}); !errors.Is(err, errUnavailable) {
		t.Fatalf("a done context: %v", err)
	}
	p, err := set.Prepare(ctx, "s", "", eventbus.Event{Type: "e", Data: 1})
	if err != nil || p.Fingerprint != "" || !strings.HasPrefix(string(p.Event.Envelope(7)), `{"id":7,`) {
		t.Fatalf("Prepare: %+v %v", p, err)
	}
	bus, err := set.Bus(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	p, err = set.Prepare(ctx, "s", "k", eventbus.Event{Type: "e", Data: 1})
	if err != nil || p.Fingerprint == "" || p.Key != "k" {
		t.Fatalf("keyed Prepare: %+v %v", p, err)
	}
	p.Appended(bus.Epoch())
	if set.Len() != 1 {
		t.Fatal("Appended in the mirror's epoch released it")
	}
	eng.renew("s")
	p.Appended("another")
	if set.Len() != 0 {
		t.Fatal("Appended in another epoch kept the stale mirror")
	}
	set.Close(nil)
	if _, err := set.Prepare(ctx, "s", "", eventbus.Event{Type: "e"}); !errors.Is(err, eventbus.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// A signal is checked before it is sent and delivered to the local
// mirror's subscribers only; Deleted and Outage end the mirror's streams.
func TestSignalsDeletedAndOutage(t *testing.T) {
	set, _ := newSet(t, time.Minute)
	ctx := context.Background()
	if err := set.PrepareSignal("s", "", "x"); !errors.Is(err, eventbus.ErrInvalidEvent) {
		t.Fatalf("empty signal type: %v", err)
	}
	if err := set.PrepareSignal("s", "changed", "doc/1"); err != nil {
		t.Fatal(err)
	}
	set.DeliverSignal("s", "changed", "doc/1") // no mirror: nothing
	sub, err := set.Subscribe(ctx, "s", eventbus.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	set.DeliverSignal("s", "changed", "doc/1")
	<-sub.Ready()
	if fs, _ := sub.AppendReady(nil); len(fs) != 1 || fs[0].Type() != "changed" || fs[0].ID() != 0 {
		t.Fatalf("delivered %v", fs)
	}
	set.Deleted("s")
	for range sub.Events() {
	}
	if set.Len() != 0 {
		t.Fatal("Deleted kept the mirror")
	}
	sub, err = set.Subscribe(ctx, "s", eventbus.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	set.Outage(set.Get("s"), time.Now().Add(-time.Second), errDown)
	var last eventbus.Frame
	for f := range sub.Events() {
		last = f
	}
	if set.Len() != 0 || last.Type() != eventbus.TypeStreamError || !strings.Contains(string(last.JSON()), `"errorKind":"unavailable"`) {
		t.Fatalf("after Outage: %d sessions, last frame %s", set.Len(), last.JSON())
	}
}
