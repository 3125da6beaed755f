package redisbus

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// redisServer is a redis-server process of one test, on a free loopback
// port, without persistence. It is stopped by PID when the test ends.
type redisServer struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	Addr string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	log  *bytes.Buffer
}

// startRedis starts a redis-server for t. Without one installed the test
// is skipped, unless CI=true, where it fails.
func startRedis(t testing.TB) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server not found (CI=true): %v; install it with apt-get install -y redis-server", err)
		}
		t.Skipf("redis-server not found: %v; install it (apt-get install -y redis-server) to run the backplane tests (with CI=true this is a failure)", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	r := &redisServer{t: t, bin: bin, dir: t.TempDir(), port: port, Addr: "127.0.0.1:" + strconv.Itoa(port)}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *redisServer) start() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	cmd := exec.Command(r.bin, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir, "--daemonize", "no", "--loglevel", "warning")
	r.log = &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = r.log, r.log
	if err := cmd.Start(); err != nil {
		r.t.Fatalf("start redis-server: %v", err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	r.cmd, r.done = cmd, done
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ping(r.Addr) == nil {
			return
		}
		select {
		case <-done:
			r.t.Fatalf("redis-server exited: %s", r.log.String())
		default:
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("redis-server on %s did not answer PING in 10s: %s", r.Addr, r.log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ping sends a raw PING, so that no client pool outlives it.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING: %q", line)
	}
	return nil
}

// stop kills the server by PID and waits for it. Idempotent.
func (r *redisServer) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	r.cmd.Process.Signal(syscall.SIGCONT) // in case it is paused
	r.cmd.Process.Kill()
	<-r.done
	r.cmd = nil
}

// restart kills the server and starts a new, empty one on the same port:
// Redis restarted without persistence.
func (r *redisServer) restart() {
	r.stop()
	r.start()
}

// pause and resume stop and continue the process (SIGSTOP, SIGCONT): a
// Redis that accepts connections but never answers.
func (r *redisServer) pause()  { r.signal(syscall.SIGSTOP) }
func (r *redisServer) resume() { r.signal(syscall.SIGCONT) }

func (r *redisServer) signal(sig syscall.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		r.cmd.Process.Signal(sig)
	}
}

// client returns a go-redis client for the server, closed when t ends
// (after everything registered later, such as the backplanes using it).
func (r *redisServer) client(t testing.TB) *redis.Client { return testClient(t, r.Addr) }

// testClient returns a go-redis client for addr, closed when t ends.
func testClient(t testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		PoolSize:              64,
		DialTimeout:           time.Second,
		ReadTimeout:           2 * time.Second,
		WriteTimeout:          2 * time.Second,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// do runs one command on a throwaway client.
func (r *redisServer) do(t testing.TB, args ...any) any {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	v, err := c.Do(ctx, args...).Result()
	if err != nil && err != redis.Nil {
		t.Fatalf("redis %v: %v", args, err)
	}
	return v
}

// cutProxy forwards TCP connections to a Redis. While cutting, the reply to
// a connection that has sent an EVALSHA is not forwarded: the connection
// is closed instead, after Redis has read (and run) the script. That is a
// connection that breaks between a command's write and its answer. (Other
// replies, such as a new connection's handshake, pass.)
type cutProxy struct {
	Addr    string
	target  string
	ln      net.Listener
	cutting atomic.Bool
	cuts    atomic.Int64 // replies swallowed

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func startCutProxy(t testing.TB, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *cutProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c) || !p.track(s) {
			c.Close()
			s.Close()
			continue
		}
		var sawEval atomic.Bool
		p.wg.Add(2)
		go func() { // client -> redis
			defer p.wg.Done()
			defer s.Close()
			buf := make([]byte, 32<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if bytes.Contains(bytes.ToLower(buf[:n]), []byte("evalsha")) {
						sawEval.Store(true) // before Redis can answer it
					}
					if _, werr := s.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() { // redis -> client, unless cutting
			defer p.wg.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					if p.cutting.Load() && sawEval.Load() {
						p.cuts.Add(1)
						c.Close()
						s.Close()
						return
					}
					if _, werr := c.Write(buf[:n]); werr != nil {
						s.Close()
						return
					}
				}
				if err != nil {
					c.Close()
					return
				}
			}
		}()
	}
}

func (p *cutProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
