// The client against the real demo daemon (cmd/sessiond).

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { gatedFetch, range, record, sleep, startDaemon } from "./helpers.js";

const EPOCH = /^[0-9a-f]{32}$/;
let d; // a daemon with a short retry:, shared by the tests that need nothing special

before(async () => {
  d = await startDaemon(["-retry", "100ms"]);
});
after(async () => {
  await d?.stop();
});

for (const mode of ["clean", "abort"]) test("live events, then a " + mode + " /disconnect: resumed with no gap and no duplicate", async () => {
  const session = "cut-" + mode;
  const r = record(d.base + "/session/" + session + "/events");
  try {
    await r.until(() => r.client.state === "open", "open");
    for (let i = 1; i <= 3; i++) await d.publish(session, "note", { i });
    await r.until(() => r.ids().length === 3, "3 events");
    const epoch = r.client.epoch;
    assert.match(epoch, EPOCH, "the epoch comes from the Event-Epoch header");
    assert.deepEqual(r.of("event").map((e) => e.epoch), [epoch, epoch, epoch]);
    assert.deepEqual(r.of("event").map((e) => e.data), [{ i: 1 }, { i: 2 }, { i: 3 }]);

    const cut = await d.post("/session/" + session + "/disconnect" + (mode === "abort" ? "?mode=abort" : ""));
    assert.equal(cut.disconnected, 1);
    await r.until(() => r.of("caughtUp").length === 1, "replay_complete after the resume");
    assert.deepEqual(r.of("caughtUp")[0], { replayedCount: 0, lastReplayedEventId: null, lastEventId: null, epoch });
    for (let i = 4; i <= 6; i++) await d.publish(session, "note", { i });
    await r.until(() => r.ids().length === 6, "6 events");
    assert.deepEqual(r.ids(), range(1, 6));
    assert.deepEqual(r.states(), ["connecting", "open", "reconnecting", "open"]);
    assert.equal(r.client.stats.connects, 2);
    assert.equal(r.of("resync").length, 0);
  } finally {
    r.client.close();
  }
  assert.equal(await r.client.done, null);
  assert.equal(r.client.state, "closed");
});

test("429 with Retry-After: the client waits that long, then connects", async () => {
  const dd = await startDaemon(["-retry", "100ms", "-max-subscribers", "1"]);
  const holder = record(dd.base + "/session/full/events");
  let r;
  try {
    await holder.until(() => holder.client.state === "open", "holder open");
    r = record(dd.base + "/session/full/events");
    await r.until(() => r.of("state").some((s) => s.delay !== undefined), "the 429");
    const e = r.of("error")[0];
    assert.equal(e.kind, "http");
    assert.equal(e.status, 429);
    assert.equal(e.code, "subscriber_limit_exceeded");
    assert.equal(e.retryAfter, 5000);
    assert.equal(e.final, false);
    const refusedAt = r.log.find((x) => x.kind === "error").at;
    const wait = r.of("state").find((s) => s.delay !== undefined);
    assert.ok(wait.delay >= 5000 && wait.delay <= 6250, "waits Retry-After plus at most 25%: " + wait.delay);
    holder.client.close();
    await r.until(() => r.client.state === "open", "open after Retry-After", 15_000);
    const openedAt = r.log.findLast((x) => x.kind === "state" && x.v.state === "open").at;
    assert.ok(openedAt - refusedAt >= 4900, "connected " + (openedAt - refusedAt) + " ms after the 429");
    await dd.publish("full", "note", { ok: true });
    await r.until(() => r.ids().length === 1, "an event");
  } finally {
    holder.client.close();
    r?.client.close();
    await dd.stop();
  }
});

test("503 with Retry-After (too many sessions): the client waits it out, then succeeds", async () => {
  const dd = await startDaemon(["-retry", "100ms", "-max-sessions", "1"]);
  try {
    await dd.publish("first", "note", {});
    const r = record(dd.base + "/session/second/events", { initialDelay: 50 });
    try {
      await r.until(() => r.of("error").length >= 2, "two 503s");
      for (const e of r.of("error")) {
        assert.equal(e.status, 503);
        assert.equal(e.code, "too_many_sessions");
        assert.equal(e.retryAfter, 1000, "the daemon says when to come back");
        assert.equal(e.final, false);
      }
      // Retry-After: 1, not the 50 ms backoff: at least a second apart.
      const [a, b] = r.log.filter((x) => x.kind === "error").map((x) => x.at);
      assert.ok(b - a >= 950, "the second attempt came " + (b - a) + " ms after the first 503");
      const waits = r.of("state").filter((s) => s.delay !== undefined).map((s) => s.delay);
      assert.ok(waits.every((w) => w >= 1000 && w <= 1250), "waits of Retry-After plus at most 25%: " + waits);
      assert.equal(await dd.del("first"), 204);
      await r.until(() => r.client.state === "open", "open once a session is free");
      await dd.publish("second", "note", { n: 1 });
      await r.until(() => r.ids().length === 1, "event");
    } finally {
      r.client.close();
    }
  } finally {
    await dd.stop();
  }
});

for (const epochIds of [true, false]) test("a daemon restart (-epoch-ids=" + epochIds + "): epoch_reset (epoch_mismatch) and the new epoch's events from id 1, never a silent join", async () => {
  const flags = ["-retry", "100ms", "-epoch-ids=" + epochIds];
  const dd = await startDaemon(flags);
  const port = dd.port;
  const gate = gatedFetch();
  for (let i = 1; i <= 3; i++) await dd.publish("s", "note", { gen: 1, i });
  // Live only: the client starts after these events and never sees them.
  const r = record(dd.base + "/session/s/events", { fetch: gate.fetch });
  let dd2;
  try {
    await r.until(() => r.client.state === "open", "open");
    await dd.publish("s", "note", { gen: 1, i: 4 });
    await r.until(() => r.ids().length === 1, "event 4");
    assert.deepEqual(r.ids(), [4]);
    const oldEpoch = r.client.epoch;

    gate.close();
    await dd.stop();
    dd2 = await startDaemon(flags, port);
    // The new epoch is already past the client's cursor (4): with plain ids
    // and no epoch a resume would silently join it at id 5.
    for (let i = 1; i <= 6; i++) await dd2.publish("s", "note", { gen: 2, i });
    gate.open();

    await r.until(() => r.of("caughtUp").length === 1, "replay_complete in the new epoch");
    const rs = r.of("resync");
    assert.equal(rs.length, 1);
    assert.equal(rs[0].reason, "epoch_reset");
    assert.equal(rs[0].detail, "epoch_mismatch");
    assert.equal(rs[0].previousEpoch, oldEpoch);
    assert.notEqual(rs[0].epoch, oldEpoch);
    assert.equal(rs[0].lastDeliveredId, 4);
    assert.equal(rs[0].missing, null, "the new ring starts at 1");
    const newEvents = r.of("event").slice(1);
    assert.deepEqual(newEvents.map((e) => e.id), range(1, 6));
    assert.ok(newEvents.every((e) => e.epoch === rs[0].epoch && e.data.gen === 2 && e.replayed));
    assert.equal(r.client.epoch, rs[0].epoch);
    assert.equal(r.client.lastEventId, 6);
    const resumed = new URL(gate.requests.at(-1).url).searchParams;
    assert.equal(resumed.get("lastEventId"), epochIds ? oldEpoch + ":4" : "4", "the cursor in the server's id form");
    assert.equal(resumed.get("epoch"), oldEpoch);
  } finally {
    r.client.close();
    await dd.stop();
    await dd2?.stop();
  }
});

test("a restart whose new epoch is behind the cursor: epoch_reset, ids from 1", async () => {
  const dd = await startDaemon(["-retry", "100ms"]);
  const r = record(dd.base + "/session/s/events");
  let dd2;
  try {
    await r.until(() => r.client.state === "open", "open");
    for (let i = 1; i <= 5; i++) await dd.publish("s", "note", { i });
    await r.until(() => r.ids().length === 5, "5 events");
    await dd.stop();
    dd2 = await startDaemon(["-retry", "100ms"], dd.port);
    await r.until(() => r.of("caughtUp").length === 1, "resumed on the new daemon");
    await dd2.publish("s", "note", { gen: 2 });
    await r.until(() => r.ids().length === 6, "the new epoch's first event");
    assert.deepEqual(r.ids(), [1, 2, 3, 4, 5, 1]);
    assert.equal(r.of("resync")[0].reason, "epoch_reset");
  } finally {
    r.client.close();
    await dd.stop();
    await dd2?.stop();
  }
});

test("eviction of a client that stops reading, then a resume that loses nothing (through the replay budget)", async () => {
  const dd = await startDaemon(["-retry", "100ms"]);
  let paused = null;
  let release;
  const r = record(dd.base + "/session/slow/events", {
    maxQueued: 16,
    onEvent(ev) {
      // Stop reading at the first event until the test lets go: the
      // server's writes block, its queue for this client fills, it evicts.
      if (ev.id === 1 && !paused) {
        paused = new Promise((res) => (release = res));
        return paused;
      }
      return undefined;
    },
  });
  try {
    await r.until(() => r.client.state === "open", "open");
    const payload = "p".repeat(256 * 1024);
    const N = 80; // 20 MiB: more than loopback's socket buffers and the 8 MiB replay budget
    for (let i = 1; i <= N; i++) await dd.publish("slow", "big", { i, payload });
    const st = await dd.status("slow");
    assert.equal(st.body.lastEventId, N);
    release();
    await r.until(() => r.ids().length === N, N + " events", 60_000);
    assert.deepEqual(r.ids(), range(1, N), "every id once, in order");
    assert.ok(r.of("event").every((e) => e.data.payload.length === payload.length));
    const ev = r.of("evicted");
    assert.ok(ev.length >= 1, "evicted");
    assert.match(ev[0].reason, /^queue_(bytes_)?overflow$/);
    assert.equal(r.of("resync").length, 0, "nothing was lost, so nothing to resync");
    assert.ok(r.client.stats.connects >= 3, "evicted, then resumed at least twice (the 8 MiB replay budget): " + r.client.stats.connects);
  } finally {
    release?.();
    r.client.close();
    await dd.stop();
  }
});

test("ring_evicted resync with the exact missing range, then the rest", async () => {
  const dd = await startDaemon(["-retry", "100ms", "-ring", "10"]);
  const gate = gatedFetch();
  const r = record(dd.base + "/session/ring/events", { fetch: gate.fetch });
  try {
    await r.until(() => r.client.state === "open", "open");
    for (let i = 1; i <= 3; i++) await dd.publish("ring", "note", { i });
    await r.until(() => r.ids().length === 3, "3 events");
    gate.close();
    await dd.post("/session/ring/disconnect");
    await r.until(() => r.client.state === "reconnecting", "cut");
    for (let i = 4; i <= 53; i++) await dd.publish("ring", "note", { i });
    gate.open();
    await r.until(() => r.of("caughtUp").length === 1, "caught up");
    const [rs] = r.of("resync");
    assert.equal(rs.reason, "ring_evicted");
    assert.equal(rs.lastDeliveredId, 3);
    assert.equal(rs.earliestAvailableId, 44);
    assert.deepEqual(rs.missing, { from: 4, to: 43 });
    assert.deepEqual(r.ids(), [1, 2, 3, ...range(44, 53)]);
    assert.deepEqual(r.of("caughtUp")[0].replayedCount, 10);
  } finally {
    r.client.close();
    await dd.stop();
  }
});

test("a 1 MiB event arrives whole", async () => {
  const r = record(d.base + "/session/big/events");
  try {
    await r.until(() => r.client.state === "open", "open");
    let s = "";
    for (let i = 0; s.length < 1 << 20; i++) s += "0123456789abcdef\u00e9\u4e16" + i;
    await d.publish("big", "blob", { s });
    await r.until(() => r.ids().length === 1, "the event");
    assert.equal(r.of("event")[0].data.s, s);
  } finally {
    r.client.close();
  }
});

test("application data is never control: an epoch in data; a synthetic frame's type is refused at publish", async () => {
  const r = record(d.base + "/session/app/events", { lastEventId: 0 });
  try {
    await r.until(() => r.of("caughtUp").length === 1, "caught up");
    const epoch = r.client.epoch;
    const fake = "f".repeat(32);
    await d.publish("app", "note", { epoch: fake });
    // The daemon refuses the types of the synthetic frames (SPEC 5.2), so
    // no event named like one reaches a client; scripted servers cover a
    // client reading one anyway (client.test.js).
    for (const [type, data] of [
      ["replay_complete", { replayedCount: 9, epoch: fake }],
      ["state_resync_required", { reason: "epoch_reset", epoch: fake, earliestAvailableId: 1 }],
      ["slow_client_warning", { queueSize: 1 }],
      ["client_evicted", { reason: "queue_overflow" }],
      ["stream_error", { error: "x", errorKind: "revoked" }],
    ]) {
      const res = await d.post("/session/app/events", { type, data });
      assert.equal(res.code, "invalid_event", type);
      assert.match(res.error, /reserved/, type);
    }
    await d.publish("app", "note", {});
    await r.until(() => r.ids().length === 2, "2 events");
    assert.deepEqual(r.ids(), [1, 2]);
    assert.deepEqual(r.of("event").map((e) => e.type), ["note", "note"]);
    assert.equal(r.client.epoch, epoch);
    assert.equal(r.of("caughtUp").length, 1);
    assert.equal(r.of("resync").length, 0);
    assert.equal(r.of("evicted").length, 0);
    assert.equal(r.client.state, "open");
    assert.equal(r.client.stats.connects, 1);
  } finally {
    r.client.close();
  }
});

test("400 is final: no retry", async () => {
  // Not valid UTF-8: the session id rule refuses it (docs/SPEC.md section 7).
  const r = record(d.base + "/session/a%FF/events");
  const err = await r.client.done;
  assert.equal(err.status, 400);
  assert.equal(err.code, "invalid_session_id");
  assert.equal(err.final, true);
  assert.equal(r.of("error").length, 1);
  assert.deepEqual(r.states(), ["connecting", "closed"]);
  await sleep(200);
  assert.equal(r.of("error").length, 1);
});

test("?maxQueued= and ?types= reach the server; a filtered stream's ids are not contiguous", async () => {
  const r = record(d.base + "/session/filt/events", { filter: ["keep", "plugin.*"], maxQueued: 32, lastEventId: 0 });
  try {
    await r.until(() => r.of("caughtUp").length === 1, "caught up");
    await d.publish("filt", "keep", {});
    await d.publish("filt", "drop", {});
    await d.publish("filt", "plugin.x", {});
    await r.until(() => r.ids().length === 2, "2 events");
    assert.deepEqual(r.ids(), [1, 3]);
    assert.equal(r.of("resync").length, 0, "a gap of a filtered stream is no resync");
  } finally {
    r.client.close();
  }
});
