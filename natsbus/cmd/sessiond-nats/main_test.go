package main

import (
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/ssebus/eventbus/internal/daemontest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestReplicaSuite runs the black-box checks every replica daemon answers
// alike (internal/daemontest.ReplicaSuite) on sessiond-nats processes,
// each check against a JetStream server of its own. (The three-node
// cluster's outages are natsbus's own tests: cluster_test.go.)
func TestReplicaSuite(t *testing.T) {
	daemontest.ReplicaSuite(t, daemontest.ReplicaHarness{Daemon: "sessiond-nats", EngineFlag: "nats", Engine: startNATS})
}

// startNATS runs a JetStream server embedded in the test binary, with its
// store in a temporary directory, until the test ends. Down shuts it down
// (clients see their connections close, then refused) and Up starts it
// again from its store on the same port; the daemons reach it through a
// proxy, whose Pause and Resume hang it (an embedded server cannot be
// stopped with SIGSTOP).
func startNATS(t *testing.T) daemontest.ReplicaEngine {
	_, port, _ := net.SplitHostPort(daemontest.FreeAddr(t))
	n, _ := strconv.Atoi(port)
	opts := server.Options{Host: "127.0.0.1", Port: n, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true}
	var (
		mu  sync.Mutex
		srv *server.Server
	)
	up := func() {
		mu.Lock()
		defer mu.Unlock()
		if srv != nil {
			return
		}
		o := opts // NewServer keeps and changes its options
		s, err := server.NewServer(&o)
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			s.Shutdown()
			t.Fatal("nats-server did not start")
		}
		srv = s
	}
	down := func() {
		mu.Lock()
		defer mu.Unlock()
		if srv != nil {
			srv.Shutdown()
			srv.WaitForShutdown()
			srv = nil
		}
	}
	up()
	t.Cleanup(down)
	p := daemontest.NewProxy(t, "127.0.0.1:"+port)
	return daemontest.ReplicaEngine{
		URL: "nats://" + p.Addr(), Flags: []string{"-stream", "D"},
		Down: down, Up: up, Pause: p.Pause, Resume: p.Resume,
	}
}
