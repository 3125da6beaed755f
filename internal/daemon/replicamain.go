package daemon

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/ssebus/eventbus"
)

// ReplicaUsage returns the -h text of a backplane replica daemon (up to
// and including "Flags:"), which is also its index page: daemon is its
// command name, module its Go module (e.g.
// "github.com/ssebus/eventbus/pgbus"), engine what holds the events
// ("PostgreSQL"). Every replica daemon serves the same routes, so the
// text differs only by these names.
func ReplicaUsage(daemon, module, engine string) string {
	r := strings.NewReplacer("DAEMON", daemon, "MODULE", module, "ENGINE", engine)
	return r.Replace(`DAEMON: a demo replica for MODULE.
Run several against one ENGINE; a client may resume on any of them.

Routes:
  GET    /session/{id}/events       SSE stream (Last-Event-ID or ?lastEventId= resumes,
                                    Event-Epoch or ?epoch= names the epoch seen; ?maxQueued=16..2048);
                                    503 unavailable with Retry-After when ENGINE is down
  POST   /session/{id}/events       publish {"type":"...","data":...,"originatorClientId":"..."}
                                    -> {"id":N,"epoch":"..."}; 400 bad body, 413 too large,
                                    408 body slower than -body-timeout, 503 server_busy (-body-budget),
                                    503 unavailable (ENGINE down: not appended, retry after Retry-After),
                                    503 publish_outcome_unknown (ENGINE's answer was lost: no answer
                                    in time or a cut connection, named in "error"; the event may or
                                    may not be appended; retry with the same key).
                                    Idempotency-Key: <1..255 printable ASCII> makes a retry of the
                                    same event within -idempotency-window append nothing
                                    -> {"id":<first>,"epoch":"...","duplicate":true};
                                    the key with another event: 422 idempotency_key_reused
  GET    /events?session=ID&session=ID...  the sessions on one SSE stream (SPEC 6.8): 1 to
                                    -max-stream-sessions distinct ids, else 400 invalid_sessions;
                                    404 for the first session ENGINE does not hold (never created here);
                                    every frame's data names its session; the id line is a composite
                                    cursor (Last-Event-ID or ?lastEventId=) resuming every session
  GET    /ws?session=ID&session=ID...  the same stream over a WebSocket (SPEC 6.10): one text message
                                    per batch, the cursor line {"op":"cursor",...} after it; the same
                                    cursor resumes either; {"op":"add"|"remove","session":...} on the socket
  GET    /session/{id}              the session in ENGINE and on this replica; 404 if it has none
  DELETE /session/{id}              forget the session -> 204; the next use starts a new epoch
  POST   /session/{id}/disconnect   cut this replica's streams of the session -> {"disconnected":N,"mode":...}
                                    (?mode=clean: end the responses; ?mode=abort: reset the connections)
  POST   /session/{id}/signal       change signal {"type":"...","about":"..."} to the session's
                                    streams on every replica (no id, not stored) -> 204

A wrong method is a JSON 405, an unknown path a JSON 404.

`) + AuthUsage + `
Flags:
`
}

// ParseReplicaFlags parses the arguments of a backplane replica daemon
// named daemon (e.g. "sessiond-pg"): the shared flags (NewFlags), the
// ReplicaFlags, and those own defines on the flag set; module is its Go
// module, pkg the backplane package ("pgbus"), engine its engine
// ("PostgreSQL"). The usage text is ReplicaUsage's, kept in Usage; the
// logger of -v writing to out in Logger. Errors are Parse's.
func ParseReplicaFlags(daemon, module, pkg, engine string, args []string, out io.Writer, own func(fs *flag.FlagSet)) (*ReplicaFlags, error) {
	rf := &ReplicaFlags{Usage: ReplicaUsage(daemon, module, engine), daemon: daemon, engine: engine}
	fs, f := NewFlags(daemon, rf.Usage, out, FlagDocs{
		DefaultAddr:    "127.0.0.1:8081",
		Ring:           "events each session keeps in " + engine + " for resumes (0: eventbus default 8000)",
		MaxSubscribers: "concurrent streams per session on this replica (0: eventbus default 64)",
		WriteTimeout:   "deadline of one SSE write+flush, or WebSocket message (0: handler default 30s)",
		StreamSessions: "most sessions one multiplexed stream (GET /events, GET /ws) serves (1 to 256)",
	})
	fs.StringVar(&rf.Name, "name", "", "replica name for logs and GET /session/{id} (default: the listen address)")
	fs.DurationVar(&rf.PublishTimeout, "publish-timeout", 0, "bound of one publish in "+engine+" (0: "+pkg+" default 2s)")
	fs.DurationVar(&rf.IdleTimeout, "idle-timeout", 0, "release a session's mirror after this long without streams here (0: "+pkg+" default 1m)")
	fs.DurationVar(&rf.OutageTimeout, "outage-timeout", 0, "end a session's streams (stream_error unavailable) after "+engine+" is unreachable this long (0: "+pkg+" default 30s)")
	own(fs)
	if err := Parse(fs, args); err != nil {
		return nil, err
	}
	if n := f.MaxStreamSessions; n < 1 || n > eventbus.MaxCursorEntries {
		return nil, fmt.Errorf("-max-stream-sessions %d: must be 1 to %d", n, eventbus.MaxCursorEntries)
	}
	rf.Flags, rf.Logger = f, f.Logger(out)
	return rf, nil
}

// ReplicaFlags are the flags of a backplane replica daemon, as
// ParseReplicaFlags defines them: the shared Flags and its own. A zero
// duration means the backplane's default.
type ReplicaFlags struct {
	*Flags

	Name           string        // -name: the replica's name (default: the listen address)
	PublishTimeout time.Duration // -publish-timeout: bound of one publish in the engine
	IdleTimeout    time.Duration // -idle-timeout: release a session's mirror after this long without streams here
	OutageTimeout  time.Duration // -outage-timeout: end the streams after the engine is unreachable this long
	Usage          string        // the -h text (ReplicaUsage), for Replica.Usage
	Logger         *slog.Logger  // the daemon's logger (-v)

	daemon, engine string // ParseReplicaFlags's
}

// ReplicaErrors returns the EngineErrors of a backplane package whose
// sentinels are outcomeUnknown, invalidSession and unavailable; the
// idempotency errors are eventbus's, which the table answers as they are.
func ReplicaErrors(outcomeUnknown, invalidSession, unavailable error) EngineErrors {
	return EngineErrors{OutcomeUnknown: outcomeUnknown, InvalidSession: invalidSession, Unavailable: unavailable}
}

// ReplicaServer is a backplane replica daemon's engine, made after its
// flags are parsed: what ReplicaFlags.Serve serves.
type ReplicaServer struct {
	Backplane Backplane    // the package's *Backplane
	Errors    EngineErrors // ReplicaErrors of the package's sentinels
	// Events is the backplane's SSE handler (its Handler()); Serve sets
	// the logger, the flags' stream settings (Flags.Handler), the access
	// control and the replica's Lookup on it.
	Events *eventbus.Handler
	// Close closes the backplane (its mirrors: open streams drain, get
	// stream_error shutdown and end); Serve calls it exactly once,
	// whatever the outcome.
	Close func()
	// WebSocket makes the handler of GET /ws from the replica's
	// MuxHandler (Replica.WebSocket): each replica daemon sets it to a
	// websocket.Handler of github.com/ssebus/eventbus/websocket, which its
	// module requires and the root does not. nil: no GET /ws.
	WebSocket   func(*eventbus.MuxHandler, StreamContext) http.Handler
	ListenAttrs []any             // after "addr" on the listening line, before "replica"
	Ready       func(addr string) // see Server.Ready
}

// Serve listens on -addr and serves the replica of rs with the TLS,
// access control, limits, demo and shutdown the flags set, as Server.Run
// does, until ctx is done. The replica's name is -name, or the listen
// address. It returns Run's error, or a flag or listen error before
// serving (having called rs.Close).
func (rf *ReplicaFlags) Serve(ctx context.Context, rs ReplicaServer) error {
	f := rf.Flags
	fail := func(err error) error {
		rs.Close()
		return err
	}
	tlsConfig, err := f.TLSConfig()
	if err != nil {
		return fail(err)
	}
	auth, err := f.Auth(rf.daemon, tlsConfig != nil)
	if err != nil {
		return fail(err)
	}
	rs.Events.Logger = rf.Logger
	if err := f.Handler(rs.Events); err != nil {
		return fail(err)
	}
	ln, err := net.Listen("tcp", f.Addr)
	if err != nil {
		return fail(err)
	}
	r := &Replica{
		Daemon: rf.daemon, Usage: rf.Usage, Name: rf.Name, Engine: rf.engine,
		Backplane: rs.Backplane, Errors: rs.Errors, Logger: rf.Logger,
		MaxBody: MaxBody(f.MaxEventBytes), BodyTimeout: f.BodyTimeout, BodyBudget: f.BodyBudget, Auth: auth,
		MaxStreamSessions: f.MaxStreamSessions, WebSocket: rs.WebSocket,
	}
	if r.Name == "" {
		r.Name = ln.Addr().String()
	}
	NewReplica(r, rs.Events)
	d := &Server{
		Name:        r.Daemon,
		Listener:    ln,
		Handler:     r.Routes(),
		TLS:         tlsConfig,
		Logger:      r.Logger,
		ListenAttrs: append(rs.ListenAttrs, "replica", r.Name),
		Ready:       rs.Ready,
		// Closing the mirrors ends each stream after what it has queued
		// and the shutdown frame, so the HTTP server's shutdown beside it
		// waits only for a client that does not read.
		Close:           func(context.Context) { rs.Close() },
		ShutdownTimeout: f.ShutdownTimeout,
		Limits:          f.Limits(),
		Debug:           f.Debug,
		// No bound on the rings together: each session mirrored here
		// keeps its own; the budget counts one full ring.
		Memory: f.MemoryBudget(eventbus.DefaultRingMaxBytes),
	}
	if f.Demo {
		d.Demo = &Demo{Interval: f.DemoInterval, Replica: r.Name, Publish: r.PublishDemo, Logger: r.Logger}
	}
	return d.Run(ctx)
}
