package eventbus_test

import (
	"context"
	"encoding/json"
	"errors"
	"expvar"
	"fmt"
	"log/slog"
	"time"

	"github.com/ssebus/eventbus"
)

// sessions publishes one Stats snapshot per live session on expvar's
// /debug/vars, e.g. {"eventbus_sessions": {"demo": {"Published": 3, ...}}}.
// Each scrape calls Stats, which takes no lock and does not allocate.
var sessions = expvar.NewMap("eventbus_sessions")

func ExampleEventBus_Stats() {
	bus, _ := eventbus.New(eventbus.Options{
		MaxQueued: 16,
		Now:       func() time.Time { return time.UnixMilli(1719000000000) }, // a fixed clock, for exact output
		Logger:    slog.New(slog.DiscardHandler),                             // keep the example's output to its prints
	})
	defer bus.Close()
	sessions.Set("demo", expvar.Func(func() any { return bus.Stats() }))
	defer sessions.Delete("demo") // when the session ends

	reader, _ := bus.Subscribe(context.Background(), eventbus.SubscribeOptions{})
	stalled, _ := bus.Subscribe(context.Background(), eventbus.SubscribeOptions{})
	_, _ = bus.Publish(eventbus.Event{Type: "message", Data: "hello"})
	_ = bus.Signal("doc.changed", "doc/1")
	_ = bus.Signal("doc.changed", "doc/1") // replaces the queued one in both queues
	_, _ = bus.Publish(eventbus.Event{Type: "", Data: "no type"})
	frames, _ := reader.AppendReady(nil)
	fmt.Println("reader received:", len(frames))
	for range 16 { // the stalled subscriber overflows its 16 live frames and is evicted
		_, _ = bus.Publish(eventbus.Event{Type: "tick"})
	}

	// What a scraper of /debug/vars reads.
	var s eventbus.Stats
	if err := json.Unmarshal([]byte(sessions.Get("demo").String()), &s); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("published:", s.Published, "signals:", s.Signals, "rejected invalid:", s.Rejected.Invalid)
	fmt.Println("delivered:", s.FramesDelivered, "coalesced:", s.Dropped.Coalesced)
	fmt.Println("subscribers:", s.Subscribers, "peak:", s.PeakSubscribers)
	fmt.Println("warnings:", s.Warnings, "evicted (queue_overflow):", s.Evictions.QueueOverflow)
	fmt.Println("ring:", s.RingLen, "events")
	fmt.Println("stalled evicted:", errors.Is(stalled.Err(), eventbus.ErrEvicted))
	// Output:
	// reader received: 2
	// published: 17 signals: 2 rejected invalid: 1
	// delivered: 2 coalesced: 2
	// subscribers: 1 peak: 2
	// warnings: 2 evicted (queue_overflow): 1
	// ring: 17 events
	// stalled evicted: true
}
