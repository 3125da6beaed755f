package daemon

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
)

// CutMode is how POST /session/{id}/disconnect ends a stream.
type CutMode int

const (
	// CutClean ends the response as the server would (the end of a chunked
	// body on HTTP/1.1, END_STREAM on HTTP/2) and keeps the connection:
	// what a load balancer draining a backend does. ?mode=clean, the default.
	CutClean CutMode = iota
	// CutAbort resets the TCP connection the stream came on (RST, no TLS
	// close_notify): what a failing load balancer or a network does. On
	// HTTP/2 that ends every other request on the connection too. ?mode=abort.
	CutAbort
)

func (m CutMode) String() string {
	if m == CutAbort {
		return "abort"
	}
	return "clean"
}

// ParseCutMode reads the mode parameter of a disconnect request: absent or
// "clean", or "abort"; anything else is an error.
func ParseCutMode(r *http.Request) (CutMode, error) {
	switch m := r.URL.Query().Get("mode"); m {
	case "", "clean":
		return CutClean, nil
	case "abort":
		return CutAbort, nil
	default:
		return CutClean, fmt.Errorf("mode must be clean or abort, not %q", m)
	}
}

type connKey struct{}

// ConnContext is Server's http.Server.ConnContext: every request's context
// carries its connection, which Track records for an abort. Set it on
// another http.Server (a test's) to get the same.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// Stream is one open SSE request that a disconnect can cut. Its methods are
// safe for concurrent use.
type Stream struct {
	cancel context.CancelFunc
	conn   net.Conn // nil when the server did not record it
}

// Track returns a Stream for r and the request the SSE handler serves in
// its place, whose context a clean Cut cancels (the handler then ends the
// response like on a client disconnect). The caller must call Done when the
// handler has returned.
func Track(r *http.Request) (*Stream, *http.Request) {
	ctx, cancel := context.WithCancel(r.Context())
	c, _ := r.Context().Value(connKey{}).(net.Conn)
	return &Stream{cancel: cancel, conn: c}, r.WithContext(ctx)
}

// Done releases the stream's context.
func (s *Stream) Done() { s.cancel() }

// Cut ends the stream as mode says. Abort needs the connection (requests
// served by Server have it); without it Cut falls back to clean.
func (s *Stream) Cut(mode CutMode) {
	if mode == CutAbort && s.conn != nil {
		abort(s.conn)
		return
	}
	s.cancel()
}

// abort closes c with a TCP reset: SO_LINGER 0, then close, under any TLS.
func abort(c net.Conn) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
