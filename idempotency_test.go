package eventbus

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestCheckIdempotencyKey(t *testing.T) {
	for _, k := range []string{"", strings.Repeat("k", 256), "a\nb", "caf\u00e9", "\x7f"} {
		if !errors.Is(CheckIdempotencyKey(k), ErrInvalidIdempotencyKey) {
			t.Errorf("%q accepted", k)
		}
	}
	for _, k := range []string{"k", strings.Repeat("k", 255), " ~!"} {
		if err := CheckIdempotencyKey(k); err != nil {
			t.Errorf("%q: %v", k, err)
		}
	}
}

func TestEncoderFingerprint(t *testing.T) {
	enc, err := newEncoder(Options{})
	if err != nil {
		t.Fatal(err)
	}
	fp := func(e Event) string {
		t.Helper()
		s, err := enc.Fingerprint(e)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	base := Event{Type: "e", Data: json.RawMessage(`{"a":1}`), OriginatorClientID: "c"}
	same := []Event{
		{Type: "e", Data: json.RawMessage(`{ "a" : 1 }`), OriginatorClientID: "c"},
		{Type: "e", Data: map[string]int{"a": 1}, OriginatorClientID: "c"},
		{Type: "e", Data: json.RawMessage(`{"a":1}`), OriginatorClientID: "c", Meta: map[string]any{"serverTimestamp": 99}},
	}
	for _, e := range same {
		if fp(e) != fp(base) {
			t.Errorf("%+v differs from %+v", e, base)
		}
	}
	differ := []Event{
		{Type: "f", Data: json.RawMessage(`{"a":1}`), OriginatorClientID: "c"},
		{Type: "e", Data: json.RawMessage(`{"a":2}`), OriginatorClientID: "c"},
		{Type: "e", OriginatorClientID: "c"},
		{Type: "e", Data: json.RawMessage(`{"a":1}`)},
		{Type: "e", Data: json.RawMessage(`{"a":1}`), OriginatorClientID: "c", Meta: map[string]any{"k": 1}},
	}
	for _, e := range differ {
		if fp(e) == fp(base) {
			t.Errorf("%+v is taken for %+v", e, base)
		}
	}
	if _, err := enc.Fingerprint(Event{}); !errors.Is(err, ErrInvalidEvent) {
		t.Errorf("invalid event: %v", err)
	}
}
