// The multiplexed stream over a WebSocket (options.webSocketURL, the
// daemon's GET /ws, docs/SPEC.md 6.10 and 9): read and resumed with the
// composite cursor, the fallback to SSE when /ws is not there and the way
// back after webSocketRetry with one cursor (no loss, no duplicate), add and
// remove on the open socket, the close codes, and a hostile server. The
// socket is the npm ws package's (Node 20 has no global WebSocket): a client
// nobody here wrote.

import assert from "node:assert/strict";
import net from "node:net";
import { after, before, test } from "node:test";
import WebSocket, { WebSocketServer } from "ws";
import { EventBusClient, epochTag, formatCursor, parseCursor, sessionTag } from "../index.js";
import { EPOCH_A, range, record, scripted, sleep, startDaemon } from "./helpers.js";

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

// proxy is a TCP proxy in front of port that answers a request for /ws
// with a plain 404 (a proxy that knows no WebSocket: no JSON, no server's
// answer) while blocked, and passes everything else through. It records
// the first line of every connection; cut() ends every open connection.
async function proxy(port) {
  const lines = [];
  const sockets = new Set();
  let blocked = true;
  const srv = net.createServer((c) => {
    sockets.add(c);
    c.on("close", () => sockets.delete(c));
    c.on("error", () => {});
    c.once("data", (first) => {
      const line = first.toString("latin1").split("\r\n", 1)[0];
      lines.push(line);
      if (blocked && line.startsWith("GET /ws")) {
        c.end("HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found");
        return;
      }
      const up = net.connect(port, "127.0.0.1");
      sockets.add(up);
      up.on("close", () => sockets.delete(up));
      up.on("error", () => c.destroy());
      c.on("error", () => up.destroy());
      up.write(first);
      c.pipe(up);
      up.pipe(c);
      c.on("close", () => up.destroy());
      up.on("close", () => c.destroy());
    });
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  return {
    base: "http://127.0.0.1:" + srv.address().port,
    lines,
    block(v) {
      blocked = v;
    },
    cut() {
      for (const s of sockets) s.destroy();
    },
    close() {
      for (const s of sockets) s.destroy();
      return new Promise((r) => srv.close(r));
    },
  };
}

test("options: webSocketURL needs sessions; http(s) becomes ws(s); WebSocket must be a constructor", () => {
  const f = () => Promise.reject(new Error("no network in this test"));
  assert.throws(() => new EventBusClient("http://x/session/a/events", { webSocketURL: "/ws", fetch: f }), TypeError);
  assert.throws(() => new EventBusClient("http://x/events", { sessions: ["a"], webSocketURL: "ftp://x/ws", fetch: f }), TypeError);
  assert.throws(() => new EventBusClient("http://x/events", { sessions: ["a"], webSocketURL: "/ws", webSocketRetry: 0, fetch: f }), RangeError);
  assert.throws(() => new EventBusClient("http://x/events", { sessions: ["a"], webSocketURL: "/ws", WebSocket: {}, fetch: f }), TypeError);
  const c = new EventBusClient("http://x/events", { sessions: ["a"], webSocketURL: "/ws", fetch: f });
  assert.equal(c.transport, null);
  c.close();
});

test("over the WebSocket (npm ws): live, the greeting's epochs, a /disconnect, each session resumed exactly with the cursor", async () => {
  const ids = ["w-a", "w-b", "w-c"];
  for (const id of ids) await d.publish(id, "note", { before: true }); // not delivered: live start
  const seen = [];
  class Spy extends WebSocket {
    constructor(url, protocols, opts) {
      seen.push({ url: new URL(url), protocols });
      super(url, protocols, opts);
    }
  }
  const r = record(d.base + "/events", { sessions: ids, webSocketURL: "/ws", WebSocket: Spy });
  try {
    await r.until(() => r.client.state === "open", "open");
    assert.equal(r.client.transport, "websocket");
    assert.equal(r.of("state").find((s) => s.state === "open").transport, "websocket");
    assert.equal(seen[0].url.protocol, "ws:");
    assert.equal(seen[0].url.pathname, "/ws");
    assert.deepEqual(seen[0].url.searchParams.getAll("session"), ids);
    assert.equal(seen[0].url.searchParams.get("lastEventId"), null, "live");
    assert.deepEqual(seen[0].protocols, ["eventbus.v1"]);
    // The greeting's cursor line gave every session its epoch and position.
    await r.until(() => ids.every((id) => r.client.session(id) !== null), "positions from the greeting");
    for (const id of ids) assert.deepEqual(r.client.session(id), { lastEventId: 1, epoch: (await d.status(id)).body.epoch });

    await d.publish(ids[0], "note", { n: 2 });
    await d.publish(ids[1], "note", { n: 2 });
    await r.until(() => r.ids().length === 2, "2 live events");
    const cursor = r.client.lastEventId;
    assert.equal(parseCursor(cursor).length, 3);

    await d.post("/session/" + ids[2] + "/disconnect"); // cuts the whole socket
    await r.until(() => r.states().filter((s) => s === "open").length === 2, "reopened");
    await d.publish(ids[2], "note", { n: 2 });
    await d.publish(ids[0], "note", { n: 3 });
    await r.until(() => r.ids().length === 4, "after the cut");
    assert.deepEqual(bySession(r.of("event")), { [ids[0]]: [2, 3], [ids[1]]: [2], [ids[2]]: [2] });
    assert.equal(seen.length, 2);
    const resumed = seen[1].url;
    assert.deepEqual(resumed.searchParams.getAll("session"), ids);
    assert.equal(resumed.searchParams.get("lastEventId"), cursor, "resumed from the cursor");
    assert.equal(r.client.stats.duplicates, 0);
    assert.equal(r.of("resync").length, 0);
    assert.deepEqual(r.of("caughtUp").map((c) => c.session).sort(), [...ids].sort(), "each session's own replay_complete");
    assert.deepEqual([...new Set(r.of("state").filter((s) => s.state === "open").map((s) => s.transport))], ["websocket"]);
  } finally {
    r.client.close();
  }
});

test("from the start (lastEventId 0) over the WebSocket, then the cursor resumes the same sessions over SSE", async () => {
  const ids = ["w0-a", "w0-b"];
  for (const n of range(1, 3)) await d.publish(ids[0], "note", { n });
  await d.publish(ids[1], "note", {});
  const r = record(d.base + "/events", { sessions: ids, webSocketURL: "/ws", WebSocket, lastEventId: 0 });
  await r.until(() => r.ids().length === 4 && r.of("caughtUp").length === 2, "the rings");
  const cursor = r.client.lastEventId;
  r.client.close();
  assert.deepEqual(bySession(r.of("event")), { [ids[0]]: [1, 2, 3], [ids[1]]: [1] });
  assert.ok(r.of("event").every((e) => e.replayed));
  await d.publish(ids[1], "note", {});
  // The WebSocket's cursor given to the SSE route.
  const s = record(d.base + "/events", { sessions: ids, lastEventId: cursor });
  try {
    await s.until(() => s.ids().length === 1 && s.of("caughtUp").length === 2, "resumed over SSE");
    assert.deepEqual(bySession(s.of("event")), { [ids[1]]: [2] });
    assert.equal(s.client.transport, "sse");
  } finally {
    s.client.close();
  }
});

test("fallback: /ws refused by a proxy (a plain 404) -> SSE at once; back to the WebSocket after webSocketRetry; one cursor, no loss, no duplicate", async (t) => {
  const ids = ["f-a", "f-b"];
  for (const id of ids) await d.publish(id, "note", {});
  const p = await proxy(d.port);
  const r = record(p.base + "/events", { sessions: ids, webSocketURL: "/ws", WebSocket, webSocketRetry: 700, lastEventId: 0 });
  let stop = false;
  const sent = { [ids[0]]: [1], [ids[1]]: [1] };
  const publisher = (async () => {
    for (let i = 0; !stop; i++) {
      const id = ids[i % 2];
      const { id: n } = await d.publish(id, "note", { i });
      sent[id].push(n);
      await sleep(15);
    }
  })();
  try {
    await r.until(() => r.client.transport === "sse", "SSE after the refused WebSocket");
    const fell = r.of("error").find((e) => e.kind === "websocket");
    assert.ok(fell, "the fallback is reported");
    assert.equal(fell.final, false);
    p.block(false);
    await r.until(() => r.client.transport === "websocket", "back on the WebSocket", 10_000);
    // Once more: refused again, cut, so the next is SSE again, then back.
    p.block(true);
    p.cut();
    await r.until(() => r.of("state").filter((s) => s.state === "open" && s.transport === "sse").length === 2, "SSE again");
    p.block(false);
    await r.until(() => r.of("state").filter((s) => s.state === "open" && s.transport === "websocket").length === 2, "WebSocket again", 10_000);
    await sleep(200);
    stop = true;
    await publisher;
    await r.until(() => r.ids().length === sent[ids[0]].length + sent[ids[1]].length, "every event", 5000);
    assert.deepEqual(bySession(r.of("event")), sent, "no loss, no duplicate, in order");
    assert.equal(r.client.stats.duplicates, 0, "the cursor moved across the switches: nothing replayed twice");
    assert.equal(r.of("resync").length, 0);
    const transports = r.of("state").filter((s) => s.state === "open").map((s) => s.transport);
    assert.deepEqual(transports, ["sse", "websocket", "sse", "websocket"]);
    assert.ok(p.lines.filter((l) => l.startsWith("GET /ws")).length >= 4);
    // What the switches cost: from the refused handshake to the SSE stream,
    // and how long each SSE stretch lasted (webSocketRetry: 700 ms).
    const at = (pred, from = 0) => r.log.findIndex((e, i) => i >= from && pred(e));
    const refused = at((e) => e.kind === "error" && e.v.kind === "websocket");
    const sse = at((e) => e.kind === "state" && e.v.state === "open" && e.v.transport === "sse", refused);
    const back = at((e) => e.kind === "state" && e.v.state === "open" && e.v.transport === "websocket", sse);
    t.diagnostic("refused WebSocket -> SSE open: " + (r.log[sse].at - r.log[refused].at) + " ms; SSE open -> WebSocket open: " +
      (r.log[back].at - r.log[sse].at) + " ms (webSocketRetry 700); " + r.ids().length + " events, " + r.client.stats.connects + " connections");
  } finally {
    stop = true;
    await publisher;
    r.client.close();
    await p.close();
  }
});

test("addSession and removeSession on the open socket: add (from the client's position) and remove, no reconnect", async () => {
  for (const id of ["ar-1", "ar-2", "ar-3"]) await d.publish(id, "note", {});
  const sockets = [];
  class Spy extends WebSocket {
    constructor(...a) {
      super(...a);
      sockets.push(this);
      const send = this.send.bind(this);
      this.sent = [];
      this.send = (m, ...rest) => {
        this.sent.push(JSON.parse(m));
        return send(m, ...rest);
      };
    }
  }
  const r = record(d.base + "/events", { sessions: ["ar-1", "ar-2"], webSocketURL: "/ws", WebSocket: Spy });
  try {
    await r.until(() => r.client.session("ar-2") !== null, "open");
    r.client.addSession("ar-3");
    await r.until(() => r.client.session("ar-3") !== null, "ar-3's position from the next cursor line");
    await d.publish("ar-3", "note", {});
    await d.publish("ar-1", "note", {});
    await r.until(() => r.ids().length === 2, "events of ar-3 and ar-1");
    assert.deepEqual(r.client.sessions, ["ar-1", "ar-2", "ar-3"]);

    r.client.removeSession("ar-1");
    await d.publish("ar-1", "note", {}); // may come before the removed: dropped
    await sleep(150);
    await d.publish("ar-1", "note", {});
    await d.publish("ar-2", "note", {});
    await r.until(() => r.ids().length === 3, "ar-2's");
    // ar-1 back, from its position: what it missed, no duplicate.
    r.client.addSession("ar-1");
    await r.until(() => r.of("event").filter((e) => e.session === "ar-1").length === 3, "ar-1's missed events");
    assert.deepEqual(bySession(r.of("event")), { "ar-1": [2, 3, 4], "ar-2": [2], "ar-3": [2] });
    assert.equal(sockets.length, 1, "one socket");
    assert.equal(r.client.stats.connects, 1);
    const ops = sockets[0].sent;
    assert.deepEqual(ops.map((m) => m.op + " " + m.session), ["add ar-3", "remove ar-1", "add ar-1"]);
    assert.equal(ops[0].lastEventId, undefined, "live");
    const [e] = parseCursor(ops[2].lastEventId);
    assert.equal(e.session, sessionTag("ar-1"));
    assert.equal(e.id, 2);
    assert.equal(e.epoch, epochTag((await d.status("ar-1")).body.epoch));
    assert.equal(r.of("error").length, 0);
  } finally {
    r.client.close();
  }
});

test("an add the server refuses (404 session_not_found) is reported; the client reconnects and the handshake's answer decides", async () => {
  const dd = await startDaemon(["-retry", "100ms", "-create-on-stream=false"]);
  try {
    await dd.publish("n-1", "note", {});
    const r = record(dd.base + "/events", { sessions: ["n-1"], webSocketURL: "/ws", WebSocket });
    await r.until(() => r.client.session("n-1") !== null, "open");
    r.client.addSession("n-nope");
    await r.until(() => r.of("gone").length === 1, "n-nope gone");
    const refused = r.of("error").find((e) => e.session === "n-nope" && e.status === 404);
    assert.equal(refused.code, "session_not_found");
    assert.deepEqual(r.client.sessions, ["n-1"]);
    await dd.publish("n-1", "note", {});
    await r.until(() => r.ids().length === 1, "n-1 goes on");
    // The handshake's 404 was the server's (its JSON error, which the ws
    // package shows): it counted as over SSE, no fallback.
    assert.equal(r.client.transport, "websocket");
    assert.equal(r.of("error").filter((e) => e.kind === "websocket").length, 0);
    assert.deepEqual(r.of("state").filter((s) => s.state === "open").map((s) => s.transport), ["websocket", "websocket"]);
    r.client.close();
  } finally {
    await dd.stop();
  }
});

// wsServer is a scripted WebSocket server: each connection is handed to
// onConnection(socket, url, n); it records the handshakes' URLs.
async function wsServer(onConnection, options = {}) {
  const s = await scripted((req, res) => {
    res.writeHead(404, { "Content-Type": "text/plain" });
    res.end("no SSE here");
  });
  const { createServer } = await import("node:http");
  const http = createServer((req, res) => {
    res.writeHead(404);
    res.end();
  });
  const wss = new WebSocketServer({ server: http, handleProtocols: (ps) => (ps.has("eventbus.v1") ? "eventbus.v1" : false), ...options });
  const urls = [];
  wss.on("connection", (sock, req) => {
    const url = new URL(req.url, "http://x");
    urls.push(url);
    onConnection(sock, url, urls.length);
  });
  await new Promise((r) => http.listen(0, "127.0.0.1", r));
  return {
    base: "http://127.0.0.1:" + http.address().port,
    urls,
    async close() {
      for (const c of wss.clients) c.terminate();
      await new Promise((r) => wss.close(r));
      await new Promise((r) => http.close(r));
      await s.close();
    },
  };
}

const cursorOf = (pairs) => formatCursor(pairs.map(([s, e, id]) => ({ session: sessionTag(s), epoch: epochTag(e), id })));
const greeting = (a) => JSON.stringify({ op: "cursor", cursor: cursorOf([["a", EPOCH_A, a]]), epochs: { a: EPOCH_A } });
const frame = (id) => JSON.stringify({ session: "a", id, v: 1, type: "note", data: { id } });
const cursorLine = (a) => JSON.stringify({ op: "cursor", cursor: cursorOf([["a", EPOCH_A, a]]) });

test("the server's own answer to the handshake (ws shows it): a 401 asks for credentials, a 429 waits its Retry-After; a proxy's page falls back", async () => {
  const asked = [];
  const { createServer } = await import("node:http");
  let n = 0;
  // Its SSE route: a stream that stays open, until the client leaves it
  // for the WebSocket.
  const http = createServer((req, res) => {
    res.writeHead(200, { "Content-Type": "text/event-stream", "Event-Epochs": EPOCH_A });
    res.write("retry: 20\n\n");
  });
  const wss = new WebSocketServer({ noServer: true });
  const urls = [];
  http.on("upgrade", (req, socket, head) => {
    n++;
    urls.push({ url: new URL(req.url, "http://x"), auth: req.headers.authorization, at: Date.now() });
    const answer = (status, headers, body) => {
      socket.end("HTTP/1.1 " + status + " X\r\nConnection: close\r\nContent-Length: " + Buffer.byteLength(body) + "\r\n" + headers + "\r\n" + body);
    };
    if (n === 1) return answer(401, "Content-Type: application/json\r\nWWW-Authenticate: Bearer\r\n", JSON.stringify({ error: "no", code: "unauthorized" }));
    if (n === 2) return answer(429, "Content-Type: application/json\r\nRetry-After: 1\r\n", JSON.stringify({ error: "full", code: "subscriber_limit_exceeded", session: "a" }));
    if (n === 3) return answer(502, "Content-Type: text/html\r\n", "<h1>Bad Gateway</h1>");
    wss.handleUpgrade(req, socket, head, (sock) => sock.send(greeting(0)));
  });
  await new Promise((r) => http.listen(0, "127.0.0.1", r));
  const base = "http://127.0.0.1:" + http.address().port;
  const r = record(base + "/events", {
    sessions: ["a"],
    webSocketURL: "/ws",
    WebSocket,
    webSocketRetry: 300,
    credentials: ({ reason }) => {
      asked.push(reason);
      return { token: "t" + asked.length };
    },
  });
  try {
    await r.until(() => r.client.transport === "websocket", "on the WebSocket", 10_000);
    assert.deepEqual(r.of("state").filter((s) => s.state === "open").map((s) => s.transport), ["sse", "websocket"]);
    assert.deepEqual(asked, ["initial", "unauthorized"]);
    assert.deepEqual(urls.map((u) => u.auth), ["Bearer t1", "Bearer t2", "Bearer t2", "Bearer t2"]);
    const errs = r.of("error");
    assert.deepEqual(errs.map((e) => e.kind + " " + (e.status ?? "")), ["http 401", "http 429", "websocket "]);
    assert.equal(errs[1].retryAfter, 1000);
    assert.ok(urls[2].at - urls[1].at >= 1000, "waited the Retry-After");
  } finally {
    r.client.close();
    for (const c of wss.clients) c.terminate();
    http.closeAllConnections();
    await new Promise((res) => http.close(res));
  }
});

test("close code 4429 (evicted, with and without its frame): resumed with the cursor, no loss, no duplicate", async () => {
  const srv = await wsServer((sock, url, n) => {
    if (n === 1) {
      sock.send(greeting(0));
      sock.send([frame(1), frame(2), cursorLine(2)].join("\n"));
      sock.send([frame(3), JSON.stringify({ session: "a", v: 1, type: "client_evicted", data: { reason: "queue_full" } })].join("\n"));
      sock.close(4429, "evicted");
    } else if (n === 2) {
      sock.send(greeting(3));
      sock.send([frame(4), cursorLine(4)].join("\n"));
      setTimeout(() => sock.close(4429, "evicted"), 20); // no client_evicted frame this time
    } else {
      sock.send(greeting(4));
      sock.send([frame(4), frame(5), cursorLine(5)].join("\n")); // 4 again: a duplicate, dropped
    }
  });
  const r = record(srv.base + "/events", { sessions: ["a"], webSocketURL: "/ws", WebSocket, lastEventId: 0, initialDelay: 20 });
  try {
    await r.until(() => r.ids().length === 5, "5 events");
    assert.deepEqual(r.ids(), [1, 2, 3, 4, 5]);
    assert.equal(r.of("evicted").length, 1);
    assert.equal(srv.urls.length, 3);
    assert.equal(srv.urls[0].searchParams.get("lastEventId"), "0");
    assert.equal(srv.urls[1].searchParams.get("lastEventId"), cursorOf([["a", EPOCH_A, 3]]));
    assert.equal(srv.urls[2].searchParams.get("lastEventId"), cursorOf([["a", EPOCH_A, 4]]));
    assert.equal(r.client.stats.duplicates, 1);
    assert.deepEqual([...new Set(r.of("state").filter((s) => s.state === "open").map((s) => s.transport))], ["websocket"]);
    assert.ok(r.of("error").every((e) => !e.final));
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("close codes 4401, 4403, 1001: reauthenticate and revoked reconnect at once with fresh credentials, shutdown after its wait", async () => {
  const asked = [];
  const srv = await wsServer((sock, url, n) => {
    sock.send(greeting(0));
    if (n === 1) setTimeout(() => sock.close(4401, "reauthenticate"), 10);
    if (n === 2) setTimeout(() => sock.close(4403, "revoked"), 10);
    if (n === 3) setTimeout(() => sock.close(1001, "shutdown"), 10);
  });
  const r = record(srv.base + "/events", {
    sessions: ["a"],
    webSocketURL: "/ws",
    WebSocket,
    maxDelay: 200, // a shutdown waits [ra, 2ra], ra capped at maxDelay/2
    credentials: ({ reason }) => {
      asked.push(reason);
      return { token: "t" + asked.length };
    },
  });
  try {
    await r.until(() => srv.urls.length === 4, "4 sockets");
    assert.deepEqual(asked, ["initial", "reauthenticate", "revoked"]);
    const kinds = r.of("error").filter((e) => e.kind === "stream_error").map((e) => e.errorKind);
    assert.deepEqual(kinds, ["reauthenticate", "revoked", "shutdown"]);
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("a hostile server: garbage lines, a binary message, a frame of no session, unknown ops, an oversized message: reported, never a crash", async () => {
  const srv = await wsServer((sock, url, n) => {
    if (n === 1) {
      sock.send(greeting(0));
      sock.send(["not json", "{", "[1,2]", '{"op":7}', '{"op":"surprise","x":1}', frame(1), '{"session":"zz","id":9,"v":1,"type":"x"}', '{"session":"a","id":-1,"v":1,"type":"x"}', '{"op":"cursor","cursor":"m1bogus"}', '{"op":"cursor","cursor":"m1r2PcTIYBI0VniasAAAAAAAAq","epochs":{"__proto__":"x","a":5}}', cursorLine(1)].join("\n"));
      sock.send(Buffer.from([0, 1, 2]), { binary: true });
      sock.send("\n\n\n" + frame(2) + "\n");
      // A cut: the client resumes with its cursor.
      setTimeout(() => sock.terminate(), 50);
    } else {
      sock.send(greeting(2));
      sock.send([frame(3), cursorLine(3)].join("\n"));
      // One line above maxEventBytes: final, as an oversized SSE event.
      sock.send([frame(4), JSON.stringify({ session: "a", id: 5, v: 1, type: "big", data: "y".repeat(8192) })].join("\n"));
    }
  });
  const r = record(srv.base + "/events", { sessions: ["a"], webSocketURL: "/ws", WebSocket, lastEventId: 0, maxEventBytes: 4096, initialDelay: 20 });
  try {
    const err = await r.client.done;
    assert.equal(err.kind, "event_too_large");
    assert.equal(err.final, true);
    assert.deepEqual(r.ids(), [1, 2, 3, 4]);
    const protocol = r.of("error").filter((e) => e.kind === "protocol");
    assert.ok(protocol.length >= 8, "each bad line reported: " + protocol.map((e) => e.message).join("; "));
    assert.ok(protocol.some((e) => /binary/.test(e.message)));
    assert.equal(srv.urls.length, 2);
    assert.equal(srv.urls[1].searchParams.get("lastEventId"), cursorOf([["a", EPOCH_A, 2]]));
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("a silent socket that answers no ping: idleTimeout ends it and the client resumes; one that answers pings stays", async () => {
  const srv = await wsServer((sock, url, n) => {
    sock.send(greeting(n === 1 ? 0 : 1));
    if (n === 1) sock.send([frame(1), cursorLine(1)].join("\n"));
    if (n === 2) sock.send([frame(2), cursorLine(2)].join("\n"));
  }, { autoPong: false });
  const r = record(srv.base + "/events", { sessions: ["a"], webSocketURL: "/ws", WebSocket, lastEventId: 0, idleTimeout: 300, initialDelay: 20 });
  try {
    await r.until(() => r.ids().length === 2, "resumed after the idle timeout");
    assert.equal(r.of("error").find((e) => e.kind === "idle_timeout")?.final, false);
    assert.equal(srv.urls[1].searchParams.get("lastEventId"), cursorOf([["a", EPOCH_A, 1]]));
  } finally {
    r.client.close();
    await srv.close();
  }
  const live = await wsServer((sock) => sock.send(greeting(0)));
  const q = record(live.base + "/events", { sessions: ["a"], webSocketURL: "/ws", WebSocket, idleTimeout: 300 });
  try {
    await sleep(1200); // four idle timeouts, kept alive by the pongs alone
    assert.equal(live.urls.length, 1);
    assert.equal(q.of("error").length, 0);
  } finally {
    q.client.close();
    await live.close();
  }
});

test("a socket cut before its first message, or a server that never answers the handshake: SSE at once, the same cursor", async () => {
  // A scripted server whose /ws accepts the handshake and closes at once,
  // and whose /events serves the multiplexed SSE stream.
  const cursor = cursorOf([["a", EPOCH_A, 7]]);
  const { createServer } = await import("node:http");
  const http = createServer((req, res) => {
    const u = new URL(req.url, "http://x");
    if (u.pathname !== "/events") {
      res.writeHead(404);
      return res.end();
    }
    res.writeHead(200, { "Content-Type": "text/event-stream", "Event-Epochs": EPOCH_A });
    res.write("retry: 20\n\n");
    const c8 = cursorOf([["a", EPOCH_A, 8]]);
    res.write("id: " + c8 + "\nevent: note\ndata: " + JSON.stringify({ session: "a", id: 8, v: 1, type: "note" }) + "\n\n");
  });
  const wss = new WebSocketServer({ server: http });
  const urls = [];
  wss.on("connection", (sock, req) => {
    urls.push(new URL(req.url, "http://x"));
    sock.close(1000); // cut before its first message
  });
  await new Promise((r) => http.listen(0, "127.0.0.1", r));
  const base = "http://127.0.0.1:" + http.address().port;
  const r = record(base + "/events", { sessions: ["a"], webSocketURL: "/ws", WebSocket, lastEventId: cursor });
  try {
    await r.until(() => r.ids().length === 1, "over SSE");
    assert.equal(r.client.transport, "sse");
    assert.equal(urls.length, 1);
    assert.equal(urls[0].searchParams.get("lastEventId"), cursor);
    assert.match(r.of("error").find((e) => e.kind === "websocket").message, /before its first message/);
    assert.deepEqual(r.client.session("a"), { lastEventId: 8, epoch: EPOCH_A });
  } finally {
    r.client.close();
    for (const c of wss.clients) c.terminate();
    http.closeAllConnections();
    await new Promise((r) => wss.close(r));
    await new Promise((r) => http.close(r));
  }
});

test("the epoch changes under the WebSocket (a kill -9 and a restart): epoch_reset per session, resumed, no silent loss", async () => {
  const dd = await startDaemon(["-retry", "100ms"]);
  const ids = ["k-a", "k-b"];
  for (const id of ids) await dd.publish(id, "note", {});
  // The attempts while the daemon is down may fall back to SSE (no
  // connection): webSocketRetry brings the client back soon.
  const r = record(dd.base + "/events", { sessions: ids, webSocketURL: "/ws", WebSocket, initialDelay: 50, webSocketRetry: 500 });
  let dd2;
  try {
    await r.until(() => ids.every((id) => r.client.session(id) !== null), "open");
    for (const id of ids) await dd.publish(id, "note", {});
    await r.until(() => r.ids().length === 2, "2 events");
    const old = Object.fromEntries(r.of("event").map((e) => [e.session, e.epoch]));
    await dd.kill();
    // The port can be briefly taken while the client keeps knocking (a
    // loopback connect to a port of the ephemeral range with no listener
    // can connect to itself): try again.
    for (let i = 0; !dd2; i++) {
      try {
        dd2 = await startDaemon(["-retry", "100ms"], dd.port);
      } catch (e) {
        if (i === 10 || !/address already in use/.test(e.message)) throw e;
        await sleep(100);
      }
    }
    await dd2.publish("k-a", "note", { gen: 2 });
    await r.until(() => r.of("resync").length === 2 && r.of("caughtUp").length === 2, "two epoch_resets");
    for (const x of r.of("resync")) {
      assert.equal(x.reason, "epoch_reset");
      assert.equal(x.previousEpoch, old[x.session]);
      assert.equal(x.epoch, (await dd2.status(x.session)).body.epoch);
    }
    await r.until(() => r.ids().length === 3, "k-a's new #1");
    await r.until(() => r.client.transport === "websocket", "on the WebSocket again");
    await dd2.publish("k-b", "note", {});
    await r.until(() => r.ids().length === 4, "k-b's new #1");
    assert.deepEqual(bySession(r.of("event")), { "k-a": [2, 1], "k-b": [2, 1] });
    assert.equal(r.client.stats.duplicates, 0);
  } finally {
    r.client.close();
    await dd2?.stop();
    await dd.stop();
  }
});

test("Node's own WebSocket global, where there is one (Node 22+)", { skip: typeof globalThis.WebSocket !== "function" && "no global WebSocket in this Node" }, async () => {
  await d.publish("g-a", "note", {});
  const r = record(d.base + "/events", { sessions: ["g-a"], webSocketURL: "/ws" });
  try {
    await r.until(() => r.client.transport === "websocket", "open");
    await r.until(() => r.client.session("g-a") !== null, "greeted");
    await d.publish("g-a", "note", {});
    await r.until(() => r.ids().length === 1, "an event");
  } finally {
    r.client.close();
  }
});

test("a message above maxEventBytes and a batch's slack (the ws package closes the socket, 1009) is final: event_too_large, no resume", async () => {
  const srv = await wsServer((sock) => {
    sock.send(greeting(0));
    sock.send([frame(1), cursorLine(1)].join("\n"));
    sock.send("x".repeat(600 * 1024));
  });
  const r = record(srv.base + "/events", { sessions: ["a"], webSocketURL: "/ws", WebSocket, lastEventId: 0, maxEventBytes: 4096, initialDelay: 20 });
  try {
    const err = await r.client.done;
    assert.equal(err.kind, "event_too_large");
    assert.equal(err.final, true);
    assert.deepEqual(r.ids(), [1]);
    assert.equal(srv.urls.length, 1, "no resume: the same batch would come again");
  } finally {
    r.client.close();
    await srv.close();
  }
});

test("with the ws package, a slow onEvent pauses the socket past twice a batch's bound and resumes it once caught up: nothing lost, nothing twice", async () => {
  let sock;
  // A socket of the ws package's shape, driven by the test.
  class PausableWS {
    constructor() {
      sock = this;
      this.readyState = 0;
      this.pauses = 0;
      this.resumes = 0;
      setTimeout(() => {
        this.readyState = 1;
        this.onopen?.();
      }, 0);
    }
    on() {}
    off() {}
    send() {}
    close() {
      if (this.readyState === 3) return;
      this.readyState = 3;
      setTimeout(() => this.onclose?.({ code: 1000, reason: "" }), 0);
    }
    pause() {
      this.pauses++;
    }
    resume() {
      this.resumes++;
    }
  }
  let release;
  const gate = new Promise((res) => (release = res));
  const r = record("http://127.0.0.1:9/events", {
    sessions: ["a"],
    webSocketURL: "/ws",
    WebSocket: PausableWS,
    lastEventId: 0,
    maxEventBytes: 4096,
    onEvent: (e) => (e.id === 1 ? gate : undefined),
  });
  try {
    await r.until(() => sock?.readyState === 1, "the socket open");
    sock.onmessage({ data: greeting(0) });
    // 5 messages of 100 frames of about 3 KiB: 1.5 M characters, past
    // twice the bound (4 KiB + 512 KiB) while event 1 is held.
    const big = (id) => JSON.stringify({ session: "a", id, v: 1, type: "note", data: "y".repeat(3000) });
    let id = 0;
    for (let m = 0; m < 5; m++) {
      const lines = [];
      for (let k = 0; k < 100; k++) lines.push(big(++id));
      lines.push(cursorLine(id));
      sock.onmessage({ data: lines.join("\n") });
    }
    await sleep(50);
    assert.equal(sock.pauses, 1, "paused once, past the bound");
    assert.equal(sock.resumes, 0, "not resumed while the application holds event 1");
    release();
    await r.until(() => r.ids().length === 500, "500 events");
    assert.equal(sock.resumes, 1, "resumed once caught up");
    assert.deepEqual(r.ids(), range(1, 500));
  } finally {
    r.client.close();
  }
});

test("a JSON refusal that says no WebSocket is served there (426 upgrade_required: a proxy that dropped the Upgrade headers; 404 not_found: a daemon without /ws) falls back to SSE, not final", async () => {
  const { createServer } = await import("node:http");
  let n = 0;
  const http = createServer((req, res) => {
    res.writeHead(200, { "Content-Type": "text/event-stream", "Event-Epochs": EPOCH_A });
    res.write("retry: 20\n\n");
  });
  http.on("upgrade", (req, socket) => {
    n++;
    const [status, code] = n === 1 ? [426, "upgrade_required"] : [404, "not_found"];
    const body = JSON.stringify({ error: "no websocket here", code });
    socket.end("HTTP/1.1 " + status + " X\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: " + Buffer.byteLength(body) + "\r\n\r\n" + body);
  });
  await new Promise((r) => http.listen(0, "127.0.0.1", r));
  const base = "http://127.0.0.1:" + http.address().port;
  const r = record(base + "/events", { sessions: ["a"], webSocketURL: "/ws", WebSocket, webSocketRetry: 200 });
  try {
    await r.until(() => n >= 2 && r.of("state").filter((s) => s.state === "open").length >= 2, "two handshakes refused, SSE after each", 10_000);
    const kinds = r.of("error").map((e) => e.kind);
    assert.ok(kinds.length >= 2 && kinds.every((k) => k === "websocket"), "each refusal a fallback: " + kinds.join(", "));
    assert.ok(r.of("state").filter((s) => s.state === "open").every((s) => s.transport === "sse"));
    assert.equal(r.of("error").some((e) => e.final), false);
  } finally {
    r.client.close();
    http.closeAllConnections();
    await new Promise((res) => http.close(res));
  }
});
