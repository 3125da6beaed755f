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
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/ssebus/eventbus/internal/seam"
)

// wallClock reads the wall clock in Unix milliseconds from one monotonic
// reading instead of time.Now's wall and monotonic pair: on virtual
// machines whose clock source is slow (kvm-clock) that halves the cost of a
// stamp, which every Publish pays. It re-reads the wall clock at least once
// a second, so a clock step is picked up within a second. The zero value is
// ready to use; it is safe for concurrent use.
type wallClock struct{ base atomic.Pointer[clockBase] }

type clockBase struct {
	t        time.Time // with its monotonic reading
	unixNano int64
}

func (c *wallClock) millis() int64 {
	if base := c.base.Load(); base != nil {
		if d := time.Since(base.t); d >= 0 && d < time.Second {
			return (base.unixNano + int64(d)) / int64(time.Millisecond)
		}
	}
	t := time.Now()
	c.base.Store(&clockBase{t, t.UnixNano()})
	return t.UnixMilli()
}

func nowMillis(now func() time.Time) int64 {
	if now != nil {
		return now().UnixMilli()
	}
	return time.Now().UnixMilli()
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
// a caller can set neither. Its envelope on the wire is docs/SPEC.md
// section 5.1.
type Event struct {
	// Type is the event type: 1 to MaxTypeLen bytes without CR or LF, and
	// none of ReservedTypes. It becomes the SSE event: field and the
	// envelope's "type".
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

// encoder validates and encodes events exactly as Publish does: every bus
// and Hub has one (Publish's, and the fingerprints of PublishIdempotent),
// and package backplane exposes it, assigning no id, as backplane.Encoder
// (a backplane numbers events in its shared log), through package seam:
// its exported methods are seam.Encoder's, whose contracts are
// backplane.Encoder's. It is safe for concurrent use; its zero value is
// not usable.
type encoder struct {
	maxEventBytes int
	now           func() time.Time
	clock         wallClock
}

// newEncoder returns an encoder that applies opts' MaxEventBytes and stamps
// serverTimestamp with opts.Now (nil: the wall clock). It returns an error
// wrapping ErrInvalidOption when opts are invalid (as New would).
func newEncoder(opts Options) (*encoder, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	return &encoder{maxEventBytes: o.MaxEventBytes, now: o.Now}, nil
}

// millis returns the current Unix milliseconds for stamps: the encoder's
// Now when set, else its wall clock.
func (enc *encoder) millis() int64 {
	if enc.now != nil {
		return enc.now().UnixMilli()
	}
	return enc.clock.millis()
}

// Encode validates e and encodes it as Publish would. It returns an error
// wrapping ErrInvalidEvent for an event Publish refuses as invalid, and one
// wrapping ErrEventTooLarge when its envelope, with the shortest id, is
// above MaxEventBytes (the envelope grows by the id's digits: a backplane
// that must be exact checks again once it has the id). Encode never
// panics, also when a MarshalJSON does.
func (enc *encoder) Encode(e Event) (seam.Encoded, error) {
	p, err := enc.encode(e, 1)
	if err != nil {
		return seam.Encoded{}, err
	}
	end := len(p.buf) - 2 // without the frame's "\n\n"
	return seam.Encoded{Type: p.typ, Tail: p.buf[p.head:end:end]}, nil
}

// CheckSignal validates a signal as Signal would, without delivering it: a
// backplane checks a signal before it spreads it to every replica. It
// returns an error wrapping ErrInvalidEvent for an invalid type and one
// wrapping ErrEventTooLarge above MaxEventBytes.
func (enc *encoder) CheckSignal(typ, about string) error {
	_, err := enc.signal(typ, about)
	return err
}

// signal builds the frame of a signal, or the error Signal returns.
func (enc *encoder) signal(typ, about string) (*frame, error) {
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
	return frame{wire: wire, json: int32(j - i), kind: kindEvent, room: uint8(i), id: id, typ: p.typ}
}

// maxSize is the held of the frame p becomes, whatever its id: p.buf is
// the frame's buffer, with room for the id lines of the longest id (see
// assemble).
func (p *encoded) maxSize() int64 { return int64(len(p.buf) + len(p.typ) + frameOverhead) }

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

// validType checks the type of an event or a signal: its bytes
// (checkTypeBytes), and that it is not reserved for the synthetic frames.
func validType(t string) error {
	if err := checkTypeBytes(t); err != nil {
		return err
	}
	if reserved(t) {
		return fmt.Errorf("%w: type %q is reserved for the synthetic frames (docs/SPEC.md section 5.2)", ErrInvalidEvent, t)
	}
	return nil
}

// checkTypeBytes checks what a type may hold: 1 to MaxTypeLen bytes
// without CR or LF. A type filter is checked with it alone: a filter that
// names a reserved type is harmless (synthetic frames pass every filter).
func checkTypeBytes(t string) error {
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
func (enc *encoder) encode(e Event, next uint64) (encoded, error) {
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
func (enc *encoder) assemble(e Event, data []byte, hasData bool, meta []byte, next uint64) (encoded, error) {
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
