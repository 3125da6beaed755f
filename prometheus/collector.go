// Package ebprom exports the metrics of an eventbus.Hub to Prometheus: a
// prometheus.Collector that reads Hub.Stats at each scrape.
//
// It lives in its own module (github.com/ssebus/eventbus/prometheus) so
// that package eventbus keeps no dependency: import it only in a daemon
// that serves Prometheus metrics.
//
//	hub, _ := eventbus.NewHub(eventbus.HubOptions{})
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(ebprom.NewCollector(hub))
//	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// The metrics: gauges for what is now, counters (_total) for what
// happened, with a "reason" label where the library counts reasons apart.
//
//	eventbus_sessions                      gauge    sessions held (HubStats.Sessions)
//	eventbus_ring_bytes                    gauge    bytes in every ring (HubStats.RingBytes)
//	eventbus_ring_budget_bytes             gauge    HubOptions.MaxTotalBytes
//	eventbus_ring_events                   gauge    events in every ring
//	eventbus_subscribers                   gauge    open subscriptions
//	eventbus_subscribers_behind            gauge    OverflowCatchUp subscribers reading the ring
//	eventbus_sessions_created_total        counter  sessions created
//	eventbus_sessions_closed_total         counter  reason: expired, deleted
//	eventbus_sessions_refused_total        counter  ErrHubFull answers
//	eventbus_pinned_bytes                  gauge    bytes subscribers hold beyond the rings
//	                                                (HubStats.PinnedBytes)
//	eventbus_idempotency_keys              gauge    idempotency keys the sessions remember
//	eventbus_idempotency_bytes             gauge    what the budget counts for them
//	eventbus_budget_trimmed_events_total   counter  events trimmed to keep MaxTotalBytes
//	eventbus_budget_shed_subscribers_total counter  subscribers the budget acted on for
//	                                                what they held beyond the rings
//	eventbus_events_published_total       counter  events given an id
//	eventbus_publishes_rejected_total      counter  reason: invalid, too_large, closed
//	eventbus_signals_total                 counter  change signals
//	eventbus_frames_delivered_total        counter  frames that reached their consumer
//	eventbus_frames_dropped_total          counter  reason: coalesced, overflow, replay_budget,
//	                                                cancelled, blocked, catchup_signal,
//	                                                memory_budget
//	eventbus_evictions_total               counter  reason: queue_overflow, queue_bytes_overflow,
//	                                                repeated_overflow, catchup_stalled,
//	                                                memory_budget
//	eventbus_resyncs_total                 counter  reason: epoch_reset, ring_evicted,
//	                                                replay_budget_exceeded, queue_overflow,
//	                                                queue_bytes_overflow, cursor_invalid
//	eventbus_slow_client_warnings_total    counter  slow_client_warning frames
//	eventbus_catchup_entered_total         counter  times a subscriber fell behind
//	eventbus_catchup_frames_served_total   counter  frames read from the ring while behind
//
// Every reason of a labelled counter is exported from the first scrape
// on, at 0 until it happens, so that rate() and alerts see it.
package ebprom

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/ssebus/eventbus"
)

// Collector is a prometheus.Collector of one hub. Register it once; its
// Collect is safe for concurrent use and takes no bus lock (it calls
// Hub.Stats). The counters are HubStats.Buses', which cover every bus
// since NewHub, expired and deleted ones included, so they never go down.
type Collector struct {
	hub *eventbus.Hub
}

// NewCollector returns a Collector of hub. It holds hub but owns nothing:
// closing the hub is the caller's, and a collector of a closed hub reports
// its final counters and no sessions.
func NewCollector(hub *eventbus.Hub) *Collector {
	return &Collector{hub: hub}
}

// metric is one exported metric: its description and, for each label
// value (or once, without labels), how to read it.
type metric struct {
	desc   *prometheus.Desc
	kind   prometheus.ValueType
	values []labelled
}

type labelled struct {
	label string // "" without a label
	value func(h *eventbus.HubStats, b *eventbus.Stats) uint64
}

func gauge(name, help string, v func(h *eventbus.HubStats, b *eventbus.Stats) uint64) metric {
	return metric{desc: prometheus.NewDesc(name, help, nil, nil), kind: prometheus.GaugeValue, values: []labelled{{"", v}}}
}

func counter(name, help string, v func(h *eventbus.HubStats, b *eventbus.Stats) uint64) metric {
	return metric{desc: prometheus.NewDesc(name, help, nil, nil), kind: prometheus.CounterValue, values: []labelled{{"", v}}}
}

func byReason(name, help string, values ...labelled) metric {
	return metric{desc: prometheus.NewDesc(name, help, []string{"reason"}, nil), kind: prometheus.CounterValue, values: values}
}

// metrics are the collector's metrics, in the order Collect sends them
// (the package documentation lists them).
var metrics = []metric{
	gauge("eventbus_sessions", "Sessions the hub holds now.",
		func(h *eventbus.HubStats, _ *eventbus.Stats) uint64 { return uint64(h.Sessions) }),
	gauge("eventbus_ring_bytes", "Bytes in every session's replay ring now, as the budget counts them (at most eventbus_ring_budget_bytes).",
		func(h *eventbus.HubStats, _ *eventbus.Stats) uint64 { return uint64(h.RingBytes) }),
	gauge("eventbus_ring_budget_bytes", "The hub's bound on the sum of every ring's bytes (HubOptions.MaxTotalBytes).",
		func(h *eventbus.HubStats, _ *eventbus.Stats) uint64 { return uint64(h.MaxTotalBytes) }),
	gauge("eventbus_ring_events", "Events in every session's replay ring now.",
		func(h *eventbus.HubStats, _ *eventbus.Stats) uint64 { return uint64(h.Buses.RingLen) }),
	gauge("eventbus_subscribers", "Subscriptions (open streams) of every session now.",
		func(h *eventbus.HubStats, _ *eventbus.Stats) uint64 { return uint64(h.Buses.Subscribers) }),
	gauge("eventbus_subscribers_behind", "Subscribers under OverflowCatchUp reading from the ring now.",
		func(h *eventbus.HubStats, _ *eventbus.Stats) uint64 { return uint64(h.Buses.CatchUp.Behind) }),

	counter("eventbus_sessions_created_total", "Sessions the hub created.",
		func(h *eventbus.HubStats, _ *eventbus.Stats) uint64 { return h.Created }),
	byReason("eventbus_sessions_closed_total", "Sessions the hub closed and forgot, by reason: idle expiry or Delete.",
		labelled{"expired", func(h *eventbus.HubStats, _ *eventbus.Stats) uint64 { return h.Expired }},
		labelled{"deleted", func(h *eventbus.HubStats, _ *eventbus.Stats) uint64 { return h.Deleted }}),
	counter("eventbus_sessions_refused_total", "New sessions refused because the hub was full of live sessions (ErrHubFull).",
		func(h *eventbus.HubStats, _ *eventbus.Stats) uint64 { return h.Refused }),
	gauge("eventbus_pinned_bytes", "Bytes subscribers hold beyond their sessions' rings now, as the hub's budget counts them (HubStats.PinnedBytes).",
		func(h *eventbus.HubStats, _ *eventbus.Stats) uint64 { return uint64(h.PinnedBytes) }),
	gauge("eventbus_idempotency_keys", "Idempotency keys the sessions remember now (Hub.PublishIdempotent).",
		func(h *eventbus.HubStats, _ *eventbus.Stats) uint64 { return uint64(h.IdempotencyKeys) }),
	gauge("eventbus_idempotency_bytes", "What the hub's budget counts for the idempotency keys now.",
		func(h *eventbus.HubStats, _ *eventbus.Stats) uint64 { return uint64(h.IdempotencyBytes) }),
	counter("eventbus_budget_trimmed_events_total", "Events removed from rings to keep the hub's byte budget.",
		func(h *eventbus.HubStats, _ *eventbus.Stats) uint64 { return h.BudgetTrimmed }),
	counter("eventbus_budget_shed_subscribers_total", "Subscribers the hub's budget acted on for what they held beyond the rings (evicted, put behind, or their draining frames dropped).",
		func(h *eventbus.HubStats, _ *eventbus.Stats) uint64 { return h.BudgetShed }),

	counter("eventbus_events_published_total", "Events published (given an id).",
		func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Published }),
	byReason("eventbus_publishes_rejected_total", "Publishes refused, by reason.",
		labelled{"invalid", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Rejected.Invalid }},
		labelled{"too_large", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Rejected.TooLarge }},
		labelled{"closed", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Rejected.Closed }}),
	counter("eventbus_signals_total", "Change signals accepted.",
		func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Signals }),
	counter("eventbus_frames_delivered_total", "Frames that reached their consumer (written and flushed, for the Handler).",
		func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.FramesDelivered }),
	byReason("eventbus_frames_dropped_total", "Frames due to a subscriber that never reached it, by reason.",
		labelled{"coalesced", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Dropped.Coalesced }},
		labelled{"overflow", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Dropped.Overflow }},
		labelled{"replay_budget", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Dropped.ReplayBudget }},
		labelled{"cancelled", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Dropped.Cancelled }},
		labelled{"blocked", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Dropped.Blocked }},
		labelled{"catchup_signal", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Dropped.CatchUpSignals }},
		labelled{"memory_budget", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Dropped.MemoryBudget }}),
	byReason("eventbus_evictions_total", "Subscribers evicted (client_evicted), by reason.",
		labelled{"queue_overflow", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Evictions.QueueOverflow }},
		labelled{"queue_bytes_overflow", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Evictions.QueueBytesOverflow }},
		labelled{"repeated_overflow", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Evictions.RepeatedOverflow }},
		labelled{"catchup_stalled", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Evictions.CatchUpStalled }},
		labelled{"memory_budget", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Evictions.MemoryBudget }}),
	byReason("eventbus_resyncs_total", "state_resync_required frames sent, by reason.",
		labelled{"epoch_reset", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Resyncs.EpochReset }},
		labelled{"ring_evicted", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Resyncs.RingEvicted }},
		labelled{"replay_budget_exceeded", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Resyncs.ReplayBudgetExceeded }},
		labelled{"queue_overflow", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Resyncs.QueueOverflow }},
		labelled{"queue_bytes_overflow", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Resyncs.QueueBytesOverflow }},
		labelled{"cursor_invalid", func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Resyncs.CursorInvalid }}),
	counter("eventbus_slow_client_warnings_total", "slow_client_warning frames sent.",
		func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.Warnings }),
	counter("eventbus_catchup_entered_total", "Times a subscriber under OverflowCatchUp fell behind.",
		func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.CatchUp.Entered }),
	counter("eventbus_catchup_frames_served_total", "Frames subscribers read from the ring while behind.",
		func(_ *eventbus.HubStats, b *eventbus.Stats) uint64 { return b.CatchUp.Served }),
}

// Describe sends the description of every metric.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range metrics {
		ch <- m.desc
	}
}

// Collect reads the hub and its sessions and sends every metric.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	hs := c.hub.Stats()
	for _, m := range metrics {
		for _, l := range m.values {
			v := float64(l.value(&hs, &hs.Buses))
			if l.label == "" {
				ch <- prometheus.MustNewConstMetric(m.desc, m.kind, v)
			} else {
				ch <- prometheus.MustNewConstMetric(m.desc, m.kind, v, l.label)
			}
		}
	}
}
