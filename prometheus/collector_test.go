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
