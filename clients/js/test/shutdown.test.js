// stream_error shutdown (issue 22, point 4): the server is going away; the
// client waits a random delay in [retryAfter, 2 * retryAfter] (retryAfter
// capped at maxDelay / 2, 2000 when absent), resets its backoff and resumes
// from its cursor. Against scripted servers, and against the demo daemon
// stopped with SIGTERM.

import assert from "node:assert/strict";
import { test } from "node:test";
import { ev, open, range, record, scripted, startDaemon, syn } from "./helpers.js";

const shutdown = (retryAfter) =>
  syn("stream_error", { error: "the server is shutting down", errorKind: "shutdown", ...(retryAfter === undefined ? {} : { retryAfter }) });

test("stream_error shutdown: a jittered wait from retryAfter, then a resume from the cursor", async () => {
  const rounds = 5;
  const ended = [];
  const srv = await scripted((req, res, n) => {
    open(res, { retry: 20 });
    res.write(ev(n));
    if (n <= rounds) {
      res.end(shutdown(150));
      ended.push(Date.now());
    }
  });
  const r = record(srv.base + "/s/events");
  try {
    await r.until(() => r.ids().length === rounds + 1, rounds + 1 + " events");
    assert.deepEqual(r.ids(), range(1, rounds + 1));
    const errs = r.of("error");
    assert.equal(errs.length, rounds);
    for (const e of errs) {
      assert.equal(e.kind, "stream_error");
      assert.equal(e.errorKind, "shutdown");
      assert.equal(e.retryAfter, 150);
      assert.equal(e.final, false);
    }
    const delays = r.of("state").filter((s) => s.delay !== undefined).map((s) => s.delay);
    assert.equal(delays.length, rounds);
    for (const d of delays) assert.ok(d >= 150 && d <= 300, "delay " + d + " outside [150, 300]");
    assert.ok(new Set(delays).size > 1, "jittered: " + delays);
    srv.requests.slice(1).forEach((q, i) => {
      assert.equal(q.url.searchParams.get("lastEventId"), String(i + 1), "resumed from the cursor");
      assert.ok(q.at - ended[i] >= 150 - 5, "request " + (i + 2) + " came " + (q.at - ended[i]) + " ms after the shutdown");
    });
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("stream_error shutdown: retryAfter capped at maxDelay / 2; 2000 when the frame has none", async () => {
  for (const c of [
    { retryAfter: 3_600_000, maxDelay: 400, lo: 200, hi: 400 },
    { retryAfter: undefined, maxDelay: undefined, lo: 2000, hi: 4000 },
  ]) {
    const srv = await scripted((req, res) => {
      open(res);
      res.write(ev(1));
      res.end(shutdown(c.retryAfter));
    });
    const r = record(srv.base + "/s/events", c.maxDelay === undefined ? {} : { maxDelay: c.maxDelay });
    try {
      await r.until(() => r.of("state").some((s) => s.delay !== undefined), "the wait");
      const d = r.of("state").find((s) => s.delay !== undefined).delay;
      assert.ok(d >= c.lo && d <= c.hi, "delay " + d + " outside [" + c.lo + ", " + c.hi + "]");
      assert.equal(r.of("error")[0].retryAfter, c.retryAfter ?? 2000);
    } finally {
      r.client.close();
      await srv.close();
    }
  }
});

test("a daemon stopped with SIGTERM says shutdown with -shutdown-retry-after; the client comes back to its successor after it", async () => {
  const flags = ["-retry", "100ms", "-shutdown-retry-after", "300ms"];
  const dd = await startDaemon(flags);
  let dd2;
  const r = record(dd.base + "/session/s/events");
  try {
    await r.until(() => r.client.state === "open", "open");
    for (let i = 1; i <= 3; i++) await dd.publish("s", "note", { i });
    await r.until(() => r.ids().length === 3, "3 events");
    const stopped = Date.now();
    const exited = dd.stop();
    await r.until(() => r.of("error").length === 1, "the shutdown frame");
    const e = r.of("error")[0];
    assert.equal(e.errorKind, "shutdown");
    assert.equal(e.retryAfter, 300);
    assert.ok(Date.now() - stopped < 2000, "the frame came at once");
    const wait = r.of("state").find((s) => s.delay !== undefined).delay;
    assert.ok(wait >= 300 && wait <= 600, "waited " + wait);
    await exited;
    dd2 = await startDaemon(flags, dd.port);
    await r.until(() => r.of("caughtUp").length === 1, "resumed on the new daemon");
    const st = await dd2.status("s");
    assert.equal(st.body.lastResumeFrom, r.of("event")[2].epoch + ":3", "the cursor it had");
  } finally {
    r.client.close();
    await dd.stop();
    await dd2?.stop();
  }
});
