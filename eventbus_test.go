package eventbus

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
