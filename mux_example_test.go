package eventbus_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/sseclient"
)

// A daemon serves each session's stream and, for pages that watch several
// sessions on one connection, the multiplexed stream beside it, with the
// same settings. Every frame names its session, and the id: line of every
// event is the composite cursor, which a client parses with ParseCursor.
func ExampleMuxHandler() {
	hub, _ := eventbus.NewHub(eventbus.HubOptions{Bus: eventbus.Options{Now: exampleClock}})
	defer hub.Close()
	single := &eventbus.Handler{Lookup: hub.LookupRequest}
	routes := http.NewServeMux()
	routes.Handle("GET /session/{id}/events", single)
	routes.Handle("GET /events", &eventbus.MuxHandler{Handler: single, Lookup: hub.LookupSession})
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
	cursor, _ := eventbus.ParseCursor(m.ID)
	chat, _ := cursor.Entry("chat")
	build, _ := cursor.Entry("build")
	fmt.Println("cursor: chat at", chat.ID, "build at", build.ID)
	var env struct{ Session, Type, Data string }
	_ = json.Unmarshal(m.Data, &env)
	fmt.Println(env.Session, env.Type, env.Data)
	// Output:
	// cursor: chat at 1 build at 0
	// chat message hello
}
