package redisbus

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/internal/backplanetest"
)

// replica is one daemon replica in-process: its own Redis client,
// backplane and HTTP server.
type replica struct {
	name string
	bp   *Backplane
	srv  *httptest.Server
}

// testOptions are quick to notice changes and to close.
func testOptions(t testing.TB) Options {
	return Options{
		KeyPrefix:      "t:" + t.Name() + ":",
		ReadBlock:      100 * time.Millisecond,
		PublishTimeout: time.Second,
		IdleTimeout:    time.Hour,
	}
}

func newReplica(t testing.TB, r *redisServer, name string, opts Options) *replica {
	t.Helper()
	client := r.client(t)
	bp, err := New(client, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bp.Close() })
	mux := http.NewServeMux()
	h := bp.Handler()
	h.Heartbeat = time.Hour
	mux.Handle("GET /session/{id}/events", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &replica{name: name, bp: bp, srv: srv}
}

func (rp *replica) publish(t testing.TB, session, typ string, data any) uint64 {
	t.Helper()
	id, _, err := rp.bp.Publish(context.Background(), session, eventbus.Event{Type: typ, Data: data})
	if err != nil {
		t.Fatalf("%s: publish: %v", rp.name, err)
	}
	return id
}

// openSSE opens GET /session/{session}/events on rp with the given headers
// (Last-Event-ID, Event-Epoch) and query; it returns once the response
// headers are in, which is after the subscription is registered.
func openSSE(t testing.TB, rp *replica, session string, header map[string]string, query string) *sse {
	t.Helper()
	url := rp.srv.URL + "/session/" + session + "/events"
	if query != "" {
		url += "?" + query
	}
	return backplanetest.Open(t, rp.srv.Client(), url, header)
}

// Short names for the shared client and checks.
type (
	frame = backplanetest.Frame
	sse   = backplanetest.Stream
)

var (
	wantIDs = backplanetest.WantIDs
	waitFor = backplanetest.WaitFor
)

// liveReplica starts a replica with opts and one live stream of session
// "s" that has received the event with id 1.
func liveReplica(t testing.TB, r *redisServer, opts Options) (*replica, *sse) {
	t.Helper()
	a := newReplica(t, r, "A", opts)
	s := openSSE(t, a, "s", nil, "")
	a.publish(t, "s", "e", nil)
	wantIDs(t, s.Events(1, wait), 1, 1)
	return a, s
}

// lateMirror publishes 20 events of session "s" on a while c's only live
// stream of it opens after the 10th, so that c's ring starts at 11; it
// returns that stream, which has read 11 to 20.
func lateMirror(t testing.TB, a, c *replica) *sse {
	t.Helper()
	for range 10 {
		a.publish(t, "s", "e", nil)
	}
	live := openSSE(t, c, "s", nil, "")
	for range 10 {
		a.publish(t, "s", "e", nil)
	}
	wantIDs(t, live.Events(10, wait), 11, 20)
	return live
}
