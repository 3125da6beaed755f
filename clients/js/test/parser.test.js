import assert from "node:assert/strict";
import { test } from "node:test";
import { SSEParseError, SSEParser } from "../index.js";

const enc = new TextEncoder();

// feedAll parses chunks and returns every record.
function feedAll(chunks, opts) {
  const p = new SSEParser(opts);
  const out = [];
  for (const c of chunks) for (const r of p.feed(c)) out.push(r);
  return out;
}

const events = (recs) => recs.filter((r) => r.kind === "event");

// splits returns the stream cut at every position into two chunks, and into
// single bytes.
function* splits(s) {
  const b = enc.encode(s);
  for (let i = 0; i <= b.length; i++) yield [b.subarray(0, i), b.subarray(i)];
  yield Array.from(b, (x) => Uint8Array.of(x));
}

test("the three line ends, mixed, give the same events at every split", () => {
  const want = [
    { kind: "event", type: "a", data: "1\n2", id: "7", lastEventId: "7" },
    { kind: "event", type: "message", data: "3", id: null, lastEventId: "7" },
  ];
  for (const s of [
    "event: a\ndata: 1\ndata: 2\nid: 7\n\ndata: 3\n\n",
    "event: a\r\ndata: 1\r\ndata: 2\r\nid: 7\r\n\r\ndata: 3\r\n\r\n",
    "event: a\rdata: 1\rdata: 2\rid: 7\r\rdata: 3\r\r",
    "event: a\r\ndata: 1\rdata: 2\nid: 7\r\n\rdata: 3\n\r\n",
  ]) {
    for (const chunks of splits(s)) assert.deepEqual(feedAll(chunks), want, JSON.stringify(s));
  }
});

test("a CR at the end of a chunk and an LF at the start of the next are one line end", () => {
  const recs = feedAll(["data: x\r", "\n", "\r", "\n"]);
  assert.deepEqual(events(recs), [{ kind: "event", type: "message", data: "x", id: null, lastEventId: "" }]);
  // CR CR is two line ends: the event is dispatched by the second.
  assert.equal(events(feedAll(["data: y\r", "\r"])).length, 1);
});

test("one leading BOM is skipped, also split across chunks; a second one is not", () => {
  for (const chunks of splits("\uFEFFdata: x\n\n")) {
    assert.deepEqual(events(feedAll(chunks)).map((e) => e.data), ["x"]);
  }
  // A BOM after the first one is part of the field name: an unknown field.
  assert.deepEqual(events(feedAll(["\uFEFF\uFEFFdata: x\n\n"])), []);
  // A stream shorter than a BOM that is a prefix of one is held back, then decided.
  const p = new SSEParser();
  assert.deepEqual(p.feed(Uint8Array.of(0xef)), []);
  assert.deepEqual(p.feed(enc.encode("data: x\n\n")).length, 0, "0xEF then 'd' is not a BOM: an unknown field");
});

test("comments, fields without a colon, one leading space only, unknown fields", () => {
  const recs = feedAll([": heartbeat\n:\ndata\n\ndata:  two spaces\nfoo: bar\nevent\ndata:x\n\n"]);
  assert.deepEqual(recs, [
    { kind: "comment", comment: " heartbeat" },
    { kind: "comment", comment: "" },
    { kind: "event", type: "message", data: "", id: null, lastEventId: "" },
    { kind: "event", type: "message", data: " two spaces\nx", id: null, lastEventId: "" },
  ]);
});

test("a heartbeat or a lone retry block dispatches no event", () => {
  const recs = feedAll(["retry: 3000\n\n: heartbeat\n\nid: 5\n\n"]);
  assert.deepEqual(recs, [
    { kind: "retry", retry: 3000 },
    { kind: "comment", comment: " heartbeat" },
  ]);
});

test("retry takes ASCII digits only", () => {
  const recs = feedAll(["retry: 10\nretry: 1x\nretry: -1\nretry:\nretry: 1.5\nretry:  20\nretry:0042\n\n"]);
  assert.deepEqual(recs.map((r) => r.retry), [10, 42]);
});

test("id: persists, empty resets, NUL is ignored, and it is set even without data", () => {
  const recs = events(feedAll(["id: 1\ndata: a\n\ndata: b\n\nid: 2\n\ndata: c\n\nid: x\0y\ndata: d\n\nid\ndata: e\n\n"]));
  assert.deepEqual(recs.map((e) => [e.data, e.id, e.lastEventId]), [
    ["a", "1", "1"],
    ["b", null, "1"],
    ["c", null, "2"],
    ["d", null, "2"],
    ["e", "", ""],
  ]);
  const p = new SSEParser();
  p.feed("id: 9\n\n");
  assert.equal(p.lastEventId, "9");
});

test("an event not terminated by a blank line is discarded at the end", () => {
  const p = new SSEParser();
  assert.deepEqual(p.feed("data: a\n\ndata: b\n"), [{ kind: "event", type: "message", data: "a", id: null, lastEventId: "" }]);
  p.end();
  assert.deepEqual(p.feed("data: c\n\n").map((r) => r.data), ["c"]);
});

test("UTF-8 split across chunks at every byte, and invalid bytes become U+FFFD", () => {
  const s = "data: h\u00e9llo \u{1F600} \u4e16\n\n";
  for (const chunks of splits(s)) assert.equal(events(feedAll(chunks))[0].data, "h\u00e9llo \u{1F600} \u4e16");
  const bad = Uint8Array.of(...enc.encode("data: "), 0xff, 0xc3, 10, 10);
  assert.equal(events(feedAll([bad]))[0].data, "\uFFFD\uFFFD");
});

test("field names are case-sensitive and exact", () => {
  assert.deepEqual(events(feedAll(["Data: x\ndata : y\nEVENT: z\n\n"])), []);
});

test("a line far longer than 64 KiB, in many chunks, and a 1 MiB event", () => {
  const big = "x".repeat(1 << 20);
  const s = enc.encode("event: big\ndata: " + big + "\n\n");
  const chunks = [];
  for (let i = 0; i < s.length; i += 7919) chunks.push(s.subarray(i, i + 7919));
  const recs = events(feedAll(chunks));
  assert.equal(recs.length, 1);
  assert.equal(recs[0].type, "big");
  assert.equal(recs[0].data.length, 1 << 20);
  assert.equal(recs[0].data, big);
});

test("many short lines in one chunk are parsed in linear time", () => {
  // 200k events without any CR in a 2.6 MB chunk: a parser that searched
  // for CR over the rest of the chunk at every line would take minutes.
  const one = "id: 1\ndata: x\n\n";
  const chunk = enc.encode(one.repeat(200_000));
  const t0 = performance.now();
  const n = events(feedAll([chunk])).length;
  assert.equal(n, 200_000);
  assert.ok(performance.now() - t0 < 10_000);
});

test("maxEventBytes bounds what one event holds, across lines and chunks", () => {
  const p = new SSEParser({ maxEventBytes: 100 });
  assert.equal(p.feed("data: " + "a".repeat(90) + "\n\n").length, 1, "a 96-byte line fits");
  assert.throws(() => p.feed("data: " + "a".repeat(95)), SSEParseError, "a partial line past the bound");
  const q = new SSEParser({ maxEventBytes: 100 });
  q.feed("data: " + "a".repeat(50) + "\n");
  assert.throws(() => q.feed("data: " + "b".repeat(50) + "\n"), (e) => e instanceof SSEParseError && e.code === "event_too_large");
  // The bound is per event: many events each under it pass.
  const r = new SSEParser({ maxEventBytes: 100 });
  for (let i = 0; i < 100; i++) assert.equal(r.feed("data: " + "c".repeat(80) + "\n\n").length, 1);
  assert.throws(() => new SSEParser({ maxEventBytes: 0 }), RangeError);
});

test("the parser reads the eventbus wire", () => {
  const wire =
    "retry: 3000\n\n" +
    'id: 42\nevent: session_update\ndata: {"id":42,"v":1,"type":"session_update","data":{"title":"Draft"}}\n\n' +
    'event: replay_complete\ndata: {"v":1,"type":"replay_complete","data":{"replayedCount":0,"epoch":"e"}}\n\n' +
    ": heartbeat\n\n" +
    "id: 0123456789abcdef0123456789abcdef:43\nevent: x\ndata: {}\n\n";
  const recs = feedAll([wire]);
  assert.deepEqual(recs.map((r) => r.kind + ":" + (r.type ?? r.retry ?? r.comment) + ":" + (r.id ?? "")), [
    "retry:3000:",
    "event:session_update:42",
    "event:replay_complete:",
    "comment: heartbeat:",
    "event:x:0123456789abcdef0123456789abcdef:43",
  ]);
});
