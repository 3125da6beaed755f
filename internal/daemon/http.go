package daemon

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"time"

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
	ServeSignal(w http.ResponseWriter, r *http.Request)     // POST /session/{id}/signal
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

// WebSocketRoutes is what a daemon that serves the multiplexed stream over
// a WebSocket too (github.com/ssebus/eventbus/websocket, which this
// package does not import: the root module keeps the standard library
// only) adds to MuxRoutes.
type WebSocketRoutes interface {
	// ServeWebSocket is GET /ws?session=<id>&session=<id>...: the
	// multiplexed stream over a WebSocket (docs/SPEC.md 6.10).
	ServeWebSocket(w http.ResponseWriter, r *http.Request)
}

// WebSocketPattern is the route of the WebSocket (WebSocketRoutes).
const WebSocketPattern = "GET /ws"

// Mux returns a new ServeMux (Go 1.22 patterns) that serves the routes
// with rt; a daemon may add routes of its own to it before it serves, then
// serves it through JSONErrors. OPTIONS of the stream goes to ServeEvents
// too (the eventbus handler answers CORS preflights, or 405). When rt is
// also MuxRoutes, GET and OPTIONS /events go to its ServeMuxEvents; when
// it is WebSocketRoutes, GET /ws to its ServeWebSocket.
func Mux(rt Routes) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", rt.ServeIndex)
	mux.HandleFunc("GET /session/{id}/events", rt.ServeEvents)
	mux.HandleFunc("OPTIONS /session/{id}/events", rt.ServeEvents)
	mux.HandleFunc("POST /session/{id}/events", rt.ServePublish)
	mux.HandleFunc("GET /session/{id}", rt.ServeStatus)
	mux.HandleFunc("DELETE /session/{id}", rt.ServeDelete)
	mux.HandleFunc("POST /session/{id}/disconnect", rt.ServeDisconnect)
	mux.HandleFunc("POST /session/{id}/signal", rt.ServeSignal)
	if m, ok := rt.(MuxRoutes); ok {
		mux.HandleFunc(MuxPattern, m.ServeMuxEvents)
		mux.HandleFunc(muxPreflight, m.ServeMuxEvents)
	}
	if ws, ok := rt.(WebSocketRoutes); ok {
		mux.HandleFunc(WebSocketPattern, ws.ServeWebSocket)
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

// BodySlack is what a POST body may carry beyond the largest event
// (eventbus.PublishBodySlack).
const BodySlack = eventbus.PublishBodySlack

// MaxBody returns the largest POST body a daemon reads for events of at
// most maxEventBytes (0: eventbus.DefaultMaxEventBytes), BodySlack more:
// eventbus.PublishHandler's default for a Hub of such events.
func MaxBody(maxEventBytes int) int64 {
	if maxEventBytes == 0 {
		maxEventBytes = eventbus.DefaultMaxEventBytes
	}
	return int64(maxEventBytes) + BodySlack
}

// NewBodyDecoder returns a JSON decoder of r's body that refuses unknown
// fields and reads at most limit bytes: reading past it fails with a
// *http.MaxBytesError, and the server then closes the connection after the
// response. The server closes the body; the caller need not. For the
// small bodies of the daemon's own routes (POST /login, /revoke); the
// event routes are the library's (eventbus.PublishHandler,
// SignalHandler).
func NewBodyDecoder(w http.ResponseWriter, r *http.Request, limit int64) *json.Decoder {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	dec.DisallowUnknownFields()
	return dec
}

// WriteBodyError answers a request whose body could not be read or
// decoded with err, by the table of docs/SPEC.md 6.9 (eventbus.WriteError):
// 413 body_too_large past a MaxBytesReader's limit, 408 request_timeout
// (and Connection: close) when the body did not arrive within
// Limits.BodyTimeout, else 400 invalid_body naming err.
func WriteBodyError(w http.ResponseWriter, r *http.Request, err error) {
	var mbe *http.MaxBytesError
	if !errors.As(err, &mbe) && !errors.Is(err, os.ErrDeadlineExceeded) {
		err = &eventbus.StatusError{Status: http.StatusBadRequest, Code: "invalid_body", Message: "malformed body: " + err.Error(), Err: err}
	}
	eventbus.WriteError(w, r, err)
}

// SessionID returns the session id of r's route (r.PathValue("id")), or
// answers 400 invalid_session_id with eventbus.CheckSessionID's message and
// reports false: every route of a daemon that names a session refuses the
// ids the rule refuses before it does anything, as the streams' Lookup
// and the library's write routes do (docs/SPEC.md section 7).
func SessionID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("id")
	if err := eventbus.CheckSessionID(id); err != nil {
		eventbus.WriteError(w, r, err)
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

// WriteError writes the JSON error response {"error":msg,"code":code}
// with status, uncacheable, as eventbus.WriteError writes every error
// (one body for every route of the daemons, the library's included).
func WriteError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Cache-Control", "no-store")
	(&eventbus.StatusError{Status: status, Code: code, Message: msg}).ServeHTTP(w, nil)
}

// WriteUnavailable writes a 503 with Retry-After: 1 and the JSON error
// body {"error":msg,"code":code}.
func WriteUnavailable(w http.ResponseWriter, code, msg string) {
	w.Header().Set("Cache-Control", "no-store")
	(&eventbus.StatusError{Status: http.StatusServiceUnavailable, Code: code, Message: msg, RetryAfter: time.Second}).ServeHTTP(w, nil)
}
