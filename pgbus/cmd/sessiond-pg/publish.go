package main

import (
	"errors"
	"net/http"

	"github.com/ssebus/eventbus"
	shared "github.com/ssebus/eventbus/internal/daemon"
)

// The HTTP answers of a publish, as sessiond-redis gives them (the
// redishard branch moves them into internal/daemon as PublishErrors,
// WriteUnavailable, IdempotencyKey and WritePublished; this file goes
// once that lands on main).

// retryAfterSeconds is the Retry-After of the daemon's 503 answers.
const retryAfterSeconds = "1"

// outcomeUnknownMessage is the "error" of a 503 publish_outcome_unknown.
const outcomeUnknownMessage = "the backplane did not answer in time: the event may or may not have been appended; " +
	"retry with the same Idempotency-Key to apply it at most once (a retry without one may append it twice)"

// idempotencyKey returns the Idempotency-Key of r and whether the request
// has one. A header present but empty, or present more than once, is
// returned as "", which the backplane refuses (400
// invalid_idempotency_key): a client that sent a key is never treated as
// one that sent none.
func idempotencyKey(r *http.Request) (key string, ok bool) {
	v := r.Header.Values("Idempotency-Key")
	switch len(v) {
	case 0:
		return "", false
	case 1:
		return v[0], true
	}
	return "", true
}

// publishErrorMap maps the errors of a publish to HTTP answers: each field
// is the sentinel the backplane's errors wrap.
type publishErrorMap struct {
	OutcomeUnknown, KeyReused, InvalidKey, InvalidSession, Unavailable error
}

// Write writes the answer to a publish that failed with err and reports
// true, or reports false, writing nothing, for an error it does not know.
func (pe publishErrorMap) Write(w http.ResponseWriter, err error) bool {
	switch {
	case errors.Is(err, pe.OutcomeUnknown): // first: it also wraps Unavailable
		writeUnavailable(w, "publish_outcome_unknown", outcomeUnknownMessage)
	case errors.Is(err, pe.KeyReused):
		shared.WriteError(w, http.StatusUnprocessableEntity, "idempotency_key_reused", err.Error())
	case errors.Is(err, pe.InvalidKey):
		shared.WriteError(w, http.StatusBadRequest, "invalid_idempotency_key", err.Error())
	case errors.Is(err, eventbus.ErrEventTooLarge):
		shared.WriteError(w, http.StatusRequestEntityTooLarge, "event_too_large", err.Error())
	case errors.Is(err, eventbus.ErrInvalidEvent), errors.Is(err, pe.InvalidSession):
		shared.WriteError(w, http.StatusBadRequest, "invalid_event", err.Error())
	case errors.Is(err, pe.Unavailable):
		writeUnavailable(w, "unavailable", "publish failed: the backplane is unreachable; the event was not appended")
	case errors.Is(err, eventbus.ErrClosed):
		writeUnavailable(w, "shutting_down", "the daemon is shutting down")
	default:
		return false
	}
	return true
}

// writeUnavailable writes a 503 with Retry-After and the JSON error body.
func writeUnavailable(w http.ResponseWriter, code, msg string) {
	w.Header().Set("Retry-After", retryAfterSeconds)
	shared.WriteError(w, http.StatusServiceUnavailable, code, msg)
}

// writePublished writes the 200 answer of a publish, with
// "duplicate":true when an idempotent publish found its key used for the
// same event (nothing was appended; id is the first publish's).
func writePublished(w http.ResponseWriter, id uint64, epoch string, duplicate bool) {
	body := map[string]any{"id": id, "epoch": epoch}
	if duplicate {
		body["duplicate"] = true
	}
	shared.WriteJSON(w, http.StatusOK, body)
}
