// The composite cursor of a multiplexed eventbus stream (eventbus.Cursor,
// GET /events?session=a&session=b): one ASCII token that holds, for each
// session, a tag of its id, a tag of its bus's epoch and the id of the last
// event delivered. It is the id: line of every event frame, so a plain
// EventSource keeps it and sends it back as Last-Event-ID by itself; this
// client keeps one position per session and writes the token itself.
//
// The token is "m1" and one 24-character group per session, in any order.
// A group is the unpadded base64url of 18 bytes, big-endian: 5 bytes of the
// session tag (the top 40 bits of FNV-1a-64 over the id's UTF-8 bytes), 6 of
// the epoch tag (the epoch's first 12 hex digits), 7 of the id (at most
// 2^53-1).

const PREFIX = "m1";
const GROUP = 24;
const MAX_ENTRIES = 256; // eventbus.MaxCursorEntries
const MAX_ID = Number.MAX_SAFE_INTEGER;
const ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const VALUE = new Map([...ALPHABET].map((c, i) => [c, i]));
const FNV_OFFSET = 0xcbf29ce484222325n;
const FNV_PRIME = 0x100000001b3n;
const MASK64 = (1n << 64n) - 1n;
const HEX12 = /^[0-9a-f]{12}/;
const utf8 = new TextEncoder();

function fnv64a(s) {
  let h = FNV_OFFSET;
  for (const b of utf8.encode(s)) {
    h ^= BigInt(b);
    h = (h * FNV_PRIME) & MASK64;
  }
  return h;
}

/**
 * The tag of a session id in a cursor: the top 40 bits of the 64-bit FNV-1a
 * hash of its UTF-8 bytes.
 * @param {string} id
 */
export function sessionTag(id) {
  return Number(fnv64a(id) >> 24n);
}

/**
 * The tag of a bus epoch in a cursor: its first 12 hex digits as a number
 * (every epoch is 32 lowercase hex digits), else the top 48 bits of the
 * 64-bit FNV-1a hash of the string.
 * @param {string} epoch
 */
export function epochTag(epoch) {
  if (HEX12.test(epoch)) return parseInt(epoch.slice(0, 12), 16);
  return Number(fnv64a(epoch) >> 16n);
}

// putBytes writes v (a safe integer) big-endian into b[at, at+n).
function putBytes(b, at, n, v) {
  for (let i = at + n - 1; i >= at; i--) {
    b[i] = v % 256;
    v = Math.floor(v / 256);
  }
}

function getBytes(b, at, n) {
  let v = 0;
  for (let i = at; i < at + n; i++) v = v * 256 + b[i];
  return v;
}

/**
 * Writes a cursor: entries of {session, epoch, id}, session a sessionTag
 * (below 2^40), epoch an epochTag (below 2^48), id at most 2^53-1; 1 to 256
 * of them. Throws a RangeError for anything else.
 * @param {{session: number, epoch: number, id: number}[]} entries
 */
export function formatCursor(entries) {
  if (!Array.isArray(entries) || entries.length < 1 || entries.length > MAX_ENTRIES) {
    throw new RangeError("eventbus: a cursor holds 1 to 256 entries");
  }
  let out = PREFIX;
  const b = new Uint8Array(18);
  for (const e of entries) {
    const ok = (v, max) => Number.isSafeInteger(v) && v >= 0 && v <= max;
    if (!ok(e.session, 2 ** 40 - 1) || !ok(e.epoch, 2 ** 48 - 1) || !ok(e.id, MAX_ID)) {
      throw new RangeError("eventbus: a cursor entry out of range");
    }
    putBytes(b, 0, 5, e.session);
    putBytes(b, 5, 6, e.epoch);
    putBytes(b, 11, 7, e.id);
    for (let i = 0; i < 18; i += 3) {
      const n = (b[i] << 16) | (b[i + 1] << 8) | b[i + 2];
      out += ALPHABET[n >> 18] + ALPHABET[(n >> 12) & 63] + ALPHABET[(n >> 6) & 63] + ALPHABET[n & 63];
    }
  }
  return out;
}

/**
 * Parses a cursor strictly, as the server does: "m1" and 1 to 256 groups of
 * base64url whose ids are at most 2^53-1. Returns its entries
 * ({session, epoch, id} tags and id), or null when s is not one (a single
 * stream's "N" or "<epoch>:<N>" included).
 * @param {string} s
 */
export function parseCursor(s) {
  if (typeof s !== "string" || !s.startsWith(PREFIX)) return null;
  const n = (s.length - PREFIX.length) / GROUP;
  if (!Number.isInteger(n) || n < 1 || n > MAX_ENTRIES) return null;
  const entries = [];
  const b = new Uint8Array(18);
  for (let g = 0; g < n; g++) {
    const at = PREFIX.length + g * GROUP;
    for (let i = 0; i < GROUP; i += 4) {
      let v = 0;
      for (let k = 0; k < 4; k++) {
        const d = VALUE.get(s[at + i + k]);
        if (d === undefined) return null;
        v = (v << 6) | d;
      }
      const j = (i / 4) * 3;
      b[j] = v >> 16;
      b[j + 1] = (v >> 8) & 255;
      b[j + 2] = v & 255;
    }
    const id = getBytes(b, 11, 7);
    if (id > MAX_ID) return null;
    entries.push({ session: getBytes(b, 0, 5), epoch: getBytes(b, 5, 6), id });
  }
  return entries;
}

/**
 * The entry of session tag tag in entries: the only one with it, or null
 * (none, or several: the server then ignores them all).
 */
export function entryOf(entries, tag) {
  let found = null;
  for (const e of entries) {
    if (e.session !== tag) continue;
    if (found) return null;
    found = e;
  }
  return found;
}
