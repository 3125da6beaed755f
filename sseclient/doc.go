// Package sseclient is a client of eventbus Server-Sent Events streams
// (github.com/ssebus/eventbus, docs/SPEC.md sections 4, 5 and 9), and the
// strict SSE parser it is built on. It imports only the standard library
// and this module's internal codec of the composite cursor
// (internal/muxcursor), not package eventbus, so eventbus's own tests can
// use it.
//
// A [Client] connects, turns frames into typed callbacks (events, signals,
// caught-up, resync with the missing id range, slow warning, eviction,
// connection state, errors) and reconnects until its context ends: it
// resumes from the last delivered id and its epoch (both id forms, "N" and
// "<epoch>:<N>"), drops duplicates by id, follows the server's retry: with
// full-jitter exponential backoff, honours Retry-After on 429 and 503, stops
// on answers that retrying cannot fix (400, 404), and asks a credentials
// callback again when the server says to re-authenticate. With
// Client.Sessions it reads several sessions on one multiplexed stream
// (eventbus.MuxHandler, e.g. GET /events?session=a&session=b): every
// callback's value names its session, each session is resumed, deduplicated
// and epoch-checked on its own from the composite cursor, a session the
// server says is gone is dropped from the URL (OnSessionGone), and
// AddSession and RemoveSession change the sessions of a running client.
//
// Where a Run starts is Client.ResumeFrom: empty for live only, "0" for
// everything the server still holds (on a multiplexed stream, every
// session from the start of its ring), else an id or a composite cursor.
// Where the client stands is Client.LastEventID (and Cursor, SessionCursor),
// to persist and resume from in a later client.
//
// A session that is gone is never reconnected to: a stream_error closed
// (the session was deleted while streaming) ends Run on a single stream
// and drops the session on a multiplexed one; a 404 session_not_found
// (the session does not exist: never created, deleted, or unknown to a
// daemon that restarted until something re-creates it) likewise, at once,
// or after Client.RetryNotFound, during which the client keeps asking and
// resumes the session (epoch_reset) once it exists again. Both errors
// match ErrSessionGone.
//
// A [Parser] reads any text/event-stream by the WHATWG rules, with no line
// length limit below its MaxEventBytes: a test helper for handlers as much
// as the client's reader.
package sseclient
