// Several sessions on one stream (options.sessions, the daemon's GET
// /events?session=...): the composite cursor's codec with its test
// vectors, and the client against the demo daemon and scripted servers.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { EventBusClient, epochTag, formatCursor, parseCursor, sessionTag } from "../index.js";
import { FakeEventSource } from "./fake-eventsource.js";
import { EPOCH_A, EPOCH_B, gatedFetch, range, record, scripted, startDaemon } from "./helpers.js";

const EPOCH = /^[0-9a-f]{32}$/;

test("the cursor's test vectors and strict parsing", () => {
  assert.equal(sessionTag(""), 0xcbf29ce484);
  assert.equal(sessionTag("a"), 0xaf63dc4c86);
  assert.equal(sessionTag("foobar"), 0x85944171f7);
  assert.equal(sessionTag("é"), sessionTag("\u00e9"), "UTF-8 bytes");
  assert.notEqual(sessionTag("é"), sessionTag("e\u0301"));
  assert.equal(epochTag("0123456789abcdef0123456789abcdef"), 0x0123456789ab);
  const token = "m1r2PcTIYBI0VniasAAAAAAAAq";
  assert.equal(formatCursor([{ session: 0xaf63dc4c86, epoch: 0x0123456789ab, id: 42 }]), token);
  assert.deepEqual(parseCursor(token), [{ session: 0xaf63dc4c86, epoch: 0x0123456789ab, id: 42 }]);
  const max = [{ session: 2 ** 40 - 1, epoch: 2 ** 48 - 1, id: Number.MAX_SAFE_INTEGER }, { session: 0, epoch: 0, id: 0 }];
  const c = formatCursor(max);
  assert.equal(c.length, 2 + 24 * 2);
  assert.match(c, /^[A-Za-z0-9_-]+$/);
  assert.deepEqual(parseCursor(c), max);
  // A group whose 7 id bytes say 2^53: one above the largest id.
  const tooBig = "m1" + Buffer.from([...new Array(11).fill(0), 0x20, 0, 0, 0, 0, 0, 0]).toString("base64url");
  assert.equal(tooBig.length, 26);
  for (const bad of ["", "7", EPOCH_A + ":7", "m1", "m2" + token.slice(2), token.slice(0, -1), token.slice(0, -1) + "!", token + "A", tooBig]) {
    assert.equal(parseCursor(bad), null, JSON.stringify(bad));
  }
  assert.throws(() => formatCursor([]), RangeError);
  assert.throws(() => formatCursor([{ session: 2 ** 40, epoch: 0, id: 0 }]), RangeError);
  assert.throws(() => formatCursor([{ session: 0, epoch: 0, id: 2 ** 53 }]), RangeError);
});

test("options: sessions are 1 to 256 distinct non-empty strings; lastEventId is a composite cursor; no epoch", () => {
  const f = () => Promise.reject(new Error("no network in this test"));
  for (const sessions of [[], [""], ["a", "a"], "a", [1], Array.from({ length: 257 }, (_, i) => "s" + i)]) {
    assert.throws(() => new EventBusClient("http://x/events", { sessions, fetch: f }), TypeError, JSON.stringify(sessions).slice(0, 40));
  }
  assert.throws(() => new EventBusClient("http://x/events", { sessions: ["a"], lastEventId: "5", fetch: f }), RangeError);
  assert.throws(() => new EventBusClient("http://x/events", { sessions: ["a"], epoch: EPOCH_A, fetch: f }), RangeError);
  const c = new EventBusClient("http://x/events?session=old&types=a", { sessions: ["a", "b"], lastEventId: "m1r2PcTIYBI0VniasAAAAAAAAq", fetch: f });
  assert.deepEqual(c.sessions, ["a", "b"]);
  assert.deepEqual(c.session("a"), { lastEventId: 42, epoch: null }, "its tag only, until the server confirms it");
  assert.equal(c.session("b"), null);
  assert.equal(c.lastEventId, "m1r2PcTIYBI0VniasAAAAAAAAq");
  assert.equal(c.epoch, null);
  c.close();
});

let d; // a daemon with a short retry:
before(async () => {
  d = await startDaemon(["-retry", "100ms"]);
});
after(async () => {
  await d?.stop();
});

const bySession = (events) => {
  const out = {};
  for (const e of events) (out[e.session] ??= []).push(e.id);
  return out;
};

for (const transport of ["fetch", "eventsource"]) test("three sessions on one stream (" + transport + "): live, a /disconnect, each session resumed exactly from the composite cursor", async () => {
  const ids = ["m-" + transport + "-a", "m-" + transport + "-b", "m-" + transport + "-c"];
  for (const id of ids) await d.publish(id, "note", { before: true }); // not delivered: live start
  const gate = gatedFetch();
  // The EventSource's own requests wait at the same gate.
  const opened = [];
  class GatedEventSource extends FakeEventSource {
    async _connect() {
      await gate.wait();
      opened.push(this.url);
      return super._connect();
    }
  }
  const r = record(d.base + "/events", {
    sessions: ids,
    fetch: gate.fetch,
    transport,
    EventSource: GatedEventSource,
    eventTypes: ["note"],
  });
  try {
    await r.until(() => r.client.state === "open", "open");
    await d.publish(ids[0], "note", { n: 2 });
    await r.until(() => r.ids().length === 1, "a#2");
    const ev = r.of("event")[0];
    assert.equal(ev.session, ids[0]);
    assert.match(ev.epoch, EPOCH);
    assert.equal(ev.epoch, (await d.status(ids[0])).body.epoch);
    assert.deepEqual(r.client.session(ids[1]), { lastEventId: 1, epoch: (await d.status(ids[1])).body.epoch }, "b's live position from the cursor");

    gate.close();
    await d.post("/session/" + ids[1] + "/disconnect"); // cuts the whole stream
    await r.until(() => r.states().at(-1) === "reconnecting", "cut");
    await d.publish(ids[1], "note", { n: 2 });
    await d.publish(ids[0], "note", { n: 3 });
    await d.publish(ids[2], "note", { n: 2 });
    const cursor = r.client.lastEventId;
    gate.open();
    await r.until(() => r.of("caughtUp").length === 3 && r.ids().length === 4, "three catch-ups");
    assert.deepEqual(bySession(r.of("event")), { [ids[0]]: [2, 3], [ids[1]]: [2], [ids[2]]: [2] });
    assert.deepEqual(new Set(r.of("caughtUp").map((c) => c.session)), new Set(ids));
    for (const c of r.of("caughtUp")) assert.equal(c.epoch, (await d.status(c.session)).body.epoch);
    const entries = parseCursor(cursor);
    assert.equal(entries.length, 3);
    const urls = transport === "fetch" ? gate.requests.filter((q) => (q.init?.method ?? "GET") === "GET").map((q) => q.url) : opened;
    const resumed = new URL(urls.at(-1));
    assert.deepEqual(resumed.searchParams.getAll("session"), ids);
    assert.equal(resumed.searchParams.get("lastEventId"), cursor);
    assert.equal(resumed.searchParams.get("epoch"), null);
    assert.equal(r.of("resync").length, 0);
    assert.equal(r.of("event").filter((e) => e.replayed).length, 3);
  } finally {
    r.client.close();
  }
});

test("a kill -9 and a restart: every session reports epoch_reset and resumes from its new epoch", async () => {
  const dd = await startDaemon(["-retry", "100ms"]);
  const port = dd.port;
  const ids = ["k1", "k2", "k3"];
  for (const id of ids) await dd.publish(id, "note", {});
  const gate = gatedFetch();
  const r = record(dd.base + "/events", { sessions: ids, fetch: gate.fetch });
  let dd2;
  try {
    await r.until(() => r.client.state === "open", "open");
    for (const id of ids) await dd.publish(id, "note", {});
    await r.until(() => r.ids().length === 3, "3 events");
    const old = Object.fromEntries(r.of("event").map((e) => [e.session, e.epoch]));
    gate.close();
    await dd.kill();
    dd2 = await startDaemon(["-retry", "100ms"], port);
    await dd2.publish("k2", "note", { gen: 2 }); // k1 and k3 are made by the stream (-create-on-stream)
    gate.open();
    await r.until(() => r.of("caughtUp").length === 3, "three catch-ups");
    const rs = r.of("resync");
    assert.equal(rs.length, 3);
    for (const x of rs) {
      assert.equal(x.reason, "epoch_reset");
      assert.equal(x.previousEpoch, old[x.session]);
      assert.equal(x.epoch, (await dd2.status(x.session)).body.epoch);
      assert.equal(x.lastDeliveredId, 2);
    }
    assert.deepEqual(bySession(r.of("event")), { k1: [2], k2: [2, 1], k3: [2] });
    await dd2.publish("k3", "note", {});
    await r.until(() => r.ids().length === 5, "k3's next");
    assert.equal(r.of("event").at(-1).session, "k3");
    assert.equal(r.of("event").at(-1).id, 1);
  } finally {
    r.client.close();
    await dd2?.stop();
  }
});

test("a session the daemon says is gone is dropped: a DELETE while streaming (stream_error closed), a 404 naming it; none left is final", async () => {
  const dd = await startDaemon(["-retry", "100ms", "-create-on-stream=false"]);
  try {
    for (const id of ["g1", "g2"]) await dd.publish(id, "note", {});
    const r = record(dd.base + "/events", { sessions: ["g1", "nope", "g2"] });
    await r.until(() => r.client.state === "open", "open");
    const [first] = r.of("gone");
    assert.equal(first.session, "nope");
    assert.equal(first.reason, "session_not_found");
    assert.equal(first.error.status, 404);
    assert.equal(first.error.session, "nope");
    assert.deepEqual(r.client.sessions, ["g1", "g2"]);
    await dd.publish("g2", "note", {});
    await r.until(() => r.ids().length === 1, "g2#2");

    assert.equal(await dd.del("g2"), 204);
    await r.until(() => r.of("gone").length === 2, "g2 gone");
    const g2 = r.of("gone")[1];
    assert.equal(g2.reason, "closed");
    assert.equal(g2.lastEventId, 2);
    assert.equal(g2.error.errorKind, "closed");
    await dd.publish("g1", "note", {});
    await r.until(() => r.ids().length === 2, "g1#2 on the same connection");
    assert.equal(r.client.stats.connects, 1);
    assert.deepEqual(r.client.sessions, ["g1"]);

    assert.equal(await dd.del("g1"), 204);
    const err = await r.client.done;
    assert.equal(err.kind, "no_sessions");
    assert.equal(err.final, true);
  } finally {
    await dd.stop();
  }
});

test("addSession and removeSession: the next connection, at once, streams the new list, each session from its position", async () => {
  for (const id of ["s1", "s2", "s3"]) await d.publish(id, "note", {});
  const gate = gatedFetch();
  const r = record(d.base + "/events", { sessions: ["s1", "s2"], fetch: gate.fetch });
  try {
    await r.until(() => r.client.state === "open", "open");
    await d.publish("s1", "note", {});
    await r.until(() => r.ids().length === 1, "s1#2");
    r.client.addSession("s3");
    assert.deepEqual(r.client.sessions, ["s1", "s2", "s3"]);
    await r.until(() => r.client.stats.connects === 2, "reconnected");
    const u = new URL(gate.requests.at(-1).url);
    assert.deepEqual(u.searchParams.getAll("session"), ["s1", "s2", "s3"]);
    assert.equal(parseCursor(u.searchParams.get("lastEventId")).length, 2, "s1 and s2 resume, s3 starts live");
    await d.publish("s3", "note", {});
    await r.until(() => r.of("event").some((e) => e.session === "s3"), "s3's event");
    r.client.removeSession("s1");
    await r.until(() => r.client.stats.connects === 3, "reconnected again");
    assert.deepEqual(new URL(gate.requests.at(-1).url).searchParams.getAll("session"), ["s2", "s3"]);
    assert.equal(r.of("error").length, 0, "a change of sessions is no error");
    r.client.removeSession("s2");
    assert.throws(() => r.client.removeSession("s3"), RangeError);
    assert.deepEqual(r.client.sessions, ["s3"]);
  } finally {
    r.client.close();
  }
});

test("SIGTERM: each session's stream_error shutdown; the client comes back to the successor after the jittered retryAfter", async () => {
  const flags = ["-retry", "100ms", "-shutdown-retry-after", "300ms"];
  const dd = await startDaemon(flags);
  const port = dd.port;
  for (const id of ["t1", "t2"]) await dd.publish(id, "note", {});
  const r = record(dd.base + "/events", { sessions: ["t1", "t2"] });
  let dd2;
  try {
    await r.until(() => r.client.state === "open", "open");
    for (const id of ["t1", "t2"]) await dd.publish(id, "note", {});
    await r.until(() => r.ids().length === 2, "an event of each");
    const stopped = dd.stop();
    await r.until(() => r.of("error").some((e) => e.errorKind === "shutdown"), "the shutdown frame");
    const e = r.of("error").find((x) => x.errorKind === "shutdown");
    assert.equal(e.retryAfter, 300);
    assert.ok(["t1", "t2"].includes(e.session));
    const wait = r.of("state").find((s) => s.delay !== undefined);
    assert.ok(wait.delay >= 300 && wait.delay <= 600, "a wait in [retryAfter, 2*retryAfter]: " + wait.delay);
    await stopped;
    dd2 = await startDaemon(flags, port);
    await r.until(() => r.of("resync").length === 2, "both epoch_reset on the successor");
    assert.ok(r.of("resync").every((x) => x.reason === "epoch_reset"));
  } finally {
    r.client.close();
    await dd2?.stop();
  }
});

// scripted multiplexed frames
const mev = (session, id, cursor, data = {}) =>
  "id: " + cursor + "\nevent: note\ndata: " + JSON.stringify({ session, id, v: 1, type: "note", data }) + "\n\n";
const msyn = (session, type, data) => "event: " + type + "\ndata: " + JSON.stringify({ session, v: 1, type, data }) + "\n\n";
const cur = (a, b) => formatCursor([
  { session: sessionTag("a"), epoch: epochTag(EPOCH_A), id: a },
  { session: sessionTag("b"), epoch: epochTag(EPOCH_B), id: b },
]);

test("the replay budget cuts one session's replay: the client resumes it at once, once the other's replay is done; nothing lost or repeated", async () => {
  const srv = await scripted((req, res, n) => {
    res.writeHead(200, { "Content-Type": "text/event-stream", "Event-Epochs": EPOCH_A + "," + EPOCH_B });
    res.write("retry: 20\n\n");
    if (n === 1) {
      res.write(mev("a", 1, cur(1, 0)));
      res.write(msyn("a", "state_resync_required", { reason: "replay_budget_exceeded", lastDeliveredId: 1, earliestAvailableId: 2, epoch: EPOCH_A }));
      res.write(msyn("a", "replay_complete", { replayedCount: 1, epoch: EPOCH_A }));
      res.write(mev("a", 9, cur(9, 0))); // live, after the cut: dropped
      res.write(mev("b", 1, cur(9, 1)));
      res.write(msyn("b", "replay_complete", { replayedCount: 1, epoch: EPOCH_B }));
      return;
    }
    for (let i = 2; i <= 9; i++) res.write(mev("a", i, cur(i, 1)));
    res.write(msyn("a", "replay_complete", { replayedCount: 8, epoch: EPOCH_A }));
    res.write(msyn("b", "replay_complete", { replayedCount: 0, epoch: EPOCH_B }));
  });
  const r = record(srv.base + "/events", { sessions: ["a", "b"], lastEventId: cur(0, 0) });
  try {
    await r.until(() => r.ids().length === 10, "a#1..9 and b#1");
    assert.deepEqual(bySession(r.of("event")), { a: range(1, 9), b: [1] });
    assert.equal(r.of("resync").length, 0);
    assert.equal(srv.requests[1].url.searchParams.get("lastEventId"), cur(1, 1));
    assert.equal(srv.requests.length, 2);
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("cursor_invalid for every session (the server could not use the cursor): each reports what it misses from its own position, then goes on live", async () => {
  const srv = await scripted((req, res) => {
    res.writeHead(200, { "Content-Type": "text/event-stream", "Event-Epochs": EPOCH_A + "," + EPOCH_B });
    res.write("retry: 5000\n\n");
    res.write(msyn("a", "state_resync_required", { reason: "cursor_invalid", lastDeliveredId: 0, earliestAvailableId: 5, epoch: EPOCH_A }));
    res.write(msyn("b", "state_resync_required", { reason: "cursor_invalid", lastDeliveredId: 0, earliestAvailableId: 2, epoch: EPOCH_B }));
    res.write(mev("a", 5, cur(5, 1)));
    res.write(mev("b", 2, cur(5, 2)));
  });
  const r = record(srv.base + "/events", { sessions: ["a", "b"], lastEventId: cur(1, 1) });
  try {
    await r.until(() => r.ids().length === 2, "a#5 and b#2");
    assert.deepEqual(bySession(r.of("event")), { a: [5], b: [2] });
    const rs = r.of("resync");
    assert.equal(rs.length, 1, "b lacks nothing: " + JSON.stringify(rs));
    assert.deepEqual(
      { session: rs[0].session, reason: rs[0].reason, earliestAvailableId: rs[0].earliestAvailableId, epoch: rs[0].epoch, missing: rs[0].missing },
      { session: "a", reason: "cursor_invalid", earliestAvailableId: 5, epoch: EPOCH_A, missing: { from: 2, to: 4 } },
    );
    assert.equal(r.of("caughtUp").length, 0);
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("a frame of no session of the stream is a protocol error, skipped; an epoch the cursor does not know without epoch_reset is reported", async () => {
  const srv = await scripted((req, res) => {
    res.writeHead(200, { "Content-Type": "text/event-stream", "Event-Epochs": EPOCH_B + "," + EPOCH_B });
    res.write(mev("zzz", 1, cur(1, 1)));
    res.write(mev("a", 5, formatCursor([{ session: sessionTag("a"), epoch: epochTag(EPOCH_B), id: 5 }])));
  });
  const r = record(srv.base + "/events", { sessions: ["a", "b"], lastEventId: cur(3, 0) });
  try {
    await r.until(() => r.ids().length === 1, "a#5");
    assert.equal(r.of("error")[0].kind, "protocol");
    const [rs] = r.of("resync");
    assert.equal(rs.session, "a");
    assert.equal(rs.reason, "epoch_reset");
    assert.equal(rs.detail, "epoch_changed");
    assert.equal(rs.lastDeliveredId, 3);
    assert.equal(rs.epoch, EPOCH_B);
    assert.deepEqual(rs.missing, { from: 1, to: 4 });
  } finally {
    r.client.close();
    await srv.close();
  }
});
