package eventbus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tableRow is one row of the table of docs/SPEC.md 6.9: an error and the
// answer every route gives it.
type tableRow struct {
	name       string
	err        error
	status     int
	code       string
	msg        string // a part of the body's "error"; "" for err's own text
	retryAfter string
}

// errorTable is the table, row by row, each error wrapped as a Publisher
// (or a daemon) would return it.
func errorTable() []tableRow {
	cause := errors.New("engine: connection reset")
	engineDown := Unavailable(2*time.Second, "Fake unavailable; retry after Retry-After")
	engineDown.Err = cause
	return []tableRow{
		{"StatusError", &StatusError{Status: http.StatusForbidden, Code: "nope", Message: "not yours"}, 403, "nope", "not yours", ""},
		{"wrapped StatusError", fmt.Errorf("lookup: %w", &StatusError{Status: http.StatusTooManyRequests, Message: "slow down", RetryAfter: 1500 * time.Millisecond}), 429, "too_many_requests", "slow down", "2"},
		{"Unavailable", fmt.Errorf("publish: %w", engineDown), 503, "unavailable", "Fake unavailable", "2"},
		{"OutcomeUnknown", OutcomeUnknown(cause), 503, "publish_outcome_unknown", "may or may not have been appended", "1"},
		{"ErrInvalidSessionID", CheckSessionID("a\xff"), 400, "invalid_session_id", "", ""},
		{"ErrInvalidIdempotencyKey", CheckIdempotencyKey(""), 400, "invalid_idempotency_key", "", ""},
		{"ErrIdempotencyKeyReused", fmt.Errorf("%w: key %q", ErrIdempotencyKeyReused, "k"), 422, "idempotency_key_reused", "", ""},
		{"ErrEventTooLarge", fmt.Errorf("%w: 2000 bytes", ErrEventTooLarge), 413, "event_too_large", "", ""},
		{"ErrInvalidEvent", fmt.Errorf("%w: empty type", ErrInvalidEvent), 400, "invalid_event", "", ""},
		{"ErrSessionNotFound", fmt.Errorf("%w: %q", ErrSessionNotFound, "s"), 404, "session_not_found", "", ""},
		{"ErrHubFull", ErrHubFull, 503, "too_many_sessions", "too many sessions", "1"},
		{"ErrClosed", fmt.Errorf("sessiond: shutting down: %w", ErrClosed), 503, "shutting_down", "shutting down", "1"},
		{"MaxBytesError", fmt.Errorf("read: %w", &http.MaxBytesError{Limit: 1000}), 413, "body_too_large", "larger than 1000 bytes", ""},
		{"read deadline", fmt.Errorf("read: %w", os.ErrDeadlineExceeded), 408, "request_timeout", "did not arrive in time", ""},
		{"context.Canceled", fmt.Errorf("publish: %w", context.Canceled), 503, "unavailable", "canceled", "1"},
		{"context.DeadlineExceeded", context.DeadlineExceeded, 503, "unavailable", "ran out of time", "1"},
		{"another error", errors.New("disk on fire: /var/secret"), 500, "internal", "internal error", ""},
		{"nil", nil, 500, "internal", "internal error", ""},
	}
}

// checkAnswer checks an error answer against row: the status, the JSON
// body {"error":...,"code":...} and its headers.
func checkAnswer(t *testing.T, row tableRow, w *httptest.ResponseRecorder) {
	t.Helper()
	var body struct {
		Error string `json:"error"`
		Code  string `json:"code"`
	}
	dec := json.NewDecoder(bytes.NewReader(w.Body.Bytes()))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(&body), "body %s", w.Body)
	require.Equal(t, row.status, w.Code, "body %s", w.Body)
	require.Equal(t, row.code, body.Code)
	switch {
	case row.msg != "":
		require.Contains(t, body.Error, row.msg)
	case row.err != nil:
		require.Equal(t, row.err.Error(), body.Error)
	}
	require.Equal(t, row.retryAfter, w.Header().Get("Retry-After"))
	require.Equal(t, "application/json", w.Header().Get("Content-Type"))
	require.Equal(t, "no-store", w.Header().Get("Cache-Control"))
	require.Equal(t, row.status == http.StatusRequestTimeout, w.Header().Get("Connection") == "close")
	if row.status == http.StatusInternalServerError {
		require.NotContains(t, w.Body.String(), "secret", "a 500 sent its cause")
	}
}

// Every row of the table: WriteError's status, code, body and headers, and
// ErrorStatus's answer, which wraps the error; a 500's cause is logged,
// never sent.
func TestWriteErrorTable(t *testing.T) {
	for _, row := range errorTable() {
		t.Run(row.name, func(t *testing.T) {
			var logs bytes.Buffer
			w := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodPost, "/session/s/events", nil)
			se := writeError(w, r, row.err, slog.New(slog.NewTextHandler(&logs, nil)))
			checkAnswer(t, row, w)
			require.Equal(t, row.status, ErrorStatus(row.err).Status)
			require.Equal(t, se, ErrorStatus(row.err))
			var inner *StatusError
			switch {
			case errors.As(row.err, &inner):
				require.Same(t, inner, se, "a StatusError is answered as it is")
			case row.err != nil:
				require.ErrorIs(t, se, row.err)
			}
			if row.code == "internal" {
				require.Contains(t, logs.String(), "level=ERROR")
				if row.err != nil {
					require.Contains(t, logs.String(), row.err.Error())
				}
			} else {
				require.Empty(t, logs.String(), "a known error was logged")
			}
		})
	}
	// The exported one logs with slog.Default.
	w := httptest.NewRecorder()
	WriteError(w, httptest.NewRequest(http.MethodGet, "/", nil), ErrHubFull)
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
}

// An error that wraps both a StatusError and a sentinel is answered as the
// StatusError says: an engine's answer wins.
func TestErrorStatusPrefersTheStatusError(t *testing.T) {
	err := fmt.Errorf("%w: %w", ErrInvalidEvent, OutcomeUnknown(errors.New("cut")))
	require.Equal(t, "publish_outcome_unknown", ErrorStatus(err).Code)
	// OutcomeUnknown without a cause still says what to do.
	se := OutcomeUnknown(nil)
	require.Contains(t, se.Message, "same Idempotency-Key")
	require.Equal(t, outcomeUnknownMessage, se.Message)
}

// The table in docs/SPEC.md 6.9 names every code ErrorStatus answers.
func TestErrorTableIsInTheSpec(t *testing.T) {
	spec, err := os.ReadFile("docs/SPEC.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(spec), "\n### 6.9 The publish route and the errors\n")
	require.True(t, ok, "SPEC.md has no section 6.9")
	section, _, _ = strings.Cut(section, "\n## ")
	for _, row := range errorTable() {
		if row.name == "StatusError" || row.name == "wrapped StatusError" {
			continue
		}
		want := fmt.Sprintf("| %d | `%s` |", row.status, row.code)
		require.Contains(t, section, want, "row %s", row.name)
	}
	for _, code := range []string{"invalid_body", "server_busy", "method_not_allowed"} {
		require.Contains(t, section, "`"+code+"`")
	}
}
