package daemon

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"sync"

	"github.com/ssebus/eventbus"
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

// Streams is a daemon's open streams by session, which POST
// /session/{id}/disconnect cuts. Its zero value is ready; its methods are
// safe for concurrent use.
type Streams struct {
	mu sync.Mutex
	m  map[string]map[*Stream]struct{}
}

// Serve serves req with h as a stream of the sessions ids, tracked until
// h returns (the SSE routes serve their streams on the request's
// goroutine).
func (s *Streams) Serve(w http.ResponseWriter, req *http.Request, h http.Handler, ids ...string) {
	st, req := Track(req)
	defer s.add(st, ids)()
	h.ServeHTTP(w, req)
}

// Context is a websocket.Handler's StreamContext for a stream of the
// sessions ids: the stream outlives its request (ServeHTTP returns once
// the connection is upgraded), so it is tracked from here until the
// returned func is called, and its context is the request's values
// without the request's cancellation, which a clean Cut cancels.
func (s *Streams) Context(req *http.Request, ids ...string) (context.Context, func()) {
	st, req := Track(req.WithContext(context.WithoutCancel(req.Context())))
	return req.Context(), s.add(st, ids)
}

// add tracks st under ids and returns the func that stops tracking it and
// releases its context.
func (s *Streams) add(st *Stream, ids []string) func() {
	s.mu.Lock()
	if s.m == nil {
		s.m = map[string]map[*Stream]struct{}{}
	}
	for _, id := range ids {
		if s.m[id] == nil {
			s.m[id] = map[*Stream]struct{}{}
		}
		s.m[id][st] = struct{}{}
	}
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		for _, id := range ids {
			delete(s.m[id], st)
			if len(s.m[id]) == 0 {
				delete(s.m, id)
			}
		}
		s.mu.Unlock()
		st.Done()
	}
}

// Count returns how many open streams serve session id.
func (s *Streams) Count(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m[id])
}

// Cut cuts every open stream of session id as mode says and returns how
// many.
func (s *Streams) Cut(id string, mode CutMode) int {
	s.mu.Lock()
	cuts := make([]*Stream, 0, len(s.m[id]))
	for st := range s.m[id] {
		cuts = append(cuts, st)
	}
	s.mu.Unlock()
	for _, st := range cuts {
		st.Cut(mode)
	}
	return len(cuts)
}

// MuxContext is Context for a multiplexed stream: the sessions of its URL
// (MuxSessions). It is a websocket.Handler's StreamContext as it is.
func (s *Streams) MuxContext(req *http.Request) (context.Context, func()) {
	return s.Context(req, MuxSessions(req)...)
}

// MuxSessions returns the sessions of a multiplexed stream's URL, for
// /disconnect; none when there are more than any stream serves (the
// handler refuses them: nothing to track).
func MuxSessions(req *http.Request) []string {
	ids := req.URL.Query()["session"]
	if len(ids) > eventbus.MaxCursorEntries {
		return nil
	}
	return ids
}
