package eventbus

// The test harness every test file of the package shares: how long a test
// runs (-short, EVENTBUS_LONG=1), the fixed and the fake clock, the bus
// constructor, the log capture, the SSE reader and client (on the
// repository's own sseclient.Parser), the Handler's test environment and
// writers, HTTP/2 on the fake clock (h2c over in-memory pipes), the queue's
// test accessors, the Hub's constructors, the one wait helper
// (waitClosed), and the one in-memory backplane Log (memLog).
// A helper that the tests of more than one code file use lives here; one
// that serves a single file's tests lives in that file.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ssebus/eventbus/internal/pipenet"
	"github.com/ssebus/eventbus/sseclient"

	"github.com/ssebus/eventbus/internal/seam"
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

// ---------------------------------------------------------------------------
// Frames: publishing, reading and describing them.

// publishEvent publishes e.
func publishEvent(t testing.TB, b *EventBus, e Event) Frame {
	t.Helper()
	f, err := b.Publish(e)
	require.NoError(t, err)
	return f
}

// publishNumbered publishes n events of type "t" with data {"n":i}.
func publishNumbered(t testing.TB, b *EventBus, n int) []Frame {
	t.Helper()
	fs := make([]Frame, 0, n)
	for i := range n {
		fs = append(fs, publishEvent(t, b, Event{Type: "t", Data: map[string]int{"n": i}}))
	}
	return fs
}

// envelopeBase is the size of the envelope of an event of type typ with
// data "" published as id by a newBus bus.
func envelopeBase(id uint64, typ string) int {
	return len(fmt.Sprintf(`{"id":%d,"v":1,"type":%q,"data":"","_meta":{"serverTimestamp":%d}}`, id, typ, testStamp))
}

// sizedEvent returns an event whose envelope is exactly size bytes when it
// is published as id by a newBus bus.
func sizedEvent(t testing.TB, id uint64, size int) Event {
	t.Helper()
	base := envelopeBase(id, "t")
	require.GreaterOrEqual(t, size, base, "an envelope cannot be smaller than %d bytes", base)
	return Event{Type: "t", Data: strings.Repeat("x", size-base)}
}

// collectEvents ranges over Events until the subscription ends.
func collectEvents(s *Subscription) []Frame {
	var fs []Frame
	for f := range s.Events() {
		fs = append(fs, f)
	}
	return fs
}

// describe renders frames for order assertions: "#<id>" for events,
// "sig:<type>/<about>" for signals, the type for synthetic frames.
func describe(fs []Frame) []string {
	out := make([]string, 0, len(fs))
	for _, f := range fs {
		switch {
		case f.Signal():
			out = append(out, "sig:"+f.Type()+"/"+f.About())
		case f.ID() != 0:
			out = append(out, fmt.Sprintf("#%d", f.ID()))
		default:
			out = append(out, f.Type())
		}
	}
	return out
}

// ids renders "#from".."#to".
func idRange(from, to uint64) []string {
	var out []string
	for i := from; i <= to; i++ {
		out = append(out, fmt.Sprintf("#%d", i))
	}
	return out
}

func seqOf(parts ...any) []string {
	var out []string
	for _, p := range parts {
		switch p := p.(type) {
		case string:
			out = append(out, p)
		case []string:
			out = append(out, p...)
		default:
			panic(fmt.Sprintf("seq: %T", p))
		}
	}
	return out
}

// dataOf returns the raw "data" member of a frame's envelope.
func dataOf(t testing.TB, f Frame) string {
	t.Helper()
	var env struct {
		Data json.RawMessage `json:"data"`
	}
	require.NoError(t, json.Unmarshal(f.JSON(), &env), "envelope %s", f.JSON())
	return string(env.Data)
}

// withEpoch replaces EPOCH in s by the bus epoch.
func withEpoch(b *EventBus, s string) string { return strings.ReplaceAll(s, "EPOCH", b.Epoch()) }

// ofType returns the frames of the given type.
func ofType(fs []Frame, typ string) []Frame {
	var out []Frame
	for _, f := range fs {
		if f.Type() == typ {
			out = append(out, f)
		}
	}
	return out
}

func sumSizes(fs []Frame) int {
	n := 0
	for _, f := range fs {
		n += f.Size()
	}
	return n
}

// watchCtx is a cancellable context that implements the AfterFunc method
// context.AfterFunc delegates to, so a test can count the callbacks still
// registered on it ("is the bus still watching this context?").
type watchCtx struct {
	mu   sync.Mutex
	done chan struct{}
	err  error
	next int
	fns  map[int]func()
}

func newWatchCtx() *watchCtx {
	return &watchCtx{done: make(chan struct{}), fns: map[int]func(){}}
}

func (c *watchCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *watchCtx) Done() <-chan struct{}       { return c.done }
func (c *watchCtx) Value(any) any               { return nil }

func (c *watchCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *watchCtx) AfterFunc(f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		go f()
		return func() bool { return false }
	}
	id := c.next
	c.next++
	c.fns[id] = f
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.fns[id]
		delete(c.fns, id)
		return ok
	}
}

func (c *watchCtx) cancel() {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = context.Canceled
	close(c.done)
	fns := c.fns
	c.fns = map[int]func(){}
	c.mu.Unlock()
	for _, f := range fns {
		go f()
	}
}

// watchers returns how many callbacks are registered.
func (c *watchCtx) watchers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.fns)
}

// ---------------------------------------------------------------------------
// The Handler: the frames a client expects, a real loopback server
// (testEnv), and in-memory response writers.

// publishN publishes n events of type "e" whose data is their own id.
func publishN(t *testing.T, b *EventBus, n int) []Frame {
	t.Helper()
	var fs []Frame
	for range n {
		f, err := b.Publish(Event{Type: "e", Data: b.LastEventID() + 1})
		require.NoError(t, err)
		fs = append(fs, f)
	}
	return fs
}

// wantEvent is what the parser reports for event id published by publishN.
func wantEvent(id uint64) sseEvent {
	s := strconv.FormatUint(id, 10)
	return sseEvent{
		Type: "e",
		Data: `{"id":` + s + `,"v":1,"type":"e","data":` + s + `,"_meta":{"serverTimestamp":1719000000000}}`,
		ID:   s,
	}
}

// wantSynth is a synthetic frame with data (exact JSON); lastID is the last
// event id the client saw before it (a synthetic frame has no id of its own).
func wantSynth(typ, data, lastID string) sseEvent {
	return sseEvent{
		Type: typ,
		Data: `{"v":1,"type":"` + typ + `","data":` + data + `,"_meta":{"serverTimestamp":1719000000000}}`,
		ID:   lastID,
	}
}

// wantCursorInvalid is b's state_resync_required cursor_invalid for a
// stream whose first live event is earliest; lastID is the SSE id the
// client holds when it arrives.
func wantCursorInvalid(b *EventBus, earliest uint64, lastID string) sseEvent {
	return wantSynth(TypeStateResyncRequired, fmt.Sprintf(`{"reason":"cursor_invalid","lastDeliveredId":0,"earliestAvailableId":%d,"epoch":"%s"}`,
		earliest, b.Epoch()), lastID)
}

// wantReplayComplete is b's replay_complete after count replayed events up
// to last; lastID is the SSE id the client holds when it arrives.
func wantReplayComplete(b *EventBus, count int, last uint64, lastID string) sseEvent {
	if count == 0 {
		return wantSynth(TypeReplayComplete, `{"replayedCount":0,"epoch":"`+b.Epoch()+`"}`, lastID)
	}
	return wantSynth(TypeReplayComplete, fmt.Sprintf(`{"replayedCount":%d,"lastReplayedEventId":%d,"lastEventId":%d,"epoch":"%s"}`,
		count, last, last, b.Epoch()), lastID)
}

// testEnv is a loopback HTTP server with the Handler on
// "GET /session/{id}/events", the MuxHandler (sharing its settings) on
// "GET /events", and a Lookup over a map of buses.
type testEnv struct {
	srv    *httptest.Server // nil with envOptions.h2c
	client *http.Client
	base   string // the URL the paths of do are under
	h      *Handler
	mux    *MuxHandler
	logs   *logCapture

	mu    sync.Mutex
	buses map[string]*EventBus
}

// testJitter is the RetryJitter of the test handlers: none unless a test
// asks for it, so that "retry:" is exact.
func testJitter(j time.Duration) time.Duration {
	if j == 0 {
		return -1
	}
	return j
}

type envOptions struct {
	handler *Handler // Retry, RetryJitter, Heartbeat, WriteTimeout, CORS and Authorize are used; nil: none
	// epochIDs: the stream's id lines carry the epoch, the Handler's
	// default; without it the tests read the bare ids of SPEC 5.3 (BareIDs).
	epochIDs       bool
	wrap           func(http.Handler) http.Handler
	maxHeaderBytes int
	http2          bool
	// h2c serves over HTTP/2 with prior knowledge on in-memory pipes
	// (h2cEnv), inside the current synctest bubble, instead of a loopback
	// server.
	h2c       bool
	anyMethod bool // route every method to the handler, not only GET/HEAD
	// mux: the MuxHandler's Authorize, Sessions and MaxStreamSessions
	// are used; nil: none.
	mux *MuxHandler
}

func newEnv(t *testing.T, o envOptions) *testEnv {
	t.Helper()
	e := &testEnv{logs: &logCapture{}, buses: map[string]*EventBus{}}
	if o.handler == nil {
		o.handler = &Handler{}
	}
	e.h = &Handler{
		Lookup:       e.lookupSession,
		Logger:       e.logs.logger(),
		Retry:        o.handler.Retry,
		RetryJitter:  testJitter(o.handler.RetryJitter),
		Heartbeat:    o.handler.Heartbeat,
		WriteTimeout: o.handler.WriteTimeout,
		BareIDs:      !o.epochIDs,
		CORS:         o.handler.CORS,
		Authorize:    o.handler.Authorize,
	}
	if o.mux == nil {
		o.mux = &MuxHandler{}
	}
	e.mux = &MuxHandler{
		Handler:           e.h,
		Sessions:          o.mux.Sessions,
		MaxStreamSessions: o.mux.MaxStreamSessions,
	}
	var h, mh http.Handler = e.h, e.mux
	if o.wrap != nil {
		h, mh = o.wrap(h), o.wrap(mh)
	}
	mux := http.NewServeMux()
	if o.anyMethod {
		mux.Handle("/session/{id}/events", h)
		mux.Handle("/events", mh)
	} else {
		mux.Handle("GET /session/{id}/events", h)
		mux.Handle("GET /events", mh)
	}
	if o.h2c {
		e.client, e.base = h2cEnv(t, mux), "http://pipe"
		return e
	}
	e.srv = httptest.NewUnstartedServer(mux)
	if o.maxHeaderBytes > 0 {
		e.srv.Config.MaxHeaderBytes = o.maxHeaderBytes
	}
	if o.http2 {
		e.srv.EnableHTTP2 = true
		e.srv.StartTLS()
	} else {
		e.srv.Start()
	}
	t.Cleanup(e.srv.Close)
	e.client, e.base = e.srv.Client(), e.srv.URL
	return e
}

// lookupSession is the handlers' Lookup over the env's buses.
func (e *testEnv) lookupSession(_ *http.Request, id string) (*EventBus, error) {
	e.mu.Lock()
	b, ok := e.buses[id]
	e.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrSessionNotFound, id)
	}
	return b, nil
}

// sessionWithEvents adds a session of its own with n events published
// (by publishN) and returns its stream path and bus.
func (e *testEnv) sessionWithEvents(t *testing.T, n int) (string, *EventBus) {
	e.mu.Lock()
	id := "s" + strconv.Itoa(len(e.buses)+1)
	e.mu.Unlock()
	b := e.bus(t, id, Options{})
	publishN(t, b, n)
	return "/session/" + id + "/events", b
}

// bus adds a session.
func (e *testEnv) bus(t *testing.T, id string, opts Options) *EventBus {
	b := newBus(t, e.logs.capture(opts))
	e.mu.Lock()
	e.buses[id] = b
	e.mu.Unlock()
	return b
}

// do sends a request; the body is closed when the test ends.
func (e *testEnv) do(t *testing.T, method, path string, hdr http.Header) *http.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, method, e.base+path, nil)
	require.NoError(t, err)
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	resp, err := e.client.Do(req)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

// open starts a stream and requires a 200 text/event-stream answer.
func (e *testEnv) open(t *testing.T, path string, hdr http.Header) *sseStream {
	t.Helper()
	resp := e.do(t, http.MethodGet, path, hdr)
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		require.Equal(t, http.StatusOK, resp.StatusCode, "body %s", body)
	}
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	return newSSEStream(t, resp)
}

// stream opens a stream and requires "retry: 3000" as its first record.
// When it returns, the subscription is registered (the handler subscribes
// before it sends the headers).
func (e *testEnv) stream(t *testing.T, path string, hdr http.Header) *sseStream {
	t.Helper()
	c := e.open(t, path, hdr)
	require.Equal(t, sseRecord{Kind: sseRetryRecord, Retry: 3000}, c.next())
	return c
}

// requireJSONError checks an error answer of SPEC 6.1 and returns its body.
func requireJSONError(t *testing.T, status int, hdr http.Header, body []byte, wantStatus int, code string) map[string]any {
	t.Helper()
	require.Equal(t, wantStatus, status, "body %s", body)
	require.Equal(t, "application/json", hdr.Get("Content-Type"))
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&m), "body %q", body)
	require.Equal(t, code, m["code"], "body %s", body)
	msg, _ := m["error"].(string)
	require.NotEmpty(t, msg, "body %s", body)
	return m
}

func requireHTTPError(t *testing.T, resp *http.Response, wantStatus int, code string) map[string]any {
	t.Helper()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return requireJSONError(t, resp.StatusCode, resp.Header, body, wantStatus, code)
}

// memWriter is an in-memory ResponseWriter that implements http.Flusher.
// Hooks run without its lock, on the handler's goroutine.
type memWriter struct {
	mu      sync.Mutex
	header  http.Header
	sent    http.Header // the header at WriteHeader
	status  int
	body    bytes.Buffer
	writes  int
	flushes int

	beforeWrite func(n int, p []byte) error // n counts from 1; an error fails the write
	beforeFlush func(n int)
}

func newMemWriter() *memWriter { return &memWriter{header: http.Header{}} }

func (w *memWriter) Header() http.Header { return w.header }

func (w *memWriter) WriteHeader(code int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.status == 0 {
		w.status, w.sent = code, w.header.Clone()
	}
}

func (w *memWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.writes++
	n, hook := w.writes, w.beforeWrite
	w.mu.Unlock()
	if hook != nil {
		if err := hook(n, p); err != nil {
			return 0, err
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.status == 0 {
		w.status, w.sent = http.StatusOK, w.header.Clone()
	}
	return w.body.Write(p)
}

func (w *memWriter) Flush() {
	w.mu.Lock()
	w.flushes++
	n, hook := w.flushes, w.beforeFlush
	w.mu.Unlock()
	if hook != nil {
		hook(n)
	}
}

type memState struct {
	status          int
	header          http.Header
	body            string
	writes, flushes int
}

func (w *memWriter) state() memState {
	w.mu.Lock()
	defer w.mu.Unlock()
	return memState{w.status, w.sent, w.body.String(), w.writes, w.flushes}
}

// deadlineWriter adds SetWriteDeadline, found by http.ResponseController.
// From write number blockFrom on (0: never), a Write blocks until the
// deadline and then fails, like a socket whose peer stopped reading.
type deadlineWriter struct {
	*memWriter
	dmu       sync.Mutex
	deadline  time.Time
	sets      []deadlineSet
	blockFrom int
}

type deadlineSet struct{ at, deadline time.Time }

func newDeadlineWriter(blockFrom int) *deadlineWriter {
	w := &deadlineWriter{memWriter: newMemWriter(), blockFrom: blockFrom}
	w.beforeWrite = func(n int, p []byte) error {
		if w.blockFrom == 0 || n < w.blockFrom {
			return nil
		}
		w.dmu.Lock()
		d := w.deadline
		w.dmu.Unlock()
		if d.IsZero() {
			return errors.New("test: a write without a deadline would block forever")
		}
		time.Sleep(time.Until(d))
		return os.ErrDeadlineExceeded
	}
	return w
}

func (w *deadlineWriter) SetWriteDeadline(d time.Time) error {
	w.dmu.Lock()
	defer w.dmu.Unlock()
	w.deadline = d
	w.sets = append(w.sets, deadlineSet{time.Now(), d})
	return nil
}

func (w *deadlineWriter) deadlineSets() []deadlineSet {
	w.dmu.Lock()
	defer w.dmu.Unlock()
	return append([]deadlineSet(nil), w.sets...)
}

// noFlushWriter cannot flush and wraps nothing.
type noFlushWriter struct{ w *memWriter }

func (n noFlushWriter) Header() http.Header         { return n.w.Header() }
func (n noFlushWriter) Write(p []byte) (int, error) { return n.w.Write(p) }
func (n noFlushWriter) WriteHeader(code int)        { n.w.WriteHeader(code) }

// unwrapOnlyWriter cannot flush itself but wraps a writer that can.
type unwrapOnlyWriter struct{ inner http.ResponseWriter }

func (u unwrapOnlyWriter) Header() http.Header         { return u.inner.Header() }
func (u unwrapOnlyWriter) Write(p []byte) (int, error) { return u.inner.Write(p) }
func (u unwrapOnlyWriter) WriteHeader(code int)        { u.inner.WriteHeader(code) }
func (u unwrapOnlyWriter) Unwrap() http.ResponseWriter { return u.inner }

// countingWriter is middleware-style: it counts flushes and times writes and
// flushes, and exposes the real writer with Unwrap (so the handler's write
// deadlines reach the connection).
type countingWriter struct {
	http.ResponseWriter
	mu       sync.Mutex
	flushes  int
	writes   int
	slowest  time.Duration // the longest single Write or Flush
	slowFrom time.Time     // when it started
	failures int
}

func (c *countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

func (c *countingWriter) record(start time.Time, err error) {
	d := time.Since(start)
	c.mu.Lock()
	if d > c.slowest {
		c.slowest, c.slowFrom = d, start
	}
	if err != nil {
		c.failures++
	}
	c.mu.Unlock()
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.writes++ // before writing, for the same reason as in FlushError
	c.mu.Unlock()
	start := time.Now()
	n, err := c.ResponseWriter.Write(p)
	c.record(start, err)
	return n, err
}

func (c *countingWriter) FlushError() error {
	// Count before flushing: the client can read the flushed bytes, and the
	// test looks at the count, before Flush returns here.
	c.mu.Lock()
	c.flushes++
	c.mu.Unlock()
	start := time.Now()
	err := http.NewResponseController(c.ResponseWriter).Flush()
	c.record(start, err)
	return err
}

func (c *countingWriter) Flush() { _ = c.FlushError() }

func (c *countingWriter) counts() (writes, flushes, failures int, slowest time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes, c.flushes, c.failures, c.slowest
}

// slowestSpan returns when the longest Write or Flush started and ended.
func (c *countingWriter) slowestSpan() (from, to time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.slowFrom, c.slowFrom.Add(c.slowest)
}

// countingMiddleware wraps every request's writer and hands the wrappers to
// the test.
type countingMiddleware struct {
	mu   sync.Mutex
	last *countingWriter
}

func (m *countingMiddleware) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cw := &countingWriter{ResponseWriter: w}
		m.mu.Lock()
		m.last = cw
		m.mu.Unlock()
		next.ServeHTTP(cw, r)
	})
}

func (m *countingMiddleware) writer() *countingWriter {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.last
}

// serveMem runs h.ServeHTTP on w in a goroutine with a cancellable request.
func serveMem(h *Handler, w http.ResponseWriter, target string, hdr http.Header) (cancel func(), done <-chan struct{}) {
	ctx, cancelCtx := context.WithCancel(context.Background())
	req := httptest.NewRequest(http.MethodGet, target, nil).WithContext(ctx)
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		h.ServeHTTP(w, req)
	}()
	return cancelCtx, ch
}

func busHandler(b *EventBus, logs *logCapture) *Handler {
	return &Handler{
		Lookup:      func(*http.Request, string) (*EventBus, error) { return b, nil },
		Logger:      logs.logger(),
		RetryJitter: testJitter(0),
		BareIDs:     true, // the tests read SPEC 5.3's id lines; epoch ids have tests of their own
	}
}

// gateFirstFlush makes the handler's first flush (the "retry:" line, which
// comes after Subscribe) wait until the returned release is called; reached
// is closed when the handler is waiting there.
func gateFirstFlush(w *memWriter) (reached <-chan struct{}, release func()) {
	r, g := make(chan struct{}), make(chan struct{})
	w.beforeFlush = func(n int) {
		if n == 1 {
			close(r)
			<-g
		}
	}
	var once sync.Once
	return r, func() { once.Do(func() { close(g) }) }
}

func parseBody(t *testing.T, body string) []sseRecord {
	t.Helper()
	recs, err := parseSSE([]byte(body))
	require.NoError(t, err, "the body must end on an event boundary: %q", body[max(0, len(body)-256):])
	return recs
}

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// ---------------------------------------------------------------------------
// HTTP/2 on the fake clock: an h2c (prior knowledge) server and client from
// the standard library, connected by in-memory pipes inside a synctest
// bubble, so that deadlines, heartbeats and idle periods of minutes take no
// time and fire exactly.

// h2cServe serves h on an h2c server inside the current synctest bubble and
// returns its listener; cleanup closes the server and waits for it.
func h2cServe(t *testing.T, h http.Handler) *pipenet.Listener {
	ln := pipenet.Listen()
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: h, Protocols: &p}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-served
	})
	return ln
}

// h2cEnv serves h as h2cServe does and returns a client that speaks
// HTTP/2 with prior knowledge. Cleanup closes both, so the bubble's
// goroutines end.
func h2cEnv(t *testing.T, h http.Handler) *http.Client {
	ln := h2cServe(t, h)
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p, DialContext: ln.DialContext}
	t.Cleanup(tr.CloseIdleConnections) // before the server closes
	return &http.Client{Transport: tr}
}

// h2Stream opens the handler's stream over client and reads it through the
// strict parser on a goroutine of the bubble; records arrive on the
// returned channel, which is closed with the read error at the end.
func h2Stream(t *testing.T, client *http.Client, hdr http.Header) (recs <-chan sseRecord, end func() error, cancel func()) {
	return h2StreamAt(t, client, "/session/s/events", hdr)
}

// h2StreamAt is h2Stream for the stream at path.
func h2StreamAt(t *testing.T, client *http.Client, path string, hdr http.Header) (recs <-chan sseRecord, end func() error, cancel func()) {
	ctx, cancelReq := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://pipe"+path, nil)
	require.NoError(t, err)
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	require.Equal(t, 2, resp.ProtoMajor)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ch := make(chan sseRecord, 1024)
	var readErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(ch)
		defer resp.Body.Close()
		r := newSSEReader(resp.Body)
		for {
			rec, err := r.next()
			if err != nil {
				readErr = err
				return
			}
			ch <- rec
		}
	}()
	t.Cleanup(func() { cancelReq(); <-done })
	return ch, func() error { <-done; return readErr }, cancelReq
}

// drain returns the records that have arrived, without waiting.
func drain(ch <-chan sseRecord) []sseRecord {
	var out []sseRecord
	for {
		select {
		case r, ok := <-ch:
			if !ok {
				return out
			}
			out = append(out, r)
		default:
			return out
		}
	}
}

// ---------------------------------------------------------------------------
// More publishing, signalling, and serving one bus over HTTP.

// publishType publishes an event of type typ without data.
func publishType(t testing.TB, b *EventBus, typ string) Frame {
	t.Helper()
	f, err := b.Publish(Event{Type: typ})
	require.NoError(t, err)
	return f
}

// publishTypeN publishes n events of type typ and returns the id of the last.
func publishTypeN(t testing.TB, b *EventBus, typ string, n int) uint64 {
	t.Helper()
	var id uint64
	for range n {
		id = publishType(t, b, typ).ID()
	}
	return id
}

// sendSignal sends a signal.
func sendSignal(t testing.TB, b *EventBus, typ, about string) {
	t.Helper()
	require.NoError(t, b.Signal(typ, about))
}

// publishSized publishes the next event of type typ with an envelope of
// exactly size bytes; it needs the fixed clock of newBus and a single
// publisher.
func publishSized(t testing.TB, b *EventBus, typ string, size int) Frame {
	t.Helper()
	base := envelopeBase(b.LastEventID()+1, typ)
	require.GreaterOrEqual(t, size, base, "an envelope cannot be smaller than %d bytes", base)
	f, err := b.Publish(Event{Type: typ, Data: strings.Repeat("x", size-base)})
	require.NoError(t, err)
	require.Equal(t, size, f.Size())
	return f
}

// maxType is a fresh type of MaxTypeLen bytes: a new string each call, as a
// daemon that decodes types from requests holds one per event.
func maxType(i int) string {
	s := strconv.Itoa(i)
	return strings.Repeat("t", MaxTypeLen-len(s)) + s
}

// stampOf returns a frame's _meta.serverTimestamp.
func stampOf(t testing.TB, f Frame) int64 {
	t.Helper()
	var env struct {
		Meta struct {
			TS int64 `json:"serverTimestamp"`
		} `json:"_meta"`
	}
	require.NoError(t, json.Unmarshal(f.JSON(), &env))
	return env.Meta.TS
}

// serveSession serves b as session "s" with h (its Lookup set here) on
// "GET /session/{id}/events" of a loopback server that accepts request
// headers of up to 16 MiB, closed when the test ends.
func serveSession(t testing.TB, b *EventBus, h *Handler) *httptest.Server {
	t.Helper()
	h.BareIDs = true // the tests read SPEC 5.3's id lines; epoch ids have tests of their own
	h.Lookup = func(r *http.Request, _ string) (*EventBus, error) {
		if r.PathValue("id") == "s" {
			return b, nil
		}
		return nil, ErrSessionNotFound
	}
	mux := http.NewServeMux()
	mux.Handle("GET /session/{id}/events", h)
	ts := httptest.NewUnstartedServer(mux)
	ts.Config.MaxHeaderBytes = 16 << 20
	ts.Start()
	t.Cleanup(ts.Close)
	return ts
}

// serveBus is serveSession with a Handler of default options and a
// discarding logger.
func serveBus(t testing.TB, b *EventBus) *httptest.Server {
	t.Helper()
	return serveSession(t, b, &Handler{Logger: slog.New(slog.DiscardHandler)})
}

// openStream starts a GET of pathQuery on ts and returns its client,
// whatever the status; the response ends with the test.
func openStream(t testing.TB, ts *httptest.Server, pathQuery string, hdr http.Header) *sseStream {
	t.Helper()
	// The timeout only keeps a bug from hanging the test.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+pathQuery, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		resp.Body.Close()
		cancel()
	})
	return newSSEStream(t, resp)
}

// ---------------------------------------------------------------------------
// The queue, from the tests: operations that only tests need (the library
// itself consumes with popAll and sizes replays with reserveLocked under its
// own locking; export_test.go has popAll, tryPopAll and ring.indexOf).

func newQueue(maxQueued, maxBytes int) *boundedAsyncQueue {
	q := &boundedAsyncQueue{}
	q.init(maxQueued, maxBytes)
	return q
}

// reserve is reserveLocked with the lock taken.
func (q *boundedAsyncQueue) reserve(n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.reserveLocked(n)
}

// poppedEntry is a dequeued entry with its frame by value (the zero Frame
// when nothing was dequeued), for comparisons.
type poppedEntry struct {
	f              Frame
	forced, marker bool
}

// popState is the outcome of a pop.
type popState uint8

const (
	popOK    popState = iota // an entry was returned
	popEmpty                 // nothing ready now; wait on ready
	popEnded                 // closed and nothing left: the end of the stream
)

// pop removes the oldest entry: popAll limited to one.
func (q *boundedAsyncQueue) pop() (poppedEntry, popState) {
	q.mu.Lock()
	var e queueEntry
	n := q.length()
	if n > 0 {
		e = q.entry(0) // its tags; take returns the frame only
	}
	ended := n == 0 && q.closed.Load()
	q.mu.Unlock()
	if ended {
		return poppedEntry{}, popEnded
	}
	if fs, _ := q.take(nil, true, 0, nil); len(fs) == 1 {
		return poppedEntry{fs[0], e.forced, e.marker}, popOK
	}
	return poppedEntry{}, popEmpty
}

// refs returns pointers to copies of fs, the form unhold takes.
func refs(fs []Frame) []*frame {
	out := make([]*frame, len(fs))
	for i, f := range fs {
		out[i] = f.ref()
	}
	return out
}

// counts returns the live counts and caps.
func (q *boundedAsyncQueue) counts() queueCounts {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.liveCounts()
}

// len returns the number of buffered entries, live and forced.
func (q *boundedAsyncQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.length()
}

// queueEntry is one buffered frame with its tags, as the tests see it.
type queueEntry struct {
	f      *frame
	forced bool
	marker bool
}

// entry returns the i-th queued entry from the head (under mu).
func (q *boundedAsyncQueue) entry(i int) queueEntry {
	j := (q.head.Load() + uint64(i)) & uint64(len(q.buf)-1)
	fl := q.flags[j]
	return queueEntry{f: q.buf[j], forced: fl&entryForced != 0, marker: fl&entryMarker != 0}
}

// freeSlotsClear reports the first slot outside [head, next) that holds a
// frame or a tag, or -1: a free slot must neither pin a frame nor hand its
// tags to the live entry that a push writes there without touching flags.
func (q *boundedAsyncQueue) freeSlotsClear() int {
	used := make(map[uint64]bool)
	mask := uint64(len(q.buf) - 1)
	for p := q.head.Load(); p != q.next; p++ {
		used[p&mask] = true
	}
	for i := range q.buf {
		if !used[uint64(i)] && (q.buf[i] != nil || q.flags[i] != 0) {
			return i
		}
	}
	return -1
}

// pushNow is push followed at once by the wake it asks for: the order every
// caller of push keeps, with nothing in between.
func (q *boundedAsyncQueue) pushNow(f *frame) (pushResult, queueCounts) {
	res, c, wake := q.push(f)
	if wake {
		q.wake()
	}
	return res, c
}

// ---------------------------------------------------------------------------
// Shutdown frames, and what a test may measure of the process.

// shutdownData is the data of a shutdown frame with retryAfter ms: what
// every stream of a bus closed by CloseForShutdown, Hub.Shutdown or
// Hub.Close gets after what was queued.
func shutdownData(ms int) string {
	return `{"error":"` + shutdownMessage + `","errorKind":"shutdown","retryAfter":` + strconv.Itoa(ms) + `}`
}

// raceEnabled reports whether the test binary was built with -race.
func raceEnabled() bool {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "-race" {
				return s.Value == "true"
			}
		}
	}
	return false
}

// liveHeap returns HeapAlloc after two full collections (the second frees
// what the first one's finalizers and sync.Pool victim caches released).
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// ---------------------------------------------------------------------------
// Waiting. waitClosed is the one wait helper: for a channel to close. A
// condition that comes true by itself is waited for with require.Eventually
// (or assert.Eventually), polling every millisecond or so; under
// testing/synctest, synctest.Wait. Never a sleep that hopes. The one
// exception is a goroutine count (waitGoroutines): Eventually runs its
// condition on goroutines of its own, which the count would include.

// waitClosed waits up to 10 s for ch to close and fails the test with what
// when it does not.
func waitClosed(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		require.FailNow(t, what)
	}
}

// waitGoroutines waits until runtime.NumGoroutine is at most n and returns
// the last count. Goroutines that end asynchronously (a context's
// AfterFunc, net/http's connection goroutines) get up to 10 s; the test
// checks the count, not the time.
func waitGoroutines(n int) int {
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := runtime.NumGoroutine()
		if got <= n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------
// The Hub.

// newTestHub makes a hub that the test's cleanup closes.
func newTestHub(t testing.TB, opts HubOptions) *Hub {
	t.Helper()
	h, err := NewHub(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Close() })
	return h
}

// newHubClock is the tests' settable clock (Options.Now): a test moves
// time and calls sweep itself.
func newHubClock() *fakeClock { return newFakeClock(testStamp) }

// hubEvent is an event of type "t" with data {"i":i}.
func hubEvent(i int) Event {
	return Event{Type: "t", Data: json.RawMessage(`{"i":` + strconv.Itoa(i) + `}`)}
}

// hubStream GETs url with hdr and returns its events up to and with the
// first of type until.
func hubStream(t *testing.T, url string, hdr http.Header, until string) []sseEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	c := newSSEStream(t, resp)
	defer c.close()
	var out []sseEvent
	for {
		ev := c.skipToEvent()
		out = append(out, ev)
		if ev.Type == until {
			return out
		}
	}
}

// ---------------------------------------------------------------------------
// Overflows and ids.

// overflow11 publishes events until the subscriber's next overflow (or
// eviction) and returns the id of the rejected one.
func overflow11(t testing.TB, b *EventBus, s *Subscription) uint64 {
	t.Helper()
	before := b.Stats()
	for range 10_000 {
		id := publishType(t, b, "e").ID()
		st := b.Stats()
		if st.Resyncs != before.Resyncs || st.Evictions != before.Evictions {
			return id
		}
	}
	t.Fatal("no overflow")
	return 0
}

// eventIDs returns the ids of the events among fs, in order.
func eventIDs(fs []Frame) []uint64 {
	var ids []uint64
	for _, f := range fs {
		if f.ID() != 0 {
			ids = append(ids, f.ID())
		}
	}
	return ids
}

// requireIDs fails with the first difference between want and got, not
// with thousands of ids.
func requireIDs(t testing.TB, want, got []uint64, msgAndArgs ...any) {
	t.Helper()
	for i := range min(len(want), len(got)) {
		if want[i] != got[i] {
			require.FailNow(t, fmt.Sprintf("id %d of %d: got %d, want %d (got %d ids, want %d)", i, len(want), got[i], want[i], len(got), len(want)), msgAndArgs...)
		}
	}
	if len(want) != len(got) {
		last := "none"
		if len(got) > 0 {
			last = strconv.FormatUint(got[len(got)-1], 10)
		}
		require.FailNow(t, fmt.Sprintf("got %d ids (the last %s), want %d", len(got), last, len(want)), msgAndArgs...)
	}
}

// seqIDs is from..to.
func seqIDs(from, to uint64) []uint64 {
	var ids []uint64
	for i := from; i <= to; i++ {
		ids = append(ids, i)
	}
	return ids
}

// pub11Size is the envelope size of an event of type "e" without data
// published as id on a newBus bus.
func pub11Size(b *EventBus, id uint64) int {
	return len(fmt.Sprintf(`{"id":%d,"v":1,"type":"e","_meta":{"serverTimestamp":%d}}`, id, testStamp))
}

// ---------------------------------------------------------------------------
// A backplane's log.

// memLog is the tests' backplane log in memory, the one seam.Log fake of
// the package's tests (package backplane's tests have their own, over its
// exported Log). It numbers its entries from 1 under its own lock, as an
// engine's atomic append would. When err is set, ReadHistory and Head
// fail with it; onRead and onHead run at the start of each, outside the
// lock (they may append); calls and reqs count and record the ReadHistory
// calls. The zero value is
// an empty log of no epoch.
type memLog struct {
	epoch  string
	err    error
	onRead func()
	onHead func()

	mu      sync.Mutex
	entries []seam.Entry
	next    uint64 // the id of the next entry; 0 means 1
	calls   int
	reqs    []seam.HistoryRequest
}

// add appends an event of type typ, encoded as Publish would, and returns
// its entry.
func (l *memLog) add(t testing.TB, typ string) seam.Entry {
	t.Helper()
	enc, err := newEncoder(Options{})
	require.NoError(t, err)
	ev, err := enc.Encode(Event{Type: typ})
	require.NoError(t, err)
	return l.put(ev)
}

// put numbers ev and appends it.
func (l *memLog) put(ev seam.Encoded) seam.Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	id := max(l.next, 1)
	l.next = id + 1
	e := seam.Entry{ID: id, Type: ev.Type, JSON: ev.Envelope(id)}
	l.entries = append(l.entries, e)
	return e
}

// trim drops all but the newest keep entries.
func (l *memLog) trim(keep int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = l.entries[len(l.entries)-keep:]
}

// ReadHistory implements seam.Log.
func (l *memLog) ReadHistory(_ context.Context, req seam.HistoryRequest) ([]seam.Entry, uint64, error) {
	if l.onRead != nil {
		l.onRead()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	l.reqs = append(l.reqs, req)
	if l.err != nil {
		return nil, 0, l.err
	}
	var out []seam.Entry
	for _, e := range l.entries {
		if e.ID > req.After && e.ID <= req.Upto {
			out = append(out, e)
		}
	}
	first := uint64(0)
	if len(l.entries) > 0 {
		first = l.entries[0].ID
	}
	return out, first, nil
}

// Head implements seam.Log.
func (l *memLog) Head(context.Context) (string, uint64, error) {
	if l.onHead != nil {
		l.onHead()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return "", 0, l.err
	}
	return l.epoch, max(l.next, 1) - 1, nil
}

// withLookup sets h's Lookup and returns h, for a MuxHandler's Handler.
func withLookup(h *Handler, lookup func(*http.Request, string) (*EventBus, error)) *Handler {
	h.Lookup = lookup
	return h
}

// streamErrorFrameNow is a stream_error frame stamped with the wall clock,
// as EventBus.StreamErrorFrame stamps it with the bus's.
func streamErrorFrameNow(msg, kind string) Frame { return streamErrorFrame(msg, kind, nowMillis(nil)) }
