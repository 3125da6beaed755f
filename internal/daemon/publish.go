package daemon

import (
	"errors"
	"fmt"
	"time"

	"github.com/ssebus/eventbus"
)

// EngineErrors are a backplane module's own sentinels, which the one table
// of errors and answers (docs/SPEC.md 6.9, eventbus.ErrorStatus) does not
// know: Map turns an error wrapping one of them into one the table answers
// as every daemon must. A nil field matches nothing.
type EngineErrors struct {
	// OutcomeUnknown: a publish sent but not answered (a timeout, a
	// broken connection): eventbus.OutcomeUnknown, 503
	// publish_outcome_unknown with Retry-After. Checked first: it may also
	// wrap Unavailable.
	OutcomeUnknown error
	// InvalidSession: a session id the backplane refuses (its own rule,
	// stricter than eventbus.CheckSessionID): 400 invalid_session_id, as
	// eventbus.ErrInvalidSessionID.
	InvalidSession error
	// Unavailable: the engine could not be reached and nothing was done:
	// eventbus.Unavailable, 503 unavailable with Retry-After.
	Unavailable error
}

// Map returns err as the table answers it: an error wrapping
// OutcomeUnknown as eventbus.OutcomeUnknown(err); one wrapping
// InvalidSession (and not eventbus.ErrInvalidSessionID already) wrapped
// with eventbus.ErrInvalidSessionID; one wrapping Unavailable as
// eventbus.Unavailable with Retry-After: 1 and msg, err its cause; any
// other (nil too) as it is.
func (ee EngineErrors) Map(err error, msg string) error {
	is := func(target error) bool { return target != nil && errors.Is(err, target) }
	switch {
	case err == nil:
		return nil
	case is(ee.OutcomeUnknown):
		return eventbus.OutcomeUnknown(err)
	case errors.Is(err, eventbus.ErrInvalidSessionID):
		return err
	case is(ee.InvalidSession):
		return fmt.Errorf("%w: %w", eventbus.ErrInvalidSessionID, err)
	case is(ee.Unavailable):
		se := eventbus.Unavailable(time.Second, msg)
		se.Err = err
		return se
	}
	return err
}
