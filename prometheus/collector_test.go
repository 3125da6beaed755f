package ebprom_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/ssebus/eventbus"
	ebprom "github.com/ssebus/eventbus/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newHub(t *testing.T, opts eventbus.HubOptions) *eventbus.Hub {
	t.Helper()
	hub, err := eventbus.NewHub(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hub.Close() })
	return hub
}

func publish(t *testing.T, hub *eventbus.Hub, session string, n int) {
	t.Helper()
	for range n {
		if _, err := hub.Publish(session, eventbus.Event{Type: "note", Data: []byte(`{"x":1}`)}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCollectorLintsClean(t *testing.T) {
	hub := newHub(t, eventbus.HubOptions{})
	publish(t, hub, "a", 1)
	problems, err := testutil.CollectAndLint(ebprom.NewCollector(hub))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	// Registering checks Describe against Collect (names, labels, help).
	if err := prometheus.NewPedanticRegistry().Register(ebprom.NewCollector(hub)); err != nil {
		t.Fatal(err)
	}
}

// compare checks the named metrics of c against want (text exposition).
func compare(t *testing.T, c prometheus.Collector, want string, names ...string) {
	t.Helper()
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
}

const (
	publishedHelp = `# HELP eventbus_events_published_total Events published (given an id).
# TYPE eventbus_events_published_total counter
`
	closedHelp = `# HELP eventbus_sessions_closed_total Sessions the hub closed and forgot, by reason: idle expiry or Delete.
# TYPE eventbus_sessions_closed_total counter
`
)

func TestCollectorReportsTheHub(t *testing.T) {
	hub := newHub(t, eventbus.HubOptions{MaxSessions: 2})
	c := ebprom.NewCollector(hub)
	publish(t, hub, "a", 3)
	publish(t, hub, "b", 2)
	if _, err := hub.Publish("c", eventbus.Event{Type: "note"}); err == nil {
		t.Fatal("a third session in a hub of 2 live ones was admitted")
	}
	if _, err := hub.Publish("a", eventbus.Event{Type: strings.Repeat("t", eventbus.MaxTypeLen+1)}); err == nil {
		t.Fatal("an over-long type was published")
	}
	bus, _ := hub.Lookup("a")
	sub, err := bus.Subscribe(context.Background(), eventbus.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	compare(t, c, publishedHelp+"eventbus_events_published_total 5\n", "eventbus_events_published_total")

	// b goes: its events still count, the counter never goes down.
	hub.Delete("b")
	st := hub.Stats()
	compare(t, c, fmt.Sprintf(`
# HELP eventbus_sessions Sessions the hub holds now.
# TYPE eventbus_sessions gauge
eventbus_sessions 1
# HELP eventbus_ring_bytes Bytes in every session's replay ring now, as the budget counts them (at most eventbus_ring_budget_bytes).
# TYPE eventbus_ring_bytes gauge
eventbus_ring_bytes %d
# HELP eventbus_ring_budget_bytes The hub's bound on the sum of every ring's bytes (HubOptions.MaxTotalBytes).
# TYPE eventbus_ring_budget_bytes gauge
eventbus_ring_budget_bytes %d
# HELP eventbus_ring_events Events in every session's replay ring now.
# TYPE eventbus_ring_events gauge
eventbus_ring_events 3
# HELP eventbus_subscribers Subscriptions (open streams) of every session now.
# TYPE eventbus_subscribers gauge
eventbus_subscribers 1
# HELP eventbus_sessions_created_total Sessions the hub created.
# TYPE eventbus_sessions_created_total counter
eventbus_sessions_created_total 2
`+closedHelp+`eventbus_sessions_closed_total{reason="deleted"} 1
eventbus_sessions_closed_total{reason="expired"} 0
# HELP eventbus_sessions_refused_total New sessions refused because the hub was full of live sessions (ErrHubFull).
# TYPE eventbus_sessions_refused_total counter
eventbus_sessions_refused_total 1
`+publishedHelp+`eventbus_events_published_total 5
# HELP eventbus_publishes_rejected_total Publishes refused, by reason.
# TYPE eventbus_publishes_rejected_total counter
eventbus_publishes_rejected_total{reason="closed"} 0
eventbus_publishes_rejected_total{reason="invalid"} 1
eventbus_publishes_rejected_total{reason="too_large"} 0
`, st.RingBytes, eventbus.DefaultMaxTotalBytes),
		"eventbus_sessions", "eventbus_ring_bytes", "eventbus_ring_budget_bytes", "eventbus_ring_events", "eventbus_subscribers",
		"eventbus_sessions_created_total", "eventbus_sessions_closed_total", "eventbus_sessions_refused_total",
		"eventbus_events_published_total", "eventbus_publishes_rejected_total")
	if st.RingBytes <= 0 {
		t.Fatalf("ring bytes %d", st.RingBytes)
	}
}

// Counters stay monotonic while sessions expire and come back, and the
// expiries are counted by reason.
func TestCollectorCountersSurviveExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hub := newHub(t, eventbus.HubOptions{IdleTimeout: time.Minute})
		c := ebprom.NewCollector(hub)
		total := 0
		for round := range 5 {
			for s := range 3 {
				publish(t, hub, fmt.Sprintf("s%d", s), round+1)
				total += round + 1
			}
			compare(t, c, publishedHelp+fmt.Sprintf("eventbus_events_published_total %d\n", total), "eventbus_events_published_total")
			time.Sleep(2 * time.Minute) // every session expires
			synctest.Wait()
		}
		final := publishedHelp + fmt.Sprintf("eventbus_events_published_total %d\n", total) + closedHelp +
			`eventbus_sessions_closed_total{reason="deleted"} 0
eventbus_sessions_closed_total{reason="expired"} 15
`
		compare(t, c, final, "eventbus_events_published_total", "eventbus_sessions_closed_total")
		// Exact, not only monotonic: a collector that never saw a session
		// counts every event of every session that has gone.
		compare(t, ebprom.NewCollector(hub), final, "eventbus_events_published_total", "eventbus_sessions_closed_total")
	})
}

// What the budget counts beyond the rings is exported: the bytes a
// subscriber that never reads holds after its ring dropped them, the
// subscriber shed when they take the budget over (evicted, reason
// memory_budget), and the idempotency keys.
func TestCollectorReportsPinsAndKeys(t *testing.T) {
	hub := newHub(t, eventbus.HubOptions{MaxTotalBytes: 64 << 10, Bus: eventbus.Options{RingSize: 2, MaxEventBytes: 8 << 10}})
	c := ebprom.NewCollector(hub)
	if _, _, _, err := hub.PublishIdempotent("k", "key-1", eventbus.Event{Type: "note"}); err != nil {
		t.Fatal(err)
	}
	bus, err := hub.GetOrCreate("slow")
	if err != nil {
		t.Fatal(err)
	}
	sub, err := bus.Subscribe(context.Background(), eventbus.SubscribeOptions{}) // never read
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	big := eventbus.Event{Type: "note", Data: []byte(`"` + strings.Repeat("x", 2000) + `"`)}
	for range 5 {
		if _, err := hub.Publish("slow", big); err != nil {
			t.Fatal(err)
		}
	}
	if st := hub.Stats(); st.PinnedBytes <= 0 {
		t.Fatalf("nothing pinned: %+v", st)
	}
	compare(t, c, fmt.Sprintf(`
# HELP eventbus_pinned_bytes Bytes subscribers hold beyond their sessions' rings now, as the hub's budget counts them (HubStats.PinnedBytes).
# TYPE eventbus_pinned_bytes gauge
eventbus_pinned_bytes %d
# HELP eventbus_idempotency_keys Idempotency keys the sessions remember now (Hub.PublishIdempotent).
# TYPE eventbus_idempotency_keys gauge
eventbus_idempotency_keys 1
`, hub.Stats().PinnedBytes), "eventbus_pinned_bytes", "eventbus_idempotency_keys")
	for i := 0; hub.Stats().BudgetShed == 0; i++ {
		if i == 200 {
			t.Fatal("the stalled subscriber was never shed")
		}
		if _, err := hub.Publish("slow", big); err != nil {
			t.Fatal(err)
		}
	}
	compare(t, c, `
# HELP eventbus_budget_shed_subscribers_total Subscribers the hub's budget acted on for what they held beyond the rings (evicted, put behind, or their draining frames dropped).
# TYPE eventbus_budget_shed_subscribers_total counter
eventbus_budget_shed_subscribers_total 1
`, "eventbus_budget_shed_subscribers_total")
	compare(t, c, `
# HELP eventbus_evictions_total Subscribers evicted (client_evicted), by reason.
# TYPE eventbus_evictions_total counter
eventbus_evictions_total{reason="catchup_stalled"} 0
eventbus_evictions_total{reason="memory_budget"} 1
eventbus_evictions_total{reason="queue_bytes_overflow"} 0
eventbus_evictions_total{reason="queue_overflow"} 0
eventbus_evictions_total{reason="repeated_overflow"} 0
`, "eventbus_evictions_total")
}
