package eventbus

import (
	"context"
	"log/slog"
	"net/http"
	"time"
)

// Signaler is what a SignalHandler sends change signals with: a Hub
// (Hub.Publisher), or a backplane, whose Signal has exactly this signature
// (redisbus, pgbus and natsbus's *Backplane spread it to every replica).
// Signal must be safe for concurrent use; it is called with the request's
// context.
type Signaler interface {
	// Signal sends the change signal (typ, about) to the session's
	// subscribers (EventBus.Signal: no id, never stored, coalesced in
	// their queues). Its errors are answered as Publisher's are
	// (ErrorStatus): an invalid type wraps ErrInvalidEvent, a signal
	// above MaxEventBytes ErrEventTooLarge.
	Signal(ctx context.Context, session, typ, about string) error
}

// SignalHandler serves POST /session/{id}/signal: it sends the change
// signal of the request body, one JSON object {"type":"...","about":"..."}
// (keys matched without regard to case, each at most once, no other key,
// nothing after it), to the session r.PathValue("id") with Signaler and
// answers 204. Its refusals, in order: 405 method_not_allowed (Allow:
// POST), 400 invalid_session_id, then the body's bounds and decoding as
// PublishHandler's (413 body_too_large, 503 server_busy, 408
// request_timeout, 400 invalid_body), then Signaler's error by
// ErrorStatus (docs/SPEC.md section 6.9). Safe for concurrent use once it
// serves; its fields must not change then, and it must not be copied
// after its first request. It blocks only on the body (bounded by
// BodyTimeout) and on Signaler.
type SignalHandler struct {
	// Signaler sends the signals: Hub.Publisher(), or a backplane.
	// Required.
	Signaler Signaler
	// MaxBodyBytes is the largest body; 0 or negative: 1 MiB.
	MaxBodyBytes int64
	// BodyTimeout bounds the time a body takes to arrive, from the start
	// of the handler; 0 or negative: DefaultBodyTimeout.
	BodyTimeout time.Duration
	// BodyBudget bounds the bytes of the bodies being read at once, as
	// PublishHandler's; 0 or negative: four bodies of MaxBodyBytes.
	BodyBudget int64
	// Logger receives the cause of a 500; nil: slog.Default().
	Logger *slog.Logger

	bodies bodyBudget
}

// ServeHTTP implements http.Handler: it serves one request as SignalHandler says
// (its refusals, in order, and what it blocks on).
func (h *SignalHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	logger := h.Logger
	if logger == nil {
		logger = slog.Default()
	}
	if !allowMethod(w, r, http.MethodPost, logger) {
		return
	}
	session := r.PathValue("id")
	if err := CheckSessionID(session); err != nil {
		writeError(w, r, err, logger)
		return
	}
	body, release, err := h.bodies.readBody(w, r, limits(h.MaxBodyBytes, defaultSignalBodyBytes, h.BodyTimeout, h.BodyBudget))
	defer release()
	if err != nil {
		writeError(w, r, err, logger)
		return
	}
	typ, about, err := decodeSignal(body)
	if err != nil {
		writeError(w, r, bodyError(err), logger)
		return
	}
	if err := h.Signaler.Signal(r.Context(), session, typ, about); err != nil {
		writeError(w, r, err, logger)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// decodeSignal decodes a signal body (SignalHandler).
func decodeSignal(body []byte) (typ, about string, err error) {
	v, err := decodeObject(body, "type", "about")
	if err != nil {
		return "", "", err
	}
	if typ, err = stringField("type", v[0]); err != nil {
		return "", "", err
	}
	if about, err = stringField("about", v[1]); err != nil {
		return "", "", err
	}
	return typ, about, nil
}
