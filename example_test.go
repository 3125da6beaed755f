package eventbus_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/sseclient"
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
		fmt.Print(string(f.SSE()))
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

// A transport of its own, written outside the package with exported API
// only, as the Handler is: take a batch into a reused slice, write each
// frame's shared encoding, flush, and report the batch once.
func ExampleSubscription_TakeReady() {
	bus, _ := eventbus.New(eventbus.Options{
		Now:          func() time.Time { return time.UnixMilli(1719000000000) },
		OnDiagnostic: func(eventbus.Diagnostic) bool { return true }, // no log lines in the example
	})
	defer bus.Close()
	sub, _ := bus.Subscribe(context.Background(), eventbus.SubscribeOptions{})
	defer sub.Close()
	_, _ = bus.Publish(eventbus.Event{Type: "greeting", Data: "hello"})
	_, _ = bus.Publish(eventbus.Event{Type: "greeting", Data: "again"})

	var conn bytes.Buffer // the transport's connection
	write := func(batch []eventbus.Frame) error {
		for _, f := range batch {
			conn.Write(f.SSE()) // shared bytes: written, never modified
		}
		return nil // a real transport flushes here, under a deadline
	}

	var batch []eventbus.Frame
	batch, open := sub.TakeReady(batch[:0]) // never blocks; wait on sub.Ready() when empty
	if err := write(batch); err != nil {
		sub.CloseBlocked(len(batch), err) // the batch and the queue count as dropped (blocked)
		return
	}
	sub.MarkWritten(len(batch)) // delivered only once written
	clear(batch)                // do not pin frames while idle

	fmt.Print(conn.String())
	fmt.Println("open:", open, "delivered:", bus.Stats().FramesDelivered)

	// A write that fails: the frames taken are reported as blocked.
	_, _ = bus.Publish(eventbus.Event{Type: "greeting", Data: "lost"})
	batch, _ = sub.TakeReady(batch[:0])
	sub.CloseBlocked(len(batch), errors.New("write: broken pipe"))
	fmt.Println("blocked:", bus.Stats().Dropped.Blocked)
	// Output:
	// id: 1
	// event: greeting
	// data: {"id":1,"v":1,"type":"greeting","data":"hello","_meta":{"serverTimestamp":1719000000000}}
	//
	// id: 2
	// event: greeting
	// data: {"id":2,"v":1,"type":"greeting","data":"again","_meta":{"serverTimestamp":1719000000000}}
	//
	// open: true delivered: 2
	// blocked: 1
}

// A hub holds a daemon's sessions: lookups never create one, a publish
// does, and a session the hub let go comes back with a new epoch.
func ExampleHub() {
	hub, err := eventbus.NewHub(eventbus.HubOptions{
		MaxSessions:   2,
		IdleTimeout:   10 * time.Minute,
		MaxTotalBytes: 64 << 20,
		Bus:           eventbus.Options{Now: exampleClock},
	})
	if err != nil {
		panic(err)
	}
	defer hub.Close()

	_, ok := hub.Lookup("doc-7")
	fmt.Println("before any publish:", ok)

	for i := range 3 {
		if _, err := hub.Publish("doc-7", eventbus.Event{Type: "edit", Data: json.RawMessage(fmt.Sprint(i))}); err != nil {
			panic(err)
		}
	}
	bus, _ := hub.Lookup("doc-7")
	sub, _ := bus.Subscribe(context.Background(), eventbus.SubscribeOptions{Resume: true, LastEventID: 1})
	frames, _ := sub.AppendReady(nil)
	for _, f := range frames {
		fmt.Println(f.ID(), f.Type())
	}
	sub.Close()

	_, _ = hub.Publish("doc-8", eventbus.Event{Type: "edit"})
	_, err = hub.Publish("doc-9", eventbus.Event{Type: "edit"})
	fmt.Println("a third session:", errors.Is(err, eventbus.ErrHubFull))

	oldEpoch := bus.Epoch()
	hub.Delete("doc-7")
	again, _ := hub.GetOrCreate("doc-7")
	fmt.Println("new epoch:", again.Epoch() != oldEpoch)

	st := hub.Stats()
	fmt.Println("sessions:", st.Sessions, "published:", st.Buses.Published, "refused:", st.Refused)
	// Output:
	// before any publish: false
	// 2 edit
	// 3 edit
	// 0 replay_complete
	// a third session: true
	// new epoch: true
	// sessions: 2 published: 4 refused: 1
}

// A daemon serves each session's stream and, for pages that watch several
// sessions on one connection, the multiplexed stream beside it, with the
// same settings. Every frame names its session, and the id: line of every
// event is the composite cursor, which a client parses with ParseCursor.
func ExampleMuxHandler() {
	hub, _ := eventbus.NewHub(eventbus.HubOptions{Bus: eventbus.Options{Now: exampleClock}})
	defer hub.Close()
	single := &eventbus.Handler{Lookup: hub.LookupSession}
	routes := http.NewServeMux()
	routes.Handle("GET /session/{id}/events", single)
	routes.Handle("GET /events", &eventbus.MuxHandler{Handler: single}) // the same Lookup and Authorize, once per session
	srv := httptest.NewServer(routes)
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()

	_, _ = hub.GetOrCreate("build")
	_, _ = hub.GetOrCreate("chat")
	resp, err := srv.Client().Get(srv.URL + "/events?session=build&session=chat")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	_, _ = hub.Publish("chat", eventbus.Event{Type: "message", Data: "hello"})

	stream := sseclient.NewParser(resp.Body)
	m, err := stream.Next()
	for err == nil && m.Kind != sseclient.KindEvent { // the retry field
		m, err = stream.Next()
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	// The id: line is the composite cursor of both sessions, an opaque
	// token a client sends back as Last-Event-ID to resume each session
	// exactly (docs/SPEC.md 6.8; sseclient and the JS client keep it).
	fmt.Printf("id: %s…, %d bytes: 2 + 24 per session\n", m.ID[:2], len(m.ID))
	var env struct{ Session, Type, Data string }
	_ = json.Unmarshal(m.Data, &env)
	fmt.Println(env.Session, env.Type, env.Data)
	// Output:
	// id: m1…, 50 bytes: 2 + 24 per session
	// chat message hello
}
