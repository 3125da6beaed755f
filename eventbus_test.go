package eventbus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ---------------------------------------------------------------------------
// Helpers shared by the package's tests.

// coreNowMillis is the fixed clock of newCoreBus: every serverTimestamp stamped
// by a test bus is this value.
const coreNowMillis = 1719000000000

func coreNow() time.Time { return time.UnixMilli(coreNowMillis) }

// coreLogBuf is a goroutine-safe log sink.
type coreLogBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *coreLogBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *coreLogBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// coreLogger returns a logger writing JSON records to the returned buffer.
func coreLogger() (*slog.Logger, *coreLogBuf) {
	buf := &coreLogBuf{}
	return slog.New(slog.NewJSONHandler(buf, nil)), buf
}

// newCoreBus returns a bus with the fixed clock and a discarding logger unless
// opts says otherwise; it is closed when the test ends.
func newCoreBus(t testing.TB, opts Options) *EventBus {
	t.Helper()
	if opts.Now == nil {
		opts.Now = coreNow
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	b, err := New(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func coreSubscribe(t testing.TB, b *EventBus, opts SubscribeOptions) *Subscription {
	t.Helper()
	s, err := b.Subscribe(context.Background(), opts)
	require.NoError(t, err)
	require.NotNil(t, s)
	return s
}

func corePublish(t testing.TB, b *EventBus, e Event) Frame {
	t.Helper()
	f, err := b.Publish(e)
	require.NoError(t, err)
	return f
}

// corePublishN publishes n events of type "t" with data {"n":i}.
func corePublishN(t testing.TB, b *EventBus, n int) []Frame {
	t.Helper()
	fs := make([]Frame, 0, n)
	for i := range n {
		fs = append(fs, corePublish(t, b, Event{Type: "t", Data: map[string]int{"n": i}}))
	}
	return fs
}

// coreEnvelopeBase is the size of the envelope of an event of type "t" with
// data "" published as id by a newCoreBus bus.
func coreEnvelopeBase(id uint64) int {
	return len(fmt.Sprintf(`{"id":%d,"v":1,"type":"t","data":"","_meta":{"serverTimestamp":%d}}`, id, coreNowMillis))
}

// coreSizedEvent returns an event whose envelope is exactly size bytes when it
// is published as id by a newCoreBus bus.
func coreSizedEvent(t testing.TB, id uint64, size int) Event {
	t.Helper()
	base := coreEnvelopeBase(id)
	require.GreaterOrEqual(t, size, base, "an envelope cannot be smaller than %d bytes", base)
	return Event{Type: "t", Data: strings.Repeat("x", size-base)}
}

// corePublishSized publishes the next event with an envelope of exactly size
// bytes (single publisher).
func corePublishSized(t testing.TB, b *EventBus, size int) Frame {
	t.Helper()
	f := corePublish(t, b, coreSizedEvent(t, b.LastEventID()+1, size))
	require.Equal(t, size, f.Size())
	return f
}

// pending returns every frame ready now, without waiting, and whether the
// subscription is still open.
func corePending(s *Subscription) ([]Frame, bool) { return s.AppendReady(nil) }

// collect ranges over Events until the subscription ends.
func coreCollect(s *Subscription) []Frame {
	var fs []Frame
	for f := range s.Events() {
		fs = append(fs, f)
	}
	return fs
}

// describe renders frames as "#<id>" for events and their type for
// synthetic frames, for order assertions.
func coreDescribe(fs []Frame) []string {
	out := make([]string, 0, len(fs))
	for _, f := range fs {
		if f.ID() != 0 {
			out = append(out, fmt.Sprintf("#%d", f.ID()))
		} else {
			out = append(out, f.Type())
		}
	}
	return out
}

// ids renders "#from".."#to".
func coreIDs(from, to uint64) []string {
	var out []string
	for i := from; i <= to; i++ {
		out = append(out, fmt.Sprintf("#%d", i))
	}
	return out
}

func coreSeq(parts ...any) []string {
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

// coreData returns the raw "data" member of a frame's envelope.
func coreData(t testing.TB, f Frame) string {
	t.Helper()
	var env struct {
		Data json.RawMessage `json:"data"`
	}
	require.NoError(t, json.Unmarshal(f.JSON(), &env), "envelope %s", f.JSON())
	return string(env.Data)
}

// coreWithEpoch replaces EPOCH in s by the bus epoch.
func coreWithEpoch(b *EventBus, s string) string { return strings.ReplaceAll(s, "EPOCH", b.Epoch()) }

// coreOfType returns the frames of the given type.
func coreOfType(fs []Frame, typ string) []Frame {
	var out []Frame
	for _, f := range fs {
		if f.Type() == typ {
			out = append(out, f)
		}
	}
	return out
}

func coreSumSizes(fs []Frame) int {
	n := 0
	for _, f := range fs {
		n += f.Size()
	}
	return n
}

// coreWatchCtx is a cancellable context that implements the AfterFunc method
// context.AfterFunc delegates to, so a test can count the callbacks still
// registered on it ("is the bus still watching this context?").
type coreWatchCtx struct {
	mu   sync.Mutex
	done chan struct{}
	err  error
	next int
	fns  map[int]func()
}

func newCoreWatchCtx() *coreWatchCtx {
	return &coreWatchCtx{done: make(chan struct{}), fns: map[int]func(){}}
}

func (c *coreWatchCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *coreWatchCtx) Done() <-chan struct{}       { return c.done }
func (c *coreWatchCtx) Value(any) any               { return nil }

func (c *coreWatchCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *coreWatchCtx) AfterFunc(f func()) func() bool {
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

func (c *coreWatchCtx) cancel() {
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
func (c *coreWatchCtx) watchers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.fns)
}

// ---------------------------------------------------------------------------
// New and options (SPEC 2).

func TestNewZeroOptionsMeanDefaults(t *testing.T) {
	b, err := New(Options{})
	require.NoError(t, err)
	defer b.Close()
	o := b.opts
	assert.Equal(t, DefaultRingSize, o.RingSize)
	assert.Equal(t, DefaultRingMaxBytes, o.RingMaxBytes)
	assert.Equal(t, DefaultMaxEventBytes, o.MaxEventBytes)
	assert.Equal(t, DefaultMaxSubscribers, o.MaxSubscribers)
	assert.Equal(t, DefaultMaxQueued, o.MaxQueued)
	assert.Equal(t, DefaultMaxQueuedBytes, o.MaxQueuedBytes)
	assert.Equal(t, DefaultReplayBudgetBytes, o.ReplayBudgetBytes)

	// The defaults reach a subscription too.
	s := coreSubscribe(t, b, SubscribeOptions{})
	c := s.q.counts()
	assert.Equal(t, DefaultMaxQueued, c.maxQueued)
	assert.Equal(t, DefaultMaxQueuedBytes, c.maxBytes)
}

func TestNewKeepsPositiveOptions(t *testing.T) {
	b, err := New(Options{
		RingSize: 1, RingMaxBytes: 2, MaxEventBytes: 3, MaxSubscribers: 4,
		MaxQueued: 5, MaxQueuedBytes: 6, ReplayBudgetBytes: 7,
	})
	require.NoError(t, err)
	defer b.Close()
	o := b.opts
	assert.Equal(t, []int{1, 2, 3, 4, 5, 6, 7},
		[]int{o.RingSize, o.RingMaxBytes, o.MaxEventBytes, o.MaxSubscribers, o.MaxQueued, o.MaxQueuedBytes, o.ReplayBudgetBytes})
}

func TestNewRejectsNegativeOptions(t *testing.T) {
	for name, set := range map[string]func(*Options){
		"RingSize":          func(o *Options) { o.RingSize = -1 },
		"RingMaxBytes":      func(o *Options) { o.RingMaxBytes = -1 },
		"MaxEventBytes":     func(o *Options) { o.MaxEventBytes = -1 },
		"MaxSubscribers":    func(o *Options) { o.MaxSubscribers = -1 },
		"MaxQueued":         func(o *Options) { o.MaxQueued = -1 },
		"MaxQueuedBytes":    func(o *Options) { o.MaxQueuedBytes = -1 },
		"ReplayBudgetBytes": func(o *Options) { o.ReplayBudgetBytes = -1 },
	} {
		t.Run(name, func(t *testing.T) {
			var o Options
			set(&o)
			b, err := New(o)
			require.Error(t, err)
			assert.Nil(t, b)
			assert.ErrorIs(t, err, ErrInvalidOption)
			assert.Contains(t, err.Error(), name)
		})
	}
}

func TestNewRejectsRingSizeAboveMaxRingSize(t *testing.T) {
	b, err := New(Options{RingSize: MaxRingSize})
	require.NoError(t, err)
	require.NoError(t, b.Close())

	_, err = New(Options{RingSize: MaxRingSize + 1})
	assert.ErrorIs(t, err, ErrInvalidOption)
}

func TestNewRingSizeBoundsTheRing(t *testing.T) {
	b := newCoreBus(t, Options{RingSize: 3})
	corePublishN(t, b, 10)
	assert.Equal(t, 3, b.ring.Len())
	assert.Equal(t, uint64(8), b.ring.firstID())
}

func TestNewRingMaxBytesBoundsTheRing(t *testing.T) {
	b := newCoreBus(t, Options{RingMaxBytes: 1000})
	for range 10 {
		corePublishSized(t, b, 300)
	}
	assert.Equal(t, 3, b.ring.Len())
	assert.Equal(t, 900, b.ring.Bytes())
	assert.Equal(t, uint64(8), b.ring.firstID())
}

func TestNewMaxEventBytesLimitsPublish(t *testing.T) {
	b := newCoreBus(t, Options{MaxEventBytes: 200})
	corePublishSized(t, b, 200)
	_, err := b.Publish(coreSizedEvent(t, 2, 201))
	assert.ErrorIs(t, err, ErrEventTooLarge)
}

func TestNewMaxSubscribersLimitsSubscribe(t *testing.T) {
	b := newCoreBus(t, Options{MaxSubscribers: 2})
	coreSubscribe(t, b, SubscribeOptions{})
	coreSubscribe(t, b, SubscribeOptions{})
	_, err := b.Subscribe(context.Background(), SubscribeOptions{})
	assert.ErrorIs(t, err, ErrSubscriberLimitExceeded)
}

func TestNewMaxQueuedIsTheSubscriptionDefault(t *testing.T) {
	b := newCoreBus(t, Options{MaxQueued: 20})
	def := coreSubscribe(t, b, SubscribeOptions{})
	own := coreSubscribe(t, b, SubscribeOptions{MaxQueued: 30})
	assert.Equal(t, 20, def.q.counts().maxQueued)
	assert.Equal(t, 30, own.q.counts().maxQueued)

	corePublishN(t, b, 21) // the 21st overflows the default subscriber only
	fs, open := corePending(def)
	assert.False(t, open)
	assert.Equal(t, TypeClientEvicted, fs[len(fs)-1].Type())
	assert.Equal(t, 1, b.SubscriberCount())
	assert.Equal(t, 21, own.q.counts().liveCount)
}

func TestNewMaxQueuedBytesCapsEverySubscription(t *testing.T) {
	b := newCoreBus(t, Options{MaxQueuedBytes: 1000})
	s1 := coreSubscribe(t, b, SubscribeOptions{})
	s2 := coreSubscribe(t, b, SubscribeOptions{MaxQueued: 2048})
	corePublishSized(t, b, 600)
	corePublishSized(t, b, 600)
	for _, s := range []*Subscription{s1, s2} {
		fs, open := corePending(s)
		assert.False(t, open)
		assert.Equal(t, []string{"#1", TypeClientEvicted}, coreDescribe(fs))
		assert.ErrorIs(t, s.Err(), ErrEvicted)
	}
}

func TestNewReplayBudgetBytesLimitsResume(t *testing.T) {
	b := newCoreBus(t, Options{ReplayBudgetBytes: 1000})
	for range 5 {
		corePublishSized(t, b, 300)
	}
	s := coreSubscribe(t, b, SubscribeOptions{Resume: true})
	fs, _ := corePending(s)
	assert.Equal(t, coreSeq(coreIDs(1, 3), TypeStateResyncRequired, TypeReplayComplete), coreDescribe(fs))
}

func TestNewLoggerReceivesDiagnostics(t *testing.T) {
	logger, buf := coreLogger()
	b := newCoreBus(t, Options{Logger: logger})
	_, err := b.Publish(Event{Type: ""})
	require.Error(t, err)
	assert.Contains(t, buf.String(), "publish rejected")
	assert.Contains(t, buf.String(), `"level":"WARN"`)
}

func TestNewNilLoggerUsesSlogDefault(t *testing.T) {
	logger, buf := coreLogger()
	old := slog.Default()
	slog.SetDefault(logger)
	defer slog.SetDefault(old)

	b, err := New(Options{Now: coreNow})
	require.NoError(t, err)
	defer b.Close()
	_, err = b.Publish(Event{Type: "a\nb"})
	require.Error(t, err)
	assert.Contains(t, buf.String(), "publish rejected")
}

func TestSubscribeRejectsNegativeMaxQueued(t *testing.T) {
	b := newCoreBus(t, Options{})
	s, err := b.Subscribe(context.Background(), SubscribeOptions{MaxQueued: -1})
	assert.ErrorIs(t, err, ErrInvalidOption)
	assert.Nil(t, s)
	assert.Equal(t, 0, b.SubscriberCount())
}

// ---------------------------------------------------------------------------
// Publish (SPEC 3, 4).

func TestPublishAssignsContiguousIDsFromOne(t *testing.T) {
	b := newCoreBus(t, Options{})
	s := coreSubscribe(t, b, SubscribeOptions{})
	fs := corePublishN(t, b, 3)
	assert.Equal(t, []string{"#1", "#2", "#3"}, coreDescribe(fs))
	got, _ := corePending(s)
	assert.Equal(t, []string{"#1", "#2", "#3"}, coreDescribe(got))
	for i, f := range fs {
		assert.True(t, bytes.HasPrefix(f.JSON(), fmt.Appendf(nil, `{"id":%d,`, i+1)), "%s", f.JSON())
	}
}

func TestPublishStampsSchemaVersion(t *testing.T) {
	b := newCoreBus(t, Options{})
	f := corePublish(t, b, Event{Type: "t"})
	var env map[string]any
	require.NoError(t, json.Unmarshal(f.JSON(), &env))
	assert.Equal(t, float64(SchemaVersion), env["v"])
	assert.Equal(t, 1, SchemaVersion)
}

func TestPublishEnvelopeFieldOrder(t *testing.T) {
	b := newCoreBus(t, Options{})
	f := corePublish(t, b, Event{
		Type:               "session_update",
		Data:               map[string]any{"b": 2, "a": 1},
		Meta:               map[string]any{"trace": "x", "region": "eu"},
		OriginatorClientID: "c1",
	})
	assert.Equal(t,
		`{"id":1,"v":1,"type":"session_update","data":{"a":1,"b":2},"_meta":{"serverTimestamp":1719000000000,"region":"eu","trace":"x"},"originatorClientId":"c1"}`,
		string(f.JSON()))

	// Without data and originator both are left out.
	f = corePublish(t, b, Event{Type: "ping"})
	assert.Equal(t, `{"id":2,"v":1,"type":"ping","_meta":{"serverTimestamp":1719000000000}}`, string(f.JSON()))

	// An empty RawMessage is "absent" too; JSON null is a value.
	f = corePublish(t, b, Event{Type: "ping", Data: json.RawMessage{}})
	assert.Equal(t, `{"id":3,"v":1,"type":"ping","_meta":{"serverTimestamp":1719000000000}}`, string(f.JSON()))
	f = corePublish(t, b, Event{Type: "ping", Data: json.RawMessage("null")})
	assert.Equal(t, `{"id":4,"v":1,"type":"ping","data":null,"_meta":{"serverTimestamp":1719000000000}}`, string(f.JSON()))
}

func TestPublishReturnsTheStampedFrame(t *testing.T) {
	b := newCoreBus(t, Options{})
	s := coreSubscribe(t, b, SubscribeOptions{})
	f := corePublish(t, b, Event{Type: "t", Data: 1})
	assert.Equal(t, uint64(1), f.ID())
	assert.Equal(t, "t", f.Type())
	assert.False(t, f.Synthetic())
	assert.False(t, f.Terminal())
	got, _ := corePending(s)
	require.Len(t, got, 1)
	assert.Equal(t, f.String(), got[0].String())
}

func TestPublishStampsServerTimestamp(t *testing.T) {
	b := newCoreBus(t, Options{})
	f := corePublish(t, b, Event{Type: "t"})
	assert.Contains(t, string(f.JSON()), `"_meta":{"serverTimestamp":1719000000000}`)

	// Without Options.Now the wall clock is used.
	real, err := New(Options{})
	require.NoError(t, err)
	defer real.Close()
	before := time.Now().UnixMilli()
	f, err = real.Publish(Event{Type: "t"})
	require.NoError(t, err)
	after := time.Now().UnixMilli()
	var env struct {
		Meta struct {
			ServerTimestamp int64 `json:"serverTimestamp"`
		} `json:"_meta"`
	}
	require.NoError(t, json.Unmarshal(f.JSON(), &env))
	assert.GreaterOrEqual(t, env.Meta.ServerTimestamp, before)
	assert.LessOrEqual(t, env.Meta.ServerTimestamp, after)
}

func TestPublishKeepsFiniteCallerTimestamp(t *testing.T) {
	for _, tc := range []struct {
		name string
		ts   any
		want string
	}{
		{"float64", float64(1700000000123), "1700000000123"},
		{"fraction", 1.5, "1.5"},
		{"float32", float32(2.5), "2.5"},
		{"int", 42, "42"},
		{"int64", int64(-7), "-7"},
		{"uint8", uint8(9), "9"},
		{"json.Number", json.Number("1700000000999"), "1700000000999"},
		{"json.Number exponent", json.Number("1.7e12"), "1.7e12"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newCoreBus(t, Options{})
			f := corePublish(t, b, Event{Type: "t", Meta: map[string]any{"serverTimestamp": tc.ts}})
			assert.Equal(t, `{"id":1,"v":1,"type":"t","_meta":{"serverTimestamp":`+tc.want+`}}`, string(f.JSON()))
		})
	}
}

func TestPublishReplacesNonFiniteOrNonNumberTimestamp(t *testing.T) {
	for _, tc := range []struct {
		name string
		ts   any
	}{
		{"NaN", math.NaN()},
		{"+Inf", math.Inf(1)},
		{"-Inf", math.Inf(-1)},
		{"float32 NaN", float32(math.NaN())},
		{"string", "1700000000000"},
		{"nil", nil},
		{"bool", true},
		{"object", map[string]int{"x": 1}},
		{"json.Number garbage", json.Number("abc")},
		{"json.Number NaN", json.Number("NaN")},
		{"json.Number Inf", json.Number("Inf")},
		{"json.Number out of range", json.Number("1e999")},
		{"json.Number hex", json.Number("0x1p4")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newCoreBus(t, Options{})
			f, err := b.Publish(Event{Type: "t", Meta: map[string]any{"serverTimestamp": tc.ts, "k": 1}})
			require.NoError(t, err)
			assert.Equal(t, `{"id":1,"v":1,"type":"t","_meta":{"serverTimestamp":1719000000000,"k":1}}`, string(f.JSON()))
		})
	}
}

func TestPublishKeepsOtherMetaKeys(t *testing.T) {
	b := newCoreBus(t, Options{})
	f := corePublish(t, b, Event{Type: "t", Meta: map[string]any{
		"z":      []int{1, 2},
		"a":      "x",
		"nested": map[string]any{"k": true},
		"nil":    nil,
	}})
	assert.Equal(t,
		`{"id":1,"v":1,"type":"t","_meta":{"serverTimestamp":1719000000000,"a":"x","nested":{"k":true},"nil":null,"z":[1,2]}}`,
		string(f.JSON()))
}

func TestPublishCallerCannotSetIDOrVersion(t *testing.T) {
	b := newCoreBus(t, Options{})
	corePublishN(t, b, 4)
	f := corePublish(t, b, Event{
		Type: "t",
		Data: map[string]any{"id": 999, "v": 7},
		Meta: map[string]any{"id": 999, "v": 7},
	})
	var env struct {
		ID   uint64 `json:"id"`
		V    int    `json:"v"`
		Data struct {
			ID int `json:"id"`
			V  int `json:"v"`
		} `json:"data"`
	}
	// The top-level id and v are the first members; json.Unmarshal keeps
	// the last duplicate, so check there is exactly one of each at the top.
	require.NoError(t, json.Unmarshal(f.JSON(), &env))
	assert.Equal(t, uint64(5), env.ID)
	assert.Equal(t, 1, env.V)
	assert.Equal(t, 999, env.Data.ID)
	assert.Equal(t, uint64(5), f.ID())
	assert.True(t, bytes.HasPrefix(f.JSON(), []byte(`{"id":5,"v":1,"type":"t",`)))
	assert.Equal(t, 1, bytes.Count(f.JSON(), []byte(`"id":5`)))
	assert.Equal(t, 1, bytes.Count(f.JSON(), []byte(`"v":1`)))
	assert.Equal(t, uint64(5), b.LastEventID())
}

func TestPublishRejectsEmptyType(t *testing.T) {
	logger, buf := coreLogger()
	b := newCoreBus(t, Options{Logger: logger})
	s := coreSubscribe(t, b, SubscribeOptions{})
	_, err := b.Publish(Event{Type: "", Data: 1})
	assert.ErrorIs(t, err, ErrInvalidEvent)
	assert.Contains(t, buf.String(), "publish rejected")
	assert.Equal(t, uint64(0), b.LastEventID())
	fs, _ := corePending(s)
	assert.Empty(t, fs)
}

func TestPublishRejectsTypeWithCROrLF(t *testing.T) {
	b := newCoreBus(t, Options{})
	for _, typ := range []string{"a\nb", "a\rb", "\r\n", "trailing\n"} {
		_, err := b.Publish(Event{Type: typ})
		assert.ErrorIs(t, err, ErrInvalidEvent, "%q", typ)
	}
	assert.Equal(t, uint64(0), b.LastEventID())
	assert.Equal(t, 0, b.ring.Len())
}

type coreCycle struct{ Next *coreCycle }

type coreErrMarshaler struct{}

func (coreErrMarshaler) MarshalJSON() ([]byte, error) { return nil, errors.New("boom") }

type corePanicMarshaler struct{}

func (corePanicMarshaler) MarshalJSON() ([]byte, error) { panic("kaboom") }

type coreBadJSONMarshaler struct{}

func (coreBadJSONMarshaler) MarshalJSON() ([]byte, error) { return []byte("{nope"), nil }

func TestPublishRejectsUnserializableData(t *testing.T) {
	cycle := &coreCycle{}
	cycle.Next = cycle
	for _, tc := range []struct {
		name string
		e    Event
	}{
		{"channel", Event{Type: "t", Data: make(chan int)}},
		{"func", Event{Type: "t", Data: func() {}}},
		{"NaN", Event{Type: "t", Data: math.NaN()}},
		{"NaN in a map", Event{Type: "t", Data: map[string]float64{"x": math.Inf(1)}}},
		{"pointer cycle", Event{Type: "t", Data: cycle}},
		{"MarshalJSON error", Event{Type: "t", Data: coreErrMarshaler{}}},
		{"MarshalJSON panic", Event{Type: "t", Data: corePanicMarshaler{}}},
		{"MarshalJSON invalid JSON", Event{Type: "t", Data: coreBadJSONMarshaler{}}},
		{"channel in _meta", Event{Type: "t", Meta: map[string]any{"c": make(chan int)}}},
		{"panic in _meta", Event{Type: "t", Meta: map[string]any{"p": corePanicMarshaler{}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger, buf := coreLogger()
			b := newCoreBus(t, Options{Logger: logger})
			s := coreSubscribe(t, b, SubscribeOptions{})
			corePublish(t, b, Event{Type: "before"})

			var err error
			require.NotPanics(t, func() { _, err = b.Publish(tc.e) })
			require.ErrorIs(t, err, ErrInvalidEvent)
			assert.Contains(t, buf.String(), "publish rejected")
			assert.Contains(t, buf.String(), `"type":"t"`)
			assert.Equal(t, uint64(1), b.LastEventID())

			after := corePublish(t, b, Event{Type: "after"})
			assert.Equal(t, uint64(2), after.ID(), "the rejected event used no id")
			fs, _ := corePending(s)
			assert.Equal(t, []string{"#1", "#2"}, coreDescribe(fs))
			assert.Equal(t, 2, b.ring.Len())
		})
	}
}

func TestPublishRejectsEventAboveMaxEventBytes(t *testing.T) {
	logger, buf := coreLogger()
	b := newCoreBus(t, Options{MaxEventBytes: 500, Logger: logger})
	s := coreSubscribe(t, b, SubscribeOptions{})

	_, err := b.Publish(coreSizedEvent(t, 1, 501))
	require.ErrorIs(t, err, ErrEventTooLarge)
	assert.NotErrorIs(t, err, ErrInvalidEvent)
	assert.Contains(t, buf.String(), "publish rejected")
	assert.Equal(t, uint64(0), b.LastEventID())

	f := corePublishSized(t, b, 500) // exactly MaxEventBytes passes
	assert.Equal(t, uint64(1), f.ID())

	// The boundary holds across an id digit change too.
	for b.LastEventID() < 9 {
		corePublishSized(t, b, 200)
	}
	_, err = b.Publish(coreSizedEvent(t, 10, 501))
	require.ErrorIs(t, err, ErrEventTooLarge)
	f = corePublishSized(t, b, 500)
	assert.Equal(t, uint64(10), f.ID())

	fs, _ := corePending(s)
	assert.Equal(t, coreIDs(1, 10), coreDescribe(fs))
}

func TestPublishCompactsRawMessage(t *testing.T) {
	b := newCoreBus(t, Options{})
	raw := json.RawMessage("{\n  \"a\" : 1,\r\n\t\"b\": [ 1, 2 ],\n  \"s\": \"x <y> \\n\"\n}\n")
	f := corePublish(t, b, Event{Type: "t", Data: raw})
	assert.Equal(t, `{"a":1,"b":[1,2],"s":"x <y> \n"}`, coreData(t, f))
	assert.False(t, bytes.ContainsAny(f.JSON(), "\r\n"))
	assert.NotContains(t, strings.ReplaceAll(string(f.JSON()), "x <y> ", ""), " ", "whitespace outside strings is removed")

	// A RawMessage in _meta is compacted as well.
	f = corePublish(t, b, Event{Type: "t", Meta: map[string]any{"m": json.RawMessage("[ 1,\n 2 ]")}})
	assert.Contains(t, string(f.JSON()), `"m":[1,2]`)
}

func TestPublishRejectsInvalidRawMessage(t *testing.T) {
	b := newCoreBus(t, Options{})
	for _, raw := range []string{`{"a":`, `nope`, `{"a":1} {"b":2}`, "\"line\nbreak\""} {
		_, err := b.Publish(Event{Type: "t", Data: json.RawMessage(raw)})
		assert.ErrorIs(t, err, ErrInvalidEvent, "%q", raw)
	}
	assert.Equal(t, uint64(0), b.LastEventID())
}

func TestPublishOnClosedBusReturnsErrClosed(t *testing.T) {
	logger, buf := coreLogger()
	b := newCoreBus(t, Options{Logger: logger})
	corePublishN(t, b, 2)
	require.NoError(t, b.Close())

	f, err := b.Publish(Event{Type: "t"})
	assert.ErrorIs(t, err, ErrClosed)
	assert.Equal(t, Frame{}, f)
	// Even an invalid event: the closed check comes first and is silent.
	_, err = b.Publish(Event{Type: ""})
	assert.ErrorIs(t, err, ErrClosed)
	assert.Equal(t, uint64(2), b.LastEventID(), "no id used")
	assert.Empty(t, buf.String())
}

func TestPublishNeverBlocksOnSubscriberThatNeverReads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newCoreBus(t, Options{MaxQueued: 16})
		stuck := coreSubscribe(t, b, SubscribeOptions{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for range 10_000 {
				if _, err := b.Publish(Event{Type: "t", Data: "x"}); err != nil {
					panic(err)
				}
			}
		}()
		synctest.Wait() // every goroutine is done or durably blocked
		select {
		case <-done:
		default:
			t.Fatal("Publish blocked")
		}
		assert.Equal(t, uint64(10_000), b.LastEventID())
		assert.Equal(t, 0, b.SubscriberCount())
		assert.ErrorIs(t, stuck.Err(), ErrEvicted)
	})
}

func TestPublishEnvelopeNeverContainsCROrLF(t *testing.T) {
	b := newCoreBus(t, Options{})
	s := coreSubscribe(t, b, SubscribeOptions{})
	nasty := "a\r\nb\rc\nd\u2028e\u2029f\x00"
	f := corePublish(t, b, Event{
		Type:               "t",
		Data:               map[string]any{"s": nasty, nasty: []string{nasty}},
		Meta:               map[string]any{nasty: nasty},
		OriginatorClientID: nasty,
	})
	for _, g := range []Frame{f, coreOne(t, s)} {
		assert.False(t, bytes.ContainsAny(g.JSON(), "\r\n"), "%q", g.JSON())
		// The wire has exactly the framing newlines.
		assert.Equal(t, 4, bytes.Count(g.AppendSSE(nil), []byte("\n")))
		assert.Equal(t, 0, bytes.Count(g.AppendSSE(nil), []byte("\r")))
		var env struct {
			Data map[string]any   `json:"data"`
			Meta map[string]any   `json:"_meta"`
			Orig string           `json:"originatorClientId"`
			Rest map[string][]int `json:"-"`
		}
		require.NoError(t, json.Unmarshal(g.JSON(), &env))
		assert.Equal(t, nasty, env.Data["s"])
		assert.Equal(t, nasty, env.Meta[nasty])
		assert.Equal(t, nasty, env.Orig)
	}
}

func coreOne(t testing.TB, s *Subscription) Frame {
	t.Helper()
	fs, _ := corePending(s)
	require.Len(t, fs, 1)
	return fs[0]
}

// coreCountingMarshaler counts its MarshalJSON calls.
type coreCountingMarshaler struct{ calls *atomic.Int32 }

func (c coreCountingMarshaler) MarshalJSON() ([]byte, error) {
	c.calls.Add(1)
	return []byte(`{"counted":true}`), nil
}

func TestPublishEncodesOnceForAllSubscribersAndReplay(t *testing.T) {
	b := newCoreBus(t, Options{MaxSubscribers: 64})
	subs := make([]*Subscription, 64)
	for i := range subs {
		subs[i] = coreSubscribe(t, b, SubscribeOptions{})
	}
	var calls atomic.Int32
	f := corePublish(t, b, Event{Type: "t", Data: coreCountingMarshaler{&calls}})
	assert.Equal(t, int32(1), calls.Load())

	first := &f.JSON()[0]
	for i, s := range subs {
		g := coreOne(t, s)
		assert.Same(t, first, &g.JSON()[0], "subscriber %d got its own copy", i)
	}

	// A resuming subscriber gets the very same bytes from the ring.
	subs[0].Close()
	r := coreSubscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 0})
	fs, _ := corePending(r)
	require.Equal(t, []string{"#1", TypeReplayComplete}, coreDescribe(fs))
	assert.Same(t, first, &fs[0].JSON()[0])
	assert.Equal(t, int32(1), calls.Load())
}

// ---------------------------------------------------------------------------
// Accessors.

func TestLastEventIDIsZeroBeforeFirstPublish(t *testing.T) {
	b := newCoreBus(t, Options{})
	assert.Equal(t, uint64(0), b.LastEventID())
	corePublishN(t, b, 3)
	assert.Equal(t, uint64(3), b.LastEventID())
	_, _ = b.Publish(Event{}) // rejected: no change
	assert.Equal(t, uint64(3), b.LastEventID())
}

func TestEpochIs32LowercaseHexAndDiffersBetweenBuses(t *testing.T) {
	hex32 := regexp.MustCompile(`^[0-9a-f]{32}$`)
	seen := map[string]bool{}
	for range 20 {
		b := newCoreBus(t, Options{})
		assert.Regexp(t, hex32, b.Epoch())
		assert.Equal(t, b.Epoch(), b.Epoch(), "stable for the bus")
		assert.False(t, seen[b.Epoch()], "epoch repeated")
		seen[b.Epoch()] = true
	}
}

func TestSubscriberCountTracksSubscriptions(t *testing.T) {
	b := newCoreBus(t, Options{MaxQueued: 16})
	assert.Equal(t, 0, b.SubscriberCount())
	s1 := coreSubscribe(t, b, SubscribeOptions{})
	s2 := coreSubscribe(t, b, SubscribeOptions{})
	s3 := coreSubscribe(t, b, SubscribeOptions{MaxQueued: 100})
	assert.Equal(t, 3, b.SubscriberCount())
	s1.Close()
	assert.Equal(t, 2, b.SubscriberCount())
	corePublishN(t, b, 17) // evicts s2
	assert.ErrorIs(t, s2.Err(), ErrEvicted)
	assert.Equal(t, 1, b.SubscriberCount())
	require.NoError(t, b.Close())
	assert.Equal(t, 0, b.SubscriberCount())
	assert.NoError(t, s3.Err())
}

// ---------------------------------------------------------------------------
// Subscribe (SPEC 5).

func TestSubscribeRegistersSynchronously(t *testing.T) {
	b := newCoreBus(t, Options{})
	s := coreSubscribe(t, b, SubscribeOptions{})
	corePublish(t, b, Event{Type: "t"})
	fs, open := corePending(s)
	assert.True(t, open)
	assert.Equal(t, []string{"#1"}, coreDescribe(fs))

	// The same holds for a concurrent publisher: whatever is published after
	// Subscribe returns is delivered.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				_, _ = b.Publish(Event{Type: "bg"})
			}
		}
	})
	for range 50 {
		s := coreSubscribe(t, b, SubscribeOptions{MaxQueued: 2048})
		after := b.LastEventID()
		f := corePublish(t, b, Event{Type: "mine"})
		fs, _ := corePending(s)
		require.NotEmpty(t, fs)
		assert.LessOrEqual(t, fs[0].ID(), after+1)
		assert.Equal(t, f.ID(), fs[len(fs)-1].ID())
		s.Close()
	}
	close(stop)
	wg.Wait()
}

func TestSubscribeLimitReturnsSubscriberLimitError(t *testing.T) {
	b := newCoreBus(t, Options{MaxSubscribers: 3})
	for range 3 {
		coreSubscribe(t, b, SubscribeOptions{})
	}
	s, err := b.Subscribe(context.Background(), SubscribeOptions{})
	assert.Nil(t, s)
	require.ErrorIs(t, err, ErrSubscriberLimitExceeded)
	var lim *SubscriberLimitError
	require.ErrorAs(t, err, &lim)
	assert.Equal(t, 3, lim.Limit)
	assert.Contains(t, err.Error(), "3")
	assert.Equal(t, 3, b.SubscriberCount())
}

func TestSubscribeLimitReleasesTheContextWatch(t *testing.T) {
	b := newCoreBus(t, Options{MaxSubscribers: 1})
	coreSubscribe(t, b, SubscribeOptions{})
	ctx := newCoreWatchCtx()
	_, err := b.Subscribe(ctx, SubscribeOptions{})
	require.ErrorIs(t, err, ErrSubscriberLimitExceeded)
	assert.Equal(t, 0, ctx.watchers())
}

func TestSubscribeOnClosedBusReturnsEndedSubscription(t *testing.T) {
	b := newCoreBus(t, Options{})
	corePublishN(t, b, 3)
	require.NoError(t, b.Close())
	ctx := newCoreWatchCtx()
	s, err := b.Subscribe(ctx, SubscribeOptions{Resume: true})
	require.NoError(t, err)
	require.NotNil(t, s)
	assert.Empty(t, coreCollect(s))
	assert.NoError(t, s.Err())
	assert.Equal(t, 0, b.SubscriberCount())
	assert.Equal(t, 0, ctx.watchers())
	fs, open := corePending(s)
	assert.Empty(t, fs)
	assert.False(t, open)
}

func TestSubscribeWithDoneContextReturnsEndedSubscription(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newCoreBus(t, Options{})
		coreSubscribe(t, b, SubscribeOptions{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		s, err := b.Subscribe(ctx, SubscribeOptions{Resume: true})
		require.NoError(t, err)
		require.NotNil(t, s)
		assert.Equal(t, 1, b.SubscriberCount())
		corePublishN(t, b, 2)
		assert.Empty(t, coreCollect(s))
		assert.ErrorIs(t, s.Err(), context.Canceled)
		synctest.Wait()
		assert.Equal(t, 1, b.SubscriberCount())

		// A done context is not even watched.
		wc := newCoreWatchCtx()
		wc.cancel()
		s, err = b.Subscribe(wc, SubscribeOptions{})
		require.NoError(t, err)
		assert.Equal(t, 0, wc.watchers())
		assert.Empty(t, coreCollect(s))
		assert.Equal(t, 1, b.SubscriberCount())
	})
}

func TestSubscribeChecksInSpecOrder(t *testing.T) {
	done, cancel := context.WithCancel(context.Background())
	cancel()

	// Options come before a closed bus.
	closed := newCoreBus(t, Options{})
	require.NoError(t, closed.Close())
	_, err := closed.Subscribe(context.Background(), SubscribeOptions{MaxQueued: -1})
	assert.ErrorIs(t, err, ErrInvalidOption)

	// A closed bus comes before a done context (either way: ended, no error).
	s, err := closed.Subscribe(done, SubscribeOptions{})
	require.NoError(t, err)
	assert.NoError(t, s.Err(), "ended by the closed bus, not by the context")

	// A done context comes before the subscriber limit.
	full := newCoreBus(t, Options{MaxSubscribers: 1})
	coreSubscribe(t, full, SubscribeOptions{})
	s, err = full.Subscribe(done, SubscribeOptions{})
	require.NoError(t, err)
	assert.Empty(t, coreCollect(s))
}

func TestSubscribeResumeFalseDiffersFromResumeFromZero(t *testing.T) {
	b := newCoreBus(t, Options{})
	corePublishN(t, b, 3)
	live := coreSubscribe(t, b, SubscribeOptions{LastEventID: 0})
	fromStart := coreSubscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 0})
	// LastEventID without Resume is ignored.
	ignored := coreSubscribe(t, b, SubscribeOptions{LastEventID: 1})
	corePublish(t, b, Event{Type: "t"})

	fs, _ := corePending(live)
	assert.Equal(t, []string{"#4"}, coreDescribe(fs))
	fs, _ = corePending(ignored)
	assert.Equal(t, []string{"#4"}, coreDescribe(fs))
	fs, _ = corePending(fromStart)
	assert.Equal(t, coreSeq(coreIDs(1, 3), TypeReplayComplete, "#4"), coreDescribe(fs))
}
