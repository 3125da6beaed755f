package eventbus_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ssebus/eventbus"
)

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
