package websocket_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	ws "github.com/coder/websocket"
	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/websocket"
)

// A daemon serves its sessions over SSE (GET /events) and over a WebSocket
// (GET /ws) with one MuxHandler; a client reads the greeting (the cursor),
// then a message of one event and the cursor after it.
func ExampleHandler() {
	hub, err := eventbus.NewHub(eventbus.HubOptions{
		Bus: eventbus.Options{Now: func() time.Time { return time.UnixMilli(1700000000000) }},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer hub.Close()
	if _, err := hub.GetOrCreate("a"); err != nil {
		log.Fatal(err)
	}

	streams := &eventbus.Handler{Lookup: hub.LookupSession}
	mux := &eventbus.MuxHandler{Handler: streams}
	routes := http.NewServeMux()
	routes.Handle("GET /events", mux)
	routes.Handle("GET /ws", &websocket.Handler{Mux: mux})
	srv := httptest.NewServer(routes)
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := ws.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/ws?session=a",
		&ws.DialOptions{Subprotocols: []string{websocket.Subprotocol}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.CloseNow()
	_, greeting, err := c.Read(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(greeting[:len(`{"op":"cursor"`)]), "(the cursor, alone)")

	if _, err := hub.Publish("a", eventbus.Event{Type: "note", Data: "hello"}); err != nil {
		log.Fatal(err)
	}
	_, msg, err := c.Read(ctx)
	if err != nil {
		log.Fatal(err)
	}
	lines := strings.Split(string(msg), "\n")
	fmt.Println(lines[0])
	fmt.Println(lines[1][:len(`{"op":"cursor"`)], "(the cursor after it)")
	_ = c.Close(ws.StatusNormalClosure, "")
	// Output:
	// {"op":"cursor" (the cursor, alone)
	// {"session":"a","id":1,"v":1,"type":"note","data":"hello","_meta":{"serverTimestamp":1700000000000}}
	// {"op":"cursor" (the cursor after it)
}
