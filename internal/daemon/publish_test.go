package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ssebus/eventbus"
)

// EngineErrors.Map turns a backplane's own sentinels into errors the
// library's table answers as every daemon must (docs/SPEC.md 6.9).
func TestEngineErrorsMap(t *testing.T) {
	var (
		errUnknown     = errors.New("unknown")
		errUnavailable = errors.New("unavailable")
		errBadSession  = errors.New("bad session")
	)
	ee := ReplicaErrors(errUnknown, errBadSession, errUnavailable)
	for _, c := range []struct {
		err        error
		status     int
		code       string
		retryAfter bool
	}{
		// Outcome unknown wins over the unavailable it also wraps.
		{fmt.Errorf("%w (%w)", errUnknown, errUnavailable), 503, "publish_outcome_unknown", true},
		{fmt.Errorf("x: %w", errUnavailable), 503, "unavailable", true},
		{errBadSession, 400, "invalid_session_id", false},
		{eventbus.CheckSessionID("a\xff"), 400, "invalid_session_id", false},
		{eventbus.ErrIdempotencyKeyReused, 422, "idempotency_key_reused", false},
		{eventbus.CheckIdempotencyKey(""), 400, "invalid_idempotency_key", false},
		{eventbus.ErrInvalidEvent, 400, "invalid_event", false},
		{eventbus.ErrEventTooLarge, 413, "event_too_large", false},
		{eventbus.ErrClosed, 503, "shutting_down", true},
		{errors.New("other"), 500, "internal", false},
	} {
		err := ee.Map(c.err, "Fake unavailable")
		w := httptest.NewRecorder()
		eventbus.WriteError(w, httptest.NewRequest(http.MethodPost, "/", nil), err)
		var body struct{ Error, Code string }
		if e := json.Unmarshal(w.Body.Bytes(), &body); e != nil || w.Code != c.status || body.Code != c.code || (w.Header().Get("Retry-After") != "") != c.retryAfter {
			t.Fatalf("%v: %d %s Retry-After %q; want %d %s", c.err, w.Code, w.Body, w.Header().Get("Retry-After"), c.status, c.code)
		}
		if !errors.Is(err, c.err) {
			t.Fatalf("%v: the mapped error %v does not wrap it", c.err, err)
		}
		if c.code == "publish_outcome_unknown" && (!strings.Contains(body.Error, "may or may not") ||
			!strings.Contains(body.Error, "same Idempotency-Key") || !strings.Contains(body.Error, c.err.Error())) {
			t.Fatalf("outcome unknown body %q does not say what happened, why and how to retry", body.Error)
		}
		if c.code == "unavailable" && body.Error != "Fake unavailable" {
			t.Fatalf("unavailable body %q", body.Error)
		}
	}
	if err := ee.Map(nil, ""); err != nil {
		t.Fatalf("Map(nil) = %v", err)
	}
	// Nil sentinels match nothing.
	if err := (EngineErrors{}).Map(errUnknown, ""); err != errUnknown {
		t.Fatalf("an empty EngineErrors mapped %v", err)
	}
}
