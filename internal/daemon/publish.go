package daemon

import (
	"errors"
	"net/http"

	"github.com/ssebus/eventbus"
)

// IdempotencyKeyHeader is the request header of POST /session/{id}/events
// that makes a publish idempotent: a retry with the same key and event
// within the daemon's window appends nothing and answers the first
// publish's id with "duplicate":true.
const IdempotencyKeyHeader = "Idempotency-Key"

// IdempotencyKey returns the Idempotency-Key of r and whether the request
// has one. A header present but empty, or present more than once, is
// returned as "", which no backplane accepts (400 invalid_idempotency_key):
// a client that sent a key is never treated as one that sent none.
func IdempotencyKey(r *http.Request) (key string, ok bool) {
	v := r.Header.Values(IdempotencyKeyHeader)
	switch len(v) {
	case 0:
		return "", false
	case 1:
		return v[0], true
	}
	return "", true
}

// RetryAfterSeconds is the Retry-After of the daemons' 503 answers.
const RetryAfterSeconds = "1"

// OutcomeUnknownMessage starts the "error" of a 503
// publish_outcome_unknown; the backplane's error (why the answer was lost)
// follows in parentheses.
const OutcomeUnknownMessage = "the backplane's answer was lost (no answer in time, or the connection was cut): " +
	"the event may or may not have been appended; " +
	"retry with the same Idempotency-Key to apply it at most once (a retry without one may append it twice)"

// PublishErrors maps the errors of a publish to HTTP answers, in one place
// for every daemon: each field is the sentinel a backplane's errors wrap
// (nil: the daemon has none). A backplane daemon (redisbus, pgbus) fills it
// with its module's sentinels.
type PublishErrors struct {
	// OutcomeUnknown: sent but not answered (a timeout, a broken
	// connection): 503 publish_outcome_unknown with Retry-After and
	// OutcomeUnknownMessage, then the error. Checked first: it may also
	// wrap Unavailable.
	OutcomeUnknown error
	// KeyReused: the key was used for a different event: 422
	// idempotency_key_reused.
	KeyReused error
	// InvalidKey: 400 invalid_idempotency_key.
	InvalidKey error
	// InvalidSession: 400 invalid_session_id (a session id the backplane
	// refuses), as eventbus.ErrInvalidSessionID is.
	InvalidSession error
	// Unavailable: the engine could not be reached and nothing was
	// appended: 503 unavailable with Retry-After.
	Unavailable error
}

// Write writes the answer to a publish that failed with err and reports
// true, or reports false, writing nothing, for an error it does not know
// (the caller answers, typically 500). Besides the fields' sentinels it
// knows eventbus.ErrInvalidSessionID (400 invalid_session_id),
// eventbus.ErrEventTooLarge (413 event_too_large), eventbus.ErrInvalidEvent
// (400 invalid_event) and eventbus.ErrClosed (503 shutting_down with
// Retry-After).
func (pe PublishErrors) Write(w http.ResponseWriter, err error) bool {
	is := func(target error) bool { return target != nil && errors.Is(err, target) }
	switch {
	case is(pe.OutcomeUnknown):
		WriteUnavailable(w, "publish_outcome_unknown", OutcomeUnknownMessage+" ("+err.Error()+")")
	case is(pe.KeyReused):
		WriteError(w, http.StatusUnprocessableEntity, "idempotency_key_reused", err.Error())
	case is(pe.InvalidKey):
		WriteError(w, http.StatusBadRequest, "invalid_idempotency_key", err.Error())
	case errors.Is(err, eventbus.ErrInvalidSessionID), is(pe.InvalidSession):
		WriteError(w, http.StatusBadRequest, "invalid_session_id", err.Error())
	case errors.Is(err, eventbus.ErrEventTooLarge):
		WriteError(w, http.StatusRequestEntityTooLarge, "event_too_large", err.Error())
	case errors.Is(err, eventbus.ErrInvalidEvent):
		WriteError(w, http.StatusBadRequest, "invalid_event", err.Error())
	case is(pe.Unavailable):
		WriteUnavailable(w, "unavailable", "publish failed: the backplane is unreachable; the event was not appended")
	case errors.Is(err, eventbus.ErrClosed):
		WriteUnavailable(w, "shutting_down", "the daemon is shutting down")
	default:
		return false
	}
	return true
}

// WriteUnavailable writes a 503 with Retry-After: RetryAfterSeconds and
// the JSON error body {"code":code,"error":msg}.
func WriteUnavailable(w http.ResponseWriter, code, msg string) {
	w.Header().Set("Retry-After", RetryAfterSeconds)
	WriteError(w, http.StatusServiceUnavailable, code, msg)
}

// WritePublished writes the 200 response of a publish:
// {"epoch":"...","id":N}, with "duplicate":true when an idempotent publish
// found its key already used for the same event (id is then the first
// publish's, and nothing was appended).
func WritePublished(w http.ResponseWriter, id uint64, epoch string, duplicate bool) {
	body := map[string]any{"id": id, "epoch": epoch}
	if duplicate {
		body["duplicate"] = true
	}
	WriteJSON(w, http.StatusOK, body)
}
