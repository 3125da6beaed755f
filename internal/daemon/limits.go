package daemon

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/ssebus/eventbus"
)

// The defaults of Limits.
const (
	// DefaultReadHeaderTimeout bounds the time a client takes to send a
	// request's headers (slowloris): past it the connection is closed.
	DefaultReadHeaderTimeout = 10 * time.Second
	// DefaultMaxHeaderBytes bounds a request's headers (and, on HTTP/2,
	// its header list): past it the server answers 431.
	DefaultMaxHeaderBytes = 64 << 10
	// DefaultKeepAliveTimeout is how long an idle keep-alive connection
	// stays open between requests.
	DefaultKeepAliveTimeout = 2 * time.Minute
	// DefaultBodyTimeout bounds the time a client takes to send a request
	// body, from the start of its handler: a 16 MiB body at 1 MB/s fits.
	DefaultBodyTimeout = eventbus.DefaultBodyTimeout
	// DefaultBodyBudgetBodies is how many bodies of the largest size
	// Limits.BodyBudget admits at once by default.
	DefaultBodyBudgetBodies = 4
)

// Limits bound what clients can hold of a daemon: the time and size of a
// request's headers, idle keep-alive connections, the time a request body
// may take to arrive, and the body bytes the daemon reads at once. The zero
// value of each field means its default.
//
// What is bounded, and how a client learns it:
//   - headers slower than ReadHeaderTimeout: the connection is closed;
//   - headers larger than MaxHeaderBytes: 431;
//   - a body not received within BodyTimeout: 408 request_timeout (the
//     handler's read answers it: eventbus.PublishHandler, SignalHandler,
//     WriteBodyError), connection closed;
//   - a Content-Length above MaxBody: 413 body_too_large before any byte
//     of the body is read;
//   - a body while BodyBudget is spent by bodies being read: 503
//     server_busy with Retry-After, before any byte of it is read.
//
// There is no read or write timeout on the whole request: an SSE stream
// lives as long as its client, and the eventbus handler puts a deadline
// on each of its writes instead.
type Limits struct {
	ReadHeaderTimeout time.Duration // 0: DefaultReadHeaderTimeout
	MaxHeaderBytes    int           // 0: DefaultMaxHeaderBytes
	KeepAliveTimeout  time.Duration // http.Server.IdleTimeout; 0: DefaultKeepAliveTimeout
	// BodyTimeout is the deadline of reading a request body (a POST's),
	// counted from the start of its handler; 0: DefaultBodyTimeout.
	BodyTimeout time.Duration
	// MaxBody is the largest request body of any route (a route may
	// refuse less, as POST /login does); 0: MaxBody(0), the body of a
	// 16 MiB event.
	MaxBody int64
	// BodyBudget bounds the bytes of the request bodies being read at
	// once: each body reserves its Content-Length (MaxBody without one)
	// until its handler returns. 0: DefaultBodyBudgetBodies * MaxBody.
	// It must be at least MaxBody, so that the largest body fits.
	BodyBudget int64
}

// withDefaults returns l with every zero field set to its default, or an
// error for a negative field or a budget below MaxBody.
func (l Limits) withDefaults() (Limits, error) {
	if l.ReadHeaderTimeout < 0 || l.MaxHeaderBytes < 0 || l.KeepAliveTimeout < 0 ||
		l.BodyTimeout < 0 || l.MaxBody < 0 || l.BodyBudget < 0 {
		return l, fmt.Errorf("daemon: negative limit in %+v", l)
	}
	if l.ReadHeaderTimeout == 0 {
		l.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if l.MaxHeaderBytes == 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if l.KeepAliveTimeout == 0 {
		l.KeepAliveTimeout = DefaultKeepAliveTimeout
	}
	if l.BodyTimeout == 0 {
		l.BodyTimeout = DefaultBodyTimeout
	}
	if l.MaxBody == 0 {
		l.MaxBody = MaxBody(0)
	}
	if l.BodyBudget == 0 {
		l.BodyBudget = DefaultBodyBudgetBodies * l.MaxBody
	}
	if l.BodyBudget < l.MaxBody {
		return l, fmt.Errorf("daemon: body budget %d below the largest body %d", l.BodyBudget, l.MaxBody)
	}
	return l, nil
}

// apply sets the server's header and keep-alive limits on hs and wraps
// its handler with the body limits. l has its defaults.
func (l Limits) apply(hs *http.Server) {
	hs.ReadHeaderTimeout = l.ReadHeaderTimeout
	hs.MaxHeaderBytes = l.MaxHeaderBytes
	hs.IdleTimeout = l.KeepAliveTimeout
	hs.Handler = &bodyLimiter{next: hs.Handler, limits: l}
}

// bodyLimiter enforces Limits' body bounds in front of a handler. It is
// safe for concurrent use.
type bodyLimiter struct {
	next   http.Handler
	limits Limits

	mu       sync.Mutex
	reserved int64 // bytes of the bodies being read
}

func (b *bodyLimiter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// A GET, HEAD or OPTIONS is never read for a body (the routes that
	// take one are POSTs), and a stream must not hold a reservation or a
	// read deadline for its whole life.
	if r.ContentLength == 0 || r.Method == http.MethodGet || r.Method == http.MethodHead || r.Method == http.MethodOptions {
		b.next.ServeHTTP(w, r)
		return
	}
	n := r.ContentLength
	if n > b.limits.MaxBody {
		refuse(w)
		eventbus.WriteError(w, r, &http.MaxBytesError{Limit: b.limits.MaxBody})
		return
	}
	if n < 0 { // chunked, or HTTP/2 without Content-Length: at most MaxBody
		n = b.limits.MaxBody
		r.Body = http.MaxBytesReader(w, r.Body, n)
	}
	if !b.reserve(n) {
		refuse(w)
		WriteUnavailable(w, "server_busy", "too many request bodies are being read; retry after Retry-After")
		return
	}
	defer b.release(n)

	// The deadline needs no clearing once the body is read: the HTTP/1.1
	// server clears it when it starts reading the connection in the
	// background (to notice a client that goes away), and on HTTP/2 it
	// bounds the stream's body alone. A response writer that cannot set
	// deadlines (a test recorder) reads without one; every http.Server
	// connection can.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(b.limits.BodyTimeout))
	b.next.ServeHTTP(w, r)
}

// refuse prepares the answer to a request whose body is not read: the
// connection closes after it, and the body's read deadline is now, so
// that the server does not wait on the body to discard it (it would read
// up to 256 KiB of it, for as long as the client takes).
func refuse(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
}

func (b *bodyLimiter) reserve(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.reserved+n > b.limits.BodyBudget {
		return false
	}
	b.reserved += n
	return true
}

func (b *bodyLimiter) release(n int64) {
	b.mu.Lock()
	b.reserved -= n
	b.mu.Unlock()
}
