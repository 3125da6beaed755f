package eventbus_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/ssebus/eventbus"
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

	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if id, ok := strings.CutPrefix(lines.Text(), "id: "); ok {
			cursor, _ := eventbus.ParseCursor(id)
			chat, _ := cursor.Entry("chat")
			build, _ := cursor.Entry("build")
			fmt.Println("cursor: chat at", chat.ID, "build at", build.ID)
		}
		if data, ok := strings.CutPrefix(lines.Text(), "data: "); ok {
			var env struct{ Session, Type, Data string }
			_ = json.Unmarshal([]byte(data), &env)
			fmt.Println(env.Session, env.Type, env.Data)
			break
		}
	}
	// Output:
	// cursor: chat at 1 build at 0
	// chat message hello
}
