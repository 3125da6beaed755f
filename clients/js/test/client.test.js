// The client against scripted servers: the cases the demo daemon cannot
// produce on demand (an abrupt socket reset, auth answers, stream_error
// kinds, silence, a server that ignores the cursor), and the EventSource
// transport.

import assert from "node:assert/strict";
import { test } from "node:test";
import { EventBusClient, parseEventId, parseRetryAfter } from "../index.js";
import { FakeEventSource } from "./fake-eventsource.js";
import { EPOCH_A, EPOCH_B, ev, jsonError, open, range, record, scripted, sleep, syn } from "./helpers.js";

test("an abrupt cut (TCP reset mid-stream): resumed from the cursor, no gap, no duplicate", async () => {
  const srv = await scripted((req, res, n) => {
    open(res);
    const after = Number(new URL(req.url, "http://x").searchParams.get("lastEventId") ?? 0);
    if (n > 1) res.write(syn("replay_complete", { replayedCount: 0, epoch: EPOCH_A }));
    for (let i = after + 1; i <= after + 3; i++) res.write(ev(i));
    if (n === 1) {
      // Half an event, then a reset, as a failing load balancer would.
      res.write("id: 4\nevent: note\ndata: {\"id\":4,");
      setTimeout(() => res.socket.resetAndDestroy(), 30);
    }
  });
  const r = record(srv.base + "/s/events");
  try {
    await r.until(() => r.ids().length === 6, "6 events");
    assert.deepEqual(r.ids(), range(1, 6));
    assert.equal(srv.requests[1].url.searchParams.get("lastEventId"), "3");
    assert.equal(srv.requests[1].url.searchParams.get("epoch"), EPOCH_A);
    const cut = r.of("error")[0];
    assert.equal(cut.kind, "network");
    assert.equal(cut.final, false);
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("404 session_not_found stops at once and says so", async () => {
  const srv = await scripted((req, res) => jsonError(res, 404, "session_not_found"));
  const r = record(srv.base + "/s/events");
  const err = await r.client.done;
  assert.equal(err.status, 404);
  assert.equal(err.code, "session_not_found");
  assert.equal(err.final, true);
  await sleep(100);
  assert.equal(srv.requests.length, 1);
  assert.deepEqual(r.states(), ["connecting", "closed"]);
  await srv.close();
});

test("Retry-After as an HTTP date; 500 and other 5xx back off and retry", async () => {
  assert.equal(parseRetryAfter("7"), 7000);
  assert.equal(parseRetryAfter(new Date(Date.now() + 3000).toUTCString()) > 1000, true);
  assert.equal(parseRetryAfter("Wed, 21 Oct 2015 07:28:00 GMT"), 0);
  assert.equal(parseRetryAfter("soon"), undefined);
  const srv = await scripted((req, res, n) => {
    if (n === 1) return jsonError(res, 503, "shutting_down", { "Retry-After": new Date(Date.now() + 3000).toUTCString() });
    if (n === 2) return jsonError(res, 500, "internal");
    if (n === 3) return jsonError(res, 502, "bad_gateway");
    open(res);
    res.write(ev(1));
  });
  const r = record(srv.base + "/s/events", { initialDelay: 50 });
  try {
    await r.until(() => r.ids().length === 1, "event after three failures");
    assert.deepEqual(r.of("error").map((e) => e.status), [503, 500, 502]);
    const t = srv.requests.map((q) => q.at);
    // An HTTP date has whole seconds: 2 to 3 s from now, plus up to 25%.
    assert.ok(t[1] - t[0] >= 1900, "after the Retry-After date: " + (t[1] - t[0]));
    const delays = r.of("state").filter((s) => s.delay !== undefined).map((s) => s.delay);
    assert.ok(delays[0] >= 1900 && delays[0] <= 3750, "Retry-After delay " + delays[0]);
    assert.ok(delays[1] < 100 && delays[2] < 200, "full jitter under 50 ms * 2^k: " + delays);
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("401: credentials are asked once; a second 401 is final", async () => {
  const srv = await scripted((req, res) => jsonError(res, 401, "unauthorized"));
  const asked = [];
  const r = record(srv.base + "/s/events", {
    credentials: (q) => {
      asked.push(q);
      return { token: "t" + asked.length };
    },
  });
  const err = await r.client.done;
  assert.equal(err.status, 401);
  assert.equal(err.final, true);
  assert.deepEqual(asked, [{ reason: "initial", status: undefined }, { reason: "unauthorized", status: 401 }]);
  assert.deepEqual(srv.requests.map((q) => q.headers.authorization), ["Bearer t1", "Bearer t2"]);
  await srv.close();
});

test("403 then fresh credentials that work; 401 without a credentials callback is final", async () => {
  const srv = await scripted((req, res) => {
    if (req.headers["x-token"] !== "good") return jsonError(res, 403, "forbidden");
    open(res);
    res.write(ev(1));
  });
  const r = record(srv.base + "/s/events", {
    credentials: ({ reason }) => ({ headers: { "X-Token": reason === "initial" ? "stale" : "good" } }),
  });
  try {
    await r.until(() => r.ids().length === 1, "event with the fresh token");
    assert.equal(r.of("error")[0].status, 403);
  } finally {
    r.client.close();
    await srv.close();
  }
  const srv2 = await scripted((req, res) => jsonError(res, 401, "unauthorized"));
  const err = await new EventBusClient(srv2.base + "/s/events").done;
  assert.equal(err.status, 401);
  assert.equal(srv2.requests.length, 1);
  await srv2.close();
});

test("stream_error reauthenticate: fresh credentials, an immediate reconnect, resumed from the cursor", async () => {
  const srv = await scripted((req, res, n) => {
    open(res, { retry: 5000 }); // a backoff would take seconds: the reconnect must not wait for it
    if (n === 1) {
      res.write(ev(1) + ev(2));
      res.end(syn("stream_error", { error: "token expired", errorKind: "reauthenticate" }));
      return;
    }
    res.write(ev(3));
  });
  let token = 0;
  const r = record(srv.base + "/s/events", { credentials: () => ({ token: "v" + ++token }) });
  try {
    await r.until(() => r.ids().length === 3, "3 events");
    const [a, b] = srv.requests;
    assert.equal(a.headers.authorization, "Bearer v1");
    assert.equal(b.headers.authorization, "Bearer v2");
    assert.equal(b.url.searchParams.get("lastEventId"), "2");
    assert.ok(b.at - a.at < 1000, "immediate: " + (b.at - a.at) + " ms");
    const e = r.of("error")[0];
    assert.equal(e.kind, "stream_error");
    assert.equal(e.errorKind, "reauthenticate");
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("stream_error revoked: one reconnect with fresh credentials; a 403 then is final", async () => {
  const srv = await scripted((req, res, n) => {
    if (n === 1) {
      open(res);
      res.write(ev(1));
      res.end(syn("stream_error", { error: "access revoked", errorKind: "revoked" }));
      return;
    }
    jsonError(res, 403, "forbidden");
  });
  const reasons = [];
  const r = record(srv.base + "/s/events", {
    credentials: ({ reason }) => {
      reasons.push(reason);
      return { token: reason };
    },
  });
  const err = await r.client.done;
  assert.equal(err.status, 403);
  assert.equal(err.final, true);
  assert.deepEqual(reasons, ["initial", "revoked"]);
  assert.equal(srv.requests.length, 2);
  assert.equal(srv.requests[1].headers.authorization, "Bearer revoked");
  await srv.close();
});

test("stream_error unavailable and internal, and client_evicted: reconnect with backoff and resume", async () => {
  const srv = await scripted((req, res, n) => {
    open(res, { retry: 40 });
    res.write(ev(n));
    if (n === 1) res.end(syn("stream_error", { error: "backplane unreachable", errorKind: "unavailable" }));
    else if (n === 2) res.end(syn("stream_error", { error: "boom", errorKind: "internal" }));
    else if (n === 3) res.end(syn("client_evicted", { reason: "queue_overflow", droppedAfter: 4, queueSize: 16, maxQueued: 16, queuedBytes: 100, maxQueuedBytes: 2097152 }));
  });
  const r = record(srv.base + "/s/events");
  try {
    await r.until(() => r.ids().length === 4, "4 events");
    assert.deepEqual(r.ids(), [1, 2, 3, 4]);
    assert.deepEqual(r.of("error").map((e) => e.errorKind), ["unavailable", "internal"]);
    assert.equal(r.of("evicted")[0].droppedAfter, 4);
    // retry: 40 is the base; each short connection doubles the cap.
    const delays = r.of("state").filter((s) => s.delay !== undefined).map((s) => s.delay);
    assert.equal(delays.length, 3);
    delays.forEach((d, i) => assert.ok(d < 40 * 2 ** i, "delay " + i + ": " + d));
    assert.deepEqual(srv.requests.slice(1).map((q) => q.url.searchParams.get("lastEventId")), ["1", "2", "3"]);
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("a silent connection (no heartbeat) is dropped after idleTimeout and resumed", async () => {
  const srv = await scripted((req, res, n) => {
    open(res);
    res.write(ev(n));
    // then nothing, not even a heartbeat
  });
  const r = record(srv.base + "/s/events", { idleTimeout: 150 });
  try {
    await r.until(() => r.ids().length === 2, "2 events");
    assert.equal(r.of("error")[0].kind, "idle_timeout");
    assert.equal(srv.requests[1].url.searchParams.get("lastEventId"), "1");
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("heartbeats keep a quiet connection alive", async () => {
  let beat;
  const srv = await scripted((req, res) => {
    open(res);
    beat = setInterval(() => res.write(": heartbeat\n\n"), 40);
    res.on("close", () => clearInterval(beat));
  });
  const r = record(srv.base + "/s/events", { idleTimeout: 200 });
  try {
    await r.until(() => r.client.state === "open", "open");
    await sleep(600);
    assert.equal(srv.requests.length, 1);
    assert.equal(r.of("error").length, 0);
  } finally {
    r.client.close();
    clearInterval(beat);
    await srv.close();
  }
});

test("duplicates are dropped by id within an epoch (a server that ignores the cursor)", async () => {
  const srv = await scripted((req, res, n) => {
    open(res);
    for (let i = 1; i <= 2 + n; i++) res.write(ev(i));
    if (n < 3) res.end();
  });
  const r = record(srv.base + "/s/events");
  try {
    await r.until(() => r.ids().length === 5, "5 events");
    await sleep(50);
    assert.deepEqual(r.ids(), [1, 2, 3, 4, 5]);
    assert.equal(r.client.stats.duplicates, 3 + 4);
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("events named like synthetic frames (from another or an older server) stay events; an epoch in data is data", async () => {
  const fake = "f".repeat(32);
  const srv = await scripted((req, res) => {
    open(res, { epoch: EPOCH_A });
    res.write(syn("replay_complete", { replayedCount: 0, epoch: EPOCH_A }));
    res.write(ev(1, "note", { epoch: fake }));
    res.write(ev(2, "replay_complete", { replayedCount: 9, epoch: fake }));
    res.write(ev(3, "state_resync_required", { reason: "epoch_reset", epoch: fake, earliestAvailableId: 1 }));
    res.write(ev(4, "client_evicted", { reason: "queue_overflow" }));
    res.write(ev(5, "stream_error", { error: "x", errorKind: "revoked" }));
  });
  const r = record(srv.base + "/s/events", { lastEventId: 0 });
  try {
    await r.until(() => r.ids().length === 5, "5 events");
    assert.deepEqual(r.of("event").map((e) => e.type), ["note", "replay_complete", "state_resync_required", "client_evicted", "stream_error"]);
    assert.equal(r.client.epoch, EPOCH_A);
    assert.equal(r.of("caughtUp").length, 1);
    assert.equal(r.of("resync").length, 0);
    assert.equal(r.of("evicted").length, 0);
    assert.equal(r.client.state, "open");
    assert.equal(srv.requests.length, 1);
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("epoch ids on the wire: the cursor goes back in the same form, with the epoch", async () => {
  const srv = await scripted((req, res, n) => {
    open(res, { epoch: EPOCH_A });
    const from = n === 1 ? 1 : 3;
    if (n > 1) res.write(syn("replay_complete", { replayedCount: 0, epoch: EPOCH_A }));
    for (let i = from; i < from + 2; i++) res.write(ev(i, "note", {}, EPOCH_A + ":" + i));
    if (n === 1) res.end();
  });
  const r = record(srv.base + "/s/events");
  try {
    await r.until(() => r.ids().length === 4, "4 events");
    assert.equal(srv.requests[1].url.searchParams.get("lastEventId"), EPOCH_A + ":2");
    assert.equal(srv.requests[1].url.searchParams.get("epoch"), EPOCH_A);
    assert.ok(r.of("event").every((e) => e.epoch === EPOCH_A));
  } finally {
    r.client.close();
    await srv.close();
  }
  assert.deepEqual(parseEventId(EPOCH_A + ":007"), { epoch: EPOCH_A, id: 7 });
  assert.deepEqual(parseEventId("9007199254740991"), { epoch: null, id: 9007199254740991 });
  for (const bad of ["", "9007199254740992", "-1", " 1", "1 ", "+1", "A".repeat(32) + ":1", "a".repeat(31) + ":1", EPOCH_A + ":", ":1", EPOCH_A + ":1:2"]) {
    assert.equal(parseEventId(bad), null, JSON.stringify(bad));
  }
});

test("an initial cursor in epoch form; a new epoch without epoch_reset is a reset the client reports itself", async () => {
  const srv = await scripted((req, res) => {
    // A server that ignores the epoch it is sent and joins numerically.
    open(res, { epoch: EPOCH_B });
    res.write(ev(8) + ev(9));
  });
  const r = record(srv.base + "/s/events", { lastEventId: EPOCH_A + ":7" });
  try {
    await r.until(() => r.ids().length === 2, "2 events");
    assert.equal(srv.requests[0].url.searchParams.get("lastEventId"), EPOCH_A + ":7");
    assert.equal(srv.requests[0].url.searchParams.get("epoch"), EPOCH_A);
    const [rs] = r.of("resync");
    assert.deepEqual(
      { reason: rs.reason, detail: rs.detail, previousEpoch: rs.previousEpoch, epoch: rs.epoch, lastDeliveredId: rs.lastDeliveredId, missing: rs.missing },
      { reason: "epoch_reset", detail: "epoch_changed", previousEpoch: EPOCH_A, epoch: EPOCH_B, lastDeliveredId: 7, missing: { from: 1, to: 7 } },
    );
    assert.deepEqual(r.of("event").map((e) => [e.id, e.epoch]), [[8, EPOCH_B], [9, EPOCH_B]]);
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("cursor_invalid (the server could not use the cursor): reported as the other resyncs, missing from the client's cursor; then live", async () => {
  const srv = await scripted((req, res) => {
    open(res, { retry: 5000 });
    // Live only, said first: no replay, no replay_complete.
    res.write(syn("state_resync_required", { reason: "cursor_invalid", lastDeliveredId: 0, earliestAvailableId: 6, epoch: EPOCH_A }));
    res.write(ev(6) + ev(7));
  });
  const r = record(srv.base + "/s/events", { lastEventId: EPOCH_A + ":2" });
  try {
    await r.until(() => r.ids().length === 2, "2 live events");
    const [rs] = r.of("resync");
    assert.deepEqual(
      { reason: rs.reason, lastDeliveredId: rs.lastDeliveredId, earliestAvailableId: rs.earliestAvailableId, epoch: rs.epoch, missing: rs.missing },
      { reason: "cursor_invalid", lastDeliveredId: 0, earliestAvailableId: 6, epoch: EPOCH_A, missing: { from: 3, to: 5 } },
    );
    assert.equal(r.of("resync").length, 1);
    assert.deepEqual(r.ids(), [6, 7]);
    assert.equal(r.of("caughtUp").length, 0);
    assert.equal(r.client.stats.resyncs, 1);
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("resync under the overflow policy: missing starts after what the client holds; replay_budget_exceeded resumes at once", async () => {
  const srv = await scripted((req, res, n) => {
    open(res, { retry: 5000 });
    if (n === 1) {
      res.write(ev(1) + ev(2) + ev(3));
      // The server's lastDeliveredId (1) is behind what the client holds (3).
      res.write(syn("state_resync_required", { reason: "queue_overflow", lastDeliveredId: 1, earliestAvailableId: 6, epoch: EPOCH_A }));
      res.write(ev(6));
      // A resync whose range the client already holds is not reported.
      res.write(syn("state_resync_required", { reason: "queue_overflow", lastDeliveredId: 0, earliestAvailableId: 7, epoch: EPOCH_A }));
      res.write(ev(7) + ev(8));
      res.write(syn("state_resync_required", { reason: "replay_budget_exceeded", lastDeliveredId: 8, earliestAvailableId: 9, epoch: EPOCH_A }));
      res.write(syn("replay_complete", { replayedCount: 3, lastReplayedEventId: 8, lastEventId: 8, epoch: EPOCH_A }));
      res.write(ev(20)); // live, past the part not replayed: must not be delivered
      return;
    }
    res.write(ev(9) + ev(10));
    res.write(syn("replay_complete", { replayedCount: 2, lastReplayedEventId: 10, lastEventId: 10, epoch: EPOCH_A }));
  });
  const r = record(srv.base + "/s/events", { lastEventId: 0 });
  try {
    await r.until(() => r.of("caughtUp").length === 1, "caught up");
    assert.deepEqual(r.ids(), [1, 2, 3, 6, 7, 8, 9, 10]);
    assert.deepEqual(r.of("resync").map((x) => x.missing), [{ from: 4, to: 5 }]);
    assert.equal(srv.requests[1].url.searchParams.get("lastEventId"), "8");
    assert.ok(srv.requests[1].at - srv.requests[0].at < 1000, "no backoff after a budget cut");
    assert.equal(r.of("caughtUp")[0].replayedCount, 2);
    assert.equal(r.of("error").length, 0);
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("signals, slow warnings, and a throwing callback that does not stop the client", async () => {
  const srv = await scripted((req, res) => {
    open(res);
    res.write(ev(1));
    res.write('event: doc_changed\ndata: {"v":1,"type":"doc_changed","about":"doc/7","_meta":{"serverTimestamp":5}}\n\n');
    // A signal is classified by its envelope, whatever its type: even a
    // synthetic frame's name, which a server of this version refuses (SPEC
    // 5.2) but another server could send.
    res.write('event: replay_complete\ndata: {"v":1,"type":"replay_complete","about":"x","_meta":{"serverTimestamp":6}}\n\n');
    res.write(syn("slow_client_warning", { queueSize: 12, maxQueued: 16, lastEventId: 1, queuedBytes: 10, maxQueuedBytes: 100, threshold: "frames" }));
    res.write(ev(2));
    res.write("data: not json\n\n");
    res.write(ev(3));
  });
  const r = record(srv.base + "/s/events", {
    onEvent(e) {
      if (e.id === 2) throw new Error("app bug");
    },
  });
  try {
    await r.until(() => r.ids().length === 3, "3 events");
    assert.deepEqual(r.of("signal").map((s) => [s.type, s.about, s.serverTimestamp]), [["doc_changed", "doc/7", 5], ["replay_complete", "x", 6]]);
    assert.equal(r.of("caughtUp").length, 0);
    assert.equal(r.of("slow")[0].queueSize, 12);
    assert.deepEqual(r.of("error").map((e) => e.kind), ["callback", "protocol"]);
    assert.equal(srv.requests.length, 1);
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("an event above maxEventBytes is final; a 200 that is not an event stream is final", async () => {
  const srv = await scripted((req, res) => {
    if (req.url.startsWith("/html")) {
      res.writeHead(200, { "Content-Type": "text/html" });
      res.end("<html>");
      return;
    }
    open(res);
    res.write(ev(1, "big", { s: "x".repeat(5000) }));
  });
  const r = record(srv.base + "/s/events", { maxEventBytes: 4096 });
  const err = await r.client.done;
  assert.equal(err.kind, "event_too_large");
  assert.equal(err.final, true);
  const err2 = await new EventBusClient(srv.base + "/html").done;
  assert.equal(err2.kind, "content_type");
  assert.equal(srv.requests.length, 2);
  await srv.close();
});

test("a promise from onEvent holds the reading (backpressure), and close() during it ends cleanly", async () => {
  const srv = await scripted((req, res) => {
    open(res);
    res.write(ev(1) + ev(2));
  });
  let resolve;
  const r = record(srv.base + "/s/events", {
    onEvent: (e) => (e.id === 1 ? new Promise((res) => (resolve = res)) : undefined),
  });
  await r.until(() => r.ids().length === 1, "event 1");
  await sleep(50);
  assert.deepEqual(r.ids(), [1], "event 2 waits for the promise");
  resolve();
  await r.until(() => r.ids().length === 2, "event 2");
  r.client.close();
  assert.equal(await r.client.done, null);
  await srv.close();
});

test("options are validated", () => {
  assert.throws(() => new EventBusClient("http://x/", { maxQueued: 15 }), RangeError);
  assert.throws(() => new EventBusClient("http://x/", { maxQueued: 2049 }), RangeError);
  assert.throws(() => new EventBusClient("http://x/", { lastEventId: "1x" }), RangeError);
  assert.throws(() => new EventBusClient("http://x/", { lastEventId: EPOCH_A + ":1", epoch: EPOCH_B }), RangeError);
  assert.throws(() => new EventBusClient("http://x/", { epoch: "E" }), RangeError);
  assert.throws(() => new EventBusClient("http://x/", { initialDelay: -1 }), RangeError);
  assert.throws(() => new EventBusClient("http://x/", { filter: ["a,b"] }), TypeError);
  assert.throws(() => new EventBusClient("http://x/", { transport: "ws" }), RangeError);
  assert.throws(() => new EventBusClient("http://x/", { transport: "eventsource" }), TypeError, "no EventSource in Node");
});

test("EventSource transport: named types, its own reconnects with ?lastEventId=, the epoch from a HEAD", async () => {
  FakeEventSource.instances = [];
  const srv = await scripted((req, res, n) => {
    if (req.method === "HEAD") {
      res.writeHead(200, { "Content-Type": "text/event-stream", "Event-Epoch": EPOCH_A });
      res.end();
      return;
    }
    open(res, { epoch: EPOCH_A });
    const after = Number(new URL(req.url, "http://x").searchParams.get("lastEventId") ?? 0);
    if (after) res.write(syn("replay_complete", { replayedCount: 0, epoch: EPOCH_A }));
    res.write(ev(after + 1, "note") + ev(after + 2, "unlisted") + ev(after + 3, "note"));
    if (n < 3) setTimeout(() => res.end(), 50);
  });
  const r = record(srv.base + "/s/events", { EventSource: FakeEventSource, eventTypes: ["note"] });
  try {
    await r.until(() => r.ids().length >= 4 && r.of("caughtUp").length >= 1, "events over two connections");
    assert.deepEqual(r.ids().slice(0, 4), [1, 3, 4, 6], "an EventSource never sees a type it does not listen for");
    assert.equal(r.client.epoch, EPOCH_A, "learned from the HEAD: an EventSource cannot read Event-Epoch");
    const gets = srv.requests.filter((q) => q.method === "GET");
    assert.equal(gets[1].url.searchParams.get("lastEventId"), "3");
    assert.equal(gets[1].url.searchParams.get("epoch"), EPOCH_A);
    assert.equal(gets[1].headers["last-event-id"], undefined, "a new EventSource, not the old one's own reconnect");
    assert.ok(FakeEventSource.instances.every((es) => es.requests === 1), "the client closes each EventSource at its first error");
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("EventSource transport: a refusal it cannot explain is retried with fetch, which sees the 429's Retry-After", async () => {
  FakeEventSource.instances = [];
  let gets = 0;
  const srv = await scripted((req, res) => {
    if (req.method === "HEAD") {
      // As the handler does: the stream's headers, a HEAD takes no slot.
      res.writeHead(200, { "Content-Type": "text/event-stream", "Event-Epoch": EPOCH_A });
      return res.end();
    }
    gets++;
    if (gets <= 2) return jsonError(res, 429, "subscriber_limit_exceeded", { "Retry-After": "1" });
    open(res, { epoch: EPOCH_A });
    res.write(ev(1, "note", {}, EPOCH_A + ":1"));
  });
  const r = record(srv.base + "/s/events", { EventSource: FakeEventSource, eventTypes: ["note"] });
  try {
    await r.until(() => r.ids().length === 1, "event");
    const [first, second] = r.of("error");
    assert.equal(first.kind, "network", "the EventSource only says it failed");
    assert.equal(second.status, 429, "fetch sees the status");
    const g = srv.requests.filter((q) => q.method === "GET");
    assert.ok(g[2].at - g[1].at >= 950, "waited for Retry-After");
    assert.equal(srv.requests.filter((q) => q.method === "HEAD").length, 1, "one HEAD: its epoch is kept for the next EventSource");
    assert.equal(FakeEventSource.instances.length, 2, "EventSource, fetch, then EventSource again");
    assert.equal(r.client.epoch, EPOCH_A);
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("auto transport: fetch when headers are needed (options or credentials) or the event types are unknown", async () => {
  globalThis.EventSource = FakeEventSource;
  FakeEventSource.instances = [];
  const srv = await scripted((req, res) => {
    open(res);
    res.write(ev(1));
  });
  try {
    const types = { eventTypes: ["note"] };
    for (const opts of [{}, { headers: { "X-A": "1" } }, { credentials: () => ({ token: "t" }), ...types }, { credentials: () => ({ headers: { "X-A": "1" } }), ...types }, { filter: ["plugin.*"] }]) {
      const r = record(srv.base + "/s/events", opts);
      await r.until(() => r.ids().length === 1, "event");
      r.client.close();
    }
    assert.equal(FakeEventSource.instances.length, 0);
    const r = record(srv.base + "/s/events", { filter: ["note"] });
    await r.until(() => r.ids().length === 1, "event");
    r.client.close();
    assert.equal(FakeEventSource.instances.length, 1, "an exact filter names the types");
    // A credentials callback that returns no headers (a cookie session that
    // renews its cookie in it) keeps the EventSource.
    const asked = [];
    const c = record(srv.base + "/s/events", { credentials: ({ reason }) => (asked.push(reason), null), ...types });
    await c.until(() => c.ids().length === 1, "event");
    c.client.close();
    assert.equal(FakeEventSource.instances.length, 2, "the cookie session's callback returned no headers: EventSource");
    assert.deepEqual(asked, ["initial"]);
  } finally {
    delete globalThis.EventSource;
    await srv.close();
  }
});
