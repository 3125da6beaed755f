package eventbus_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/sseclient"
)

// A small backplane written with the public API alone, as a NATS, Kafka or
// PostgreSQL backplane in another module would be: a shared log numbers
// events (eventbus.MemLog, the tests' in-memory Log, under its own lock,
// standing in for the engine), and every replica feeds its fed bus from
// the log with a reader goroutine.

// replica is one daemon's view of the log: a fed bus and its reader.
type replica struct {
	bus  *eventbus.EventBus
	enc  *eventbus.Encoder
	stop context.CancelFunc
	done chan struct{}
}

func newReplica(t *testing.T, l *eventbus.MemLog, opts eventbus.Options) *replica {
	t.Helper()
	_, last, _ := l.Head(context.Background())
	bus, err := eventbus.NewFed(opts, eventbus.FeedOptions{Epoch: l.Epoch(), NextID: last + 1, Log: l})
	require.NoError(t, err)
	enc, err := eventbus.NewEncoder(opts)
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	r := &replica{bus: bus, enc: enc, stop: stop, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			entries, changed := l.After(bus.LastEventID())
			for _, e := range entries {
				if err := bus.Append(e); err != nil {
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

func (r *replica) publish(t *testing.T, l *eventbus.MemLog, typ string) uint64 {
	t.Helper()
	ev, err := r.enc.Encode(eventbus.Event{Type: typ, Data: map[string]string{"from": "test"}})
	require.NoError(t, err)
	return l.Append(ev)
}

// take reads frames until it has n events, or fails after a while.
func take(t *testing.T, s *eventbus.Subscription, n int) []eventbus.Frame {
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

func TestExternalBackplaneResumesOnAnotherReplica(t *testing.T) {
	l := eventbus.NewMemLog(100)
	a := newReplica(t, l, eventbus.Options{})
	b := newReplica(t, l, eventbus.Options{})

	sa, err := a.bus.Subscribe(context.Background(), eventbus.SubscribeOptions{})
	require.NoError(t, err)
	for range 5 {
		a.publish(t, l, "tick")
	}
	got := take(t, sa, 5)
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
	got = take(t, sb, 3)
	var ids []uint64
	for _, f := range got {
		if f.ID() != 0 {
			ids = append(ids, f.ID())
		}
	}
	assert.Equal(t, []uint64{6, 7, 8}, ids)
	assert.Equal(t, a.bus.Epoch(), b.bus.Epoch(), "one epoch for the log")
}

func TestExternalBackplaneLateReplicaAnswersFromTheLog(t *testing.T) {
	l := eventbus.NewMemLog(4)
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
	got := take(t, s, 4)
	require.Equal(t, eventbus.TypeStateResyncRequired, got[0].Type())
	assert.Contains(t, string(got[0].JSON()), `"reason":"ring_evicted","lastDeliveredId":2,"earliestAvailableId":7`)
	assert.Equal(t, uint64(7), got[1].ID())
	assert.Equal(t, uint64(10), got[4].ID())
}

func TestExternalBackplaneConcurrentPublishersSameOrderEverywhere(t *testing.T) {
	l := eventbus.NewMemLog(10000)
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
		for _, f := range take(t, s, 3*each) {
			order = append(order, f.Type())
			assert.Equal(t, uint64(len(order)), f.ID(), "contiguous ids from 1")
		}
		orders = append(orders, order)
	}
	assert.Equal(t, orders[0], orders[1])
	assert.Equal(t, orders[0], orders[2])
}

// The Handler serves a fed bus with no hook of its own: a resume its ring
// cannot answer comes from the log.
func TestExternalBackplaneThroughTheHandler(t *testing.T) {
	l := eventbus.NewMemLog(100)
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
	assert.Equal(t, l.Epoch(), resp.Header.Get("Event-Epoch"))
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
