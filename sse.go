package eventbus

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
)

// This file is the Server-Sent Events transport of Handler and MuxHandler:
// a Transport (transport.go) written on the package's exported API alone,
// as github.com/ssebus/eventbus/websocket's is (TestSSETransportUsesExportedAPIOnly).
// The routes (handler.go, mux.go) open the Stream and send the headers;
// this writes the stream's body.

// sseIDField starts an event's SSE encoding (see Frame.SSE).
const sseIDField = "id: "

// sseHeartbeat is the idle keep-alive once the stream's tail holds a
// field: one comment line, without a blank line after it (see Handler), as
// short as a comment can be, because lenient clients keep such lines
// until the next event's blank line.
const sseHeartbeat = ":\n"

const (
	// Frames this large are written from their shared bytes instead of
	// being copied into the batch.
	sseDirectWriteSize = 64 << 10
	// A batch buffer beyond this is written out before it grows further,
	// and is not kept between batches.
	sseMaxBatchBuffer = 1 << 20
)

// errSSEInterrupted is the error of a batch whose transport was
// interrupted (Transport.Interrupt).
var errSSEInterrupted = errors.New("eventbus: the stream was interrupted")

// sseTransport writes a Stream as one SSE response. Every batch is written
// with one Write when it fits sseMaxBatchBuffer (frames of
// sseDirectWriteSize or more go out from their shared bytes) and flushed
// once, under one write deadline (see arm). Its fields are owned by the
// goroutine running Serve, but cut (Interrupt's) and rc, set before Serve.
type sseTransport struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	// ctx is the request's context: once it is done no deadline is armed
	// (see arm).
	ctx     context.Context
	timeout time.Duration
	// http1: the response is HTTP/1.x, whose last chunk net/http writes
	// after the handler returns (see armLastChunk).
	http1 bool
	// multiplexed: the multiplexed wire (the id: line is the stream's
	// cursor, every envelope starts with the session member), else the
	// single stream's.
	multiplexed bool
	buf         []byte
	// idPrefix is "id: <epoch>:" on a single stream without
	// Handler.BareIDs, else nil. An event's shared bytes start with
	// "id: N"; the writer puts idPrefix in front of the bytes after
	// "id: ", so the frames stay encoded once.
	idPrefix []byte
	// cursorLen is the length of the last cursor written (the
	// multiplexed wire), for sizing a batch.
	cursorLen int
	retry     int64 // this connection's retry:, in milliseconds
	// tailField: since the last blank line the stream has carried a field
	// (the retry: line), not only comments (see Handler).
	tailField bool
	err       error // the first write error; later writes are skipped
	pending   bool  // written since the last flush
	armed     bool  // this batch's write deadline is set (see arm)
	inBatch   bool  // a WriteBatch has not returned (it panicked)
	lastChunk bool  // the deadline armed is the last chunk's, kept on return
	// until is the write deadline set on the connection, zero when none:
	// on HTTP/2 it is cleared after every batch; on HTTP/1.x it stays, and
	// a batch sets a new one only when it is older than timeout/8 (see
	// arm). noDeadline: the writer cannot set one (ErrNotSupported).
	until      time.Time
	noDeadline bool
	// cut is set by Interrupt, from another goroutine.
	cut atomic.Bool
}

// newSSETransport returns the transport of the response to r, with this
// connection's retry: line in its buffer (no blank line after it: a block
// of its own would be an empty event in lenient clients, see Handler),
// which the stream's first batch flushes. epoch is the single stream's
// bus epoch for its id: lines ("" for the multiplexed wire, or with
// Handler.BareIDs).
func newSSETransport(h *Handler, w http.ResponseWriter, r *http.Request, multiplexed bool, epoch string) *sseTransport {
	s := &sseTransport{
		w:           w,
		rc:          http.NewResponseController(w),
		ctx:         r.Context(),
		timeout:     h.WriteTimeout,
		http1:       r.ProtoMajor == 1,
		multiplexed: multiplexed,
		retry:       sseRetryMillis(h),
	}
	if s.timeout <= 0 {
		s.timeout = DefaultWriteTimeout
	}
	if epoch != "" {
		s.idPrefix = make([]byte, 0, len(sseIDField)+len(epoch)+1)
		s.idPrefix = append(append(append(s.idPrefix, sseIDField...), epoch...), ':')
	}
	s.appendRetry()
	return s
}

// sseRetryMillis is the retry: value of one connection of h, in
// milliseconds: Retry plus a random jitter in [0, RetryJitter].
func sseRetryMillis(h *Handler) int64 {
	retry := h.Retry
	if retry <= 0 {
		retry = DefaultRetry
	}
	jitter := h.RetryJitter
	if jitter == 0 {
		jitter = time.Duration(float64(retry) * DefaultRetryJitterRatio)
	}
	ms := retry.Milliseconds()
	if j := jitter.Milliseconds(); j > 0 {
		ms += rand.Int64N(j + 1)
	}
	return ms
}

// WriteBatch is Transport.WriteBatch: the batch's frames in the stream's
// wire, one Write and one Flush.
func (s *sseTransport) WriteBatch(b *Batch) error {
	if s.inBatch {
		// The last call panicked: what it left in the buffer is half a
		// batch, which the client must not get.
		s.buf = s.buf[:0]
	}
	s.inBatch = true
	s.reserve(b)
	n := b.Len()
	for i := range n {
		if s.multiplexed {
			s.addMux(b, i)
		} else {
			s.add(b.Frame(i))
		}
	}
	if len(s.buf) > 0 || s.pending {
		if err := s.flushBatch(); err != nil {
			s.inBatch = false
			return err
		}
		if n > 0 {
			s.tailField = false // every frame ends with a blank line
		}
	}
	s.inBatch = false
	return nil
}

// Keepalive is Transport.Keepalive: the heartbeat, flushed.
func (s *sseTransport) Keepalive() error {
	s.appendHeartbeat()
	return s.flushBatch()
}

// Interrupt is Transport.Interrupt: the write in progress, and any later
// one, fails at once (on HTTP/1.x a deadline on the connection, on HTTP/2
// a deadline in the past resets the stream).
func (s *sseTransport) Interrupt() {
	s.cut.Store(true)
	_ = s.rc.SetWriteDeadline(time.Now())
}

// finish is called once Serve has returned end: net/http's end of an
// HTTP/1.x response after a stream that ended by itself gets a deadline
// of its own (armLastChunk), and no other deadline of ours outlives the
// handler (on HTTP/2 a deadline armed on a stream the client has reset is
// a timer that nothing stops, and it keeps the stream alive for the whole
// WriteTimeout: rapid reset, issue 22).
func (s *sseTransport) finish(end StreamEnd) {
	switch end {
	case StreamEvicted, StreamClosed, StreamShutdown, StreamRevoked, StreamExpired:
		s.armLastChunk()
	}
	if !s.lastChunk {
		s.disarm()
	}
}

// appendRetry adds the connection's retry: line, without a blank line.
func (s *sseTransport) appendRetry() {
	s.buf = strconv.AppendInt(append(s.buf, "retry: "...), s.retry, 10)
	s.buf = append(s.buf, '\n')
	s.tailField = true
}

// appendHeartbeat adds the idle keep-alive: the retry: line again when
// the text since the last blank line holds no field, else a comment (see
// Handler).
func (s *sseTransport) appendHeartbeat() {
	if s.tailField {
		s.buf = append(s.buf, sseHeartbeat...)
	} else {
		s.appendRetry()
	}
}

// reserve makes room in the batch buffer for the frames add will copy,
// in one allocation: growing by doubling while a large batch is copied
// moved each byte several times and took a fifth of the handler's CPU with
// 256 clients (docs/bench/NOTES.md, item 10).
func (s *sseTransport) reserve(b *Batch) {
	need := 0
	for i := range b.Len() {
		f := b.Frame(i)
		if f.Size() < sseDirectWriteSize { // larger ones are written directly
			need += len(f.SSE())
		}
		switch {
		case s.multiplexed:
			need += len(b.Member(i).SessionMember())
			if f.ID() != 0 {
				need += s.cursorLen + 24 // a session added since: one entry more
			}
		case s.idPrefix != nil && f.ID() != 0:
			need += len(s.idPrefix) - len(sseIDField)
		}
	}
	if len(s.buf)+need <= sseMaxBatchBuffer {
		s.buf = slices.Grow(s.buf, need)
	}
}

// add adds frame f with the single stream's wire: its shared bytes, with
// idPrefix in place of "id: " for an event.
func (s *sseTransport) add(f Frame) {
	if s.err != nil {
		return
	}
	wire := f.SSE()
	prefix := s.idPrefix != nil && f.ID() != 0 // only events have an id line
	if prefix {
		wire = wire[len(sseIDField):]
	}
	big := f.Size() >= sseDirectWriteSize
	if big || len(s.buf)+len(s.idPrefix)+len(wire) > sseMaxBatchBuffer {
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

// addMux adds frame i of b with the multiplexed wire: for an event, the
// id line with the stream's cursor after it in place of the frame's own;
// then the frame's bytes up to its envelope's "{", the session member, and
// the rest of the frame.
func (s *sseTransport) addMux(b *Batch, i int) {
	f := b.Frame(i)
	wire := f.SSE()
	if s.err != nil || wire == nil {
		return
	}
	from := 0
	id := f.ID() != 0
	if id {
		from = len(sseIDField)
		for wire[from] != '\n' {
			from++
		}
		from++
	}
	open := len(wire) - 2 - len(f.JSON()) + 1 // after the envelope's "{"
	member := b.Member(i).SessionMember()
	rest := wire[open:]
	big := f.Size() >= sseDirectWriteSize
	idLen := 0
	if id {
		idLen = len(sseIDField) + s.cursorLen + 1
	}
	if big || len(s.buf)+idLen+open-from+len(member)+len(rest) > sseMaxBatchBuffer {
		s.write(nil)
	}
	if id {
		at := len(s.buf)
		s.buf = b.AppendCursor(append(s.buf, sseIDField...), i)
		s.cursorLen = len(s.buf) - at - len(sseIDField)
		s.buf = append(s.buf, '\n')
	}
	s.buf = append(s.buf, wire[from:open]...)
	s.buf = append(s.buf, member...)
	if big {
		s.write(nil)
		s.write(rest)
		return
	}
	s.buf = append(s.buf, rest...)
}

// write sends p, or the batch buffer when p is nil, under the batch's
// deadline.
func (s *sseTransport) write(p []byte) {
	if p == nil {
		p = s.buf
		s.buf = s.buf[:0]
		if cap(s.buf) > sseMaxBatchBuffer {
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

// arm sets the batch's write deadline, at the batch's first write. On
// HTTP/2 it is now+timeout, cleared after the flush (see disarm). On
// HTTP/1.x a deadline on the connection only bounds writes, so it is left
// set between batches and a batch sets a new one only when the one set is
// older than timeout/8: a write then fails between 7/8 of the timeout and
// the timeout after it starts, and a busy stream sets at most eight
// deadlines per timeout instead of two per batch (each a runtime timer
// update, 14% of the handler's CPU in a fan-out to 10,000 clients: issue
// 26). A request whose context is done gets none, and the batch fails with
// the context's error: the client has gone (or a write failed), and on
// HTTP/2 a deadline set on a stream already closed is a timer that
// nothing stops (see disarm).
func (s *sseTransport) arm() {
	if s.armed || s.err != nil {
		return
	}
	if err := s.ctx.Err(); err != nil {
		s.err = err
		return
	}
	if s.cut.Load() {
		s.err = errSSEInterrupted
		return
	}
	s.armed = true
	now := time.Now()
	if s.noDeadline || s.http1 && !s.until.IsZero() && s.until.Sub(now) >= s.timeout-s.timeout/8 {
		return
	}
	until := now.Add(s.timeout)
	switch err := s.rc.SetWriteDeadline(until); {
	case err == nil:
		s.until = until
		if s.cut.Load() {
			// Interrupt's deadline may have come before this one.
			_ = s.rc.SetWriteDeadline(time.Now())
		}
	case errors.Is(err, http.ErrNotSupported):
		s.noDeadline = true
	default:
		s.err = err
	}
}

// disarm clears the write deadline if one is set, whether or not the batch
// failed. Go's HTTP/2 server (1.26) stops a stream's deadline timer when the
// stream closes, but a deadline set after that (the client reset the stream
// while the batch was being armed) starts a new timer, which only a clear
// stops: the clear goes to the connection's serve loop after the set, in
// order, so it always finds the timer.
func (s *sseTransport) disarm() {
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
func (s *sseTransport) armLastChunk() {
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
func (s *sseTransport) flushBatch() error {
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
	return s.err
}
