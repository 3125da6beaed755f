package eventbus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"
)

// The one table of errors and HTTP answers (docs/SPEC.md section 6.9):
// every route of PublishHandler, DeleteHandler and SignalHandler answers
// its errors with it, the demo daemons answer theirs with it, and a daemon
// author answers the errors of its own routes with WriteError.

// errorRetryAfter is the Retry-After of the table's 503s.
const errorRetryAfter = time.Second

// outcomeUnknownMessage starts the "error" of a 503
// publish_outcome_unknown; the cause follows in parentheses.
const outcomeUnknownMessage = "the backplane's answer was lost (no answer in time, or the connection was cut): " +
	"the event may or may not have been appended; " +
	"retry with the same Idempotency-Key to apply it at most once (a retry without one may append it twice)"

// OutcomeUnknown returns the answer to a publish that was sent to an
// engine and not answered (a timeout, a cut connection): 503
// publish_outcome_unknown with Retry-After: 1, its "error" saying that the
// event may or may not have been appended and that a retry with the same
// Idempotency-Key applies it at most once, then, in parentheses, err's
// text (so err must hold nothing a client may not read). Err is err. A
// Publisher whose engine can lose an answer returns it, or an error
// wrapping it, so that every daemon answers alike (docs/SPEC.md 8.3).
func OutcomeUnknown(err error) *StatusError {
	msg := outcomeUnknownMessage
	if err != nil {
		msg += " (" + err.Error() + ")"
	}
	return &StatusError{Status: http.StatusServiceUnavailable, Code: "publish_outcome_unknown",
		Message: msg, RetryAfter: errorRetryAfter, Err: err}
}

// ErrorStatus returns the answer the table of docs/SPEC.md section 6.9
// gives err, as a StatusError whose Err is err:
//
//   - an error that is or wraps a *StatusError: that one, as it is (an
//     engine's own answer, such as OutcomeUnknown or Unavailable, or a
//     daemon's), checked first;
//   - ErrInvalidSessionID: 400 invalid_session_id;
//   - ErrInvalidIdempotencyKey: 400 invalid_idempotency_key;
//   - ErrIdempotencyKeyReused: 422 idempotency_key_reused;
//   - ErrEventTooLarge: 413 event_too_large;
//   - ErrInvalidEvent: 400 invalid_event;
//   - ErrSessionNotFound: 404 session_not_found;
//   - ErrHubFull: 503 too_many_sessions, Retry-After: 1;
//   - ErrClosed: 503 shutting_down, Retry-After: 1;
//   - a *http.MaxBytesError (a body past http.MaxBytesReader's limit):
//     413 body_too_large;
//   - os.ErrDeadlineExceeded (a body that did not arrive before its read
//     deadline): 408 request_timeout;
//   - context.Canceled or context.DeadlineExceeded (the request ended, or
//     ran out of its time, before the work was done): 503 unavailable,
//     Retry-After: 1;
//   - anything else, and nil: 500 internal, "internal error"; the cause
//     is not sent.
//
// The first that matches wins, in this order. The "error" of the
// library's sentinels is err's text, which says what was wrong with the
// request (it quotes at most 64 bytes of a session id, escaped); wrap them
// with nothing a client may not read. It never returns nil and does not
// modify the StatusError err holds.
func ErrorStatus(err error) *StatusError {
	se, _ := errorStatus(err)
	return se
}

// errorStatus is ErrorStatus, also reporting whether err is one the table
// names (false: a 500 internal of its own, whose cause should be logged).
func errorStatus(err error) (*StatusError, bool) {
	var se *StatusError
	if errors.As(err, &se) {
		return se, true
	}
	s := &StatusError{Err: err}
	switch {
	case errors.Is(err, ErrInvalidSessionID):
		s.Status, s.Code = http.StatusBadRequest, "invalid_session_id"
	case errors.Is(err, ErrInvalidIdempotencyKey):
		s.Status, s.Code = http.StatusBadRequest, "invalid_idempotency_key"
	case errors.Is(err, ErrIdempotencyKeyReused):
		s.Status, s.Code = http.StatusUnprocessableEntity, "idempotency_key_reused"
	case errors.Is(err, ErrEventTooLarge):
		s.Status, s.Code = http.StatusRequestEntityTooLarge, "event_too_large"
	case errors.Is(err, ErrInvalidEvent):
		s.Status, s.Code = http.StatusBadRequest, "invalid_event"
	case errors.Is(err, ErrSessionNotFound):
		s.Status, s.Code = http.StatusNotFound, "session_not_found"
	case errors.Is(err, ErrHubFull):
		s.Status, s.Code, s.RetryAfter = http.StatusServiceUnavailable, "too_many_sessions", errorRetryAfter
		s.Message = "too many sessions: " + err.Error()
		return s, true
	case errors.Is(err, ErrClosed):
		s.Status, s.Code, s.RetryAfter = http.StatusServiceUnavailable, "shutting_down", errorRetryAfter
		s.Message = "the daemon is shutting down"
		return s, true
	default:
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			s.Status, s.Code = http.StatusRequestEntityTooLarge, "body_too_large"
			s.Message = fmt.Sprintf("request body larger than %d bytes", mbe.Limit)
		case errors.Is(err, os.ErrDeadlineExceeded):
			s.Status, s.Code = http.StatusRequestTimeout, "request_timeout"
			s.Message = "the request body did not arrive in time"
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			s.Status, s.Code, s.RetryAfter = http.StatusServiceUnavailable, "unavailable", errorRetryAfter
			s.Message = "the request was canceled or ran out of time before it was done"
		default:
			s.Status, s.Code, s.Message = http.StatusInternalServerError, "internal", "internal error"
			return s, false
		}
		return s, true
	}
	s.Message = err.Error()
	return s, true
}

// WriteError answers r with the answer ErrorStatus gives err: the status,
// Retry-After (and WWW-Authenticate) when it has them, Cache-Control:
// no-store, and the JSON body {"error":...,"code":...}, as
// StatusError.ServeHTTP writes it; a 408 request_timeout also closes the
// connection (what is left of the body is not read). A 500 internal's
// cause is logged with slog.Default() at Error, never sent. It must be
// called before anything was written to w. Safe for concurrent use; it
// does not block beyond its write to w.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	writeError(w, r, err, slog.Default())
}

// writeError is WriteError with the logger of a 500's cause; it returns
// the answer written.
func writeError(w http.ResponseWriter, r *http.Request, err error, logger *slog.Logger) *StatusError {
	se, known := errorStatus(err)
	if !known {
		cause := "<nil>"
		if err != nil {
			cause = err.Error()
		}
		logger.LogAttrs(r.Context(), slog.LevelError, "eventbus: request failed",
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("error", cause))
	}
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	if se.Status == http.StatusRequestTimeout {
		h.Set("Connection", "close")
	}
	se.serve(w, "")
	return se
}
