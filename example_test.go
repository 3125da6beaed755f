package eventbus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/ssebus/eventbus"
)

// exampleClock is a fixed clock, so that serverTimestamp is the same on
// every run.
func exampleClock() time.Time { return time.UnixMilli(1719000000000) }

// exampleData returns the "data" member of a frame's envelope.
func exampleData(f eventbus.Frame) string {
	var env struct {
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(f.JSON(), &env); err != nil {
		panic(err)
	}
	return string(env.Data)
}

// A bus per session: publish events, and stream them to a subscriber in
// the Server-Sent Events format.
func Example() {
	bus, err := eventbus.New(eventbus.Options{Now: exampleClock})
	if err != nil {
		panic(err)
	}
	defer bus.Close()

	// The request context of the SSE route: when the client goes away, the
	// subscription ends.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub, err := bus.Subscribe(ctx, eventbus.SubscribeOptions{})
	if err != nil {
		panic(err)
	}

	// Registration is synchronous: both events reach sub.
	if _, err := bus.Publish(eventbus.Event{
		Type:               "session_update",
		Data:               map[string]string{"title": "Draft"},
		OriginatorClientID: "c1",
	}); err != nil {
		panic(err)
	}
	if _, err := bus.Publish(eventbus.Event{Type: "message", Data: "hello"}); err != nil {
		panic(err)
	}

	// Close ends every subscription after its queued frames.
	bus.Close()
	for f := range sub.Events() {
		fmt.Print(string(f.AppendSSE(nil)))
	}
	// Output:
	// id: 1
	// event: session_update
	// data: {"id":1,"v":1,"type":"session_update","data":{"title":"Draft"},"_meta":{"serverTimestamp":1719000000000},"originatorClientId":"c1"}
	//
	// id: 2
	// event: message
	// data: {"id":2,"v":1,"type":"message","data":"hello","_meta":{"serverTimestamp":1719000000000}}
}

// A client that reconnects with Last-Event-ID gets what it missed from the
// ring, then replay_complete, then the live stream. A client whose cursor
// comes from an earlier bus (say, before a daemon restart) is told to
// resync and gets the whole ring.
func Example_resume() {
	bus, err := eventbus.New(eventbus.Options{Now: exampleClock})
	if err != nil {
		panic(err)
	}
	defer bus.Close()
	for i := 1; i <= 5; i++ {
		if _, err := bus.Publish(eventbus.Event{Type: "tick", Data: i}); err != nil {
			panic(err)
		}
	}

	ctx := context.Background()
	// Last-Event-ID: 3, and the Event-Epoch header it saw on this bus.
	resumed, _ := bus.Subscribe(ctx, eventbus.SubscribeOptions{Resume: true, LastEventID: 3, Epoch: bus.Epoch()})
	// A cursor from another epoch.
	stale, _ := bus.Subscribe(ctx, eventbus.SubscribeOptions{Resume: true, LastEventID: 2, Epoch: "0123456789abcdef0123456789abcdef"})

	if _, err := bus.Publish(eventbus.Event{Type: "tick", Data: 6}); err != nil {
		panic(err)
	}
	bus.Close()

	// The epoch is random: it is printed as <epoch>.
	epoch := func(s string) string { return strings.ReplaceAll(s, bus.Epoch(), "<epoch>") }
	fmt.Println("resumed:")
	for f := range resumed.Events() {
		fmt.Println(f.ID(), f.Type(), epoch(string(f.JSON())))
	}
	fmt.Println("stale:")
	for f := range stale.Events() {
		if f.Synthetic() {
			fmt.Println(f.Type(), epoch(exampleData(f)))
		} else {
			fmt.Println(f.ID(), f.Type())
		}
	}
	// Output:
	// resumed:
	// 4 tick {"id":4,"v":1,"type":"tick","data":4,"_meta":{"serverTimestamp":1719000000000}}
	// 5 tick {"id":5,"v":1,"type":"tick","data":5,"_meta":{"serverTimestamp":1719000000000}}
	// 0 replay_complete {"v":1,"type":"replay_complete","data":{"replayedCount":2,"lastReplayedEventId":5,"lastEventId":5,"epoch":"<epoch>"},"_meta":{"serverTimestamp":1719000000000}}
	// 6 tick {"id":6,"v":1,"type":"tick","data":6,"_meta":{"serverTimestamp":1719000000000}}
	// stale:
	// state_resync_required {"reason":"epoch_reset","detail":"epoch_mismatch","lastDeliveredId":2,"earliestAvailableId":1,"epoch":"<epoch>"}
	// 1 tick
	// 2 tick
	// 3 tick
	// 4 tick
	// 5 tick
	// replay_complete {"replayedCount":5,"lastReplayedEventId":5,"lastEventId":5,"epoch":"<epoch>"}
	// 6 tick
}

// A subscriber that does not keep up is warned once its queue is 3/4 full,
// and evicted when it overflows: it still gets what was queued, then a
// terminal client_evicted frame. The publisher never waits for it.
func Example_eviction() {
	bus, err := eventbus.New(eventbus.Options{
		Now:    exampleClock,
		Logger: slog.New(slog.DiscardHandler), // the diagnostics are not part of the output
	})
	if err != nil {
		panic(err)
	}
	defer bus.Close()

	slow, _ := bus.Subscribe(context.Background(), eventbus.SubscribeOptions{MaxQueued: 16})
	for i := range 20 { // nobody reads: #17 overflows the 16-frame queue
		if _, err := bus.Publish(eventbus.Event{Type: "tick", Data: i}); err != nil {
			panic(err)
		}
	}
	fmt.Println("subscribers:", bus.SubscriberCount())

	var ids []string
	for f := range slow.Events() {
		if !f.Synthetic() {
			ids = append(ids, fmt.Sprint(f.ID()))
			continue
		}
		fmt.Println("events:", strings.Join(ids, " "))
		ids = nil
		fmt.Println(f.Type(), exampleData(f), "terminal:", f.Terminal())
	}
	fmt.Println("evicted:", errors.Is(slow.Err(), eventbus.ErrEvicted))
	// Output:
	// subscribers: 0
	// events: 1 2 3 4 5 6 7 8 9 10 11 12
	// slow_client_warning {"queueSize":12,"maxQueued":16,"lastEventId":12,"queuedBytes":953,"maxQueuedBytes":2097152,"threshold":"frames"} terminal: false
	// events: 13 14 15 16
	// client_evicted {"reason":"queue_overflow","droppedAfter":17,"queueSize":16,"maxQueued":16,"queuedBytes":1277,"maxQueuedBytes":2097152} terminal: true
	// evicted: true
}
