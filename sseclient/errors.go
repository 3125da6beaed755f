package sseclient

import (
	"errors"
	"strconv"
	"time"
)

var (
	// ErrInvalidOption is wrapped by the error Run returns at once for a
	// Client field out of range.
	ErrInvalidOption = errors.New("sseclient: invalid option")
	// ErrRunning is returned by Run when the Client is already running.
	ErrRunning = errors.New("sseclient: Run called while the client runs")
	// ErrNotEventStream is Run's final error when the server answers 200
	// (or 204) with something that is not a text/event-stream.
	ErrNotEventStream = errors.New("sseclient: the response is not a text/event-stream")
	// ErrIdleTimeout is reported through OnError when nothing, not even a
	// heartbeat, arrived for IdleTimeout; the client reconnects.
	ErrIdleTimeout = errors.New("sseclient: nothing received for IdleTimeout")
	// ErrProtocol is wrapped by the errors reported through OnError for a
	// frame that is not an eventbus envelope; the frame is skipped.
	ErrProtocol = errors.New("sseclient: protocol error")
	// ErrStreamCut is wrapped by the errors reported through OnError when
	// an open stream ends without a terminal frame (a clean end of the
	// response, or the connection failing); the client resumes.
	ErrStreamCut = errors.New("sseclient: the stream was cut")
	// ErrNoSessions is Run's final error on a multiplexed stream
	// (Client.Sessions) once every session is gone (OnSessionGone).
	ErrNoSessions = errors.New("sseclient: every session of the multiplexed stream is gone")
	// ErrSessionGone matches (errors.Is) the errors that say a session is
	// gone: a 404 session_not_found (*HTTPError: it does not exist, or the
	// daemon restarted and nothing re-created it yet) and a stream_error
	// closed (*StreamError: it was deleted while streaming). On a single
	// stream either is Run's final error (the 404 once Client.RetryNotFound
	// has passed); on a multiplexed stream it is SessionGone.Err.
	ErrSessionGone = errors.New("sseclient: the session is gone")
	// ErrWebSocketBinary is what a WebSocketConn's ReadMessage returns for
	// a binary message: the server of docs/SPEC.md 6.10 sends text only.
	ErrWebSocketBinary = errors.New("sseclient: a binary WebSocket message")
	// ErrNotMultiplexed is returned by AddSession and RemoveSession on a
	// client without Sessions.
	ErrNotMultiplexed = errors.New("sseclient: AddSession and RemoveSession need a multiplexed client (Sessions)")
)

// HTTPError is a non-200 answer. Run returns it as its final error for
// 400, 404, another 4xx than 408, 425 and 429, and a 401 or 403 it cannot
// recover from; it reports the others through OnError and retries.
type HTTPError struct {
	StatusCode int
	// Code and Message are the JSON error body's "code" and "error" (for
	// example session_not_found, subscriber_limit_exceeded), empty when the
	// body was not one.
	Code    string
	Message string
	// Session is the body's "session": on a multiplexed stream, the
	// session the answer is about (the unknown one of a 404, the refused
	// one of a 403, the full one of a 429); "" when it names none.
	Session string
	// RetryAfter is the Retry-After header's delay, when HasRetryAfter.
	RetryAfter    time.Duration
	HasRetryAfter bool
	// Challenge is the WWW-Authenticate header, which a 401 carries: what
	// the credentials lacked, such as `Bearer realm="app",
	// error="invalid_token"`. Empty when the answer had none.
	Challenge string
}

// Is reports whether target is ErrSessionGone and e a 404
// session_not_found.
func (e *HTTPError) Is(target error) bool {
	return target == ErrSessionGone && e.StatusCode == 404 && e.Code == "session_not_found"
}

// Error returns "sseclient: HTTP <status> <code>: <message>".
func (e *HTTPError) Error() string {
	s := "sseclient: HTTP " + strconv.Itoa(e.StatusCode)
	if e.Code != "" {
		s += " " + e.Code
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// StreamError is a stream_error frame: the server ended the stream. Kind is
// its errorKind: internal, reauthenticate, revoked, unavailable, shutdown,
// closed (the session was deleted: on a single stream Run's final error,
// on a multiplexed stream that session is dropped and the others go on, see
// SessionGone; errors.Is(err, ErrSessionGone) holds), or a newer server's
// kind. The others are reported through OnError; the client reconnects and
// resumes from its cursor: at once with fresh credentials for
// reauthenticate and revoked, after a random delay in [RetryAfter,
// 2*RetryAfter] for shutdown (see Client), with backoff for the others.
type StreamError struct {
	// Session is, on a multiplexed stream, the session the frame named.
	Session string
	Kind    string
	Message string
	// RetryAfter is, for Kind shutdown, the frame's retryAfter (the server
	// is going away: come back after it), 2s when the frame had none; 0 for
	// the other kinds.
	RetryAfter time.Duration
}

// Error returns "sseclient: the server ended the stream (<kind>): <message>",
// and for kind closed "sseclient: the session is gone (stream_error closed):
// <message>".
func (e *StreamError) Error() string {
	if e.Kind == kindClosed {
		return "sseclient: the session is gone (stream_error closed): " + e.Message
	}
	return "sseclient: the server ended the stream (" + e.Kind + "): " + e.Message
}

// Is reports whether target is ErrSessionGone and e of kind closed.
func (e *StreamError) Is(target error) bool {
	return target == ErrSessionGone && e.Kind == kindClosed
}
