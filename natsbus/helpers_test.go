package natsbus

import (
	"context"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/ssebus/eventbus/backplane/backplanetest"
)

func TestMain(m *testing.M) {
	fastRaft()
	goleak.VerifyTestMain(m)
}

const wait = 10 * time.Second // bound of every wait for frames

// natsServer is a nats-server with JetStream embedded in the test binary,
// on a loopback port of its own; Stop and Start keep its port and store.
type natsServer struct {
	t    testing.TB
	opts server.Options

	mu  sync.Mutex
	srv *server.Server
}

// startServer starts a single JetStream server for t, stopped when t
// ends.
func startServer(t testing.TB) *natsServer {
	t.Helper()
	n := &natsServer{t: t, opts: server.Options{
		Host: "127.0.0.1", Port: freePort(t), JetStream: true, StoreDir: t.TempDir(),
		NoLog: true, NoSigs: true, ServerName: "n0",
	}}
	n.Start()
	t.Cleanup(n.Stop)
	return n
}

// freePort returns a loopback port nothing listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Start starts the server (again) and waits until it accepts clients.
func (n *natsServer) Start() {
	n.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		return
	}
	opts := n.opts // NewServer keeps and changes its options
	s, err := server.NewServer(&opts)
	if err != nil {
		n.t.Fatalf("nats-server: %v", err)
	}
	s.Start()
	if !s.ReadyForConnections(wait) {
		s.Shutdown()
		n.t.Fatalf("nats-server %s did not start", n.opts.ServerName)
	}
	n.srv = s
}

// Stop shuts the server down (its clients see the connection close) and
// waits for it. Idempotent.
func (n *natsServer) Stop() {
	n.mu.Lock()
	s := n.srv
	n.srv = nil
	n.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// Server returns the running server, nil when stopped.
func (n *natsServer) Server() *server.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srv
}

func (n *natsServer) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(n.opts.Port) }

// connect returns a JetStream client of url (a comma-separated list),
// closed when t ends: no reconnect buffer (the backplane's advice), quick
// reconnects.
func connect(t testing.TB, url string) jetstream.JetStream {
	t.Helper()
	return connectWith(t, url, nats.ReconnectBufSize(-1), nats.MaxReconnects(-1),
		nats.ReconnectWait(50*time.Millisecond), nats.ReconnectJitter(0, 0), nats.Timeout(time.Second),
		nats.RetryOnFailedConnect(false))
}

// connectWith returns a JetStream client of url with opts, closed when t
// ends.
func connectWith(t testing.TB, url string, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// testOptions are quick to notice changes and to close.
func testOptions() Options {
	return Options{
		Stream:         "T",
		Subject:        "t",
		CheckInterval:  100 * time.Millisecond,
		PublishTimeout: 5 * time.Second, // a loaded machine: contended publishes retry
		IdleTimeout:    time.Hour,
		Logger:         testLogger,
	}
}

// replica is one daemon replica in-process: its own connection, backplane
// and HTTP server.
type replica struct {
	name   string
	bp     *Backplane
	gate   *backplanetest.Gate // its readers wait at it
	shared *backplanetest.Replica
}

func newReplica(t testing.TB, url, name string, opts Options) *replica {
	t.Helper()
	return newReplicaOn(t, connect(t, url), name, opts)
}

// newReplicaOn is newReplica on a client of the test's own.
func newReplicaOn(t testing.TB, js jetstream.JetStream, name string, opts Options) *replica {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	bp, err := New(ctx, js, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bp.Close() })
	g := backplanetest.NewGate()
	hook := g.Wait
	bp.readHook.Store(&hook)
	return &replica{name: name, bp: bp, gate: g, shared: backplanetest.NewReplica(t, name, bp)}
}

func (rp *replica) publish(t testing.TB, session, typ string, data any) uint64 {
	t.Helper()
	return rp.shared.Publish(t, session, typ, data)
}

func (rp *replica) open(t testing.TB, session string, header map[string]string, query string) *sse {
	t.Helper()
	return rp.shared.Open(t, session, header, query)
}

func threeReplicas(t testing.TB, url string, opts Options) (a, b, c *replica) {
	return newReplica(t, url, "A", opts), newReplica(t, url, "B", opts), newReplica(t, url, "C", opts)
}

// Short names for the shared client and checks.
type sse = backplanetest.Stream

var (
	wantIDs = backplanetest.WantIDs
	waitFor = backplanetest.WaitFor
)

// liveReplica starts a replica with opts and one live stream of session
// "s" that has received the event with id 1.
func liveReplica(t testing.TB, url string, opts Options) (*replica, *sse) {
	t.Helper()
	a := newReplica(t, url, "A", opts)
	s := a.open(t, "s", nil, "")
	a.publish(t, "s", "e", nil)
	wantIDs(t, s.Events(1, wait), 1, 1)
	return a, s
}

// stall is a TCP proxy in front of a server whose forwarding can be held:
// while stalled it reads nothing from either side (a hung server, as
// SIGSTOP makes one), and on release it forwards what waited.
type stall struct {
	Addr string
	ln   net.Listener
	held atomic.Bool
	// parked counts the reads that waited for Release (or Cut) with
	// bytes to forward.
	parked  atomic.Int64
	mu      sync.Mutex
	release chan struct{}
	conns   []net.Conn
	wg      sync.WaitGroup
}

func startStall(t testing.TB, target string) *stall {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stall{Addr: "nats://" + ln.Addr().String(), ln: ln, release: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			p.wg.Add(2)
			go p.pipe(c, s)
			go p.pipe(s, c)
		}
	}()
	t.Cleanup(p.close)
	return p
}

func (p *stall) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && p.held.Load() {
			p.parked.Add(1)
		}
		for p.held.Load() {
			p.mu.Lock()
			ch := p.release
			p.mu.Unlock()
			<-ch
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

// Hold stops forwarding: bytes read from now on wait for Release.
func (p *stall) Hold() {
	p.mu.Lock()
	p.release = make(chan struct{})
	p.mu.Unlock()
	p.held.Store(true)
}

// Release forwards again. Idempotent.
func (p *stall) Release() {
	if p.held.Swap(false) {
		p.mu.Lock()
		close(p.release)
		p.mu.Unlock()
	}
}

// Cut resets every connection forwarded so far (what Hold kept of them
// is lost: their clients see the connection cut under way) and forwards
// again: a client that reconnects gets through.
func (p *stall) Cut() {
	p.mu.Lock()
	for _, c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // a reset, not an orderly close
		}
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.Release()
}

func (p *stall) close() {
	p.Release()
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// discardLogger keeps the backplanes of the tests quiet.
var discardLogger = slog.New(slog.DiscardHandler)

var testLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))

// harness is the conformance suite's: n replicas on an embedded
// nats-server of their own; Down stops it (its store kept: clients see
// the connection refused), Lose deletes the stream.
var harness = backplanetest.Harness{
	Start: func(t testing.TB, n int, o backplanetest.Options) backplanetest.Cluster {
		srv := startServer(t)
		opts := testOptions()
		o.Apply(&opts.Bus, &opts.PublishTimeout, &opts.OutageTimeout, &opts.IdleTimeout, &opts.IdempotencyWindow)
		c := backplanetest.Cluster{Down: srv.Stop, Up: srv.Start}
		var first *Backplane
		for i := range n {
			rp := newReplica(t, srv.URL(), string(rune('A'+i)), opts)
			c.Replicas = append(c.Replicas, rp.bp)
			c.Gates = append(c.Gates, rp.gate)
			if first == nil {
				first = rp.bp
			}
		}
		c.Lose = func() {
			if err := first.js.DeleteStream(context.Background(), opts.Stream); err != nil {
				t.Fatalf("delete the stream: %v", err)
			}
		}
		return c
	},
	ErrUnavailable:    ErrUnavailable,
	ErrOutcomeUnknown: ErrOutcomeUnknown,
	ErrInvalidSession: ErrInvalidSession,
	TrimsBytes:        false, // JetStream has no per-subject byte limit
}
