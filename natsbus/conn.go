package natsbus

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// The reconnect policy of ConnectOptions (ReconnectDelay).
const (
	// MinReconnectDelay is the longest wait before the second reconnect
	// attempt after a cut (the first is at once).
	MinReconnectDelay = 50 * time.Millisecond
	// MaxReconnectDelay is the longest wait between two reconnect
	// attempts.
	MaxReconnectDelay = time.Second
)

// ReconnectDelay is the reconnect policy of ConnectOptions, a
// nats.ReconnectDelayHandler: the wait before the attempts-th pass over
// the connection's servers after a cut (nats.go counts the passes from
// 1). The first pass is at once, so a connection that a server cut and
// survived (a kick, a restart of its listener, a proxy's reset) is back in
// a round trip. Then the waits double from MinReconnectDelay to
// MaxReconnectDelay, each drawn at random from [d/2, d] so that the
// replicas a server cut together do not knock in step. It never blocks
// and is safe for concurrent use.
func ReconnectDelay(attempts int) time.Duration {
	if attempts <= 1 {
		return 0
	}
	d := MaxReconnectDelay
	if n := attempts - 2; n < 16 { // past 16 doublings the cap holds anyway; the shift must not overflow
		d = min(MinReconnectDelay<<n, MaxReconnectDelay)
	}
	return d/2 + rand.N(d/2+1)
}

// ConnectOptions returns the nats.Connect options the backplane relies
// on; append the connection's own (a name, credentials, TLS) after them:
//
//	nc, err := nats.Connect(url, append(natsbus.ConnectOptions(), nats.Name("replica-a"))...)
//
// They are ReconnectBufSize -1 (a publish while the connection
// reconnects fails at once, nothing sent, instead of being buffered and
// sent after its caller gave up), MaxReconnects -1 (the connection never
// gives up: a closed one would end the backplane), and ReconnectDelay as
// the CustomReconnectDelay (the first attempt after a cut at once, then
// backing off). The backplane's calls wait for a reconnect (see the
// package documentation), so with these options a cut that the server
// survives costs its calls a round trip, not a refusal.
func ConnectOptions() []nats.Option {
	return []nats.Option{
		nats.ReconnectBufSize(-1),
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(ReconnectDelay),
	}
}

// reconnectGrace bounds how long after the connection was lost a call
// still waits for it to come back: a reconnect is a round trip or a few
// backoff steps, while a server that stays away past this is an outage,
// and a call then fails at once with ErrUnavailable rather than holding
// its caller for all of PublishTimeout.
const reconnectGrace = time.Second

// errNoConnection is wrapped by the error of a call that found no
// connection to send on and gave up waiting for one: nothing was sent.
var errNoConnection = errors.New("natsbus: no nats connection")

// link follows the state of the backplane's nats connection, so that a
// call made while it reconnects waits for it (bounded by the call's
// context and reconnectGrace), and a read whose connection is lost before
// its answer is sent again on the next one. It learns the state from a
// status listener of the connection (nats.Conn.StatusChanged), whose
// events nats.go sends in order as the state changes; run applies them.
type link struct {
	nc     *nats.Conn
	events chan nats.Status

	mu sync.Mutex
	// cur is done once the connection it was made for is lost, and when
	// the connection is not up (then it is a done one).
	cur    context.Context
	cancel context.CancelFunc
	// back is closed when the connection is up again or closed for good;
	// replaced when it is lost.
	back   chan struct{}
	lostAt time.Time // when the connection was lost; zero while it is up
	closed bool      // closed for good: nothing comes back
}

// newLink follows nc from now on: it takes its state now, and run
// applies the changes that follow.
func newLink(nc *nats.Conn) *link {
	l := &link{nc: nc, back: make(chan struct{})}
	l.cur, l.cancel = context.WithCancel(context.Background())
	close(l.back)
	// Listen first, then read the state: a change after the listener is
	// registered is among the events, one before it is in the state, and
	// applying a state twice changes nothing.
	l.events = nc.StatusChanged(nats.CONNECTED, nats.RECONNECTING, nats.DISCONNECTED, nats.CLOSED)
	if st := nc.Status(); st != nats.CONNECTED {
		l.apply(st)
	}
	return l
}

// run applies the connection's status changes until ctx ends, then stops
// listening.
func (l *link) run(ctx context.Context) {
	defer l.nc.RemoveStatusListener(l.events)
	for {
		select {
		case <-ctx.Done():
			return
		case st := <-l.events:
			l.apply(st)
		}
	}
}

// apply records a status of the connection.
func (l *link) apply(st nats.Status) {
	l.mu.Lock()
	defer l.mu.Unlock()
	up := l.cur.Err() == nil
	switch {
	case l.closed:
	case st == nats.CONNECTED && !up:
		l.cur, l.cancel = context.WithCancel(context.Background())
		l.lostAt = time.Time{}
		close(l.back)
	case st == nats.CLOSED:
		l.closed = true
		l.cancel()
		if up {
			return // back is closed: waiters go, and find it closed
		}
		close(l.back)
	case st != nats.CONNECTED && up: // RECONNECTING, DISCONNECTED, or the first state
		l.cancel()
		l.lostAt = time.Now()
		l.back = make(chan struct{})
	}
}

// conn returns a context of the connection as it is up now: done once it
// is lost. While it is reconnecting, conn waits for it, until ctx ends or
// it has been lost for reconnectGrace; it then fails with an error
// wrapping errNoConnection, as it does at once when the connection is
// closed for good.
func (l *link) conn(ctx context.Context) (context.Context, error) {
	for {
		l.mu.Lock()
		cur, back, lostAt, closed := l.cur, l.back, l.lostAt, l.closed
		l.mu.Unlock()
		switch {
		case closed:
			return nil, fmt.Errorf("%w: %w", errNoConnection, nats.ErrConnectionClosed)
		case cur.Err() == nil:
			return cur, nil
		}
		left := time.Until(lostAt.Add(reconnectGrace))
		if left <= 0 {
			return nil, fmt.Errorf("%w: it has been reconnecting for %v", errNoConnection, time.Since(lostAt).Round(time.Millisecond))
		}
		t := time.NewTimer(left)
		select {
		case <-back:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w: waiting for it to reconnect: %w", errNoConnection, ctx.Err())
		}
		t.Stop()
	}
}

// reconnecting reports whether err is nats.go refusing to send because
// the connection is reconnecting (with ReconnectBufSize -1 nothing is
// buffered): nothing was sent.
func reconnecting(err error) bool {
	return errors.Is(err, nats.ErrReconnectBufExceeded) || errors.Is(err, nats.ErrConnectionReconnecting)
}

// send makes a call that must not be repeated once it may have reached
// the server (a publish): it waits for the connection (conn), calls call,
// and calls it again on the next connection only when it failed because
// the connection was reconnecting, that is when provably nothing was
// sent. call gets ctx, not a context that ends with the connection: the
// answer to what was sent may still come on the next one. Errors are
// call's, or conn's (wrapping errNoConnection: nothing sent).
func (l *link) send(ctx context.Context, call func() error) error {
	for {
		cur, err := l.conn(ctx)
		if err != nil {
			return err
		}
		err = call()
		if err == nil || !reconnecting(err) || ctx.Err() != nil {
			return err
		}
		// nats.go refused before the listener's event was applied: wait
		// until it is, rather than spin on a connection that is gone.
		select {
		case <-cur.Done():
		case <-ctx.Done():
			return err
		}
	}
}

// read makes a call that is safe to repeat (a read, or an append that a
// condition makes happen at most once): it waits for the connection
// (conn) and calls call with a context that also ends when that
// connection is lost; when the connection was lost before call returned,
// or call was refused because it was reconnecting, it calls it again on
// the next connection. All within ctx. Errors are call's, or conn's
// (wrapping errNoConnection).
func (l *link) read(ctx context.Context, call func(ctx context.Context) error) error {
	for {
		cur, err := l.conn(ctx)
		if err != nil {
			return err
		}
		gen := l.nc.Stats().Reconnects
		cctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(cur, cancel)
		err = call(cctx)
		stop()
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		if cur.Err() != nil {
			continue // lost under the call: its answer is not coming
		}
		// The listener's events come a moment after the change: ask the
		// connection itself whether it was lost under the call (a failed
		// flush, say, reads as closed then), or refused it for
		// reconnecting. If not, the failure is call's own.
		if !reconnecting(err) && l.nc.IsConnected() && l.nc.Stats().Reconnects == gen || l.nc.IsClosed() {
			return err
		}
		select { // until the listener's event is applied, not spinning
		case <-cur.Done():
		case <-ctx.Done():
			return err
		}
	}
}
