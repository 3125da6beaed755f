package websocket

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	ws "github.com/coder/websocket"
	"github.com/ssebus/eventbus"
)

// Subprotocol is the WebSocket subprotocol of the wire (docs/SPEC.md
// 6.10): the server selects it when the client offers it, and none
// otherwise.
const Subprotocol = "eventbus.v1"

// The close codes of the wire that RFC 6455 does not define: the stream
// ended because its credentials expired (the client reauthenticates and
// resumes with its cursor), because its access was revoked, or because a
// session's subscription was evicted (it resumes with its cursor). They
// are untyped, so they compare with github.com/coder/websocket's
// StatusCode as they are.
const (
	StatusReauthenticate = 4401
	StatusRevoked        = 4403
	StatusEvicted        = 4429
)

// The limits on client messages (docs/SPEC.md 6.10): a message longer than
// MaxMessageBytes closes the socket with 1009, one past the rate (a token
// bucket of MessageBurst tokens refilled at MessageRate a second) with
// 1008 rate_limited.
const (
	MaxMessageBytes = 8 << 10
	MessageRate     = 20
	MessageBurst    = 40
)

// Handler serves the multiplexed stream of package eventbus (docs/SPEC.md
// 6.8) over a WebSocket, typically on "GET /ws?session=a&session=b". The
// wire, the handshake's checks and the close codes are docs/SPEC.md 6.10.
//
// The handshake is checked in this order: the method (GET, else 405
// method_not_allowed); the Origin (eventbus.CORS.AllowsOrigin with the
// Mux's Handler's CORS, else 403 origin_not_allowed: a browser opens a
// WebSocket from any site with the visitor's cookies); a WebSocket
// handshake (else 426 upgrade_required); a connection that can be taken
// over (else 500 streaming_unsupported); then Mux.OpenStream, whose
// sessions, query, Lookup, Authorize and subscriptions answer their own
// refusals with the multiplexed route's JSON; only then the upgrade. Every
// refusal is JSON {"error":...,"code":...}, as the root's handlers answer.
//
// ServeHTTP returns once the connection is upgraded, and the stream is
// served on a goroutine of its own until it ends, under StreamContext's
// context: net/http then releases the request's goroutine and its state,
// so that an idle WebSocket costs no more than an idle SSE stream
// (BENCHMARKS.md). The stream ends when its client leaves, when its
// sessions end (EventBus.Close, Hub.Delete, Hub.Shutdown), when
// Handler.Revoke names its subject, when its lifetime ends, when a write
// fails, or when StreamContext's context is cancelled; its goroutine then
// closes the connection and returns. One more goroutine per connection
// reads the client's messages, and one at a time may wait for a ping's
// pong; both end before the stream's goroutine does. Each batch of the stream
// is one text message written under the Handler's WriteTimeout: a write
// that blocks longer closes the connection without a close frame. A stream
// that ends by itself is closed with the close code of its end (1000
// closed, 1001 shutdown, StatusReauthenticate, StatusRevoked,
// StatusEvicted, 1011 internal) after its last frames; a client that
// leaves, or a write that fails, closes it without one.
//
// A Handler is safe for concurrent use once its fields are set; they must
// not change while it serves. It must not be copied after first use. The
// zero Handler answers 404 session_not_found to a handshake with valid
// sessions, since it has no Lookup.
type Handler struct {
	// Mux opens the streams: its sessions rule, MaxStreamSessions, and
	// its Handler's Lookup, Authorize, Revoke registry (Handler.Revoke
	// ends the WebSocket streams too), Heartbeat (the idle time before a
	// ping), WriteTimeout (the bound on each batch's write and on a ping's
	// pong), CORS (only its origin check: no CORS header is sent) and
	// Logger. nil: a MuxHandler of its own without a Handler, so every
	// session is unknown.
	Mux *eventbus.MuxHandler
	// CompressionThreshold turns permessage-deflate on when positive:
	// negotiated with a client that offers it, without context takeover
	// (no memory kept per connection between messages), and applied to the
	// messages of at least that many bytes. 0 (or negative): off, and not
	// negotiated.
	CompressionThreshold int
	// StreamContext, when set, is called with the request of a handshake
	// that passed the checks above, before the stream opens, and returns
	// the context the stream is opened and served under and a func (nil:
	// none) called once: when the stream has ended and the connection is
	// closed, or at once when the opening is refused or the upgrade fails.
	// Cancelling ctx ends the stream as a client leaving does: the
	// connection closes without a close frame. Until the upgrade the
	// request's cancellation ends the opening too. A daemon that cuts its
	// streams (its own /disconnect, say) or counts them sets it. ctx must
	// not be derived from the request's cancellation, which net/http
	// cancels as soon as ServeHTTP returns: context.WithoutCancel(
	// r.Context()) keeps its values. nil: that context, and no func.
	StreamContext func(r *http.Request) (ctx context.Context, done func())

	def eventbus.MuxHandler // when Mux is nil
}

func (h *Handler) mux() *eventbus.MuxHandler {
	if h.Mux != nil {
		return h.Mux
	}
	return &h.def
}

// settings returns the Handler whose settings the streams use (a zero one
// when the Mux has none).
func (h *Handler) settings() *eventbus.Handler {
	if m := h.mux(); m.Handler != nil {
		return m.Handler
	}
	return &zeroHandler
}

// zeroHandler is the settings of a Mux without a Handler: the defaults. It
// is only read.
var zeroHandler eventbus.Handler

func (h *Handler) logger() *slog.Logger {
	if l := h.settings().Logger; l != nil {
		return l
	}
	return slog.Default()
}

// ServeHTTP implements http.Handler: it checks the handshake, opens the
// stream, upgrades the connection, and returns, the stream served on a
// goroutine of its own until it ends (see Handler).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if c := h.open(w, r); c != nil {
		// Not on the request's goroutine: its stack (8 KiB, most of it
		// net/http's frames) and net/http's connection state would stay
		// for as long as the stream, 5 KiB an idle connection
		// (docs/bench/scale-ws.md, part 5).
		go c.serve()
	}
}

// refuse answers a handshake refused before the stream was opened.
func refuse(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	w.Header().Set("Cache-Control", "no-store")
	(&eventbus.StatusError{Status: status, Code: code, Message: msg}).ServeHTTP(w, r)
}

// open checks the handshake, opens the stream and upgrades the connection;
// nil when it answered the request instead.
func (h *Handler) open(w http.ResponseWriter, r *http.Request) *conn {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		refuse(w, r, http.StatusMethodNotAllowed, "method_not_allowed", "websocket: the method must be GET")
		return nil
	}
	s := h.settings()
	if !s.CORS.AllowsOrigin(r) {
		refuse(w, r, http.StatusForbidden, "origin_not_allowed", "websocket: origin not allowed")
		return nil
	}
	if msg := checkHandshake(r); msg != "" {
		hd := w.Header()
		hd.Set("Upgrade", "websocket")
		hd.Set("Connection", "Upgrade")
		hd.Set("Sec-WebSocket-Version", "13")
		refuse(w, r, http.StatusUpgradeRequired, "upgrade_required", "websocket: "+msg)
		return nil
	}
	if !canHijack(w) {
		// As the SSE routes' check of a writer that cannot flush: before
		// any Lookup, and never a stream that cannot be served.
		refuse(w, r, http.StatusInternalServerError, "streaming_unsupported", "websocket: the connection cannot be taken over from net/http")
		return nil
	}
	// The stream's context (see conn.ctx), which the request's
	// cancellation ends too until the upgrade: a client that leaves
	// during the opening ends it. The Stream keeps r, and calls Lookup and
	// Authorize with it for the sessions the client adds: with this
	// context, not the request's, which net/http cancels once ServeHTTP
	// has returned.
	ctx, cancel, done := h.streamContext(r)
	stop := context.AfterFunc(r.Context(), cancel)
	r = r.WithContext(ctx)
	var st *eventbus.Stream
	opened := false
	defer func() {
		// Refused, failed, or panicked (in the embedder's Lookup or
		// Authorize, say, which net/http then recovers): undo, and call
		// StreamContext's func all the same.
		if !opened {
			if st != nil {
				st.Close()
			}
			stop()
			cancel()
			done()
		}
	}()
	st = h.mux().OpenStream(w, r)
	if st == nil {
		return nil // it answered
	}
	hj := &hijackRecorder{ResponseWriter: w}
	opts := &ws.AcceptOptions{
		Subprotocols: []string{Subprotocol},
		// The origin was checked above, with the Handler's CORS: coder's
		// own check knows only its patterns and would refuse differently.
		InsecureSkipVerify: true,
	}
	if h.CompressionThreshold > 0 {
		opts.CompressionMode = ws.CompressionNoContextTakeover
		opts.CompressionThreshold = h.CompressionThreshold
	}
	c, err := ws.Accept(hj, r, opts)
	if err != nil || hj.raw == nil {
		if c != nil {
			_ = c.CloseNow()
		}
		h.logger().LogAttrs(r.Context(), slog.LevelWarn, "websocket: upgrade failed", slog.Any("error", err))
		return nil
	}
	c.SetReadLimit(MaxMessageBytes)
	flate := w.Header().Get("Sec-WebSocket-Extensions") != "" // Accept set it: negotiated
	cn := newConn(h, st, c, hj.raw, flate, ctx, cancel, done)
	stop() // a cancel that came meanwhile ends the stream at once
	opened = true
	return cn
}

// streamContext returns the context of a stream of r (StreamContext's,
// else r's without its cancellation) with its cancel, and the func to call
// once the stream has ended.
func (h *Handler) streamContext(r *http.Request) (context.Context, context.CancelFunc, func()) {
	base, done := context.WithoutCancel(r.Context()), func() {}
	if h.StreamContext != nil {
		base, done = h.StreamContext(r)
		if done == nil {
			done = func() {}
		}
	}
	ctx, cancel := context.WithCancel(base)
	return ctx, cancel, done
}

// checkHandshake returns why r is not a WebSocket handshake that
// github.com/coder/websocket accepts, "" when it is one.
func checkHandshake(r *http.Request) string {
	switch {
	case !r.ProtoAtLeast(1, 1) || r.ProtoMajor != 1:
		// HTTP/2 and HTTP/3 carry WebSockets only with RFC 8441's extended
		// CONNECT, which the library does not serve.
		return "a WebSocket handshake needs HTTP/1.1"
	case !hasToken(r.Header, "Connection", "upgrade"):
		return "the Connection header does not contain Upgrade"
	case !hasToken(r.Header, "Upgrade", "websocket"):
		return "the Upgrade header does not contain websocket"
	case r.Header.Get("Sec-WebSocket-Version") != "13":
		return "Sec-WebSocket-Version must be 13"
	case r.Header.Get("Sec-WebSocket-Key") == "":
		return "the Sec-WebSocket-Key header is missing"
	}
	return ""
}

// hasToken reports whether the comma-separated header key holds token,
// without regard to case.
func hasToken(h http.Header, key, token string) bool {
	for _, v := range h.Values(key) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// canHijack reports whether w, or a writer it unwraps to (as
// http.ResponseController and coder's Accept look for it), can be taken
// over.
func canHijack(w http.ResponseWriter) bool {
	for {
		switch t := w.(type) {
		case http.Hijacker:
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = t.Unwrap()
		default:
			return false
		}
	}
}

// hijackRecorder is the ResponseWriter given to coder's Accept: it keeps
// the connection Accept takes over, whose deadlines bound the stream's
// writes without a context per write (see conn.kill).
type hijackRecorder struct {
	http.ResponseWriter
	raw net.Conn
}

// Hijack is http.Hijacker's, through http.ResponseController (which
// unwraps middleware's writers).
func (h *hijackRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err == nil {
		h.raw = c
	}
	return c, brw, err
}

// closeCode is the close frame that ends a stream that ended with end;
// ok is false for the ends that close the connection without one (the
// client left, a write failed).
func closeCode(end eventbus.StreamEnd) (code ws.StatusCode, reason string, ok bool) {
	switch end {
	case eventbus.StreamClosed:
		return ws.StatusNormalClosure, "closed", true
	case eventbus.StreamShutdown:
		return ws.StatusGoingAway, "shutdown", true
	case eventbus.StreamExpired:
		return StatusReauthenticate, "reauthenticate", true
	case eventbus.StreamRevoked:
		return StatusRevoked, "revoked", true
	case eventbus.StreamEvicted:
		return StatusEvicted, "evicted", true
	case eventbus.StreamPanicked:
		return ws.StatusInternalError, "internal", true
	}
	return 0, "", false
}

// errWriteBlocked is the error of a batch that did not go out within the
// write timeout; it wraps os.ErrDeadlineExceeded, so that the stream
// counts the batch as blocked whether or not the reader saw the
// connection end first.
var errWriteBlocked = fmt.Errorf("websocket: a write blocked past the write timeout: %w", os.ErrDeadlineExceeded)

// errInterrupted is the error of a batch after Interrupt.
var errInterrupted = errors.New("websocket: the stream was interrupted")

// errPongMissing is the error of a keepalive after a ping whose pong did
// not come within the write timeout.
var errPongMissing = errors.New("websocket: no pong within the write timeout")

// writeTimeout is the Handler's WriteTimeout with its default.
func (h *Handler) writeTimeout() time.Duration {
	if d := h.settings().WriteTimeout; d > 0 {
		return d
	}
	return eventbus.DefaultWriteTimeout
}

// background is the context of the stream's message writes: it has no
// Done channel, so coder's writes arm no timer and allocate nothing; the
// write timeout is conn's watchdog instead.
var background = context.Background()
