package backplane_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
)

// An engine's sentinels keep their text and their identity, and every
// daemon answers them as SPEC 6.9's table says, through its own routes or
// eventbus.PublishHandler alike (before, a *Backplane served by
// PublishHandler answered an outage 500).
func TestEngineSentinelsAnswerAsTheTableSays(t *testing.T) {
	unavailable := backplane.UnavailableError("mybus: engine unavailable")
	unknown := backplane.OutcomeUnknownError("mybus: publish outcome unknown")
	for _, tc := range []struct {
		sentinel    error
		text, code  string
		status      int
		retryAfter  string
		bodyContain string
	}{
		{unavailable, "mybus: engine unavailable", "unavailable", http.StatusServiceUnavailable, "1", "mybus: engine unavailable"},
		{unknown, "mybus: publish outcome unknown", "publish_outcome_unknown", http.StatusServiceUnavailable, "1", "may or may not have been appended"},
	} {
		if tc.sentinel.Error() != tc.text {
			t.Errorf("text %q, want %q", tc.sentinel.Error(), tc.text)
		}
		err := fmt.Errorf("publish to session s: %w", tc.sentinel)
		if !errors.Is(err, tc.sentinel) {
			t.Errorf("%v does not match its sentinel", err)
		}
		w := httptest.NewRecorder()
		eventbus.WriteError(w, httptest.NewRequest(http.MethodPost, "/session/s/events", nil), err)
		if w.Code != tc.status || w.Header().Get("Retry-After") != tc.retryAfter ||
			!strings.Contains(w.Body.String(), `"code":"`+tc.code+`"`) || !strings.Contains(w.Body.String(), tc.bodyContain) {
			t.Errorf("%s: %d Retry-After %q %s; want %d %s", tc.text, w.Code, w.Header().Get("Retry-After"), w.Body, tc.status, tc.code)
		}
	}
	if errors.Is(unavailable, unknown) || errors.Is(unknown, unavailable) {
		t.Error("the two sentinels match each other")
	}
}
