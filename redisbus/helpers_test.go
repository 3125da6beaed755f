package redisbus

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/internal/backplanetest"
)

// replica is one daemon replica in-process: its own Redis client,
// backplane and HTTP server.
type replica struct {
	name   string
	bp     *Backplane
	srv    *httptest.Server
	shared *backplanetest.Replica // the same, for the shared tests
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
	shared := backplanetest.NewReplica(t, name, bp)
	return &replica{name: name, bp: bp, srv: shared.Server, shared: shared}
}

func (rp *replica) publish(t testing.TB, session, typ string, data any) uint64 {
	t.Helper()
	return rp.shared.Publish(t, session, typ, data)
}

// openSSE opens GET /session/{session}/events on rp with the given headers
// (Last-Event-ID, Event-Epoch) and query; it returns once the response
// headers are in, which is after the subscription is registered.
func openSSE(t testing.TB, rp *replica, session string, header map[string]string, query string) *sse {
	t.Helper()
	return rp.shared.Open(t, session, header, query)
}

// cluster is backplanetest's Cluster: n replicas on a redis-server of
// their own.
func cluster(t *testing.T, n int, tune func(*eventbus.Options)) []*backplanetest.Replica {
	r := startRedis(t)
	opts := testOptions(t)
	if tune != nil {
		tune(&opts.Bus)
	}
	var out []*backplanetest.Replica
	for i := range n {
		out = append(out, newReplica(t, r, string(rune('A'+i)), opts).shared)
	}
	return out
}

// Short names for the shared client and checks.
type sse = backplanetest.Stream

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
