package eventbus

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
)

// streamEnds are the ways a stream ends by itself; a nil channel never
// fires.
type streamEnds struct {
	lifetime <-chan time.Time // the Grant's Expires
	revoked  <-chan struct{}  // closed by Revoke
}

// endCause is why a stream ends by itself.
type endCause uint8

const (
	endNone endCause = iota
	endLifetime
	endRevoked
)

// poll reports whether an end has come, without waiting.
func (e streamEnds) poll() endCause {
	if e.lifetime == nil && e.revoked == nil {
		return endNone
	}
	select {
	case <-e.revoked:
		return endRevoked
	case <-e.lifetime:
		return endLifetime
	default:
		return endNone
	}
}

// sessionStream is one served stream of Handler: its subscription, what
// ends it, and its writer. It lives on the heap, not in a frame of the
// request's goroutine (see ServeHTTP).
type sessionStream struct {
	h        *Handler
	bus      *EventBus
	sub      *Subscription
	ls       *liveStream // its entry for Revoke; nil without Authorize
	lifetime *time.Timer // the Grant's Expires; nil without one
	ends     streamEnds
	end      endCause // how the stream ends by itself, once known
	s        stream
	frames   []Frame // the batch being taken
}

// close releases what open took, in reverse order.
func (st *sessionStream) close() {
	if st.lifetime != nil {
		st.lifetime.Stop()
	}
	st.s.beat.Stop()
	st.sub.Close()
	if st.ls != nil {
		st.h.reg.remove(st.ls)
	}
}

// served is a stream that serveStream serves: one session's
// (sessionStream) or several sessions' on one response (muxStream).
type served interface {
	// batch takes what is ready and writes it as one batch, with the frame
	// that ends the stream when it ends by itself. more reports that
	// frames were taken (there may be more), done that the stream is over.
	batch() (more, done bool)
	// failed ends the subscriptions after a heartbeat's write failed.
	failed(err error)
	// panicked tells the client and the log that the stream loop panicked
	// with p.
	panicked(p any)
	// close releases what the stream's open took.
	close()
}

// serveStream is the stream loop: write what is ready as one batch, else
// wait for frames (ready), the heartbeat, the end of the stream's lifetime,
// a revocation or the client going away; end records how the stream ends
// by itself once a wait learns it. Its frame is small on purpose: the work
// of a batch is in batch, whose frame is gone while the loop waits.
func serveStream(st served, s *stream, ready <-chan struct{}, ends streamEnds, end *endCause) {
	defer st.close()
	defer func() {
		// A bug must not take the daemon down with a half-written stream:
		// tell the client, log it, and end this stream only. Whatever the
		// exit, no write deadline of ours outlives the loop on HTTP/2 (see
		// armLastChunk for HTTP/1.x): there a deadline armed on a stream
		// the client has reset is a timer that nothing stops, and it keeps
		// the stream alive for the whole WriteTimeout (rapid reset, issue
		// 22).
		if p := recover(); p != nil {
			st.panicked(p)
		}
		if !s.lastChunk {
			s.disarm()
		}
	}()
	for {
		more, done := st.batch()
		if done {
			return
		}
		if more {
			continue // more may have arrived while writing
		}
		e, gone, err := s.wait(ready, ends)
		if err != nil {
			st.failed(err)
			return
		}
		if gone {
			return // the deferred close cancels without drain
		}
		*end = e
	}
}

// failed is served.failed: the subscription is dropped, its frames of the
// failed heartbeat's batch (none) counted as blocked.
func (st *sessionStream) failed(err error) { st.h.dropBlocked(st.s.ctx, st.sub, &st.s, err) }

// panicked is served.panicked: a stream_error internal frame in place of
// the half-written batch.
func (st *sessionStream) panicked(p any) {
	s := &st.s
	st.h.logger().LogAttrs(s.ctx, slog.LevelError, "eventbus: stream panicked", slog.Any("panic", p))
	s.buf = append(s.buf[:0], st.bus.StreamErrorFrame("internal error", ErrorKindInternal).SSE()...)
	_ = s.flushBatch()
}

// batch takes what is ready and writes it as one batch, with the frame that
// ends the stream when it ends by itself. more reports that frames were
// taken (the queue may hold more), done that the stream is over.
//
//go:noinline
func (st *sessionStream) batch() (more, done bool) {
	s, sub := &st.s, st.sub
	// No yield before waiting: between batches the handler writes and
	// flushes, which gives the publisher time to queue more, and in the
	// peer harness's tight-publisher runs the yield gave 10x slower
	// outliers (docs/bench/NOTES.md, item 8).
	frames, open := sub.TakeReady(st.frames[:0])
	if st.end == endNone {
		// After the take: a batch taken after Revoke returned is never
		// written.
		st.end = st.ends.poll()
	}
	if st.end == endRevoked {
		// Access is gone: what was queued is not written. The client's
		// cursor stays before it, so nothing is lost should it get
		// access again.
		sub.MarkDiscarded(len(frames))
		clear(frames)
		frames = frames[:0]
	}
	s.reserve(frames)
	terminal := false
	for _, f := range frames {
		s.add(f)
		terminal = terminal || f.Terminal()
	}
	taken := len(frames)
	clear(frames) // do not pin delivered frames while idle
	st.frames = frames[:0]
	gone := s.ctx.Err() != nil
	switch {
	case st.end == endRevoked && !gone:
		s.add(st.bus.StreamErrorFrame(revokedMessage, ErrorKindRevoked))
		open = false
	case st.end == endLifetime && open:
		// After what was queued: the client resumes after its last id.
		s.add(st.bus.StreamErrorFrame(lifetimeEndedMessage, ErrorKindReauthenticate))
		open = false
	case !open && !terminal && !gone:
		if f, ok := endFrame(st.bus, sub); ok {
			s.add(f)
		}
	}
	if len(s.buf) > 0 || s.pending {
		if err := s.flushBatch(); err != nil {
			st.h.dropBlocked(s.ctx, sub, s, err)
			return false, true
		}
		s.tailField = false // every frame ends with a blank line
	}
	// Delivered only once written and flushed: the frames of a failed
	// batch are counted as dropped (blocked) instead, never as both. Not
	// for an empty take (each delivery ends with one): the counter is the
	// bus's, shared by every subscriber.
	if taken > 0 {
		sub.MarkWritten(taken)
	}
	if !open || st.end != endNone {
		// (A stream ended by itself returns with its subscription open:
		// the deferred Close ends it, dropping what came after.)
		s.armLastChunk()
		return false, true
	}
	return taken > 0, false
}

// wait is a stream loop's wait between batches: for frames (ready), the
// heartbeat, which it writes and flushes (err is that flush's), the end of
// the stream's lifetime or a revocation (end), or the client going away
// (gone). The heartbeat timer is not reset by every batch, which would
// cost a timer update per batch: when it fires after a write, it is set
// again for Heartbeat after that write.
func (s *stream) wait(ready <-chan struct{}, ends streamEnds) (end endCause, gone bool, err error) {
	select {
	case <-ready:
	case <-s.beat.C:
		if quiet := time.Since(s.wrote); quiet < s.idle {
			s.beat.Reset(s.idle - quiet)
			return endNone, false, nil
		}
		s.appendHeartbeat()
		if err := s.flushBatch(); err != nil {
			return endNone, false, err
		}
		s.beat.Reset(s.idle)
	case <-ends.lifetime:
		return endLifetime, false, nil
	case <-ends.revoked:
		return endRevoked, false, nil
	case <-s.ctx.Done():
		return endNone, true, nil
	}
	return endNone, false, nil
}

// dropBlocked ends a subscription whose write failed or hit its deadline:
// no drain, no frame (the connection is unusable).
// A write that fails because the client went away is a plain
// cancellation; anything else is counted as dropped, reason blocked.
func (h *Handler) dropBlocked(ctx context.Context, sub *Subscription, s *stream, err error) {
	dropWriteFailed(ctx, sub, s.frames, err)
}

// dropWriteFailed is dropBlocked for a subscription of which unwritten
// frames taken were in the batches that failed.
func dropWriteFailed(ctx context.Context, sub *Subscription, unwritten int, err error) {
	// net/http cancels the request context as soon as a write on the
	// connection fails, a deadline included (HTTP/1.1 and HTTP/2 alike), so
	// a done context alone does not mean the client left: a write that hit
	// its deadline is a blocked writer either way.
	if ctx.Err() != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		sub.Close()
		return
	}
	sub.CloseBlocked(unwritten, err)
}

// endFrame is the frame that ends a single stream whose subscription
// ended without a terminal frame of its own: stream_error internal for a
// failure (endErrorFrame); stream_error closed when the bus was closed by
// a plain Close (a Hub's Delete, a backplane releasing a session deleted on its
// replica: Err is nil), as a multiplexed stream says
// it for that session: the session this stream followed is gone
// (docs/SPEC.md 5.2). None otherwise (an eviction and the other closes
// queue their own terminal frame).
func endFrame(bus *EventBus, sub *Subscription) (Frame, bool) {
	if f, ok := endErrorFrame(bus, sub); ok {
		return f, true
	}
	if sub.Err() == nil {
		return bus.StreamErrorFrame(sessionClosedMessage, ErrorKindClosed), true
	}
	return Frame{}, false
}

// sessionClosedMessage is the error of a stream_error closed.
const sessionClosedMessage = "session closed"

// endErrorFrame returns the stream_error internal frame for a subscription
// that ended, without a terminal frame of its own, for a reason the client
// would not otherwise learn (an eviction and closeWithError queue their
// own terminal frame; a plain Close gets stream_error closed instead,
// endFrame).
func endErrorFrame(bus *EventBus, sub *Subscription) (Frame, bool) {
	if err := sub.Err(); err != nil && !errors.Is(err, ErrEvicted) && !errors.Is(err, ErrClosed) {
		return bus.StreamErrorFrame(err.Error(), ErrorKindInternal), true
	}
	return Frame{}, false
}

// idField starts an event's SSE encoding (see Frame.SSE).
const idField = "id: "

// heartbeat is the idle keep-alive once the stream's tail holds a field:
// one comment line, without a blank line after it (see Handler), as short
// as a comment can be, because lenient clients keep such lines until the
// next event's blank line.
const heartbeat = ":\n"

// stream batches frames for one response. Every batch is written with one
// Write when it fits maxBatchBuffer (frames of directWriteSize or more go
// out from their shared bytes) and flushed once, under one write deadline
// (see arm).
type stream struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	// ctx is the request's context: once it is done no deadline is armed
	// (see arm).
	ctx     context.Context
	timeout time.Duration
	// http1: the response is HTTP/1.x, whose last chunk net/http writes
	// after the handler returns (see armLastChunk).
	http1 bool
	buf   []byte
	// idPrefix is "id: <epoch>:" unless Handler.BareIDs, else nil. An
	// event's shared bytes start with "id: N"; the writer puts idPrefix
	// in front of the bytes after "id: ", so the frames stay encoded once.
	idPrefix []byte
	retry    int64 // this connection's retry:, in milliseconds
	// tailField: since the last blank line the stream has carried a field
	// (the retry: line), not only comments (see Handler).
	tailField bool
	err       error // the first write error; later writes are skipped
	pending   bool  // written since the last flush
	armed     bool  // this batch's write deadline is set (see arm)
	lastChunk bool  // the deadline armed is the last chunk's, kept on return
	frames    int   // frames in this batch
	// until is the write deadline set on the connection, zero when none:
	// on HTTP/2 it is cleared after every batch; on HTTP/1.x it stays, and
	// a batch sets a new one only when it is older than timeout/8 (see
	// arm). noDeadline: the writer cannot set one (ErrNotSupported).
	until      time.Time
	noDeadline bool
	// cut is set by interrupt, from another goroutine: a Hub's budget took
	// back what the stream's subscription held, and the batch in flight
	// must be let go. rcp is rc, for interrupt to read.
	cut atomic.Bool
	rcp atomic.Pointer[http.ResponseController]
	// idle is the heartbeat interval, beat its timer, wrote the time of
	// the last batch written (see wait).
	idle  time.Duration
	beat  *time.Timer
	wrote time.Time
}

const (
	// Frames this large are written from their shared bytes instead of
	// being copied into the batch.
	directWriteSize = 64 << 10
	// A batch buffer beyond this is written out before it grows further,
	// and is not kept between batches.
	maxBatchBuffer = 1 << 20
)

// appendRetry adds the connection's retry: line, without a blank line.
func (s *stream) appendRetry() {
	s.buf = strconv.AppendInt(append(s.buf, "retry: "...), s.retry, 10)
	s.buf = append(s.buf, '\n')
	s.tailField = true
}

// appendHeartbeat adds the idle keep-alive: the retry: line again when
// the text since the last blank line holds no field, else a comment (see
// Handler).
func (s *stream) appendHeartbeat() {
	if s.tailField {
		s.buf = append(s.buf, heartbeat...)
	} else {
		s.appendRetry()
	}
}

// reserve makes room in the batch buffer for the frames add will copy,
// in one allocation: growing by doubling while a large batch is copied
// moved each byte several times and took a fifth of the handler's CPU with
// 256 clients (docs/bench/NOTES.md, item 10).
func (s *stream) reserve(frames []Frame) {
	need := 0
	for _, f := range frames {
		if f.Size() < directWriteSize { // larger ones are written directly
			need += len(f.SSE())
		}
		if s.idPrefix != nil && f.ID() != 0 {
			need += len(s.idPrefix) - len(idField)
		}
	}
	if len(s.buf)+need <= maxBatchBuffer {
		s.buf = slices.Grow(s.buf, need)
	}
}

func (s *stream) add(f Frame) {
	s.frames++
	if s.err != nil {
		return
	}
	wire := f.SSE()
	prefix := s.idPrefix != nil && f.ID() != 0 // only events have an id line
	if prefix {
		wire = wire[len(idField):]
	}
	big := f.Size() >= directWriteSize
	if big || len(s.buf)+len(s.idPrefix)+len(wire) > maxBatchBuffer {
		s.write(nil)
	}
	if prefix {
		s.buf = append(s.buf, s.idPrefix...)
	}
	if big {
		s.write(nil) // the prefix, if any
		s.write(wire)
		return
	}
	s.buf = append(s.buf, wire...)
}

// write sends p, or the batch buffer when p is nil, under the batch's
// deadline.
func (s *stream) write(p []byte) {
	if p == nil {
		p = s.buf
		s.buf = s.buf[:0]
		if cap(s.buf) > maxBatchBuffer {
			s.buf = nil
		}
	}
	if s.err != nil || len(p) == 0 {
		return
	}
	s.arm()
	if s.err == nil {
		_, s.err = s.w.Write(p)
		s.pending = true
	}
}

// arm sets the batch's write deadline, at the batch's first write, and
// stamps the batch's time (see wait). On HTTP/2 it is now+timeout, cleared
// after the flush (see disarm). On HTTP/1.x a deadline on the connection
// only bounds writes, so it is left set between batches and a batch sets a
// new one only when the one set is older than timeout/8: a write then
// fails between 7/8 of the timeout and the timeout after it starts, and a
// busy stream sets at most eight deadlines per timeout instead of two per
// batch (each a runtime timer update, 14% of the handler's CPU in a
// fan-out to 10,000 clients: issue 26). A request whose context is done
// gets none, and the batch fails with the context's error: the client has
// gone (or a write failed), and on HTTP/2 a deadline set on a stream
// already closed is a timer that nothing stops (see disarm).
func (s *stream) arm() {
	if s.armed || s.err != nil {
		return
	}
	if err := s.ctx.Err(); err != nil {
		s.err = err
		return
	}
	if s.cut.Load() {
		s.err = errInterrupted
		return
	}
	s.armed = true
	now := time.Now()
	s.wrote = now
	if s.noDeadline || s.http1 && !s.until.IsZero() && s.until.Sub(now) >= s.timeout-s.timeout/8 {
		return
	}
	until := now.Add(s.timeout)
	switch err := s.rc.SetWriteDeadline(until); {
	case err == nil:
		s.until = until
		if s.cut.Load() {
			// interrupt's deadline may have come before this one.
			_ = s.rc.SetWriteDeadline(time.Now())
		}
	case errors.Is(err, http.ErrNotSupported):
		s.noDeadline = true
	default:
		s.err = err
	}
}

// interrupt is the subscription's Interrupt (SubscribeOptions): the write
// in progress, and any later one, fails at once, so that the batch it
// holds is let go and the stream ends. Any goroutine may call it; it does
// not block (on HTTP/1.x a deadline on the connection, on HTTP/2 a
// deadline in the past resets the stream).
func (s *stream) interrupt() {
	s.cut.Store(true)
	if rc := s.rcp.Load(); rc != nil {
		_ = rc.SetWriteDeadline(time.Now())
	}
}

// errInterrupted is the error of a batch whose stream was interrupted.
var errInterrupted = errors.New("eventbus: the stream's subscription was shed by its hub's memory budget")

// disarm clears the write deadline if one is set, whether or not the batch
// failed. Go's HTTP/2 server (1.26) stops a stream's deadline timer when the
// stream closes, but a deadline set after that (the client reset the stream
// while the batch was being armed) starts a new timer, which only a clear
// stops: the clear goes to the connection's serve loop after the set, in
// order, so it always finds the timer.
func (s *stream) disarm() {
	if s.until.IsZero() {
		return
	}
	s.until = time.Time{}
	if err := s.rc.SetWriteDeadline(time.Time{}); err != nil && !errors.Is(err, http.ErrNotSupported) && s.err == nil {
		s.err = err
	}
}

// armLastChunk gives net/http's end of an HTTP/1.x response, written after
// the handler returns (the last chunk), a deadline of its own (the batch's,
// or a new one as arm decides): without one a client that stopped reading
// holds the connection for good, and one that expired while the last batch
// went out would cut the connection right after a terminal frame the client
// has read. HTTP/2 needs none: the end of its stream is an empty DATA frame,
// which flow control does not hold, so only a stuck connection can hold it,
// and a stream's deadline cannot unstick that (its RST_STREAM would wait
// behind it); armed there after a reset it would only pin the stream. None
// is armed once the request's context is done.
func (s *stream) armLastChunk() {
	if !s.http1 || s.err != nil || s.ctx.Err() != nil {
		return
	}
	s.armed = false
	s.arm()
	s.lastChunk = !s.until.IsZero()
}

// flushBatch writes what is buffered, flushes once, clears the write
// deadline on HTTP/2 (also when the batch failed), and returns the first
// error of the batch.
func (s *stream) flushBatch() error {
	s.write(nil)
	if s.err == nil && s.pending {
		s.err = s.rc.Flush()
	}
	// Go's HTTP/2 server resets a stream when its write deadline passes even
	// while nothing is being written; an idle stream must have none, whatever
	// Heartbeat and WriteTimeout are. A failed batch clears it too: its
	// stream may have been reset before the deadline was set (see disarm).
	if !s.http1 {
		s.disarm()
	}
	s.armed = false
	s.pending = false
	if s.err == nil {
		// On an error the caller still needs the count: the frames of the
		// failed batch are counted as dropped, reason blocked.
		s.frames = 0
	}
	return s.err
}

// writeStreamHeaders sends SPEC 10's response headers and the 200 status.
func writeStreamHeaders(w http.ResponseWriter, r *http.Request, bus *EventBus) {
	writeSSEHeaders(w, r, "Event-Epoch", bus.Epoch())
}

// writeSSEHeaders sends the stream's response headers, with the epoch
// header epochName (exposed to CORS pages) set to epoch, and the 200
// status.
func writeSSEHeaders(w http.ResponseWriter, r *http.Request, epochName, epoch string) {
	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-cache, no-transform")
	if r.ProtoMajor == 1 {
		hd.Set("Connection", "keep-alive")
	}
	hd.Set("X-Accel-Buffering", "no")
	hd.Set(epochName, epoch)
	hd.Set("Access-Control-Expose-Headers", epochName)
	w.WriteHeader(http.StatusOK)
}

// canFlush reports whether w, or a writer it wraps (the Unwrap convention
// of http.ResponseController), can flush. It is checked before subscribing:
// once the status line is out it is too late to answer 500.
func canFlush(w http.ResponseWriter) bool {
	for {
		switch x := w.(type) {
		case http.Flusher:
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return false
		}
	}
}
