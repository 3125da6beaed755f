package sseclient

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"time"
)

// DefaultMaxEventBytes is the Parser's and the Client's bound on one event
// when MaxEventBytes is 0: the server's default MaxEventBytes (16 MiB, the
// size of an envelope) plus 64 KiB for the SSE framing around it.
const DefaultMaxEventBytes = 16<<20 + 64<<10

// readSize is the size of the parser's read buffer. A line longer than it
// is not a problem: it is gathered across reads, up to MaxEventBytes.
const readSize = 64 << 10

// ErrEventTooLarge is returned (wrapped) by Parser.Next, and by Client.Run
// as its final error, when one event holds more than MaxEventBytes bytes.
var ErrEventTooLarge = errors.New("sseclient: event larger than MaxEventBytes")

// Kind says what a Message holds.
type Kind uint8

const (
	// KindEvent is a dispatched event: Type, Data, ID, HasID, LastEventID.
	KindEvent Kind = iota + 1
	// KindComment is a comment line (": heartbeat"): Comment.
	KindComment
	// KindRetry is a valid retry field: Retry.
	KindRetry
)

// Message is one thing a Parser read, in stream order.
type Message struct {
	Kind Kind
	// Type is the event type; "message" when the stream set none.
	Type string
	// Data is the event's data lines joined by LF. The caller owns it: the
	// parser never touches it again.
	Data []byte
	// ID is the value of the id field of this event's block, when HasID.
	ID    string
	HasID bool
	// LastEventID is the standard's last event ID string at dispatch: the
	// last id field seen, in this block or an earlier one.
	LastEventID string
	// Comment is a comment line without its leading colon.
	Comment string
	// Retry is the reconnection time a retry field set.
	Retry time.Duration
}

// Parser is a strict, incremental reader of a text/event-stream, written
// from the WHATWG HTML standard's "interpreting an event stream" rules:
// lines end with CRLF, LF or CR; one leading U+FEFF BOM is skipped; a line
// starting with ':' is a comment; "field:value" splits at the first colon
// and drops one leading space of the value, and a line without a colon is a
// field with an empty value; event sets the type, data appends value+LF, id
// sets the last event ID unless the value holds NUL, retry counts only when
// it is ASCII digits, other fields are ignored; a blank line dispatches the
// event (none when no data field was seen) with one trailing LF removed. At
// the end of the stream an event not yet terminated by a blank line is
// discarded. It works on bytes: the standard's UTF-8 decoding (invalid
// sequences to U+FFFD) is left to the caller, so what the server sent can
// be compared byte for byte.
//
// There is no line length limit below MaxEventBytes, which bounds what the
// parser holds for one event: its data (with the LF between lines), its
// type, and the line being read.
//
// A Parser is not safe for concurrent use. Its zero value is not usable:
// make one with NewParser.
type Parser struct {
	// MaxEventBytes bounds one event (see above); 0 means
	// DefaultMaxEventBytes. Set it before the first Next. A negative value
	// makes Next return an error.
	MaxEventBytes int

	rd      io.Reader
	rerr    error // a read error held back until the buffer is consumed
	err     error // the error Next returns from now on
	buf     []byte
	r, w    int    // unread bytes are buf[r:w]
	started bool   // the BOM check has run
	skipLF  bool   // the last line ended with a CR at the end of the buffer
	line    []byte // a line gathered across reads

	data    []byte // the data buffer (value+LF per data line)
	hasData bool
	typ     string
	idBuf   string // the last event ID buffer
	id      string // the id field of the current block
	hasID   bool
	lastID  string // the last event ID string
}

// NewParser returns a Parser reading r, in reads of up to 64 KiB. Next
// blocks in r's Read; the caller owns r and closes it (closing it is also
// how another goroutine stops a blocked Next).
func NewParser(r io.Reader) *Parser {
	return &Parser{rd: r}
}

// LastEventID returns the last event ID string as of the last dispatch.
func (p *Parser) LastEventID() string { return p.lastID }

// Next returns the next Message. At the end of the stream it returns
// io.EOF (an unterminated event is discarded); a read error is returned as
// it is; an event past MaxEventBytes is an error wrapping
// ErrEventTooLarge. After an error, Next returns that error again.
func (p *Parser) Next() (Message, error) {
	if p.err != nil {
		return Message{}, p.err
	}
	if p.MaxEventBytes < 0 {
		p.err = fmt.Errorf("sseclient: negative MaxEventBytes %d", p.MaxEventBytes)
		return Message{}, p.err
	}
	for {
		line, err := p.readLine()
		if err != nil {
			p.err = err
			return Message{}, err
		}
		if m, ok := p.process(line); ok {
			return m, nil
		}
	}
}

func (p *Parser) max() int {
	if p.MaxEventBytes == 0 {
		return DefaultMaxEventBytes
	}
	return p.MaxEventBytes
}

// check fails when the event, with more bytes of the line being read,
// would exceed MaxEventBytes.
func (p *Parser) check(more int) error {
	if len(p.data)+len(p.typ)+len(p.line)+more > p.max() {
		return fmt.Errorf("%w (%d bytes)", ErrEventTooLarge, p.max())
	}
	return nil
}

// fill reads more bytes after the unread ones.
func (p *Parser) fill() error {
	if p.rerr != nil {
		return p.rerr
	}
	if p.buf == nil {
		p.buf = make([]byte, readSize)
	}
	if p.r > 0 {
		p.w = copy(p.buf, p.buf[p.r:p.w])
		p.r = 0
	}
	for range 100 {
		n, err := p.rd.Read(p.buf[p.w:])
		p.w += n
		if err != nil {
			p.rerr = err
		}
		if n > 0 {
			return nil
		}
		if err != nil {
			return err
		}
	}
	p.rerr = io.ErrNoProgress
	return p.rerr
}

var bom = []byte("\uFEFF")

// readLine returns the next line without its end. The slice is valid until
// the next call.
func (p *Parser) readLine() ([]byte, error) {
	for !p.started {
		n := p.w - p.r
		if n >= len(bom) || (n > 0 && !bytes.HasPrefix(bom, p.buf[p.r:p.w])) {
			if bytes.HasPrefix(p.buf[p.r:p.w], bom) {
				p.r += len(bom)
			}
			p.started = true
			break
		}
		if err := p.fill(); err != nil {
			return nil, err
		}
	}
	if cap(p.line) > readSize {
		p.line = nil // do not keep a huge line's buffer for the rest of the stream
	}
	p.line = p.line[:0]
	gathered := false
	for {
		if p.r == p.w {
			if err := p.fill(); err != nil {
				return nil, err
			}
		}
		if p.skipLF {
			p.skipLF = false
			if p.buf[p.r] == '\n' {
				p.r++
				continue
			}
		}
		chunk := p.buf[p.r:p.w]
		i := eol(chunk)
		if i < 0 {
			if err := p.check(len(chunk)); err != nil {
				return nil, err
			}
			p.line = append(p.line, chunk...)
			gathered = true
			p.r = p.w
			continue
		}
		if err := p.check(i); err != nil {
			return nil, err
		}
		line := chunk[:i]
		if gathered {
			p.line = append(p.line, line...)
			line = p.line
		}
		p.r += i + 1
		if chunk[i] == '\r' {
			if p.r < p.w {
				if p.buf[p.r] == '\n' {
					p.r++
				}
			} else {
				p.skipLF = true
			}
		}
		return line, nil
	}
}

// eol returns the index of the first CR or LF in b, or -1. Two bounded
// IndexByte scans beat one loop over both bytes by far on long lines.
func eol(b []byte) int {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		i = len(b)
	}
	if j := bytes.IndexByte(b[:i], '\r'); j >= 0 {
		return j
	}
	if i == len(b) {
		return -1
	}
	return i
}

// process interprets one line; it reports a Message when the line
// completed one.
func (p *Parser) process(line []byte) (Message, bool) {
	if len(line) == 0 {
		return p.dispatch()
	}
	if line[0] == ':' {
		return Message{Kind: KindComment, Comment: string(line[1:])}, true
	}
	name, value, found := bytes.Cut(line, []byte{':'})
	if found && len(value) > 0 && value[0] == ' ' {
		value = value[1:]
	}
	switch string(name) {
	case "data":
		if len(p.data) == 0 {
			p.data = make([]byte, 0, len(value)+1)
		}
		p.data = append(p.data, value...)
		p.data = append(p.data, '\n')
		p.hasData = true
	case "event":
		p.typ = string(value)
	case "id":
		if bytes.IndexByte(value, 0) < 0 {
			p.idBuf = string(value)
			p.id, p.hasID = p.idBuf, true
		}
	case "retry":
		if ms, ok := digits(value); ok {
			return Message{Kind: KindRetry, Retry: ms}, true
		}
	}
	return Message{}, false
}

// digits parses a retry value: one or more ASCII digits, milliseconds. A
// value too large for a Duration is clamped to the largest one.
func digits(b []byte) (time.Duration, bool) {
	if len(b) == 0 {
		return 0, false
	}
	const limit = math.MaxInt64 / int64(time.Millisecond)
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		if n <= limit {
			n = n*10 + int64(c-'0')
		}
	}
	if n > limit {
		return math.MaxInt64, true
	}
	return time.Duration(n) * time.Millisecond, true
}

func (p *Parser) dispatch() (Message, bool) {
	p.lastID = p.idBuf
	defer func() {
		p.data, p.hasData, p.typ, p.id, p.hasID = nil, false, "", "", false
	}()
	if !p.hasData {
		return Message{}, false
	}
	m := Message{
		Kind:        KindEvent,
		Type:        p.typ,
		Data:        p.data[:len(p.data)-1],
		ID:          p.id,
		HasID:       p.hasID,
		LastEventID: p.lastID,
	}
	if m.Type == "" {
		m.Type = "message"
	}
	return m, true
}
