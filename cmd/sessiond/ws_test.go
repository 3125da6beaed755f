package main

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	ws "github.com/coder/websocket"
)

// GET /ws through the daemon's routes: the envelope of GET /events on each
// line, the cursor line that resumes GET /events, a session added on the
// open socket, and /disconnect cutting the socket as it cuts a stream.
func TestWebSocketThroughTheDaemon(t *testing.T) {
	m := newMuxServer(t, "http1", true, config{})
	m.post(t, "a", 1)
	m.post(t, "b", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, err := ws.Dial(ctx, "ws"+strings.TrimPrefix(m.ts.URL, "http")+"/ws?session=a&lastEventId=0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	read := func() []string {
		t.Helper()
		_, p, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Split(string(p), "\n")
	}
	var cursor string
	var lines []string
	for cursor == "" || len(lines) < 3 { // a#1, a's replay_complete, a cursor line
		for _, l := range read() {
			var ctl struct{ Op, Cursor string }
			if json.Unmarshal([]byte(l), &ctl) == nil && ctl.Op == "cursor" {
				cursor = ctl.Cursor
			}
			lines = append(lines, l)
		}
	}
	// The same envelope as GET /events's data: line.
	s := m.open(t, []string{"a"}, "0")
	f := nextMux(t, s)
	if f.String() != "a#1" {
		t.Fatalf("SSE: %s", f)
	}
	if !strings.Contains(strings.Join(lines, "\n"), `{"session":"a","id":1,`) {
		t.Fatalf("the WebSocket's lines %q hold no envelope of a#1", lines)
	}
	s.close()

	// Add b on the open socket; publish; the cursor after both resumes
	// GET /events exactly.
	if err := c.Write(ctx, ws.MessageText, []byte(`{"op":"add","session":"b"}`)); err != nil {
		t.Fatal(err)
	}
	for added := false; !added; {
		for _, l := range read() {
			added = added || strings.HasPrefix(l, `{"op":"added"`)
		}
	}
	m.post(t, "b", 2)
	m.post(t, "a", 2)
	for seen := 0; seen < 2; {
		for _, l := range read() {
			var ctl struct{ Op, Cursor string }
			if json.Unmarshal([]byte(l), &ctl) == nil && ctl.Op == "cursor" {
				cursor = ctl.Cursor
			} else if strings.HasPrefix(l, `{"session":`) && strings.Contains(l, `"id":2,`) {
				seen++
			}
		}
	}
	m.post(t, "a", 3)
	s = m.open(t, []string{"a", "b"}, cursor)
	if got := []string{nextMux(t, s).String(), nextMux(t, s).String()}; !strings.Contains(strings.Join(got, " "), "a#3") {
		t.Fatalf("SSE from the WebSocket's cursor: %v, want a#3 and the replays' ends", got)
	}
	s.close()

	// /disconnect of a cuts the socket (once the SSE stream, closed by
	// the client, is gone from the server too).
	waitFor(t, "the SSE stream gone", func() bool { return m.srv.subscribers("a") == 1 })
	r := do(t, http.MethodPost, m.ts.URL+"/session/a/disconnect", "")
	if r.json(t)["disconnected"] != float64(1) {
		t.Fatalf("disconnect: %s", r.body)
	}
	for i := 0; ; i++ { // what was written before the cut, then its end
		if _, _, err := c.Read(ctx); err != nil {
			break
		}
		if i == 10 {
			t.Fatal("the socket is still open after /disconnect")
		}
	}
	waitFor(t, "a's subscription gone", func() bool { return m.srv.subscribers("a") == 0 })
}
