package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
)

// Backplane is what a backplane daemon serves: the methods every
// backplane module's Backplane has (redisbus, pgbus, natsbus), whose Info
// is backplane.Info.
type Backplane interface {
	Bus(ctx context.Context, session string) (*eventbus.EventBus, error)
	Publish(ctx context.Context, session string, e eventbus.Event) (id uint64, epoch string, err error)
	PublishIdempotent(ctx context.Context, session, key string, e eventbus.Event) (id uint64, epoch string, duplicate bool, err error)
	Signal(ctx context.Context, session, typ, about string) error
	Delete(ctx context.Context, session string) error
	Info(ctx context.Context, session string) (SessionInfo, error)
}

// SessionInfo describes a session as the engine and this replica see it.
type SessionInfo = backplane.Info

// Replica serves the routes of one replica of a backplane daemon
// (sessiond-pg; sessiond-redis has the same routes), so that every engine
// answers alike: a client cannot tell which is behind a daemon. Fill it in,
// pass it to NewReplica with its SSE handler and serve Routes. It is safe
// for concurrent use once serving.
type Replica struct {
	Daemon    string // e.g. "sessiond-pg": the index page's title
	Usage     string // the index page, after the title (the -h text without "Flags:")
	Name      string // the replica's name, in the index and GET /session/{id}
	Engine    string // e.g. "PostgreSQL": in log lines and 503 messages
	Backplane Backplane
	// Errors maps publish errors; its InvalidSession and Unavailable also
	// serve the other routes.
	Errors  PublishErrors
	Logger  *slog.Logger
	MaxBody int64 // the largest POST body (MaxBody)
	// Auth, when set (-auth-token), protects the routes (Auth.Protect) and
	// the stream (Auth.Install, by NewReplica).
	Auth *Auth

	events *eventbus.Handler

	mu      sync.Mutex
	streams map[string]map[*Stream]struct{} // open streams by session, for /disconnect
}

// NewReplica returns r ready to serve with events as its SSE handler:
// events' Lookup becomes the backplane's Bus (which checks the session's
// epoch with the engine), its errors answered as eventbus.StatusError: an
// invalid session id 400 invalid_session_id (eventbus.CheckSessionID, or
// the backplane's own rule), the engine unreachable 503 unavailable and a
// closed backplane 503 shutting_down, both with Retry-After. With r.Auth
// set, it then installs the access control on events. Its other fields
// stay as set.
func NewReplica(r *Replica, events *eventbus.Handler) *Replica {
	events.Lookup = r.lookup
	r.Auth.Install(events)
	r.events = events
	r.streams = map[string]map[*Stream]struct{}{}
	return r
}

func (r *Replica) lookup(req *http.Request, id string) (*eventbus.EventBus, error) {
	if err := eventbus.CheckSessionID(id); err != nil {
		return nil, err // the handler answers 400 invalid_session_id
	}
	bus, err := r.Backplane.Bus(req.Context(), id)
	switch {
	case errors.Is(err, eventbus.ErrInvalidSessionID):
		return nil, err
	case r.isInvalidSession(err):
		// A rule of the backplane's own, stricter than the shared one.
		return nil, fmt.Errorf("%w: %w", eventbus.ErrInvalidSessionID, err)
	case r.isUnavailable(err):
		return nil, &eventbus.StatusError{Status: http.StatusServiceUnavailable, Code: "unavailable",
			Message: r.Engine + " unavailable; retry after Retry-After", RetryAfter: time.Second, Err: err}
	case errors.Is(err, eventbus.ErrClosed):
		return nil, &eventbus.StatusError{Status: http.StatusServiceUnavailable, Code: "shutting_down",
			Message: "the daemon is shutting down", RetryAfter: time.Second, Err: err}
	}
	return bus, err // another error: the client left while the session opened (500)
}

// Routes returns the daemon's routes: Mux's and POST /session/{id}/signal,
// behind r.Auth.Protect (JSONErrors alone when r.Auth is nil: a wrong
// method is a JSON 405).
func (r *Replica) Routes() http.Handler {
	mux := Mux(r)
	mux.HandleFunc("POST /session/{id}/signal", r.ServeSignal)
	return r.Auth.Protect(mux) // JSONErrors without Auth
}

// ServeIndex writes the usage text.
func (r *Replica) ServeIndex(w http.ResponseWriter, req *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "%s replica %s\n\n", r.Daemon, r.Name)
	io.WriteString(w, strings.TrimSuffix(r.Usage, "Flags:\n"))
}

func (r *Replica) isInvalidSession(err error) bool {
	return r.Errors.InvalidSession != nil && errors.Is(err, r.Errors.InvalidSession)
}

func (r *Replica) isUnavailable(err error) bool {
	return r.Errors.Unavailable != nil && errors.Is(err, r.Errors.Unavailable)
}

// ServeEvents runs the SSE handler (whose Lookup finds the session's
// mirror) on a request that /disconnect can cut; a CORS preflight
// (OPTIONS) is answered without being tracked.
func (r *Replica) ServeEvents(w http.ResponseWriter, req *http.Request) {
	if req.Method == http.MethodOptions {
		r.events.ServeHTTP(w, req)
		return
	}
	id := req.PathValue("id")
	st, req := Track(req)
	defer st.Done()
	r.mu.Lock()
	if r.streams[id] == nil {
		r.streams[id] = map[*Stream]struct{}{}
	}
	r.streams[id][st] = struct{}{}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.streams[id], st)
		if len(r.streams[id]) == 0 {
			delete(r.streams, id)
		}
		r.mu.Unlock()
	}()
	r.Logger.Debug("stream opened", "session", id, "lastEventId", req.Header.Get("Last-Event-ID"), "remote", req.RemoteAddr)
	r.events.ServeHTTP(w, req)
}

// ServePublish publishes the body's event, idempotently with an
// Idempotency-Key header; an invalid session id is 400 invalid_session_id
// before the body is read.
func (r *Replica) ServePublish(w http.ResponseWriter, req *http.Request) {
	session, ok := SessionID(w, req)
	if !ok {
		return
	}
	key, keyed := IdempotencyKey(req)
	body, ok := DecodePublish(w, req, r.MaxBody)
	if !ok {
		return
	}
	var (
		id    uint64
		epoch string
		dup   bool
		err   error
	)
	if keyed {
		id, epoch, dup, err = r.Backplane.PublishIdempotent(req.Context(), session, key, body.Event())
	} else {
		id, epoch, err = r.Backplane.Publish(req.Context(), session, body.Event())
	}
	if err == nil {
		WritePublished(w, id, epoch, dup)
		return
	}
	if r.isUnavailable(err) {
		r.Logger.Warn("publish failed", "session", session, "keyed", keyed, "err", err)
	}
	if !r.Errors.Write(w, err) {
		WriteError(w, http.StatusInternalServerError, "internal", err.Error())
	}
}

// ServeSignal sends the body's change signal to every replica; an invalid
// session id is 400 invalid_session_id.
func (r *Replica) ServeSignal(w http.ResponseWriter, req *http.Request) {
	session, ok := SessionID(w, req)
	if !ok {
		return
	}
	var body struct {
		Type  string `json:"type"`
		About string `json:"about"`
	}
	if err := NewBodyDecoder(w, req, 1<<20).Decode(&body); err != nil {
		WriteBodyError(w, err)
		return
	}
	err := r.Backplane.Signal(req.Context(), session, body.Type, body.About)
	switch {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
	case errors.Is(err, eventbus.ErrInvalidSessionID), r.isInvalidSession(err):
		WriteError(w, http.StatusBadRequest, "invalid_session_id", err.Error())
	case errors.Is(err, eventbus.ErrEventTooLarge):
		WriteError(w, http.StatusRequestEntityTooLarge, "event_too_large", err.Error())
	case errors.Is(err, eventbus.ErrInvalidEvent):
		WriteError(w, http.StatusBadRequest, "invalid_event", err.Error())
	default:
		WriteUnavailable(w, "unavailable", err.Error())
	}
}

// ServeStatus describes the session as the engine and this replica see
// it; 404 when the engine has none, 400 invalid_session_id for an invalid
// id.
func (r *Replica) ServeStatus(w http.ResponseWriter, req *http.Request) {
	session, ok := SessionID(w, req)
	if !ok {
		return
	}
	in, err := r.Backplane.Info(req.Context(), session)
	switch {
	case errors.Is(err, eventbus.ErrInvalidSessionID), r.isInvalidSession(err):
		WriteError(w, http.StatusBadRequest, "invalid_session_id", err.Error())
		return
	case err != nil:
		WriteUnavailable(w, "unavailable", err.Error())
		return
	case !in.Exists:
		WriteError(w, http.StatusNotFound, "session_not_found", "session not found")
		return
	}
	r.mu.Lock()
	open := len(r.streams[session])
	r.mu.Unlock()
	WriteJSON(w, http.StatusOK, map[string]any{
		"id": session, "replica": r.Name,
		"epoch": in.Epoch, "lastEventId": in.LastEventID, "firstEventId": in.FirstEventID, "bytes": in.Bytes,
		"local": in.Local, "localLastEventId": in.LocalLastEventID, "subscribers": in.Subscribers, "streams": open,
	})
}

// ServeDelete forgets the session in the engine (204, an unknown session
// too); an invalid id is 400 invalid_session_id.
func (r *Replica) ServeDelete(w http.ResponseWriter, req *http.Request) {
	session, ok := SessionID(w, req)
	if !ok {
		return
	}
	switch err := r.Backplane.Delete(req.Context(), session); {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
	case errors.Is(err, eventbus.ErrInvalidSessionID), r.isInvalidSession(err):
		WriteError(w, http.StatusBadRequest, "invalid_session_id", err.Error())
	default:
		WriteUnavailable(w, "unavailable", err.Error())
	}
}

// ServeDisconnect cuts this replica's open streams of the session as
// ?mode= says (clean, the default, or abort) and answers
// {"disconnected":N,"mode":...}; an invalid session id is 400
// invalid_session_id.
func (r *Replica) ServeDisconnect(w http.ResponseWriter, req *http.Request) {
	session, ok := SessionID(w, req)
	if !ok {
		return
	}
	mode, err := ParseCutMode(req)
	if err != nil {
		WriteError(w, http.StatusBadRequest, "invalid_mode", err.Error())
		return
	}
	r.mu.Lock()
	var cuts []*Stream
	for st := range r.streams[session] {
		cuts = append(cuts, st)
	}
	r.mu.Unlock()
	for _, st := range cuts {
		st.Cut(mode)
	}
	WriteJSON(w, http.StatusOK, map[string]any{"disconnected": len(cuts), "mode": mode.String()})
}

// PublishDemo is a Demo's Publish; an error after the demo was stopped is
// not worth a log line.
func (r *Replica) PublishDemo(ctx context.Context, id string, ev eventbus.Event) error {
	if _, _, err := r.Backplane.Publish(ctx, id, ev); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}
