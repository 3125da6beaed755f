// Issue 33 against the demo daemon (cmd/sessiond): what the client says
// for a session that is gone (a restart nobody re-created it after, a
// DELETE while streaming), retryNotFound for daemons whose sessions come
// back, a multiplexed stream from the start (lastEventId: 0), a clean end
// reported, whole-millisecond delays, and the README's copy list.
//
// The daemon runs with -create-on-stream=false, as the README's daemon
// ("In twenty lines") does: a GET of an unknown session is 404
// session_not_found, and only a POST (a publish) creates one.

import assert from "node:assert/strict";
import { copyFileSync, mkdtempSync, readFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";
import { parseCursor } from "../index.js";
import { FakeEventSource } from "./fake-eventsource.js";
import { gatedFetch, record, repoRoot, startDaemon } from "./helpers.js";

const README = ["-retry", "100ms", "-shutdown-retry-after", "100ms", "-create-on-stream=false"];
const fast = { initialDelay: 50, maxDelay: 1000 };

for (const how of ["SIGTERM", "kill -9"]) {
  test("after a restart (" + how + ") a session nobody re-created is 404: final on a single stream, dropped on a multiplexed one", async () => {
    let dd = await startDaemon(README);
    const port = dd.port;
    for (const id of ["s", "m1", "m2"]) await dd.publish(id, "note", {});
    const single = record(dd.base + "/session/s/events", fast);
    const mux = record(dd.base + "/events", { ...fast, sessions: ["m1", "m2"] });
    try {
      await single.until(() => single.client.state === "open", "single open");
      await mux.until(() => mux.client.state === "open", "mux open");
      if (how === "SIGTERM") await dd.stop();
      else await dd.kill();
      dd = await startDaemon(README, port);
      const err = await single.client.done;
      assert.equal(err.kind, "http");
      assert.equal(err.status, 404);
      assert.equal(err.code, "session_not_found");
      assert.equal(err.sessionGone, true);
      assert.equal(err.final, true);
      assert.equal(single.of("error").at(-1), err, "reported through onError too");
      assert.equal(single.of("state").at(-1).state, "closed");
      assert.equal(single.of("state").at(-1).error, err);
      const merr = await mux.client.done;
      assert.equal(merr.kind, "no_sessions");
      assert.deepEqual(mux.of("gone").map((g) => [g.session, g.reason, g.error.sessionGone]), [["m1", "session_not_found", true], ["m2", "session_not_found", true]]);
    } finally {
      single.client.close();
      mux.client.close();
      await dd.stop();
    }
  });

  test("after a restart (" + how + ") with retryNotFound: the client asks again until a publish re-creates the session, then resumes with epoch_reset", async () => {
    let dd = await startDaemon(README);
    const port = dd.port;
    for (const id of ["s", "m1", "m2"]) await dd.publish(id, "note", {});
    const single = record(dd.base + "/session/s/events", { ...fast, retryNotFound: 60_000 });
    const mux = record(dd.base + "/events", { ...fast, sessions: ["m1", "m2"], retryNotFound: 60_000 });
    try {
      await single.until(() => single.client.state === "open", "single open");
      await mux.until(() => mux.client.state === "open", "mux open");
      await dd.publish("s", "note", {});
      await dd.publish("m1", "note", {});
      await single.until(() => single.ids().length === 1, "s#2");
      await mux.until(() => mux.ids().length === 1, "m1#2");
      const old = single.client.epoch;
      if (how === "SIGTERM") await dd.stop();
      else await dd.kill();
      dd = await startDaemon(README, port);
      for (const r of [single, mux]) await r.until(() => r.of("error").some((e) => e.sessionGone && !e.final), "a 404, retried");
      for (const id of ["s", "m1", "m2"]) await dd.publish(id, "note", { gen: 2 });
      await single.until(() => single.of("resync").length === 1 && single.ids().length === 2, "s: epoch_reset and s#1");
      await mux.until(() => mux.of("resync").length === 2 && mux.ids().length === 3, "m1, m2: epoch_reset and #1");
      const rs = single.of("resync")[0];
      assert.equal(rs.reason, "epoch_reset");
      assert.equal(rs.previousEpoch, old);
      assert.equal(rs.epoch, (await dd.status("s")).body.epoch);
      assert.deepEqual(single.ids(), [2, 1]);
      assert.ok(mux.of("resync").every((x) => x.reason === "epoch_reset"));
      assert.equal(mux.of("gone").length, 0);
      for (const s of [...single.of("state"), ...mux.of("state")]) {
        if (s.delay !== undefined) assert.ok(Number.isInteger(s.delay), "a delay in whole ms: " + s.delay);
      }
    } finally {
      single.client.close();
      mux.client.close();
      await dd.stop();
    }
  });
}

test("retryNotFound is a bound: past it the 404 is final", async () => {
  const dd = await startDaemon(README);
  try {
    const t0 = Date.now();
    const r = record(dd.base + "/session/never/events", { initialDelay: 50, retryNotFound: 1500 });
    const err = await r.client.done;
    const took = Date.now() - t0;
    assert.equal(err.status, 404);
    assert.equal(err.final, true);
    assert.ok(took >= 1500 && took < 4000, "final after " + took + " ms");
    assert.ok(r.of("error").filter((e) => !e.final).length >= 2, "each 404 reported while retrying");
    assert.throws(() => record(dd.base + "/session/x/events", { retryNotFound: -1 }), RangeError);
  } finally {
    await dd.stop();
  }
});

for (const transport of ["fetch", "eventsource"]) test("a DELETE while a single stream is open (" + transport + "): stream_error closed, reported once, final, never reconnected", async () => {
  const dd = await startDaemon(README);
  const gate = gatedFetch();
  const opened = [];
  class CountedEventSource extends FakeEventSource {
    _connect() {
      opened.push(this.url);
      return super._connect();
    }
  }
  try {
    await dd.publish("del", "note", {});
    const r = record(dd.base + "/session/del/events", { fetch: gate.fetch, transport, EventSource: CountedEventSource, eventTypes: ["note"] });
    await r.until(() => r.client.state === "open", "open");
    await dd.publish("del", "note", {});
    await r.until(() => r.ids().length === 1, "del#2");
    assert.equal(await dd.del("del"), 204);
    const err = await r.client.done;
    assert.equal(err.kind, "stream_error");
    assert.equal(err.errorKind, "closed");
    assert.equal(err.sessionGone, true);
    assert.equal(err.final, true);
    assert.match(err.message, /the session is gone \(stream_error closed\)/);
    assert.deepEqual(r.of("error"), [err]);
    assert.deepEqual(r.states(), ["connecting", "open", "closed"]);
    const gets = gate.requests.filter((q) => (q.init?.method ?? "GET") === "GET").length + opened.length;
    assert.equal(gets, 1, "no request after the end");
  } finally {
    await dd.stop();
  }
});

test("a clean end of the response (a clean /disconnect) is reported through onError, and in the reconnecting state's detail", async () => {
  const dd = await startDaemon(["-retry", "100ms"]);
  const r = record(dd.base + "/session/clean/events", { transport: "fetch" });
  try {
    await r.until(() => r.client.state === "open", "open");
    await dd.post("/session/clean/disconnect");
    await r.until(() => r.client.stats.connects === 2, "the resume");
    const [err] = r.of("error");
    assert.equal(err.kind, "network");
    assert.equal(err.final, false);
    assert.match(err.message, /the stream ended/);
    const wait = r.of("state").find((s) => s.state === "reconnecting" && s.error);
    assert.equal(wait.error, err);
    assert.ok(Number.isInteger(wait.delay), "whole milliseconds: " + wait.delay);
  } finally {
    r.client.close();
    await dd.stop();
  }
});

for (const transport of ["fetch", "eventsource"]) test("lastEventId 0 with sessions (" + transport + "): every session from the start of its ring, each with its replay_complete, an empty one too", async () => {
  const dd = await startDaemon(["-retry", "100ms"]); // -create-on-stream: the stream makes "empty"
  const gate = gatedFetch();
  const opened = [];
  class SeenEventSource extends FakeEventSource {
    _connect() {
      opened.push(this.url);
      return super._connect();
    }
  }
  try {
    for (let i = 1; i <= 3; i++) await dd.publish("a", "note", { i });
    await dd.publish("b", "note", {});
    const r = record(dd.base + "/events", { sessions: ["a", "b", "empty"], lastEventId: 0, fetch: gate.fetch, transport, EventSource: SeenEventSource, eventTypes: ["note"] });
    assert.equal(r.client.lastEventId, "0");
    await r.until(() => r.of("caughtUp").length === 3, "three catch-ups");
    await r.until(() => r.ids().length === 4, "4 events");
    const by = {};
    for (const e of r.of("event")) (by[e.session] ??= []).push(e.id);
    assert.deepEqual(by, { a: [1, 2, 3], b: [1] });
    assert.ok(r.of("event").every((e) => e.replayed));
    assert.deepEqual(Object.fromEntries(r.of("caughtUp").map((c) => [c.session, c.replayedCount])), { a: 3, b: 1, empty: 0 });
    const urls = transport === "fetch" ? gate.requests.filter((q) => (q.init?.method ?? "GET") === "GET").map((q) => q.url) : opened;
    assert.equal(new URL(urls[0]).searchParams.get("lastEventId"), "0");
    assert.equal(parseCursor(r.client.lastEventId).length, 3, "every session has a position, empty at 0");
    assert.deepEqual(r.client.session("empty"), { lastEventId: 0, epoch: (await dd.status("empty")).body.epoch });
    // A cut: each session resumes from its position, empty from 0.
    gate.close();
    await dd.post("/session/a/disconnect");
    await r.until(() => r.states().at(-1) === "reconnecting", "cut");
    await dd.publish("empty", "note", {});
    gate.open();
    await r.until(() => r.ids().length === 5, "empty#1");
    assert.equal(r.of("event").at(-1).session, "empty");
    assert.equal(r.of("event").at(-1).id, 1);
    assert.equal(r.of("resync").length, 0);
    r.client.close();
  } finally {
    await dd.stop();
  }
});

test("the README's copy list is the package's modules: copied alone, they load", async () => {
  const readme = readFileSync(path.join(repoRoot, "clients/js/README.md"), "utf8");
  const m = readme.match(/Otherwise copy the package's ([^\n]+(?:\n[^\n]+)?) next to/);
  assert.ok(m, "the README says what to copy");
  const files = [...m[1].matchAll(/`([a-z]+\.js)`/g)].map((x) => x[1]);
  const pkg = JSON.parse(readFileSync(path.join(repoRoot, "clients/js/package.json"), "utf8"));
  assert.deepEqual(files.sort(), pkg.files.filter((f) => f.endsWith(".js")).sort());
  const dir = mkdtempSync(path.join(os.tmpdir(), "eventbus-copy-"));
  for (const f of files) copyFileSync(path.join(repoRoot, "clients/js", f), path.join(dir, f));
  const mod = await import(pathToFileURL(path.join(dir, "index.js")).href);
  assert.equal(typeof mod.EventBusClient, "function");
  assert.equal(typeof mod.parseCursor, "function", "the cursor helpers come from the package's index");
  // The package exports its index only: the docs name no other entry.
  const self = await import("@ssebus/eventbus-client");
  for (const name of ["parseCursor", "formatCursor", "sessionTag", "epochTag"]) assert.equal(typeof self[name], "function", name);
  await assert.rejects(import("@ssebus/eventbus-client/cursor.js"), { code: "ERR_PACKAGE_PATH_NOT_EXPORTED" });
});
