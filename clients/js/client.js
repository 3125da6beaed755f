// EventBusClient: a resumable client of an eventbus SSE stream (the Go
// library github.com/ssebus/eventbus and its demo daemons). See README.md
// for the rules it follows and index.d.ts for the API.

import { entryOf, epochTag, formatCursor, parseCursor, sessionTag } from "./cursor.js";
import { DEFAULT_MAX_EVENT_BYTES, SSEParseError, SSEParser } from "./parser.js";

/** The frames the server synthesises; they carry no id. */
export const SYNTHETIC_TYPES = Object.freeze([
  "replay_complete",
  "state_resync_required",
  "slow_client_warning",
  "client_evicted",
  "stream_error",
]);

const MAX_ID = Number.MAX_SAFE_INTEGER; // 2^53-1, the server's MaxEventID
const EPOCH = /^[0-9a-f]{32}$/;
const DIGITS = /^[0-9]+$/;
// A connection that stayed open this long, or that delivered something
// before a plain cut, resets the backoff.
const STABLE_MS = 10_000;
// An immediate reconnect (re-authentication, a replay cut by the server's
// budget) after a connection shorter than this, right after another
// immediate one, waits for the backoff instead: a server that keeps asking
// must not get a tight loop.
const QUICK_MS = 1_000;
const MAX_ERROR_BODY = 64 * 1024;
// A shutdown's retryAfter when its frame has none (the server's default).
const SHUTDOWN_RETRY_AFTER_MS = 2_000;
// The most sessions one multiplexed stream holds (eventbus.MaxCursorEntries).
const MAX_SESSIONS = 256;
// How long the client stays on SSE after the WebSocket failed (SPEC 9, Go
// sseclient.DefaultWebSocketRetry).
const WEBSOCKET_RETRY_MS = 60_000;
// The subprotocol offered on the WebSocket (SPEC 6.10).
const WEBSOCKET_PROTOCOL = "eventbus.v1";
// A frame line of the WebSocket starts with the multiplexed envelope's
// first member; any other line is a control line.
const FRAME_PREFIX = '{"session":';
// A WebSocket message is one batch: at most 256 KiB of envelopes and the
// frame that reaches the bound. Longer than maxEventBytes and this is no
// server of ours.
const MAX_BATCH_SLACK = 512 * 1024;
// The stream_error kind a WebSocket close code stands for (SPEC 6.10),
// when the frames before it did not say.
const CLOSE_KINDS = new Map([
  [1001, "shutdown"],
  [4401, "reauthenticate"],
  [4403, "revoked"],
  [1011, "internal"],
]);
const CLOSE_EVICTED = 4429;

/** What an EventBusClient reports through onError and resolves done with. */
export class EventBusError extends Error {
  constructor(kind, message, fields = {}) {
    super(message, fields.cause === undefined ? undefined : { cause: fields.cause });
    this.name = "EventBusError";
    this.kind = kind;
    this.status = fields.status;
    this.code = fields.code;
    this.errorKind = fields.errorKind;
    this.retryAfter = fields.retryAfter;
    this.challenge = fields.challenge;
    this.session = fields.session;
    this.final = false;
  }

  /**
   * True when the error says the session is gone: a 404
   * session_not_found (it does not exist, or the daemon restarted and
   * nothing re-created it yet) or a stream_error closed (it was deleted
   * while streaming).
   */
  get sessionGone() {
    return (this.kind === "http" && this.status === 404 && this.code === "session_not_found") ||
      (this.kind === "stream_error" && this.errorKind === "closed");
  }
}

/**
 * Parses a cursor as the server accepts it: "N" or "<epoch>:<N>" (epoch 32
 * lowercase hex, N ASCII digits up to 2^53-1). Returns {epoch, id} (epoch
 * null for the plain form) or null when s is malformed.
 * @param {string} s
 */
export function parseEventId(s) {
  if (typeof s !== "string") return null;
  let epoch = null;
  let n = s;
  const colon = s.indexOf(":");
  if (colon >= 0) {
    epoch = s.slice(0, colon);
    n = s.slice(colon + 1);
    if (!EPOCH.test(epoch)) return null;
  }
  if (!DIGITS.test(n)) return null;
  const id = Number(n);
  if (id > MAX_ID) return null;
  return { epoch, id };
}

/** Retry-After as milliseconds (delta-seconds or an HTTP date), or undefined. */
export function parseRetryAfter(v, now = Date.now()) {
  if (v == null) return undefined;
  v = v.trim();
  if (DIGITS.test(v)) return Number(v) * 1000;
  const t = Date.parse(v);
  if (Number.isNaN(t)) return undefined;
  return Math.max(0, t - now);
}

// A position is where the client stands in one sequence of events: the
// single stream, or one session of a multiplexed stream. epoch is the
// epoch of cursor (or of the stream when there is no cursor), null while
// unknown; cursor the last event id delivered, null: none (live only); on a
// multiplexed stream tag is the epoch's tag in the composite cursor (known
// with cursor even while the epoch itself is not). The rest is per
// connection.
function newPosition(session) {
  return {
    session,
    sessionTag: session === null ? null : sessionTag(session),
    epoch: null,
    cursor: null,
    tag: null,
    idForm: "plain", // single stream: the id form the server last used
    streamEpoch: null, // the epoch the stream's headers (or id lines) showed
    replaying: false,
    budgetCut: false,
  };
}

function setEpoch(p, e) {
  p.epoch = e;
  if (e !== null && p.session !== null) p.tag = epochTag(e);
}

// isEpoch reports whether e is p's epoch; on a multiplexed stream, the
// epoch of its tag when only that is known.
function isEpoch(p, e) {
  if (p.epoch !== null || p.session === null) return e === p.epoch;
  return p.cursor !== null && epochTag(e) === p.tag;
}

function unknownEpoch(p) {
  return p.epoch === null && !(p.session !== null && p.cursor !== null);
}

function validSession(id) {
  return typeof id === "string" && id !== "";
}

function positive(name, v, def) {
  if (v === undefined) return def;
  if (typeof v !== "number" || !(v > 0) || !Number.isFinite(v)) {
    throw new RangeError("eventbus: " + name + " must be a positive number of milliseconds, got " + v);
  }
  return v;
}

// isFromStart reports whether a lastEventId option is 0: from the start of
// the ring (of every session's, with sessions).
function isFromStart(v) {
  return v === 0 || (typeof v === "string" && /^0+$/.test(v));
}

export class EventBusClient {
  #opts;
  #base; // the stream URL, without the cursor parameters
  #fetch;
  #maxEventBytes;
  #initialDelay;
  #maxDelay;
  #idleTimeout;
  #wsBase = null; // the WebSocket route (options.webSocketURL), or null: SSE only
  #webSocketRetry = WEBSOCKET_RETRY_MS;
  #sseUntil = 0; // after a WebSocket failure: SSE until then
  #ws = null; // the open WebSocket: {conn, send, adding (the adds not answered yet)}
  #transport = null; // of the open connection: "websocket" | "sse"

  #single = newPosition(null); // the single stream's position
  #mux = null; // a multiplexed stream's: {all: Map(session -> position), order: the sessions streamed}
  #restart = false; // the sessions changed: the connection ends and the next starts at once
  #serverRetry = null;
  #failures = 0;
  #lastImmediate = false;
  #authFinal = false; // fresh credentials were just fetched: a 401/403 now is final
  #retryNotFound = 0; // ms a 404 session_not_found is retried
  #notFoundSince = null; // the first 404 session_not_found since the last open stream
  #credentials = null; // the last credentials result
  #state = "idle";
  #closed = false;
  #abort = null; // ends the current connection
  #timer = null;
  #wake = null;
  #stats = { connects: 0, events: 0, duplicates: 0, resyncs: 0 };
  #resolveDone;

  /**
   * @param {string | URL} url the stream, e.g. "/session/demo/events"
   * @param {object} [options] see index.d.ts
   */
  constructor(url, options = {}) {
    const o = { ...options };
    this.#opts = o;
    const where = globalThis.location?.href;
    this.#base = new URL(String(url), where);
    for (const k of ["lastEventId", "epoch"]) this.#base.searchParams.delete(k);
    if (o.sessions !== undefined) this.#initMux(o);
    if (o.maxQueued !== undefined) {
      if (!Number.isInteger(o.maxQueued) || o.maxQueued < 16 || o.maxQueued > 2048) {
        throw new RangeError("eventbus: maxQueued must be an integer in [16, 2048], got " + o.maxQueued);
      }
      this.#base.searchParams.set("maxQueued", String(o.maxQueued));
    }
    if (o.filter !== undefined) {
      if (!Array.isArray(o.filter) || o.filter.some((t) => typeof t !== "string" || t === "" || t.includes(","))) {
        throw new TypeError("eventbus: filter must be an array of non-empty types without commas");
      }
      if (o.filter.length > 0) this.#base.searchParams.set("types", o.filter.join(","));
    }
    this.#fetch = o.fetch ?? globalThis.fetch?.bind(globalThis);
    this.#maxEventBytes = o.maxEventBytes ?? DEFAULT_MAX_EVENT_BYTES;
    if (!Number.isSafeInteger(this.#maxEventBytes) || this.#maxEventBytes < 1) {
      throw new RangeError("eventbus: maxEventBytes must be a positive integer, got " + o.maxEventBytes);
    }
    this.#initialDelay = positive("initialDelay", o.initialDelay, 1000);
    this.#maxDelay = positive("maxDelay", o.maxDelay, 30_000);
    if (o.idleTimeout === 0) this.#idleTimeout = 0;
    else this.#idleTimeout = positive("idleTimeout", o.idleTimeout, 45_000);
    if (o.retryNotFound !== undefined && o.retryNotFound !== 0) this.#retryNotFound = positive("retryNotFound", o.retryNotFound, 0);
    if (o.webSocketURL !== undefined && o.webSocketURL !== null) {
      if (!this.#mux) throw new TypeError("eventbus: webSocketURL needs sessions: the WebSocket serves the multiplexed stream");
      this.#wsBase = new URL(String(o.webSocketURL), this.#base);
      if (this.#wsBase.protocol === "http:") this.#wsBase.protocol = "ws:";
      else if (this.#wsBase.protocol === "https:") this.#wsBase.protocol = "wss:";
      if (!["ws:", "wss:"].includes(this.#wsBase.protocol)) throw new TypeError("eventbus: webSocketURL must be ws, wss, http or https");
      for (const k of ["session", "lastEventId"]) this.#wsBase.searchParams.delete(k);
      this.#webSocketRetry = positive("webSocketRetry", o.webSocketRetry, WEBSOCKET_RETRY_MS);
    }
    if (o.WebSocket !== undefined && typeof o.WebSocket !== "function") throw new TypeError("eventbus: WebSocket must be a constructor");
    if (!this.#mux && o.lastEventId !== undefined && o.lastEventId !== null) {
      const c = typeof o.lastEventId === "number" ? parseEventId(String(o.lastEventId)) : parseEventId(o.lastEventId);
      if (!c) throw new RangeError("eventbus: lastEventId must be N or <epoch>:<N>, got " + o.lastEventId);
      this.#single.cursor = c.id;
      if (c.epoch) {
        this.#single.epoch = c.epoch;
        this.#single.idForm = "epoch";
      }
    }
    if (o.epoch !== undefined && o.epoch !== null) {
      if (this.#mux) throw new RangeError("eventbus: epoch with sessions: a multiplexed stream resumes from lastEventId, its composite cursor");
      if (!EPOCH.test(o.epoch)) throw new RangeError("eventbus: epoch must be 32 lowercase hex digits");
      if (this.#single.epoch && this.#single.epoch !== o.epoch) throw new RangeError("eventbus: epoch and the epoch in lastEventId differ");
      this.#single.epoch = o.epoch;
    }
    const t = o.transport ?? "auto";
    if (!["auto", "fetch", "eventsource"].includes(t)) throw new RangeError("eventbus: transport must be auto, fetch or eventsource");
    if (t === "eventsource" && !(o.EventSource ?? globalThis.EventSource)) throw new TypeError("eventbus: no EventSource here");
    if (!this.#fetch && t !== "eventsource") throw new TypeError("eventbus: no fetch here; pass options.fetch");
    if (o.credentials !== undefined && typeof o.credentials !== "function") throw new TypeError("eventbus: credentials must be a function");
    this.done = new Promise((resolve) => {
      this.#resolveDone = resolve;
    });
    // Started after the constructor returns, so callbacks may use the client.
    queueMicrotask(() => this.#run());
  }

  /** "idle" | "connecting" | "open" | "reconnecting" | "closed" */
  get state() {
    return this.#state;
  }
  /** What the open connection came on: "websocket" or "sse"; null while none is open. */
  get transport() {
    return this.#state === "open" ? this.#transport : null;
  }
  /**
   * The id of the last event delivered (the resume cursor), or null. On a
   * multiplexed stream: the composite cursor of the sessions streamed (what
   * the next connection resumes from), "0" while a start from the
   * beginning (lastEventId: 0) has given no session a position yet, or
   * null while no session has a position.
   */
  get lastEventId() {
    if (this.#mux) return this.#compositeCursor();
    return this.#single.cursor;
  }
  /** The epoch lastEventId belongs to (or of the stream), or null while unknown; null on a multiplexed stream (see session()). */
  get epoch() {
    return this.#mux ? null : this.#single.epoch;
  }
  /** The sessions of a multiplexed stream the client streams (those the server said are gone removed), or null on a single stream. */
  get sessions() {
    return this.#mux ? this.#mux.order.map((p) => p.session) : null;
  }
  /**
   * Where the client stands in session id of a multiplexed stream:
   * {lastEventId, epoch} (epoch null while only its tag is known), or null
   * when it has no position there (it started live and nothing arrived yet).
   * @param {string} id
   */
  session(id) {
    const p = this.#mux?.all.get(id);
    if (!p || p.cursor === null) return null;
    return { lastEventId: p.cursor, epoch: p.epoch };
  }
  /**
   * Adds session id to a multiplexed stream (from the client's position in
   * it when it has one, else live): on an open WebSocket in place (an
   * "add"), else the connection ends and the next, at once, streams it too.
   * A session streamed already is left as it is.
   * @param {string} id
   */
  addSession(id) {
    if (!this.#mux) throw new TypeError("eventbus: addSession needs a client made with sessions");
    if (!validSession(id)) throw new TypeError("eventbus: a session is a non-empty string");
    if (this.#mux.order.some((p) => p.session === id)) return;
    if (this.#mux.order.length >= MAX_SESSIONS) throw new RangeError("eventbus: at most 256 sessions on one stream");
    let p = this.#mux.all.get(id);
    if (!p) {
      p = newPosition(id);
      this.#mux.all.set(id, p);
    }
    this.#mux.order.push(p);
    if (!this.#wsAdd(p)) this.#reconnectNow();
  }
  /**
   * Removes session id from a multiplexed stream: on an open WebSocket in
   * place (a "remove"), else the connection ends and the next, at once,
   * streams the others. The last session cannot be removed (close the
   * client instead).
   * @param {string} id
   */
  removeSession(id) {
    if (!this.#mux) throw new TypeError("eventbus: removeSession needs a client made with sessions");
    const i = this.#mux.order.findIndex((p) => p.session === id);
    if (i < 0) return;
    if (this.#mux.order.length === 1) throw new RangeError("eventbus: the last session of the stream: close the client instead");
    this.#mux.order.splice(i, 1);
    if (!this.#wsRemove(id)) this.#reconnectNow();
  }
  /** Counters: connections opened, events delivered, duplicates dropped, resyncs reported. */
  get stats() {
    return { ...this.#stats };
  }

  #initMux(o) {
    const ids = o.sessions;
    if (!Array.isArray(ids) || ids.length < 1 || ids.length > MAX_SESSIONS || !ids.every(validSession) || new Set(ids).size !== ids.length) {
      throw new TypeError("eventbus: sessions must be 1 to 256 distinct non-empty strings");
    }
    this.#base.searchParams.delete("session");
    // fromStart: lastEventId 0, every session from the start of its ring;
    // asked for again while no session has a position.
    this.#mux = { all: new Map(), order: [], fromStart: false };
    let from = [];
    if (isFromStart(o.lastEventId)) {
      this.#mux.fromStart = true;
    } else if (o.lastEventId !== undefined && o.lastEventId !== null) {
      from = parseCursor(o.lastEventId);
      if (!from) throw new RangeError("eventbus: with sessions, lastEventId must be 0 or a composite cursor (m1...), got " + o.lastEventId);
    }
    for (const id of ids) {
      const p = newPosition(id);
      const e = entryOf(from, p.sessionTag);
      if (e) {
        p.cursor = e.id;
        p.tag = e.epoch;
      }
      this.#mux.all.set(id, p);
      this.#mux.order.push(p);
    }
  }

  #compositeCursor() {
    const entries = [];
    for (const p of this.#mux.order) {
      if (p.cursor !== null && p.tag !== null) entries.push({ session: p.sessionTag, epoch: p.tag, id: p.cursor });
    }
    if (entries.length > 0) return formatCursor(entries);
    return this.#mux.fromStart ? "0" : null;
  }

  // #sendsFromStart reports whether the next connection asks for "0": every
  // session from the start of its ring.
  #sendsFromStart() {
    return !!this.#mux?.fromStart && this.#mux.order.every((p) => p.cursor === null);
  }

  // #startAt0 gives p, of a connection that asked for "0", the position 0
  // of its epoch once that is known: a reconnect then asks for its whole
  // ring again.
  #startAt0(p, conn) {
    if (conn.fromStart && p.cursor === null && p.epoch !== null) p.cursor = 0;
  }

  // #reconnectNow ends the connection (if one is open or opening) so that
  // the next one, with the new sessions, starts at once.
  #reconnectNow() {
    if (this.#closed || !this.#abort) return;
    this.#restart = true;
    this.#abort();
  }

  /** Stops for good: ends the connection and any wait. Idempotent. */
  close() {
    if (this.#closed) return;
    this.#closed = true;
    this.#abort?.();
    clearTimeout(this.#timer);
    this.#wake?.();
    this.#finish(null);
  }

  #finish(err) {
    this.#closed = true;
    if (err) {
      err.final = true;
      this.#report(err);
    }
    this.#setState("closed", err ? { error: err } : {});
    this.#resolveDone(err);
  }

  #setState(state, detail = {}) {
    if (this.#state === state && detail.delay === undefined) return;
    if (this.#state === "closed") return;
    this.#state = state;
    this.#call("onState", state, detail);
  }

  // #call runs a user callback. What it throws (or rejects with) is
  // reported through onError and never stops the client; a returned
  // promise is handed back so the fetch transport can wait for it.
  #call(name, ...args) {
    const cb = this.#opts[name];
    if (typeof cb !== "function") return undefined;
    try {
      const v = cb.apply(undefined, args);
      if (v && typeof v.then === "function") {
        return Promise.resolve(v).catch((e) => this.#callbackFailed(name, e));
      }
    } catch (e) {
      this.#callbackFailed(name, e);
    }
    return undefined;
  }

  #callbackFailed(name, e) {
    if (name === "onError") {
      console.error("eventbus: onError threw", e);
      return;
    }
    this.#report(new EventBusError("callback", "eventbus: " + name + " threw: " + (e?.message ?? e), { cause: e }));
  }

  #report(err) {
    this.#call("onError", err);
  }

  async #run() {
    if (this.#closed) return; // closed before it started
    try {
      if (this.#opts.credentials && !(await this.#refreshCredentials("initial"))) return;
      let forceFetch = false;
      let attempt = 0;
      while (!this.#closed) {
        this.#setState(this.#stats.connects === 0 && attempt === 0 ? "connecting" : "reconnecting");
        attempt++;
        let useES = false;
        let r;
        if (this.#useWebSocket()) {
          r = await this.#viaWebSocket();
        } else {
          useES = !forceFetch && this.#useEventSource();
          // SSE until webSocketRetry has passed since the WebSocket failed;
          // then this connection ends and the next tries the WebSocket,
          // resuming from the one cursor.
          const back = this.#wsBase && this.#canWebSocket()
            ? setTimeout(() => this.#reconnectNow(), Math.max(0, this.#sseUntil - Date.now()))
            : null;
          r = useES ? await this.#viaEventSource() : await this.#viaFetch();
          clearTimeout(back);
        }
        if (this.#closed) return;
        if (this.#restart) {
          // The sessions changed: whatever ended this connection, the next
          // one, with the new URL, starts at once.
          this.#restart = false;
          attempt = 0;
          continue;
        }
        // An EventSource that failed before opening cannot tell why (a 429
        // with Retry-After, a 404): the next attempt asks with fetch.
        forceFetch = useES && !r.opened;
        const next = this.#decide(r);
        if (next.final) {
          this.#finish(next.final);
          return;
        }
        if (r.error) this.#report(r.error);
        if (next.refresh && !(await this.#refreshCredentials(next.refresh, next.status))) return;
        if (this.#closed) return;
        // Whole milliseconds: what onState shows, what the timer waits.
        const delay = Math.round(next.delay ?? 0);
        this.#setState("reconnecting", { delay, attempt, error: r.error });
        if (delay > 0) await this.#sleep(delay);
      }
    } catch (e) {
      // A bug of ours: stop instead of looping on it.
      if (!this.#closed) this.#finish(new EventBusError("internal", "eventbus: client failed: " + (e?.message ?? e), { cause: e }));
    }
  }

  #sleep(ms) {
    return new Promise((resolve) => {
      this.#wake = resolve;
      this.#timer = setTimeout(resolve, ms);
    }).then(() => {
      this.#wake = null;
    });
  }

  async #refreshCredentials(reason, status) {
    try {
      const c = await this.#opts.credentials({ reason, status });
      if (c != null && typeof c !== "object") throw new TypeError("credentials must return an object, null or undefined");
      if (c?.token !== undefined && typeof c.token !== "string") throw new TypeError("credentials token must be a string");
      this.#credentials = c ?? null;
      return true;
    } catch (e) {
      if (!this.#closed) {
        this.#finish(new EventBusError("credentials", "eventbus: credentials failed: " + (e?.message ?? e), { cause: e }));
      }
      return false;
    }
  }

  // #decide turns how a connection ended into the next step: a final
  // error, or credentials to fetch (refresh) and a delay before the next
  // attempt.
  #decide(r) {
    const immediate = (reason) => {
      const quick = Date.now() - r.openedAt < QUICK_MS;
      const wasImmediate = this.#lastImmediate;
      this.#lastImmediate = true;
      // Without a credentials callback the application refreshes a cookie
      // itself; the reconnect is still immediate.
      const refresh = this.#opts.credentials ? reason : null;
      return { refresh, delay: quick && wasImmediate ? this.#backoff(false) : 0 };
    };
    if (r.end === "fatal" || r.end === "no_sessions" || r.end === "gone") return { final: r.error };
    if (r.end === "fallback") {
      // The WebSocket failed without the server's answer: SSE, at once.
      this.#lastImmediate = false;
      return { delay: 0 };
    }
    if (r.end === "http") {
      this.#lastImmediate = false;
      const s = r.status;
      const mine = !this.#mux || this.#mux.order.some((p) => p.session === r.error?.session);
      if (s === 404 && r.error?.code === "session_not_found" && mine) {
        // The session does not exist (yet: a daemon that restarted knows
        // it again once something re-creates it). Within retryNotFound,
        // retry with backoff.
        const left = this.#notFoundLeft();
        if (left > 0) return { delay: Math.min(this.#backoff(false), left) };
        // Gone. On a multiplexed stream the next connection, at once,
        // streams the others: each such answer drops one session.
        if (!this.#mux) return { final: r.error };
        const final = this.#gone(r.error.session, "session_not_found", r.error);
        return final ? { final } : { delay: 0 };
      }
      if (s === 401 || s === 403) {
        if (!this.#opts.credentials || this.#authFinal) return { final: r.error };
        this.#authFinal = true;
        return { refresh: s === 401 ? "unauthorized" : "forbidden", status: s, delay: 0 };
      }
      if ((s === 429 || s === 503) && r.retryAfter !== undefined) {
        this.#backoff(false);
        return { delay: r.retryAfter * (1 + 0.25 * Math.random()) };
      }
      if (s >= 500 || s === 408 || s === 425 || s === 429) return { delay: this.#backoff(false) };
      return { final: r.error };
    }
    if (!r.opened) {
      this.#lastImmediate = false;
      return { delay: this.#backoff(false) };
    }
    if (r.end === "budget") return immediate(null);
    if (r.end === "stream_error" && r.errorKind === "reauthenticate") return immediate("reauthenticate");
    if (r.end === "stream_error" && r.errorKind === "revoked") {
      const next = immediate("revoked");
      this.#authFinal = true;
      return next;
    }
    if (r.end === "stream_error" && r.errorKind === "shutdown") {
      // The server is going away, not failing: come back spread over
      // [retryAfter, 2*retryAfter] (retryAfter capped at maxDelay/2), and
      // start the backoff afresh (a daemon restarting refuses a while).
      this.#lastImmediate = false;
      this.#failures = 0;
      const ra = Math.min(r.retryAfter, this.#maxDelay / 2);
      return { delay: ra * (1 + Math.random()) };
    }
    this.#lastImmediate = false;
    const stable = Date.now() - r.openedAt >= STABLE_MS || (r.end === "cut" && r.delivered);
    return { delay: this.#backoff(stable) };
  }

  // #notFoundLeft returns how much of retryNotFound is left since the first
  // 404 session_not_found after the last stream that opened (that window
  // starting now when this is the first), 0 when none is.
  #notFoundLeft() {
    if (this.#retryNotFound <= 0) return 0;
    this.#notFoundSince ??= Date.now();
    return Math.max(0, this.#retryNotFound - (Date.now() - this.#notFoundSince));
  }

  // Full-jitter exponential backoff: a uniform delay in [0, cap), cap
  // doubling with each failure since the last stable connection, from the
  // server's retry: (or initialDelay) up to maxDelay (or the server's retry
  // when that is larger).
  #backoff(stable) {
    this.#failures = (stable ? 0 : this.#failures) + 1;
    const base = this.#serverRetry ?? this.#initialDelay;
    const cap = Math.min(Math.max(this.#maxDelay, base), base * 2 ** Math.min(this.#failures - 1, 30));
    return Math.random() * cap;
  }

  #useEventSource() {
    const o = this.#opts;
    const t = o.transport ?? "auto";
    if (t === "fetch") return false;
    if (t === "eventsource") return true;
    if (!(o.EventSource ?? globalThis.EventSource)) return false;
    // Decided per connection, from the credentials in hand: a token or
    // headers need fetch; a callback that returned none (a cookie session
    // whose callback renewed the cookie) leaves the EventSource usable.
    if (this.#sendsHeaders()) return false;
    // An EventSource delivers only the event types it listens for by name.
    const exactFilter = Array.isArray(o.filter) && o.filter.length > 0 && o.filter.every((f) => !f.endsWith("*"));
    return (Array.isArray(o.eventTypes) && o.eventTypes.length > 0) || exactFilter;
  }

  #url() {
    const u = new URL(this.#base);
    if (this.#mux) {
      for (const p of this.#mux.order) u.searchParams.append("session", p.session);
      const c = this.#compositeCursor();
      if (c) u.searchParams.set("lastEventId", c);
      return u.toString();
    }
    const p = this.#single;
    if (p.cursor !== null) {
      const form = p.idForm === "epoch" && p.epoch;
      u.searchParams.set("lastEventId", form ? p.epoch + ":" + p.cursor : String(p.cursor));
      if (p.epoch) u.searchParams.set("epoch", p.epoch);
    }
    return u.toString();
  }

  // #positions are the positions of the current stream.
  #positions() {
    return this.#mux ? this.#mux.order : [this.#single];
  }

  // #headers are the request's headers: the options', the credentials';
  // without Accept for the WebSocket's handshake (ws).
  #headers(ws = false) {
    const h = ws ? {} : { Accept: "text/event-stream" };
    Object.assign(h, this.#opts.headers ?? {});
    const c = this.#credentials;
    if (c?.headers) Object.assign(h, c.headers);
    if (c?.token) h.Authorization = "Bearer " + c.token;
    return h;
  }

  #newConn() {
    const fromStart = this.#sendsFromStart();
    for (const p of this.#positions()) {
      p.streamEpoch = null;
      p.replaying = p.cursor !== null || fromStart;
      p.budgetCut = false;
    }
    return {
      fromStart, // a multiplexed connection that asks for "0"
      opened: false,
      openedAt: 0,
      delivered: false,
      stop: null, // "budget" | "evicted" | "stream_error" | "no_sessions" | "gone"
      errorKind: undefined,
      retryAfter: undefined, // of a stream_error shutdown, in ms
      error: undefined,
    };
  }

  // #opened starts an open stream; headers are its response headers (null
  // for an EventSource or a WebSocket, which do not show them).
  #opened(conn, headers, transport = "sse") {
    conn.opened = true;
    conn.openedAt = Date.now();
    this.#stats.connects++;
    this.#authFinal = false;
    this.#notFoundSince = null;
    this.#headerEpochs(headers, (p, e) => {
      p.streamEpoch = e;
      // Only a client without a position adopts the header's epoch at once;
      // with a cursor, the first frame says whether the server accepted it
      // (an epoch_reset says it did not).
      if (p.cursor === null) {
        setEpoch(p, e);
        this.#startAt0(p, conn);
      }
    });
    this.#transport = transport;
    this.#setState("open", { transport });
  }

  // #headerEpochs calls f(position, epoch) for each epoch the stream's
  // headers name: Event-Epoch, or on a multiplexed stream Event-Epochs (the
  // sessions' epochs in the URL's order).
  #headerEpochs(headers, f) {
    if (!headers) return;
    if (!this.#mux) {
      const e = headers.get("event-epoch");
      if (e && EPOCH.test(e)) f(this.#single, e);
      return;
    }
    const list = (headers.get("event-epochs") ?? "").split(",").map((e) => e.trim());
    if (list.length !== this.#mux.order.length) return; // not this stream's: the frames will say
    this.#mux.order.forEach((p, i) => {
      if (EPOCH.test(list[i])) f(p, list[i]);
    });
  }

  #result(conn, end, error) {
    if (conn.stop === "budget") end = "budget";
    else if (conn.stop) end = conn.stop;
    return {
      end,
      opened: conn.opened,
      openedAt: conn.openedAt,
      delivered: conn.delivered,
      errorKind: conn.errorKind,
      retryAfter: conn.retryAfter,
      error: error ?? conn.error,
    };
  }

  async #viaFetch() {
    const ac = new AbortController();
    this.#abort = () => ac.abort();
    const conn = this.#newConn();
    let res;
    try {
      res = await this.#fetch(this.#url(), {
        headers: this.#headers(),
        signal: ac.signal,
        cache: "no-store",
        credentials: this.#opts.withCredentials ? "include" : "same-origin",
      });
    } catch (e) {
      return this.#result(conn, "network", new EventBusError("network", "eventbus: connecting failed: " + (e?.cause?.message ?? e?.message ?? e), { cause: e }));
    }
    if (res.status !== 200) return this.#httpFailure(res, conn);
    const ct = res.headers.get("content-type") ?? "";
    if (!/^text\/event-stream(\s*;|\s*$)/i.test(ct) || !res.body) {
      ac.abort();
      return this.#result(conn, "fatal", new EventBusError("content_type", "eventbus: the server answered 200 with Content-Type " + JSON.stringify(ct) + ", not text/event-stream", { status: 200 }));
    }
    this.#opened(conn, res.headers);
    const parser = new SSEParser({ maxEventBytes: this.#maxEventBytes });
    const reader = res.body.getReader();
    let idleFired = false;
    let idle = null;
    const arm = () => {
      clearTimeout(idle);
      if (this.#idleTimeout > 0) {
        idle = setTimeout(() => {
          idleFired = true;
          ac.abort();
        }, this.#idleTimeout);
      }
    };
    arm();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) {
          return this.#result(conn, "cut", new EventBusError("network", "eventbus: the stream ended (the server closed the response without a terminal frame)"));
        }
        arm();
        let recs;
        try {
          recs = parser.feed(value);
        } catch (e) {
          if (!(e instanceof SSEParseError)) throw e;
          return this.#result(conn, "fatal", new EventBusError("event_too_large", e.message + "; raise maxEventBytes", { cause: e }));
        }
        for (const rec of recs) {
          const p = this.#record(rec, conn);
          if (p) {
            // Backpressure: nothing is read while the application works.
            clearTimeout(idle);
            await p;
            if (this.#closed) return this.#result(conn, "closed");
            arm();
          }
          if (conn.stop) return this.#result(conn, conn.stop);
        }
      }
    } catch (e) {
      if (this.#closed || this.#restart) return this.#result(conn, "closed");
      if (idleFired) {
        return this.#result(conn, "idle", new EventBusError("idle_timeout", "eventbus: nothing received for " + this.#idleTimeout + " ms (not even a heartbeat); reconnecting"));
      }
      return this.#result(conn, "cut", new EventBusError("network", "eventbus: the stream was cut: " + (e?.cause?.message ?? e?.message ?? e), { cause: e }));
    } finally {
      clearTimeout(idle);
      this.#abort = null;
      ac.abort();
    }
  }

  async #httpFailure(res, conn) {
    let body = "";
    try {
      body = await readLimited(res, MAX_ERROR_BODY);
    } catch {
      // The status says enough.
    }
    let code;
    let message;
    let session;
    try {
      const j = JSON.parse(body);
      if (typeof j?.code === "string") code = j.code;
      if (typeof j?.error === "string") message = j.error;
      if (typeof j?.session === "string") session = j.session;
    } catch {
      // Not a JSON error body (a proxy's page).
    }
    const retryAfter = parseRetryAfter(res.headers.get("retry-after"));
    const s = res.status;
    const challenge = res.headers.get("www-authenticate") ?? undefined;
    const about = session === undefined ? "" : " (session " + JSON.stringify(session) + ")";
    const err = new EventBusError("http", "eventbus: HTTP " + s + (code ? " " + code : "") + about + ": " + (message ?? res.statusText ?? ""), { status: s, code, retryAfter, challenge, session });
    const r = this.#result(conn, "http", err);
    r.status = s;
    r.retryAfter = retryAfter;
    return r;
  }

  // #canWebSocket reports whether this client can open its WebSocket now: a
  // constructor (options.WebSocket, else the global one) and, when headers
  // are to be sent (options.headers, a token, credential headers), one that
  // takes them (the npm ws package's third argument): the platform's own
  // WebSocket (a browser's, Node's), or a subclass of it, sends cookies and
  // no header.
  #canWebSocket() {
    const WS = this.#opts.WebSocket ?? globalThis.WebSocket;
    if (typeof WS !== "function") return false;
    if (!nativeWebSocket(WS)) return true;
    return !this.#sendsHeaders();
  }

  // #sendsHeaders reports whether the next connection must send headers
  // (options.headers, or a token or headers from credentials), which
  // neither a browser's EventSource nor its WebSocket can.
  #sendsHeaders() {
    const c = this.#credentials;
    const some = (h) => !!h && Object.keys(h).length > 0;
    return some(this.#opts.headers) || !!c?.token || some(c?.headers);
  }

  // #useWebSocket reports whether the next connection is the WebSocket:
  // given its route, it can be opened, and it did not fail within
  // webSocketRetry.
  #useWebSocket() {
    return this.#wsBase !== null && Date.now() >= this.#sseUntil && this.#canWebSocket();
  }

  // #wsURL is the WebSocket's URL: the multiplexed stream's sessions, its
  // types and maxQueued, and the composite cursor.
  #wsURL() {
    const u = new URL(this.#wsBase);
    for (const k of ["types", "maxQueued"]) {
      const v = this.#base.searchParams.get(k);
      if (v !== null) u.searchParams.set(k, v);
    }
    for (const p of this.#mux.order) u.searchParams.append("session", p.session);
    const c = this.#compositeCursor();
    if (c) u.searchParams.set("lastEventId", c);
    return u.toString();
  }

  // #viaWebSocket is one connection over the WebSocket (SPEC 6.10): each
  // text message is lines, a frame line handled as the multiplexed SSE
  // frame's data, a control line ({"op":...}) as below. What fails before
  // the server's first message (no connection, a handshake refused: a
  // browser's WebSocket does not say by whom, a socket cut at once) falls
  // back to SSE for webSocketRetry, at once and with the same cursor: the
  // SSE route's answer then says what the server thinks (a 404, a 401).
  #viaWebSocket() {
    const WS = this.#opts.WebSocket ?? globalThis.WebSocket;
    const conn = this.#newConn();
    conn.dropped = new Set(); // sessions removed on this socket: their last frames are ignored
    const url = this.#wsURL();
    const limit = this.#maxEventBytes + MAX_BATCH_SLACK;
    return new Promise((resolve) => {
      let sock = null;
      let done = false;
      let greeted = false;
      let idle = null;
      let pinger = null;
      let chain = Promise.resolve();
      // What the messages waiting for the application hold (characters),
      // and whether the socket was paused for it (see onmessage).
      let queued = 0;
      let paused = false;
      let oversized = null; // the ws package refused a message too long
      const ws = {
        conn,
        adding: new Set(),
        send: (msg) => {
          try {
            sock.send(JSON.stringify(msg));
            return true;
          } catch {
            return false;
          }
        },
      };
      const finish = (end, error, result) => {
        if (done) return;
        done = true;
        clearTimeout(idle);
        clearInterval(pinger);
        sock?.off?.("pong", arm);
        if (this.#ws === ws) this.#ws = null;
        this.#abort = null;
        try {
          if (sock && sock.readyState <= 1) sock.close(1000);
        } catch {
          // Closed already.
        }
        resolve(result ?? this.#result(conn, end, error));
      };
      const fallback = (why) => {
        this.#sseUntil = Date.now() + this.#webSocketRetry;
        finish("fallback", new EventBusError("websocket", "eventbus: the WebSocket " + why + "; SSE for " + this.#webSocketRetry + " ms"));
      };
      // Idle detection needs pings, which a browser's WebSocket cannot
      // send (it answers the server's by itself, unseen): only a socket
      // with ping() and "pong" events (the npm ws package) has it.
      const canPing = (s) => this.#idleTimeout > 0 && typeof s.ping === "function" && typeof s.on === "function";
      const arm = () => {
        if (done || !canPing(sock)) return;
        clearTimeout(idle);
        idle = setTimeout(() => {
          finish("idle", new EventBusError("idle_timeout", "eventbus: nothing received for " + this.#idleTimeout + " ms (no pong either); reconnecting"));
        }, this.#idleTimeout);
      };
      this.#abort = () => finish("closed");
      try {
        sock = nativeWebSocket(WS)
          ? new WS(url, [WEBSOCKET_PROTOCOL])
          : new WS(url, [WEBSOCKET_PROTOCOL], { headers: this.#headers(true), maxPayload: limit });
      } catch (e) {
        fallback("could not be opened (" + (e?.message ?? e) + ")");
        return;
      }
      if (!nativeWebSocket(WS) && typeof sock.on === "function") {
        // The ws package shows the answer to a refused handshake: the
        // server's own (its JSON error) counts as it would over SSE (a 401
        // asks for credentials, a 404 drops its session); anything else (a
        // proxy's page) falls back.
        sock.on("unexpected-response", (req, res) => {
          if (done) return;
          readNodeBody(res, MAX_ERROR_BODY).then(async (body) => {
            if (done) return;
            let code;
            try {
              code = JSON.parse(body)?.code;
            } catch {
              // A proxy's page.
            }
            if (typeof code !== "string" || res.statusCode < 200) {
              fallback("handshake was answered " + res.statusCode + " without the server's JSON error");
              return;
            }
            if (webSocketUnavailable(res.statusCode, code)) {
              fallback("is not served there (" + res.statusCode + " " + code + ")");
              return;
            }
            const h = new Headers();
            for (const [k, v] of Object.entries(res.headers)) if (v !== undefined) h.set(k, Array.isArray(v) ? v.join(", ") : v);
            const r = await this.#httpFailure(new Response(body, { status: res.statusCode, headers: h }), conn);
            finish(r.end, r.error, r);
          }, () => fallback("handshake was answered " + res.statusCode));
        });
      }
      sock.onopen = () => {
        if (done) return;
        this.#opened(conn, null, "websocket");
        this.#ws = ws;
        arm();
        if (canPing(sock)) {
          sock.on("pong", arm);
          pinger = setInterval(() => {
            try {
              sock.ping();
            } catch {
              // The close event follows.
            }
          }, Math.max(1, this.#idleTimeout / 3));
        }
      };
      // The close event follows (after a failed handshake too).
      sock.onerror = () => {};
      if (!nativeWebSocket(WS) && typeof sock.on === "function") {
        // The ws package closes a socket whose message passes maxPayload
        // (1009) and says why here: final, as the same batch would come
        // again on every resume (an oversized event, as over SSE).
        // Told at the close, after the messages that came before it.
        sock.on("error", (e) => {
          if (e?.code === "WS_ERR_UNSUPPORTED_MESSAGE_LENGTH") {
            oversized = new EventBusError("event_too_large", "eventbus: a WebSocket message above maxEventBytes and a batch's slack; raise maxEventBytes");
          }
        });
      }
      const handle = async (data) => {
        if (typeof data !== "string") {
          this.#protocol("a binary WebSocket message (the server sends text only)");
          return;
        }
        if (data.length > limit) {
          conn.stop = "fatal";
          conn.error = new EventBusError("event_too_large", "eventbus: a WebSocket message of " + data.length + " characters, above maxEventBytes; raise maxEventBytes");
          return;
        }
        for (const line of data.split("\n")) {
          if (done || conn.stop) return;
          if (line === "") continue;
          if (line.length > this.#maxEventBytes) {
            conn.stop = "fatal";
            conn.error = new EventBusError("event_too_large", "eventbus: a frame of " + line.length + " characters, above maxEventBytes; raise maxEventBytes");
            return;
          }
          if (!line.startsWith(FRAME_PREFIX)) {
            this.#wsControl(line, ws, conn);
            continue;
          }
          const p = this.#frame(line, null, conn);
          if (p) {
            // The next line waits for the application; the messages that
            // come meanwhile wait in chain (see onmessage's bound).
            clearTimeout(idle);
            await p;
            if (!done) arm();
          }
        }
      };
      sock.onmessage = (ev) => {
        if (done) return;
        greeted = true;
        arm();
        // Backpressure: a slow onEvent holds messages here. Past twice a
        // batch's bound the ws package's socket is paused (it stops
        // reading, so the server's queue for this client fills and its
        // rules apply: warning, eviction, catch-up) until the application
        // has caught up; a browser's WebSocket cannot be paused.
        const size = typeof ev.data === "string" ? ev.data.length : 0;
        queued += size;
        if (!paused && queued > 2 * limit && typeof sock.pause === "function") {
          paused = true;
          sock.pause();
        }
        chain = chain.then(() => (done ? undefined : handle(ev.data))).then(
          () => {
            queued -= size;
            if (paused && queued <= limit && !done) {
              paused = false;
              sock.resume();
            }
            if (!done && conn.stop) finish(conn.stop);
          },
          (e) => {
            if (!done) finish("fatal", new EventBusError("internal", "eventbus: client failed: " + (e?.message ?? e), { cause: e }));
          },
        );
      };
      sock.onclose = (ev) => {
        if (done) return;
        // The messages that came before it first.
        chain = chain.then(() => {
          if (done) return;
          if (this.#closed || this.#restart) return finish("closed");
          if (oversized && !conn.stop) {
            conn.stop = "fatal";
            conn.error = oversized;
          }
          if (!greeted) {
            return fallback(conn.opened
              ? "closed before its first message (code " + ev.code + ")"
              : "could not connect (a refused handshake, a proxy, no route: a WebSocket does not say)");
          }
          if (conn.stop) return finish(conn.stop);
          const kind = CLOSE_KINDS.get(ev.code);
          if (ev.code === CLOSE_EVICTED) {
            // client_evicted was written (and handled) or lost: resume with the cursor.
            conn.stop = "evicted";
            return finish("evicted");
          }
          if (kind) {
            conn.stop = "stream_error";
            conn.errorKind = kind;
            if (kind === "shutdown") conn.retryAfter = SHUTDOWN_RETRY_AFTER_MS;
            return finish("stream_error", new EventBusError("stream_error", "eventbus: the server closed the WebSocket (" + ev.code + " " + kind + ")", { errorKind: kind, retryAfter: conn.retryAfter }));
          }
          finish("cut", new EventBusError("network", "eventbus: the WebSocket was closed (" + ev.code + (ev.reason ? " " + ev.reason : "") + ") without a terminal frame"));
        });
      };
    });
  }

  // #wsControl handles a control line of the WebSocket: the cursor (with
  // every session's epoch in the greeting and after a change), the answers
  // to add and remove. An unknown op is a newer server's: skipped.
  #wsControl(line, ws, conn) {
    let c;
    try {
      c = JSON.parse(line);
    } catch {
      this.#protocol("a WebSocket line that is not JSON: " + line.slice(0, 64));
      return;
    }
    if (c === null || typeof c !== "object" || typeof c.op !== "string") {
      this.#protocol("a WebSocket line that is neither a frame nor a control line: " + line.slice(0, 64));
      return;
    }
    switch (c.op) {
      case "cursor": {
        const entries = parseCursor(typeof c.cursor === "string" ? c.cursor : "");
        if (!entries) {
          this.#protocol("a cursor line whose cursor does not parse: " + String(c.cursor).slice(0, 64));
          return;
        }
        const epochs = c.epochs !== null && typeof c.epochs === "object" ? c.epochs : {};
        for (const p of this.#mux.order) {
          const e = Object.hasOwn(epochs, p.session) ? epochs[p.session] : null;
          if (typeof e === "string" && EPOCH.test(e)) {
            // As Event-Epochs on SSE: a session without a position adopts
            // it; one with a cursor learns from its first frame whether the
            // server took the cursor.
            p.streamEpoch = e;
            if (p.cursor === null) setEpoch(p, e);
            this.#startAt0(p, conn);
          }
          if (p.budgetCut) continue;
          const en = entryOf(entries, p.sessionTag);
          if (!en) continue;
          if (p.cursor === null) {
            // The live position the server holds: a reconnect loses none
            // of its events.
            p.cursor = en.id;
            p.tag = en.epoch;
          } else if (p.tag === null) {
            p.tag = en.epoch; // an added session's first events came before its epoch
          } else continue;
          if (p.streamEpoch && epochTag(p.streamEpoch) === en.epoch) p.epoch = p.streamEpoch;
        }
        return;
      }
      case "added":
        ws.adding.delete(c.session);
        return;
      case "removed":
        return; // its last frames may still come: conn.dropped keeps ignoring them
      case "error": {
        const session = typeof c.session === "string" ? c.session : undefined;
        const status = Number.isInteger(c.status) ? c.status : undefined;
        const code = typeof c.code === "string" ? c.code : undefined;
        const about = session === undefined ? "" : " (session " + JSON.stringify(session) + ")";
        this.#report(new EventBusError("http", "eventbus: the server refused a change of the stream" + about + ": " + (status ?? "") + " " + (code ?? "") + ": " + (typeof c.error === "string" ? c.error : ""), { status, code, session }));
        if (session !== undefined && ws.adding.has(session)) {
          // A session it could not add: the next connection asks for the
          // whole list, and the answer to that counts as on any connection.
          ws.adding.delete(session);
          this.#restart = true;
          conn.stop = "closed";
        }
        return;
      }
      default:
        return;
    }
  }

  // #wsAdd sends an add for p on the open WebSocket (from the client's
  // position in it as a one-entry cursor, else live) and reports whether it
  // could.
  #wsAdd(p) {
    const ws = this.#ws;
    if (!ws || ws.conn.stop) return false;
    const msg = { op: "add", session: p.session };
    if (p.cursor !== null && p.tag !== null) msg.lastEventId = formatCursor([{ session: p.sessionTag, epoch: p.tag, id: p.cursor }]);
    p.streamEpoch = null;
    p.replaying = p.cursor !== null;
    p.budgetCut = false;
    ws.conn.dropped.delete(p.session);
    ws.adding.add(p.session);
    return ws.send(msg);
  }

  // #wsRemove sends a remove for session id on the open WebSocket and
  // reports whether it could.
  #wsRemove(id) {
    const ws = this.#ws;
    if (!ws || ws.conn.stop) return false;
    ws.conn.dropped.add(id);
    ws.adding.delete(id);
    return ws.send({ op: "remove", session: id });
  }

  async #viaEventSource() {
    const ES = this.#opts.EventSource ?? globalThis.EventSource;
    const conn = this.#newConn();
    const url = this.#url();
    if (this.#positions().some((p) => p.epoch === null && p.cursor === null)) await this.#probeEpoch(url, conn);
    if (this.#closed || this.#restart) return this.#result(conn, "closed");
    return new Promise((resolve) => {
      let es;
      let done = false;
      const finish = (end, error) => {
        if (done) return;
        done = true;
        this.#abort = null;
        es?.close();
        resolve(this.#result(conn, end, error));
      };
      this.#abort = () => finish("closed");
      try {
        es = new ES(url, { withCredentials: !!this.#opts.withCredentials });
      } catch (e) {
        finish("network", new EventBusError("network", "eventbus: EventSource failed: " + (e?.message ?? e), { cause: e }));
        return;
      }
      es.onopen = () => {
        if (done) return;
        this.#opened(conn, null);
      };
      es.onerror = () => {
        // Whatever the browser would do next, the loop decides: close it.
        if (conn.opened) finish("cut", new EventBusError("network", "eventbus: the stream was cut"));
        else finish("network", new EventBusError("network", "eventbus: the EventSource could not connect (it does not say why); the next attempt uses fetch"));
      };
      const onMessage = (ev) => {
        if (done) return;
        // No backpressure here: an EventSource reads on by itself.
        this.#frame(ev.data, ev.lastEventId, conn);
        if (conn.stop) finish(conn.stop);
      };
      const types = new Set(["message", ...SYNTHETIC_TYPES, ...(this.#opts.eventTypes ?? [])]);
      for (const f of this.#opts.filter ?? []) if (!f.endsWith("*")) types.add(f);
      for (const t of types) es.addEventListener(t, onMessage);
    });
  }

  // #probeEpoch learns the epoch of a live-only stream an EventSource is
  // about to open (it cannot read the Event-Epoch header) from a HEAD of the
  // same URL, which the handler answers with the stream's headers without
  // taking a subscriber slot. Without it, a stream with plain ids would
  // never learn its epoch, and its resume after a daemon restart could join
  // two epochs. Were the session recreated between the HEAD and the GET, the
  // next resume would name the older epoch and get an epoch_reset: a
  // needless resync, never a silent join. A HEAD that fails or takes more
  // than 5 s is given up; the EventSource opens all the same.
  async #probeEpoch(url, conn) {
    if (!this.#fetch) return;
    const ac = new AbortController();
    this.#abort = () => ac.abort();
    const timer = setTimeout(() => ac.abort(), 5000);
    try {
      const res = await this.#fetch(url, {
        method: "HEAD",
        cache: "no-store",
        credentials: this.#opts.withCredentials ? "include" : "same-origin",
        signal: ac.signal,
      });
      if (res.ok) {
        this.#headerEpochs(res.headers, (p, e) => {
          if (p.epoch === null) setEpoch(p, e);
          this.#startAt0(p, conn);
        });
      }
    } catch {
      // The stream itself will say what is wrong.
    } finally {
      clearTimeout(timer);
      this.#abort = null;
    }
  }

  #record(rec, conn) {
    if (rec.kind === "retry") {
      this.#serverRetry = rec.retry;
      return undefined;
    }
    if (rec.kind !== "event") return undefined;
    return this.#frame(rec.data, rec.id, conn);
  }

  #protocol(msg) {
    this.#report(new EventBusError("protocol", "eventbus: " + msg));
  }

  // #frame handles one SSE event by its JSON envelope: an id makes it an
  // application event, an "about" a signal, anything else a synthetic
  // frame. The SSE event name is never trusted: a publisher may use any
  // type, "replay_complete" included. On a multiplexed stream the
  // envelope's "session" says whose position it moves.
  #frame(text, idField, conn) {
    let env;
    try {
      env = JSON.parse(text);
    } catch {
      this.#protocol("a frame whose data is not JSON: " + String(text).slice(0, 64));
      return undefined;
    }
    if (env === null || typeof env !== "object" || typeof env.type !== "string") {
      this.#protocol("a frame that is not an event envelope");
      return undefined;
    }
    let p = this.#single;
    if (this.#mux) {
      p = this.#mux.order.find((q) => q.session === env.session);
      // A session removed on the open WebSocket: its last frames may
      // still come.
      if (!p && conn.dropped?.has(env.session)) return undefined;
      if (!p) {
        this.#protocol("a frame of no session of the stream: " + String(text).slice(0, 64));
        return undefined;
      }
    }
    if (env.id !== undefined) return this.#appEvent(p, env, idField, conn);
    if (typeof env.about === "string") {
      if (p.budgetCut) return undefined;
      conn.delivered = true;
      return this.#call("onSignal", this.#tagged(p, { type: env.type, about: env.about, meta: env._meta, serverTimestamp: env._meta?.serverTimestamp }));
    }
    const d = env.data !== null && typeof env.data === "object" ? env.data : {};
    switch (env.type) {
      case "replay_complete": {
        this.#observeEpoch(p, d.epoch, null);
        this.#startAt0(p, conn);
        p.replaying = false;
        // A replay cut by the server's budget resumes at once from the
        // cursor, once no other session's replay is under way.
        const others = this.#positions().some((q) => q.replaying);
        const cut = this.#positions().some((q) => q.budgetCut);
        if (cut && !others) conn.stop = "budget";
        if (p.budgetCut) return undefined;
        conn.delivered = true;
        return this.#call("onCaughtUp", this.#tagged(p, {
          replayedCount: d.replayedCount ?? 0,
          lastReplayedEventId: d.lastReplayedEventId ?? null,
          lastEventId: d.lastEventId ?? null,
          epoch: p.epoch,
        }));
      }
      case "state_resync_required":
        return this.#resync(p, d, conn);
      case "slow_client_warning":
        return this.#call("onSlow", this.#tagged(p, d));
      case "client_evicted":
        conn.stop = "evicted";
        return this.#call("onEvicted", this.#tagged(p, d));
      case "stream_error": {
        const kind = typeof d.errorKind === "string" ? d.errorKind : "internal";
        const about = this.#mux ? " (session " + JSON.stringify(p.session) + ")" : "";
        const message = kind === "closed"
          ? "eventbus: the session" + about + " is gone (stream_error closed): " + (d.error ?? "")
          : "eventbus: the server ended the stream" + about + " (" + kind + "): " + (d.error ?? "");
        const err = new EventBusError("stream_error", message, {
          errorKind: kind,
          session: this.#mux ? p.session : undefined,
        });
        if (kind === "closed") {
          if (!this.#mux) {
            // The session was deleted: final, never resumed.
            conn.stop = "gone";
            conn.error = err;
            return undefined;
          }
          // This session is gone (deleted); the others go on.
          const final = this.#gone(p.session, "closed", err);
          if (final) {
            conn.stop = "no_sessions";
            conn.error = final;
          }
          return undefined;
        }
        conn.stop = "stream_error";
        conn.errorKind = kind;
        if (kind === "shutdown") {
          conn.retryAfter = Number.isFinite(d.retryAfter) && d.retryAfter >= 0 ? d.retryAfter : SHUTDOWN_RETRY_AFTER_MS;
          err.retryAfter = conn.retryAfter;
        }
        conn.error = err;
        return undefined;
      }
      default:
        return undefined; // a synthetic frame of a newer server
    }
  }

  // #tagged is v, with its session first on a multiplexed stream.
  #tagged(p, v) {
    return this.#mux ? { session: p.session, ...v } : v;
  }

  // #gone drops session id from the stream, which the server says is gone,
  // and reports it; it returns the final error when no session is left.
  #gone(id, reason, error) {
    const order = this.#mux.order;
    const i = order.findIndex((p) => p.session === id);
    if (i < 0) return null;
    const [p] = order.splice(i, 1);
    this.#call("onSessionGone", { session: id, reason, error, lastEventId: p.cursor, epoch: p.epoch });
    if (order.length > 0) return null;
    return new EventBusError("no_sessions", "eventbus: every session of the stream is gone (the last, " + JSON.stringify(id) + ": " + reason + ")");
  }

  #appEvent(p, env, idField, conn) {
    const id = env.id;
    if (!Number.isSafeInteger(id) || id < 0) {
      this.#protocol("an event id that is not an integer in [0, 2^53-1]: " + id);
      return undefined;
    }
    if (this.#mux) {
      this.#muxLine(p, idField, id);
    } else {
      const line = parseEventId(idField ?? "");
      if (line && line.id === id) {
        // The id line agrees with the envelope: its form (and epoch) count.
        p.idForm = line.epoch ? "epoch" : "plain";
        if (line.epoch) p.streamEpoch = line.epoch;
      }
    }
    this.#observeEpoch(p, p.streamEpoch, id);
    if (p.budgetCut) return undefined;
    if (p.cursor !== null && id <= p.cursor) {
      this.#stats.duplicates++;
      return undefined;
    }
    p.cursor = id;
    conn.delivered = true;
    this.#stats.events++;
    return this.#call("onEvent", this.#tagged(p, {
      id,
      epoch: p.epoch,
      type: env.type,
      data: env.data,
      meta: env._meta,
      serverTimestamp: env._meta?.serverTimestamp,
      originatorClientId: env.originatorClientId,
      replayed: p.replaying,
    }));
  }

  // #muxLine reads the composite cursor of event id of p, its id line.
  // The sessions without a position take theirs from it, the live position
  // the server holds for them, so that a reconnect loses none of their
  // events. And p takes its epoch's tag from it while it does not know the
  // epoch itself (an EventSource shows no Event-Epochs header): a tag
  // other than its cursor's is an epoch change it reports.
  #muxLine(p, idField, id) {
    const others = this.#mux.order.some((q) => q !== p && q.cursor === null && !q.budgetCut);
    if (!others && (p.epoch !== null || p.streamEpoch !== null)) return;
    const entries = parseCursor(idField ?? "");
    if (!entries) return;
    for (const q of this.#mux.order) {
      if (q === p || q.cursor !== null || q.budgetCut) continue;
      const e = entryOf(entries, q.sessionTag);
      if (!e) continue;
      q.cursor = e.id;
      q.tag = e.epoch;
      if (q.streamEpoch && epochTag(q.streamEpoch) === e.epoch) q.epoch = q.streamEpoch;
    }
    const own = entryOf(entries, p.sessionTag);
    if (p.epoch !== null || p.streamEpoch !== null || !own || own.id !== id || own.epoch === p.tag) return;
    if (p.cursor !== null && p.tag !== null) {
      const last = p.cursor;
      p.cursor = 0;
      p.tag = own.epoch;
      this.#reportResync(p, "epoch_reset", "epoch_changed", last, id, null, id > 1 ? { from: 1, to: id - 1 } : null);
      return;
    }
    p.tag = own.epoch;
  }

  // #observeEpoch takes in the epoch a frame of p shows (from the
  // Event-Epoch(s) header, the id line, or replay_complete and
  // state_resync_required; never from application data). An epoch that
  // differs from the cursor's without an epoch_reset first means the server
  // did not see (or ignored) our epoch: the client resets itself and says
  // so.
  #observeEpoch(p, e, firstId) {
    if (typeof e !== "string" || !EPOCH.test(e)) return;
    if (isEpoch(p, e) || unknownEpoch(p) || p.cursor === null) {
      setEpoch(p, e); // the epoch itself, where only its tag was known
      return;
    }
    const previous = p.epoch;
    const last = p.cursor;
    setEpoch(p, e);
    // From the start of the new epoch: what this connection delivers next
    // moves the cursor on; a drop before that replays the whole new epoch.
    p.cursor = 0;
    this.#reportResync(p, "epoch_reset", "epoch_changed", last, firstId, previous, firstId > 1 ? { from: 1, to: firstId - 1 } : null);
  }

  #resync(p, d, conn) {
    const reason = typeof d.reason === "string" ? d.reason : "unknown";
    const last = Number.isSafeInteger(d.lastDeliveredId) ? d.lastDeliveredId : 0;
    const earliest = Number.isSafeInteger(d.earliestAvailableId) ? d.earliestAvailableId : 0;
    if (reason === "replay_budget_exceeded") {
      // Nothing is lost: the rest is still in the ring. The client takes
      // replay_complete, drops what follows and resumes from its cursor.
      this.#observeEpoch(p, d.epoch, null);
      p.budgetCut = true;
      return undefined;
    }
    if (reason === "epoch_reset") {
      const previous = p.epoch;
      if (typeof d.epoch === "string" && EPOCH.test(d.epoch)) setEpoch(p, d.epoch);
      else if (p.streamEpoch) setEpoch(p, p.streamEpoch);
      p.cursor = 0; // the whole ring of the new epoch follows
      return this.#reportResync(p, reason, d.detail, last, earliest, previous, earliest > 1 ? { from: 1, to: earliest - 1 } : null);
    }
    this.#observeEpoch(p, d.epoch, null);
    // The server's lastDeliveredId can be behind what this client holds
    // (under the resync overflow policy it is the last id the server
    // dequeued); what is missing starts after the later of the two.
    const from = Math.max(last, p.cursor ?? 0) + 1;
    const to = earliest - 1;
    if (from > to) return undefined;
    return this.#reportResync(p, reason, d.detail, last, earliest, null, { from, to });
  }

  #reportResync(p, reason, detail, lastDeliveredId, earliestAvailableId, previousEpoch, missing) {
    this.#stats.resyncs++;
    return this.#call("onResync", this.#tagged(p, { reason, detail, lastDeliveredId, earliestAvailableId, epoch: p.epoch, previousEpoch, missing }));
  }
}

// webSocketUnavailable reports whether a server's JSON refusal of the
// handshake says that no WebSocket is served there rather than anything
// about the stream (SPEC 9): a route it does not have (404 other than
// session_not_found, 405), a handshake that reached it without its Upgrade
// headers (426: a proxy that does not forward them), a connection it cannot
// take over (500 streaming_unsupported). The client falls back to SSE.
function webSocketUnavailable(status, code) {
  switch (status) {
    case 404:
      return code !== "session_not_found";
    case 405:
    case 426:
      return true;
    case 500:
      return code === "streaming_unsupported";
  }
  return false;
}

// readNodeBody reads a Node http.IncomingMessage's body, up to limit bytes,
// as text, and releases it.
function readNodeBody(res, limit) {
  return new Promise((resolve, reject) => {
    const parts = [];
    let n = 0;
    const end = () => {
      res.destroy();
      resolve(new TextDecoder().decode(Buffer.concat(parts).subarray(0, limit)));
    };
    res.on("data", (b) => {
      parts.push(b);
      n += b.length;
      if (n >= limit) end();
    });
    res.on("end", end);
    res.on("error", reject);
  });
}

// nativeWebSocket reports whether WS is the platform's WebSocket (or a
// subclass of it), which takes no headers.
function nativeWebSocket(WS) {
  const G = globalThis.WebSocket;
  return typeof G === "function" && (WS === G || WS.prototype instanceof G);
}

async function readLimited(res, limit) {
  if (!res.body) return "";
  const reader = res.body.getReader();
  const parts = [];
  let n = 0;
  try {
    while (n < limit) {
      const { done, value } = await reader.read();
      if (done) break;
      parts.push(value);
      n += value.length;
    }
  } finally {
    reader.cancel().catch(() => {});
  }
  const all = new Uint8Array(Math.min(n, limit));
  let off = 0;
  for (const p of parts) {
    const take = Math.min(p.length, all.length - off);
    all.set(p.subarray(0, take), off);
    off += take;
  }
  return new TextDecoder().decode(all);
}

/**
 * Opens a client (same as new EventBusClient(url, options)).
 * @param {string | URL} url
 * @param {object} [options]
 */
export function connect(url, options) {
  return new EventBusClient(url, options);
}
