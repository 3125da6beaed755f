package daemontest

import (
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

	mu     sync.Mutex
	ln     net.Listener // nil while down
	conns  map[net.Conn]struct{}
	hold   chan struct{} // non-nil while paused; closed by Resume
	closed bool
	wg     sync.WaitGroup
}

// NewProxy starts a proxy to target (host:port), closed when t ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{t: t, target: target, addr: ln.Addr().String(), conns: map[net.Conn]struct{}{}}
	p.serve(ln)
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's host:port, for the daemon's engine URL.
func (p *Proxy) Addr() string { return p.addr }

// serve accepts on ln until it is closed. Called with p.mu held or
// before p is shared.
func (p *Proxy) serve(ln net.Listener) {
	p.ln = ln
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.forward(c)
			}()
		}
	}()
}

// forward pipes c to a new connection to the target, both ways, until
// either side ends or Down or the cleanup closes them.
func (p *Proxy) forward(c net.Conn) {
	u, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.closed || p.ln == nil {
		p.mu.Unlock()
		c.Close()
		u.Close()
		return
	}
	p.conns[c], p.conns[u] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{})
	go func() {
		p.pipe(c, u)
		close(done)
	}()
	p.pipe(u, c)
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, u)
	p.mu.Unlock()
}

// pipe copies src to dst, holding each read while the proxy is paused;
// at the end of src it closes both.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			hold := p.hold
			p.mu.Unlock()
			if hold != nil {
				<-hold
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Pause hangs every connection, open or new: nothing is forwarded until
// Resume.
func (p *Proxy) Pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hold == nil {
		p.hold = make(chan struct{})
	}
}

// Resume forwards what Pause held, and goes on. Idempotent.
func (p *Proxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hold != nil {
		close(p.hold)
		p.hold = nil
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

// Up listens on the proxy's port again.
func (p *Proxy) Up() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		return
	}
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var ln net.Listener
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			p.serve(ln)
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("proxy: listen on %s again: %v", p.addr, err)
		}
	}
}

// close ends the proxy and waits for its goroutines.
func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	if p.ln != nil {
		p.ln.Close()
	}
	if p.hold != nil {
		close(p.hold)
		p.hold = nil
	}
	p.cutAll()
	p.mu.Unlock()
	p.wg.Wait()
}
