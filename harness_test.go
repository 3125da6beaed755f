package eventbus

// The test harness every test file of the package shares: the fixed and the
// fake clock, the bus constructor, the log capture, the SSE reader and
// client (on the repository's own sseclient.Parser), and how long a test
// runs (-short, EVENTBUS_LONG=1).

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ssebus/eventbus/sseclient"
)

// ---------------------------------------------------------------------------
// How long a test runs.

// proveLong reports whether the long forms of the "prove it holds" tests
// run (EVENTBUS_LONG=1): more fuzz seeds, longer chaos, soak and memory
// runs. The normal forms run in `go test -race -count=1 ./...`, the short
// ones under -short.
func proveLong() bool { return os.Getenv("EVENTBUS_LONG") == "1" }

// pick returns short under -short, long with EVENTBUS_LONG=1 (and no
// -short), else normal: the one place a test chooses how much work it does.
func pick[T any](short, normal, long T) T {
	switch {
	case testing.Short():
		return short
	case proveLong():
		return long
	}
	return normal
}

// skipIfShort skips a test that has no short form under -short, saying why
// it is long. The normal run (no -short) always runs it.
func skipIfShort(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: " + why)
	}
}

// ---------------------------------------------------------------------------
// Clocks.

// testStamp is the fixed clock of the test buses: every serverTimestamp
// they stamp is this value, in Unix milliseconds.
const testStamp = 1719000000000

// testNow is the fixed clock (Options.Now) of newBus.
func testNow() time.Time { return time.UnixMilli(testStamp) }

// fakeClock is an Options.Now that only moves when told; safe for
// concurrent use.
type fakeClock struct{ ms atomic.Int64 }

func newFakeClock(ms int64) *fakeClock {
	c := &fakeClock{}
	c.ms.Store(ms)
	return c
}

func (c *fakeClock) now() time.Time          { return time.UnixMilli(c.ms.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }

// ---------------------------------------------------------------------------
// The bus.

// newBus returns a bus with the fixed clock and a discarding logger unless
// opts says otherwise (logs.capture(opts) routes both to a logCapture); it
// is closed when the test ends.
func newBus(t testing.TB, opts Options) *EventBus {
	t.Helper()
	if opts.Now == nil {
		opts.Now = testNow
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	b, err := New(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// subscribe subscribes with a background context; the subscription is
// closed when the test ends.
func subscribe(t testing.TB, b *EventBus, opts SubscribeOptions) *Subscription {
	t.Helper()
	s, err := b.Subscribe(context.Background(), opts)
	require.NoError(t, err)
	require.NotNil(t, s)
	t.Cleanup(s.Close)
	return s
}

// readyNow returns every frame ready now, without waiting.
func readyNow(s *Subscription) []Frame {
	fs, _ := s.AppendReady(nil)
	return fs
}

// ---------------------------------------------------------------------------
// Logs.

// logCapture records what a bus or a Handler logs: each slog record (as a
// capturedLog, and rendered as a JSON line like slog.NewJSONHandler writes
// it) and, as the bus's OnDiagnostic, each Diagnostic. Safe for concurrent
// use; the zero value is ready.
type logCapture struct {
	mu   sync.Mutex
	recs []capturedLog
	text bytes.Buffer
	json slog.Handler // writes to text
}

type capturedLog struct {
	Kind  string // the Diagnostic kind; "" for a log record
	Msg   string
	Attrs map[string]string
}

func (c *logCapture) Enabled(context.Context, slog.Level) bool { return true }

func (c *logCapture) Handle(ctx context.Context, r slog.Record) error {
	l := capturedLog{Msg: r.Message, Attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		l.Attrs[a.Key] = a.Value.String()
		return true
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recs = append(c.recs, l)
	if c.json == nil {
		c.json = slog.NewJSONHandler(&c.text, nil)
	}
	return c.json.Handle(ctx, r)
}

func (c *logCapture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *logCapture) WithGroup(string) slog.Handler      { return c }
func (c *logCapture) logger() *slog.Logger               { return slog.New(c) }

// capture returns opts with the logger and OnDiagnostic writing to c.
func (c *logCapture) capture(opts Options) Options {
	opts.Logger = c.logger()
	opts.OnDiagnostic = c.diag
	return opts
}

// diag is an Options.OnDiagnostic that records and suppresses the log line.
func (c *logCapture) diag(d Diagnostic) bool {
	l := capturedLog{Kind: d.Kind, Msg: d.Message, Attrs: map[string]string{}}
	for _, a := range d.Attrs {
		l.Attrs[a.Key] = a.Value.String()
	}
	c.mu.Lock()
	c.recs = append(c.recs, l)
	c.mu.Unlock()
	return true
}

// String returns the log records as JSON lines, one per record.
func (c *logCapture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.text.String()
}

// find returns the records whose message contains substr.
func (c *logCapture) find(substr string) []capturedLog {
	return c.filter(func(l capturedLog) bool { return strings.Contains(l.Msg, substr) })
}

// kind returns the diagnostics of that kind.
func (c *logCapture) kind(kind string) []capturedLog {
	return c.filter(func(l capturedLog) bool { return l.Kind == kind })
}

func (c *logCapture) filter(keep func(capturedLog) bool) []capturedLog {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []capturedLog
	for _, l := range c.recs {
		if keep(l) {
			out = append(out, l)
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// SSE: a strict reader on sseclient.Parser, and a client of a response.

// sseRecordKind says what an sseRecord holds.
type sseRecordKind int

const (
	sseEventRecord sseRecordKind = iota
	sseCommentRecord
	sseRetryRecord
)

// sseRecord is one thing the reader saw, in stream order.
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

// errSSEIncomplete is what an sseReader reports when the stream ended
// inside a line or inside an event: a browser would silently discard it, a
// strict test treats it as a framing error.
var errSSEIncomplete = errors.New("sse: stream ended inside an event")

// sseProbe is what an sseReader appends to a stream that ended, to learn
// whether it ended on an event boundary: from a clean state the parser
// dispatches it alone as an event of type "message" with data sseProbeMark
// and no id field. Anything pending changes that: a cut line swallows the
// "data" field name (no event, or a comment or data ending in the mark), a
// pending data field prefixes the data, an event field sets the type, an id
// field sets HasID. The server never sends a NUL.
const (
	sseProbeMark = "\x00end-of-stream probe\x00"
	sseProbe     = "data:" + sseProbeMark + "\n\n"
)

// sseReader reads a text/event-stream through sseclient.Parser, strictly:
// at the end it reports io.EOF only when the stream ended on an event
// boundary, else errSSEIncomplete. It keeps every byte it read (raw).
type sseReader struct {
	p   *sseclient.Parser
	src *sseProbeReader
	msg sseclient.Message // the last message next returned, as the parser gave it
	err error             // the error next returns from now on
}

func newSSEReader(r io.Reader) *sseReader {
	src := &sseProbeReader{r: r}
	p := sseclient.NewParser(src)
	p.MaxEventBytes = 1 << 40 // no bound: tests check sizes themselves
	return &sseReader{p: p, src: src}
}

// raw returns the bytes of the stream read so far.
func (s *sseReader) raw() []byte { return s.src.raw }

// next returns the next record, io.EOF at a clean end, errSSEIncomplete at
// a cut one, or the read error.
func (s *sseReader) next() (sseRecord, error) {
	if s.err != nil {
		return sseRecord{}, s.err
	}
	m, err := s.p.Next()
	switch {
	case err == io.EOF && s.src.sent:
		// The stream ended and the probe was swallowed by a cut line.
		s.err = errSSEIncomplete
	case err != nil:
		s.err = err
	case s.src.sent && isProbe(m):
		s.err = io.EOF
		if m.Kind != sseclient.KindEvent || m.Type != "message" || string(m.Data) != sseProbeMark || m.HasID {
			s.err = errSSEIncomplete
		}
	}
	if s.err != nil {
		return sseRecord{}, s.err
	}
	s.msg = m
	switch m.Kind {
	case sseclient.KindComment:
		return sseRecord{Kind: sseCommentRecord, Comment: m.Comment}, nil
	case sseclient.KindRetry:
		return sseRecord{Kind: sseRetryRecord, Retry: m.Retry.Milliseconds()}, nil
	}
	return sseRecord{Kind: sseEventRecord, Event: sseEvent{Type: m.Type, Data: string(m.Data), ID: m.LastEventID}}, nil
}

// isProbe reports whether m holds (the end of) the probe.
func isProbe(m sseclient.Message) bool {
	return strings.HasSuffix(string(m.Data), sseProbeMark) || strings.HasSuffix(m.Comment, sseProbeMark)
}

// lastEventID returns the parser's last event ID string.
func (s *sseReader) lastEventID() string { return s.p.LastEventID() }

// sseProbeReader passes r's bytes through, keeping them, and when r ends
// (io.EOF) reads sseProbe before its own io.EOF.
type sseProbeReader struct {
	r     io.Reader
	raw   []byte
	probe *strings.Reader // set when r ended
	sent  bool            // some of the probe was read
}

func (p *sseProbeReader) Read(b []byte) (int, error) {
	if p.probe != nil {
		n, err := p.probe.Read(b)
		p.sent = p.sent || n > 0
		return n, err
	}
	n, err := p.r.Read(b)
	p.raw = append(p.raw, b[:n]...)
	if err == io.EOF {
		p.probe = strings.NewReader(sseProbe)
		err = nil
	}
	return n, err
}

// readSSE reads r to its end.
func readSSE(r io.Reader) ([]sseRecord, error) {
	s := newSSEReader(r)
	var recs []sseRecord
	for {
		rec, err := s.next()
		if err == io.EOF {
			return recs, nil
		}
		if err != nil {
			return recs, err
		}
		recs = append(recs, rec)
	}
}

// parseSSE parses a whole stream; errSSEIncomplete says it does not end on
// an event boundary.
func parseSSE(b []byte) ([]sseRecord, error) { return readSSE(bytes.NewReader(b)) }

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

// sseStream is a test's client of one SSE response: it reads the body
// through the strict reader and fails the test when the stream ends before
// what it waits for. Not safe for concurrent use.
type sseStream struct {
	t    testing.TB
	resp *http.Response
	r    *sseReader
}

func newSSEStream(t testing.TB, resp *http.Response) *sseStream {
	return &sseStream{t: t, resp: resp, r: newSSEReader(resp.Body)}
}

// close closes the response body (a client hanging up).
func (c *sseStream) close() { _ = c.resp.Body.Close() }

// raw returns the bytes of the body read so far.
func (c *sseStream) raw() []byte { return c.r.raw() }

// next returns the next record; the stream must not end before it.
func (c *sseStream) next() sseRecord {
	c.t.Helper()
	r, err := c.r.next()
	if err != nil {
		raw := c.raw()
		require.FailNow(c.t, "stream ended early", "%v; last bytes %q", err, raw[max(0, len(raw)-512):])
	}
	return r
}

// nextEvent returns the next record, which must be an event.
func (c *sseStream) nextEvent() sseEvent {
	c.t.Helper()
	r := c.next()
	require.Equal(c.t, sseEventRecord, r.Kind, "want an event, got %+v", r)
	return r.Event
}

// skipToEvent skips comments and retry directives and returns the next
// event.
func (c *sseStream) skipToEvent() sseEvent {
	c.t.Helper()
	for {
		if r := c.next(); r.Kind == sseEventRecord {
			return r.Event
		}
	}
}

// messagesUntil returns the events, as the parser gives them (with the id
// field of their own block: ID, HasID), up to the first for which stop
// reports true (included), skipping comments and retry directives.
func (c *sseStream) messagesUntil(stop func(sseclient.Message) bool) []sseclient.Message {
	c.t.Helper()
	var out []sseclient.Message
	for {
		c.skipToEvent()
		out = append(out, c.r.msg)
		if stop(c.r.msg) {
			return out
		}
	}
}

// expect requires the next records to be exactly these events.
func (c *sseStream) expect(want ...sseEvent) {
	c.t.Helper()
	for i, w := range want {
		require.Equal(c.t, w, c.nextEvent(), "frame %d", i)
	}
}

// rest reads to the end of the stream, which must end on an event
// boundary, and returns the records not read yet.
func (c *sseStream) rest() []sseRecord {
	c.t.Helper()
	var out []sseRecord
	for {
		r, err := c.r.next()
		if err == io.EOF {
			return out
		}
		require.NotErrorIs(c.t, err, errSSEIncomplete, "the stream must end on an event boundary")
		require.NoError(c.t, err)
		out = append(out, r)
	}
}
