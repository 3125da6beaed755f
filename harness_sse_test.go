package eventbus

import (
	"bytes"
	"io"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The tests of the harness's SSE reader (harness_test.go): sseclient.Parser
// under it reads the WHATWG "interpreting an event stream" rules (its own
// tests in sseclient check them further); these check what the reader adds
// on top (records in stream order, the last event ID on each event, and the
// strict end on an event boundary), on the standard's cases:
//
//   - lines end with CRLF, LF or CR (a CR at the end of one read and an LF
//     at the start of the next are one line end);
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
//     dispatched with type "message" unless the event type buffer is set.

// chunkReader returns its chunks one per Read.
type chunkReader struct{ chunks [][]byte }

func (c *chunkReader) Read(p []byte) (int, error) {
	for len(c.chunks) > 0 && len(c.chunks[0]) == 0 {
		c.chunks = c.chunks[1:]
	}
	if len(c.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.chunks[0])
	c.chunks[0] = c.chunks[0][n:]
	return n, nil
}

// readSplit reads in as two reads, cut at i.
func readSplit(in string, i int) ([]sseRecord, error) {
	return readSSE(&chunkReader{chunks: [][]byte{[]byte(in[:i]), []byte(in[i:])}})
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

			// Every split into two reads, and byte by byte, parses the same.
			for i := 0; i <= len(tc.in); i++ {
				recs, err := readSplit(tc.in, i)
				require.Equal(t, tc.want, recs, "split at %d", i)
				require.NoError(t, err, "split at %d", i)
			}
			recs, err := readSSE(iotest.OneByteReader(bytes.NewReader([]byte(tc.in))))
			require.NoError(t, err)
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

func TestSSEParserRetryKeepsOnlyValidValues(t *testing.T) {
	recs, err := parseSSE([]byte("retry: 10\nretry: x\n\n"))
	require.NoError(t, err)
	require.Equal(t, []sseRecord{{Kind: sseRetryRecord, Retry: 10}}, recs, "an invalid retry is no record")
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

// FuzzSSEParserSplit checks the harness's SSE reader: how the stream is cut
// into reads never changes what it reports, nor whether it ended on an
// event boundary.
func FuzzSSEParserSplit(f *testing.F) {
	f.Add("event: a\r\ndata: x\r\n\r\n", uint(9))
	f.Add("data: 1\rdata: 2\r\r: c\n", uint(8))
	f.Add("\uFEFFid: 1\x00\ndata\n\n", uint(1))
	f.Add("retry: 12\nretry: x\n\n", uint(3))
	f.Fuzz(func(t *testing.T, in string, cut uint) {
		whole, errWhole := parseSSE([]byte(in))
		i := int(cut % uint(len(in)+1))
		parts, errParts := readSplit(in, i)
		require.Equal(t, whole, parts)
		require.Equal(t, errWhole, errParts)
		for _, r := range whole {
			if r.Kind == sseEventRecord {
				require.NotEmpty(t, r.Event.Type)
				require.NotContains(t, r.Event.ID, "\x00")
			}
		}
	})
}
