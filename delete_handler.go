package eventbus

import (
	"context"
	"log/slog"
	"net/http"
)

// Deleter is what a DeleteHandler deletes sessions with: a Hub
// (Hub.Publisher), or a backplane, whose Delete has exactly this signature
// (redisbus, pgbus and natsbus's *Backplane). Delete must be safe for
// concurrent use; it is called with the request's context.
type Deleter interface {
	// Delete forgets session: its streams get what is queued, then end,
	// and the next publish starts the session again with a new epoch. An
	// unknown session is no error. Its errors are answered as
	// Publisher's are (ErrorStatus).
	Delete(ctx context.Context, session string) error
}

// DeleteHandler serves DELETE /session/{id}: it deletes the session
// r.PathValue("id") with Deleter and answers 204, also for a session that
// does not exist (a DELETE is idempotent). A method other than DELETE is
// 405 method_not_allowed (Allow: DELETE), a session id CheckSessionID
// refuses 400 invalid_session_id before Deleter is called, and Deleter's
// error is answered by ErrorStatus (docs/SPEC.md section 6.9). It reads no
// body. Safe for concurrent use; its fields must not change once it
// serves. It blocks only on Deleter (a Hub never waits).
type DeleteHandler struct {
	// Deleter deletes the sessions: Hub.Publisher(), or a backplane.
	// Required.
	Deleter Deleter
	// Logger receives the cause of a 500; nil: slog.Default().
	Logger *slog.Logger
}

// ServeHTTP implements http.Handler: it serves one request as DeleteHandler says
// (its refusals, in order, and what it blocks on).
func (h *DeleteHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	logger := h.Logger
	if logger == nil {
		logger = slog.Default()
	}
	if !allowMethod(w, r, http.MethodDelete, logger) {
		return
	}
	session := r.PathValue("id")
	err := CheckSessionID(session)
	if err == nil {
		err = h.Deleter.Delete(r.Context(), session)
	}
	if err != nil {
		writeError(w, r, err, logger)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
