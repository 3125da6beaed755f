// The client against the demo daemon's access control (cmd/sessiond
// -auth-token, -token-lifetime): the Handler's Authorize hook, its stream
// lifetimes and Revoke, for real.

import assert from "node:assert/strict";
import { test } from "node:test";
import { gatedFetch, range, record, sleep, startDaemon } from "./helpers.js";

const TOKEN = "js-test-token";

// login makes POST /login as subject and returns its cookie ("name=value").
async function login(d, subject) {
  const res = await fetch(d.base + "/login", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ token: TOKEN, subject }),
  });
  assert.equal(res.status, 200);
  await res.arrayBuffer();
  return res.headers.get("set-cookie").split(";")[0];
}

// publishing publishes a note every ms until stop(), which resolves with
// how many it published.
function publishing(d, session, ms) {
  let n = 0;
  let stopped = false;
  const loop = (async () => {
    while (!stopped) {
      await d.publish(session, "note", { n: ++n });
      await sleep(ms);
    }
    return n;
  })();
  return async () => {
    stopped = true;
    return loop;
  };
}

test("a stream lifetime ends with stream_error reauthenticate: the credentials callback is asked, the client resumes at once with every id once", async () => {
  const d = await startDaemon(["-retry", "100ms", "-auth-token", TOKEN, "-token-lifetime", "1500ms"]);
  const gate = gatedFetch();
  const reasons = [];
  const r = record(d.base + "/session/life/events", {
    fetch: gate.fetch,
    credentials: ({ reason }) => {
      reasons.push(reason);
      return { token: TOKEN };
    },
  });
  let stop;
  try {
    await r.until(() => r.client.state === "open", "open");
    stop = publishing(d, "life", 20);
    await r.until(() => r.of("error").filter((e) => e.errorKind === "reauthenticate").length === 2 && r.client.state === "open", "two lifetimes", 20_000);
    const total = await stop();
    await r.until(() => r.ids().length === total, total + " events");
    await sleep(200); // a duplicate, if any
    assert.deepEqual(r.ids(), range(1, total), "every id once, in order, across two lifetimes");
    assert.deepEqual(reasons, ["initial", "reauthenticate", "reauthenticate"]);
    const errs = r.of("error");
    assert.deepEqual(errs.map((e) => [e.kind, e.errorKind, e.final]), [["stream_error", "reauthenticate", false], ["stream_error", "reauthenticate", false]]);
    assert.equal(r.of("resync").length, 0);
    // Each lifetime's end is followed by an immediate reconnect, with the
    // token, resuming after the last id delivered.
    assert.equal(gate.requests.length, 3);
    for (const q of gate.requests) assert.equal(q.init.headers.Authorization, "Bearer " + TOKEN);
    const ends = r.log.filter((x) => x.kind === "error").map((x) => x.at);
    for (const [i, q] of gate.requests.slice(1).entries()) {
      assert.ok(q.at - ends[i] < 500, "reconnected " + (q.at - ends[i]) + " ms after the lifetime's end");
      const cursor = new URL(q.url).searchParams.get("lastEventId");
      assert.match(cursor, /^[0-9a-f]{32}:[0-9]+$/);
    }
    assert.deepEqual(r.of("caughtUp").length, 2, "one replay_complete per resume");
    assert.ok(r.of("state").filter((s) => s.delay !== undefined).every((s) => s.delay === 0));
  } finally {
    await stop?.();
    r.client.close();
    await d.stop();
  }
});

for (const how of ["logout", "revoke"]) test("a " + how + " ends the stream with stream_error revoked: one reconnect with fresh credentials, then 401 is final", async () => {
  const d = await startDaemon(["-retry", "100ms", "-auth-token", TOKEN]);
  const cookie = await login(d, "alice");
  const other = await login(d, "bob");
  const gate = gatedFetch();
  const reasons = [];
  const creds = (c) => ({ reason }) => {
    reasons.push(reason);
    return { headers: { Cookie: c } }; // the application has no better one
  };
  const r = record(d.base + "/session/rev/events", { fetch: gate.fetch, credentials: creds(cookie) });
  const bob = record(d.base + "/session/rev/events", { credentials: () => ({ headers: { Cookie: other } }) });
  try {
    await r.until(() => r.client.state === "open", "alice open");
    await bob.until(() => bob.client.state === "open", "bob open");
    await d.publish("rev", "note", { n: 1 });
    await r.until(() => r.ids().length === 1, "an event");
    const revoked = how === "logout" ? await d.post("/logout", undefined, { Cookie: cookie }) : await d.post("/revoke", { subject: "alice" });
    assert.deepEqual(revoked, { subject: "alice", revoked: 1 }, "exactly alice's stream");
    const err = await r.client.done;
    assert.equal(err.status, 401);
    assert.equal(err.code, "unauthorized");
    assert.equal(err.final, true);
    assert.deepEqual(reasons, ["initial", "revoked"]);
    assert.deepEqual(r.of("error").map((e) => [e.kind, e.errorKind ?? e.status, e.final]), [["stream_error", "revoked", false], ["http", 401, true]]);
    assert.equal(gate.requests.length, 2, "one reconnection after the revocation");
    assert.equal(new URL(gate.requests[1].url).searchParams.get("lastEventId").split(":")[1], "1");
    await sleep(300);
    assert.equal(gate.requests.length, 2, "no retry after the final 401");
    assert.deepEqual(r.states().slice(-2), ["reconnecting", "closed"]);
    // Bob's stream goes on.
    await d.publish("rev", "note", { n: 2 });
    await bob.until(() => bob.ids().length === 2, "bob's events");
    assert.equal(bob.client.state, "open");
    assert.equal(bob.of("error").length, 0);
  } finally {
    r.client.close();
    bob.client.close();
    await d.stop();
  }
});

test("401 before any stream: without credentials final at once; with a callback asked once; fresh credentials that work open the stream", async () => {
  const d = await startDaemon(["-retry", "100ms", "-auth-token", TOKEN]);
  try {
    const url = d.base + "/session/nobody/events";
    const anon = record(url);
    let err = await anon.client.done;
    assert.deepEqual([err.status, err.code, err.final, err.challenge], [401, "unauthorized", true, 'Bearer realm="sessiond"']);
    assert.equal(anon.of("error").length, 1);

    const gate = gatedFetch();
    const reasons = [];
    const wrong = record(url, { fetch: gate.fetch, credentials: ({ reason }) => (reasons.push(reason), { token: "wrong" }) });
    err = await wrong.client.done;
    assert.deepEqual([err.status, err.code, err.final, err.challenge], [401, "unauthorized", true, 'Bearer realm="sessiond", error="invalid_token"']);
    assert.deepEqual(reasons, ["initial", "unauthorized"]);
    assert.equal(gate.requests.length, 2);
    assert.equal((await d.status("nobody")).status, 404, "refused before the session was created");

    const asked = [];
    const ok = record(url, { credentials: ({ reason }) => (asked.push(reason), { token: reason === "initial" ? "stale" : TOKEN }) });
    try {
      await ok.until(() => ok.client.state === "open", "open with the fresh token");
      await d.publish("nobody", "note", {});
      await ok.until(() => ok.ids().length === 1, "an event");
      assert.deepEqual(asked, ["initial", "unauthorized"]);
      assert.deepEqual(ok.of("error").map((e) => [e.status, e.final]), [[401, false]]);
    } finally {
      ok.client.close();
    }
  } finally {
    await d.stop();
  }
});
