package backplane

import (
	"time"

	"github.com/ssebus/eventbus"
)

// An engine's two failure sentinels (docs/SPEC.md section 8.3): a request
// that provably reached nothing, and a publish sent and not answered. Made
// with UnavailableError and OutcomeUnknownError, they keep the engine's own
// text (and errors.Is by identity), and a daemon's eventbus.WriteError
// answers them as the table of docs/SPEC.md section 6.9 says, whether it
// serves the engine through its own routes or through
// eventbus.PublishHandler: errors.As finds the *eventbus.StatusError each
// one carries.

// UnavailableError returns a sentinel error whose text is text and which a
// daemon answers 503 unavailable with Retry-After: 1: the engine could not
// be reached and nothing was done (an engine's ErrUnavailable).
func UnavailableError(text string) error {
	return &statusSentinel{text: text, status: eventbus.Unavailable(time.Second, text+"; retry after Retry-After")}
}

// OutcomeUnknownError returns a sentinel error whose text is text and
// which a daemon answers 503 publish_outcome_unknown with Retry-After: 1
// (eventbus.OutcomeUnknown): a publish was sent and its answer lost, so
// the event may or may not have been appended (an engine's
// ErrOutcomeUnknown).
func OutcomeUnknownError(text string) error {
	return &statusSentinel{text: text, status: eventbus.OutcomeUnknown(nil)}
}

// statusSentinel is an error with its own text that unwraps to the
// *eventbus.StatusError a daemon answers it with.
type statusSentinel struct {
	text   string
	status *eventbus.StatusError
}

func (e *statusSentinel) Error() string { return e.text }

func (e *statusSentinel) Unwrap() error { return e.status }
