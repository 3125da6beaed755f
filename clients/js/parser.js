// A strict, incremental parser of a text/event-stream, written from the
// WHATWG HTML standard's "interpreting an event stream" rules:
//
// - lines end with CRLF, LF or CR; a CR at the end of one chunk and an LF at
//   the start of the next are one line end;
// - one U+FEFF BOM at the very start of the stream is skipped;
// - a line starting with ":" is a comment;
// - "field:value" splits at the first colon and drops one leading space of
//   the value; a line without a colon is a field with an empty value;
// - "event" sets the event type buffer, "data" appends value+LF to the data
//   buffer, "id" sets the last event ID buffer unless the value holds NUL,
//   "retry" sets the reconnection time when the value is ASCII digits only,
//   any other field is ignored;
// - a blank line dispatches: the last event ID string takes the buffer's
//   value (it persists across events); an empty data buffer dispatches
//   nothing; otherwise one trailing LF is removed and an event is dispatched
//   with type "message" unless the event type buffer is set;
// - at the end of the stream, an event not yet terminated by a blank line is
//   discarded.
//
// It works on bytes and decodes each field value as UTF-8 (invalid
// sequences become U+FFFD, as the standard says), so a multi-byte character
// split across chunks is never mangled. There is no line length limit below
// maxEventBytes: the most bytes the parser holds for one event (its data,
// with the LF between lines, its type, and the line being read).

const LF = 10;
const CR = 13;
const COLON = 58;
const SPACE = 32;

/** 16 MiB (the server's default MaxEventBytes) plus 64 KiB for the framing. */
export const DEFAULT_MAX_EVENT_BYTES = 16 * 1024 * 1024 + 64 * 1024;

/** Thrown by SSEParser.feed when one event exceeds maxEventBytes. */
export class SSEParseError extends Error {
  constructor(message, code) {
    super(message);
    this.name = "SSEParseError";
    this.code = code;
  }
}

const utf8 = new TextDecoder("utf-8", { ignoreBOM: true });
const encoder = new TextEncoder();

function fieldIs(b, end, name) {
  if (end !== name.length) return false;
  for (let i = 0; i < end; i++) if (b[i] !== name.charCodeAt(i)) return false;
  return true;
}

function concat(pieces, total) {
  const out = new Uint8Array(total);
  let off = 0;
  for (const p of pieces) {
    out.set(p, off);
    off += p.length;
  }
  return out;
}

export class SSEParser {
  #max;
  #started = false; // the BOM check has run
  #head = null; // bytes held back until the BOM check can decide
  #skipLF = false; // the previous chunk ended with CR
  #pending = []; // pieces of the line being read (copies)
  #pendingLen = 0;
  #data = []; // data lines of the current event
  #dataBytes = 0;
  #type = "";
  #typeBytes = 0;
  #idBuf = ""; // the last event ID buffer
  #blockId = null; // the id field of the current block, if any
  #lastEventId = ""; // the last event ID string, set on dispatch

  /**
   * @param {{maxEventBytes?: number}} [options]
   */
  constructor(options = {}) {
    const max = options.maxEventBytes ?? DEFAULT_MAX_EVENT_BYTES;
    if (!Number.isSafeInteger(max) || max < 1) {
      throw new RangeError("eventbus: maxEventBytes must be a positive integer, got " + max);
    }
    this.#max = max;
  }

  /** The last event ID string (the standard's), as of the last dispatch. */
  get lastEventId() {
    return this.#lastEventId;
  }

  /**
   * Parses the next chunk of the stream and returns what it completed, in
   * stream order: {kind:"event", type, data, id, lastEventId},
   * {kind:"retry", retry} and {kind:"comment", comment}. A string chunk is
   * taken as its UTF-8 bytes. Throws SSEParseError when an event grows past
   * maxEventBytes; the parser must not be used after that.
   * @param {Uint8Array | string} chunk
   */
  feed(chunk) {
    let b = typeof chunk === "string" ? encoder.encode(chunk) : chunk;
    if (!this.#started) {
      // Hold back until it is clear whether the stream starts with a BOM.
      if (this.#head) {
        const h = new Uint8Array(this.#head.length + b.length);
        h.set(this.#head);
        h.set(b, this.#head.length);
        b = h;
      }
      const bom = [0xef, 0xbb, 0xbf];
      let prefix = true;
      for (let i = 0; i < Math.min(3, b.length); i++) prefix = prefix && b[i] === bom[i];
      if (prefix && b.length < 3) {
        this.#head = b.slice();
        return [];
      }
      this.#started = true;
      this.#head = null;
      if (prefix) b = b.subarray(3);
    }
    const out = [];
    const n = b.length;
    let pos = 0;
    let nextLF = -2; // -2: not searched yet in this chunk; -1: none left
    let nextCR = -2;
    while (pos < n) {
      if (this.#skipLF) {
        this.#skipLF = false;
        if (b[pos] === LF) {
          pos++;
          continue;
        }
      }
      // Each search runs once per line end it finds, never once per line
      // over the rest of the chunk: a chunk of many short lines without a
      // CR would otherwise be rescanned to its end for every line.
      if (nextLF !== -1 && nextLF < pos) nextLF = b.indexOf(LF, pos);
      if (nextCR !== -1 && nextCR < pos) nextCR = b.indexOf(CR, pos);
      let end = nextLF;
      if (end === -1 || (nextCR !== -1 && nextCR < end)) end = nextCR;
      if (end === -1) {
        this.#hold(b.subarray(pos));
        break;
      }
      this.#checkSize(end - pos);
      let line;
      if (this.#pendingLen > 0) {
        this.#pending.push(b.subarray(pos, end));
        line = concat(this.#pending, this.#pendingLen + end - pos);
        this.#pending = [];
        this.#pendingLen = 0;
      } else {
        line = b.subarray(pos, end);
      }
      if (b[end] === CR) {
        if (end + 1 < n) {
          if (b[end + 1] === LF) end++;
        } else {
          this.#skipLF = true;
        }
      }
      pos = end + 1;
      this.#line(line, out);
    }
    return out;
  }

  /**
   * Ends the stream: an event not terminated by a blank line, and a partial
   * line, are discarded (as the standard says). The parser can then be fed
   * a new stream, with the last event ID string kept.
   */
  end() {
    this.#started = false;
    this.#head = null;
    this.#skipLF = false;
    this.#pending = [];
    this.#pendingLen = 0;
    this.#resetEvent();
    this.#idBuf = this.#lastEventId;
  }

  #hold(piece) {
    this.#checkSize(piece.length);
    if (piece.length === 0) return;
    // A copy: the caller may reuse its buffer once feed returns.
    this.#pending.push(piece.slice());
    this.#pendingLen += piece.length;
  }

  #checkSize(more) {
    if (this.#dataBytes + this.#typeBytes + this.#pendingLen + more > this.#max) {
      throw new SSEParseError(
        "eventbus: an event exceeds maxEventBytes (" + this.#max + " bytes)",
        "event_too_large",
      );
    }
  }

  #resetEvent() {
    this.#data = [];
    this.#dataBytes = 0;
    this.#type = "";
    this.#typeBytes = 0;
    this.#blockId = null;
  }

  #line(b, out) {
    if (b.length === 0) {
      this.#dispatch(out);
      return;
    }
    if (b[0] === COLON) {
      out.push({ kind: "comment", comment: utf8.decode(b.subarray(1)) });
      return;
    }
    let nameEnd = b.indexOf(COLON);
    let value;
    if (nameEnd === -1) {
      nameEnd = b.length;
      value = b.subarray(b.length);
    } else {
      let v = nameEnd + 1;
      if (b[v] === SPACE) v++;
      value = b.subarray(v);
    }
    if (fieldIs(b, nameEnd, "data")) {
      this.#data.push(utf8.decode(value));
      this.#dataBytes += value.length + 1;
    } else if (fieldIs(b, nameEnd, "event")) {
      this.#type = utf8.decode(value);
      this.#typeBytes = value.length;
    } else if (fieldIs(b, nameEnd, "id")) {
      if (value.indexOf(0) === -1) {
        this.#idBuf = utf8.decode(value);
        this.#blockId = this.#idBuf;
      }
    } else if (fieldIs(b, nameEnd, "retry")) {
      if (value.length === 0) return;
      for (let i = 0; i < value.length; i++) if (value[i] < 48 || value[i] > 57) return;
      out.push({ kind: "retry", retry: Number(utf8.decode(value)) });
    }
  }

  #dispatch(out) {
    this.#lastEventId = this.#idBuf;
    if (this.#data.length === 0) {
      this.#resetEvent();
      return;
    }
    out.push({
      kind: "event",
      type: this.#type === "" ? "message" : this.#type,
      data: this.#data.join("\n"),
      id: this.#blockId,
      lastEventId: this.#lastEventId,
    });
    this.#resetEvent();
  }
}
