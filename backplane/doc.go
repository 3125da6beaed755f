// Package backplane is the engine-independent half of a backplane: what
// lets a daemon run as several replicas behind a load balancer, each
// session's events in one shared log, so that a client resumes with
// Last-Event-ID on any replica (docs/SPEC.md section 8). The redisbus,
// pgbus and natsbus modules are built on it; so can be a backplane for
// any other engine, in a module of its own. It imports only the standard
// library and package eventbus (and internal/seam, through which package
// eventbus lends it the mirror's internals).
//
// It is also where everything lives that only a backplane does to a bus,
// out of the way of a daemon author who reads package eventbus: the
// mirror's seam (docs/SPEC.md section 8.2). NewMirror makes a mirror, an
// *eventbus.EventBus whose epoch and ids come from a shared log; Append
// feeds it, in id order; its Log (ReadHistory, Head, over LogEntry and
// HistoryRequest) answers the resumes its ring cannot; its Publish returns
// ErrMirror. Encoder encodes an event as Publish would, without an id
// (EncodedEvent), fingerprints it for idempotent publish and checks
// signals; CloseWithError ends a bus with a stream_error of a given kind.
// The Handler, MuxHandler and Subscribe of package eventbus serve a mirror
// unchanged.
//
// Per session with subscribers on this replica, a Set holds a mirror
// (NewMirror), fed by one reader goroutine. Every replica's mirror delivers the
// same ids in the same order; queues, warnings and evictions stay local.
// A resume the mirror's ring cannot answer is answered from the log. The
// Set opens a mirror once however many lookups ask at once, checks a
// reused mirror's epoch with the engine before a new stream joins it,
// answers the SSE Handler's lookups (400 invalid_session_id for an
// invalid id, 503 unavailable, 503 shutting_down), releases idle mirrors,
// ends every stream with stream_error shutdown on Close, and holds what
// every backplane's Publish, Signal and Delete do around the engine's
// call.
//
// # What an engine does
//
// A backplane module writes two types. Its session type embeds Session
// and is the mirror's Log:
//
//   - ReadHistory returns the log's entries in a range and the first id
//     the log still holds (a resume from before it gets
//     state_resync_required, ring_evicted);
//   - Head returns the log's epoch and last id (a resume ahead of the
//     mirror waits for its reader).
//
// Its Engine has four methods (each one's contract is in its doc):
//
//   - New makes a session value;
//   - Open reads, or atomically creates, the session's epoch and last id
//     (a Start, with the engine's own cursor for Run);
//   - Run is the reader: it appends the log's entries to the mirror in id
//     order (Append) until its context ends, releases the mirror when the log lost
//     its epoch (Set.Expire), and ends it when the engine is unreachable
//     past the outage bound (Set.Outage), waiting a Backoff between
//     failures;
//   - Epoch reads the session's current epoch.
//
// And its Backplane type, the module's API, does on the engine what the
// Set cannot:
//
//   - Publish assigns the next id atomically in the log (1, 2, 3 ...
//     whichever replica publishes: a compare-and-set on the last id, a
//     lock, a script), stores Event.Envelope(id), trims the session's log
//     to Bus.MaxLen events (and Bus.MaxBytes bytes where it can), and
//     returns within its timeout, with an error wrapping the module's
//     ErrOutcomeUnknown when the append may have happened all the same;
//     Set.Prepare does the checks and the encoding before, and
//     Publish.Appended after;
//   - PublishIdempotent is Publish with a key the log remembers for a
//     window, checked and appended in one atomic step: within the window,
//     the same key and fingerprint return the first id with duplicate
//     true, another fingerprint eventbus.ErrIdempotencyKeyReused;
//   - Signal sends a change signal to every replica (no id, not stored),
//     which each delivers with Set.DeliverSignal; Set.PrepareSignal
//     checks it first;
//   - Delete forgets the session in the log (its events, epoch and keys:
//     the next use starts a new epoch at id 1), then Set.Deleted;
//   - Info returns an Info;
//   - Bus, Subscribe, Handler, Sessions and Close are the Set's.
//
// The conformance suite, package backplanetest, checks all of this
// against the module's real engine from one call in its tests
// (backplanetest.Run); docs/backplane-guide.md walks through writing an
// engine, its tests and its README.
package backplane
