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
	"slices"
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
	return len(fmt.Sprintf(`{"id":%d,"v":1,"type":"t","data":"","_meta":{"serverTimestamp":%d}}`, id, testStamp))
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

// coreDescribe renders frames for order assertions: "#<id>" for events,
// "sig:<type>/<about>" for signals, the type for synthetic frames.
func coreDescribe(fs []Frame) []string {
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
	s := subscribe(t, b, SubscribeOptions{})
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
	b := newBus(t, Options{RingSize: 3})
	corePublishN(t, b, 10)
	assert.Equal(t, 3, b.ring.Len())
	assert.Equal(t, uint64(8), b.ring.firstID())
}

func TestNewRingMaxBytesBoundsTheRing(t *testing.T) {
	b := newBus(t, Options{RingMaxBytes: 1000})
	for range 10 {
		corePublishSized(t, b, 300)
	}
	assert.Equal(t, 3, b.ring.Len())
	assert.Equal(t, 900, b.ring.Bytes())
	assert.Equal(t, uint64(8), b.ring.firstID())
}

func TestNewMaxEventBytesLimitsPublish(t *testing.T) {
	b := newBus(t, Options{MaxEventBytes: 200})
	corePublishSized(t, b, 200)
	_, err := b.Publish(coreSizedEvent(t, 2, 201))
	assert.ErrorIs(t, err, ErrEventTooLarge)
}

func TestNewMaxSubscribersLimitsSubscribe(t *testing.T) {
	b := newBus(t, Options{MaxSubscribers: 2})
	subscribe(t, b, SubscribeOptions{})
	subscribe(t, b, SubscribeOptions{})
	_, err := b.Subscribe(context.Background(), SubscribeOptions{})
	assert.ErrorIs(t, err, ErrSubscriberLimitExceeded)
}

func TestNewMaxQueuedIsTheSubscriptionDefault(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 20})
	def := subscribe(t, b, SubscribeOptions{})
	own := subscribe(t, b, SubscribeOptions{MaxQueued: 30})
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
	b := newBus(t, Options{MaxQueuedBytes: 1000})
	s1 := subscribe(t, b, SubscribeOptions{})
	s2 := subscribe(t, b, SubscribeOptions{MaxQueued: 2048})
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
	b := newBus(t, Options{ReplayBudgetBytes: 1000})
	for range 5 {
		corePublishSized(t, b, 300)
	}
	s := subscribe(t, b, SubscribeOptions{Resume: true})
	fs, _ := corePending(s)
	assert.Equal(t, coreSeq(coreIDs(1, 3), TypeStateResyncRequired, TypeReplayComplete), coreDescribe(fs))
}

func TestNewLoggerReceivesDiagnostics(t *testing.T) {
	buf := &logCapture{}
	logger := buf.logger()
	b := newBus(t, Options{Logger: logger})
	_, err := b.Publish(Event{Type: ""})
	require.Error(t, err)
	assert.Contains(t, buf.String(), "publish rejected")
	assert.Contains(t, buf.String(), `"level":"WARN"`)
}

func TestNewNilLoggerUsesSlogDefault(t *testing.T) {
	buf := &logCapture{}
	logger := buf.logger()
	old := slog.Default()
	slog.SetDefault(logger)
	defer slog.SetDefault(old)

	b, err := New(Options{Now: testNow})
	require.NoError(t, err)
	defer b.Close()
	_, err = b.Publish(Event{Type: "a\nb"})
	require.Error(t, err)
	assert.Contains(t, buf.String(), "publish rejected")
}

func TestSubscribeRejectsNegativeMaxQueued(t *testing.T) {
	b := newBus(t, Options{})
	s, err := b.Subscribe(context.Background(), SubscribeOptions{MaxQueued: -1})
	assert.ErrorIs(t, err, ErrInvalidOption)
	assert.Nil(t, s)
	assert.Equal(t, 0, b.SubscriberCount())
}

// ---------------------------------------------------------------------------
// Publish (SPEC 3, 4).

func TestPublishAssignsContiguousIDsFromOne(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	fs := corePublishN(t, b, 3)
	assert.Equal(t, []string{"#1", "#2", "#3"}, coreDescribe(fs))
	got, _ := corePending(s)
	assert.Equal(t, []string{"#1", "#2", "#3"}, coreDescribe(got))
	for i, f := range fs {
		assert.True(t, bytes.HasPrefix(f.JSON(), fmt.Appendf(nil, `{"id":%d,`, i+1)), "%s", f.JSON())
	}
}

func TestPublishStampsSchemaVersion(t *testing.T) {
	b := newBus(t, Options{})
	f := corePublish(t, b, Event{Type: "t"})
	var env map[string]any
	require.NoError(t, json.Unmarshal(f.JSON(), &env))
	assert.Equal(t, float64(SchemaVersion), env["v"])
	assert.Equal(t, 1, SchemaVersion)
}

func TestPublishEnvelopeFieldOrder(t *testing.T) {
	b := newBus(t, Options{})
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
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
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
	b := newBus(t, Options{})
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
			b := newBus(t, Options{})
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
			b := newBus(t, Options{})
			f, err := b.Publish(Event{Type: "t", Meta: map[string]any{"serverTimestamp": tc.ts, "k": 1}})
			require.NoError(t, err)
			assert.Equal(t, `{"id":1,"v":1,"type":"t","_meta":{"serverTimestamp":1719000000000,"k":1}}`, string(f.JSON()))
		})
	}
}

func TestPublishKeepsOtherMetaKeys(t *testing.T) {
	b := newBus(t, Options{})
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
	b := newBus(t, Options{})
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
	buf := &logCapture{}
	logger := buf.logger()
	b := newBus(t, Options{Logger: logger})
	s := subscribe(t, b, SubscribeOptions{})
	_, err := b.Publish(Event{Type: "", Data: 1})
	assert.ErrorIs(t, err, ErrInvalidEvent)
	assert.Contains(t, buf.String(), "publish rejected")
	assert.Equal(t, uint64(0), b.LastEventID())
	fs, _ := corePending(s)
	assert.Empty(t, fs)
}

func TestPublishRejectsTypeWithCROrLF(t *testing.T) {
	b := newBus(t, Options{})
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
			buf := &logCapture{}
			logger := buf.logger()
			b := newBus(t, Options{Logger: logger})
			s := subscribe(t, b, SubscribeOptions{})
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
	buf := &logCapture{}
	logger := buf.logger()
	b := newBus(t, Options{MaxEventBytes: 500, Logger: logger})
	s := subscribe(t, b, SubscribeOptions{})

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
	b := newBus(t, Options{})
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
	b := newBus(t, Options{})
	for _, raw := range []string{`{"a":`, `nope`, `{"a":1} {"b":2}`, "\"line\nbreak\""} {
		_, err := b.Publish(Event{Type: "t", Data: json.RawMessage(raw)})
		assert.ErrorIs(t, err, ErrInvalidEvent, "%q", raw)
	}
	assert.Equal(t, uint64(0), b.LastEventID())
}

func TestPublishOnClosedBusReturnsErrClosed(t *testing.T) {
	buf := &logCapture{}
	logger := buf.logger()
	b := newBus(t, Options{Logger: logger})
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
		b := newBus(t, Options{MaxQueued: 16})
		stuck := subscribe(t, b, SubscribeOptions{})
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
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
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
	b := newBus(t, Options{MaxSubscribers: 64})
	subs := make([]*Subscription, 64)
	for i := range subs {
		subs[i] = subscribe(t, b, SubscribeOptions{})
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
	r := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 0})
	fs, _ := corePending(r)
	require.Equal(t, []string{"#1", TypeReplayComplete}, coreDescribe(fs))
	assert.Same(t, first, &fs[0].JSON()[0])
	assert.Equal(t, int32(1), calls.Load())
}

// ---------------------------------------------------------------------------
// Accessors.

func TestLastEventIDIsZeroBeforeFirstPublish(t *testing.T) {
	b := newBus(t, Options{})
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
		b := newBus(t, Options{})
		assert.Regexp(t, hex32, b.Epoch())
		assert.Equal(t, b.Epoch(), b.Epoch(), "stable for the bus")
		assert.False(t, seen[b.Epoch()], "epoch repeated")
		seen[b.Epoch()] = true
	}
}

func TestSubscriberCountTracksSubscriptions(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16})
	assert.Equal(t, 0, b.SubscriberCount())
	s1 := subscribe(t, b, SubscribeOptions{})
	s2 := subscribe(t, b, SubscribeOptions{})
	s3 := subscribe(t, b, SubscribeOptions{MaxQueued: 100})
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
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
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
		s := subscribe(t, b, SubscribeOptions{MaxQueued: 2048})
		after := b.LastEventID()
		f := corePublish(t, b, Event{Type: "mine"})
		fs, _ := corePending(s)
		require.NotEmpty(t, fs)
		assert.LessOrEqual(t, fs[0].ID(), after+1)
		if errors.Is(s.Err(), ErrEvicted) {
			// A descheduled test goroutine can let the background
			// publisher fill 2048 frames first; that is a legitimate end.
			s.Close()
			continue
		}
		// Background events may follow mine; mine must be among them.
		assert.True(t, slices.ContainsFunc(fs, func(x Frame) bool { return x.ID() == f.ID() }),
			"#%d published after Subscribe returned was not delivered", f.ID())
		s.Close()
	}
	close(stop)
	wg.Wait()
}

func TestSubscribeLimitReturnsSubscriberLimitError(t *testing.T) {
	b := newBus(t, Options{MaxSubscribers: 3})
	for range 3 {
		subscribe(t, b, SubscribeOptions{})
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
	b := newBus(t, Options{MaxSubscribers: 1})
	subscribe(t, b, SubscribeOptions{})
	ctx := newCoreWatchCtx()
	_, err := b.Subscribe(ctx, SubscribeOptions{})
	require.ErrorIs(t, err, ErrSubscriberLimitExceeded)
	assert.Equal(t, 0, ctx.watchers())
}

func TestSubscribeOnClosedBusReturnsEndedSubscription(t *testing.T) {
	b := newBus(t, Options{})
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
		b := newBus(t, Options{})
		subscribe(t, b, SubscribeOptions{})
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
	closed := newBus(t, Options{})
	require.NoError(t, closed.Close())
	_, err := closed.Subscribe(context.Background(), SubscribeOptions{MaxQueued: -1})
	assert.ErrorIs(t, err, ErrInvalidOption)

	// A closed bus comes before a done context (either way: ended, no error).
	s, err := closed.Subscribe(done, SubscribeOptions{})
	require.NoError(t, err)
	assert.NoError(t, s.Err(), "ended by the closed bus, not by the context")

	// A done context comes before the subscriber limit.
	full := newBus(t, Options{MaxSubscribers: 1})
	subscribe(t, full, SubscribeOptions{})
	s, err = full.Subscribe(done, SubscribeOptions{})
	require.NoError(t, err)
	assert.Empty(t, coreCollect(s))
}

func TestSubscribeResumeFalseDiffersFromResumeFromZero(t *testing.T) {
	b := newBus(t, Options{})
	corePublishN(t, b, 3)
	live := subscribe(t, b, SubscribeOptions{LastEventID: 0})
	fromStart := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 0})
	// LastEventID without Resume is ignored.
	ignored := subscribe(t, b, SubscribeOptions{LastEventID: 1})
	corePublish(t, b, Event{Type: "t"})

	fs, _ := corePending(live)
	assert.Equal(t, []string{"#4"}, coreDescribe(fs))
	fs, _ = corePending(ignored)
	assert.Equal(t, []string{"#4"}, coreDescribe(fs))
	fs, _ = corePending(fromStart)
	assert.Equal(t, coreSeq(coreIDs(1, 3), TypeReplayComplete, "#4"), coreDescribe(fs))
}

// ---------------------------------------------------------------------------
// Resume (SPEC 5.1 - 5.4).

func TestResumeWithoutLastIDIsLiveOnly(t *testing.T) {
	b := newBus(t, Options{})
	corePublishN(t, b, 3)
	s := subscribe(t, b, SubscribeOptions{})
	fs, open := corePending(s)
	assert.True(t, open)
	assert.Empty(t, fs, "no replay, no replay_complete")
	corePublishN(t, b, 1)
	fs, _ = corePending(s)
	assert.Equal(t, []string{"#4"}, coreDescribe(fs))
}

func TestResumeReplaysContiguousEventsThenReplayComplete(t *testing.T) {
	b := newBus(t, Options{})
	published := corePublishN(t, b, 5)
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 2})
	corePublishN(t, b, 1)
	fs, _ := corePending(s)
	require.Equal(t, coreSeq(coreIDs(3, 5), TypeReplayComplete, "#6"), coreDescribe(fs))
	for i, f := range fs[:3] {
		assert.Equal(t, published[i+2].String(), f.String(), "replayed frames are the published bytes")
	}
	rc := fs[3]
	assert.True(t, rc.Synthetic())
	assert.Equal(t, uint64(0), rc.ID())
	assert.Equal(t, coreWithEpoch(b, `{"replayedCount":3,"lastReplayedEventId":5,"lastEventId":5,"epoch":"EPOCH"}`), coreData(t, rc))
	assert.Equal(t,
		coreWithEpoch(b, `{"v":1,"type":"replay_complete","data":{"replayedCount":3,"lastReplayedEventId":5,"lastEventId":5,"epoch":"EPOCH"},"_meta":{"serverTimestamp":1719000000000}}`),
		string(rc.JSON()))
}

func TestResumeAtLatestSendsReplayedCountZero(t *testing.T) {
	b := newBus(t, Options{})
	corePublishN(t, b, 5)
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 5})
	fs, _ := corePending(s)
	require.Equal(t, []string{TypeReplayComplete}, coreDescribe(fs))
	assert.Equal(t, coreWithEpoch(b, `{"replayedCount":0,"epoch":"EPOCH"}`), coreData(t, fs[0]))

	// From the start on a bus that has published nothing: the same.
	empty := newBus(t, Options{})
	s = subscribe(t, empty, SubscribeOptions{Resume: true, LastEventID: 0})
	fs, _ = corePending(s)
	require.Equal(t, []string{TypeReplayComplete}, coreDescribe(fs))
	assert.Equal(t, coreWithEpoch(empty, `{"replayedCount":0,"epoch":"EPOCH"}`), coreData(t, fs[0]))
}

func TestResumeAfterRingEvictionSendsRingEvictedResync(t *testing.T) {
	b := newBus(t, Options{RingSize: 3})
	corePublishN(t, b, 10) // the ring holds 8..10
	for _, n := range []uint64{0, 5, 6} {
		s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: n})
		fs, _ := corePending(s)
		require.Equal(t, coreSeq(TypeStateResyncRequired, coreIDs(8, 10), TypeReplayComplete), coreDescribe(fs), "N=%d", n)
		assert.Equal(t,
			coreWithEpoch(b, fmt.Sprintf(`{"reason":"ring_evicted","lastDeliveredId":%d,"earliestAvailableId":8,"epoch":"EPOCH"}`, n)),
			coreData(t, fs[0]))
		assert.Equal(t, coreWithEpoch(b, `{"replayedCount":3,"lastReplayedEventId":10,"lastEventId":10,"epoch":"EPOCH"}`), coreData(t, fs[4]))
		s.Close()
	}
}

func TestResumeAtRingBoundaryDoesNotResync(t *testing.T) {
	b := newBus(t, Options{RingSize: 3})
	corePublishN(t, b, 10)
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 7}) // N == ring[0].id-1
	fs, _ := corePending(s)
	assert.Equal(t, coreSeq(coreIDs(8, 10), TypeReplayComplete), coreDescribe(fs))
}

func TestResumeAfterRingMaxBytesEvictionSendsRingEvictedResync(t *testing.T) {
	b := newBus(t, Options{RingMaxBytes: 1000})
	for range 10 {
		corePublishSized(t, b, 300)
	}
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 3})
	fs, _ := corePending(s)
	require.Equal(t, coreSeq(TypeStateResyncRequired, coreIDs(8, 10), TypeReplayComplete), coreDescribe(fs))
	assert.Equal(t, coreWithEpoch(b, `{"reason":"ring_evicted","lastDeliveredId":3,"earliestAvailableId":8,"epoch":"EPOCH"}`), coreData(t, fs[0]))

	s = subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 7})
	fs, _ = corePending(s)
	assert.Equal(t, coreSeq(coreIDs(8, 10), TypeReplayComplete), coreDescribe(fs))
}

func TestResumeFromLaterEpochSendsEpochReset(t *testing.T) {
	b := newBus(t, Options{})
	corePublishN(t, b, 5)
	for _, n := range []uint64{6, 7, 1000, math.MaxUint64} { // N >= nextID
		s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: n})
		fs, _ := corePending(s)
		require.Equal(t, coreSeq(TypeStateResyncRequired, coreIDs(1, 5), TypeReplayComplete), coreDescribe(fs), "N=%d", n)
		assert.Equal(t,
			coreWithEpoch(b, fmt.Sprintf(`{"reason":"epoch_reset","lastDeliveredId":%d,"earliestAvailableId":1,"epoch":"EPOCH"}`, n)),
			coreData(t, fs[0]))
		assert.Equal(t, coreWithEpoch(b, `{"replayedCount":5,"lastReplayedEventId":5,"lastEventId":5,"epoch":"EPOCH"}`), coreData(t, fs[6]))
		s.Close()
	}

	// With an evicting ring, earliestAvailableId is the ring's first id and
	// the whole ring is replayed.
	small := newBus(t, Options{RingSize: 3})
	corePublishN(t, small, 10)
	s := subscribe(t, small, SubscribeOptions{Resume: true, LastEventID: 50})
	fs, _ := corePending(s)
	require.Equal(t, coreSeq(TypeStateResyncRequired, coreIDs(8, 10), TypeReplayComplete), coreDescribe(fs))
	assert.Equal(t, coreWithEpoch(small, `{"reason":"epoch_reset","lastDeliveredId":50,"earliestAvailableId":8,"epoch":"EPOCH"}`), coreData(t, fs[0]))
}

func TestResumeAtLastEventIDIsNotEpochReset(t *testing.T) {
	b := newBus(t, Options{})
	corePublishN(t, b, 5)
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 5}) // N == nextID-1
	corePublishN(t, b, 1)
	fs, _ := corePending(s)
	assert.Equal(t, []string{TypeReplayComplete, "#6"}, coreDescribe(fs))
}

func TestResumeEpochResetOnEmptyRingUsesNextID(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 5})
	corePublishN(t, b, 1)
	fs, _ := corePending(s)
	require.Equal(t, []string{TypeStateResyncRequired, TypeReplayComplete, "#1"}, coreDescribe(fs))
	assert.Equal(t, coreWithEpoch(b, `{"reason":"epoch_reset","lastDeliveredId":5,"earliestAvailableId":1,"epoch":"EPOCH"}`), coreData(t, fs[0]))
	assert.Equal(t, coreWithEpoch(b, `{"replayedCount":0,"epoch":"EPOCH"}`), coreData(t, fs[1]))
}

func TestResumeWithDifferentEpochSendsEpochMismatch(t *testing.T) {
	b := newBus(t, Options{})
	other := newBus(t, Options{})
	corePublishN(t, b, 5)
	for _, n := range []uint64{0, 3, 5} { // all below nextID
		s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: n, Epoch: other.Epoch()})
		fs, _ := corePending(s)
		require.Equal(t, coreSeq(TypeStateResyncRequired, coreIDs(1, 5), TypeReplayComplete), coreDescribe(fs), "N=%d", n)
		assert.Equal(t,
			coreWithEpoch(b, fmt.Sprintf(`{"reason":"epoch_reset","detail":"epoch_mismatch","lastDeliveredId":%d,"earliestAvailableId":1,"epoch":"EPOCH"}`, n)),
			coreData(t, fs[0]))
		s.Close()
	}

	// The bus's own epoch is no mismatch.
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 3, Epoch: b.Epoch()})
	fs, _ := corePending(s)
	assert.Equal(t, coreSeq(coreIDs(4, 5), TypeReplayComplete), coreDescribe(fs))
}

func TestResumeIgnoresEmptyOrOversizedEpoch(t *testing.T) {
	b := newBus(t, Options{})
	corePublishN(t, b, 5)
	for _, epoch := range []string{"", strings.Repeat("a", 65), strings.Repeat("z", 1000)} {
		s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 3, Epoch: epoch})
		fs, _ := corePending(s)
		assert.Equal(t, coreSeq(coreIDs(4, 5), TypeReplayComplete), coreDescribe(fs), "epoch of %d bytes", len(epoch))
		s.Close()
	}
	// 64 bytes is still a presented epoch.
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 3, Epoch: strings.Repeat("a", 64)})
	fs, _ := corePending(s)
	require.NotEmpty(t, fs)
	assert.Equal(t, TypeStateResyncRequired, fs[0].Type())
	assert.Contains(t, coreData(t, fs[0]), `"detail":"epoch_mismatch"`)
}

func TestEpochIgnoredWithoutResume(t *testing.T) {
	b := newBus(t, Options{})
	corePublishN(t, b, 3)
	s := subscribe(t, b, SubscribeOptions{Epoch: "different", LastEventID: 1})
	corePublishN(t, b, 1)
	fs, _ := corePending(s)
	assert.Equal(t, []string{"#4"}, coreDescribe(fs))
}

func TestResumeReplayBudgetExceeded(t *testing.T) {
	b := newBus(t, Options{ReplayBudgetBytes: 900})
	for range 6 {
		corePublishSized(t, b, 300)
	}
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 1})
	corePublishN(t, b, 1)
	fs, _ := corePending(s)
	// 2, 3, 4 are exactly the budget; 5 would exceed it.
	require.Equal(t, coreSeq(coreIDs(2, 4), TypeStateResyncRequired, TypeReplayComplete, "#7"), coreDescribe(fs))
	assert.Equal(t, coreWithEpoch(b, `{"reason":"replay_budget_exceeded","lastDeliveredId":4,"earliestAvailableId":5,"epoch":"EPOCH"}`), coreData(t, fs[3]))
	assert.Equal(t, coreWithEpoch(b, `{"replayedCount":3,"lastReplayedEventId":4,"lastEventId":4,"epoch":"EPOCH"}`), coreData(t, fs[4]))

	// Within the budget: no resync.
	s = subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 4})
	fs, _ = corePending(s)
	assert.Equal(t, coreSeq(coreIDs(5, 7), TypeReplayComplete), coreDescribe(fs), "2*300 + the small #7 fit in 900")
}

func TestResumeReplayBudgetAfterRingEvictedResync(t *testing.T) {
	b := newBus(t, Options{RingSize: 4, ReplayBudgetBytes: 600})
	for range 10 {
		corePublishSized(t, b, 300)
	}
	s := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 2})
	fs, _ := corePending(s)
	require.Equal(t, coreSeq(TypeStateResyncRequired, coreIDs(7, 8), TypeStateResyncRequired, TypeReplayComplete), coreDescribe(fs))
	assert.Contains(t, coreData(t, fs[0]), `"reason":"ring_evicted","lastDeliveredId":2,"earliestAvailableId":7`)
	assert.Contains(t, coreData(t, fs[3]), `"reason":"replay_budget_exceeded","lastDeliveredId":8,"earliestAvailableId":9`)
}

func TestResumeReplaysFirstFrameEvenAboveBudget(t *testing.T) {
	b := newBus(t, Options{ReplayBudgetBytes: 100})
	corePublishSized(t, b, 300)
	corePublishSized(t, b, 300)
	s := subscribe(t, b, SubscribeOptions{Resume: true})
	fs, _ := corePending(s)
	require.Equal(t, []string{"#1", TypeStateResyncRequired, TypeReplayComplete}, coreDescribe(fs))
	assert.Equal(t, coreWithEpoch(b, `{"reason":"replay_budget_exceeded","lastDeliveredId":1,"earliestAvailableId":2,"epoch":"EPOCH"}`), coreData(t, fs[1]))
	assert.Equal(t, coreWithEpoch(b, `{"replayedCount":1,"lastReplayedEventId":1,"lastEventId":1,"epoch":"EPOCH"}`), coreData(t, fs[2]))

	s = subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 1})
	fs, _ = corePending(s)
	assert.Equal(t, []string{"#2", TypeReplayComplete}, coreDescribe(fs), "a single oversized frame needs no resync")
}

func TestReplayFramesDoNotCountTowardLiveCaps(t *testing.T) {
	b := newBus(t, Options{MaxQueuedBytes: 4096})
	published := corePublishN(t, b, 1000)
	require.Greater(t, coreSumSizes(published), 4096)
	s := subscribe(t, b, SubscribeOptions{Resume: true, MaxQueued: 16})
	assert.Equal(t, 1001, s.q.len())
	assert.Equal(t, 0, s.q.counts().liveCount)
	assert.Equal(t, 0, s.q.counts().liveBytes)
	assert.NoError(t, s.Err())
	assert.Equal(t, 1, b.SubscriberCount())
	fs, open := corePending(s)
	assert.True(t, open)
	assert.Equal(t, coreSeq(coreIDs(1, 1000), TypeReplayComplete), coreDescribe(fs))
}

func TestLivePublishAfterLargeReplayDoesNotEvict(t *testing.T) {
	b := newBus(t, Options{MaxQueuedBytes: 4096})
	corePublishN(t, b, 1000)
	s := subscribe(t, b, SubscribeOptions{Resume: true, MaxQueued: 16})
	live := corePublishN(t, b, 12) // nothing consumed: 1001 forced frames still queued
	assert.NoError(t, s.Err())
	assert.Equal(t, 1, b.SubscriberCount())
	c := s.q.counts()
	assert.Equal(t, 12, c.liveCount)
	assert.Equal(t, coreSumSizes(live), c.liveBytes)
	fs, open := corePending(s)
	assert.True(t, open)
	assert.Equal(t, coreSeq(coreIDs(1, 1000), TypeReplayComplete, coreIDs(1001, 1012), TypeSlowClientWarning), coreDescribe(fs))
	assert.Contains(t, coreData(t, fs[len(fs)-1]), `"queueSize":12,`)
}

func TestResumeUnderConcurrentPublishHasNoGapOrDuplicate(t *testing.T) {
	b := newBus(t, Options{MaxSubscribers: 1000})
	const total = 2000
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range total {
			if _, err := b.Publish(Event{Type: "t"}); err != nil {
				panic(err)
			}
		}
	}()
	var subs []*Subscription
	var cursors []uint64
	for range 40 {
		n := b.LastEventID()
		n -= min(n, uint64(len(subs)%7))
		subs = append(subs, subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: n, MaxQueued: 2 * total}))
		cursors = append(cursors, n)
	}
	<-done
	for i, s := range subs {
		fs, _ := corePending(s)
		want := cursors[i] + 1
		completes := 0
		for _, f := range fs {
			if f.Type() == TypeReplayComplete {
				completes++
				continue
			}
			require.Equal(t, "t", f.Type(), "subscriber %d: %s", i, f.Type())
			require.Equal(t, want, f.ID(), "subscriber %d resumed after %d", i, cursors[i])
			want++
		}
		assert.Equal(t, 1, completes)
		assert.Equal(t, uint64(total+1), want)
	}
}

// ---------------------------------------------------------------------------
// The warning (SPEC 6).

func TestWarningAtThreeQuartersOfMaxQueued(t *testing.T) {
	buf := &logCapture{}
	logger := buf.logger()
	b := newBus(t, Options{Logger: logger})
	s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	live := corePublishN(t, b, 11)
	assert.Equal(t, 11, s.q.len(), "no warning below 12")
	live = append(live, corePublishN(t, b, 1)...)
	assert.Equal(t, 13, s.q.len(), "the warning is queued right after #12")
	fs, _ := corePending(s)
	require.Equal(t, coreSeq(coreIDs(1, 12), TypeSlowClientWarning), coreDescribe(fs))
	w := fs[12]
	assert.False(t, w.Terminal())
	assert.Equal(t, uint64(0), w.ID())
	assert.Equal(t,
		fmt.Sprintf(`{"queueSize":12,"maxQueued":16,"lastEventId":12,"queuedBytes":%d,"maxQueuedBytes":2097152,"threshold":"frames"}`, coreSumSizes(live)),
		coreData(t, w))
	assert.Contains(t, string(w.JSON()), `"_meta":{"serverTimestamp":1719000000000}`)
	assert.Contains(t, buf.String(), "slow client")

	// Ratios are floats, not rounded: 0.75*10 = 7.5, so the warning comes at 8.
	s10 := subscribe(t, b, SubscribeOptions{MaxQueued: 10})
	corePublishN(t, b, 7)
	assert.Equal(t, 7, s10.q.len())
	corePublishN(t, b, 1)
	assert.Equal(t, 9, s10.q.len())
}

func TestWarningOncePerEpisode(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	corePublishN(t, b, 16)
	fs, open := corePending(s)
	assert.True(t, open)
	assert.Equal(t, coreSeq(coreIDs(1, 12), TypeSlowClientWarning, coreIDs(13, 16)), coreDescribe(fs))
}

func TestWarningRearmsOnlyWhenFramesAndBytesAtOrBelowResetRatio(t *testing.T) {
	// MaxQueued 16: warn at 12, re-arm at <= 6 frames. MaxQueuedBytes 8000:
	// warn at 6000, re-arm at <= 3000 bytes. Small events are ~80 bytes.
	setup := func(t *testing.T) (*EventBus, *Subscription) {
		b := newBus(t, Options{MaxQueuedBytes: 8000})
		s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
		corePublishN(t, b, 12)
		require.Equal(t, 13, s.q.len(), "12 live frames and the first warning")
		return b, s
	}
	warnings := func(s *Subscription) int {
		fs, _ := corePending(s)
		return len(coreOfType(fs, TypeSlowClientWarning))
	}

	t.Run("frames above reset", func(t *testing.T) {
		b, s := setup(t)
		popN(t, s, 6) // 6 left
		corePublishN(t, b, 1)
		assert.Equal(t, 7, s.q.counts().liveCount)
		corePublishN(t, b, 5) // back at 12
		assert.Equal(t, 1, warnings(s), "7 > 6 frames: still the same episode")
	})
	t.Run("frames at reset", func(t *testing.T) {
		b, s := setup(t)
		popN(t, s, 7) // 5 left
		corePublishN(t, b, 1)
		assert.Equal(t, 6, s.q.counts().liveCount)
		corePublishN(t, b, 6) // back at 12
		assert.Equal(t, 2, warnings(s), "6 <= 6 frames and few bytes: re-armed")
	})
	t.Run("bytes above reset", func(t *testing.T) {
		b, s := setup(t)
		popN(t, s, 12)
		corePublishSized(t, b, 3001) // 1 frame, 3001 bytes: frames low, bytes high
		corePublishN(t, b, 11)       // 12 frames, well under 6000 bytes
		assert.Equal(t, 12, s.q.counts().liveCount)
		assert.Less(t, s.q.counts().liveBytes, 6000)
		assert.Equal(t, 1, warnings(s), "3001 > 3000 bytes: not re-armed")
	})
	t.Run("bytes at reset", func(t *testing.T) {
		b, s := setup(t)
		popN(t, s, 12)
		corePublishSized(t, b, 3000)
		corePublishN(t, b, 11)
		assert.Equal(t, 2, warnings(s), "3000 <= 3000 bytes and 1 frame: re-armed")
	})
}

// popN pops n entries, whatever they are, one by one.
func popN(t *testing.T, s *Subscription, n int) {
	t.Helper()
	for range n {
		_, st := s.q.pop()
		require.Equal(t, popOK, st)
	}
}

func warnedLocked(b *EventBus, s *Subscription) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return s.warned
}

func TestWarningRearmIsEvaluatedOnlyOnPublish(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	corePublishN(t, b, 12)
	fs, _ := corePending(s) // drained to empty
	require.Equal(t, coreSeq(coreIDs(1, 12), TypeSlowClientWarning), coreDescribe(fs))
	assert.True(t, warnedLocked(b, s), "a dequeue never re-arms by itself")

	corePublishN(t, b, 1)
	assert.False(t, warnedLocked(b, s), "the next publish re-arms")
	live := corePublishN(t, b, 11)
	fs, _ = corePending(s)
	require.Equal(t, coreSeq(coreIDs(13, 24), TypeSlowClientWarning), coreDescribe(fs))
	assert.Contains(t, coreData(t, fs[12]), fmt.Sprintf(`"queueSize":12,"maxQueued":16,"lastEventId":24,"queuedBytes":%d,`, fs[0].Size()+coreSumSizes(live)))
}

func TestWarningThresholdFrames(t *testing.T) {
	b := newBus(t, Options{MaxQueuedBytes: 1 << 20})
	s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	corePublishN(t, b, 12)
	fs, _ := corePending(s)
	require.Len(t, fs, 13)
	assert.Contains(t, coreData(t, fs[12]), `"threshold":"frames"`)
}

func TestWarningThresholdBytes(t *testing.T) {
	// MaxQueuedBytes 4000: warn at 3000 bytes.
	b := newBus(t, Options{MaxQueuedBytes: 4000})
	s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	corePublishSized(t, b, 1000)
	corePublishSized(t, b, 1000)
	corePublishSized(t, b, 999)
	assert.Equal(t, 3, s.q.len(), "2999 bytes: no warning")

	s2 := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	corePublishSized(t, b, 1000)
	corePublishSized(t, b, 1000)
	corePublishSized(t, b, 1000)
	fs, _ := corePending(s2)
	require.Equal(t, coreSeq(coreIDs(4, 6), TypeSlowClientWarning), coreDescribe(fs))
	assert.Equal(t, `{"queueSize":3,"maxQueued":16,"lastEventId":6,"queuedBytes":3000,"maxQueuedBytes":4000,"threshold":"bytes"}`, coreData(t, fs[3]))
}

func TestWarningThresholdFramesAndBytes(t *testing.T) {
	b := newBus(t, Options{MaxQueuedBytes: 4000})
	s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	for range 11 {
		corePublishSized(t, b, 250)
	}
	assert.Equal(t, 11, s.q.len(), "11 frames, 2750 bytes: no warning")
	corePublishSized(t, b, 250)
	fs, _ := corePending(s)
	require.Equal(t, coreSeq(coreIDs(1, 12), TypeSlowClientWarning), coreDescribe(fs))
	assert.Equal(t, `{"queueSize":12,"maxQueued":16,"lastEventId":12,"queuedBytes":3000,"maxQueuedBytes":4000,"threshold":"frames_and_bytes"}`, coreData(t, fs[12]))
}

func TestForcedFramesDoNotSkewLiveCount(t *testing.T) {
	b := newBus(t, Options{})
	corePublishN(t, b, 10)
	s := subscribe(t, b, SubscribeOptions{Resume: true, MaxQueued: 16})
	require.Equal(t, 11, s.q.len(), "10 replayed + replay_complete, all forced")
	corePublishN(t, b, 11)
	assert.Equal(t, 11, s.q.counts().liveCount)
	assert.Equal(t, 22, s.q.len(), "no warning at 11 live frames")
	live := corePublishN(t, b, 1)
	c := s.q.counts()
	assert.Equal(t, 12, c.liveCount)
	assert.Equal(t, 24, s.q.len(), "warning at 12 live frames")
	// The warning at the tail is forced too: 4 more fit, the 5th evicts.
	corePublishN(t, b, 4)
	assert.Equal(t, 16, s.q.counts().liveCount)
	assert.NoError(t, s.Err())
	corePublishN(t, b, 1)
	require.ErrorIs(t, s.Err(), ErrEvicted)
	fs, _ := corePending(s)
	require.Equal(t, coreSeq(coreIDs(1, 10), TypeReplayComplete, coreIDs(11, 22), TypeSlowClientWarning, coreIDs(23, 26), TypeClientEvicted), coreDescribe(fs))
	assert.Contains(t, coreData(t, fs[23]), `"queueSize":12,"maxQueued":16,"lastEventId":22,`)
	assert.Contains(t, coreData(t, fs[len(fs)-1]), `"droppedAfter":27,"queueSize":16,"maxQueued":16,`)
	_ = live
}

// ---------------------------------------------------------------------------
// Eviction (SPEC 7).

func TestEvictionOnFrameCap(t *testing.T) {
	buf := &logCapture{}
	logger := buf.logger()
	b := newBus(t, Options{Logger: logger})
	s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	live := corePublishN(t, b, 16)
	assert.NoError(t, s.Err())
	corePublishN(t, b, 1)
	fs, open := corePending(s)
	assert.False(t, open)
	require.Equal(t, coreSeq(coreIDs(1, 12), TypeSlowClientWarning, coreIDs(13, 16), TypeClientEvicted), coreDescribe(fs))
	ev := fs[len(fs)-1]
	assert.True(t, ev.Terminal())
	assert.Equal(t, uint64(0), ev.ID())
	assert.Equal(t,
		fmt.Sprintf(`{"reason":"queue_overflow","droppedAfter":17,"queueSize":16,"maxQueued":16,"queuedBytes":%d,"maxQueuedBytes":2097152}`, coreSumSizes(live)),
		coreData(t, ev))
	assert.Contains(t, string(ev.JSON()), `"_meta":{"serverTimestamp":1719000000000}`)
	assert.Contains(t, buf.String(), "subscriber evicted")
	assert.Contains(t, buf.String(), `"reason":"queue_overflow"`)
}

func TestEvictionOnByteCap(t *testing.T) {
	b := newBus(t, Options{MaxQueuedBytes: 4000})
	s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	corePublishSized(t, b, 1000)
	corePublishSized(t, b, 1000)
	corePublishSized(t, b, 2500)
	fs, open := corePending(s)
	assert.False(t, open)
	require.Equal(t, []string{"#1", "#2", TypeClientEvicted}, coreDescribe(fs))
	assert.Equal(t,
		`{"reason":"queue_bytes_overflow","droppedAfter":3,"queueSize":2,"maxQueued":16,"queuedBytes":2000,"maxQueuedBytes":4000,"eventBytes":2500}`,
		coreData(t, fs[2]))
	assert.ErrorIs(t, s.Err(), ErrEvicted)
	assert.Contains(t, s.Err().Error(), ReasonQueueBytesOverflow)
}

func TestEvictedConsumerGetsQueuedFramesThenTerminalThenEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
		gate := make(chan struct{})
		var got []Frame
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			for f := range s.Events() {
				got = append(got, f)
				if len(got) == 1 {
					<-gate // a slow consumer
				}
			}
		}()
		corePublishN(t, b, 1)
		synctest.Wait() // the consumer holds #1 and stalls
		corePublishN(t, b, 17)
		require.ErrorIs(t, s.Err(), ErrEvicted)
		close(gate)
		<-ended
		assert.Equal(t, coreSeq(coreIDs(1, 13), TypeSlowClientWarning, coreIDs(14, 17), TypeClientEvicted), coreDescribe(got))
	})
}

func TestEvictedErrWrapsErrEvicted(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	assert.NoError(t, s.Err())
	corePublishN(t, b, 17)
	err := s.Err()
	require.ErrorIs(t, err, ErrEvicted)
	assert.Contains(t, err.Error(), ReasonQueueOverflow)
	s.Close() // a later Close does not change why it ended
	assert.ErrorIs(t, s.Err(), ErrEvicted)
}

func TestEvictionDecrementsSubscriberCount(t *testing.T) {
	b := newBus(t, Options{})
	subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	subscribe(t, b, SubscribeOptions{MaxQueued: 100})
	assert.Equal(t, 2, b.SubscriberCount())
	corePublishN(t, b, 17)
	assert.Equal(t, 1, b.SubscriberCount())
	b.mu.Lock()
	assert.Len(t, b.subs, 1)
	b.mu.Unlock()
}

func TestEvictionStopsWatchingContext(t *testing.T) {
	ctx := newCoreWatchCtx()
	b := newBus(t, Options{})
	s, err := b.Subscribe(ctx, SubscribeOptions{MaxQueued: 16})
	require.NoError(t, err)
	assert.Equal(t, 1, ctx.watchers())
	corePublishN(t, b, 17)
	require.ErrorIs(t, s.Err(), ErrEvicted)
	assert.Equal(t, 0, ctx.watchers(), "the evicted subscriber's context is no longer watched")

	// With a real context: cancelling it after the eviction changes nothing,
	// the consumer still gets the queued frames and the terminal one.
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		ctx, cancel := context.WithCancel(context.Background())
		s, err := b.Subscribe(ctx, SubscribeOptions{MaxQueued: 16})
		require.NoError(t, err)
		corePublishN(t, b, 17)
		cancel()
		synctest.Wait()
		assert.ErrorIs(t, s.Err(), ErrEvicted)
		fs, open := corePending(s)
		assert.False(t, open)
		assert.Equal(t, coreSeq(coreIDs(1, 12), TypeSlowClientWarning, coreIDs(13, 16), TypeClientEvicted), coreDescribe(fs))
	})
}

func TestEvictionDoesNotAffectSiblings(t *testing.T) {
	b := newBus(t, Options{})
	before := subscribe(t, b, SubscribeOptions{MaxQueued: 2048})
	slow := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	slow2 := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	fast := subscribe(t, b, SubscribeOptions{MaxQueued: 16})
	after := subscribe(t, b, SubscribeOptions{MaxQueued: 2048})
	var fastGot []Frame
	for range 100 {
		corePublishN(t, b, 1)
		fs, _ := corePending(fast)
		fastGot = append(fastGot, fs...)
	}
	assert.ErrorIs(t, slow.Err(), ErrEvicted)
	assert.ErrorIs(t, slow2.Err(), ErrEvicted, "two evictions in one publish")
	assert.Equal(t, 3, b.SubscriberCount())
	assert.Equal(t, coreIDs(1, 100), coreDescribe(fastGot))
	for _, s := range []*Subscription{before, after} {
		fs, open := corePending(s)
		assert.True(t, open)
		assert.Equal(t, coreIDs(1, 100), coreDescribe(fs))
	}
	b.mu.Lock()
	assert.Equal(t, []*Subscription{before, fast, after}, b.subs, "subscription order kept")
	b.mu.Unlock()
}

// ---------------------------------------------------------------------------
// Cancellation and Close (SPEC 8).

func TestContextCancelDropsBufferAndEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		ctx, cancel := context.WithCancel(context.Background())
		s, err := b.Subscribe(ctx, SubscribeOptions{})
		require.NoError(t, err)
		corePublishN(t, b, 5)
		cancel()
		synctest.Wait()
		fs, open := corePending(s)
		assert.Empty(t, fs, "the buffer is dropped at once")
		assert.False(t, open)
		assert.ErrorIs(t, s.Err(), context.Canceled)
		assert.Equal(t, 0, b.SubscriberCount())
		corePublishN(t, b, 1)
		assert.Equal(t, 0, s.q.len())

		// A consumer blocked in Events returns.
		ctx, cancel = context.WithCancel(context.Background())
		s, err = b.Subscribe(ctx, SubscribeOptions{})
		require.NoError(t, err)
		ended := make(chan []Frame)
		go func() { ended <- coreCollect(s) }()
		corePublishN(t, b, 1)
		synctest.Wait()
		cancel()
		assert.Equal(t, []string{"#7"}, coreDescribe(<-ended))
	})
}

func TestSubscriptionCloseDropsBufferAndEnds(t *testing.T) {
	ctx := newCoreWatchCtx()
	b := newBus(t, Options{})
	s, err := b.Subscribe(ctx, SubscribeOptions{})
	require.NoError(t, err)
	corePublishN(t, b, 5)
	s.Close()
	fs, open := corePending(s)
	assert.Empty(t, fs)
	assert.False(t, open)
	assert.ErrorIs(t, s.Err(), context.Canceled)
	assert.Equal(t, 0, b.SubscriberCount())
	assert.Equal(t, 0, ctx.watchers(), "the context is no longer watched")
	assert.Empty(t, coreCollect(s))
}

func TestCancellationIsIdempotent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		other := subscribe(t, b, SubscribeOptions{})
		ctx, cancel := context.WithCancel(context.Background())
		s, err := b.Subscribe(ctx, SubscribeOptions{})
		require.NoError(t, err)
		s.Close()
		s.Close()
		cancel()
		synctest.Wait()
		s.Close()
		assert.ErrorIs(t, s.Err(), context.Canceled)
		assert.Equal(t, 1, b.SubscriberCount())
		corePublishN(t, b, 1)
		fs, open := corePending(other)
		assert.True(t, open)
		assert.Equal(t, []string{"#1"}, coreDescribe(fs))
	})
}

func TestBreakingOutOfEventsClosesSubscription(t *testing.T) {
	ctx := newCoreWatchCtx()
	b := newBus(t, Options{})
	s, err := b.Subscribe(ctx, SubscribeOptions{})
	require.NoError(t, err)
	corePublishN(t, b, 3)
	var got []Frame
	for f := range s.Events() {
		got = append(got, f)
		break
	}
	assert.Equal(t, []string{"#1"}, coreDescribe(got))
	assert.Equal(t, 0, b.SubscriberCount())
	assert.ErrorIs(t, s.Err(), context.Canceled)
	assert.Equal(t, 0, ctx.watchers())
	fs, open := corePending(s)
	assert.Empty(t, fs, "#2 and #3 were dropped")
	assert.False(t, open)
}

func TestEventsIsSingleUse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		s := subscribe(t, b, SubscribeOptions{})
		first := make(chan []Frame)
		go func() { first <- coreCollect(s) }()
		corePublishN(t, b, 2)
		synctest.Wait() // the first iterator took both and waits

		n := 0
		for range s.Events() {
			n++
		}
		assert.Zero(t, n, "a second range yields nothing")
		assert.Equal(t, 1, b.SubscriberCount(), "and does not end the subscription")

		corePublishN(t, b, 1)
		require.NoError(t, b.Close())
		assert.Equal(t, []string{"#1", "#2", "#3"}, coreDescribe(<-first))

		for range s.Events() {
			n++
		}
		assert.Zero(t, n)
	})
}

func TestEventsDeliversToABlockedConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		s := subscribe(t, b, SubscribeOptions{})
		got := make(chan Frame, 100)
		go func() {
			for f := range s.Events() {
				got <- f
			}
			close(got)
		}()
		for i := range 5 {
			synctest.Wait() // the consumer is blocked waiting
			corePublishN(t, b, 1)
			f := <-got
			assert.Equal(t, uint64(i+1), f.ID())
		}
		s.Close()
		_, ok := <-got
		assert.False(t, ok)
	})
}

func TestReadyAndAppendReady(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	select {
	case <-s.Ready():
		t.Fatal("token before any frame")
	default:
	}
	corePublishN(t, b, 2)
	select {
	case <-s.Ready():
	default:
		t.Fatal("no token after a frame")
	}
	dst := make([]Frame, 1, 8)
	fs, open := s.AppendReady(dst)
	assert.True(t, open)
	require.Len(t, fs, 3, "appended after what dst held")
	assert.Equal(t, []string{"#1", "#2"}, coreDescribe(fs[1:]))
	fs, open = s.AppendReady(nil)
	assert.Empty(t, fs)
	assert.True(t, open)
	require.NoError(t, b.Close())
	select {
	case <-s.Ready():
	default:
		t.Fatal("no token at the end")
	}
	fs, open = s.AppendReady(nil)
	assert.Empty(t, fs)
	assert.False(t, open)
}

func TestBusCloseEndsEverySubscriptionWithDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		never := subscribe(t, b, SubscribeOptions{}) // never iterated
		polled := subscribe(t, b, SubscribeOptions{})
		ranged := subscribe(t, b, SubscribeOptions{})
		got := make(chan []Frame)
		go func() { got <- coreCollect(ranged) }()
		corePublishN(t, b, 3)
		fs, _ := corePending(polled)
		require.Len(t, fs, 3)
		corePublishN(t, b, 2)

		require.NoError(t, b.Close())
		assert.Equal(t, 0, b.SubscriberCount())
		assert.Equal(t, coreIDs(1, 5), coreDescribe(<-got))
		fs, open := corePending(polled)
		assert.Equal(t, coreIDs(4, 5), coreDescribe(fs))
		assert.False(t, open)
		assert.Equal(t, coreIDs(1, 5), coreDescribe(coreCollect(never)))
		for _, s := range []*Subscription{never, polled, ranged} {
			assert.NoError(t, s.Err(), "a closed bus is no error")
		}
	})
}

func TestBusCloseWithErrorEndsEverySubscriptionWithATerminalFrame(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		never := subscribe(t, b, SubscribeOptions{})
		polled := subscribe(t, b, SubscribeOptions{})
		corePublishN(t, b, 2)
		require.NoError(t, b.CloseWithError(ErrorKindUnavailable, "backplane unreachable"))
		require.NoError(t, b.CloseWithError(ErrorKindInternal, "again"), "idempotent")
		require.NoError(t, b.Close(), "a later Close changes nothing")
		for _, s := range []*Subscription{never, polled} {
			fs := coreCollect(s)
			require.Len(t, fs, 3, "what was queued, then the terminal frame")
			last := fs[2]
			assert.True(t, last.Terminal())
			assert.Equal(t, TypeStreamError, last.Type())
			assert.Contains(t, string(last.JSON()), `"data":{"error":"backplane unreachable","errorKind":"unavailable"}`)
			assert.ErrorIs(t, s.Err(), ErrClosed)
			assert.Contains(t, s.Err().Error(), "unavailable")
		}
		_, err := b.Publish(Event{Type: "x"})
		assert.ErrorIs(t, err, ErrClosed)
	})
}

func TestBusCloseIsIdempotent(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	corePublishN(t, b, 1)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { assert.NoError(t, b.Close()) })
	}
	wg.Wait()
	assert.NoError(t, b.Close())
	assert.Equal(t, []string{"#1"}, coreDescribe(coreCollect(s)))
}

func TestAfterClosePublishErrClosedAndSubscribeEnded(t *testing.T) {
	b := newBus(t, Options{})
	corePublishN(t, b, 2)
	require.NoError(t, b.Close())
	_, err := b.Publish(Event{Type: "t"})
	assert.ErrorIs(t, err, ErrClosed)
	s, err := b.Subscribe(context.Background(), SubscribeOptions{Resume: true})
	require.NoError(t, err)
	assert.Empty(t, coreCollect(s))
	assert.Equal(t, 0, b.SubscriberCount())
	assert.Equal(t, uint64(2), b.LastEventID())
}

func TestCancellationAfterCloseDropsDrainingBuffer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		ctx, cancel := context.WithCancel(context.Background())
		viaCtx, err := b.Subscribe(ctx, SubscribeOptions{})
		require.NoError(t, err)
		viaClose := subscribe(t, b, SubscribeOptions{})
		corePublishN(t, b, 3)
		require.NoError(t, b.Close())

		cancel()
		viaClose.Close()
		synctest.Wait()
		for _, s := range []*Subscription{viaCtx, viaClose} {
			fs, open := corePending(s)
			assert.Empty(t, fs)
			assert.False(t, open)
		}
	})
}

func TestBusCloseReleasesContextWatchWhenDrained(t *testing.T) {
	b := newBus(t, Options{})
	polled, ranged := newCoreWatchCtx(), newCoreWatchCtx()
	s1, err := b.Subscribe(polled, SubscribeOptions{})
	require.NoError(t, err)
	s2, err := b.Subscribe(ranged, SubscribeOptions{})
	require.NoError(t, err)
	corePublishN(t, b, 2)
	require.NoError(t, b.Close())
	// Still watched while draining, so a cancellation can drop the buffer.
	assert.Equal(t, 1, polled.watchers())
	assert.Equal(t, 1, ranged.watchers())

	fs, open := corePending(s1)
	assert.Len(t, fs, 2)
	assert.False(t, open)
	assert.Equal(t, 0, polled.watchers(), "released at the end of the stream")
	assert.Len(t, coreCollect(s2), 2)
	assert.Equal(t, 0, ranged.watchers())
}

func TestConcurrentPublishersDeliverIncreasingIDs(t *testing.T) {
	b := newBus(t, Options{})
	const publishers, each = 8, 500
	subs := []*Subscription{
		subscribe(t, b, SubscribeOptions{MaxQueued: 10_000}),
		subscribe(t, b, SubscribeOptions{MaxQueued: 10_000}),
		subscribe(t, b, SubscribeOptions{MaxQueued: 10_000}),
	}
	var wg sync.WaitGroup
	for range publishers {
		wg.Go(func() {
			for range each {
				if _, err := b.Publish(Event{Type: "t"}); err != nil {
					panic(err)
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, uint64(publishers*each), b.LastEventID())
	for _, s := range subs {
		fs, _ := corePending(s)
		assert.Equal(t, coreIDs(1, publishers*each), coreDescribe(coreEventsOnly(fs)))
	}
}

func coreEventsOnly(fs []Frame) []Frame {
	var out []Frame
	for _, f := range fs {
		if !f.Synthetic() {
			out = append(out, f)
		}
	}
	return out
}

func TestZeroEventBusBehavesAsClosed(t *testing.T) {
	var b EventBus
	_, err := b.Publish(Event{Type: "x"})
	assert.ErrorIs(t, err, ErrClosed)
	assert.ErrorIs(t, b.Signal("x", "a"), ErrClosed)
	s, err := b.Subscribe(context.Background(), SubscribeOptions{Resume: true})
	require.NoError(t, err)
	fs, open := s.AppendReady(nil)
	assert.Empty(t, fs)
	assert.False(t, open)
	assert.Zero(t, b.LastEventID())
	assert.NoError(t, b.Close())
}

func TestDefaultClockStampsWallTimeBetweenRebases(t *testing.T) {
	// Without Options.Now the bus reads one monotonic clock per stamp and
	// re-reads the wall clock at least once a second; every stamp must still
	// be the wall time of the publish, to the millisecond.
	synctest.Test(t, func(t *testing.T) {
		b, err := New(Options{})
		require.NoError(t, err)
		defer b.Close()
		for _, step := range []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, 1500 * time.Millisecond, 7 * time.Millisecond} {
			time.Sleep(step)
			f, err := b.Publish(Event{Type: "t"})
			require.NoError(t, err)
			var env struct {
				Meta struct {
					ServerTimestamp int64 `json:"serverTimestamp"`
				} `json:"_meta"`
			}
			require.NoError(t, json.Unmarshal(f.JSON(), &env))
			assert.Equal(t, time.Now().UnixMilli(), env.Meta.ServerTimestamp, "after sleeping %v", step)
		}
	})
}
