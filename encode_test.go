package eventbus

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ---------------------------------------------------------------------------
// Encoding an event: the envelope, its validation, once for everyone (SPEC 5.1, 2.1).

func TestPublishStampsSchemaVersion(t *testing.T) {
	b := newBus(t, Options{})
	f := publishEvent(t, b, Event{Type: "t"})
	var env map[string]any
	require.NoError(t, json.Unmarshal(f.JSON(), &env))
	assert.Equal(t, float64(SchemaVersion), env["v"])
	assert.Equal(t, 1, SchemaVersion)
}

func TestPublishEnvelopeFieldOrder(t *testing.T) {
	b := newBus(t, Options{})
	f := publishEvent(t, b, Event{
		Type:               "session_update",
		Data:               map[string]any{"b": 2, "a": 1},
		Meta:               map[string]any{"trace": "x", "region": "eu"},
		OriginatorClientID: "c1",
	})
	assert.Equal(t,
		`{"id":1,"v":1,"type":"session_update","data":{"a":1,"b":2},"_meta":{"serverTimestamp":1719000000000,"region":"eu","trace":"x"},"originatorClientId":"c1"}`,
		string(f.JSON()))

	// Without data and originator both are left out.
	f = publishEvent(t, b, Event{Type: "ping"})
	assert.Equal(t, `{"id":2,"v":1,"type":"ping","_meta":{"serverTimestamp":1719000000000}}`, string(f.JSON()))

	// An empty RawMessage is "absent" too; JSON null is a value.
	f = publishEvent(t, b, Event{Type: "ping", Data: json.RawMessage{}})
	assert.Equal(t, `{"id":3,"v":1,"type":"ping","_meta":{"serverTimestamp":1719000000000}}`, string(f.JSON()))
	f = publishEvent(t, b, Event{Type: "ping", Data: json.RawMessage("null")})
	assert.Equal(t, `{"id":4,"v":1,"type":"ping","data":null,"_meta":{"serverTimestamp":1719000000000}}`, string(f.JSON()))
}

func TestPublishStampsServerTimestamp(t *testing.T) {
	b := newBus(t, Options{})
	f := publishEvent(t, b, Event{Type: "t"})
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
			f := publishEvent(t, b, Event{Type: "t", Meta: map[string]any{"serverTimestamp": tc.ts}})
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
	f := publishEvent(t, b, Event{Type: "t", Meta: map[string]any{
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
	publishNumbered(t, b, 4)
	f := publishEvent(t, b, Event{
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
	fs, _ := s.AppendReady(nil)
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
			publishEvent(t, b, Event{Type: "before"})

			var err error
			require.NotPanics(t, func() { _, err = b.Publish(tc.e) })
			require.ErrorIs(t, err, ErrInvalidEvent)
			assert.Contains(t, buf.String(), "publish rejected")
			assert.Contains(t, buf.String(), `"type":"t"`)
			assert.Equal(t, uint64(1), b.LastEventID())

			after := publishEvent(t, b, Event{Type: "after"})
			assert.Equal(t, uint64(2), after.ID(), "the rejected event used no id")
			fs, _ := s.AppendReady(nil)
			assert.Equal(t, []string{"#1", "#2"}, describe(fs))
			assert.Equal(t, 2, b.ring.Len())
		})
	}
}

func TestPublishRejectsEventAboveMaxEventBytes(t *testing.T) {
	buf := &logCapture{}
	logger := buf.logger()
	b := newBus(t, Options{MaxEventBytes: 500, Logger: logger})
	s := subscribe(t, b, SubscribeOptions{})

	_, err := b.Publish(sizedEvent(t, 1, 501))
	require.ErrorIs(t, err, ErrEventTooLarge)
	assert.NotErrorIs(t, err, ErrInvalidEvent)
	assert.Contains(t, buf.String(), "publish rejected")
	assert.Equal(t, uint64(0), b.LastEventID())

	f := publishSized(t, b, "t", 500) // exactly MaxEventBytes passes
	assert.Equal(t, uint64(1), f.ID())

	// The boundary holds across an id digit change too.
	for b.LastEventID() < 9 {
		publishSized(t, b, "t", 200)
	}
	_, err = b.Publish(sizedEvent(t, 10, 501))
	require.ErrorIs(t, err, ErrEventTooLarge)
	f = publishSized(t, b, "t", 500)
	assert.Equal(t, uint64(10), f.ID())

	fs, _ := s.AppendReady(nil)
	assert.Equal(t, idRange(1, 10), describe(fs))
}

func TestPublishCompactsRawMessage(t *testing.T) {
	b := newBus(t, Options{})
	raw := json.RawMessage("{\n  \"a\" : 1,\r\n\t\"b\": [ 1, 2 ],\n  \"s\": \"x <y> \\n\"\n}\n")
	f := publishEvent(t, b, Event{Type: "t", Data: raw})
	assert.Equal(t, `{"a":1,"b":[1,2],"s":"x <y> \n"}`, dataOf(t, f))
	assert.False(t, bytes.ContainsAny(f.JSON(), "\r\n"))
	assert.NotContains(t, strings.ReplaceAll(string(f.JSON()), "x <y> ", ""), " ", "whitespace outside strings is removed")

	// A RawMessage in _meta is compacted as well.
	f = publishEvent(t, b, Event{Type: "t", Meta: map[string]any{"m": json.RawMessage("[ 1,\n 2 ]")}})
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

func TestPublishEnvelopeNeverContainsCROrLF(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	nasty := "a\r\nb\rc\nd\u2028e\u2029f\x00"
	f := publishEvent(t, b, Event{
		Type:               "t",
		Data:               map[string]any{"s": nasty, nasty: []string{nasty}},
		Meta:               map[string]any{nasty: nasty},
		OriginatorClientID: nasty,
	})
	for _, g := range []Frame{f, coreOne(t, s)} {
		assert.False(t, bytes.ContainsAny(g.JSON(), "\r\n"), "%q", g.JSON())
		// The wire has exactly the framing newlines.
		assert.Equal(t, 4, bytes.Count(g.SSE(), []byte("\n")))
		assert.Equal(t, 0, bytes.Count(g.SSE(), []byte("\r")))
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
	fs, _ := s.AppendReady(nil)
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
	f := publishEvent(t, b, Event{Type: "t", Data: coreCountingMarshaler{&calls}})
	assert.Equal(t, int32(1), calls.Load())

	first := &f.JSON()[0]
	for i, s := range subs {
		g := coreOne(t, s)
		assert.Same(t, first, &g.JSON()[0], "subscriber %d got its own copy", i)
	}

	// A resuming subscriber gets the very same bytes from the ring.
	subs[0].Close()
	r := subscribe(t, b, SubscribeOptions{Resume: true, LastEventID: 0})
	fs, _ := r.AppendReady(nil)
	require.Equal(t, []string{"#1", TypeReplayComplete}, describe(fs))
	assert.Same(t, first, &fs[0].JSON()[0])
	assert.Equal(t, int32(1), calls.Load())
}

// coreJSONString is the reference: encoding/json without HTML escaping.
func coreJSONString(t testing.TB, s string) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(s))
	return strings.TrimSuffix(buf.String(), "\n")
}

func TestAppendJSONStringMatchesEncodingJSON(t *testing.T) {
	cases := []string{
		"", "plain", `quote " backslash \ slash /`, "<html>&amp;</html>",
		"\n\r\t\b\f\v\a", "\x00\x01\x1f\x7f",
		"line\u2028sep\u2029para", "émoji 🎉 中文",
		"\xff", "a\xffb", "\xc3", "\xc3\x28", "\xe2\x82", "\xed\xa0\x80", // invalid UTF-8 and a surrogate
		"\xf4\x90\x80\x80", "trailing \xe2", string(utf8.RuneError),
	}
	for c := range 0x80 {
		cases = append(cases, "x"+string(rune(c))+"y")
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		p := make([]byte, r.IntN(24))
		for i := range p {
			p[i] = byte(r.IntN(256))
		}
		cases = append(cases, string(p))
	}
	for _, s := range cases {
		got := string(appendJSONString([]byte("pre"), s))
		require.Equal(t, "pre"+coreJSONString(t, s), got, "%q", s)
		require.False(t, strings.ContainsAny(got, "\r\n"), "%q", s)
	}
}

func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "a\nb", "\xff", "\u2028", "\b\f", `"\`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := string(appendJSONString(nil, s))
		if want := coreJSONString(t, s); got != want {
			t.Fatalf("appendJSONString(%q) = %s, encoding/json %s", s, got, want)
		}
	})
}

// Compact pre-encoded data takes Publish's fast path, anything else the
// scratch path; both must lay out byte-identical envelopes, escapes in the
// type and the originator included.
func TestPublishFastPathMatchesScratchPath(t *testing.T) {
	for _, c := range []struct{ typ, orig, compact, spaced string }{
		{"e", "", `{"n":1}`, `{ "n" : 1 }`},
		{"plugin.tool.x", "client-7", `[1,"two",{"3":null}]`, "[1, \"two\", {\"3\": null}]\n"},
		{"t\u2028é", "c\"1\\\u00ff", `"s"`, ` "s" `},
		{"e", "c1", "", ""},
	} {
		wire := func(data string) string {
			b := newBus(t, Options{})
			ev := Event{Type: c.typ, OriginatorClientID: c.orig}
			if data != "" || c.compact != "" {
				ev.Data = json.RawMessage(data)
			}
			f, err := b.Publish(ev)
			require.NoError(t, err)
			return f.String()
		}
		fast := wire(c.compact)
		if c.compact == "" {
			// No data at all: the same envelope as through encoding/json's path.
			b := newBus(t, Options{})
			f, err := b.Publish(Event{Type: c.typ, OriginatorClientID: c.orig, Meta: map[string]any{"serverTimestamp": testNow().UnixMilli()}})
			require.NoError(t, err)
			assert.Equal(t, f.String(), fast)
			continue
		}
		assert.Equal(t, wire(c.spaced), fast, "%q", c.compact)
		assert.Contains(t, fast, c.compact)
	}
}

// ---------------------------------------------------------------------------
// The clock, MaxTypeLen, the encoder a backplane uses (backplane.Encoder),
// and hostile input end to end.

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

func TestMaxTypeLen(t *testing.T) {
	b, err := New(Options{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	defer b.Close()
	s, err := b.Subscribe(t.Context(), SubscribeOptions{})
	require.NoError(t, err)
	at, past := strings.Repeat("a", MaxTypeLen), strings.Repeat("a", MaxTypeLen+1)

	_, err = b.Publish(Event{Type: past})
	require.ErrorIs(t, err, ErrInvalidEvent)
	assert.Contains(t, err.Error(), "MaxTypeLen")
	require.ErrorIs(t, b.Signal(past, "x"), ErrInvalidEvent)
	assert.Zero(t, b.LastEventID(), "no id used")
	fs, _ := s.AppendReady(nil)
	assert.Empty(t, fs, "nobody got it")
	assert.Equal(t, uint64(2), b.Stats().Rejected.Invalid)

	f, err := b.Publish(Event{Type: at})
	require.NoError(t, err)
	assert.Equal(t, uint64(1), f.ID(), "the first id is still free")
	require.NoError(t, b.Signal(at, "x"))
	fs, _ = s.AppendReady(nil)
	require.Len(t, fs, 2)
	assert.Equal(t, at, fs[0].Type())
	assert.Equal(t, at, fs[1].Type())

	// The encoder and a type filter agree with Publish.
	enc, err := newEncoder(Options{})
	require.NoError(t, err)
	_, err = enc.Encode(Event{Type: past})
	require.ErrorIs(t, err, ErrInvalidEvent)
	require.ErrorIs(t, enc.CheckSignal(past, ""), ErrInvalidEvent)
}

func TestEncoderEncodesAsPublish(t *testing.T) {
	now := func() time.Time { return time.UnixMilli(1719000000000) }
	enc, err := newEncoder(Options{Now: now})
	require.NoError(t, err)
	b, err := New(Options{Now: now})
	require.NoError(t, err)
	defer b.Close()
	ev := Event{Type: "t", Data: map[string]int{"a": 1}, OriginatorClientID: "c"}
	e, err := enc.Encode(ev)
	require.NoError(t, err)
	f, err := b.Publish(ev)
	require.NoError(t, err)
	assert.Equal(t, "t", e.Type)
	assert.Equal(t, string(f.JSON()), string(e.Envelope(1)))

	_, err = enc.Encode(Event{Type: "a\nb"})
	assert.ErrorIs(t, err, ErrInvalidEvent)
	small, err := newEncoder(Options{MaxEventBytes: 40})
	require.NoError(t, err)
	_, err = small.Encode(Event{Type: "t", Data: strings.Repeat("x", 40)})
	assert.ErrorIs(t, err, ErrEventTooLarge)
	_, err = newEncoder(Options{MaxEventBytes: -1})
	assert.ErrorIs(t, err, ErrInvalidOption)
}

// TestHostileInjectionStaysInsideOneDataLine: types that would inject SSE
// lines are rejected at Publish (no id used, nobody receives anything);
// strings with "\n\ndata: x", "\r\nid: 99", "\r", U+2028, NUL and quotes in
// data, _meta keys and values, originatorClientId, and pre-encoded JSON
// with raw newlines reach the client as ONE event with ONE data line,
// whose JSON decodes back to exactly what was published.
func TestHostileInjectionStaysInsideOneDataLine(t *testing.T) {
	b := newBus(t, Options{})
	ts := serveSession(t, b, &Handler{Logger: slog.New(slog.DiscardHandler)})
	s := openStream(t, ts, "/session/s/events", nil)
	if s.resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", s.resp.StatusCode)
	}
	if r := s.next(); r.Kind != sseRetryRecord || r.Retry < 3000 || r.Retry > 4500 {
		t.Fatalf("first record %+v", r)
	}

	for _, typ := range []string{"\n", "\r", "\r\n", "a\n\ndata: x", "a\nid: 99", "x\revent: y", "ok\n", "\nok",
		"a\r\n\r\nid: 1\r\ndata: {}\r\n\r\n"} {
		_, err := b.Publish(Event{Type: typ, Data: "evil"})
		if !errors.Is(err, ErrInvalidEvent) {
			t.Errorf("Publish(type %q): %v, want ErrInvalidEvent", typ, err)
		}
		if err := b.Signal(typ, "about"); !errors.Is(err, ErrInvalidEvent) {
			t.Errorf("Signal(type %q): %v, want ErrInvalidEvent", typ, err)
		}
	}
	if b.LastEventID() != 0 || b.Stats().Rejected.Invalid != 18 {
		t.Fatalf("rejected events used ids or were not counted: last id %d, %+v", b.LastEventID(), b.Stats().Rejected)
	}

	evil := []string{"\n\ndata: x", "\r\nid: 99\r\n\r\n", "x\ry", "\u2028\u2029", "nul\x00", `"}]` + "\n", "id: 5\n\nevent: x\ndata: {}\n\n"}
	type published struct {
		f    Frame
		data any
		meta map[string]any
		orig string
	}
	var pubs []published
	for i, e := range evil {
		data := map[string]any{"text": e, "id": e, "nested": []any{e}}
		meta := map[string]any{"note": e, e: "key", "id": 77}
		f, err := b.Publish(Event{Type: "t", Data: data, Meta: meta, OriginatorClientID: e})
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		pubs = append(pubs, published{f, data, meta, e})
	}
	raw, err := b.Publish(Event{Type: "raw", Data: json.RawMessage("{\n  \"a\": \"b\\n\\ndata: x\",\r\n  \"id\": 9\n}\n")})
	if err != nil {
		t.Fatal(err)
	}
	sig := "\n\ndata: x"
	if err := b.Signal("sig", sig); err != nil {
		t.Fatal(err)
	}

	for _, p := range pubs {
		ev := s.skipToEvent()
		if ev.Type != "t" || ev.ID != strconv.FormatUint(p.f.ID(), 10) || strings.ContainsAny(ev.Data, "\r\n") {
			t.Fatalf("event %d arrived as type %q id %q data %q", p.f.ID(), ev.Type, ev.ID, ev.Data)
		}
		var env struct {
			ID   uint64         `json:"id"`
			Data any            `json:"data"`
			Meta map[string]any `json:"_meta"`
			Orig string         `json:"originatorClientId"`
		}
		if err := json.Unmarshal([]byte(ev.Data), &env); err != nil {
			t.Fatalf("event %d: %v in %q", p.f.ID(), err, ev.Data)
		}
		wantData, _ := json.Marshal(p.data)
		gotData, _ := json.Marshal(env.Data)
		if env.ID != p.f.ID() || string(gotData) != string(wantData) || env.Orig != p.orig ||
			env.Meta["note"] != p.meta["note"] || env.Meta[p.orig] != "key" || env.Meta["id"] != float64(77) {
			t.Errorf("event %d decoded to %+v, want data %s originator %q", p.f.ID(), env, wantData, p.orig)
		}
	}
	ev := s.skipToEvent()
	if ev.Type != "raw" || ev.ID != strconv.FormatUint(raw.ID(), 10) || strings.ContainsAny(ev.Data, "\r\n") ||
		!strings.Contains(ev.Data, `"data":{"a":"b\n\ndata: x","id":9}`) {
		t.Errorf("pre-encoded JSON arrived as %+v", ev)
	}
	ev = s.skipToEvent()
	var senv struct{ About string }
	if ev.Type != "sig" || ev.ID != strconv.FormatUint(raw.ID(), 10) /* the last id persists */ ||
		json.Unmarshal([]byte(ev.Data), &senv) != nil || senv.About != sig {
		t.Errorf("signal arrived as %+v", ev)
	}
}
