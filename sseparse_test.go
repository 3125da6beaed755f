package eventbus

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sseParser is a strict, incremental parser of a text/event-stream, written
// from the WHATWG "interpreting an event stream" rules, for tests:
//
//   - lines end with CRLF, LF or CR (a CR at the end of one Feed and an LF at
//     the start of the next are one line end);
//   - a leading U+FEFF BOM of the stream is skipped;
//   - a line starting with ':' is a comment;
//   - "field:value" splits at the first colon and drops one leading space of
//     the value; a line without a colon is a field with an empty value;
//   - event sets the event type buffer, data appends value+LF to the data
//     buffer, id sets the last event ID buffer unless the value contains NUL,
//     retry sets the reconnection time when the value is ASCII digits only,
//     any other field is ignored;
//   - a blank line dispatches: the last event ID string takes the buffer's
//     value (it persists across events), then an empty data buffer dispatches
//     nothing; otherwise one trailing LF is removed and an event is
//     dispatched with type "message" unless the event type buffer is set;
//     data and event type buffers are reset, the last event ID is not.
//
// It works on bytes: the standard's UTF-8 decode step (which would replace
// invalid sequences with U+FFFD) is left out, so tests can compare exactly
// the bytes the server sent. Besides events it reports comments and retry
// directives in stream order, so tests can check heartbeats and "retry:".
type sseParser struct {
	started  bool   // the BOM check has run
	skipLF   bool   // the previous chunk ended with CR
	line     []byte // the incomplete line carried between Feeds
	data     strings.Builder
	hasData  bool // the data buffer is not empty (data: with an empty value counts)
	evType   string
	idBuf    string // the last event ID buffer
	lastID   string // the last event ID string, set on dispatch
	retry    int64  // the reconnection time in ms, -1 before any retry field
	retrySet bool
}

// sseRecordKind says what an sseRecord holds.
type sseRecordKind int

const (
	sseEventRecord sseRecordKind = iota
	sseCommentRecord
	sseRetryRecord
)

// sseRecord is one thing the parser saw, in stream order.
type sseRecord struct {
	Kind    sseRecordKind
	Event   sseEvent // sseEventRecord
	Comment string   // sseCommentRecord: the line without its ':'
	Retry   int64    // sseRetryRecord: milliseconds
}

// sseEvent is one dispatched event.
type sseEvent struct {
	Type string // "message" when the stream set none
	Data string
	ID   string // the last event ID string at dispatch
}

func newSSEParser() *sseParser { return &sseParser{retry: -1} }

// Feed parses p and returns what it completed, in order.
func (p *sseParser) Feed(b []byte) []sseRecord {
	var out []sseRecord
	if !p.started {
		// Hold back until it is clear whether the stream starts with a BOM.
		p.line = append(p.line, b...)
		if len(p.line) < 3 && strings.HasPrefix("\uFEFF", string(p.line)) {
			return nil
		}
		p.started = true
		b = p.line
		p.line = nil
		if strings.HasPrefix(string(b), "\uFEFF") {
			b = b[3:]
		}
	}
	for len(b) > 0 {
		if p.skipLF {
			p.skipLF = false
			if b[0] == '\n' {
				b = b[1:]
				continue
			}
		}
		i := strings.IndexAny(string(b), "\r\n")
		if i < 0 {
			p.line = append(p.line, b...)
			return out
		}
		var line []byte
		if len(p.line) > 0 {
			line = append(p.line, b[:i]...)
			p.line = nil
		} else {
			line = b[:i]
		}
		if b[i] == '\r' {
			if i+1 < len(b) {
				if b[i+1] == '\n' {
					i++
				}
			} else {
				p.skipLF = true
			}
		}
		b = b[i+1:]
		out = p.processLine(string(line), out)
	}
	return out
}

func (p *sseParser) processLine(line string, out []sseRecord) []sseRecord {
	if line == "" {
		return p.dispatch(out)
	}
	if line[0] == ':' {
		return append(out, sseRecord{Kind: sseCommentRecord, Comment: line[1:]})
	}
	field, value := line, ""
	if i := strings.IndexByte(line, ':'); i >= 0 {
		field, value = line[:i], line[i+1:]
		value = strings.TrimPrefix(value, " ")
	}
	switch field {
	case "event":
		p.evType = value
	case "data":
		p.data.WriteString(value)
		p.data.WriteByte('\n')
		p.hasData = true
	case "id":
		if !strings.ContainsRune(value, 0) {
			p.idBuf = value
		}
	case "retry":
		if n, ok := sseDigits(value); ok {
			p.retry, p.retrySet = n, true
			out = append(out, sseRecord{Kind: sseRetryRecord, Retry: n})
		}
	}
	return out
}

// sseDigits reports whether v is one or more ASCII digits and its value
// (values past int64 are ignored like any other unusable retry).
func sseDigits(v string) (int64, bool) {
	if v == "" {
		return 0, false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil
}

func (p *sseParser) dispatch(out []sseRecord) []sseRecord {
	p.lastID = p.idBuf
	if !p.hasData {
		p.data.Reset()
		p.evType = ""
		return out
	}
	data := strings.TrimSuffix(p.data.String(), "\n")
	typ := p.evType
	if typ == "" {
		typ = "message"
	}
	p.data.Reset()
	p.hasData = false
	p.evType = ""
	return append(out, sseRecord{Kind: sseEventRecord, Event: sseEvent{Type: typ, Data: data, ID: p.lastID}})
}

// errSSEIncomplete is what Close reports when the stream ended inside a
// line or inside an event: a browser would silently discard it, a strict
// test treats it as a framing error.
var errSSEIncomplete = errors.New("sse: stream ended inside an event")

// Close ends the stream. Pending data is discarded, as the standard says;
// Close reports errSSEIncomplete when there was any.
func (p *sseParser) Close() error {
	pending := len(p.line) > 0 || p.hasData || p.evType != "" || p.idBuf != p.lastID
	p.line = nil
	p.data.Reset()
	p.hasData, p.evType = false, ""
	if pending {
		return errSSEIncomplete
	}
	return nil
}

// parseSSE parses a whole stream; strict reports a stream that does not
// end on an event boundary.
func parseSSE(b []byte) (recs []sseRecord, err error) {
	p := newSSEParser()
	recs = p.Feed(b)
	if !p.started && len(p.line) > 0 {
		// A stream shorter than a BOM: finish the BOM check.
		p.started = true
		rest := p.line
		p.line = nil
		recs = append(recs, p.Feed(rest)...)
	}
	return recs, p.Close()
}

// sseEvents keeps only the events of recs.
func sseEvents(recs []sseRecord) []sseEvent {
	var evs []sseEvent
	for _, r := range recs {
		if r.Kind == sseEventRecord {
			evs = append(evs, r.Event)
		}
	}
	return evs
}

func TestSSEParser(t *testing.T) {
	ev := func(typ, data, id string) sseRecord {
		return sseRecord{Kind: sseEventRecord, Event: sseEvent{Type: typ, Data: data, ID: id}}
	}
	comment := func(c string) sseRecord { return sseRecord{Kind: sseCommentRecord, Comment: c} }
	retry := func(n int64) sseRecord { return sseRecord{Kind: sseRetryRecord, Retry: n} }

	tests := []struct {
		name string
		in   string
		want []sseRecord
	}{
		{"LF", "event: a\ndata: x\n\n", []sseRecord{ev("a", "x", "")}},
		{"CRLF", "event: a\r\ndata: x\r\n\r\n", []sseRecord{ev("a", "x", "")}},
		{"CR", "event: a\rdata: x\r\r", []sseRecord{ev("a", "x", "")}},
		{"mixed line ends", "data: 1\r\ndata: 2\rdata: 3\n\r\n", []sseRecord{ev("message", "1\n2\n3", "")}},
		{"CR CR is two line ends", "data: x\r\r", []sseRecord{ev("message", "x", "")}},
		{"LF CR is two line ends", "data: x\n\r", []sseRecord{ev("message", "x", "")}},
		{"default type is message", "data: x\n\n", []sseRecord{ev("message", "x", "")}},
		{"multiple data lines joined by LF", "data: a\ndata: b\ndata:\ndata: c\n\n", []sseRecord{ev("message", "a\nb\n\nc", "")}},
		{"one leading space stripped once", "data:  two\ndata:none\n\n", []sseRecord{ev("message", " two\nnone", "")}},
		{"only the first colon splits", "data: a: b:c\n\n", []sseRecord{ev("message", "a: b:c", "")}},
		{"field without colon has empty value", "data\ndata\n\n", []sseRecord{ev("message", "\n", "")}},
		{"single empty data line dispatches an empty event", "data\n\n", []sseRecord{ev("message", "", "")}},
		{"empty data buffer dispatches nothing", "event: a\n\nid: 3\n\n", nil},
		{"comment", ": heartbeat\n\n", []sseRecord{comment(" heartbeat")}},
		{"comment inside an event", "data: a\n:c\ndata: b\n\n", []sseRecord{comment("c"), ev("message", "a\nb", "")}},
		{"retry digits", "retry: 3000\n\n", []sseRecord{retry(3000)}},
		{"retry leading zeros", "retry: 0042\n\n", []sseRecord{retry(42)}},
		{"retry not digits ignored", "retry: 30s\nretry: -1\nretry: +1\nretry:  1\nretry:\nretry: 1.5\n\n", nil},
		{"id persists across events", "id: 7\ndata: a\n\ndata: b\n\nid: 8\ndata: c\n\n",
			[]sseRecord{ev("message", "a", "7"), ev("message", "b", "7"), ev("message", "c", "8")}},
		{"id with NUL ignored", "id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n",
			[]sseRecord{ev("message", "a", "1"), ev("message", "b", "1")}},
		{"empty id resets", "id: 1\ndata: a\n\nid\ndata: b\n\n",
			[]sseRecord{ev("message", "a", "1"), ev("message", "b", "")}},
		{"id-only block sets the last event id", "id: 5\n\ndata: a\n\n", []sseRecord{ev("message", "a", "5")}},
		{"event type reset after dispatch", "event: a\ndata: 1\n\ndata: 2\n\n", []sseRecord{ev("a", "1", ""), ev("message", "2", "")}},
		{"last event field wins", "event: a\nevent: b\ndata: x\n\n", []sseRecord{ev("b", "x", "")}},
		{"empty event type means message", "event:\ndata: x\n\n", []sseRecord{ev("message", "x", "")}},
		{"unknown field ignored", "foo: bar\nData: x\ndata: y\n\n", []sseRecord{ev("message", "y", "")}},
		{"field names are case sensitive", "EVENT: a\ndata: y\n\n", []sseRecord{ev("message", "y", "")}},
		{"field name with space is unknown", "data : y\n\n", nil},
		{"leading BOM skipped", "\uFEFFdata: x\n\n", []sseRecord{ev("message", "x", "")}},
		{"second BOM is part of the field", "\uFEFF\uFEFFdata: x\n\n", nil},
		{"NUL in data kept", "data: a\x00b\n\n", []sseRecord{ev("message", "a\x00b", "")}},
		{"frame of the bus", "id: 42\nevent: session_update\ndata: {\"id\":42}\n\n", []sseRecord{ev("session_update", `{"id":42}`, "42")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseSSE([]byte(tc.in))
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)

			// Every split into two chunks, and byte by byte, parses the same.
			for i := 0; i <= len(tc.in); i++ {
				p := newSSEParser()
				recs := append(p.Feed([]byte(tc.in[:i])), p.Feed([]byte(tc.in[i:]))...)
				require.Equal(t, tc.want, recs, "split at %d", i)
				require.NoError(t, p.Close(), "split at %d", i)
			}
			p := newSSEParser()
			var recs []sseRecord
			for i := 0; i < len(tc.in); i++ {
				recs = append(recs, p.Feed([]byte{tc.in[i]})...)
			}
			require.Equal(t, tc.want, recs, "byte by byte")
		})
	}
}

func TestSSEParserIncompleteStream(t *testing.T) {
	for _, in := range []string{
		"data: x",            // inside a line
		"data: x\n",          // inside an event
		"event: a\n",         // only a type
		"id: 3\n",            // an id not dispatched yet
		"data: x\r",          // CR ends the line, the event is still open
		"data: a\n\ndata: b", // the second event is cut
	} {
		recs, err := parseSSE([]byte(in))
		require.ErrorIs(t, err, errSSEIncomplete, "%q", in)
		for _, r := range recs {
			// Only complete events are dispatched; a cut one never is.
			require.NotEqual(t, "b", r.Event.Data, "%q", in)
		}
	}
	recs, err := parseSSE([]byte("data: a\n\ndata: b"))
	require.ErrorIs(t, err, errSSEIncomplete)
	require.Equal(t, []sseEvent{{Type: "message", Data: "a"}}, sseEvents(recs))
}

func TestSSEParserRetryState(t *testing.T) {
	p := newSSEParser()
	require.Equal(t, int64(-1), p.retry)
	p.Feed([]byte("retry: 10\nretry: x\n\n"))
	require.True(t, p.retrySet)
	require.Equal(t, int64(10), p.retry, "an invalid retry leaves the previous one")
	p.Feed([]byte("retry: 99999999999999999999999\n\n"))
	require.Equal(t, int64(10), p.retry, "a retry past int64 is ignored")
}

func TestSSEParserShortStreams(t *testing.T) {
	for _, in := range []string{"", "\xEF", "\xEF\xBB", "\uFEFF"} {
		recs, err := parseSSE([]byte(in))
		require.Empty(t, recs, "%q", in)
		if in == "" || in == "\uFEFF" {
			require.NoError(t, err, "%q", in)
		} else {
			require.ErrorIs(t, err, errSSEIncomplete, "%q", in)
		}
	}
}
