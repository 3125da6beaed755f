// Package websocket serves package eventbus's multiplexed stream (several
// sessions on one connection, one composite cursor) over a WebSocket, with
// github.com/coder/websocket, on the root package's exported transport
// seam alone (eventbus.Transport, eventbus.Stream, MuxHandler.OpenStream).
//
// Mount a Handler beside the SSE routes, on the MuxHandler whose Handler
// (Lookup, Authorize, Revoke, Heartbeat, WriteTimeout, CORS, Logger) it
// applies:
//
//	mux := &eventbus.MuxHandler{Handler: streams}
//	http.Handle("GET /events", mux)
//	http.Handle("GET /ws", &websocket.Handler{Mux: mux})
//
// The wire (docs/SPEC.md 6.10): each batch of the stream is one text
// message of lines joined by "\n". A frame's line is the multiplexed SSE
// route's data: envelope, byte for byte ({"session":"a","id":7,...}); a
// control line starts {"op": — {"op":"cursor","cursor":"m1..."} last
// whenever the cursor moved (the first message is the cursor alone),
// {"op":"added"}, {"op":"removed"} and {"op":"error"} in answer to the
// client's {"op":"add","session":...,"lastEventId":...} and
// {"op":"remove","session":...}. The cursor is the SSE route's: a client
// resumes over either transport with the other's cursor, losing nothing
// and getting nothing twice. A stream that ends by itself is closed with a
// code that says why (1000, 1001, StatusReauthenticate, StatusRevoked,
// StatusEvicted, 1011).
//
// ServeHTTP returns once the connection is upgraded; the stream is then
// served on a goroutine of its own until it ends, under the context
// Handler.StreamContext gives (by default the request's values without its
// cancellation), so that an idle connection does not keep the request's
// goroutine and net/http's state.
package websocket
