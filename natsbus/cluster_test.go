package natsbus

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
	_ "unsafe" // go:linkname, for the raft timings below

	"github.com/nats-io/nats-server/v2/server"
	"github.com/ssebus/eventbus"
)

// The embedded servers' raft timings, shortened for the cluster tests as
// nats-server's own tests do (its defaults: heartbeats every second,
// elections after 4 to 9 s, a leader steps down 10 s after it lost
// quorum), so that a failover takes a second, not ten. They are set once,
// in TestMain, before any server runs.
//
//go:linkname raftHeartbeat github.com/nats-io/nats-server/v2/server.hbInterval
var raftHeartbeat time.Duration

//go:linkname raftMinElection github.com/nats-io/nats-server/v2/server.minElectionTimeout
var raftMinElection time.Duration

//go:linkname raftMaxElection github.com/nats-io/nats-server/v2/server.maxElectionTimeout
var raftMaxElection time.Duration

//go:linkname raftLostQuorum github.com/nats-io/nats-server/v2/server.lostQuorumInterval
var raftLostQuorum time.Duration

//go:linkname raftLostQuorumCheck github.com/nats-io/nats-server/v2/server.lostQuorumCheck
var raftLostQuorumCheck time.Duration

func fastRaft() {
	raftHeartbeat = 100 * time.Millisecond
	raftMinElection = 500 * time.Millisecond
	raftMaxElection = 1500 * time.Millisecond
	raftLostQuorum = time.Second
	raftLostQuorumCheck = 400 * time.Millisecond
}

// natsCluster is a JetStream cluster of embedded servers on loopback
// ports, each with a store of its own; a node can be stopped and started
// again.
type natsCluster struct {
	nodes []*natsServer
}

func startCluster(t *testing.T, n int) *natsCluster {
	t.Helper()
	ports, cports := make([]int, n), make([]int, n)
	for i := range n {
		ports[i], cports[i] = freePort(t), freePort(t)
	}
	c := &natsCluster{}
	for i := range n {
		var routes []string
		for j := range n {
			if j != i {
				routes = append(routes, "nats://127.0.0.1:"+strconv.Itoa(cports[j]))
			}
		}
		c.nodes = append(c.nodes, &natsServer{t: t, opts: server.Options{
			Host: "127.0.0.1", Port: ports[i], JetStream: true, StoreDir: t.TempDir(),
			NoLog: true, NoSigs: true, ServerName: "n" + strconv.Itoa(i),
			Cluster: server.ClusterOpts{Name: "c", Host: "127.0.0.1", Port: cports[i]},
			Routes:  server.RoutesFromStr(strings.Join(routes, ",")),
		}})
	}
	for _, nd := range c.nodes {
		nd.Start()
		t.Cleanup(nd.Stop)
	}
	// Every node current is not enough: until the meta leader has the
	// stats of every peer, it counts them offline, and a stream of three
	// replicas cannot be placed ("no suitable peers for placement, peer
	// offline", a CI failure).
	waitFor(t, 30*time.Second, "a JetStream meta leader that sees every node online, every node current", func() bool {
		for _, nd := range c.nodes {
			if !nd.Server().JetStreamIsCurrent() {
				return false
			}
		}
		leader := c.metaLeader()
		return leader != nil && len(leader.Server().JetStreamClusterPeers()) == n
	})
	return c
}

// URL is every node's client URL: a client fails over between them.
func (c *natsCluster) URL() string {
	var urls []string
	for _, nd := range c.nodes {
		urls = append(urls, nd.URL())
	}
	return strings.Join(urls, ",")
}

func (c *natsCluster) metaLeader() *natsServer {
	for _, nd := range c.nodes {
		if s := nd.Server(); s != nil && s.JetStreamIsLeader() {
			return nd
		}
	}
	return nil
}

func (c *natsCluster) streamLeader(stream string) *natsServer {
	for _, nd := range c.nodes {
		if s := nd.Server(); s != nil && s.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
			return nd
		}
	}
	return nil
}

func clusterOptions() Options {
	opts := testOptions()
	opts.Replicas = 3
	opts.PublishTimeout = 2 * time.Second
	opts.OutageTimeout = 2 * time.Second
	return opts
}

// publishAll publishes n events alternately on the replicas, each of
// which must succeed at its first attempt, and returns the last id.
func publishAll(t *testing.T, n int, reps ...*replica) uint64 {
	t.Helper()
	var last uint64
	for i := range n {
		rp := reps[i%len(reps)]
		start := time.Now()
		id, _, err := rp.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e", Data: i})
		if err != nil {
			in, ierr := rp.bp.Info(context.Background(), "s")
			t.Fatalf("%s (on %s): publish %d failed after %v: %v (then: %+v %v)", rp.name, rp.bp.nc.ConnectedServerName(), i, time.Since(start), err, in, ierr)
		}
		if last != 0 && id != last+1 {
			t.Fatalf("%s: id %d after %d", rp.name, id, last)
		}
		last = id
	}
	return last
}

// contiguous reads frames of s until one has id upto, checking that the
// ids run on from from without a gap (an unknown outcome may have added
// events), and returns the last id read.
func contiguous(t *testing.T, s *sse, from, upto uint64) {
	t.Helper()
	want := from
	for want <= upto {
		f := s.Next(wait)
		if f.ID == 0 {
			t.Fatalf("unexpected %s %s at id %d", f.Event, f.Data, want)
		}
		if f.ID != want {
			t.Fatalf("id %d, want %d", f.ID, want)
		}
		want++
	}
}

// A three-node cluster and a stream of three replicas: one node lost
// (neither the stream's leader nor the meta leader) and publishes go on
// at once on both replicas, with contiguous ids; a second node lost (no
// quorum) and publishes fail within their timeout, open streams end with
// stream_error "unavailable" within OutageTimeout of the quorum's loss,
// and new streams are 503; both nodes back and publishes, new streams and
// resumes from a cursor work again, without a gap.
func TestClusterNodeLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("a three-node cluster: not with -short")
	}
	c := startCluster(t, 3)
	opts := clusterOptions()
	a, b := newReplica(t, c.URL(), "A", opts), newReplica(t, c.URL(), "B", opts)
	sa, sb := a.open(t, "s", nil, ""), b.open(t, "s", nil, "")
	last := publishAll(t, 10, a, b)
	wantIDs(t, sa.Events(10, wait), 1, last)
	wantIDs(t, sb.Events(10, wait), 1, last)

	sl, ml := c.streamLeader(opts.Stream), c.metaLeader()
	var victim *natsServer
	for _, nd := range c.nodes {
		if nd != sl && nd != ml {
			victim = nd
			break
		}
	}
	start := time.Now()
	victim.Stop()
	waitFor(t, wait, "both replicas connected to the others", func() bool {
		for _, rp := range []*replica{a, b} {
			if !rp.bp.nc.IsConnected() || rp.bp.nc.ConnectedServerName() == victim.opts.ServerName {
				return false
			}
		}
		return true
	})
	t.Logf("one node (%s) down: the clients reconnected in %v (stream leader %s, meta leader %s)", victim.opts.ServerName, time.Since(start).Round(time.Millisecond), sl.opts.ServerName, ml.opts.ServerName)
	start = time.Now()
	last2 := publishAll(t, 20, a, b)
	t.Logf("one node down: 20 publishes in %v, ids %d..%d", time.Since(start).Round(time.Millisecond), last+1, last2)
	wantIDs(t, sa.Events(20, wait), last+1, last2)
	wantIDs(t, sb.Events(20, wait), last+1, last2)

	// A second node: the survivor alone has no quorum.
	var second *natsServer
	for _, nd := range c.nodes {
		if nd != victim {
			second = nd
			break
		}
	}
	lost := time.Now()
	second.Stop()
	var pubErr error
	waitFor(t, wait, "a publish to fail", func() bool {
		t0 := time.Now()
		_, _, pubErr = a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		if took := time.Since(t0); took > opts.PublishTimeout+500*time.Millisecond {
			t.Fatalf("a publish took %v, timeout %v", took, opts.PublishTimeout)
		}
		return pubErr != nil
	})
	if !errors.Is(pubErr, ErrUnavailable) {
		t.Fatalf("publish without quorum: %v", pubErr)
	}
	t.Logf("two nodes down: publishes fail %v after the loss: %v", time.Since(lost).Round(time.Millisecond), pubErr)
	sa.EndedUnavailable(30 * time.Second)
	sb.EndedUnavailable(30 * time.Second)
	t.Logf("two nodes down: open streams ended (stream_error unavailable) %v after the loss", time.Since(lost).Round(time.Millisecond))
	waitFor(t, wait, "new streams refused", func() bool {
		resp, err := a.shared.Server.Client().Get(a.shared.URL("s", ""))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != ""
	})

	back := time.Now()
	victim.Start()
	second.Start()
	var id uint64
	var epoch string
	waitFor(t, 60*time.Second, "a publish after the nodes came back", func() bool {
		var err error
		id, epoch, err = b.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		return err == nil
	})
	t.Logf("nodes back: the first publish succeeded %v after the restart, id %d", time.Since(back).Round(time.Millisecond), id)
	if id <= last2 || epoch != sa.Epoch {
		t.Fatalf("after the outage: id %d epoch %s, want above %d in %s", id, epoch, last2, sa.Epoch)
	}
	// The client that read up to last2 resumes on A: every id after it
	// (a publish of unknown outcome may have been applied too).
	var ra *sse
	waitFor(t, 30*time.Second, "a stream on A", func() bool {
		resp, err := a.shared.Server.Client().Get(a.shared.URL("probe", ""))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	ra = a.open(t, "s", map[string]string{"Last-Event-ID": fmt.Sprint(last2), "Event-Epoch": sa.Epoch}, "")
	contiguous(t, ra, last2+1, id)
	if rc := ra.Next(wait); rc.Event != eventbus.TypeReplayComplete {
		t.Fatalf("want replay_complete, got %+v", rc)
	}
	next := publishAll(t, 5, a, b)
	contiguous(t, ra, id+1, next)
}

// The stream's leader lost: after an election the publishes go on, with
// contiguous ids, and the open streams lose nothing.
func TestClusterLeaderLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("a three-node cluster: not with -short")
	}
	c := startCluster(t, 3)
	opts := clusterOptions()
	opts.OutageTimeout = 30 * time.Second // an election is no outage
	a, b := newReplica(t, c.URL(), "A", opts), newReplica(t, c.URL(), "B", opts)
	sa, sb := a.open(t, "s", nil, ""), b.open(t, "s", nil, "")
	last := publishAll(t, 10, a, b)
	leader := c.streamLeader(opts.Stream)
	start := time.Now()
	leader.Stop()
	var id uint64
	waitFor(t, 30*time.Second, "a publish after the leader was lost", func() bool {
		var err error
		id, _, err = a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		return err == nil
	})
	t.Logf("stream leader (%s) lost: publishes succeed again after %v (id %d)", leader.opts.ServerName, time.Since(start).Round(time.Millisecond), id)
	next := publishAll(t, 10, a, b)
	contiguous(t, sa, 1, next)
	contiguous(t, sb, 1, next)
	if last >= id {
		t.Fatalf("id %d after %d", id, last)
	}
}
