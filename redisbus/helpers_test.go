package redisbus

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ssebus/eventbus/backplane/backplanetest"
)

// replica is one daemon replica in-process: its own Redis client,
// backplane, readers' gate and HTTP server.
type replica struct {
	name   string
	bp     *Backplane
	gate   *backplanetest.Gate
	srv    *httptest.Server
	shared *backplanetest.Replica // the same, for the shared helpers
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

// newBackplane returns a backplane on r with opts, closed when t ends,
// and the gate its readers wait at.
func newBackplane(t testing.TB, r *redisServer, opts Options) (*Backplane, *backplanetest.Gate) {
	t.Helper()
	bp, err := New(r.client(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bp.Close() })
	g := backplanetest.NewGate()
	hook := g.Wait
	bp.readHook.Store(&hook)
	return bp, g
}

func newReplica(t testing.TB, r *redisServer, name string, opts Options) *replica {
	t.Helper()
	bp, g := newBackplane(t, r, opts)
	shared := backplanetest.NewReplica(t, name, bp)
	return &replica{name: name, bp: bp, gate: g, srv: shared.Server, shared: shared}
}

func threeReplicas(t *testing.T, r *redisServer, opts Options) (a, b, c *replica) {
	return newReplica(t, r, "A", opts), newReplica(t, r, "B", opts), newReplica(t, r, "C", opts)
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

// harness is the conformance suite's: n replicas on a redis-server of
// their own; Down pauses it (a hung Redis), Lose restarts it (without
// persistence: every stream is lost).
var harness = backplanetest.Harness{
	Start: func(t testing.TB, n int, o backplanetest.Options) backplanetest.Cluster {
		r := startRedis(t)
		opts := testOptions(t)
		o.Apply(&opts.Bus, &opts.PublishTimeout, &opts.OutageTimeout, &opts.IdleTimeout, &opts.IdempotencyWindow)
		c := backplanetest.Cluster{Down: r.pause, Up: r.resume, Lose: r.restart}
		for range n {
			bp, g := newBackplane(t, r, opts)
			c.Replicas = append(c.Replicas, bp)
			c.Gates = append(c.Gates, g)
		}
		return c
	},
	ErrUnavailable:    ErrUnavailable,
	ErrOutcomeUnknown: ErrOutcomeUnknown,
	ErrInvalidSession: ErrInvalidSession,
	TrimsBytes:        true,
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
