package daemontest

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy forwards the TCP connections it accepts on a loopback port to an
// engine server, so that a test can make the engine unreachable from the
// daemons that connect through it, without touching the server that other
// tests share: Pause hangs every connection (what the clients send is held
// and delivered at Resume, as a stopped server would read it then), Down
// resets every connection and refuses new ones until Up. Its methods are
// for the test's goroutine.
type Proxy struct {
	t      testing.TB
	target string
	addr   string
	// gate is write-locked while paused: every forwarded write takes a
	// read lock.
	gate sync.RWMutex
	wg   sync.WaitGroup

	mu     sync.Mutex
	paused bool
	closed bool
	ln     net.Listener // nil while down
	conns  map[net.Conn]struct{}
}

// NewProxy starts a proxy to target (host:port), closed when t ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln := listen(t, "127.0.0.1:0")
	p := &Proxy{t: t, target: target, addr: ln.Addr().String(), conns: map[net.Conn]struct{}{}}
	p.serve(ln)
	t.Cleanup(p.close)
	return p
}

// listen listens on addr, failing t when it cannot.
func listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// Addr is the proxy's host:port, for the daemon's engine URL.
func (p *Proxy) Addr() string { return p.addr }

// serve accepts on ln until it is closed. Called with p.mu held, or
// before p is shared.
func (p *Proxy) serve(ln net.Listener) {
	p.ln = ln
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Go(func() { p.forward(c) })
		}
	})
}

// forward pipes c to a new connection to the target, both ways, until
// either side ends or Down or the cleanup cuts them.
func (p *Proxy) forward(c net.Conn) {
	u, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c, u) {
		c.Close()
		u.Close()
		return
	}
	var both sync.WaitGroup
	for _, pair := range [][2]net.Conn{{c, u}, {u, c}} {
		both.Go(func() {
			io.Copy(gated{p, pair[1]}, pair[0])
			pair[0].Close()
			pair[1].Close()
		})
	}
	both.Wait()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, u)
	p.mu.Unlock()
}

// track records the two ends of a forwarded connection for Down and the
// cleanup; false when the proxy went down or closed meanwhile.
func (p *Proxy) track(c, u net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.ln == nil {
		return false
	}
	p.conns[c], p.conns[u] = struct{}{}, struct{}{}
	return true
}

// gated writes to w, waiting while the proxy is paused.
type gated struct {
	p *Proxy
	w io.Writer
}

func (g gated) Write(b []byte) (int, error) {
	g.p.gate.RLock()
	defer g.p.gate.RUnlock()
	return g.w.Write(b)
}

// Pause hangs every connection, open or new: nothing is forwarded until
// Resume.
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.paused {
		p.paused = true
		p.gate.Lock()
	}
}

// Resume forwards what Pause held, and goes on. Idempotent.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		p.paused = false
		p.gate.Unlock()
	}
}

// Down resets every connection and closes the port: a client's
// connection is refused until Up.
func (p *Proxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	p.cutAll()
}

// cutAll resets every forwarded connection. Called with p.mu held.
func (p *Proxy) cutAll() {
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // a reset, not an orderly close
		}
		c.Close()
	}
}

// Up listens on the proxy's port again (when down).
func (p *Proxy) Up() {
	p.mu.Lock()
	defer p.mu.Unlock()
	// The port was closed a moment ago: a few tries, should it linger.
	for deadline := time.Now().Add(5 * time.Second); p.ln == nil; time.Sleep(20 * time.Millisecond) {
		ln, err := net.Listen("tcp", p.addr)
		switch {
		case err == nil:
			p.serve(ln)
		case time.Now().After(deadline):
			p.t.Fatalf("proxy: listen on %s again: %v", p.addr, err)
		}
	}
}

// close ends the proxy and waits for its goroutines.
func (p *Proxy) close() {
	p.Resume()
	p.mu.Lock()
	p.closed = true
	if p.ln != nil {
		p.ln.Close()
	}
	p.cutAll()
	p.mu.Unlock()
	p.wg.Wait()
}
