package eventbus

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ssebus/eventbus/internal/muxcursor"
)

// A Stream is one client connection's subscriptions to one or more
// sessions, and the loop that serves them through a Transport: the one
// stream engine of the package. A single-session SSE stream (Handler) is
// a Stream of one member written with the single stream's wire; a
// multiplexed SSE stream (MuxHandler) and a WebSocket
// (github.com/ssebus/eventbus/websocket) are Streams of up to
// MaxStreamSessions members written with the multiplexed wire. Every rule
// of docs/SPEC.md about a served stream (batches, backpressure, the frames
// that end a session or the stream, revocation, lifetime, heartbeats, the
// cursor) is the Stream's, whatever the transport.
//
// MuxHandler.OpenStream makes one, for a transport of its own; Serve runs
// it; Add and Remove change its sessions while it runs. One goroutine, the
// one calling Serve, serves every session of a Stream: it waits on one
// ReadyGroup and takes from the sessions that are ready; the Stream starts
// no goroutine. A Stream that is not served must be closed (Close).
//
// Locks and owners. Stream.mu (the sessions being added or removed), the
// registry's lock (Revoke's) and a ReadyGroup's lock (joining, leaving)
// are leaves: each is held alone, never while another lock is taken, user
// code (Lookup, Authorize) runs or a bus is called. A bus's lock comes
// before its subscriptions' queue locks (a push under the bus's lock takes
// a queue's, SPEC 4); the stream takes them only inside Subscribe,
// TakeReady, MarkWritten and Close, and holds no lock while it writes.
// The serve loop's state (the members, the batch, the cursor, the timers)
// is owned by Serve's goroutine and guarded by no lock: nothing else
// touches it once Serve has started (before that, the goroutine that
// opened the stream owns it). The atomic cut and tp are what other
// goroutines (a Hub's budget, through interrupt) read.
type Stream struct {
	h           *Handler
	r           *http.Request // for Add's Lookup and Authorize
	multiplexed bool
	types       []string // ?types=, for Add
	maxQueued   int      // ?maxQueued=, for Add
	maxSessions int

	// Owned by the goroutine that opened the stream, then by Serve's.
	order  []*Member     // the stream's sessions, in the cursor's order
	slots  []*Member     // by ReadyGroup member number
	group  *ReadyGroup   // nil for a stream of one member that never changes
	ls     *liveStream   // its registry entry; nil without Authorize
	ends   streamEnds    // the lifetime and revocation channels
	end    endCause      // how the stream ends by itself, once known
	timer  *time.Timer   // the first Grant's Expires; nil without one
	expiry *Member       // the member whose Grant expires first
	active int           // members that have not left
	cursor []byte        // muxcursor.Prefix and every member's entry
	idle   time.Duration // Handler.Heartbeat
	beat   *time.Timer
	// born is when Serve started; wrote, when the last batch or keepalive
	// was written, since born. time.Since(born) reads the monotonic clock
	// alone, where time.Now reads the wall clock too: the stamp per batch
	// costs 30 ns instead of 51 (docs/bench/NOTES.md, item 21).
	born   time.Time
	wrote  time.Duration
	ctx    context.Context
	t      Transport
	shut   bool // a terminal frame was stream_error shutdown
	served bool
	closed bool
	// The batch being taken and written.
	batch   Batch
	frames  []Frame
	owners  []*Member
	woken   []int
	ending  []*Member
	current *Member // the member whose frame is being handled, for a panic's frame
	start   int     // the member the next batch takes from first

	// Read by Interrupt, from any goroutine.
	cut atomic.Bool
	tp  atomic.Pointer[Transport]

	// The sessions Add and Remove change, from any goroutine.
	wake    chan struct{} // nil when the stream's sessions never change
	mu      sync.Mutex
	names   []string // the sessions in the stream or being added, under mu
	holding int      // ReadyGroup places held: members, adds, removes not yet done, under mu
	adds    []*Member
	removes []string
}

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

// newMember returns the member of session on bus, with its JSON member
// and its cursor entry at id.
func newMember(session string, bus *EventBus) *Member {
	return &Member{session: session, bus: bus, json: sessionMember(session),
		entry: muxcursor.Entry{Session: muxcursor.SessionTag(session), Epoch: muxcursor.EpochTag(bus.Epoch())}}
}

// interrupt is every member's SubscribeOptions.Interrupt: a Hub's budget
// took back what a subscription held, and the batch in flight must be let
// go. The stream ends at its next write.
func (st *Stream) interrupt() {
	st.cut.Store(true)
	if t := st.tp.Load(); t != nil {
		(*t).Interrupt()
	}
}

// errInterrupted is the error of a batch whose stream was interrupted.
var errInterrupted = errors.New("eventbus: the stream's subscription was shed by its hub's memory budget")

// Serve serves the stream through t on the calling goroutine until it
// ends, and returns why. ctx is the client's: once it is done the stream
// ends without writing more (StreamGone); an SSE route passes the
// request's context, a transport that hijacks its connection one it
// cancels when the connection's reader fails. Serve writes the first
// batch at once (see Transport.WriteBatch), then every batch its
// sessions' subscriptions make ready, a keepalive when idle, and the frame
// that ends the stream when it ends by itself. When Serve returns every
// subscription of the stream has ended and its registry entry is gone;
// the connection is the caller's to close. Serve is called once; a second
// call, or one after Close, returns StreamGone at once.
func (st *Stream) Serve(ctx context.Context, t Transport) (end StreamEnd) {
	if st.served || st.closed {
		return StreamGone
	}
	st.served = true
	st.ctx, st.t = ctx, t
	st.tp.Store(&t)
	if st.cut.Load() {
		t.Interrupt() // the budget came before the transport
	}
	defer st.Close()
	defer func() {
		// A bug must not take the daemon down with a half-written stream:
		// tell the client, log it, and end this stream only.
		if p := recover(); p != nil {
			st.panicked(p)
			end = StreamPanicked
		}
	}()
	st.born = time.Now()
	st.batch = Batch{st: st, moved: true}
	if err := st.write(); err != nil {
		st.dropAll(err)
		return StreamFailed
	}
	st.beat = time.NewTimer(st.idle)
	return st.serve()
}

// serve is the stream loop: write what is ready as one batch, else wait
// for frames, the heartbeat, the end of the stream's lifetime, a
// revocation, a change of its sessions or the client going away. Its frame
// is small on purpose: the work of a batch is in take, whose frame is gone
// while the loop waits (the goroutine's stack shrinks back, issue 26).
func (st *Stream) serve() StreamEnd {
	var ready <-chan struct{}
	if st.group != nil {
		ready = st.group.Ready()
	} else {
		ready = st.order[0].sub.Ready()
	}
	for {
		more, end := st.take()
		if end != 0 {
			return end
		}
		if more {
			continue // more may have arrived while writing
		}
		select {
		case <-ready:
		case <-st.wake:
		case <-st.beat.C:
			if quiet := time.Since(st.born) - st.wrote; quiet < st.idle {
				// Written meanwhile: the timer is not reset per batch.
				st.beat.Reset(st.idle - quiet)
				continue
			}
			if err := st.t.Keepalive(); err != nil {
				st.dropAll(err)
				return StreamFailed
			}
			st.wrote = time.Since(st.born)
			st.beat.Reset(st.idle)
		case <-st.ends.lifetime:
			st.end = endLifetime
		case <-st.ends.revoked:
			st.end = endRevoked
		case <-st.ctx.Done():
			return StreamGone // Close cancels without drain
		}
	}
}

// maxTakeBytes bounds the envelopes one batch takes from a stream's
// sessions (each TakeReady takes at most 256 KiB, and at least one frame):
// a stream blocked in a write holds at most about that much outside its
// sessions' caps, whatever the number of sessions.
const maxTakeBytes = 256 << 10

// take takes from every session that may have frames and writes what it
// took as one batch, with the frames of the sessions that left and the one
// that ends the stream when it ends by itself. more reports that frames
// were taken (there may be more); end is why the stream is over, 0 while
// it is not.
//
//go:noinline
func (st *Stream) take() (more bool, end StreamEnd) {
	b := &st.batch
	*b = Batch{st: st}
	if st.wake != nil {
		b.moved = st.apply()
	}
	if st.group != nil {
		st.woken = st.group.Woken(st.woken[:0])
		for _, i := range st.woken {
			// A member an Add joined after apply ran is past slots:
			// the next apply takes it in with todo set.
			if i < len(st.slots) && st.slots[i] != nil {
				st.slots[i].todo = true
			}
		}
	} else {
		st.order[0].todo = true // its own Ready: take before every wait
	}
	frames, owners, ending := st.frames[:0], st.owners[:0], st.ending[:0]
	// The sessions a bounded batch did not reach keep todo, and the next
	// batch starts with the first of them, so that no session waits
	// behind the others for long.
	taken := 0
	first := st.start
	st.start = 0
	n := len(st.order)
	for k := range n {
		i := (first + k) % n
		m := st.order[i]
		if !m.todo || m.left {
			continue
		}
		if taken >= maxTakeBytes {
			st.start, more = i, true
			break
		}
		from := len(frames)
		var open bool
		frames, open = m.sub.TakeReady(frames)
		for _, f := range frames[from:] {
			taken += f.Size()
			owners = append(owners, m)
		}
		m.pending += len(frames) - from
		// A take with frames leaves the queue not waiting: it signals
		// nothing until a take finds it empty, so it is taken from again
		// before the loop waits.
		m.todo = len(frames) > from
		more = more || m.todo
		if !open {
			m.left, m.todo = true, false
			ending = append(ending, m)
			st.active--
		}
	}
	if st.end == endNone {
		// After the takes: a batch taken after Revoke returned is never
		// written.
		st.end = st.ends.poll()
	}
	if st.end == endRevoked {
		// Access is gone: what was queued is not written. The client's
		// cursor stays before it, so nothing is lost should it get access
		// again.
		for _, m := range st.order {
			m.sub.MarkDiscarded(m.pending)
			m.pending = 0
		}
		clear(frames)
		frames, owners, ending = frames[:0], owners[:0], ending[:0]
	}
	evicted := false
	for k, f := range frames {
		m := owners[k]
		m.before = m.entry.ID
		if f.ID() != 0 {
			b.moved = true
		} else if f.Terminal() {
			m.terminal = true
			evicted = evicted || f.Type() == TypeClientEvicted
			st.shut = st.shut || isShutdownFrame(f)
		}
	}
	gone := st.ctx.Err() != nil
	if !gone {
		for _, m := range ending {
			if m.terminal {
				continue
			}
			// Its bus closed without a terminal frame of its own: tell
			// the client this session leaves (or why it failed).
			if f, ok := endFrame(m.bus, m.sub); ok {
				frames, owners = appendFrame(frames, owners, f, m)
			}
		}
	}
	switch {
	case st.end == endRevoked:
		if m := st.revokedMember(); m != nil && !gone {
			frames, owners = appendFrame(frames, owners, m.bus.StreamErrorFrame(revokedMessage, ErrorKindRevoked), m)
		}
		end = StreamRevoked
	case st.end == endLifetime && st.active > 0 && !evicted:
		// After what was queued: the client resumes after its cursor.
		if m := st.expiringMember(); m != nil {
			frames, owners = appendFrame(frames, owners, m.bus.StreamErrorFrame(lifetimeEndedMessage, ErrorKindReauthenticate), m)
		}
		end = StreamExpired
	}
	b.frames, b.owners = frames, owners
	if len(frames) > 0 || b.moved {
		if err := st.write(); err != nil {
			st.dropAll(err)
			return false, StreamFailed
		}
	}
	for k, f := range frames {
		if id := f.ID(); id != 0 {
			owners[k].entry.ID = id
		}
	}
	// Delivered only once written: the frames of a failed batch are counted
	// as dropped (blocked) instead, never as both.
	for _, m := range owners {
		if m.pending > 0 {
			m.sub.MarkWritten(m.pending)
			m.pending = 0
		}
	}
	clear(frames) // do not pin delivered frames while idle
	st.frames, st.owners, st.ending = frames[:0], owners[:0], ending[:0]
	b.frames, b.owners = nil, nil
	switch {
	case end != 0:
	case evicted:
		end = StreamEvicted
	case st.active == 0 && len(ending) > 0:
		end = StreamClosed
		if st.shut {
			end = StreamShutdown
		}
	case st.end == endLifetime:
		end = StreamExpired // no session left to name
	}
	return more && end == 0, end
}

// appendFrame adds synthetic frame f of member m to a batch being made.
func appendFrame(frames []Frame, owners []*Member, f Frame, m *Member) ([]Frame, []*Member) {
	m.before = m.entry.ID
	return append(frames, f), append(owners, m)
}

// write hands the batch to the transport, under the cut check: a stream
// interrupted by its hub's budget writes nothing more.
func (st *Stream) write() error {
	if st.cut.Load() {
		return errInterrupted
	}
	if len(st.batch.frames) > 0 {
		st.current = st.batch.owners[0]
	}
	err := st.t.WriteBatch(&st.batch)
	st.wrote = time.Since(st.born)
	return err
}

// isShutdownFrame reports whether terminal frame f is stream_error
// shutdown.
func isShutdownFrame(f Frame) bool {
	return f.Type() == TypeStreamError && bytes.Contains(f.JSON(), []byte(`"errorKind":"`+ErrorKindShutdown+`"`))
}

// revokedMember is the member a revocation's frame names: the first whose
// Grant named the revoked subject, else the first; nil when the stream has
// none.
func (st *Stream) revokedMember() *Member {
	if st.ls != nil && st.ls.by != "" {
		for _, m := range st.order {
			if m.subject == st.ls.by {
				return m
			}
		}
	}
	if len(st.order) > 0 {
		return st.order[0]
	}
	return nil
}

// expiringMember is the member a lifetime's end names: the one whose Grant
// expires first, else the first.
func (st *Stream) expiringMember() *Member {
	if st.expiry != nil && !st.expiry.left {
		return st.expiry
	}
	for _, m := range st.order {
		if !m.left {
			return m
		}
	}
	return nil
}

// dropAll ends every subscription after a write failed or blocked: the
// frames of each session in the failed batch are counted as blocked.
func (st *Stream) dropAll(err error) {
	for _, m := range st.order {
		if !m.left || m.pending > 0 {
			dropWriteFailed(st.ctx, m.sub, m.pending, err)
			m.pending = 0
		}
	}
}

// dropWriteFailed ends sub, of which unwritten frames taken were in the
// batches that failed with err.
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

// panicked tells the client and the log that the stream loop panicked with
// p: one batch, stream_error internal naming the member whose frame was
// being handled, in place of the half-written one.
func (st *Stream) panicked(p any) {
	st.h.logger().LogAttrs(st.ctx, slog.LevelError, "eventbus: stream panicked", slog.Any("panic", p))
	m := st.current
	if m == nil && len(st.order) > 0 {
		m = st.order[0]
	}
	if m == nil || st.t == nil {
		return
	}
	defer func() { _ = recover() }() // the transport may panic again
	st.batch = Batch{st: st, frames: []Frame{m.bus.StreamErrorFrame("internal error", ErrorKindInternal)}, owners: []*Member{m}}
	_ = st.t.WriteBatch(&st.batch)
}

// Close ends the stream's subscriptions and releases what opening it took,
// without writing anything: for a stream that will not be served (its
// transport failed to start), and what Serve does when it returns. It is
// idempotent. Call it from the goroutine that opened the stream, or the
// one running Serve.
func (st *Stream) Close() {
	if st.closed {
		return
	}
	st.mu.Lock() // Add reads closed under it
	st.closed = true
	adds := st.adds
	st.adds = nil
	st.mu.Unlock()
	if st.timer != nil {
		st.timer.Stop()
	}
	if st.beat != nil {
		st.beat.Stop()
	}
	for _, m := range st.order {
		if m.sub != nil {
			m.sub.Close()
		}
	}
	for _, m := range adds { // subscribed by Add, never taken in by the loop
		m.sub.Close()
	}
	if st.ls != nil {
		st.h.reg.remove(st.ls)
	}
	clear(st.batch.frames)
}

// Len returns the number of sessions in the stream. Call it before Serve,
// or from the transport's WriteBatch.
func (st *Stream) Len() int { return len(st.order) }

// Member returns the stream's session i, 0 <= i < Len(), in the cursor's
// order. Call it before Serve, or from the transport's WriteBatch.
func (st *Stream) Member(i int) *Member { return st.order[i] }

// AppendCursor appends the stream's composite cursor to dst: every
// session's entry at the last event delivered to it (see
// Batch.AppendCursor). Call it before Serve, or from the transport's
// WriteBatch (where it is the cursor after the frames AppendCursor of the
// batch was last asked about).
func (st *Stream) AppendCursor(dst []byte) []byte { return st.appendCursor(dst) }

// appendCursor puts every member's entry whose id changed into the
// cursor's text, and appends the text to dst.
func (st *Stream) appendCursor(dst []byte) []byte {
	for _, m := range st.order {
		if m.put != m.entry.ID {
			m.put = m.entry.ID
			muxcursor.Put(st.cursor[m.at:], m.entry)
		}
	}
	return append(dst, st.cursor...)
}

// layCursor lays out the cursor's text with every member's entry, in
// order.
func (st *Stream) layCursor() {
	st.cursor = append(st.cursor[:0], muxcursor.Prefix...)
	for _, m := range st.order {
		m.at = len(st.cursor)
		st.cursor = append(st.cursor, make([]byte, muxcursor.EntryLen)...)
		m.put = m.entry.ID
		muxcursor.Put(st.cursor[m.at:], m.entry)
	}
}

// setLifetime starts the lifetime timer at the earliest Expires of the
// members' Grants, or moves it earlier for a member added with an earlier
// one.
func (st *Stream) setLifetime(m *Member) {
	if m.expires == 0 || (st.expiry != nil && !st.expiry.left && st.expiry.expires <= m.expires) {
		return
	}
	st.expiry = m
	d := time.Until(time.Unix(0, m.expires))
	if st.timer == nil {
		st.timer = time.NewTimer(d)
		st.ends.lifetime = st.timer.C
		return
	}
	st.timer.Reset(d)
}

// streamError is a refusal of Add or Remove, as the route would answer it.
func streamError(status int, code, msg string) *StatusError {
	return &StatusError{Status: status, Code: code, Message: msg}
}

// Add adds session to the stream while it is served (a WebSocket client's
// request), as the multiplexed route would have served it from the start:
// the Handler's Lookup (its refusals as they would answer the route),
// Authorize with the stream's request (a Grant's subject joins the
// stream's for Revoke, its lifetime may end the stream earlier), the
// subscriber limit, the stream's ?types= and ?maxQueued=. cursor is where
// the session resumes, read as the multiplexed route reads its
// Last-Event-ID: a composite cursor (the session's entry, if it has one;
// an entry of another epoch is epoch_reset), "0" (from the start of its
// ring), "" (live), anything else cursor_invalid then live.
//
// Add may be called from any goroutine but Serve's, before Serve or while
// it runs; it blocks while Lookup and Authorize run, and returns once the
// session is subscribed: its frames (the replay, replay_complete, then
// live) follow in the stream's next batches, and the cursor names it from
// the next batch on. A refusal is a *StatusError, with the status and code
// the route would answer (400 invalid_sessions for a session the stream
// has or one more than MaxStreamSessions, 404 session_not_found, 401/403
// from Authorize, 429 subscriber_limit_exceeded), and changes nothing. A
// stream whose sessions never change (an SSE route's) refuses every Add
// with 405 method_not_allowed; one that has ended, 410 stream_ended.
func (st *Stream) Add(session, cursor string) error {
	if st.wake == nil {
		return streamError(http.StatusMethodNotAllowed, "method_not_allowed", "this stream's sessions cannot change")
	}
	if err := CheckSessionID(session); err != nil {
		return streamError(http.StatusBadRequest, "invalid_session_id", err.Error())
	}
	st.mu.Lock()
	switch {
	case st.closed:
		st.mu.Unlock()
		return streamError(http.StatusGone, "stream_ended", "the stream has ended")
	case slices.Contains(st.names, session):
		st.mu.Unlock()
		return streamError(http.StatusBadRequest, "invalid_sessions", "session "+quoteHead(session, 64)+" is in the stream already")
	case len(st.names) >= st.maxSessions:
		st.mu.Unlock()
		return streamError(http.StatusBadRequest, "invalid_sessions", "the stream has "+strconv.Itoa(st.maxSessions)+" sessions, its most")
	case st.holding >= st.group.size:
		// Removes the loop has not done yet (it is blocked in a write)
		// still hold their places in the group.
		st.mu.Unlock()
		return streamError(http.StatusTooManyRequests, "too_many_changes", "too many changes pending; try again once the stream has caught up")
	}
	st.names = append(st.names, session)
	st.holding++
	st.mu.Unlock()
	m, err := st.subscribeMember(session, cursor)
	st.mu.Lock()
	if err == nil && st.closed {
		// Ended meanwhile: Close has taken the adds already.
		m.sub.Close()
		err = streamError(http.StatusGone, "stream_ended", "the stream has ended")
	}
	if err != nil {
		st.names = slices.DeleteFunc(st.names, func(s string) bool { return s == session })
		st.holding--
		st.mu.Unlock()
		return err
	}
	st.adds = append(st.adds, m)
	st.mu.Unlock()
	st.signal()
	return nil
}

// subscribeMember looks session up, authorizes it for the stream's
// request and subscribes it as cursor says, for Add.
func (st *Stream) subscribeMember(session, cursor string) (*Member, error) {
	h, r := st.h, st.r
	var bus *EventBus
	var err error
	if h.Lookup != nil {
		bus, err = h.Lookup(r, session)
	}
	if se := h.lookupRefusal(r, bus, err, session); se != nil {
		return nil, se
	}
	m := newMember(session, bus)
	if h.Authorize != nil {
		// Filed as pending while Authorize runs, so that a Revoke of the
		// subject meanwhile is not missed (see Revoke).
		h.reg.extendBegin(st.ls)
		grant, err := h.Authorize(r, session, bus)
		se := h.authorizeRefusal(r, grant, err, session)
		if se == nil && !h.reg.extendCommit(st.ls, grant.Subject) {
			se = streamError(http.StatusForbidden, "revoked", "access to the session was revoked while it was being added")
		} else if se != nil {
			h.reg.extendCommit(st.ls, "")
		}
		if se != nil {
			return nil, se
		}
		m.subject = grant.Subject
		if !grant.Expires.IsZero() {
			m.expires = grant.Expires.UnixNano()
		}
	}
	c, unusable, fromStart := parseMuxCursor(r, h, cursor)
	st.mu.Lock()
	others := slices.Clone(st.names)
	st.mu.Unlock()
	e, how := entryFor(c, m.session, others)
	opts := st.memberOptions(m, c != nil || unusable, unusable, fromStart, e, how)
	opts.Group, opts.Interrupt = st.group, st.interrupt
	sub, err := subscribeRequest(r, bus, opts)
	if err != nil {
		// Its subject stays filed for Revoke (another member may share
		// it): a Revoke of it then ends this stream too, which is safe.
		var limit *SubscriberLimitError
		if errors.As(err, &limit) {
			return nil, &StatusError{Status: http.StatusTooManyRequests, Code: "subscriber_limit_exceeded", Message: "subscriber limit exceeded", RetryAfter: 5 * time.Second}
		}
		return nil, streamError(http.StatusInternalServerError, "internal", err.Error())
	}
	m.sub = sub
	m.slot = sub.q.member
	return m, nil
}

// Remove takes session out of the stream while it is served (a WebSocket
// client's request): from the next batch on no frame of it is written and
// the cursor no longer names it; its subscription ends (what it had queued
// is dropped, counted as cancelled). Remove may be called from any
// goroutine but Serve's and never blocks. A session the stream does not
// have is a *StatusError 404 session_not_in_stream; a stream whose
// sessions never change refuses with 405 method_not_allowed.
func (st *Stream) Remove(session string) error {
	if st.wake == nil {
		return streamError(http.StatusMethodNotAllowed, "method_not_allowed", "this stream's sessions cannot change")
	}
	st.mu.Lock()
	i := slices.Index(st.names, session)
	if i < 0 || st.closed {
		st.mu.Unlock()
		return streamError(http.StatusNotFound, "session_not_in_stream", "session "+quoteHead(session, 64)+" is not in the stream")
	}
	st.names = slices.Delete(st.names, i, i+1)
	st.removes = append(st.removes, session)
	st.mu.Unlock()
	st.signal()
	return nil
}

// signal wakes the serve loop to apply the changes Add and Remove made; a
// wake-up already pending covers this one.
func (st *Stream) signal() {
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// apply takes in the sessions Add subscribed and takes out those Remove
// named, on Serve's goroutine, and reports whether the stream's sessions
// changed.
func (st *Stream) apply() bool {
	st.mu.Lock()
	adds, removes := st.adds, st.removes
	st.adds, st.removes = nil, nil
	st.mu.Unlock()
	if len(adds) == 0 && len(removes) == 0 {
		return false
	}
	changed := false
	for _, m := range adds {
		st.order = append(st.order, m)
		if m.slot >= len(st.slots) {
			st.slots = append(st.slots, make([]*Member, m.slot+1-len(st.slots))...)
		}
		st.slots[m.slot] = m
		m.todo = true
		st.active++
		st.setLifetime(m)
		changed = true
	}
	freed := 0
	for _, session := range removes {
		i := slices.IndexFunc(st.order, func(m *Member) bool { return m.session == session })
		if i < 0 {
			// Added and removed before the loop saw either: the add's
			// member is in adds above, so this cannot happen; kept safe.
			continue
		}
		m := st.order[i]
		st.order = slices.Delete(st.order, i, i+1)
		if !m.left {
			st.active--
		}
		m.left = true
		m.sub.Close()
		st.group.leave(m.sub)
		st.slots[m.slot] = nil
		if st.ls != nil {
			st.h.reg.drop(st.ls, m.subject)
		}
		if st.expiry == m {
			st.expiry = nil
			st.resetLifetime()
		}
		freed++
		changed = true
	}
	if freed > 0 {
		st.mu.Lock()
		st.holding -= freed
		st.mu.Unlock()
	}
	if st.start >= len(st.order) {
		st.start = 0
	}
	st.layCursor()
	return changed
}

// resetLifetime sets the lifetime timer at the earliest Expires of the
// members left, or stops it when none has one.
func (st *Stream) resetLifetime() {
	for _, m := range st.order {
		st.setLifetime(m)
	}
	if st.expiry == nil && st.timer != nil {
		st.timer.Stop()
	}
}

// endFrame is the frame that says a session leaves a stream because its
// subscription ended without a terminal frame of its own: stream_error
// internal for a failure (any error but an eviction or a close); stream_error
// closed when the bus was closed by a plain Close (a Hub's Delete, a
// backplane releasing a session deleted on its replica: Err is nil), the
// session is gone (docs/SPEC.md 5.2). None otherwise (an eviction and the
// other closes queue their own terminal frame).
func endFrame(bus *EventBus, sub *Subscription) (Frame, bool) {
	switch err := sub.Err(); {
	case err == nil:
		return bus.StreamErrorFrame(sessionClosedMessage, ErrorKindClosed), true
	case !errors.Is(err, ErrEvicted) && !errors.Is(err, ErrClosed):
		return bus.StreamErrorFrame(err.Error(), ErrorKindInternal), true
	}
	return Frame{}, false
}

// sessionClosedMessage is the error of a stream_error closed.
const sessionClosedMessage = "session closed"

// openPlan is what a route read from its request, for openStream.
type openPlan struct {
	ids []string
	sq  streamQuery
	// multiplexed: the multiplexed route's stream (its error answers name
	// the session); dynamic: its sessions may change (OpenStream).
	multiplexed, dynamic bool
	maxSessions          int
	// head answers a HEAD once Lookup and Authorize have passed; nil: a
	// HEAD is served as a GET (the route checked the method).
	head func(st *Stream)
	// options returns a member's subscription options: its cursor's
	// (setting the member's cursor entry), the query's types and
	// maxQueued.
	options func(st *Stream, m *Member) SubscribeOptions
}

// openStream runs the steps every route takes, in this order, for each
// session of p in order: Lookup; then the registry entry and Authorize
// (the first refusal answers the request); then a HEAD's answer; then the
// subscriptions, all or none (a full bus is 429 subscriber_limit_exceeded,
// and the subscriptions already made are closed). It returns the stream
// to serve, or nil when it answered the request itself, having undone what
// it did. The request checks (CORS, the method, the writer) and the
// query's are the route's, before.
func (h *Handler) openStream(w http.ResponseWriter, r *http.Request, p openPlan) *Stream {
	named := func(id string) string {
		if p.multiplexed {
			return id
		}
		return "" // the single route's answers do not name the session
	}
	st := &Stream{h: h, r: r, multiplexed: p.multiplexed, types: p.sq.types, maxQueued: p.sq.maxQueued,
		maxSessions: max(p.maxSessions, len(p.ids)), idle: h.Heartbeat}
	if st.idle <= 0 {
		st.idle = DefaultHeartbeat
	}
	st.order = make([]*Member, 0, len(p.ids))
	for _, id := range p.ids {
		var bus *EventBus
		var err error
		if h.Lookup != nil {
			bus, err = h.Lookup(r, id)
		}
		if se := h.lookupRefusal(r, bus, err, id); se != nil {
			se.serve(w, named(id))
			return nil
		}
		st.order = append(st.order, newMember(id, bus))
	}

	opened := false
	defer func() {
		if !opened { // refused, failed or panicked (in Authorize, say): undo
			st.Close()
		}
	}()
	head := p.head != nil && r.Method == http.MethodHead
	if h.Authorize != nil {
		if !head {
			// Filed before the first Authorize runs, so that a Revoke while
			// it runs reaches this stream too (see Revoke).
			st.ls = h.reg.begin()
		}
		subjects := make([]string, 0, len(st.order))
		for _, m := range st.order {
			grant, err := h.Authorize(r, m.session, m.bus)
			if se := h.authorizeRefusal(r, grant, err, m.session); se != nil {
				se.serve(w, named(m.session))
				return nil
			}
			m.subject = grant.Subject
			subjects = append(subjects, grant.Subject)
			if !grant.Expires.IsZero() {
				m.expires = grant.Expires.UnixNano()
			}
		}
		if st.ls != nil {
			h.reg.commit(st.ls, subjects...)
		}
	}
	if head {
		p.head(st)
		return nil
	}

	size := len(st.order)
	if p.dynamic {
		// Twice the sessions: a Remove holds its place until the loop has
		// done it, and an Add may come meanwhile.
		size = 2 * st.maxSessions
		st.wake = make(chan struct{}, 1)
		st.names = slices.Clone(p.ids)
		st.holding = len(p.ids)
	}
	if size > 1 || p.dynamic {
		// slots grows with the member numbers an Add gets (apply); the
		// group's places cost a pointer each until a member takes one.
		st.group = NewReadyGroup(size)
		st.slots = make([]*Member, len(st.order))
	} else {
		st.slots = st.order
	}
	for _, m := range st.order {
		opts := p.options(st, m)
		opts.Group, opts.Interrupt = st.group, st.interrupt
		sub, err := subscribeRequest(r, m.bus, opts)
		if err != nil {
			writeSubscribeError(w, err, named(m.session)) // the deferred Close ends the others
			return nil
		}
		m.sub = sub
		if st.group != nil {
			m.slot = sub.q.member
			st.slots[m.slot] = m
		}
		m.todo = true
	}
	for _, m := range st.order {
		st.setLifetime(m)
	}
	if st.ls != nil {
		st.ends.revoked = st.ls.revoked
	}
	st.active = len(st.order)
	st.layCursor()
	opened = true
	return st
}
