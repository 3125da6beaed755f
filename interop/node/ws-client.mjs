// npm "ws" as a WebSocket client of eventbus (docs/SPEC.md 6.10), driven by
// the Go test ../websocket_test.go with the same commands and records as
// ../python/ws_client.py (see there): JSON lines on stdin, JSON lines on
// stdout. When the WebSocket handshake is answered 404 it falls back to the
// multiplexed SSE route with its cursor as Last-Event-ID, read with fetch
// and npm eventsource-parser.
import WebSocket from "ws";
import { createParser } from "eventsource-parser";
import { createInterface } from "node:readline";

const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");

let cursor = "";
let sock = null; // the open WebSocket
let sse = null; // the AbortController of the SSE fetch
let ended = null; // a promise that resolves when the current connection ended

const withCursor = (url, c) => (c ? url + (url.includes("?") ? "&" : "?") + new URLSearchParams({ lastEventId: c }) : url);

function openWS(cmd) {
  const c = cmd.resume ? cursor : cmd.cursor || "";
  let done;
  ended = new Promise((r) => (done = r));
  const ws = new WebSocket(withCursor(cmd.ws, c), ["eventbus.v1"], { perMessageDeflate: false, maxPayload: 0 });
  let opened = false;
  ws.on("unexpected-response", (req, res) => {
    res.resume();
    if (res.statusCode === 404 && cmd.sse) {
      out({ kind: "fallback", status: res.statusCode });
      openSSE(cmd.sse, c, done);
    } else {
      out({ kind: "refused", status: res.statusCode });
      done();
    }
    req.destroy();
  });
  ws.on("open", () => {
    opened = true;
    sock = ws;
    out({ kind: "open", transport: "ws", subprotocol: ws.protocol });
  });
  ws.on("message", (data, isBinary) => {
    if (isBinary) {
      out({ kind: "error", message: "a binary message" });
      return;
    }
    for (const line of data.toString("utf8").split("\n")) {
      if (line.startsWith('{"op":')) {
        const ctl = JSON.parse(line);
        if (ctl.op === "cursor") {
          cursor = ctl.cursor;
          out({ kind: "cursor", cursor: ctl.cursor });
        } else {
          out({ kind: "control", data: line });
        }
      } else {
        out({ kind: "frame", transport: "ws", data: line });
      }
    }
  });
  ws.on("error", (e) => {
    if (!opened) out({ kind: "error", message: String(e && e.message) });
  });
  ws.on("close", (code, reason) => {
    sock = null;
    if (opened) out({ kind: "close", code: code === 1005 || code === 1006 ? 0 : code, reason: reason.toString() });
    done();
  });
}

async function openSSE(url, c, done) {
  const ac = new AbortController();
  sse = ac;
  try {
    const headers = { Accept: "text/event-stream" };
    if (c) headers["Last-Event-ID"] = c;
    const res = await fetch(url, { headers, signal: ac.signal });
    if (res.status !== 200) {
      out({ kind: "refused", status: res.status, message: await res.text() });
      return;
    }
    out({ kind: "open", transport: "sse", subprotocol: "" });
    const parser = createParser({
      onEvent(ev) {
        if (ev.id) cursor = ev.id;
        out({ kind: "frame", transport: "sse", data: ev.data, id: ev.id || "" });
      },
    });
    const dec = new TextDecoder();
    for await (const chunk of res.body) parser.feed(dec.decode(chunk, { stream: true }));
  } catch (e) {
    if (e.name !== "AbortError") out({ kind: "error", message: String(e) });
  } finally {
    sse = null;
    out({ kind: "close", code: 0, reason: "sse" });
    done();
  }
}

async function close() {
  if (sock) sock.close(1000);
  if (sse) sse.abort();
  if (ended) await ended;
  ended = null;
  out({ kind: "closed" });
}

const rl = createInterface({ input: process.stdin });
for await (const line of rl) {
  const cmd = JSON.parse(line);
  try {
    switch (cmd.cmd) {
      case "open":
        openWS(cmd);
        break;
      case "send":
        sock.send(cmd.text);
        break;
      case "sendbinary":
        sock.send(Buffer.from(cmd.text), { binary: true });
        break;
      case "close":
        await close();
        break;
      case "quit":
        process.exit(0);
    }
  } catch (e) {
    out({ kind: "error", message: String(e) });
  }
}
process.exit(0);
