// npm "eventsource" (a WHATWG EventSource for Node) against one stream URL.
// Every frame of the types a page would listen for, and every unnamed
// ("message") event, is printed as one JSON line on stdout; so are opens and
// errors. It reconnects by itself, as a browser does, sending Last-Event-ID.
// It exits when stdin closes.
import { EventSource } from "eventsource";

const url = process.argv[2];
const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");
const es = new EventSource(url);
for (const type of ["message", "note", "replay_complete", "state_resync_required", "slow_client_warning", "client_evicted", "stream_error"]) {
  es.addEventListener(type, (e) => out({ kind: "event", type: e.type, id: e.lastEventId, data: e.data }));
}
es.onopen = () => out({ kind: "open" });
es.onerror = (e) => out({ kind: "error", message: String(e && e.message) });
process.stdin.resume();
process.stdin.on("end", () => { es.close(); process.exit(0); });
