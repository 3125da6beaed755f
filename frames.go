package eventbus

import (
	"slices"
	"strconv"
	"time"
	"unsafe"
)

// Synthetic frame types. Synthetic frames are local to one subscriber and
// carry no id, so they never consume a slot of the per-session sequence.
// Their data, and when each is sent, are docs/SPEC.md section 5.2.
const (
	// TypeReplayComplete marks the seam between replayed and live frames of a
	// resumed subscription.
	TypeReplayComplete = "replay_complete"
	// TypeStateResyncRequired tells the client that it missed events it cannot
	// get back and must refetch its state.
	TypeStateResyncRequired = "state_resync_required"
	// TypeSlowClientWarning is sent once per overflow episode when a
	// subscriber's live queue reaches WarnThresholdRatio of a cap.
	TypeSlowClientWarning = "slow_client_warning"
	// TypeClientEvicted is the terminal frame of an evicted subscriber.
	TypeClientEvicted = "client_evicted"
	// TypeStreamError is the terminal frame the HTTP layer writes when a
	// stream ends for a reason other than eviction, close or disconnect.
	TypeStreamError = "stream_error"
)

// reservedTypes are the synthetic frame types: the one list of them
// (ReservedTypes, and the check of every publish path, validType).
var reservedTypes = [...]string{
	TypeReplayComplete,
	TypeStateResyncRequired,
	TypeSlowClientWarning,
	TypeClientEvicted,
	TypeStreamError,
}

// ReservedTypes returns the event types reserved for the synthetic frames
// (docs/SPEC.md section 5.2), in a new slice the caller may keep or
// modify. No publish path takes one as its type, compared exactly (case
// and spaces count): EventBus.Publish, EventBus.Signal, Hub.Publish,
// Hub.PublishIdempotent, and package backplane's Encoder (Encode,
// Fingerprint, CheckSignal) and Append return an error wrapping
// ErrInvalidEvent that says the type is reserved, and use no id. So a
// frame with one of these event names always comes from the server, never
// from a publisher: a plain EventSource listener for "client_evicted"
// fires only on an eviction.
func ReservedTypes() []string { return slices.Clone(reservedTypes[:]) }

// reserved reports whether t is one of reservedTypes.
func reserved(t string) bool {
	for _, r := range reservedTypes {
		if t == r {
			return true
		}
	}
	return false
}

// Resync and eviction reasons, as they appear in frame data: the "reason"
// of state_resync_required and of client_evicted (docs/SPEC.md section 5.2
// says when each is sent).
const (
	// ReasonEpochReset (resync): the client's cursor is of another epoch,
	// or ahead of the bus.
	ReasonEpochReset = "epoch_reset"
	// ReasonRingEvicted (resync): the ring, or a backplane's log, no longer
	// holds what the client missed.
	ReasonRingEvicted = "ring_evicted"
	// ReasonReplayBudgetExceeded (resync): a resume would replay more than
	// Options.ReplayBudgetBytes.
	ReasonReplayBudgetExceeded = "replay_budget_exceeded"
	// ReasonCursorInvalid (resync): the client's cursor could not be used
	// (SubscribeOptions.CursorInvalid); the stream is live from
	// earliestAvailableId.
	ReasonCursorInvalid = "cursor_invalid"
	// ReasonQueueOverflow and ReasonQueueBytesOverflow (eviction, or the
	// resync of OverflowResync): the frame cap, or the byte cap, rejected a
	// live push.
	ReasonQueueOverflow      = "queue_overflow"
	ReasonQueueBytesOverflow = "queue_bytes_overflow"
	// ReasonRepeatedOverflow (eviction): OverflowResync's third overflow
	// within OverflowWindow.
	ReasonRepeatedOverflow = "repeated_overflow"
	// ReasonCatchUpStalled (eviction): a subscriber under OverflowCatchUp
	// whose consumer took nothing for CatchUpStallTimeout while it was
	// behind.
	ReasonCatchUpStalled = "catch_up_stalled"
	// ReasonMemoryBudget (eviction): a Hub's memory budget took back the
	// frames the subscriber held beyond its session's ring, a client that
	// read too slowly for what the daemon may hold (docs/SPEC.md section 7).
	ReasonMemoryBudget = "memory_budget"
)

// errorKind values of stream_error frames: what a client does next
// (docs/SPEC.md section 5.2).
const (
	// ErrorKindInternal: the server failed; reconnect with backoff.
	ErrorKindInternal = "internal"
	// ErrorKindUnavailable: a backplane could not reach its engine past its
	// bound; reconnect with backoff and resume from the cursor.
	ErrorKindUnavailable = "unavailable"
	// ErrorKindReauthenticate: the stream's lifetime ended (a token
	// expired); get fresh credentials, reconnect at once and resume.
	ErrorKindReauthenticate = "reauthenticate"
	// ErrorKindRevoked: access was revoked; reconnect once with fresh
	// credentials, and take a 401 or 403 then as final.
	ErrorKindRevoked = "revoked"
	// ErrorKindShutdown: the server is going away (a restart, a deploy, a
	// replica leaving) after the frames queued before it; the frame's data
	// also holds "retryAfter", in milliseconds. Reconnect after a random
	// delay of at least retryAfter and resume from the cursor (to another
	// replica where there is one). See EventBus.CloseForShutdown.
	ErrorKindShutdown = "shutdown"
	// ErrorKindClosed: the session's bus was closed by a plain Close (a
	// Hub's Delete, an EventBus.Close, a backplane releasing a session
	// deleted on its replica) while a stream served it,
	// after the frames queued for it: the session the stream followed is
	// gone. A single stream (Handler) ends with it; on a multiplexed stream
	// (MuxHandler) only that session leaves, and the others go on. Do not
	// reconnect to it: a session of that id made later is another one (a
	// 404 says there is none). CloseWithError and CloseForShutdown (a
	// Hub's Shutdown and Close) send their own frame instead.
	ErrorKindClosed = "closed"
)

// DefaultShutdownRetryAfter is the retryAfter of a shutdown's stream_error
// when none is chosen (HubOptions.ShutdownRetryAfter, CloseForShutdown):
// its clients come back spread over [2s, 4s].
const DefaultShutdownRetryAfter = 2 * time.Second

// shutdownMessage is the error of a shutdown's stream_error.
const shutdownMessage = "the server is shutting down: reconnect after retryAfter ms and resume"

type frameKind uint8

const (
	kindEvent frameKind = iota
	kindSignal
	kindSynthetic
	kindTerminal
)

// Frame is one frame of a subscription: a published event (with an id) or a
// synthetic frame (without). It is one pointer to the frame's immutable
// encoding, shared by the ring and every queue that holds the frame; copy it
// freely.
//
// The bytes a Frame exposes are shared by every subscriber that received it
// and by the SSE writer: they are encoded once, at publish, and must never be
// modified. The zero Frame has no type and encodes to nothing.
type Frame struct {
	*frame
}

// frame is what a Frame points to. Frames are immutable once made, so one
// frame serves the ring, every queue and every consumer's batch: a
// consumer copies a pointer per frame, not the header (docs/bench/NOTES.md,
// item 17).
type frame struct {
	// wire is the complete SSE frame; the JSON envelope is wire[json:len-2].
	wire  []byte
	json  int32
	kind  frameKind
	room  uint8 // bytes of the buffer before wire, left for a longer id (build)
	id    uint64
	typ   string
	about string // signals only
	at    int64  // events: Unix ms of the publish, for Options.MaxAge
	// pin is where the frame ends in its bus's ring history: the sum of
	// held over every frame appended to the ring up to this one, set once
	// by the append, before anyone else sees the frame. A frame covers
	// [pin-held, pin) of that history, so a Hub's budget can tell what a
	// subscriber holds beyond its ring (hub_pins.go). 0 for frames never
	// appended (synthetic frames, signals, a log's replay).
	pin uint64
}

// ID returns the event's id, or 0 for a synthetic frame (ids start at 1).
func (f Frame) ID() uint64 {
	if f.frame == nil {
		return 0
	}
	return f.id
}

// Type returns the frame's event type.
func (f Frame) Type() string {
	if f.frame == nil {
		return ""
	}
	return f.typ
}

// JSON returns the encoded envelope, exactly what follows "data: " on the
// wire. The slice is shared and must not be modified.
func (f Frame) JSON() []byte {
	if f.frame == nil || f.wire == nil {
		return nil
	}
	return f.wire[f.json : len(f.wire)-2 : len(f.wire)-2]
}

// Size returns the length of the frame's JSON envelope in bytes, len(JSON()):
// what follows "data: " on the wire, without the line ends. It is the unit
// of every byte cap of a bus (Options.RingMaxBytes, MaxQueuedBytes,
// ReplayBudgetBytes, MaxEventBytes) and of every byte count on the wire
// (the queuedBytes and eventBytes of slow_client_warning and
// client_evicted). The zero Frame has size 0.
//
// A frame costs more memory than its Size, by a bounded amount: at most
// 2*MaxTypeLen+156 bytes on 64-bit platforms (668), before the allocator's
// rounding; a signal also keeps its resource string (About). So the
// frame-count caps (RingSize, MaxQueued) bound what the byte caps leave
// out, and a Hub's MaxTotalBytes counts all of it. The unit and the bound
// are docs/SPEC.md section 1.3.
func (f Frame) Size() int {
	if f.frame == nil {
		return 0
	}
	return f.frame.size()
}

// size is Frame.Size for a frame the caller knows is not nil: the envelope,
// from the "data: " line to the blank line that ends the frame.
func (f *frame) size() int {
	if f.wire == nil {
		return 0
	}
	return len(f.wire) - 2 - int(f.json)
}

// maxFrameExtra is the most a frame costs beyond its envelope (size),
// whatever its kind, before the allocator's rounding: Frame.Size's figure.
// An event's buffer holds its id line and the envelope's id each with room
// for the longest id (the encoder cannot know the id before the bus lock;
// the envelope's own digits, at least one, are the envelope's), the event
// line with its type, the data line's prefix and the blank line; the frame
// keeps its type string beside the buffer (counted as a copy of its own: a
// daemon that decodes types from requests holds one per event), and its
// header and ring slot (frameOverhead). A synthetic frame, a signal and a
// frame from a log have no id room and hold less; a signal also keeps its
// resource, which is not in this figure (its envelope holds it too).
const maxFrameExtra = len(headID) + 2*maxDigits - 1 + len(headEvent) + MaxTypeLen + len(headData) + len("\n\n") +
	MaxTypeLen + frameOverhead

// frameOverhead is what a frame costs beyond its bytes: its header and
// its slot in the ring.
const frameOverhead = int(unsafe.Sizeof(frame{})) + int(unsafe.Sizeof((*frame)(nil)))

// held is every byte a frame in a ring costs, the unit of a Hub's budget:
// its buffer (the whole SSE encoding: envelope, id, event and data lines,
// the type's second copy among them, and for an event the room the
// encoder left for the longest id), the strings it keeps beside it (its
// type, a signal's resource) and its header and ring slot, so that many
// small events count as what they cost. The bus's own byte caps count
// envelopes (size): held is at most size + maxFrameExtra for an event.
func (f *frame) held() int {
	return len(f.wire) + int(f.room) + len(f.typ) + len(f.about) + frameOverhead
}

// maxFrameSize is the largest held of an event whose envelope has
// maxEventBytes bytes: the envelope, the id and event lines with room for
// the longest id and type, the data line, the type again and the header.
func maxFrameSize(maxEventBytes int) int {
	return len(headID) + 2*maxDigits + len(headEvent) + 2*MaxTypeLen + len(headData) + maxEventBytes + 2 + frameOverhead
}

// ref returns the shared frame, for the ring and the queues, which hold
// frames by pointer (see entryFlags). f must not be the zero Frame.
func (f Frame) ref() *frame { return f.frame }

// SSE returns the frame's Server-Sent Events encoding: for an event (ID not 0) it starts with its id line, "id: " and
// the decimal id, then come "event: <type>", one "data: <envelope>" line
// and a blank line. It is the encoding built once, at publish, shared by
// every subscriber and by the ring: a transport writes it as it is (or
// from after "id: ", to write another id form), and must never modify it.
// The zero Frame returns nil.
func (f Frame) SSE() []byte {
	if f.frame == nil {
		return nil
	}
	return f.wire
}

// Synthetic reports whether the frame was made by the bus for one
// subscriber (replay_complete, state_resync_required, slow_client_warning,
// client_evicted, stream_error). Synthetic frames have no id.
func (f Frame) Synthetic() bool { return f.frame != nil && f.kind >= kindSynthetic }

// Signal reports whether the frame is a coalescable change signal published
// with EventBus.Signal. Signals have no id and are never replayed.
func (f Frame) Signal() bool { return f.frame != nil && f.kind == kindSignal }

// About returns the resource a signal concerns, "" for other frames.
func (f Frame) About() string {
	if f.frame == nil {
		return ""
	}
	return f.about
}

// Terminal reports whether the frame is the last one of its stream
// (client_evicted or stream_error).
func (f Frame) Terminal() bool { return f.frame != nil && f.kind == kindTerminal }

// String returns the SSE encoding, for debugging and examples.
func (f Frame) String() string {
	if f.frame == nil {
		return ""
	}
	return string(f.wire)
}

// streamErrorFrame is StreamErrorFrame stamped with ts.
func streamErrorFrame(msg, kind string, ts int64) Frame {
	var retry time.Duration
	if kind == ErrorKindShutdown {
		retry = DefaultShutdownRetryAfter
	}
	return streamErrorFrameRetry(msg, kind, retry, ts)
}

// shutdownFrame is a shutdown's stream_error, retryAfter <= 0 meaning
// DefaultShutdownRetryAfter.
func shutdownFrame(retryAfter time.Duration, ts int64) Frame {
	if retryAfter <= 0 {
		retryAfter = DefaultShutdownRetryAfter
	}
	return streamErrorFrameRetry(shutdownMessage, ErrorKindShutdown, retryAfter, ts)
}

// streamErrorFrameRetry builds a stream_error with data
// {"error":msg,"errorKind":kind} and, when retryAfter > 0,
// "retryAfter":<milliseconds, at least 1> after them.
func streamErrorFrameRetry(msg, kind string, retryAfter time.Duration, ts int64) Frame {
	d := make([]byte, 0, 72+len(msg)+len(kind))
	d = append(d, `{"error":`...)
	d = appendJSONString(d, msg)
	d = append(d, `,"errorKind":`...)
	d = appendJSONString(d, kind)
	if retryAfter > 0 {
		d = append(d, `,"retryAfter":`...)
		d = strconv.AppendInt(d, max(retryAfter.Milliseconds(), 1), 10)
	}
	d = append(d, '}')
	return syntheticFrame(TypeStreamError, kindTerminal, d, ts)
}

// syntheticFrame builds an id-less frame around pre-encoded data.
func syntheticFrame(typ string, kind frameKind, data []byte, ts int64) Frame {
	return idlessFrame(typ, kind, `,"data":`, data, ts, "")
}

// signalFrame builds SPEC 3.8's signal envelope
// {"v":1,"type":T,"about":A,"_meta":{"serverTimestamp":ms}}.
func signalFrame(typ, about string, ts int64) Frame {
	return idlessFrame(typ, kindSignal, `,"about":`, appendJSONString(nil, about), ts, about)
}

// idlessFrame builds a frame without an id line:
// event: T / data: {"v":1,"type":T<key><value>,"_meta":{"serverTimestamp":ts}}.
// Its buffer is made to the exact length, so that what a frame holds
// beyond its envelope stays within maxFrameExtra whatever its type needs
// escaped.
func idlessFrame(typ string, kind frameKind, key string, value []byte, ts int64, about string) Frame {
	const ev, dl, vType, kMeta, end = "event: ", "\ndata: ", `{"v":1,"type":`, `,"_meta":{"serverTimestamp":`, "}}\n\n"
	var tb [64]byte
	typeJSON := appendJSONString(tb[:0], typ)
	var sb [20]byte
	stamp := strconv.AppendInt(sb[:0], ts, 10)
	b := make([]byte, 0, len(ev)+len(typ)+len(dl)+len(vType)+len(typeJSON)+len(key)+len(value)+len(kMeta)+len(stamp)+len(end))
	b = append(b, ev...)
	b = append(b, typ...)
	b = append(b, dl...)
	j := len(b)
	b = append(b, vType...)
	b = append(b, typeJSON...)
	b = append(b, key...)
	b = append(b, value...)
	b = append(b, kMeta...)
	b = append(b, stamp...)
	b = append(b, end...)
	return Frame{&frame{wire: b, json: int32(j), kind: kind, typ: typ, about: about}}
}

// syntheticData is a tiny JSON object writer for synthetic frame data. The
// data of synthetic frames is a handful of numbers and short strings, so a
// hand-written encoder keeps them cheap and deterministic in field order.
type syntheticData struct{ b []byte }

func (d *syntheticData) key(k string) {
	if len(d.b) == 0 {
		d.b = append(d.b, '{')
	} else {
		d.b = append(d.b, ',')
	}
	d.b = append(d.b, '"')
	d.b = append(d.b, k...)
	d.b = append(d.b, `":`...)
}

func (d *syntheticData) uint(k string, v uint64) *syntheticData {
	d.key(k)
	d.b = strconv.AppendUint(d.b, v, 10)
	return d
}

func (d *syntheticData) int(k string, v int) *syntheticData {
	d.key(k)
	d.b = strconv.AppendInt(d.b, int64(v), 10)
	return d
}

func (d *syntheticData) str(k, v string) *syntheticData {
	d.key(k)
	d.b = appendJSONString(d.b, v)
	return d
}

func (d *syntheticData) bytes() []byte {
	if len(d.b) == 0 {
		return []byte("{}")
	}
	return append(d.b, '}')
}

// replayCompleteFrame is 5.1's replay_complete.
func replayCompleteFrame(count int, last uint64, epoch string, ts int64) Frame {
	d := &syntheticData{b: make([]byte, 0, 128)}
	d.int("replayedCount", count)
	if count > 0 {
		d.uint("lastReplayedEventId", last).uint("lastEventId", last)
	}
	d.str("epoch", epoch)
	return syntheticFrame(TypeReplayComplete, kindSynthetic, d.bytes(), ts)
}

// resyncFrame is state_resync_required (5.1, 5.2, 5.4).
func resyncFrame(reason, detail string, lastDelivered, earliest uint64, epoch string, ts int64) Frame {
	d := &syntheticData{b: make([]byte, 0, 160)}
	d.str("reason", reason)
	if detail != "" {
		d.str("detail", detail)
	}
	d.uint("lastDeliveredId", lastDelivered).uint("earliestAvailableId", earliest).str("epoch", epoch)
	return syntheticFrame(TypeStateResyncRequired, kindSynthetic, d.bytes(), ts)
}

// warningFrame is SPEC 3.2's slow_client_warning.
func warningFrame(c queueCounts, lastEventID uint64, threshold string, ts int64) Frame {
	d := &syntheticData{b: make([]byte, 0, 160)}
	d.int("queueSize", c.liveCount).int("maxQueued", c.maxQueued).uint("lastEventId", lastEventID)
	d.int("queuedBytes", c.liveBytes).int("maxQueuedBytes", c.maxBytes).str("threshold", threshold)
	return syntheticFrame(TypeSlowClientWarning, kindSynthetic, d.bytes(), ts)
}

// evictedFrame is SPEC 3.3's client_evicted; eventBytes < 0 leaves it out.
func evictedFrame(reason string, droppedAfter uint64, c queueCounts, eventBytes int, ts int64) Frame {
	d := &syntheticData{b: make([]byte, 0, 192)}
	d.str("reason", reason).uint("droppedAfter", droppedAfter)
	d.int("queueSize", c.liveCount).int("maxQueued", c.maxQueued)
	d.int("queuedBytes", c.liveBytes).int("maxQueuedBytes", c.maxBytes)
	if eventBytes >= 0 {
		d.int("eventBytes", eventBytes)
	}
	return syntheticFrame(TypeClientEvicted, kindTerminal, d.bytes(), ts)
}
