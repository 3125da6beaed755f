// Command sessiond-nats is a demo daemon for package natsbus: the session
// event routes of sessiond-redis and sessiond-pg, with every session's
// events in a NATS JetStream stream, so that several replicas serve the
// same sessions and a client may resume with Last-Event-ID on any of them.
// Its HTTP surface (routes, bodies, status codes, headers) is theirs,
// served by the same code (internal/daemon.Replica): a client cannot tell
// which engine is behind it.
//
// Usage:
//
//	go run ./cmd/sessiond-nats [-addr 127.0.0.1:8081] [-nats nats://127.0.0.1:4222] [flags]
//
// (from the natsbus module: cd natsbus first). Routes:
//
//	GET    /session/{id}/events       the SSE stream (eventbus.Handler, resumes from the stream)
//	GET    /events?session=ID&...     the sessions on one SSE stream (eventbus.MuxHandler, SPEC 6.8): its
//	                                  id line is a composite cursor; 404 for a session not in the engine
//	                                  (never created here); 1 to -max-stream-sessions ids
//	GET    /ws?session=ID&...         the same stream over a WebSocket (github.com/ssebus/eventbus/websocket,
//	                                  SPEC 6.10): the same cursor resumes either route, on any replica
//	POST   /session/{id}/events       publish {"type":..., "data":..., "originatorClientId":...} -> {"id":N,"epoch":...}
//	                                  (an Idempotency-Key header makes a retry safe: see natsbus/README.md)
//	GET    /session/{id}              the session as the stream and this replica see it (404 if it has none)
//	DELETE /session/{id}              forget the session; every replica's streams of it end -> 204
//	POST   /session/{id}/disconnect   cut this replica's open streams of the session -> {"disconnected":N,"mode":...}
//	                                  (?mode=clean ends the responses, ?mode=abort resets the connections)
//	POST   /session/{id}/signal       send {"type":..., "about":...} to the session's streams on every replica -> 204
//
// The flags of cmd/sessiond apply (epoch ids on by default, -cors-origin,
// h2c, -tls-cert/-tls-key, the header and body limits, -auth-token and
// -token-lifetime with POST /login, /logout and /revoke; a revocation ends
// the streams of this replica). On SIGINT or SIGTERM it closes the
// backplane (open streams drain, get stream_error shutdown with
// -shutdown-retry-after, and end) while the HTTP server shuts down, within
// -shutdown-timeout.
// The stream stays.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/ssebus/eventbus"
	shared "github.com/ssebus/eventbus/internal/daemon" // not "daemon": main_test.go has a func daemon
	"github.com/ssebus/eventbus/natsbus"
	"github.com/ssebus/eventbus/websocket"
)

func main() { shared.Main("sessiond-nats", run) }

// run serves a replica until ctx is done, then closes the backplane
// (streams drain) and the HTTP server; ready, when set, learns the address.
func run(ctx context.Context, args []string, logOut io.Writer, ready func(addr string)) error {
	var (
		natsURL, stream, subject string
		replicas                 int
	)
	rf, err := shared.ParseReplicaFlags("sessiond-nats", "github.com/ssebus/eventbus/natsbus", "natsbus", "NATS", args, logOut, func(fs *flag.FlagSet) {
		fs.StringVar(&natsURL, "nats", nats.DefaultURL, "NATS server URL, or a comma-separated list of a cluster's")
		fs.StringVar(&stream, "stream", natsbus.DefaultStream, "JetStream stream of the sessions (created when missing)")
		fs.StringVar(&subject, "subject", natsbus.DefaultSubject, "prefix of the backplane's subjects (<subject>.s.<session>, <subject>.sig.<session>)")
		fs.IntVar(&replicas, "replicas", 1, "replicas of the stream when this replica creates it (3 on a three-node cluster)")
	})
	if err != nil {
		return err
	}
	// natsbus's options: no publish buffered while the connection
	// reconnects, and the first reconnect after a cut at once (a request
	// meanwhile waits for it). Retrying a failed first connect lets the
	// replica start before NATS does.
	nc, err := nats.Connect(natsURL, append(natsbus.ConnectOptions(),
		nats.Name("sessiond-nats "+rf.Name), nats.RetryOnFailedConnect(true))...)
	if err != nil {
		return fmt.Errorf("-nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("-nats: %w", err)
	}
	nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	bp, err := natsbus.New(nctx, js, natsbus.Options{
		Bus:                rf.BusOptions(rf.Logger), // its RingSize is each session's MaxMsgsPerSubject too
		PublishTimeout:     rf.PublishTimeout,
		IdleTimeout:        rf.IdleTimeout,
		OutageTimeout:      rf.OutageTimeout,
		IdempotencyWindow:  rf.IdempotencyWindow,
		ShutdownRetryAfter: rf.ShutdownRetryAfter,
		Stream:             stream,
		Subject:            subject,
		Replicas:           replicas,
		Logger:             rf.Logger,
	})
	if err != nil {
		return err
	}
	return rf.Serve(ctx, shared.ReplicaServer{
		Backplane: bp,
		Errors:    shared.ReplicaErrors(natsbus.ErrOutcomeUnknown, natsbus.ErrInvalidSession, natsbus.ErrUnavailable),
		Events:    bp.Handler(), Close: func() { bp.Close() }, Ready: ready,
		WebSocket:   webSocket,
		ListenAttrs: []any{"nats", natsURL, "stream", stream},
	})
}

// webSocket is the replica's GET /ws: the multiplexed stream over a
// WebSocket (github.com/ssebus/eventbus/websocket, docs/SPEC.md 6.10) on
// the replica's MuxHandler, so with the same sessions, Lookup, Authorize,
// limits and cursor as its GET /events; track keeps its streams for
// /disconnect, as they outlive their requests.
func webSocket(m *eventbus.MuxHandler, track shared.StreamContext) http.Handler {
	return &websocket.Handler{Mux: m, StreamContext: track}
}
