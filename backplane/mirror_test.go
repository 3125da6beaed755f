package backplane_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
	"github.com/ssebus/eventbus/sseclient"
)

// A small backplane written with the mirror's API alone (NewMirror,
// Append, Log, Encoder), without a Set: a shared log numbers events
// (memLog, under its own lock, standing in for the engine), and every
// replica feeds its mirror from the log with a reader goroutine.

// memLog is a shared log in memory: it numbers its entries from 1 under
// its own lock, as an engine's atomic append would, keeps the newest keep
// of them (0: all), and closes the channel after returns at every append,
// for the readers that feed replicas.
type memLog struct {
	epoch string
	keep  int

	mu      sync.Mutex
	entries []backplane.LogEntry
	next    uint64 // the id of the next entry; 0 means 1
	changed chan struct{}
}

func newMemLog(keep int) *memLog { return &memLog{epoch: eventbus.NewEpoch(), keep: keep} }

// Append numbers an encoded event and returns its id.
func (l *memLog) Append(ev backplane.EncodedEvent) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	id := max(l.next, 1)
	l.next = id + 1
	l.entries = append(l.entries, backplane.LogEntry{ID: id, Type: ev.Type, JSON: ev.Envelope(id)})
	if l.keep > 0 && len(l.entries) > l.keep {
		l.entries = l.entries[len(l.entries)-l.keep:]
	}
	if l.changed != nil {
		close(l.changed)
	}
	l.changed = make(chan struct{})
	return id
}

// After returns the entries after id and a channel closed at the next
// append.
func (l *memLog) After(id uint64) ([]backplane.LogEntry, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []backplane.LogEntry
	for _, e := range l.entries {
		if e.ID > id {
			out = append(out, e)
		}
	}
	if l.changed == nil {
		l.changed = make(chan struct{})
	}
	return out, l.changed
}

// ReadHistory implements backplane.Log.
func (l *memLog) ReadHistory(_ context.Context, req backplane.HistoryRequest) ([]backplane.LogEntry, uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []backplane.LogEntry
	for _, e := range l.entries {
		if e.ID > req.After && e.ID <= req.Upto {
			out = append(out, e)
		}
	}
	first := uint64(0)
	if len(l.entries) > 0 {
		first = l.entries[0].ID
	}
	return out, first, nil
}

// Head implements backplane.Log.
func (l *memLog) Head(context.Context) (string, uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.epoch, max(l.next, 1) - 1, nil
}

// replica is one daemon's view of the log: a mirror and its reader.
type replica struct {
	bus  *eventbus.EventBus
	enc  *backplane.Encoder
	stop context.CancelFunc
	done chan struct{}
}

func newReplica(t *testing.T, l *memLog, opts eventbus.Options) *replica {
	t.Helper()
	_, last, _ := l.Head(context.Background())
	bus, err := backplane.NewMirror(opts, backplane.MirrorOptions{Epoch: l.epoch, NextID: last + 1, Log: l})
	require.NoError(t, err)
	enc, err := backplane.NewEncoder(opts)
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	r := &replica{bus: bus, enc: enc, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			entries, changed := l.After(bus.LastEventID())
			for _, e := range entries {
				if err := backplane.Append(bus, e); err != nil {
					return
				}
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(r.close)
	return r
}

func (r *replica) close() {
	r.stop()
	<-r.done
	r.bus.Close()
}

func (r *replica) publish(t *testing.T, l *memLog, typ string) uint64 {
	t.Helper()
	ev, err := r.enc.Encode(eventbus.Event{Type: typ, Data: map[string]string{"from": "test"}})
	require.NoError(t, err)
	return l.Append(ev)
}

// takeEvents reads frames until it has n events, or fails after a while.
func takeEvents(t *testing.T, s *eventbus.Subscription, n int) []eventbus.Frame {
	t.Helper()
	var out []eventbus.Frame
	events := 0
	deadline := time.After(10 * time.Second)
	for events < n {
		fs, open := s.AppendReady(nil)
		for _, f := range fs {
			out = append(out, f)
			if f.ID() != 0 {
				events++
			}
		}
		if !open {
			t.Fatalf("subscription ended after %d events", events)
		}
		if len(fs) == 0 {
			select {
			case <-s.Ready():
			case <-deadline:
				t.Fatalf("got %d of %d events", events, n)
			}
		}
	}
	return out
}

func TestMirrorResumesOnAnotherReplica(t *testing.T) {
	l := newMemLog(100)
	a := newReplica(t, l, eventbus.Options{})
	b := newReplica(t, l, eventbus.Options{})

	sa, err := a.bus.Subscribe(context.Background(), eventbus.SubscribeOptions{})
	require.NoError(t, err)
	for range 5 {
		a.publish(t, l, "tick")
	}
	got := takeEvents(t, sa, 5)
	assert.Equal(t, uint64(5), got[4].ID())
	sa.Close()

	// The client moves to replica b, which has been fed too, then more
	// events come through b.
	for range 3 {
		b.publish(t, l, "tock")
	}
	sb, err := b.bus.Subscribe(context.Background(), eventbus.SubscribeOptions{Resume: true, LastEventID: 5, Epoch: a.bus.Epoch()})
	require.NoError(t, err)
	defer sb.Close()
	got = takeEvents(t, sb, 3)
	var ids []uint64
	for _, f := range got {
		if f.ID() != 0 {
			ids = append(ids, f.ID())
		}
	}
	assert.Equal(t, []uint64{6, 7, 8}, ids)
	assert.Equal(t, a.bus.Epoch(), b.bus.Epoch(), "one epoch for the log")
}

func TestMirrorLateReplicaAnswersFromTheLog(t *testing.T) {
	l := newMemLog(4)
	a := newReplica(t, l, eventbus.Options{})
	for range 10 {
		a.publish(t, l, "tick")
	}
	// A replica that starts now has an empty ring: a resume is answered
	// from the log, which has trimmed all but 7..10.
	late := newReplica(t, l, eventbus.Options{})
	s, err := late.bus.Subscribe(context.Background(), eventbus.SubscribeOptions{Resume: true, LastEventID: 2})
	require.NoError(t, err)
	defer s.Close()
	got := takeEvents(t, s, 4)
	require.Equal(t, eventbus.TypeStateResyncRequired, got[0].Type())
	assert.Contains(t, string(got[0].JSON()), `"reason":"ring_evicted","lastDeliveredId":2,"earliestAvailableId":7`)
	assert.Equal(t, uint64(7), got[1].ID())
	assert.Equal(t, uint64(10), got[4].ID())
}

func TestMirrorConcurrentPublishersSameOrderEverywhere(t *testing.T) {
	l := newMemLog(10000)
	rs := []*replica{newReplica(t, l, eventbus.Options{}), newReplica(t, l, eventbus.Options{}), newReplica(t, l, eventbus.Options{})}
	var subs []*eventbus.Subscription
	for _, r := range rs {
		s, err := r.bus.Subscribe(context.Background(), eventbus.SubscribeOptions{MaxQueued: 2048})
		require.NoError(t, err)
		defer s.Close()
		subs = append(subs, s)
	}
	const each = 300
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				r.publish(t, l, "from"+string(rune('a'+i)))
			}
		}()
	}
	wg.Wait()
	var orders [][]string
	for _, s := range subs {
		var order []string
		for _, f := range takeEvents(t, s, 3*each) {
			order = append(order, f.Type())
			assert.Equal(t, uint64(len(order)), f.ID(), "contiguous ids from 1")
		}
		orders = append(orders, order)
	}
	assert.Equal(t, orders[0], orders[1])
	assert.Equal(t, orders[0], orders[2])
}

// The Handler serves a mirror with no hook of its own: a resume its ring
// cannot answer comes from the log.
func TestMirrorThroughTheHandler(t *testing.T) {
	l := newMemLog(100)
	a := newReplica(t, l, eventbus.Options{})
	for range 3 {
		a.publish(t, l, "tick")
	}
	late := newReplica(t, l, eventbus.Options{RingSize: 1})
	srv := httptest.NewServer(&eventbus.Handler{
		Lookup: func(*http.Request, string) (*eventbus.EventBus, error) { return late.bus, nil },
	})
	defer srv.Close()
	require.Eventually(t, func() bool { return late.bus.LastEventID() == 3 }, 5*time.Second, time.Millisecond)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	req.Header.Set("Last-Event-ID", "0")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, l.epoch, resp.Header.Get("Event-Epoch"))
	p := sseclient.NewParser(resp.Body)
	var ids []string
	for len(ids) < 4 {
		m, err := p.Next()
		require.NoError(t, err, "the stream ended after ids %v", ids)
		if m.Kind != sseclient.KindEvent {
			continue
		}
		if m.HasID {
			ids = append(ids, m.ID)
		}
		if m.Type == eventbus.TypeReplayComplete {
			a.publish(t, l, "live")
		}
	}
	e := late.bus.Epoch() + ":" // the Handler's id lines carry the epoch by default
	assert.Equal(t, []string{e + "1", e + "2", e + "3", e + "4"}, ids, "1..3 from the log (the ring holds only 3), then live 4")
}

// The mirror's API over package eventbus's implementation: what each
// function returns, as documented.
func TestNewMirrorValidates(t *testing.T) {
	epoch := eventbus.NewEpoch()
	for _, mo := range []backplane.MirrorOptions{
		{}, {Epoch: "short"}, {Epoch: strings.ToUpper(epoch)}, {Epoch: epoch, LagTimeout: -1},
	} {
		_, err := backplane.NewMirror(eventbus.Options{}, mo)
		assert.ErrorIs(t, err, eventbus.ErrInvalidOption, "%+v", mo)
	}
	_, err := backplane.NewMirror(eventbus.Options{RingSize: -1}, backplane.MirrorOptions{Epoch: epoch})
	assert.ErrorIs(t, err, eventbus.ErrInvalidOption)
	assert.Equal(t, 2*time.Second, backplane.DefaultLagTimeout)
}

func TestMirrorRefusesPublishAndAppendRefusesOtherBuses(t *testing.T) {
	epoch := eventbus.NewEpoch()
	m, err := backplane.NewMirror(eventbus.Options{}, backplane.MirrorOptions{Epoch: epoch, NextID: 41})
	require.NoError(t, err)
	defer m.Close()
	assert.Equal(t, epoch, m.Epoch())
	assert.Equal(t, uint64(40), m.LastEventID())
	_, err = m.Publish(eventbus.Event{Type: "x"})
	assert.ErrorIs(t, err, backplane.ErrMirror, "ids come from the log")
	assert.True(t, strings.HasPrefix(backplane.ErrMirror.Error(), "backplane: "), backplane.ErrMirror.Error())
	_, err = m.Publish(eventbus.Event{})
	assert.ErrorIs(t, err, eventbus.ErrInvalidEvent, "an event Publish refuses anyway says why")

	s, err := m.Subscribe(context.Background(), eventbus.SubscribeOptions{})
	require.NoError(t, err)
	defer s.Close()
	env := []byte(`{"id":41,"v":1,"type":"tick"}`)
	require.NoError(t, backplane.Append(m, backplane.LogEntry{ID: 41, Type: "tick", JSON: env}))
	require.NoError(t, backplane.Append(m, backplane.LogEntry{ID: 41, Type: "tick", JSON: env}), "a re-read is ignored")
	got := takeEvents(t, s, 1)
	assert.Equal(t, "id: 41\nevent: tick\ndata: "+string(env)+"\n\n", got[0].String())
	assert.ErrorIs(t, backplane.Append(m, backplane.LogEntry{ID: 42, Type: eventbus.TypeClientEvicted, JSON: []byte(`{}`)}), eventbus.ErrInvalidEvent)
	assert.ErrorIs(t, backplane.Append(m, backplane.LogEntry{ID: 42, Type: "x", JSON: []byte("{\n}")}), eventbus.ErrInvalidEvent)
	assert.Equal(t, uint64(41), m.LastEventID(), "a refused entry is not delivered")

	b, err := eventbus.New(eventbus.Options{})
	require.NoError(t, err)
	assert.ErrorIs(t, backplane.Append(b, backplane.LogEntry{ID: 1, Type: "x", JSON: []byte(`{"id":1}`)}), backplane.ErrMirror)
	b.Close()
	assert.ErrorIs(t, backplane.Append(b, backplane.LogEntry{ID: 1, Type: "x", JSON: []byte(`{"id":1}`)}), eventbus.ErrClosed)
}

func TestCloseWithErrorEndsWithItsKind(t *testing.T) {
	b, err := eventbus.New(eventbus.Options{})
	require.NoError(t, err)
	s, err := b.Subscribe(context.Background(), eventbus.SubscribeOptions{})
	require.NoError(t, err)
	_, err = b.Publish(eventbus.Event{Type: "e"})
	require.NoError(t, err)
	require.NoError(t, backplane.CloseWithError(b, eventbus.ErrorKindUnavailable, "engine down"))
	require.NoError(t, backplane.CloseWithError(b, eventbus.ErrorKindInternal, "again"), "idempotent")
	require.NoError(t, b.Close(), "only the first close counts")
	var fs []eventbus.Frame
	for f := range s.Events() {
		fs = append(fs, f)
	}
	require.Len(t, fs, 2, "the queued event, then the terminal frame")
	assert.Equal(t, uint64(1), fs[0].ID())
	assert.Equal(t, eventbus.TypeStreamError, fs[1].Type())
	assert.Contains(t, string(fs[1].JSON()), `"data":{"error":"engine down","errorKind":"unavailable"}`)
	assert.ErrorIs(t, s.Err(), eventbus.ErrClosed)
	assert.Contains(t, s.Err().Error(), "engine down")
}
