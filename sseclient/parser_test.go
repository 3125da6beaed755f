package sseclient_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/sseclient"
)

// rec is a Message in a comparable, printable form.
type rec struct {
	Kind                        sseclient.Kind
	Type, Data, ID, LastEventID string
	HasID                       bool
	Comment                     string
	Retry                       time.Duration
}

func recOf(m sseclient.Message) rec {
	return rec{m.Kind, m.Type, string(m.Data), m.ID, m.LastEventID, m.HasID, m.Comment, m.Retry}
}

func evRec(typ, data, id string, hasID bool, last string) rec {
	return rec{Kind: sseclient.KindEvent, Type: typ, Data: data, ID: id, HasID: hasID, LastEventID: last}
}

// parseAll reads r to its end and returns every Message and the error
// that ended it (nil for io.EOF).
func parseAll(r io.Reader, max int) ([]rec, error) {
	p := sseclient.NewParser(r)
	p.MaxEventBytes = max
	var out []rec
	for {
		m, err := p.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, recOf(m))
	}
}

// chunks reads s in pieces of n bytes.
type chunks struct {
	b []byte
	n int
}

func (c *chunks) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	k := min(c.n, len(p), len(c.b))
	copy(p, c.b[:k])
	c.b = c.b[k:]
	return k, nil
}

// splitReader returns the stream in two reads, cut at i.
func splitReader(s string, i int) io.Reader {
	return io.MultiReader(strings.NewReader(s[:i]), strings.NewReader(s[i:]))
}

// readers yields s cut at every position, one byte at a time, and whole.
func readers(s string) map[string]io.Reader {
	m := map[string]io.Reader{"whole": strings.NewReader(s), "bytes": iotest.OneByteReader(strings.NewReader(s))}
	for i := 0; i <= len(s); i++ {
		m[fmt.Sprint("cut ", i)] = splitReader(s, i)
	}
	return m
}

func checkAll(t *testing.T, s string, want []rec) {
	t.Helper()
	for name, r := range readers(s) {
		got, err := parseAll(r, 0)
		if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%q read %s:\n got %v (%v)\nwant %v", s, name, got, err, want)
		}
	}
}

func TestParserLineEndsAtEverySplit(t *testing.T) {
	want := []rec{evRec("a", "1\n2", "7", true, "7"), evRec("message", "3", "", false, "7")}
	for _, s := range []string{
		"event: a\ndata: 1\ndata: 2\nid: 7\n\ndata: 3\n\n",
		"event: a\r\ndata: 1\r\ndata: 2\r\nid: 7\r\n\r\ndata: 3\r\n\r\n",
		"event: a\rdata: 1\rdata: 2\rid: 7\r\rdata: 3\r\r",
		"event: a\r\ndata: 1\rdata: 2\nid: 7\r\n\rdata: 3\n\r\n",
	} {
		checkAll(t, s, want)
	}
}

func TestParserBOMCommentsFieldsRetryID(t *testing.T) {
	checkAll(t, "\uFEFFdata: x\n\n", []rec{evRec("message", "x", "", false, "")})
	// Only one BOM, and only at the start.
	checkAll(t, "\uFEFF\uFEFFdata: x\n\n", nil)
	checkAll(t, ": heartbeat\n:\ndata\n\ndata:  two\nfoo: bar\nevent\ndata:x\n\n", []rec{
		{Kind: sseclient.KindComment, Comment: " heartbeat"},
		{Kind: sseclient.KindComment},
		evRec("message", "", "", false, ""),
		evRec("message", " two\nx", "", false, ""),
	})
	checkAll(t, "retry: 3000\n\n: heartbeat\n\nid: 5\n\n", []rec{
		{Kind: sseclient.KindRetry, Retry: 3 * time.Second},
		{Kind: sseclient.KindComment, Comment: " heartbeat"},
	})
	checkAll(t, "retry: 10\nretry: 1x\nretry: -1\nretry:\nretry: 1.5\nretry:  20\nretry:0042\nretry: 99999999999999999999999\n\n", []rec{
		{Kind: sseclient.KindRetry, Retry: 10 * time.Millisecond},
		{Kind: sseclient.KindRetry, Retry: 42 * time.Millisecond},
		{Kind: sseclient.KindRetry, Retry: time.Duration(1<<63 - 1)},
	})
	checkAll(t, "id: 1\ndata: a\n\ndata: b\n\nid: 2\n\ndata: c\n\nid: x\x00y\ndata: d\n\nid\ndata: e\n\n", []rec{
		evRec("message", "a", "1", true, "1"),
		evRec("message", "b", "", false, "1"),
		evRec("message", "c", "", false, "2"),
		evRec("message", "d", "", false, "2"),
		evRec("message", "e", "", true, ""),
	})
	checkAll(t, "Data: x\ndata : y\nEVENT: z\n\n", nil)
	// The end of the stream discards an unterminated event.
	checkAll(t, "data: a\n\ndata: b\n", []rec{evRec("message", "a", "", false, "")})
	// Bytes as sent: no UTF-8 repair.
	checkAll(t, "data: \xff\xc3\n\n", []rec{evRec("message", "\xff\xc3", "", false, "")})
}

func TestParserLongLinesAndMaxEventBytes(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	for _, size := range []int{1, 7919, 64 << 10, 1 << 20} {
		got, err := parseAll(&chunks{b: []byte("event: big\ndata: " + big[:200<<10] + "\ndata: " + big + "\n\n"), n: size}, 0)
		if err != nil || len(got) != 1 || got[0].Data != big[:200<<10]+"\n"+big {
			t.Fatalf("chunks of %d: %d records, %v", size, len(got), err)
		}
	}
	// The bound is what one event holds: data, type and the line being read.
	_, err := parseAll(strings.NewReader("data: "+strings.Repeat("a", 94)+"\n\n"), 100)
	if err != nil {
		t.Fatalf("a 100-byte line with a 100-byte bound: %v", err)
	}
	for _, s := range []string{
		"data: " + strings.Repeat("a", 95),                                               // one partial line
		"data: " + strings.Repeat("a", 50) + "\ndata: " + strings.Repeat("b", 50) + "\n", // two lines
		"event: " + strings.Repeat("t", 60) + "\ndata: " + strings.Repeat("d", 40) + "\n",
		": " + strings.Repeat("c", 200) + "\n", // a comment line counts while it is read
	} {
		_, err := parseAll(iotest.OneByteReader(strings.NewReader(s)), 100)
		if !errors.Is(err, sseclient.ErrEventTooLarge) {
			t.Fatalf("%.20q...: %v, want ErrEventTooLarge", s, err)
		}
	}
	got, err := parseAll(strings.NewReader(strings.Repeat("data: "+strings.Repeat("c", 80)+"\n\n", 100)), 100)
	if err != nil || len(got) != 100 {
		t.Fatalf("many events under the bound: %d, %v", len(got), err)
	}
	p := sseclient.NewParser(strings.NewReader("data: x\n\n"))
	p.MaxEventBytes = -1
	if _, err := p.Next(); err == nil {
		t.Fatal("negative MaxEventBytes accepted")
	}
}

func TestParserErrors(t *testing.T) {
	boom := errors.New("boom")
	p := sseclient.NewParser(io.MultiReader(strings.NewReader("data: a\n\ndata: b"), iotest.ErrReader(boom)))
	if m, err := p.Next(); err != nil || string(m.Data) != "a" {
		t.Fatalf("first: %v %v", m, err)
	}
	for range 2 {
		if _, err := p.Next(); !errors.Is(err, boom) {
			t.Fatalf("read error: %v", err)
		}
	}
	p = sseclient.NewParser(zeroReader{})
	if _, err := p.Next(); !errors.Is(err, io.ErrNoProgress) {
		t.Fatalf("a reader that returns nothing: %v", err)
	}
}

type zeroReader struct{}

func (zeroReader) Read([]byte) (int, error) { return 0, nil }

func TestParserOwnsNothingItReturns(t *testing.T) {
	p := sseclient.NewParser(strings.NewReader("data: first\n\ndata: second\n\n"))
	a, _ := p.Next()
	b, _ := p.Next()
	if string(a.Data) != "first" || string(b.Data) != "second" || p.LastEventID() != "" {
		t.Fatalf("%q %q", a.Data, b.Data)
	}
}

// TestParserReadsTheHandlersWire parses what the real eventbus.Handler
// writes, with both id forms: retry:, events, a synthetic frame, and the
// heartbeats (the retry: line again after an event, then bare comments),
// none of them a blank-line block of its own.
func TestParserReadsTheHandlersWire(t *testing.T) {
	for _, epochIDs := range []bool{false, true} {
		s := newServer(t, serverConfig{handler: func(h *eventbus.Handler) {
			h.Retry, h.RetryJitter = 1500*time.Millisecond, -1
			h.Heartbeat = 20 * time.Millisecond
			h.BareIDs = !epochIDs
		}})
		s.publish("a", "note", map[string]string{"x": "\n\ndata: injected"})
		resp, err := http.Get(s.url("a") + "?lastEventId=0")
		if err != nil {
			t.Fatal(err)
		}
		p := sseclient.NewParser(resp.Body)
		var kinds []string
		for len(kinds) < 6 {
			m, err := p.Next()
			if err != nil {
				t.Fatal(err)
			}
			switch m.Kind {
			case sseclient.KindRetry:
				kinds = append(kinds, fmt.Sprint("retry ", m.Retry))
			case sseclient.KindComment:
				kinds = append(kinds, "comment"+m.Comment)
			case sseclient.KindEvent:
				kinds = append(kinds, m.Type+" "+m.ID)
				if m.Type == "note" && !bytes.Contains(m.Data, []byte(`\n\ndata: injected`)) {
					t.Fatalf("data %s", m.Data)
				}
			}
		}
		resp.Body.Close()
		id := "1"
		if epochIDs {
			id = s.bus("a").Epoch() + ":1"
		}
		if got, want := strings.Join(kinds, ","), "retry 1.5s,note "+id+",replay_complete ,retry 1.5s,comment,comment"; got != want {
			t.Fatalf("EpochIDs %v: read %s, want %s", epochIDs, got, want)
		}
	}
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
}

// reference is a plain, non-incremental reading of the same rules: split
// the whole stream into lines first, then interpret them.
func reference(b []byte) []rec {
	b = bytes.TrimPrefix(b, []byte("\uFEFF"))
	var lines []string
	for {
		i := bytes.IndexAny(b, "\r\n")
		if i < 0 {
			break // an unterminated last line is never complete
		}
		lines = append(lines, string(b[:i]))
		if b[i] == '\r' && i+1 < len(b) && b[i+1] == '\n' {
			i++
		}
		b = b[i+1:]
	}
	var out []rec
	var data []string
	typ, idBuf, id, last := "", "", "", ""
	hasData, hasID := false, false
	for _, l := range lines {
		switch {
		case l == "":
			last = idBuf
			if hasData {
				t := typ
				if t == "" {
					t = "message"
				}
				out = append(out, evRec(t, strings.Join(data, "\n"), id, hasID, last))
			}
			data, typ, id, hasData, hasID = nil, "", "", false, false
		case l[0] == ':':
			out = append(out, rec{Kind: sseclient.KindComment, Comment: l[1:]})
		default:
			name, value, found := strings.Cut(l, ":")
			if found {
				value = strings.TrimPrefix(value, " ")
			}
			switch name {
			case "data":
				data, hasData = append(data, value), true
			case "event":
				typ = value
			case "id":
				if !strings.Contains(value, "\x00") {
					idBuf, id, hasID = value, value, true
				}
			case "retry":
				if value != "" && strings.Trim(value, "0123456789") == "" {
					d := time.Duration(math.MaxInt64) // past what a Duration holds: clamped
					if ms, err := strconv.ParseInt(value, 10, 64); err == nil && ms <= math.MaxInt64/int64(time.Millisecond) {
						d = time.Duration(ms) * time.Millisecond
					}
					out = append(out, rec{Kind: sseclient.KindRetry, Retry: d})
				}
			}
		}
	}
	return out
}

// FuzzParser checks the incremental parser against the plain reading,
// whatever the chunking.
func FuzzParser(f *testing.F) {
	for _, s := range []string{
		"event: a\r\ndata: 1\rdata: 2\nid: 7\r\n\rdata: 3\n\r\n",
		"\uFEFFretry: 30\n\n: c\nid: 1\x00\ndata:\n\n",
		"data: x\r",
		"\xef\xbb",
		"id: 1\ndata: a\n\nid\ndata: b\n\n",
	} {
		f.Add([]byte(s), uint8(1))
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, b []byte, n uint8) {
		want := reference(b)
		got, err := parseAll(&chunks{b: b, n: int(n)%13 + 1}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%q in chunks of %d:\n got %v\nwant %v", b, int(n)%13+1, got, want)
		}
	})
}
