// Package eventbus gives a daemon one in-memory event bus per session and
// serves it as a resumable Server-Sent Events stream. It imports only the
// standard library.
//
// The contract it implements is docs/SPEC.md, ordered by topic: the model
// (section 1), ids, the ring and subscriptions (2), queues and
// backpressure (3), resume (4), the wire (5), HTTP (6), the Hub (7),
// backplanes (8) and clients (9). The doc comments state each name's
// contract (what is safe concurrently, what blocks, who closes what, the
// zero value, the errors) and point to the section that has the rules.
//
// # The model
//
// An [EventBus] is one session's bus, made by [New]. [EventBus.Publish]
// gives every event the session's next id (1, 2, 3 ...), encodes it once
// into an immutable [Frame] shared by everyone who receives it, keeps it in
// a bounded replay ring (Options.RingSize events, Options.RingMaxBytes
// bytes) and queues it for every subscriber whose type filter matches.
// Every bus has an epoch ([EventBus.Epoch], 32 hex characters): an id
// means something only within its epoch.
//
// [EventBus.Subscribe] registers a [Subscription] with a bounded queue of
// its own, capped in frames and in bytes. A subscription that resumes
// (SubscribeOptions.Resume, LastEventID, Epoch) first gets what it missed
// from the ring, then a replay_complete frame, then the live stream; when
// the ring no longer holds it, the cursor is of another epoch or the
// replay budget runs out, it gets state_resync_required saying so, so
// nothing is ever lost silently. Frames the bus makes for one subscriber
// (replay_complete, state_resync_required, slow_client_warning and the
// terminal client_evicted and stream_error) have no id: [Frame.Synthetic].
//
// Publish never blocks on a subscriber and no goroutine runs per
// subscriber. A subscriber whose queue fills past WarnThresholdRatio is
// warned, once per episode; when a cap rejects a live frame its [OverflowPolicy]
// decides: [OverflowEvict] (the default) ends it with client_evicted,
// [OverflowResync] drops its queue and tells it to refetch, and
// [OverflowCatchUp] keeps it and lets it read what it missed from the
// ring, then rejoin the live stream with no gap. [EventBus.Signal]
// publishes coalescable change signals without ids. [EventBus.Stats] and
// Options.OnDiagnostic show what happened.
//
// # Which API to use
//
// Most daemons need three things: [New] for each session's bus,
// [EventBus.Publish] to publish, and a [Handler] to serve
// "GET /session/{id}/events": it parses Last-Event-ID (both "N" and
// "<epoch>:<N>", see [ParseEventID]), subscribes, writes every ready frame
// in one flushed batch, sends heartbeats, enforces write deadlines, and
// optionally checks credentials ([Handler.Authorize], [Grant],
// [Handler.Revoke]) and cross-origin access ([CORS]). A daemon with many
// sessions keeps their buses in a [Hub] ([NewHub]): [Hub.GetOrCreate] or
// [Hub.Publish] where it publishes, [Hub.LookupSession] as the Handler's
// Lookup (an unknown session is a 404, never a new bus), a session cap,
// idle expiry and one byte budget over every ring. A page that watches
// several sessions opens one multiplexed stream instead, served by a
// [MuxHandler] ("GET /events?session=a&session=b", [Hub.LookupSession] as
// its Lookup): one connection, one goroutine, every frame naming its
// session, and one composite cursor in the id: lines that resumes each
// session exactly.
//
// In-process consumers range over [Subscription.Events]. A consumer that
// must also wait on something else uses [Subscription.Ready] and
// [Subscription.AppendReady]; one that serves many subscriptions on one
// goroutine makes them members of one [ReadyGroup]. A transport of another kind (WebSocket, say)
// is written as the Handler is, with exported API only:
// [Subscription.TakeReady] to take a batch into its own slice, then
// [Subscription.MarkWritten] once it is written, [Subscription.MarkDiscarded]
// for frames it chose not to write, or [Subscription.CloseBlocked] when
// the write failed; [Frame.SSE] or [Frame.JSON] give the shared encoding.
//
// # Several replicas
//
// A backplane shares a session between the replicas of a daemon through a
// log in a real engine (the redisbus, pgbus and natsbus modules of this
// repository are three, built on package backplane; docs/SPEC.md section
// 8). Everything that only a backplane needs is in that package, not
// here: its Encoder encodes events as Publish would, without an id, for
// the backplane to number in its log; its NewMirror makes a bus (an
// *EventBus) whose epoch and ids come from that log, fed with its Append;
// its Log answers resumes the ring cannot. The Handler, MuxHandler and
// Subscribe serve a mirror unchanged.
//
// The package examples (Example, Example_resume, Example_eviction,
// ExampleEventBus_Stats, ExampleHub, ExampleMuxHandler and
// ExampleSubscription_TakeReady) show publishing, resuming, eviction, the
// counters, a hub, the multiplexed stream and a transport of one's own;
// examples/daemon is a complete daemon.
package eventbus
