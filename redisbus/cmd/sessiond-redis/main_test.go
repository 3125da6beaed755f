package main

import (
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ssebus/eventbus/internal/daemontest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestReplicaSuite runs the black-box checks every replica daemon answers
// alike (internal/daemontest.ReplicaSuite) on sessiond-redis processes,
// each check against a redis-server of its own.
func TestReplicaSuite(t *testing.T) {
	daemontest.ReplicaSuite(t, daemontest.ReplicaHarness{Daemon: "sessiond-redis", EngineFlag: "redis", Engine: startRedis})
}

// startRedis runs a redis-server on a free loopback port until the test
// ends (skipped without one, unless CI=true). It writes every command to
// its append-only file before answering, so that Down (SIGKILL, a crash)
// and Up (a restart on the same port and directory) lose nothing; Pause
// and Resume are SIGSTOP and SIGCONT (a hung Redis).
func startRedis(t *testing.T) daemontest.ReplicaEngine {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server not found (CI=true): %v", err)
		}
		t.Skipf("redis-server not found: %v (apt-get install -y redis-server; CI=true makes this a failure)", err)
	}
	addr := daemontest.FreeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	dir := t.TempDir()
	var (
		mu   sync.Mutex
		proc *os.Process
		done chan struct{}
	)
	up := func() {
		mu.Lock()
		defer mu.Unlock()
		if proc != nil {
			return
		}
		cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--dir", dir)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		proc, done = cmd.Process, make(chan struct{})
		go func(done chan struct{}) { cmd.Wait(); close(done) }(done)
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if c, err := net.Dial("tcp", addr); err == nil {
				c.Close()
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("redis-server did not start on " + addr)
			}
		}
	}
	down := func() {
		mu.Lock()
		defer mu.Unlock()
		if proc != nil {
			proc.Signal(syscall.SIGCONT)
			proc.Kill()
			<-done
			proc = nil
		}
	}
	signal := func(sig os.Signal) func() {
		return func() {
			mu.Lock()
			defer mu.Unlock()
			proc.Signal(sig)
		}
	}
	up()
	t.Cleanup(down)
	return daemontest.ReplicaEngine{
		URL: addr, Flags: []string{"-prefix", "suite:"},
		Down: down, Up: up,
		Pause: signal(syscall.SIGSTOP), Resume: signal(syscall.SIGCONT),
	}
}
