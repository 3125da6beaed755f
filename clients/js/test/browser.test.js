// The client in a real browser (headless Chromium), against the demo
// daemon: the EventSource transport for real (a plain GET, no headers), and
// the fetch transport with a header, and on a multiplexed stream the
// browser's own WebSocket. The page and the client's modules are served by a
// small Node server that also forwards /session/, /events and /ws (its
// upgrade, byte for byte) to the daemon (same origin, so the test needs no
// CORS from the daemon).
//
// Skipped when Chromium is missing, unless CI is set (then it fails).

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { parseCursor } from "../index.js";
import { startDaemon } from "./helpers.js";

const chromium = process.env.CHROMIUM ?? "/usr/bin/chromium";
const pkg = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const skip = !existsSync(chromium) && !process.env.CI ? "no Chromium at " + chromium : false;

const PAGE = `<!doctype html><meta charset="utf-8"><title>client test</title>
<script type="module">
import { EventBusClient } from "/js/index.js";
// Reports travel on concurrent requests: seq restores their order.
let seq = 0;
const report = (client, kind, v) =>
  fetch("/report", { method: "POST", body: JSON.stringify({ seq: seq++, client, kind, v }) });
class CountingEventSource extends EventSource {
  constructor(url, init) { super(url, init); report("es", "eventsource", url); }
}
const cb = (name) => ({
  onEvent: (e) => report(name, "event", { id: e.id, epoch: e.epoch, data: e.data, replayed: e.replayed }),
  onCaughtUp: (c) => report(name, "caughtUp", c),
  onResync: (r) => report(name, "resync", r),
  onState: (s, d) => report(name, "state", { state: s, delay: d.delay }),
  onError: (e) => report(name, "error", { kind: e.kind, status: e.status, code: e.code, final: e.final }),
});
new EventBusClient("/session/b/events", { EventSource: CountingEventSource, eventTypes: ["note"], ...cb("es") });
new EventBusClient("/session/b/events", { headers: { "X-Viewer": "fetch" }, ...cb("fetch") });
</script>`;

// MUX_PAGE reads three sessions on one multiplexed stream, with each
// transport.
const MUX_PAGE = PAGE.replace(/new EventBusClient\([^]*<\/script>/, `const sessions = ["m1", "m2", "m3"];
const mux = (name) => ({
  ...cb(name),
  onEvent: (e) => report(name, "event", { session: e.session, id: e.id, epoch: e.epoch, replayed: e.replayed }),
});
new EventBusClient("/events", { sessions, EventSource: CountingEventSource, eventTypes: ["note"], ...mux("es") });
new EventBusClient("/events", { sessions, headers: { "X-Viewer": "fetch" }, ...mux("fetch") });
// The browser's own WebSocket (GET /ws), SSE when it fails, back after 500 ms.
new EventBusClient("/events", { sessions, webSocketURL: "/ws", webSocketRetry: 500, eventTypes: ["note"], ...mux("ws"),
  onState: (s, d) => report("ws", "state", { state: s, delay: d.delay, transport: d.transport }) });
</script>`);

// serve starts the page server with page; it forwards /session/ and
// /events to the daemon at target() (which changes across a restart) and
// records every forwarded request.
async function serve(target, page = PAGE) {
  const reports = [];
  const forwarded = [];
  const waiters = [];
  const srv = http.createServer((req, res) => {
    const u = new URL(req.url, "http://x");
    if (u.pathname === "/") {
      res.writeHead(200, { "Content-Type": "text/html" });
      res.end(page);
    } else if (u.pathname.startsWith("/js/")) {
      const f = path.join(pkg, path.basename(u.pathname));
      if (!existsSync(f)) return res.writeHead(404).end();
      res.writeHead(200, { "Content-Type": "text/javascript" });
      res.end(readFileSync(f));
    } else if (u.pathname === "/report") {
      let body = "";
      req.on("data", (b) => (body += b));
      req.on("end", () => {
        reports.push(JSON.parse(body));
        for (const w of waiters.splice(0)) w();
        res.writeHead(204).end();
      });
    } else if (u.pathname.startsWith("/session/") || u.pathname === "/events") {
      forwarded.push({ method: req.method, url: u, headers: req.headers });
      const up = http.request(target() + req.url, { method: req.method, headers: req.headers }, (ur) => {
        res.writeHead(ur.statusCode, ur.headers);
        res.flushHeaders();
        ur.pipe(res);
        // A daemon killed mid-stream resets the upstream: cut the browser's too.
        ur.on("aborted", () => res.destroy());
        ur.on("error", () => res.destroy());
      });
      up.on("error", () => {
        if (!res.headersSent) res.writeHead(502, { "Content-Type": "application/json" }).end('{"error":"daemon down","code":"bad_gateway"}');
        else res.destroy();
      });
      res.on("close", () => up.destroy());
      req.pipe(up);
    } else {
      res.writeHead(404).end();
    }
  });
  // /ws: the WebSocket's handshake and then its bytes, as they are.
  const tunnels = new Set();
  srv.on("upgrade", (req, sock, head) => {
    forwarded.push({ method: req.method, url: new URL(req.url, "http://x"), headers: req.headers, upgrade: true });
    const t = new URL(target());
    const up = net.connect(Number(t.port), t.hostname, () => {
      up.write(req.method + " " + req.url + " HTTP/1.1\r\n" + Object.entries(req.headers).map(([k, v]) => k + ": " + v + "\r\n").join("") + "\r\n");
      up.write(head);
      sock.pipe(up);
      up.pipe(sock);
    });
    tunnels.add(sock).add(up);
    const end = () => {
      sock.destroy();
      up.destroy();
      tunnels.delete(sock);
      tunnels.delete(up);
    };
    up.on("error", end).on("close", end);
    sock.on("error", end).on("close", end);
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  const of = (client, kind) =>
    reports
      .filter((x) => x.client === client && x.kind === kind)
      .sort((a, b) => a.seq - b.seq)
      .map((x) => x.v);
  return {
    url: "http://127.0.0.1:" + srv.address().port + "/",
    forwarded,
    of,
    ids: (client) => of(client, "event").map((e) => e.id),
    async until(pred, what, ms = 30_000) {
      const end = Date.now() + ms;
      while (!pred()) {
        if (Date.now() > end) throw new Error("timed out waiting for " + what + "; reports: " + JSON.stringify(reports).slice(-4000));
        await new Promise((r) => {
          waiters.push(r);
          setTimeout(r, 200);
        });
      }
    },
    close: () => {
      for (const t of tunnels) t.destroy();
      srv.closeAllConnections();
      return new Promise((r) => srv.close(r));
    },
  };
}

// openBrowser starts headless Chromium on url, in a profile of its own;
// close() ends it (and its helpers) and removes the profile.
function openBrowser(url) {
  const profile = mkdtempSync(path.join(os.tmpdir(), "chromium-"));
  const browser = spawn(chromium, [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--user-data-dir=" + profile, url,
  ], { stdio: "ignore", detached: true }); // its own process group: its helpers end with it
  const killGroup = () => {
    try {
      process.kill(-browser.pid, "SIGKILL");
    } catch {
      // already gone
    }
  };
  process.once("exit", killGroup); // should the test die before its cleanup
  return {
    async close() {
      const exited = new Promise((r) => (browser.exitCode !== null ? r() : browser.once("exit", r)));
      try {
        process.kill(-browser.pid, "SIGTERM");
      } catch {
        // already gone
      }
      await exited;
      process.off("exit", killGroup);
      rmSync(profile, { recursive: true, force: true, maxRetries: 10, retryDelay: 100 });
    },
  };
}

for (const epochIds of [true, false]) test("in Chromium (-epoch-ids=" + epochIds + "): EventSource and fetch transports across a clean cut, an abrupt cut and a daemon restart", { skip, timeout: 120_000 }, async () => {
  const flags = ["-retry", "200ms", "-epoch-ids=" + epochIds];
  let d = await startDaemon(flags);
  const port = d.port;
  const page = await serve(() => d.base);
  const browser = openBrowser(page.url);
  try {
    const both = (n) => page.ids("es").length >= n && page.ids("fetch").length >= n;
    await page.until(() => page.of("es", "state").some((s) => s.state === "open") && page.of("fetch", "state").some((s) => s.state === "open"), "both open");
    for (let i = 1; i <= 3; i++) await d.publish("b", "note", { i });
    await page.until(() => both(3), "3 events in both");
    const epoch1 = (await d.status("b")).body.epoch;

    // A clean cut: both resume with no gap and no duplicate.
    await d.post("/session/b/disconnect");
    await page.until(() => page.of("es", "caughtUp").length === 1 && page.of("fetch", "caughtUp").length === 1, "both resumed");
    await d.publish("b", "note", { i: 4 });
    await page.until(() => both(4), "4 events in both");
    // An abrupt cut (the connections reset, as a failing load balancer would).
    assert.equal((await d.post("/session/b/disconnect?mode=abort")).mode, "abort");
    await page.until(() => page.of("es", "caughtUp").length === 2 && page.of("fetch", "caughtUp").length === 2, "both resumed again");
    await d.publish("b", "note", { i: 5 });
    await page.until(() => both(5), "5 events in both");
    for (const c of ["es", "fetch"]) {
      assert.deepEqual(page.ids(c), [1, 2, 3, 4, 5], c);
      assert.ok(page.of(c, "event").every((e) => e.epoch === epoch1), c + ": the epoch is known (an EventSource learns it from the id line or a HEAD): " + JSON.stringify(page.of(c, "event").map((e) => e.epoch)) + JSON.stringify(page.forwarded.map((f) => f.method + " " + f.url.search)));
    }

    // A restart: the new epoch passes the cursor before the clients come
    // back, yet both report epoch_reset and take the new epoch from id 1.
    await d.stop();
    d = await startDaemon(flags, port);
    for (let i = 1; i <= 7; i++) await d.publish("b", "note", { gen: 2, i });
    const epoch2 = (await d.status("b")).body.epoch;
    await page.until(() => both(12), "the new epoch in both");
    for (const c of ["es", "fetch"]) {
      assert.deepEqual(page.ids(c), [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 6, 7], c);
      const [rs] = page.of(c, "resync");
      assert.equal(rs.reason, "epoch_reset", c);
      assert.equal(rs.previousEpoch, epoch1, c);
      assert.equal(rs.epoch, epoch2, c);
      assert.ok(page.of(c, "event").slice(5).every((e) => e.epoch === epoch2), c);
    }

    // The EventSource client really used EventSource, with the cursor in
    // the URL; while the daemon was down it asked with fetch (502s).
    const esGets = page.forwarded.filter((f) => f.method === "GET" && !f.headers["x-viewer"]);
    assert.ok(page.of("es", "eventsource").length >= 3, "EventSources opened: " + page.of("es", "eventsource").length);
    assert.ok(esGets.every((f) => f.headers.accept === "text/event-stream"));
    const cursor = (epochIds ? epoch1 + ":" : "") + "5";
    assert.ok(esGets.some((f) => f.url.searchParams.get("lastEventId") === cursor && f.url.searchParams.get("epoch") === epoch1), "resumed with " + cursor);
    assert.ok(page.forwarded.some((f) => f.method === "HEAD"), "the epoch probe of the first, live-only stream");
    assert.ok(page.forwarded.filter((f) => f.headers["x-viewer"] === "fetch").length >= 3, "the fetch client sent its header");
    for (const c of ["es", "fetch"]) assert.ok(page.of(c, "error").every((e) => !e.final), c + ": no final error");
  } finally {
    await browser.close();
    await page.close();
    await d.stop();
  }
});

test("in Chromium: three sessions on one stream, EventSource, fetch and the WebSocket, across a /disconnect and a kill -9", { skip, timeout: 120_000 }, async () => {
  const flags = ["-retry", "200ms"];
  let d = await startDaemon(flags);
  const port = d.port;
  const sessions = ["m1", "m2", "m3"];
  for (const id of sessions) await d.publish(id, "note", {});
  const page = await serve(() => d.base, MUX_PAGE);
  const browser = openBrowser(page.url);
  try {
    const clients = ["es", "fetch", "ws"];
    const both = (n) => clients.every((c) => page.ids(c).length >= n);
    await page.until(() => clients.every((c) => page.of(c, "state").some((s) => s.state === "open")), "all open");
    assert.equal(page.of("ws", "state").find((s) => s.state === "open").transport, "websocket");
    for (const id of sessions) await d.publish(id, "note", {});
    await page.until(() => both(3), "an event of each session in both");
    await d.post("/session/m2/disconnect"); // the whole stream
    for (const id of sessions) await d.publish(id, "note", {});
    await page.until(() => both(6), "6 events in both");
    const epochs = {};
    for (const id of sessions) epochs[id] = (await d.status(id)).body.epoch;
    for (const c of clients) {
      for (const id of sessions) {
        const evs = page.of(c, "event").filter((e) => e.session === id);
        assert.deepEqual(evs.map((e) => e.id), [2, 3], c + " " + id);
        assert.ok(evs.every((e) => e.epoch === epochs[id]), c + " " + id + ": " + JSON.stringify(evs));
      }
      assert.equal(page.of(c, "resync").length, 0, c);
    }

    await d.kill();
    d = await startDaemon(flags, port);
    for (const id of sessions) await d.publish(id, "note", { gen: 2 });
    await page.until(() => both(9) && clients.every((c) => page.of(c, "resync").length === 3), "the new epochs");
    // The WebSocket's attempts while the daemon was down fell back to SSE
    // (or not, as the timing goes); it ends on the WebSocket.
    await page.until(() => page.of("ws", "state").filter((s) => s.state === "open").at(-1)?.transport === "websocket", "the WebSocket again");
    for (const c of clients) {
      for (const rs of page.of(c, "resync")) {
        assert.equal(rs.reason, "epoch_reset", c);
        assert.equal(rs.previousEpoch, epochs[rs.session], c);
        assert.equal(rs.epoch, (await d.status(rs.session)).body.epoch, c);
      }
      for (const id of sessions) {
        assert.deepEqual(page.of(c, "event").filter((e) => e.session === id).map((e) => e.id), [2, 3, 1], c + " " + id);
      }
    }
    const esGets = page.forwarded.filter((f) => f.method === "GET" && !f.headers["x-viewer"] && !f.upgrade);
    assert.ok(esGets.every((f) => f.url.pathname === "/events" && f.url.searchParams.getAll("session").join() === "m1,m2,m3"));
    const upgrades = page.forwarded.filter((f) => f.upgrade);
    assert.ok(upgrades.every((f) => f.url.pathname === "/ws" && f.url.searchParams.getAll("session").join() === "m1,m2,m3" && f.headers["sec-websocket-protocol"] === "eventbus.v1"));
    assert.equal(upgrades[0].url.searchParams.get("lastEventId"), null, "live");
    assert.ok(upgrades.slice(1).every((f) => parseCursor(f.url.searchParams.get("lastEventId") ?? "")?.length === 3), "the WebSocket resumed with the composite cursor");
    assert.ok(esGets.some((f) => parseCursor(f.url.searchParams.get("lastEventId") ?? "")?.length === 3), "the EventSource resumed with the composite cursor");
  } finally {
    await browser.close();
    await page.close();
    await d.stop();
  }
});
