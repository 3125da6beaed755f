package main

import (
	"testing"

	ws "github.com/coder/websocket"
	"github.com/ssebus/eventbus/internal/daemontest"
	"github.com/ssebus/eventbus/websocket"
)

// TestWebSocketAcrossReplicas runs daemontest.WebSocketAcrossReplicas (the
// WebSocket and the multiplexed SSE stream, resumed across replicas, and
// their refusals) on two replicas of this daemon, run in the test's
// process, on one engine.
func TestWebSocketAcrossReplicas(t *testing.T) {
	e := startPG(t)
	a := daemontest.RunReplica(t, run, "pg", e, "A")
	b := daemontest.RunReplica(t, run, "pg", e, "B")
	daemontest.WebSocketAcrossReplicas(t, a, b, &websocket.Dialer{}, closeStatus)
}

// closeStatus is the close code of the error that ended a read of a
// websocket.Dialer's connection, -1 when it is no close frame's: the
// error is github.com/coder/websocket's, which ReadMessage returns as is.
func closeStatus(err error) int { return int(ws.CloseStatus(err)) }
