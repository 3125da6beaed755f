package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/ssebus/eventbus"
)

// Routes are the handlers of the routes both daemons serve; each finds the
// session id with r.PathValue("id"). Mux routes requests to them.
type Routes interface {
	ServeIndex(w http.ResponseWriter, r *http.Request)      // GET /
	ServeEvents(w http.ResponseWriter, r *http.Request)     // GET /session/{id}/events: the SSE stream
	ServePublish(w http.ResponseWriter, r *http.Request)    // POST /session/{id}/events
	ServeStatus(w http.ResponseWriter, r *http.Request)     // GET /session/{id}
	ServeDelete(w http.ResponseWriter, r *http.Request)     // DELETE /session/{id}
	ServeDisconnect(w http.ResponseWriter, r *http.Request) // POST /session/{id}/disconnect[?mode=clean|abort]
}

// MuxRoutes is what a daemon that serves several sessions on one stream
// (an eventbus.MuxHandler) adds to Routes.
type MuxRoutes interface {
	// ServeMuxEvents is GET (and HEAD, and OPTIONS for a CORS preflight)
	// /events?session=<id>&session=<id>...: the multiplexed SSE stream.
	ServeMuxEvents(w http.ResponseWriter, r *http.Request)
}

// MuxPattern is the route of the multiplexed stream (MuxRoutes); a GET
// pattern serves HEAD too.
const MuxPattern = "GET /events"

// Mux returns a new ServeMux (Go 1.22 patterns) that serves the routes
// with rt; a daemon may add routes of its own to it before it serves, then
// serves it through JSONErrors. OPTIONS of the stream goes to ServeEvents
// too (the eventbus handler answers CORS preflights, or 405). When rt is
// also MuxRoutes, GET and OPTIONS /events go to its ServeMuxEvents.
func Mux(rt Routes) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", rt.ServeIndex)
	mux.HandleFunc("GET /session/{id}/events", rt.ServeEvents)
	mux.HandleFunc("OPTIONS /session/{id}/events", rt.ServeEvents)
	mux.HandleFunc("POST /session/{id}/events", rt.ServePublish)
	mux.HandleFunc("GET /session/{id}", rt.ServeStatus)
	mux.HandleFunc("DELETE /session/{id}", rt.ServeDelete)
	mux.HandleFunc("POST /session/{id}/disconnect", rt.ServeDisconnect)
	if m, ok := rt.(MuxRoutes); ok {
		mux.HandleFunc(MuxPattern, m.ServeMuxEvents)
		mux.HandleFunc(muxPreflight, m.ServeMuxEvents)
	}
	return mux
}

// JSONErrors serves mux, answering what no route matches as the eventbus
// handler answers errors: 405 {"error":...,"code":"method_not_allowed"}
// with the ServeMux's Allow header for a known path with another method,
// 404 {"error":...,"code":"not_found"} for an unknown path. Its redirects
// (a path to clean) are kept.
func JSONErrors(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern != "" {
			mux.ServeHTTP(w, r) // sets r's path values, which Handler does not
			return
		}
		rec := &headerRecorder{header: http.Header{}}
		mux.ServeHTTP(rec, r)
		switch rec.status {
		case http.StatusMethodNotAllowed:
			w.Header().Set("Allow", rec.header.Get("Allow"))
			WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed", "method "+r.Method+" not allowed here")
		default:
			WriteError(w, http.StatusNotFound, "not_found", "no such route")
		}
	})
}

// headerRecorder keeps what the ServeMux's own 404 or 405 handler sets.
type headerRecorder struct {
	header http.Header
	status int
}

func (h *headerRecorder) Header() http.Header         { return h.header }
func (h *headerRecorder) WriteHeader(code int)        { h.status = code }
func (h *headerRecorder) Write(p []byte) (int, error) { return len(p), nil }

// BodySlack is what a POST body may carry beyond the largest event: the
// request's own field names and whitespace that compaction removes.
const BodySlack = 1 << 20

// MaxBody returns the largest POST body a daemon reads for events of at
// most maxEventBytes (0: eventbus.DefaultMaxEventBytes), BodySlack more.
func MaxBody(maxEventBytes int) int64 {
	if maxEventBytes == 0 {
		maxEventBytes = eventbus.DefaultMaxEventBytes
	}
	return int64(maxEventBytes) + BodySlack
}

// NewBodyDecoder returns a JSON decoder of r's body that refuses unknown
// fields and reads at most limit bytes: reading past it fails with a
// *http.MaxBytesError, and the server then closes the connection after the
// response. The server closes the body; the caller need not.
func NewBodyDecoder(w http.ResponseWriter, r *http.Request, limit int64) *json.Decoder {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	return dec
}

// DecodePublish reads the body of POST /session/{id}/events: exactly one
// JSON object with the fields of PublishRequest (matched as encoding/json
// matches them, without regard to case) and nothing after it, at most
// limit bytes. On failure it has already answered (400 invalid_body, 413
// body_too_large or 408 request_timeout: WriteBodyError) and reports
// false. It does not close the body (the server does).
//
// It holds the body once: read into one buffer (of the Content-Length,
// when the request has one), with the event's data a slice of it, not a
// copy, so that a body of n bytes costs n bytes until the publish encodes
// it (a json.Decoder would hold up to twice n in its buffer, plus a copy
// of the data).
func DecodePublish(w http.ResponseWriter, r *http.Request, limit int64) (PublishRequest, bool) {
	var req PublishRequest
	body, err := readBody(w, r, limit)
	if err == nil {
		err = decodePublish(body, &req)
	}
	if err != nil {
		WriteBodyError(w, err)
		return PublishRequest{}, false
	}
	return req, true
}

// readBody reads r's whole body, at most limit bytes (past it a
// *http.MaxBytesError).
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	rd := http.MaxBytesReader(w, r.Body, limit)
	if n := r.ContentLength; n > 0 && n <= limit {
		// The server ends the body at Content-Length (short: an
		// unexpected EOF), so the buffer is exactly the body.
		buf := make([]byte, n)
		if _, err := io.ReadFull(rd, buf); err != nil {
			return nil, err
		}
		return buf, nil
	}
	return io.ReadAll(rd)
}

// rawSlice is a JSON value kept as the slice of the input it was decoded
// from (json.RawMessage copies it): for a body the caller owns.
type rawSlice []byte

func (s *rawSlice) UnmarshalJSON(b []byte) error {
	*s = b
	return nil
}

// decodePublish decodes body into req with DisallowUnknownFields'
// strictness: one JSON object, its keys the fields of PublishRequest
// matched without regard to case, each at most once, nothing after it.
// The data is a slice of body.
func decodePublish(body []byte, req *PublishRequest) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return errors.New("empty body")
	}
	var fields map[string]rawSlice
	if err := json.Unmarshal(body, &fields); err != nil {
		var typ *json.UnmarshalTypeError
		switch {
		case strings.Contains(err.Error(), "after top-level value"):
			return errors.New("body holds more than one JSON value")
		case errors.As(err, &typ):
			return fmt.Errorf("body is a JSON %s, not an object", typ.Value)
		}
		return err
	}
	seen := map[string]bool{}
	for k, v := range fields {
		var field string
		for _, name := range [...]string{"type", "data", "originatorClientId"} {
			if strings.EqualFold(k, name) {
				field = name
			}
		}
		if field == "" {
			return fmt.Errorf("json: unknown field %q", k)
		}
		if seen[field] {
			return fmt.Errorf("json: field %q given twice", field)
		}
		seen[field] = true
		var err error
		switch field {
		case "type":
			err = json.Unmarshal(v, &req.Type)
		case "originatorClientId":
			err = json.Unmarshal(v, &req.OriginatorClientID)
		default:
			req.Data = json.RawMessage(v)
		}
		if err != nil {
			return fmt.Errorf("json: field %q: %w", field, err)
		}
	}
	return nil
}

// WriteBodyError answers a request whose body could not be read or
// decoded with err: 413 body_too_large past a MaxBytesReader's limit, 408
// request_timeout (and Connection: close) when the body did not arrive
// within Limits.BodyTimeout, else 400 invalid_body naming err.
func WriteBodyError(w http.ResponseWriter, err error) {
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		WriteError(w, http.StatusRequestEntityTooLarge, "body_too_large",
			fmt.Sprintf("request body larger than %d bytes", mbe.Limit))
		return
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		w.Header().Set("Connection", "close")
		WriteError(w, http.StatusRequestTimeout, "request_timeout", "the request body did not arrive in time")
		return
	}
	WriteError(w, http.StatusBadRequest, "invalid_body", "malformed body: "+err.Error())
}

// PublishRequest is the body of POST /session/{id}/events.
type PublishRequest struct {
	Type               string          `json:"type"`
	Data               json.RawMessage `json:"data"`
	OriginatorClientID string          `json:"originatorClientId"`
}

// Event returns the event the request publishes. An absent "data" stays
// nil (the event has no data); "data":null is kept as null.
func (p PublishRequest) Event() eventbus.Event {
	ev := eventbus.Event{Type: p.Type, OriginatorClientID: p.OriginatorClientID}
	if p.Data != nil {
		ev.Data = p.Data
	}
	return ev
}

// SessionID returns the session id of r's route (r.PathValue("id")), or
// answers 400 invalid_session_id with eventbus.CheckSessionID's message and
// reports false: every route of a daemon that names a session refuses the
// ids the rule refuses before it does anything, as the streams' Lookup
// does (docs/SPEC.md section 7).
func SessionID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	if err := eventbus.CheckSessionID(id); err != nil {
		WriteError(w, http.StatusBadRequest, "invalid_session_id", err.Error())
		return "", false
	}
	return id, true
}

// WriteJSON writes v as a JSON response with status, uncacheable, followed
// by a newline. When v does not marshal it writes a 500
// {"error":"internal","code":"internal"} instead. The caller must not have
// written a header yet.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"internal","code":"internal"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// WriteError writes the JSON error response {"code":code,"error":msg}
// with status, as WriteJSON does.
func WriteError(w http.ResponseWriter, status int, code, msg string) {
	WriteJSON(w, status, map[string]string{"error": msg, "code": code})
}
