// A minimal fetch client on npm "eventsource-parser", the way many apps and
// SDKs read SSE: it prints every event the parser dispatches (whatever its
// type) as one JSON line on stdout, keeps the last id, honours retry:, and on
// the end of a response or a network error reconnects after the retry delay
// with Last-Event-ID. It exits when stdin closes.
import { createParser } from "eventsource-parser";

const url = process.argv[2];
const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");
let lastId = "";
let retry = 1000;
let stopped = false;
let controller = null;

async function connect() {
  controller = new AbortController();
  const headers = { Accept: "text/event-stream" };
  if (lastId) headers["Last-Event-ID"] = lastId;
  const res = await fetch(url, { headers, signal: controller.signal });
  if (res.status !== 200) throw new Error("status " + res.status);
  out({ kind: "open" });
  const parser = createParser({
    onEvent: (e) => {
      if (e.id !== undefined) lastId = e.id;
      out({ kind: "event", type: e.event || "message", id: lastId, data: e.data });
    },
    onRetry: (ms) => { retry = ms; },
  });
  const decoder = new TextDecoder();
  for await (const chunk of res.body) parser.feed(decoder.decode(chunk, { stream: true }));
}

process.stdin.resume();
process.stdin.on("end", () => { stopped = true; if (controller) controller.abort(); process.exit(0); });
while (!stopped) {
  try {
    await connect();
    out({ kind: "end" });
  } catch (e) {
    out({ kind: "error", message: String(e && e.message) });
  }
  await new Promise((r) => setTimeout(r, retry));
}
