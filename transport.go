package eventbus

import (
	"strconv"

	"github.com/ssebus/eventbus/internal/muxcursor"
)

// A Transport writes one Stream to one client connection. The package's
// Handler and MuxHandler write Server-Sent Events through one;
// github.com/ssebus/eventbus/websocket writes WebSocket messages through
// another, on this exported API alone. The Stream decides everything about
// the sessions (what is taken from which subscription, in what order, the
// frames that say why a session or the stream ends, backpressure, catch-up,
// eviction, revocation, lifetime, heartbeats, the cursor); a Transport only
// puts bytes on its connection and says whether they went out.
//
// The contract, for a Transport given to Stream.Serve:
//
//   - WriteBatch and Keepalive are called from Serve's goroutine only, one
//     call at a time, never concurrently with each other. They may block,
//     but must bound the time they block (a write deadline): a write that
//     neither completes nor fails stalls the stream, and the Stream's
//     memory bound then rests on Interrupt alone.
//   - Interrupt may be called from any goroutine, at any time from the
//     Serve call that is given the Transport until Serve returns, once or
//     more, concurrently with WriteBatch. It must not block: it makes the
//     write in progress, and every later one, fail soon (a deadline in the
//     past, closing the connection).
//   - A Transport must not retain a Batch, nor any slice a Batch or a Frame
//     returned, after WriteBatch returns: the Stream reuses them, and a
//     frame's bytes held past its delivery are memory a Hub's budget does
//     not count.
//   - A Transport must not call the Stream's methods from WriteBatch or
//     Keepalive except those documented as callable there (Len, Member,
//     AppendCursor); it may call Add and Remove from any other goroutine.
//
// The Stream ends its subscriptions itself: after a WriteBatch or Keepalive
// that returned an error it ends them at once (the frames of the failed
// batch counted as dropped, reason blocked, unless Serve's context was done
// and the error is not a deadline: the client left), and returns
// StreamFailed. Closing the connection is the caller's, after Serve
// returns.
type Transport interface {
	// WriteBatch writes the batch's frames, in order, and flushes them:
	// it returns nil once the connection has taken them, or the error
	// that failed or blocked the write. The first batch of every stream
	// has no frames and CursorMoved set: the transport writes its greeting
	// there (the SSE retry: line, the WebSocket's first cursor), and the
	// Stream learns that the connection takes writes. Later batches have
	// frames, or a changed cursor (a session added or removed), or both.
	// After a WriteBatch that panicked the Stream calls it once more, with
	// one frame (stream_error internal), and ends: a transport that
	// buffers drops what the failed batch left unwritten.
	WriteBatch(b *Batch) error
	// Keepalive is called when the stream has written nothing for its
	// Handler's Heartbeat: the transport writes what keeps the connection
	// and its proxies from timing out and shows that the client is still
	// there (an SSE comment; a WebSocket ping, whose missing pong ends the
	// connection). An error ends the stream as WriteBatch's does.
	Keepalive() error
	// Interrupt makes the write in progress, and every later one, fail
	// soon; see the type's contract.
	Interrupt()
}

// A Batch is what a Stream hands its Transport at once: frames taken from
// its sessions' subscriptions, each with the Member it belongs to, in the
// order to write them, and the stream's cursor. The order within a session
// is its bus's; across sessions it is the Stream's choice. A Batch is valid
// only during the WriteBatch call it is given to, and only on that
// goroutine.
type Batch struct {
	st      *Stream
	frames  []Frame
	owners  []*Member
	moved   bool // the cursor changed: events, or the stream's sessions
	applied int  // the frames whose ids are in the cursor: [0, applied)
}

// Len returns the number of frames in the batch.
func (b *Batch) Len() int { return len(b.frames) }

// Frame returns frame i, 0 <= i < Len(). Its bytes (Frame.SSE,
// Frame.JSON) are shared by every subscriber and must not be modified.
func (b *Batch) Frame(i int) Frame { return b.frames[i] }

// Member returns the session frame i belongs to, 0 <= i < Len().
func (b *Batch) Member(i int) *Member { return b.owners[i] }

// CursorMoved reports whether the stream's cursor after this batch
// differs from the one after the last batch: the batch has events, or the
// stream's sessions changed (Stream.Add, Stream.Remove), or it is the
// stream's first. A transport whose client cannot read the cursor from the
// frames themselves (SSE's id: line does so per event) sends it then.
func (b *Batch) CursorMoved() bool { return b.moved }

// AppendCursor appends to dst the stream's composite cursor as it stands
// after frame i (i = -1: before the batch's frames; Len()-1: after all of
// them) and returns the extended slice. The cursor names every session of
// the stream with its epoch and the id of the last event the stream
// delivered to it (docs/SPEC.md 6.8): given back as the multiplexed
// route's Last-Event-ID or lastEventId, or to a WebSocket's lastEventId,
// it resumes every session exactly after frame i. Calls with increasing i
// cost one entry's encoding per event; a smaller i than the last call's
// recomputes the batch's entries.
func (b *Batch) AppendCursor(dst []byte, i int) []byte {
	if i < -1 || i >= len(b.frames) {
		panic("eventbus: Batch.AppendCursor index out of range: " + strconv.Itoa(i))
	}
	if i+1 < b.applied {
		for _, m := range b.owners {
			m.entry.ID = m.before
		}
		b.applied = 0
	}
	for ; b.applied <= i; b.applied++ {
		if id := b.frames[b.applied].ID(); id != 0 {
			b.owners[b.applied].entry.ID = id
		}
	}
	return b.st.appendCursor(dst)
}

// A Member is one session of a Stream: its id, its bus's epoch, and the
// bytes a multiplexed wire splices into each of its frames. A Member is
// valid while it is in its stream (from the batch that first names it
// until the stream ends or Stream.Remove takes it out); its methods are
// safe to call from any goroutine.
type Member struct {
	session string
	bus     *EventBus
	sub     *Subscription
	subject string // its Grant's
	expires int64  // its Grant's Expires, Unix ns; 0 when none
	// json is `"session":<id as a JSON string>,`: the multiplexed wire's
	// member, spliced after the "{" of every frame's envelope.
	json []byte
	// entry is its position in the cursor: the id of the last event
	// delivered (or, while a batch is written, the one AppendCursor was
	// asked about). Its text is at the offset at of Stream.cursor, with
	// the id put there (see Stream.appendCursor); before is entry.ID
	// before the current batch.
	entry  muxcursor.Entry
	at     int
	put    uint64
	before uint64
	slot   int // its number in the stream's ReadyGroup

	// The serve loop's state, owned by Serve's goroutine.
	todo     bool // take from it before waiting: its last take had frames, or it was woken
	left     bool // its subscription ended, or Remove took it out
	terminal bool // its terminal frame is in a batch
	pending  int  // frames taken that are in the batch being written
}

// Session returns the session's id.
func (m *Member) Session() string { return m.session }

// Epoch returns the epoch of the session's bus (EventBus.Epoch).
func (m *Member) Epoch() string { return m.bus.Epoch() }

// SessionMember returns the JSON object member `"session":"<id>",` (the
// id as a JSON string, without HTML escaping, then a comma): the
// multiplexed wire's envelope of a frame f is f.JSON()[:1], this, then
// f.JSON()[1:] (docs/SPEC.md 6.8). It must not be modified.
func (m *Member) SessionMember() []byte { return m.json }

// StreamEnd is why Stream.Serve returned: what the stream wrote last, and
// what a transport with close codes (WebSocket) says when it closes.
type StreamEnd uint8

const (
	// StreamGone: Serve's context ended (the client left), or the stream
	// was never served; nothing more was written.
	StreamGone StreamEnd = iota + 1
	// StreamFailed: a write or a keepalive failed, blocked past its
	// deadline or was interrupted; the connection is not usable.
	StreamFailed
	// StreamEvicted: a session's subscription was evicted; the last batch
	// ended with its client_evicted frame. The client resumes with its
	// cursor.
	StreamEvicted
	// StreamClosed: the stream's last session left because its bus
	// closed; the last batch ended with its terminal frame (stream_error
	// closed, or the bus's own).
	StreamClosed
	// StreamShutdown: as StreamClosed, a session's terminal frame being
	// stream_error shutdown (EventBus.CloseForShutdown): the server is
	// going away.
	StreamShutdown
	// StreamRevoked: Handler.Revoke named a subject of the stream; the last
	// batch ended with stream_error revoked.
	StreamRevoked
	// StreamExpired: a Grant's lifetime ended; the last batch ended with
	// stream_error reauthenticate.
	StreamExpired
	// StreamPanicked: the stream loop or its transport panicked; the last
	// batch was stream_error internal. The panic is logged.
	StreamPanicked
)

var streamEndNames = [...]string{"", "gone", "failed", "evicted", "closed", "shutdown", "revoked", "expired", "panicked"}

// String returns the end's name: "gone", "failed", "evicted", "closed",
// "shutdown", "revoked", "expired" or "panicked".
func (e StreamEnd) String() string {
	if int(e) < len(streamEndNames) && e != 0 {
		return streamEndNames[e]
	}
	return "StreamEnd(" + strconv.Itoa(int(e)) + ")"
}
