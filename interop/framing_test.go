package interop

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// The control for TestThirdPartyClients: the framing the handler used to
// send before issue 15 (a "retry:" block and ": heartbeat" blocks, each
// ended by a blank line; SPEC 5.3 has today's) makes the Go clients report
// events nobody published, and the handler's current framing does not. Each
// server sends one event among those lines, then ends; the clients run
// until it has been requested twice (they reconnect after the end).
func TestFramingControl(t *testing.T) {
	const event = "id: 1\nevent: note\ndata: {\"id\":1}\n\n"
	for _, tc := range []struct {
		name, body string
		phantoms   bool
	}{
		{"old: blocks of their own", "retry: 100\n\n: heartbeat\n\n" + event + ": heartbeat\n\n: heartbeat\n\n", true},
		{"new: lines in the next block", "retry: 100\n:\n" + event + "retry: 100\n:\nid: 2\nevent: note\ndata: {\"id\":2}\n\n", false},
	} {
		for _, start := range []struct {
			name string
			fn   starter
		}{{"go-sse", startGoSSE}, {"r3labs", startR3labs}} {
			t.Run(tc.name+"/"+start.name, func(t *testing.T) {
				var requests atomic.Int32
				ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					requests.Add(1)
					w.Header().Set("Content-Type", "text/event-stream")
					io.WriteString(w, tc.body)
				}))
				defer ts.Close()
				ctx, cancel := context.WithCancel(context.Background())
				c := &client{name: start.name}
				wait := start.fn(t, ctx, c, ts.URL)
				deadline := time.Now().Add(10 * time.Second)
				for requests.Load() < 2 && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				cancel()
				wait()
				ts.CloseClientConnections()
				empty := 0
				for _, r := range c.records() {
					if r.Kind == "event" && r.Data == "" {
						empty++
					}
				}
				if tc.phantoms && empty == 0 {
					t.Fatalf("no empty event from the old framing: %+v", c.records())
				}
				if !tc.phantoms && empty > 0 {
					t.Fatalf("%d empty events from the new framing: %+v", empty, c.records())
				}
				t.Logf("%d empty events in %d records", empty, len(c.records()))
			})
		}
	}
}
