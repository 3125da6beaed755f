package eventbus

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// Synthetic frame types. Synthetic frames are local to one subscriber and
// carry no id, so they never consume a slot of the per-session sequence.
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

// Resync and eviction reasons, as they appear in frame data.
const (
	ReasonEpochReset           = "epoch_reset"
	ReasonRingEvicted          = "ring_evicted"
	ReasonReplayBudgetExceeded = "replay_budget_exceeded"
	ReasonQueueOverflow        = "queue_overflow"
	ReasonQueueBytesOverflow   = "queue_bytes_overflow"
)

// errorKind values of stream_error frames: what a client does next.
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
)

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
// consumer copies a pointer per frame, not the header (BENCHMARKS.md).
type frame struct {
	// wire is the complete SSE frame; the JSON envelope is wire[json:len-2].
	wire  []byte
	json  int32
	kind  frameKind
	id    uint64
	typ   string
	about string // signals only
	at    int64  // events: Unix ms of the publish, for Options.MaxAge
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

// Size returns the length of the encoded envelope in bytes: the unit of every
// byte cap of the package.
func (f Frame) Size() int {
	if f.frame == nil {
		return 0
	}
	return f.frame.size()
}

// size is Frame.Size for a frame the caller knows is not nil.
func (f *frame) size() int {
	if f.wire == nil {
		return 0
	}
	return len(f.wire) - 2 - int(f.json)
}

// ref returns the shared frame, for the ring and the queues, which hold
// frames by pointer (see entryFlags). f must not be the zero Frame.
func (f Frame) ref() *frame { return f.frame }

// AppendSSE appends the frame's Server-Sent Events encoding to dst and
// returns the extended slice: an "id: N" line only for events with an id,
// then "event: <type>", one "data: <envelope>" line and a blank line. The
// encoding was built once, at publish; this is a single copy.
func (f Frame) AppendSSE(dst []byte) []byte {
	if f.frame == nil {
		return dst
	}
	return append(dst, f.wire...)
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

// StreamErrorFrame returns a terminal stream_error frame with data
// {"error":msg,"errorKind":kind}, stamped with the current time. The HTTP
// handler writes it when a stream must end for a reason other than eviction,
// close or disconnect.
func StreamErrorFrame(msg, kind string) Frame { return streamErrorFrame(msg, kind, nowMillis(nil)) }

// streamErrorFrame is StreamErrorFrame stamped with ts.
func streamErrorFrame(msg, kind string, ts int64) Frame {
	d := make([]byte, 0, 48+len(msg)+len(kind))
	d = append(d, `{"error":`...)
	d = appendJSONString(d, msg)
	d = append(d, `,"errorKind":`...)
	d = appendJSONString(d, kind)
	d = append(d, '}')
	return syntheticFrame(TypeStreamError, kindTerminal, d, ts)
}

// syntheticFrame builds an id-less frame around pre-encoded data.
func syntheticFrame(typ string, kind frameKind, data []byte, ts int64) Frame {
	return idlessFrame(typ, kind, `,"data":`, data, ts, "")
}

// signalFrame builds SPEC 11's signal envelope
// {"v":1,"type":T,"about":A,"_meta":{"serverTimestamp":ms}}.
func signalFrame(typ, about string, ts int64) Frame {
	return idlessFrame(typ, kindSignal, `,"about":`, appendJSONString(nil, about), ts, about)
}

// idlessFrame builds a frame without an id line:
// event: T / data: {"v":1,"type":T<key><value>,"_meta":{"serverTimestamp":ts}}.
func idlessFrame(typ string, kind frameKind, key string, value []byte, ts int64, about string) Frame {
	const ev, dl = "event: ", "\ndata: "
	b := make([]byte, 0, len(ev)+2*len(typ)+len(dl)+len(key)+len(value)+64)
	b = append(b, ev...)
	b = append(b, typ...)
	b = append(b, dl...)
	j := len(b)
	b = append(b, `{"v":1,"type":`...)
	b = appendJSONString(b, typ)
	b = append(b, key...)
	b = append(b, value...)
	b = append(b, `,"_meta":{"serverTimestamp":`...)
	b = strconv.AppendInt(b, ts, 10)
	b = append(b, "}}\n\n"...)
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

// queueCounts is a snapshot of a queue's live counts and caps.
type queueCounts struct {
	liveCount, maxQueued, liveBytes, maxBytes int
}

// warningFrame is section 6's slow_client_warning.
func warningFrame(c queueCounts, lastEventID uint64, threshold string, ts int64) Frame {
	d := &syntheticData{b: make([]byte, 0, 160)}
	d.int("queueSize", c.liveCount).int("maxQueued", c.maxQueued).uint("lastEventId", lastEventID)
	d.int("queuedBytes", c.liveBytes).int("maxQueuedBytes", c.maxBytes).str("threshold", threshold)
	return syntheticFrame(TypeSlowClientWarning, kindSynthetic, d.bytes(), ts)
}

// evictedFrame is section 7's client_evicted; eventBytes < 0 leaves it out.
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

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string, escaped as encoding/json
// escapes it without HTML escaping: quotes, backslashes, control characters,
// U+2028 and U+2029, and invalid UTF-8 as U+FFFD. The result never holds a
// raw CR or LF byte.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\b', '\f':
				// encoding/json writes these short forms since Go 1.22; match
				// it, so a string encodes the same in data (encoding/json) as
				// in type, _meta keys and originatorClientId (here).
				if c == '\b' {
					dst = append(dst, '\\', 'b')
				} else {
					dst = append(dst, '\\', 'f')
				}
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// Event is what a caller publishes. The bus assigns the id and stamps "v";
// a caller can set neither.
type Event struct {
	// Type is the event type: non-empty, without CR or LF. It becomes the SSE
	// event: field and the envelope's "type".
	Type string
	// Data is the payload, encoded once with encoding/json. A json.RawMessage
	// is validated and compacted instead. nil (or an empty RawMessage) leaves
	// "data" out of the envelope.
	Data any
	// Meta holds extra "_meta" keys. "serverTimestamp" is kept when it is a
	// finite number; otherwise Publish stamps the current Unix milliseconds.
	Meta map[string]any
	// OriginatorClientID, when not empty, is copied into the envelope so the
	// client that caused the event can recognise it.
	OriginatorClientID string
}

// Encoder validates and encodes events exactly as Publish does, without
// assigning an id: the seam for a backplane, which numbers events in its
// shared log (see NewFed). Make one with NewEncoder.
//
// An Encoder is safe for concurrent use. Its zero value is not usable.
type Encoder struct {
	maxEventBytes int
	now           func() time.Time
	clock         wallClock
}

// NewEncoder returns an encoder that applies opts' MaxEventBytes and stamps
// serverTimestamp with opts.Now (nil: the wall clock). It returns an error
// wrapping ErrInvalidOption when opts are invalid (as New would).
func NewEncoder(opts Options) (*Encoder, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Encoder{maxEventBytes: o.MaxEventBytes, now: o.Now}, nil
}

// millis returns the current Unix milliseconds for stamps: the encoder's
// Now when set, else its wall clock.
func (enc *Encoder) millis() int64 {
	if enc.now != nil {
		return enc.now().UnixMilli()
	}
	return enc.clock.millis()
}

// EncodedEvent is an event encoded by an Encoder, everything but its id.
type EncodedEvent struct {
	// Type is the event's type (the SSE event: field).
	Type string
	// Tail is the JSON envelope after its leading `{"id":N`: the envelope
	// of the event numbered N is `{"id":` + N + Tail. It is the caller's.
	Tail []byte
}

// Envelope returns the complete JSON envelope of the event numbered id, as
// a LogEntry's JSON holds it.
func (e EncodedEvent) Envelope(id uint64) []byte {
	b := make([]byte, 0, len(headJSON)+maxDigits+len(e.Tail))
	b = strconv.AppendUint(append(b, headJSON...), id, 10)
	return append(b, e.Tail...)
}

// Encode validates e and encodes it as Publish would. It returns an error
// wrapping ErrInvalidEvent for an event Publish refuses as invalid, and one
// wrapping ErrEventTooLarge when its envelope, with the shortest id, is
// above MaxEventBytes (the envelope grows by the id's digits: a backplane
// that must be exact checks again once it has the id). Encode never
// panics, also when a MarshalJSON does.
func (enc *Encoder) Encode(e Event) (EncodedEvent, error) {
	p, err := enc.encode(e, 1)
	if err != nil {
		return EncodedEvent{}, err
	}
	end := len(p.buf) - 2 // without the frame's "\n\n"
	return EncodedEvent{Type: p.typ, Tail: p.buf[p.head:end:end]}, nil
}

// CheckSignal validates a signal as Signal would, without delivering it: a
// backplane checks a signal before it spreads it to every replica. It
// returns an error wrapping ErrInvalidEvent for an invalid type and one
// wrapping ErrEventTooLarge above MaxEventBytes.
func (enc *Encoder) CheckSignal(typ, about string) error {
	_, err := enc.signal(typ, about)
	return err
}

// signal builds the frame of a signal, or the error Signal returns.
func (enc *Encoder) signal(typ, about string) (*frame, error) {
	if err := validType(typ); err != nil {
		return nil, err
	}
	f := signalFrame(typ, about, enc.millis()).ref()
	if f.size() > enc.maxEventBytes {
		return nil, fmt.Errorf("%w: signal of %d bytes, MaxEventBytes is %d", ErrEventTooLarge, f.size(), enc.maxEventBytes)
	}
	return f, nil
}

// encoded is an event encoded outside the bus lock: buf holds the envelope's
// tail (everything after the id) from offset head, with room before it for
// the id-dependent head, which frame writes under the lock.
type encoded struct {
	buf  []byte
	head int
	typ  string
	now  int64 // the clock reading of the stamp, Unix ms; 0 when the caller gave one
}

const (
	headID    = "id: "
	headEvent = "\nevent: "
	headData  = "\ndata: "
	headJSON  = `{"id":`
	maxDigits = 20
)

// frame completes the encoding with id: it writes "id: N\nevent: T\ndata:
// {"id":N" right-aligned before the tail. It does O(len(type)) copying and
// no allocation, so it may run under the bus lock.
func (p *encoded) build(id uint64) frame {
	var d [maxDigits]byte
	digits := strconv.AppendUint(d[:0], id, 10)
	i := p.head
	i -= len(digits)
	copy(p.buf[i:], digits)
	i -= len(headJSON)
	copy(p.buf[i:], headJSON)
	j := i
	i -= len(headData)
	copy(p.buf[i:], headData)
	i -= len(p.typ)
	copy(p.buf[i:], p.typ)
	i -= len(headEvent)
	copy(p.buf[i:], headEvent)
	i -= len(digits)
	copy(p.buf[i:], digits)
	i -= len(headID)
	copy(p.buf[i:], headID)
	wire := p.buf[i:len(p.buf):len(p.buf)]
	return frame{wire: wire, json: int32(j - i), kind: kindEvent, id: id, typ: p.typ}
}

// scratch holds reusable encoding buffers; the data is copied into the
// event's own buffer, so a scratch never escapes a Publish.
type scratch struct {
	data []byte       // the envelope's data, then its _meta members
	out  bytes.Buffer // json.Encoder's output
	enc  *json.Encoder
}

var scratchPool = sync.Pool{New: func() any {
	s := &scratch{}
	s.enc = json.NewEncoder(&s.out)
	s.enc.SetEscapeHTML(false)
	return s
}}

func (s *scratch) free() {
	// A huge event must not pin its buffers in the pool forever.
	if cap(s.data) > 64<<10 || s.out.Cap() > 64<<10 {
		return
	}
	s.data = s.data[:0]
	s.out.Reset()
	scratchPool.Put(s)
}

// encodeValue appends the JSON encoding of v to s.data. Panics in a
// MarshalJSON become errors: Publish must never panic.
func (s *scratch) encodeValue(v any) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: encoding panicked: %v", ErrInvalidEvent, r)
		}
	}()
	s.out.Reset()
	if err := s.enc.Encode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidEvent, err)
	}
	out := s.out.Bytes()
	s.data = append(s.data, out[:len(out)-1]...) // without Encode's newline
	return nil
}

// encodeRaw validates and compacts pre-encoded JSON into s.data. It is the
// hot path of daemons that encode their payloads themselves, so it does not
// go through encoding/json's scanner (or box the slice into an interface).
func (s *scratch) encodeRaw(raw json.RawMessage) error {
	out, err := compactJSON(s.data, raw)
	if err != nil {
		return fmt.Errorf("%w: invalid JSON: %v", ErrInvalidEvent, err)
	}
	s.data = out
	return nil
}

// finiteNumber reports whether v is a finite JSON number.
func finiteNumber(v any) bool {
	switch n := v.(type) {
	case float64:
		return !math.IsNaN(n) && !math.IsInf(n, 0)
	case float32:
		return !math.IsNaN(float64(n)) && !math.IsInf(float64(n), 0)
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return true
	case json.Number:
		// strconv accepts "NaN", "Inf" and hex floats, which are no JSON
		// numbers: encoding/json would refuse to write them and the whole
		// event would be rejected instead of stamped. Require a finite value
		// and a JSON number literal (starts with '-' or a digit and ends
		// with a digit, so json.Valid cannot pass on surrounding spaces).
		f, err := n.Float64()
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return false
		}
		s := string(n) // not empty: Float64 succeeded
		first, last := s[0], s[len(s)-1]
		return (first == '-' || '0' <= first && first <= '9') &&
			'0' <= last && last <= '9' && json.Valid([]byte(s))
	}
	return false
}

// MaxTypeLen is the longest event type, in bytes, that Publish and Signal
// accept: a frame keeps its type in its event: line and in its envelope,
// and a type without a bound would make every small event large.
const MaxTypeLen = 256

// validType checks an event type.
func validType(t string) error {
	if t == "" {
		return fmt.Errorf("%w: empty type", ErrInvalidEvent)
	}
	if len(t) > MaxTypeLen {
		return fmt.Errorf("%w: type of %d bytes, longer than MaxTypeLen %d", ErrInvalidEvent, len(t), MaxTypeLen)
	}
	// A plain loop: strings.ContainsAny builds an ASCII set per call, and
	// this runs on every Publish.
	for i := 0; i < len(t); i++ {
		if t[i] == '\r' || t[i] == '\n' {
			return fmt.Errorf("%w: type contains CR or LF", ErrInvalidEvent)
		}
	}
	return nil
}

// encode validates e and encodes everything of its envelope but the id,
// outside the bus lock, sized for an id of next's digits. The result needs
// one allocation.
func (enc *Encoder) encode(e Event, next uint64) (encoded, error) {
	if err := validType(e.Type); err != nil {
		return encoded{}, err
	}
	// The common case, pre-encoded compact data (or none) and no Meta,
	// needs no scratch: every part is either e's own or fits in a stack
	// buffer, and is copied once, into the event's buffer. This and the
	// faster validation (compactValid) made such a Publish 21% cheaper
	// (BenchmarkEncode). Meta is tested first: with it, the scratch path
	// validates the data anyway.
	if raw, ok := e.Data.(json.RawMessage); len(e.Meta) == 0 && (e.Data == nil || ok && compactValid(raw)) {
		var mb [len(kTimestamp) + maxDigits + 1]byte
		now := enc.millis()
		meta := strconv.AppendInt(append(mb[:0], kTimestamp...), now, 10)
		p, err := enc.assemble(e, raw, len(raw) > 0, meta, next)
		p.now = now
		return p, err
	}

	s := scratchPool.Get().(*scratch)
	defer s.free()

	// s.data collects, in order: data, then the _meta members.
	hasData := false
	switch v := e.Data.(type) {
	case nil:
	case json.RawMessage:
		if len(v) > 0 {
			if err := s.encodeRaw(v); err != nil {
				return encoded{}, err
			}
			hasData = true
		}
	default:
		if err := s.encodeValue(v); err != nil {
			return encoded{}, err
		}
		hasData = true
	}
	dataEnd := len(s.data)

	s.data = append(s.data, kTimestamp...)
	var now int64
	if ts, ok := e.Meta["serverTimestamp"]; ok && finiteNumber(ts) {
		if err := s.encodeValue(ts); err != nil {
			return encoded{}, err
		}
	} else {
		now = enc.millis()
		s.data = strconv.AppendInt(s.data, now, 10)
	}
	if len(e.Meta) > 0 {
		for _, k := range slices.Sorted(maps.Keys(e.Meta)) {
			if k == "serverTimestamp" {
				continue
			}
			s.data = append(s.data, ',')
			s.data = appendJSONString(s.data, k)
			s.data = append(s.data, ':')
			if err := s.encodeValue(e.Meta[k]); err != nil {
				return encoded{}, fmt.Errorf("%w (in _meta[%q])", err, k)
			}
		}
	}
	p, err := enc.assemble(e, s.data[:dataEnd], hasData, s.data[dataEnd:], next)
	p.now = now
	return p, err
}

const kTimestamp = `"serverTimestamp":`

// assemble lays e's envelope out in the event's own buffer, given its
// encoded data (written only with hasData) and the members of its "_meta".
// It returns ErrEventTooLarge above MaxEventBytes for an id of next's digits.
func (enc *Encoder) assemble(e Event, data []byte, hasData bool, meta []byte, next uint64) (encoded, error) {
	const (
		vType  = `,"v":1,"type":`
		kData  = `,"data":`
		kMeta  = `,"_meta":{`
		kOrig  = `},"originatorClientId":`
		closer = "}\n\n"
	)
	// The type and the originator as JSON strings, in stack buffers: the
	// lengths are needed before the buffer is made.
	var tb, ob [64]byte
	typeJSON := appendJSONString(tb[:0], e.Type)
	var orig []byte
	if e.OriginatorClientID != "" {
		orig = appendJSONString(ob[:0], e.OriginatorClientID)
	}
	tail := len(vType) + len(typeJSON) + len(kMeta) + len(meta) + 1 + len(closer)
	if hasData {
		tail += len(kData) + len(data)
	}
	if orig != nil {
		tail += len(kOrig) - 1 + len(orig)
	}
	// The envelope is {"id":N followed by the tail without its "\n\n". The
	// id is not known yet; Publish passes the next one, which is exact for a
	// single publisher and off by at most one byte under a race.
	size := len(headJSON) + digits(next) + tail - 2
	if size > enc.maxEventBytes {
		return encoded{}, fmt.Errorf("%w: %d bytes encoded, MaxEventBytes is %d", ErrEventTooLarge, size, enc.maxEventBytes)
	}

	head := len(headID) + maxDigits + len(headEvent) + len(e.Type) + len(headData) + len(headJSON) + maxDigits
	buf := make([]byte, head, head+tail)
	buf = append(buf, vType...)
	buf = append(buf, typeJSON...)
	if hasData {
		buf = append(buf, kData...)
		buf = append(buf, data...)
	}
	buf = append(buf, kMeta...)
	buf = append(buf, meta...)
	if orig != nil {
		buf = append(buf, kOrig...)
		buf = append(buf, orig...)
	} else {
		buf = append(buf, '}')
	}
	buf = append(buf, closer...)
	return encoded{buf: buf, head: head, typ: e.Type}, nil
}

func digits(n uint64) int {
	d := 1
	for n >= 10 {
		n /= 10
		d++
	}
	return d
}
