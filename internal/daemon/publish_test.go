package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ssebus/eventbus"
)

func TestIdempotencyKeyHeader(t *testing.T) {
	for _, c := range []struct {
		values []string
		key    string
		ok     bool
	}{
		{nil, "", false},
		{[]string{"k1"}, "k1", true},
		{[]string{""}, "", true},
		{[]string{"a", "b"}, "", true},
	} {
		r := httptest.NewRequest("POST", "/", nil)
		for _, v := range c.values {
			r.Header.Add("Idempotency-Key", v)
		}
		if key, ok := IdempotencyKey(r); key != c.key || ok != c.ok {
			t.Errorf("%q: %q %v, want %q %v", c.values, key, ok, c.key, c.ok)
		}
	}
}

func TestPublishErrorsWrite(t *testing.T) {
	var (
		errUnknown     = errors.New("unknown")
		errUnavailable = errors.New("unavailable")
		errReused      = errors.New("reused")
		errBadKey      = errors.New("bad key")
		errBadSession  = errors.New("bad session")
	)
	pe := PublishErrors{OutcomeUnknown: errUnknown, Unavailable: errUnavailable, KeyReused: errReused,
		InvalidKey: errBadKey, InvalidSession: errBadSession}
	for _, c := range []struct {
		err        error
		status     int
		code       string
		retryAfter bool
	}{
		// Outcome unknown wins over the unavailable it also wraps.
		{fmt.Errorf("%w (%w)", errUnknown, errUnavailable), 503, "publish_outcome_unknown", true},
		{fmt.Errorf("x: %w", errUnavailable), 503, "unavailable", true},
		{errReused, 422, "idempotency_key_reused", false},
		{errBadKey, 400, "invalid_idempotency_key", false},
		{errBadSession, 400, "invalid_session_id", false},
		{eventbus.CheckSessionID("a\xff"), 400, "invalid_session_id", false},
		{eventbus.ErrInvalidEvent, 400, "invalid_event", false},
		{eventbus.ErrEventTooLarge, 413, "event_too_large", false},
		{eventbus.ErrClosed, 503, "shutting_down", true},
	} {
		w := httptest.NewRecorder()
		if !pe.Write(w, c.err) {
			t.Fatalf("%v: not written", c.err)
		}
		var body map[string]string
		json.Unmarshal(w.Body.Bytes(), &body)
		if w.Code != c.status || body["code"] != c.code || (w.Header().Get("Retry-After") != "") != c.retryAfter {
			t.Fatalf("%v: %d %v Retry-After %q; want %d %s", c.err, w.Code, body, w.Header().Get("Retry-After"), c.status, c.code)
		}
		if c.code == "publish_outcome_unknown" && (!strings.Contains(body["error"], "may or may not") ||
			!strings.Contains(body["error"], "same Idempotency-Key") || !strings.Contains(body["error"], c.err.Error())) {
			t.Fatalf("outcome unknown body %q does not say what happened, why and how to retry", body["error"])
		}
	}
	w := httptest.NewRecorder()
	if pe.Write(w, errors.New("other")) || w.Body.Len() != 0 {
		t.Fatalf("an unknown error was written: %s", w.Body)
	}
	// Nil sentinels match nothing.
	if (PublishErrors{}).Write(httptest.NewRecorder(), errUnknown) {
		t.Fatal("an empty PublishErrors wrote an answer")
	}
}
