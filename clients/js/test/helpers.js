// Test helpers: the demo daemon (cmd/sessiond, built from this repository),
// a free port, and a recorder of everything a client reports.

import { execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync } from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { EventBusClient } from "../index.js";

const here = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(here, "../../..");

let built = null;

// sessiondPath builds cmd/sessiond once per process (the Go build cache
// makes later builds fast), unless SESSIOND names a binary already built.
// cmd/sessiond is a Go module of its own: it is built in its folder.
export function sessiondPath() {
  if (process.env.SESSIOND) return process.env.SESSIOND;
  if (built) return built;
  const dir = mkdtempSync(path.join(os.tmpdir(), "sessiond-"));
  const out = path.join(dir, "sessiond");
  const go = existsSync("/usr/local/go/bin/go") ? "/usr/local/go/bin/go" : "go";
  execFileSync(go, ["build", "-o", out, "."], { cwd: path.join(repoRoot, "cmd", "sessiond"), stdio: "inherit" });
  built = out;
  return out;
}

export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// Every daemon still running when the test process exits (a test that
// failed before its cleanup, a crash) is killed with it.
const running = new Set();
process.on("exit", () => {
  for (const p of running) p.kill("SIGKILL");
});

// startDaemon runs sessiond on port (a free one by default) with args and
// resolves once it listens. stop() sends SIGTERM and waits for the exit.
// With -auth-token in args, its helpers send that token.
export async function startDaemon(args = [], port) {
  const t = args.indexOf("-auth-token");
  const auth = t >= 0 ? { Authorization: "Bearer " + args[t + 1] } : {};
  port ??= await freePort();
  // -create-on-stream: a stream creates its session, as before the hub, so
  // that a client reconnecting across a restart or a DELETE finds a new epoch.
  const proc = spawn(sessiondPath(), ["-addr", "127.0.0.1:" + port, "-create-on-stream", ...args], { stdio: ["ignore", "ignore", "pipe"] });
  running.add(proc);
  proc.once("exit", () => running.delete(proc));
  let log = "";
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("sessiond did not start:\n" + log)), 15_000);
    proc.stderr.on("data", (b) => {
      log += b;
      if (log.includes("sessiond listening")) {
        clearTimeout(timer);
        resolve();
      }
    });
    proc.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error("sessiond exited with " + code + ":\n" + log));
    });
  });
  const base = "http://127.0.0.1:" + port;
  const exited = new Promise((resolve) => proc.once("exit", resolve));
  return {
    port,
    base,
    log: () => log,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGTERM");
      await exited;
    },
    // kill ends the daemon with SIGKILL, as a crash would: no shutdown
    // frame, every connection cut, every session lost.
    async kill() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
      await exited;
    },
    async publish(session, type, data) {
      const res = await fetch(base + "/session/" + session + "/events", {
        method: "POST",
        headers: { "Content-Type": "application/json", ...auth },
        body: JSON.stringify(data === undefined ? { type } : { type, data }),
      });
      const body = await res.json();
      if (res.status !== 200) throw new Error("publish: " + res.status + " " + JSON.stringify(body));
      return body;
    },
    // post sends a POST (with body as JSON, and headers instead of the
    // token's when given) and resolves with the answer's JSON.
    async post(p, body, headers = auth) {
      const res = await fetch(base + p, {
        method: "POST",
        headers: body === undefined ? headers : { "Content-Type": "application/json", ...headers },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      return res.json();
    },
    async del(session) {
      const res = await fetch(base + "/session/" + session, { method: "DELETE", headers: auth });
      await res.arrayBuffer();
      return res.status;
    },
    async status(session) {
      const res = await fetch(base + "/session/" + session, { headers: auth });
      return { status: res.status, body: await res.json() };
    },
  };
}

// record opens a client and records everything it reports, in order.
export function record(url, options = {}) {
  const log = [];
  const waiters = [];
  const check = () => {
    for (let i = waiters.length - 1; i >= 0; i--) {
      if (waiters[i].pred()) {
        waiters[i].resolve();
        waiters.splice(i, 1);
      }
    }
  };
  const push = (kind, v) => {
    log.push({ kind, v, at: Date.now() });
    check();
  };
  const wrap = (name, kind) => (v, d) => {
    push(kind, d === undefined ? v : { state: v, ...d });
    return options[name]?.(v, d);
  };
  const client = new EventBusClient(url, {
    ...options,
    onSessionGone: wrap("onSessionGone", "gone"),
    onEvent: wrap("onEvent", "event"),
    onSignal: wrap("onSignal", "signal"),
    onCaughtUp: wrap("onCaughtUp", "caughtUp"),
    onResync: wrap("onResync", "resync"),
    onSlow: wrap("onSlow", "slow"),
    onEvicted: wrap("onEvicted", "evicted"),
    onState: wrap("onState", "state"),
    onError: wrap("onError", "error"),
  });
  const of = (kind) => log.filter((e) => e.kind === kind).map((e) => e.v);
  return {
    client,
    log,
    of,
    ids: () => of("event").map((e) => e.id),
    states: () => of("state").map((s) => s.state),
    // until resolves once pred() holds, or fails after ms.
    until(pred, what = "condition", ms = 20_000) {
      if (pred()) return Promise.resolve();
      return new Promise((resolve, reject) => {
        // Checked at each report, and every 20 ms for what changes
        // without one (a position taken from a WebSocket's cursor line).
        const poll = setInterval(check, 20);
        const t = setTimeout(() => {
          clearInterval(poll);
          reject(new Error("timed out waiting for " + what + "; log:\n" + JSON.stringify(log.map((e) => [e.kind, e.v]), null, 0).slice(-3000)));
        }, ms);
        waiters.push({
          pred,
          resolve: () => {
            clearTimeout(t);
            clearInterval(poll);
            resolve();
          },
        });
      });
    },
  };
}

export const range = (a, b) => Array.from({ length: b - a + 1 }, (_, i) => a + i);
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// gate returns a fetch that holds requests while closed.
export function gatedFetch() {
  let open = true;
  let release = null;
  let waiting = Promise.resolve();
  const requests = [];
  const f = async (url, init) => {
    requests.push({ url: String(url), init, at: Date.now() });
    if (!open && (init?.method ?? "GET") === "GET") await waiting;
    return fetch(url, init);
  };
  return {
    fetch: f,
    requests,
    // wait resolves once the gate is open (for requests made otherwise).
    wait: () => (open ? Promise.resolve() : waiting),
    close() {
      if (!open) return;
      open = false;
      waiting = new Promise((r) => (release = r));
    },
    open() {
      open = true;
      release?.();
    },
  };
}

// scripted starts an HTTP server whose every request goes to
// handler(req, res, n) (n counts requests from 1). It records each request's
// URL and headers. close() ends every open connection.
export async function scripted(handler) {
  const { createServer } = await import("node:http");
  const requests = [];
  const sockets = new Set();
  const srv = createServer((req, res) => {
    requests.push({ url: new URL(req.url, "http://x"), method: req.method, headers: req.headers, at: Date.now() });
    Promise.resolve(handler(req, res, requests.length)).catch((e) => {
      console.error("scripted handler failed", e);
      res.destroy();
    });
  });
  srv.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  return {
    base: "http://127.0.0.1:" + srv.address().port,
    requests,
    close() {
      for (const s of sockets) s.destroy();
      return new Promise((r) => srv.close(r));
    },
  };
}

export const EPOCH_A = "a".repeat(32);
export const EPOCH_B = "b".repeat(32);

// open writes a 200 event-stream response's headers and retry: line.
export function open(res, { epoch = EPOCH_A, retry = 20 } = {}) {
  const h = { "Content-Type": "text/event-stream", "Cache-Control": "no-cache" };
  if (epoch) h["Event-Epoch"] = epoch;
  res.writeHead(200, h);
  res.write(retry === null ? "" : "retry: " + retry + "\n\n");
}

// ev is the wire form of a published event; idLine overrides its id: line.
export function ev(id, type = "note", data = {}, idLine = String(id)) {
  return "id: " + idLine + "\nevent: " + type + "\ndata: " + JSON.stringify({ id, v: 1, type, data }) + "\n\n";
}

// syn is the wire form of a synthetic frame.
export function syn(type, data) {
  return "event: " + type + "\ndata: " + JSON.stringify({ v: 1, type, data }) + "\n\n";
}

export function jsonError(res, status, code, headers = {}) {
  res.writeHead(status, { "Content-Type": "application/json", ...headers });
  res.end(JSON.stringify({ error: code.replace(/_/g, " "), code }) + "\n");
}
