package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
)

// Backplane is what a backplane daemon serves: the methods every
// backplane module's Backplane has (redisbus, pgbus, natsbus), whose Info
// is backplane.Info. Its write side is the library's: a backplane is an
// eventbus.Publisher, Deleter and Signaler as it is.
type Backplane interface {
	eventbus.Publisher
	eventbus.Deleter
	eventbus.Signaler
	Bus(ctx context.Context, session string) (*eventbus.EventBus, error)
	Info(ctx context.Context, session string) (SessionInfo, error)
}

// SessionInfo describes a session as the engine and this replica see it.
type SessionInfo = backplane.Info

// Replica serves the routes of one replica of a backplane daemon
// (sessiond-pg; sessiond-redis and sessiond-nats have the same routes), so
// that every engine answers alike: a client cannot tell which is behind a
// daemon. Its write routes are the library's (eventbus.PublishHandler,
// DeleteHandler, SignalHandler) on the Backplane, whose own errors Errors
// maps to the table of docs/SPEC.md 6.9. Its streams are the SSE stream of
// one session, the multiplexed SSE stream (GET /events, an
// eventbus.MuxHandler sharing the SSE handler) and, with WebSocket set, the
// same multiplexed stream over a WebSocket (GET /ws). Fill it in, pass it
// to NewReplica with its SSE handler and serve Routes. It is safe for
// concurrent use once serving.
type Replica struct {
	Daemon    string // e.g. "sessiond-pg": the index page's title
	Usage     string // the index page, after the title (the -h text without "Flags:")
	Name      string // the replica's name, in the index and GET /session/{id}
	Engine    string // e.g. "PostgreSQL": in log lines and 503 messages
	Backplane Backplane
	// Errors maps the backplane's own errors on every route.
	Errors EngineErrors
	Logger *slog.Logger
	// MaxBody (MaxBody), BodyTimeout and BodyBudget bound the bodies of
	// POST /session/{id}/events as eventbus.PublishHandler's fields do (0:
	// its defaults); the server's Limits bound every route's.
	MaxBody     int64
	BodyTimeout time.Duration
	BodyBudget  int64
	// Auth, when set (-auth-token), protects the routes (Auth.Protect) and
	// the stream (Auth.Install, by NewReplica).
	Auth *Auth
	// MaxStreamSessions is the most sessions one multiplexed stream (GET
	// /events, GET /ws) serves; 0: eventbus.DefaultMaxStreamSessions.
	MaxStreamSessions int
	// WebSocket, when set, makes the handler of GET /ws from the
	// replica's MuxHandler and the StreamContext that tracks its streams
	// for /disconnect: typically
	//
	//	func(m *eventbus.MuxHandler, track StreamContext) http.Handler {
	//		return &websocket.Handler{Mux: m, StreamContext: track}
	//	}
	//
	// with github.com/ssebus/eventbus/websocket, which the daemon's own
	// module requires: this package, in the root module, imports the
	// standard library and the root only. nil: no GET /ws (a JSON 404).
	WebSocket func(m *eventbus.MuxHandler, track StreamContext) http.Handler

	events  *eventbus.Handler
	mux     *eventbus.MuxHandler // GET /events?session=..., sharing events
	ws      http.Handler         // GET /ws: WebSocket(mux); nil without WebSocket
	publish *eventbus.PublishHandler
	delete  *eventbus.DeleteHandler
	signal  *eventbus.SignalHandler

	streams Streams // open streams by session, for /disconnect
}

// StreamContext is websocket.Handler's StreamContext, for
// Replica.WebSocket: it tracks a WebSocket's stream, which outlives its
// request, for /disconnect (Streams.Context).
type StreamContext = func(*http.Request) (context.Context, func())

// NewReplica returns r ready to serve with events as its SSE handler:
// events' Lookup becomes the backplane's Bus (which checks the session's
// epoch with the engine), its errors answered as eventbus.StatusError: an
// invalid session id 400 invalid_session_id (eventbus.CheckSessionID, or
// the backplane's own rule), the engine unreachable 503 unavailable and a
// closed backplane 503 shutting_down, both with Retry-After. With r.Auth
// set, it then installs the access control on events. The multiplexed
// stream (and the WebSocket's, with r.WebSocket set) shares events: its
// settings, its Lookup and Authorize, and its registry, so that a Revoke
// ends every kind of stream. Its other fields stay as set.
func NewReplica(r *Replica, events *eventbus.Handler) *Replica {
	events.Lookup = r.lookup
	r.Auth.Install(events)
	r.events = events
	r.mux = &eventbus.MuxHandler{Handler: events, MaxStreamSessions: r.MaxStreamSessions}
	if r.WebSocket != nil {
		r.ws = r.WebSocket(r.mux, r.streams.MuxContext)
	}
	w := replicaWrites{r}
	r.publish = &eventbus.PublishHandler{Publisher: w, MaxBodyBytes: r.MaxBody, BodyTimeout: r.BodyTimeout, BodyBudget: r.BodyBudget, Logger: r.Logger}
	r.delete = &eventbus.DeleteHandler{Deleter: w, Logger: r.Logger}
	r.signal = &eventbus.SignalHandler{Signaler: w, BodyTimeout: r.BodyTimeout, Logger: r.Logger}
	return r
}

// lookup is the handlers' Lookup. On the single stream it gets or creates
// the session in the engine (Backplane.Bus), as it always has. On the
// multiplexed streams (GET /events, GET /ws: no {id} in the path) it never
// creates one, as docs/SPEC.md 6.8 asks: the engine is asked first
// whether it holds the session (Backplane.Info), and one it does not is
// 404 session_not_found; a URL of up to MaxStreamSessions ids, or a
// WebSocket's adds, would otherwise make sessions in the engine for
// anyone. The check and the open are two steps: a DELETE between them
// (on any replica) lets the open make the session again, in a new epoch
// with no events, as a stream of the single route would; the kit has no
// Engine.Open that refuses to create (yet) to close that window.
func (r *Replica) lookup(req *http.Request, id string) (*eventbus.EventBus, error) {
	if err := eventbus.CheckSessionID(id); err != nil {
		return nil, err // the handler answers 400 invalid_session_id
	}
	if req.PathValue("id") == "" {
		in, err := r.Backplane.Info(req.Context(), id)
		if err != nil {
			return nil, r.lookupErr(err)
		}
		if !in.Exists {
			return nil, fmt.Errorf("%w: %q", eventbus.ErrSessionNotFound, id) // 404 naming the session
		}
	}
	bus, err := r.Backplane.Bus(req.Context(), id)
	if err != nil {
		return nil, r.lookupErr(err)
	}
	return bus, nil
}

// lookupErr maps an error of the backplane's Bus or Info for a Lookup.
func (r *Replica) lookupErr(err error) error {
	err = r.mapErr(err)
	if errors.Is(err, eventbus.ErrClosed) {
		return eventbus.ErrorStatus(err) // 503 shutting_down
	}
	return err // another error: the client left while the session opened (500)
}

// mapErr is r.Errors.Map with the message of an unreachable engine.
func (r *Replica) mapErr(err error) error {
	return r.Errors.Map(err, r.Engine+" unavailable; retry after Retry-After")
}

// replicaWrites is a Replica's Backplane as the library's write routes
// take it (eventbus.Publisher, Deleter, Signaler), its errors mapped.
type replicaWrites struct{ r *Replica }

func (w replicaWrites) Publish(ctx context.Context, session string, e eventbus.Event) (uint64, string, error) {
	id, epoch, err := w.r.Backplane.Publish(ctx, session, e)
	return id, epoch, w.publishErr(err)
}

func (w replicaWrites) PublishIdempotent(ctx context.Context, session, key string, e eventbus.Event) (uint64, string, bool, error) {
	id, epoch, dup, err := w.r.Backplane.PublishIdempotent(ctx, session, key, e)
	return id, epoch, dup, w.publishErr(err)
}

// publishErr maps a publish's error; an unreachable engine's message says
// that nothing was appended.
func (w replicaWrites) publishErr(err error) error {
	return w.r.Errors.Map(err, "publish failed: "+w.r.Engine+" is unreachable; the event was not appended")
}

func (w replicaWrites) Delete(ctx context.Context, session string) error {
	return w.r.mapErr(w.r.Backplane.Delete(ctx, session))
}

func (w replicaWrites) Signal(ctx context.Context, session, typ, about string) error {
	return w.r.mapErr(w.r.Backplane.Signal(ctx, session, typ, about))
}

// Routes returns the daemon's routes (Mux's: with the multiplexed stream,
// and GET /ws when r.WebSocket is set) behind r.Auth.Protect (JSONErrors
// alone when r.Auth is nil: a wrong method is a JSON 405).
func (r *Replica) Routes() http.Handler {
	var rt Routes = r
	if r.ws != nil {
		rt = replicaWebSocket{r}
	}
	return r.Auth.Protect(Mux(rt)) // JSONErrors without Auth
}

// replicaWebSocket is a Replica whose routes include GET /ws
// (WebSocketRoutes): a Replica without WebSocket has no such method, so
// that Mux does not register the route.
type replicaWebSocket struct{ *Replica }

// ServeWebSocket is GET /ws?session=<id>&session=<id>...: the multiplexed
// stream over a WebSocket (docs/SPEC.md 6.10) on the replica's
// MuxHandler: the same sessions, Lookup (which never creates a session),
// Authorize, limits and cursor as GET /events. A disconnect of any of the
// sessions of its URL cuts it (clean: the connection closes; abort: a TCP
// reset); one the client adds on the open socket is not tracked for
// /disconnect.
func (r replicaWebSocket) ServeWebSocket(w http.ResponseWriter, req *http.Request) {
	r.Logger.Debug("stream opened", "sessions", MuxSessions(req), "lastEventId", req.URL.Query().Get("lastEventId"), "remote", req.RemoteAddr)
	r.ws.ServeHTTP(w, req) // tracked by the StreamContext NewReplica gave it
}

// ServeIndex writes the usage text.
func (r *Replica) ServeIndex(w http.ResponseWriter, req *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "%s replica %s\n\n", r.Daemon, r.Name)
	io.WriteString(w, strings.TrimSuffix(r.Usage, "Flags:\n"))
}

// ServeEvents runs the SSE handler (whose Lookup finds the session's
// mirror) on a request that /disconnect can cut; a CORS preflight
// (OPTIONS) is answered without being tracked.
func (r *Replica) ServeEvents(w http.ResponseWriter, req *http.Request) {
	if req.Method == http.MethodOptions {
		r.events.ServeHTTP(w, req)
		return
	}
	r.serveTracked(w, req, r.events, req.PathValue("id"))
}

// ServeMuxEvents is GET /events?session=<id>&session=<id>...: the
// sessions' mirrors on one SSE stream (eventbus.MuxHandler, sharing the
// SSE handler; it answers a list of sessions that is empty, too long or
// repeats one with 400 invalid_sessions, a session the engine does not
// hold with 404 naming it). A disconnect of any of its sessions cuts the
// whole stream, whose client then resumes every session with its cursor.
func (r *Replica) ServeMuxEvents(w http.ResponseWriter, req *http.Request) {
	if req.Method == http.MethodOptions {
		r.mux.ServeHTTP(w, req) // a CORS preflight: no session, no stream
		return
	}
	r.serveTracked(w, req, r.mux, MuxSessions(req)...)
}

// serveTracked serves req with h as a stream of the sessions ids that
// /disconnect can cut.
func (r *Replica) serveTracked(w http.ResponseWriter, req *http.Request, h http.Handler, ids ...string) {
	r.Logger.Debug("stream opened", "sessions", ids, "lastEventId", req.Header.Get("Last-Event-ID"), "remote", req.RemoteAddr)
	r.streams.Serve(w, req, h, ids...)
}

// ServePublish is eventbus.PublishHandler on the backplane: it publishes
// the body's event, idempotently with an Idempotency-Key header.
func (r *Replica) ServePublish(w http.ResponseWriter, req *http.Request) {
	r.publish.ServeHTTP(w, req)
}

// ServeSignal is eventbus.SignalHandler on the backplane: it sends the
// body's change signal to every replica.
func (r *Replica) ServeSignal(w http.ResponseWriter, req *http.Request) {
	r.signal.ServeHTTP(w, req)
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
	case err != nil:
		eventbus.WriteError(w, req, r.mapErr(err))
		return
	case !in.Exists:
		eventbus.WriteError(w, req, eventbus.ErrSessionNotFound)
		return
	}
	open := r.streams.Count(session)
	WriteJSON(w, http.StatusOK, map[string]any{
		"id": session, "replica": r.Name,
		"epoch": in.Epoch, "lastEventId": in.LastEventID, "firstEventId": in.FirstEventID, "bytes": in.Bytes,
		"local": in.Local, "localLastEventId": in.LocalLastEventID, "subscribers": in.Subscribers, "streams": open,
	})
}

// ServeDelete is eventbus.DeleteHandler on the backplane: it forgets the
// session in the engine (204, an unknown session too).
func (r *Replica) ServeDelete(w http.ResponseWriter, req *http.Request) {
	r.delete.ServeHTTP(w, req)
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
	n := r.streams.Cut(session, mode)
	WriteJSON(w, http.StatusOK, map[string]any{"disconnected": n, "mode": mode.String()})
}

// PublishDemo is a Demo's Publish; an error after the demo was stopped is
// not worth a log line.
func (r *Replica) PublishDemo(ctx context.Context, id string, ev eventbus.Event) error {
	if _, _, err := r.Backplane.Publish(ctx, id, ev); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}
