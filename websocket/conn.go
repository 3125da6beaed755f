package websocket

import (
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	ws "github.com/coder/websocket"
	"github.com/ssebus/eventbus"
)

const (
	// Frames whose envelope is this large are written from their shared
	// bytes, as a fragment of the batch's message, instead of being copied
	// into the batch buffer (as the SSE transport does).
	directWriteSize = 64 << 10
	// A batch buffer larger than this is not kept between batches.
	maxKeptBuffer = 1 << 20
)

// The cursor line's text around the cursor, and before its epochs.
const (
	cursorOpen  = `{"op":"cursor","cursor":"`
	cursorClose = `"}`
	epochsOpen  = `,"epochs":{`
)

// conn is one WebSocket connection serving one Stream: the Transport
// given to Stream.Serve, the reader of the client's messages, and the
// watchdog that bounds every batch's write.
//
// Goroutines: the stream's own (started by ServeHTTP once the connection
// is upgraded) runs serve (Stream.Serve, so WriteBatch and Keepalive, then
// the close); the reader runs read; at most one runs ping; the watchdog's
// timer runs watch. Interrupt comes from any goroutine.
// coder's Conn serializes the messages and frames written by several of
// them.
type conn struct {
	h       *Handler
	st      *eventbus.Stream
	c       *ws.Conn
	raw     net.Conn // the connection coder took over, for kill
	log     *slog.Logger
	timeout time.Duration
	// flate: permessage-deflate was negotiated, and messages of at least
	// threshold bytes are compressed.
	flate     bool
	threshold int

	// ctx is Serve's and the connection's, a child of StreamContext's: the
	// reader cancels it when reading fails or it refuses a message, so the
	// stream ends (StreamGone) when the client leaves, and serve cancels
	// it once the stream is over. Neither the reader nor a ping waits on
	// it: both end when the connection is closed, which serve does before
	// it waits for them, and a context with a Done channel would cost each
	// idle read a context.AfterFunc in coder (a registration held for as
	// long as the connection is idle).
	ctx    context.Context
	cancel context.CancelFunc
	done   func()         // StreamContext's, called last by serve
	wg     sync.WaitGroup // the reader and a ping in flight

	// Owned by Serve's goroutine.
	buf       []byte
	cursorLen int                // of the last cursor written, to size a batch
	msg       io.WriteCloser     // the fragmented message being written; nil when none
	err       error              // the first write error: the connection is unusable
	inBatch   bool               // a WriteBatch has not returned (it panicked)
	seen      []*eventbus.Member // the stream's members at the last batch whose cursor moved
	announced bool               // the greeting was written
	namesDue  bool               // the batch being written names sessions the reader has not been told of

	// The watchdog: writing is the start of the write in progress, and
	// pinging the start of the ping waiting for its pong (time since base,
	// plus 1), 0 when none; the timer is armed (armed) only while a write
	// or a ping may be in progress, and fires at most once per timeout
	// whatever the number of batches and pings (see start, watch): one
	// timer per connection, none per ping.
	base    time.Time
	dog     *time.Timer
	writing atomic.Int64
	pinging atomic.Int64
	armed   atomic.Bool
	// Why the connection was killed, if it was.
	blocked     atomic.Bool // a write blocked past the timeout
	cut         atomic.Bool // Interrupt
	pongMissing atomic.Bool // a ping's pong did not come in time
	refused     atomic.Bool // the reader closed the socket for a bad message

	// The stream's sessions as the client last saw them in a cursor line,
	// for the reader's replies (see await), under mu.
	mu      sync.Mutex
	names   []string
	changed chan struct{} // closed and replaced when names changes
	greeted bool          // the greeting was written

	// The reader's. rbuf is allocated at the first message: most clients
	// send none, and an idle connection should not hold 8 KiB for them.
	rbuf   []byte
	tokens float64
	last   time.Duration
}

// newConn returns the connection of stream st, upgraded to c over raw, for
// request r; flate reports that permessage-deflate was negotiated.
func newConn(h *Handler, st *eventbus.Stream, c *ws.Conn, raw net.Conn, flate bool, ctx context.Context, cancel context.CancelFunc, done func()) *conn {
	cn := &conn{
		h: h, st: st, c: c, raw: raw, log: h.logger(), timeout: h.writeTimeout(),
		flate: flate, threshold: h.CompressionThreshold,
		ctx: ctx, cancel: cancel, done: done,
		base: time.Now(), changed: make(chan struct{}), tokens: MessageBurst,
		cursorLen: 2 + 24*st.Len(), // the greeting's: "m1", then an entry per session
	}
	cn.dog = time.AfterFunc(time.Hour, cn.watch)
	cn.dog.Stop()
	return cn
}

// serve serves the stream until it ends, closes the connection as the end
// says, and returns once the reader and any ping have ended, calling
// StreamContext's done last. It runs on a goroutine of its own, outside
// net/http's recovery: a panic past the Stream's own (which ends the
// stream with stream_error internal) closes this connection only.
func (c *conn) serve() {
	defer func() {
		// StreamContext's func is the embedder's: a panic there must
		// not take the process down either.
		defer func() {
			if p := recover(); p != nil {
				c.log.LogAttrs(c.ctx, slog.LevelError, "websocket: panic in StreamContext's func", slog.Any("panic", p))
			}
		}()
		c.done()
	}()
	defer func() {
		if p := recover(); p != nil {
			c.log.LogAttrs(c.ctx, slog.LevelError, "websocket: panic serving a stream", slog.Any("panic", p))
			_ = c.c.CloseNow()
			c.cancel()
			c.wg.Wait()
			c.dog.Stop()
		}
	}()
	c.wg.Add(1)
	go c.read()
	end := c.st.Serve(c.ctx, c)
	c.finish(end)
	c.cancel()
	c.wg.Wait()
	c.dog.Stop()
	_ = c.c.CloseNow() // releases coder's state; a no-op after Close
}

// finish closes the connection after the stream ended with end: with the
// end's close code when the stream ended by itself and the connection
// still works, else without a close frame.
func (c *conn) finish(end eventbus.StreamEnd) {
	if c.refused.Load() {
		return // the reader is closing it with the code of the bad message
	}
	switch {
	case c.blocked.Load():
		c.log.LogAttrs(c.ctx, slog.LevelDebug, "websocket: a write blocked past the write timeout, closed", slog.Duration("timeout", c.timeout))
	case c.pongMissing.Load():
		c.log.LogAttrs(c.ctx, slog.LevelDebug, "websocket: no pong within the write timeout, closed", slog.Duration("timeout", c.timeout))
	}
	code, reason, ok := closeCode(end)
	if !ok || c.err != nil || c.blocked.Load() || c.cut.Load() || c.pongMissing.Load() {
		_ = c.c.CloseNow()
		return
	}
	// The close handshake (coder writes the close frame, then waits up to
	// 5 s for the client's) is bounded by the write timeout too.
	c.begin()
	_ = c.c.Close(code, reason)
	c.end()
}

// WriteBatch is eventbus.Transport's: the batch as one text message, each
// frame a line (the multiplexed envelope: the frame's JSON with the
// session member spliced after its "{"), then the cursor line when the
// cursor moved. The message is written with one Write of the batch
// buffer; a frame of directWriteSize or more goes out from its shared
// bytes as a fragment of its own, unless the message is compressed.
func (c *conn) WriteBatch(b *eventbus.Batch) error {
	if c.inBatch && c.msg != nil && c.err == nil {
		// The last call panicked halfway through a fragmented message,
		// whose writer still holds coder's message lock: no other message
		// can follow it on this connection.
		c.err = errInterrupted
		c.kill()
	}
	if c.err != nil {
		return c.err
	}
	if c.cut.Load() {
		return errInterrupted
	}
	c.inBatch = true
	c.begin()
	err := c.writeBatch(b)
	c.end()
	c.inBatch = false
	if err != nil {
		return c.fail(err)
	}
	if c.namesDue {
		c.noteSessions()
	}
	return nil
}

// writeBatch writes b's message.
func (c *conn) writeBatch(b *eventbus.Batch) error {
	n := b.Len()
	moved := b.CursorMoved()
	// One allocation at most for the buffer: growing it by doubling while
	// a large batch is copied moves each byte several times.
	total, direct := 0, 0
	for i := range n {
		size := len(b.Frame(i).JSON())
		total += size + len(b.Member(i).SessionMember()) + 1
		if size >= directWriteSize {
			direct += size
		}
	}
	changed := false
	if moved {
		total += len(cursorOpen) + c.cursorLen + 24 + len(cursorClose) // 24: a session added since
		if changed = c.sessionsChanged(); changed {
			total += len(epochsOpen) + 1
			for i := range c.st.Len() {
				total += len(c.st.Member(i).SessionMember()) + 36
			}
		}
	}
	c.namesDue = changed
	// A compressed message is one frame, made of every byte by the
	// compressor, so the shared bytes are copied into the buffer then.
	whole := c.flate && total >= c.threshold
	if whole {
		direct = 0
	}
	buf := slices.Grow(c.buf[:0], total-direct)
	lines := 0
	for i := range n {
		js := b.Frame(i).JSON()
		if len(js) == 0 {
			continue
		}
		if lines > 0 {
			buf = append(buf, '\n')
		}
		lines++
		buf = append(buf, js[0])
		buf = append(buf, b.Member(i).SessionMember()...)
		if !whole && len(js) >= directWriteSize {
			if err := c.fragment(buf); err != nil {
				return err
			}
			buf = buf[:0]
			if err := c.fragment(js[1:]); err != nil {
				return err
			}
			continue
		}
		buf = append(buf, js[1:]...)
	}
	if moved {
		if lines > 0 {
			buf = append(buf, '\n')
		}
		at := len(buf) + len(cursorOpen)
		buf = b.AppendCursor(append(buf, cursorOpen...), n-1)
		c.cursorLen = len(buf) - at
		buf = append(buf, '"')
		if changed {
			buf = c.appendEpochs(buf)
		}
		buf = append(buf, '}')
	}
	var err error
	switch {
	case c.msg != nil:
		if len(buf) > 0 {
			err = c.fragment(buf)
		}
		if err == nil {
			err = c.msg.Close()
			c.msg = nil
		}
	case len(buf) > 0:
		err = c.c.Write(background, ws.MessageText, buf)
	}
	if cap(buf) <= maxKeptBuffer {
		c.buf = buf[:0]
	} else {
		c.buf = nil
	}
	return err
}

// fragment writes p as the next fragment of the batch's message, starting
// the message at the first one.
func (c *conn) fragment(p []byte) error {
	if c.msg == nil {
		w, err := c.c.Writer(background, ws.MessageText)
		if err != nil {
			return err
		}
		c.msg = w
	}
	_, err := c.msg.Write(p)
	return err
}

// fail records the first write error and returns the error the stream
// gets: one that wraps os.ErrDeadlineExceeded when the watchdog cut a
// blocked write (the stream counts the batch blocked, whether or not the
// reader saw the end first), errInterrupted after Interrupt. Another
// failure is the client gone (a reset): Serve's context is cancelled
// first, so the stream counts its subscriptions cancelled, as net/http
// does for the SSE routes.
func (c *conn) fail(err error) error {
	switch {
	case c.blocked.Load():
		err = errWriteBlocked
	case c.cut.Load():
		err = errInterrupted
	case c.pongMissing.Load():
		err = errPongMissing
	default:
		c.cancel()
	}
	if c.err == nil {
		c.err = err
	}
	return err
}

// sessionsChanged reports whether the stream's sessions are not those of
// the last cursor line written (or none was): a comparison of pointers per
// session.
func (c *conn) sessionsChanged() bool {
	n := c.st.Len()
	if !c.announced || n != len(c.seen) {
		return true
	}
	for i := range n {
		if c.st.Member(i) != c.seen[i] {
			return true
		}
	}
	return false
}

// appendEpochs appends the cursor line's "epochs" member: every session's
// epoch by id (SPEC 6.10), the ids as the envelopes quote them.
func (c *conn) appendEpochs(buf []byte) []byte {
	buf = append(buf, epochsOpen...)
	for i := range c.st.Len() {
		m := c.st.Member(i)
		if i > 0 {
			buf = append(buf, ',')
		}
		sm := m.SessionMember() // "session":"<id>",
		buf = append(buf, sm[len(`"session":`):len(sm)-1]...)
		buf = append(append(append(buf, `:"`...), m.Epoch()...), '"')
	}
	return append(buf, '}')
}

// noteSessions publishes the stream's sessions, as the cursor line just
// written names them (writeBatch found them changed: namesDue), for the
// reader's replies.
func (c *conn) noteSessions() {
	c.namesDue = false
	n := c.st.Len()
	c.announced = true
	c.seen = c.seen[:0]
	names := make([]string, n)
	for i := range n {
		m := c.st.Member(i)
		c.seen = append(c.seen, m)
		names[i] = m.Session()
	}
	c.mu.Lock()
	c.names, c.greeted = names, true
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// await waits until the client has been sent the greeting and a cursor
// line whose sessions satisfy cond, and reports whether it was; false when
// the connection ended first.
func (c *conn) await(cond func(names []string) bool) bool {
	for {
		c.mu.Lock()
		ok := c.greeted && cond(c.names)
		ch := c.changed
		c.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-c.ctx.Done():
			return false
		}
	}
}

// Keepalive is eventbus.Transport's: a ping, unless one is in flight,
// whose pong must come within the write timeout, else the connection is
// killed. It returns at once: a goroutine of the connection waits for the
// pong, so the stream's next batch does not wait a round trip. It fails
// once a pong was missed.
func (c *conn) Keepalive() error {
	if c.pongMissing.Load() {
		return errPongMissing
	}
	if c.cut.Load() {
		return errInterrupted
	}
	if c.pinging.Load() == 0 {
		// Marked here, on Serve's goroutine, so that the next Keepalive
		// sees the ping in flight; the ping's goroutine clears it.
		c.start(&c.pinging)
		c.wg.Add(1)
		go c.ping()
	}
	return nil
}

// ping sends a ping and waits for its pong, for Keepalive. The watchdog
// kills the connection when the pong is a timeout late; Ping returns
// then, as when serve closes the connection, so it needs no context of
// its own.
func (c *conn) ping() {
	defer c.wg.Done()
	_ = c.c.Ping(background)
	c.pinging.Store(0)
}

// Interrupt is eventbus.Transport's: the write in progress, and every
// later one, fails at once. It never blocks.
func (c *conn) Interrupt() {
	c.cut.Store(true)
	c.kill()
}

// kill makes every read and write of the connection fail at once, without
// a close frame, and without blocking: a deadline in the past on the
// connection coder took over (closing a TLS connection would first try to
// write its close alert). serve closes it for good.
func (c *conn) kill() {
	_ = c.raw.SetDeadline(time.Unix(1, 0))
}

// begin marks a write in progress for the watchdog.
func (c *conn) begin() { c.start(&c.writing) }

// start marks a write (writing) or a ping (pinging) in progress for the
// watchdog, arming its timer if it is not armed: a busy stream re-arms it
// about once per timeout, not twice per batch.
func (c *conn) start(p *atomic.Int64) {
	p.Store(int64(time.Since(c.base)) + 1)
	if c.armed.CompareAndSwap(false, true) {
		c.dog.Reset(c.timeout)
	}
}

// end marks the write done.
func (c *conn) end() { c.writing.Store(0) }

// watch is the watchdog's timer: it kills the connection when the write in
// progress, or the ping waiting for its pong, started a timeout ago or
// more, re-arms itself for the rest of the timeout of the earliest that
// started later, and stays unarmed when none is in progress (start arms it
// again). armed is cleared before writing and pinging are read, so a write
// or a ping that starts meanwhile either is seen here or arms the timer
// itself.
func (c *conn) watch() {
	c.armed.Store(false)
	now := time.Since(c.base)
	var rest time.Duration // until the earliest in progress is late; 0: none
	for _, p := range [...]*atomic.Int64{&c.writing, &c.pinging} {
		start := p.Load()
		if start == 0 {
			continue
		}
		elapsed := now - time.Duration(start-1)
		if elapsed < c.timeout {
			if left := c.timeout - elapsed; rest == 0 || left < rest {
				rest = left
			}
			continue
		}
		// Logged by finish, on the stream's goroutine: this one runs
		// the embedder's logger outside any recover.
		if p == &c.writing {
			c.blocked.Store(true)
		} else {
			c.pongMissing.Store(true)
		}
		c.kill()
		return
	}
	if rest > 0 && c.armed.CompareAndSwap(false, true) {
		c.dog.Reset(rest)
	}
}
