// Package pipenet is an in-memory network for tests: a net.Listener whose
// connections are net.Pipe pairs. Goroutines blocked on such connections
// are durably blocked inside a testing/synctest bubble, so the bubble's
// fake clock advances while an HTTP client and server wait on each other
// (a real socket would stop it). It is internal to this module; its users
// are the tests of package eventbus and of sseclient.
package pipenet

import (
	"context"
	"net"
	"sync"
)

// Listener is a net.Listener whose connections come from its DialContext.
// It is safe for concurrent use. Make one with Listen; Close it to end
// Accept and refuse later dials.
type Listener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

// Listen returns a new Listener.
func Listen() *Listener {
	return &Listener{conns: make(chan net.Conn), done: make(chan struct{})}
}

// Accept blocks until a DialContext hands it the server end of a pipe, or
// the Listener is closed (net.ErrClosed).
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close makes Accept and DialContext return net.ErrClosed. Idempotent; it
// does not close connections already made.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr returns a placeholder address ("pipe").
func (l *Listener) Addr() net.Addr { return addr{} }

// DialContext has the signature of http.Transport.DialContext; network and
// address are ignored. It blocks until Accept takes the server end, the
// Listener is closed, or ctx is done.
func (l *Listener) DialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	server, client := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type addr struct{}

func (addr) Network() string { return "pipe" }
func (addr) String() string  { return "pipe" }
