// Type declarations of @ssebus/eventbus-client (hand-written; the package
// has no build step).

/** The synthetic frame types the server sends; they carry no id. */
export declare const SYNTHETIC_TYPES: readonly [
  "replay_complete",
  "state_resync_required",
  "slow_client_warning",
  "client_evicted",
  "stream_error",
];

/** 16 MiB (the server's default MaxEventBytes) plus 64 KiB for the framing. */
export declare const DEFAULT_MAX_EVENT_BYTES: number;

/** A published event, as delivered once (duplicates are dropped by id). */
export interface BusEvent<T = unknown> {
  /** On a multiplexed stream (options.sessions): the session it belongs to. Absent on a single stream. */
  session?: string;
  /** The per-session id, 1, 2, 3 ... within its epoch. */
  id: number;
  /** The epoch the id belongs to; null while the client does not know it yet. */
  epoch: string | null;
  type: string;
  /** The event's data; undefined when it was published without any. */
  data: T | undefined;
  /** The envelope's "_meta" (serverTimestamp and any keys the publisher set). */
  meta: Record<string, unknown> | undefined;
  /** _meta.serverTimestamp: Unix milliseconds. */
  serverTimestamp: number | undefined;
  originatorClientId: string | undefined;
  /** True for events replayed after a reconnect, before onCaughtUp. */
  replayed: boolean;
}

/** A change notification (eventbus Signal): no id, no data, never replayed. */
export interface BusSignal {
  /** On a multiplexed stream: its session. */
  session?: string;
  type: string;
  /** The resource it is about. */
  about: string;
  meta: Record<string, unknown> | undefined;
  serverTimestamp: number | undefined;
}

/** replay_complete: everything the server could replay has been delivered. */
export interface CaughtUp {
  /** On a multiplexed stream: the session whose replay is complete (each resumed session has its own). */
  session?: string;
  replayedCount: number;
  lastReplayedEventId: number | null;
  lastEventId: number | null;
  epoch: string | null;
}

/** An inclusive range of ids that were not and will not be delivered. */
export interface IdRange {
  from: number;
  to: number;
}

/**
 * state_resync_required: events were lost (the server's ring no longer held
 * them, the daemon restarted, the subscriber overflowed under the resync
 * policy, the server could not use the cursor). The application should
 * refetch its state. A replay_budget_exceeded resync is not reported: the
 * client resumes on its own and loses nothing.
 */
export interface Resync {
  /** On a multiplexed stream: the session that lost events (the others are not concerned). */
  session?: string;
  /** "epoch_reset" | "ring_evicted" | "queue_overflow" | "queue_bytes_overflow" | "cursor_invalid" (the server could not use the cursor; live from earliestAvailableId) | a newer server's reason */
  reason: string;
  /** "epoch_mismatch" from the server, "epoch_changed" when the client saw a new epoch without an epoch_reset. */
  detail: string | undefined;
  lastDeliveredId: number;
  earliestAvailableId: number | null;
  /** The epoch the stream continues in. */
  epoch: string | null;
  /** For epoch_reset: the epoch of the cursor that is no longer valid (null when unknown). */
  previousEpoch: string | null;
  /**
   * The ids of the current epoch this client lacks and will not receive, or
   * null when none are (or, for a client-detected epoch change, when that
   * is unknown). For epoch_reset the remainder of the previous epoch is lost
   * as well, however long it was.
   */
  missing: IdRange | null;
}

/** slow_client_warning: the server's queue for this client is 75% full. */
export interface SlowWarning {
  /** On a multiplexed stream: the session whose queue is filling. */
  session?: string;
  queueSize: number;
  maxQueued: number;
  lastEventId: number;
  queuedBytes: number;
  maxQueuedBytes: number;
  threshold: "frames" | "bytes" | "frames_and_bytes";
}

/** client_evicted: the server dropped this client; it reconnects with backoff and resumes. */
export interface Eviction {
  /** On a multiplexed stream: the session whose queue overflowed (the whole stream ends; every session resumes). */
  session?: string;
  reason: "queue_overflow" | "queue_bytes_overflow" | "repeated_overflow" | string;
  /** The first id not delivered on that connection. */
  droppedAfter: number;
  queueSize: number;
  maxQueued: number;
  queuedBytes: number;
  maxQueuedBytes: number;
  eventBytes?: number;
}

export type ConnectionState = "idle" | "connecting" | "open" | "reconnecting" | "closed";

export interface StateDetail {
  /** While reconnecting: how long the client waits before the next attempt, in whole ms (0: at once). */
  delay?: number;
  /** The attempt that just ended (1 for the first). */
  attempt?: number;
  /**
   * What ended the previous connection or attempt (undefined when nothing
   * failed: a replay cut by the budget, a change of sessions); for
   * "closed", the final error.
   */
  error?: EventBusError;
  /** For "open": what the connection came on, the WebSocket (webSocketURL) or SSE (fetch or EventSource). */
  transport?: Transport;
}

/** What a connection comes on. */
export type Transport = "websocket" | "sse";

export type ErrorKind =
  | "http" // a non-200 answer; see status, code, retryAfter
  | "network" // could not connect, or the stream was cut or ended without a terminal frame
  | "idle_timeout" // nothing arrived for idleTimeout, not even a heartbeat
  | "stream_error" // the server ended the stream; see errorKind (a WebSocket's close code when no frame said)
  | "websocket" // the WebSocket failed before its first message (not the server's answer): SSE for webSocketRetry
  | "protocol" // a frame that is not an eventbus envelope (skipped)
  | "event_too_large" // an event above maxEventBytes (final)
  | "content_type" // a 200 that is not text/event-stream (final)
  | "credentials" // the credentials callback failed (final)
  | "callback" // an application callback threw (reported, the client goes on)
  | "no_sessions" // every session of a multiplexed stream is gone (final)
  | "internal";

export declare class EventBusError extends Error {
  readonly kind: ErrorKind;
  /** The HTTP status, for kind "http". */
  readonly status: number | undefined;
  /** The JSON error body's "code" (session_not_found, subscriber_limit_exceeded, ...). */
  readonly code: string | undefined;
  /** For kind "stream_error": internal | reauthenticate | revoked | unavailable | shutdown | closed (the session was deleted: final on a single stream; on a multiplexed one that session is dropped) | ... */
  readonly errorKind: string | undefined;
  /**
   * True when the error says the session is gone: a 404 session_not_found
   * (it does not exist, or the daemon restarted and nothing re-created it
   * yet; final, or retried within retryNotFound) or a stream_error closed
   * (deleted while streaming; final on a single stream).
   */
  readonly sessionGone: boolean;
  /**
   * On a multiplexed stream: the session the answer or frame is about (the
   * JSON error body's "session": the unknown one of a 404, the refused one
   * of a 403, the full one of a 429; a stream_error's session).
   */
  readonly session: string | undefined;
  /**
   * In milliseconds: Retry-After, when the answer had one; for a
   * stream_error shutdown, the frame's retryAfter (2000 when it had none).
   */
  readonly retryAfter: number | undefined;
  /**
   * The WWW-Authenticate header a 401 carries (what the credentials lacked,
   * e.g. `Bearer realm="app", error="invalid_token"`), when the answer had
   * one and, cross-origin, the server exposed it.
   */
  readonly challenge: string | undefined;
  /** True when the client stopped because of this error. */
  final: boolean;
}

/** Why the credentials callback is called. */
export type CredentialsReason =
  | "initial" // before the first connection
  | "reauthenticate" // stream_error reauthenticate: the stream's lifetime ended (e.g. token expiry)
  | "revoked" // stream_error revoked: a 401/403 after these credentials is final
  | "unauthorized" // a 401 answer (asked once; another 401/403 right after is final)
  | "forbidden"; // a 403 answer (likewise)

export interface Credentials {
  /** Request headers to send (fetch transport). */
  headers?: Record<string, string>;
  /** Sent as "Authorization: Bearer <token>". */
  token?: string;
}

/** What onSessionGone receives: a session of a multiplexed stream the server says no longer exists; the client dropped it from the URL. */
export interface SessionGone {
  session: string;
  /** "session_not_found": a 404 naming it (it does not exist, or the daemon restarted and nothing re-created it; past retryNotFound); "closed": a stream_error closed (deleted while streaming). */
  reason: "session_not_found" | "closed";
  error: EventBusError;
  /** Where the client stood in it (null: nowhere yet). */
  lastEventId: number | null;
  epoch: string | null;
}

export interface ClientOptions {
  /** A published event, once, in id order. A returned promise is awaited before the next frame is read (fetch transport only). */
  onEvent?: (event: BusEvent) => void | Promise<void>;
  /** A signal (change notification). */
  onSignal?: (signal: BusSignal) => void | Promise<void>;
  /** replay_complete after a resume. */
  onCaughtUp?: (info: CaughtUp) => void | Promise<void>;
  /** Events were lost; refetch. */
  onResync?: (info: Resync) => void | Promise<void>;
  onSlow?: (info: SlowWarning) => void | Promise<void>;
  onEvicted?: (info: Eviction) => void | Promise<void>;
  onState?: (state: ConnectionState, detail: StateDetail) => void;
  /** A session of a multiplexed stream is gone and was dropped; the others go on. */
  onSessionGone?: (info: SessionGone) => void;
  /** Every failure; error.final says whether the client stopped. */
  onError?: (error: EventBusError) => void;

  /**
   * Called before the first connection, on stream_error reauthenticate or
   * revoked, and on a 401/403 (once). Its result is kept for every
   * reconnect until the next call. A rejection stops the client. A result
   * with a token or headers needs the fetch transport; null (a cookie
   * session whose callback renewed the cookie) leaves EventSource usable.
   */
  credentials?: (request: { reason: CredentialsReason; status?: number }) =>
    | Credentials
    | null
    | undefined
    | Promise<Credentials | null | undefined>;
  /** Extra request headers (forces the fetch transport). */
  headers?: Record<string, string>;
  /** Send cookies cross-origin (fetch credentials "include", EventSource withCredentials). */
  withCredentials?: boolean;

  /**
   * Where to start (read once; where the client stands later is
   * client.lastEventId). Resume after this id: N or "<epoch>:<N>". 0
   * replays from the start of the ring. Absent: live only. With sessions:
   * 0 starts every session from the start of its ring (each with its own
   * onCaughtUp), or a composite cursor ("m1...", an id line of a
   * multiplexed stream or lastEventId of an earlier client) resumes each
   * session it names; a session it does not name starts live (so does a
   * session added later with addSession).
   */
  lastEventId?: number | string | null;
  /** The epoch lastEventId belongs to (not with sessions). */
  epoch?: string | null;
  /**
   * Several sessions on one connection (eventbus MuxHandler, e.g. the
   * daemon's "/events"): the client adds one session=<id> parameter per
   * session to the URL (replacing its own), and every callback's value
   * names its session. Each session is resumed, deduplicated and
   * epoch-checked on its own, from the composite cursor the client keeps
   * (the server's id line; sent as ?lastEventId=). A session the server
   * says is gone (a 404 naming it, a stream_error "closed" for it) is
   * dropped (onSessionGone); when none is left the client stops
   * ("no_sessions"). 1 to 256 distinct non-empty ids (the server's own
   * bound, 32 by default, answers 400).
   */
  sessions?: string[];
  /** ?maxQueued=, 16..2048. */
  maxQueued?: number;
  /** ?types=: exact types or trailing wildcards ("plugin.*"). */
  filter?: string[];
  /**
   * The event types the application handles. The EventSource transport
   * delivers only types it listens for by name; "auto" uses it only when
   * this (or an exact filter) is given.
   */
  eventTypes?: string[];

  /**
   * "auto" (default): EventSource in a browser when no headers are to be
   * sent (none in options.headers, no token or headers from credentials:
   * decided per connection) and the event types are known, else fetch.
   */
  transport?: "auto" | "fetch" | "eventsource";
  /** Backoff base in ms until the server sends retry: (which replaces it). Default 1000. */
  initialDelay?: number;
  /**
   * Backoff cap in ms (the server's retry: when that is larger); half of it
   * caps a stream_error shutdown's retryAfter. Default 30000.
   */
  maxDelay?: number;
  /** Reconnect when nothing (not even a heartbeat) arrives for this long, in ms; 0 disables. Default 45000. fetch transport, and a WebSocket that can ping (the ws package's: pings every third of it, a pong counts). */
  idleTimeout?: number;
  /**
   * How long, in ms, a 404 session_not_found is retried (with backoff, each
   * one reported to onError with final false) before it is final; counted
   * from the first 404 after the last stream that opened. Default 0: a 404
   * is final at once (on a multiplexed stream: the session it names is
   * dropped). For daemons whose sessions come back: after a restart a
   * session is unknown until something re-creates it (a publish, in the
   * README's daemon), and the client resumes it then (epoch_reset). On a
   * multiplexed stream the server refuses the whole request while one
   * session is unknown, so the others wait too: keep it short there. A
   * stream_error closed (a DELETE) is final whatever this says.
   */
  retryNotFound?: number;
  /** The most bytes one event may hold. Default DEFAULT_MAX_EVENT_BYTES. */
  maxEventBytes?: number;

  /** A fetch to use instead of globalThis.fetch. */
  fetch?: typeof fetch;
  /** An EventSource constructor to use instead of globalThis.EventSource. */
  EventSource?: new (url: string, init?: { withCredentials?: boolean }) => EventSourceLike;

  /**
   * With sessions: the WebSocket route of the same multiplexed stream (e.g.
   * "/ws", resolved against the stream's URL; http(s) becomes ws(s)). The
   * client then tries the WebSocket first, with the same sessions, cursor
   * and filters; what fails before the server's first message (no
   * connection, a refused handshake, which a WebSocket does not explain, a
   * socket cut at once) falls back to SSE at once with the same cursor, for
   * webSocketRetry, after which the SSE stream ends and the WebSocket is
   * tried again. One composite cursor serves both: no event lost, none seen
   * twice across a switch. Absent: SSE only.
   */
  webSocketURL?: string | URL;
  /** How long, in ms, the client stays on SSE after the WebSocket failed. Default 60000. */
  webSocketRetry?: number;
  /**
   * A WebSocket constructor to use instead of globalThis.WebSocket (Node 20
   * has none: the npm ws package's). The platform's own (or a subclass)
   * sends cookies and no header, so with headers or a token the client uses
   * SSE; any other is given (url, ["eventbus.v1"], {headers, maxPayload}),
   * as the ws package takes them, and one with the ws package's
   * "unexpected-response" event shows the answer to a refused handshake:
   * the server's own (its JSON error) then counts as over SSE, no fallback.
   */
  WebSocket?: new (url: string, protocols: string[], options?: { headers?: Record<string, string>; maxPayload?: number }) => WebSocketLike;
}

/** What the client needs of a WebSocket (the browser's, Node's, the npm ws package's). */
export interface WebSocketLike {
  readonly readyState: number;
  onopen: ((ev: unknown) => void) | null;
  onmessage: ((ev: { data: unknown }) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  onclose: ((ev: { code: number; reason: string }) => void) | null;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  /** The ws package's: with it (and "pong" events through on), the client pings every idleTimeout/3. */
  ping?(): void;
  /** The ws package's events the client listens to: "pong", "unexpected-response" (a refused handshake's answer), "error" (a message above maxPayload). */
  on?(event: "pong" | "unexpected-response" | "error", listener: (...args: any[]) => void): unknown;
  off?(event: "pong", listener: () => void): unknown;
  /** The ws package's: the client pauses the socket while its application is far behind, and resumes it. */
  pause?(): void;
  resume?(): void;
}

/** What the client needs of an EventSource. */
export interface EventSourceLike {
  onopen: ((ev: unknown) => void) | null;
  onerror: ((ev: unknown) => void) | null;
  addEventListener(type: string, listener: (ev: { data: string; lastEventId: string }) => void): void;
  close(): void;
}

/**
 * A resumable client of one eventbus stream. It connects as soon as it is
 * constructed (after the constructor returns) and reconnects until close()
 * or a final error: 404 (past retryNotFound), 400 and other 4xx but
 * 408/425/429, a second 401/403, a 200 that is not an event stream, an
 * event above maxEventBytes, a failing credentials callback, a stream_error
 * closed on a single stream (the session was deleted), every session of a
 * multiplexed stream gone. A final error is reported to onError (final:
 * true), given to onState("closed", {error}) and resolves done.
 */
export declare class EventBusClient {
  constructor(url: string | URL, options?: ClientOptions);
  readonly state: ConnectionState;
  /**
   * Where the client stands (the lastEventId option is only where it
   * started): the id of the last event delivered (the resume cursor), or
   * null for none. With sessions: the composite cursor of the sessions
   * streamed that have a position (what the next connection sends), "0"
   * while a start from the beginning has given none a position yet, or
   * null.
   */
  readonly lastEventId: number | string | null;
  /** The epoch of lastEventId (or of the stream), or null while unknown; null with sessions (see session()). */
  readonly epoch: string | null;
  /** With sessions: the sessions streamed (without those gone or removed); null on a single stream. */
  readonly sessions: string[] | null;
  /** With sessions: where the client stands in session id (epoch null while only its tag is known), or null when it has no position there. */
  session(id: string): { lastEventId: number; epoch: string | null } | null;
  /** With sessions: streams id too (from the client's position in it, else live): on an open WebSocket an "add" on the same socket (one the server refuses is reported and the client reconnects), else the connection ends and the next starts at once. */
  addSession(id: string): void;
  /** With sessions: stops streaming id: on an open WebSocket a "remove" on the same socket, else the connection ends and the next starts at once. Throws for the last session (close() instead). */
  removeSession(id: string): void;
  /** What the open connection came on, "websocket" or "sse"; null while none is open. */
  readonly transport: Transport | null;
  readonly stats: { connects: number; events: number; duplicates: number; resyncs: number };
  /** Resolves once the client has stopped: null after close(), else the final error. Never rejects. */
  readonly done: Promise<EventBusError | null>;
  /** Stops for good. Idempotent. */
  close(): void;
}

export declare function connect(url: string | URL, options?: ClientOptions): EventBusClient;

/** Parses "N" or "<epoch>:<N>" strictly, as the server does; null when malformed. */
export declare function parseEventId(s: string): { epoch: string | null; id: number } | null;

/** One session's entry in a composite cursor: tags of the session id and of its epoch, and the last id delivered. */
export interface CursorEntry {
  /** sessionTag(id): below 2^40. */
  session: number;
  /** epochTag(epoch): below 2^48. */
  epoch: number;
  /** At most 2^53-1. */
  id: number;
}

/** The tag of a session id in a cursor: the top 40 bits of FNV-1a-64 over its UTF-8 bytes. */
export declare function sessionTag(id: string): number;
/** The tag of an epoch in a cursor: its first 12 hex digits (else the top 48 bits of FNV-1a-64). */
export declare function epochTag(epoch: string): number;
/** Parses a composite cursor ("m1" and 24 characters per entry) strictly, as the server does; null when malformed. */
export declare function parseCursor(s: string): CursorEntry[] | null;
/** Writes a composite cursor of 1 to 256 entries; a RangeError for an entry out of range. */
export declare function formatCursor(entries: CursorEntry[]): string;

/** Retry-After (delta-seconds or HTTP date) as milliseconds, or undefined. */
export declare function parseRetryAfter(value: string | null | undefined, now?: number): number | undefined;

export type SSERecord =
  | {
      kind: "event";
      /** "message" when the stream set none. */
      type: string;
      data: string;
      /** The id field of this event's block, or null when it had none. */
      id: string | null;
      /** The standard's last event ID string at dispatch (persists across events). */
      lastEventId: string;
    }
  | { kind: "retry"; retry: number }
  | { kind: "comment"; comment: string };

/**
 * A strict, incremental text/event-stream parser (WHATWG rules: CR, LF and
 * CRLF line ends, a leading BOM, comments, retry digits only, id without
 * NUL). No line limit below maxEventBytes.
 */
export declare class SSEParser {
  constructor(options?: { maxEventBytes?: number });
  readonly lastEventId: string;
  /** Parses a chunk; returns what it completed, in order. Throws SSEParseError past maxEventBytes. */
  feed(chunk: Uint8Array | string): SSERecord[];
  /** Ends the stream: an unterminated event is discarded. The parser can then take a new stream. */
  end(): void;
}

export declare class SSEParseError extends Error {
  readonly code: "event_too_large";
}
