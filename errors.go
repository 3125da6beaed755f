package eventbus

import (
	"errors"
	"strconv"
)

// Sentinel errors. Callers branch on them with [errors.Is]; the errors the
// package returns wrap them with more detail.
var (
	// ErrInvalidOption is wrapped by the error New or Subscribe return for an
	// option that is negative, above its maximum, or cannot hold one byte.
	ErrInvalidOption = errors.New("eventbus: invalid option")

	// ErrClosed is returned by Publish on a bus that has been closed. It is the
	// normal shutdown race, so it is cheap and logs nothing.
	ErrClosed = errors.New("eventbus: bus closed")

	// ErrSubscriberLimitExceeded is wrapped by the *SubscriberLimitError that
	// Subscribe returns when the bus already has MaxSubscribers subscribers.
	ErrSubscriberLimitExceeded = errors.New("eventbus: subscriber limit exceeded")

	// ErrInvalidEvent is wrapped by the error Publish returns for an event it
	// cannot accept: an empty type, a type with CR or LF or longer than
	// MaxTypeLen, a type reserved for the synthetic frames (ReservedTypes),
	// or data or metadata that cannot be encoded as JSON. Signal wraps it
	// for the same types, and so do package backplane's Encoder and Append.
	ErrInvalidEvent = errors.New("eventbus: invalid event")

	// ErrEventTooLarge is wrapped by the error Publish returns when the encoded
	// envelope is larger than Options.MaxEventBytes.
	ErrEventTooLarge = errors.New("eventbus: event too large")

	// ErrInvalidFilter is wrapped by the error Subscribe returns for an
	// invalid SubscribeOptions.Types entry; the message names the filter.
	ErrInvalidFilter = errors.New("eventbus: invalid type filter")

	// ErrInvalidIdempotencyKey is wrapped by the error of CheckIdempotencyKey
	// (and of a backplane's idempotent publish) for a key that is not 1 to
	// MaxIdempotencyKeyBytes bytes of printable ASCII.
	ErrInvalidIdempotencyKey = errors.New("eventbus: invalid idempotency key")

	// ErrIdempotencyKeyReused is wrapped by the error of an idempotent
	// publish (a backplane's, or Hub.PublishIdempotent's) whose key a publish of a
	// different event (another fingerprint: backplane.Encoder.Fingerprint,
	// which Hub.PublishIdempotent compares too) used within the key's window.
	ErrIdempotencyKeyReused = errors.New("eventbus: idempotency key reused for a different event")

	// ErrSessionNotFound is what a Handler's or MuxHandler's Lookup returns
	// (or wraps) for an unknown session, and what Hub.LookupSession and
	// Hub.LookupSession wrap; the handlers answer 404.
	ErrSessionNotFound = errors.New("eventbus: session not found")

	// ErrInvalidSessionID is wrapped by the error of CheckSessionID for a
	// session id that is empty, longer than MaxSessionIDBytes or not valid
	// UTF-8, and so by every Hub method that returns an error for one
	// (GetOrCreate, Publish, LookupSession). A Handler's Lookup that
	// returns it (or wraps it) is answered 400 invalid_session_id.
	ErrInvalidSessionID = errors.New("eventbus: invalid session id")

	// ErrEvicted is wrapped by Subscription.Err after the bus evicted the
	// subscription because its queue overflowed.
	ErrEvicted = errors.New("eventbus: subscriber evicted")
)

// SubscriberLimitError is returned by Subscribe when the bus is full. It
// matches ErrSubscriberLimitExceeded with [errors.Is]; use [errors.As] to read
// the limit.
type SubscriberLimitError struct {
	// Limit is the bus's MaxSubscribers.
	Limit int
}

// Error implements error.
func (e *SubscriberLimitError) Error() string {
	return "eventbus: subscriber limit exceeded (limit " + strconv.Itoa(e.Limit) + ")"
}

// Unwrap returns ErrSubscriberLimitExceeded.
func (e *SubscriberLimitError) Unwrap() error { return ErrSubscriberLimitExceeded }
