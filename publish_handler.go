package eventbus

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"
)

// Publisher is where a PublishHandler publishes: a Hub (Hub.Publisher), or
// a backplane, whose Publish and PublishIdempotent have exactly these
// signatures (redisbus, pgbus and natsbus's *Backplane satisfy it). Its
// methods are called concurrently, one call per request, with the
// request's context: they must be safe for concurrent use.
//
// Their errors are answered by the table of docs/SPEC.md section 6.9
// (ErrorStatus): the package's sentinels (ErrInvalidSessionID,
// ErrInvalidEvent, ErrEventTooLarge, ErrInvalidIdempotencyKey,
// ErrIdempotencyKeyReused, ErrHubFull, ErrClosed) as the table says, an
// error that is or wraps a *StatusError as that says: a Publisher whose
// engine can be unreachable returns (or wraps) Unavailable(...) when
// nothing was appended and OutcomeUnknown(cause) when the event may have
// been appended all the same. Any other error is a 500 whose cause is
// logged, not sent. (redisbus, pgbus and natsbus return sentinels of their
// own for those two, ErrUnavailable and ErrOutcomeUnknown, made with
// backplane.UnavailableError and backplane.OutcomeUnknownError: each
// carries its *StatusError, so they are answered so without a mapping.)
type Publisher interface {
	// Publish appends e to session's log, creating the session if it
	// does not exist, and returns the event's id and the session's epoch.
	Publish(ctx context.Context, session string, e Event) (id uint64, epoch string, err error)
	// PublishIdempotent is Publish with an idempotency key, by the rules
	// of docs/SPEC.md section 8.3: within the key's window, a key already
	// used with the same event (Encoder.Fingerprint) appends nothing and
	// returns the first publish's id with duplicate true; with another
	// event it fails with ErrIdempotencyKeyReused; a key
	// CheckIdempotencyKey refuses fails with ErrInvalidIdempotencyKey.
	PublishIdempotent(ctx context.Context, session, key string, e Event) (id uint64, epoch string, duplicate bool, err error)
}

// IdempotencyKeyHeader is the request header that makes a publish of
// PublishHandler idempotent (Publisher.PublishIdempotent).
const IdempotencyKeyHeader = "Idempotency-Key"

// PublishHandler serves POST /session/{id}/events: it publishes the
// request body's event to the session r.PathValue("id") through Publisher
// and answers 200 {"id":N,"epoch":"..."}. The body is one JSON object
// {"type":"...","data":...,"originatorClientId":"..."}: the keys matched
// without regard to case, each at most once, no other key, nothing after
// the object; "data" absent leaves the event without data ("data":null is
// kept as null), an empty "originatorClientId" is left out. With an
// Idempotency-Key header it publishes with Publisher.PublishIdempotent: a
// retry of the same event answers the first publish's id with
// "duplicate":true, and nothing is appended (docs/SPEC.md section 8.3).
//
// In this order, before anything is published (docs/SPEC.md 6.9):
//   - a method other than POST: 405 method_not_allowed, Allow: POST;
//   - a session id CheckSessionID refuses: 400 invalid_session_id;
//   - an Idempotency-Key that CheckIdempotencyKey refuses, empty, or sent
//     more than once: 400 invalid_idempotency_key;
//   - a Content-Length above MaxBodyBytes: 413 body_too_large, before
//     any byte of the body is read (the connection closes);
//   - a body while BodyBudget is spent by the bodies being read: 503
//     server_busy with Retry-After, before any byte of it is read;
//   - a body that reads past MaxBodyBytes: 413 body_too_large; one not
//     received within BodyTimeout: 408 request_timeout (the connection
//     closes); one that is not such an object: 400 invalid_body;
//   - then Publisher's error, answered by ErrorStatus.
//
// A client cannot make the handler hold more than BodyBudget bytes of
// bodies at once, nor one body for longer than BodyTimeout, whatever it
// sends: a body is held once (in one buffer of its Content-Length, or of
// at most MaxBodyBytes), its event's data a slice of it, until the
// publish returns. A PublishHandler is safe for concurrent use once it
// serves; its fields must not change then, and it must not be copied
// after its first request. It blocks only on the body (bounded by
// BodyTimeout) and on Publisher (a Hub never waits; a backplane's publish
// is bounded by its own timeout and the request's context).
type PublishHandler struct {
	// Publisher publishes the events: Hub.Publisher(), or a backplane.
	// Required.
	Publisher Publisher
	// MaxBodyBytes is the largest body; 0 or negative: the largest event
	// of Publisher plus PublishBodySlack (1 MiB) — the Hub's
	// Bus.MaxEventBytes for Hub.Publisher(), DefaultMaxEventBytes for any
	// other Publisher: a daemon whose MaxEventBytes is not the default
	// sets it.
	MaxBodyBytes int64
	// BodyTimeout bounds the time a body takes to arrive, from the start
	// of the handler; 0 or negative: DefaultBodyTimeout (30 s). A daemon
	// needs no server-wide ReadTimeout for it (which would cut its SSE
	// streams).
	BodyTimeout time.Duration
	// BodyBudget bounds the bytes of the bodies being read at once by this
	// handler: each body reserves its Content-Length (MaxBodyBytes without
	// one) until its publish returns. 0 or negative: four bodies of
	// MaxBodyBytes; below MaxBodyBytes: MaxBodyBytes.
	BodyBudget int64
	// Logger receives the cause of a 500; nil: slog.Default().
	Logger *slog.Logger

	bodies bodyBudget
}

// publisherLimit is implemented by the Publishers that know their largest
// event (Hub.Publisher).
type publisherLimit interface{ maxEventBytes() int }

func (h *PublishHandler) limits() bodyLimits {
	maxEvent := DefaultMaxEventBytes
	if p, ok := h.Publisher.(publisherLimit); ok {
		maxEvent = p.maxEventBytes()
	}
	return limits(h.MaxBodyBytes, int64(maxEvent)+PublishBodySlack, h.BodyTimeout, h.BodyBudget)
}

func (h *PublishHandler) logger() *slog.Logger {
	if h.Logger != nil {
		return h.Logger
	}
	return slog.Default()
}

// published is the body of a publish's 200.
type published struct {
	ID        uint64 `json:"id"`
	Epoch     string `json:"epoch"`
	Duplicate bool   `json:"duplicate,omitempty"`
}

// ServeHTTP implements http.Handler: it serves one request as PublishHandler says
// (its refusals, in order, and what it blocks on).
func (h *PublishHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !allowMethod(w, r, http.MethodPost, h.logger()) {
		return
	}
	session := r.PathValue("id")
	if err := CheckSessionID(session); err != nil {
		writeError(w, r, err, h.logger())
		return
	}
	key, keyed, err := idempotencyKey(r)
	if err != nil {
		writeError(w, r, err, h.logger())
		return
	}
	body, release, err := h.bodies.readBody(w, r, h.limits())
	defer release()
	if err != nil {
		writeError(w, r, err, h.logger())
		return
	}
	e, err := decodePublish(body)
	if err != nil {
		writeError(w, r, bodyError(err), h.logger())
		return
	}
	var out published
	if keyed {
		out.ID, out.Epoch, out.Duplicate, err = h.Publisher.PublishIdempotent(r.Context(), session, key, e)
	} else {
		out.ID, out.Epoch, err = h.Publisher.Publish(r.Context(), session, e)
	}
	if err != nil {
		writeError(w, r, err, h.logger())
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// idempotencyKey returns r's Idempotency-Key and whether r has one. A key
// CheckIdempotencyKey refuses is its error; so is a header present but
// empty, or present more than once: a client that sent a key is never
// served as one that sent none.
func idempotencyKey(r *http.Request) (key string, ok bool, err error) {
	v := r.Header.Values(IdempotencyKeyHeader)
	switch len(v) {
	case 0:
		return "", false, nil
	case 1:
		return v[0], true, CheckIdempotencyKey(v[0])
	}
	return "", true, fmt.Errorf("%w: the %s header sent %d times, want once", ErrInvalidIdempotencyKey, IdempotencyKeyHeader, len(v))
}

// decodePublish decodes a publish body (PublishHandler) into its event,
// whose data is a slice of body.
func decodePublish(body []byte) (Event, error) {
	v, err := decodeObject(body, "type", "data", "originatorClientId")
	if err != nil {
		return Event{}, err
	}
	var e Event
	if e.Type, err = stringField("type", v[0]); err != nil {
		return Event{}, err
	}
	if e.OriginatorClientID, err = stringField("originatorClientId", v[2]); err != nil {
		return Event{}, err
	}
	if v[1] != nil {
		e.Data = json.RawMessage(v[1])
	}
	return e, nil
}

// allowMethod reports whether r's method is method, else answers 405
// method_not_allowed with Allow: method.
func allowMethod(w http.ResponseWriter, r *http.Request, method string, logger *slog.Logger) bool {
	if r.Method == method {
		return true
	}
	w.Header().Set("Allow", method)
	writeError(w, r, &StatusError{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed",
		Message: "method " + r.Method + " not allowed here"}, logger)
	return false
}

// writeJSON writes v, which must marshal, as an uncacheable JSON answer
// with status, followed by a newline.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic("eventbus: writeJSON: " + err.Error())
	}
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
