// A test stand-in for a browser's EventSource, written from the WHATWG
// processing model, so the client's EventSource transport runs under Node:
// only listeners of an event's type (or onmessage for "message") see it; a
// non-200 or a wrong Content-Type fails the connection for good (CLOSED)
// without saying why; a network error or the end of the response reconnects
// by itself after the reconnection time, sending Last-Event-ID. The real
// thing is exercised in Chromium (test/browser.test.js).

import { SSEParser } from "../index.js";

export class FakeEventSource {
  static CONNECTING = 0;
  static OPEN = 1;
  static CLOSED = 2;
  static instances = [];

  constructor(url, init = {}) {
    this.url = String(url);
    this.withCredentials = !!init.withCredentials;
    this.readyState = FakeEventSource.CONNECTING;
    this.onopen = null;
    this.onerror = null;
    this.onmessage = null;
    this.lastEventId = "";
    this.reconnectionTime = 3000;
    this.requests = 0;
    this._listeners = new Map();
    this._ac = null;
    this._timer = null;
    FakeEventSource.instances.push(this);
    queueMicrotask(() => this._connect());
  }

  addEventListener(type, fn) {
    if (!this._listeners.has(type)) this._listeners.set(type, []);
    this._listeners.get(type).push(fn);
  }

  close() {
    this.readyState = FakeEventSource.CLOSED;
    this._ac?.abort();
    clearTimeout(this._timer);
  }

  _fire(type, ev) {
    if (type === "open") this.onopen?.(ev);
    else if (type === "error") this.onerror?.(ev);
    else if (type === "message") this.onmessage?.(ev);
    for (const fn of this._listeners.get(type) ?? []) fn(ev);
  }

  async _connect() {
    if (this.readyState === FakeEventSource.CLOSED) return;
    this._ac = new AbortController();
    this.requests++;
    const headers = { Accept: "text/event-stream" };
    if (this.lastEventId !== "") headers["Last-Event-ID"] = this.lastEventId;
    let res;
    try {
      res = await fetch(this.url, { headers, signal: this._ac.signal });
    } catch {
      return this._reestablish();
    }
    const ct = res.headers.get("content-type") ?? "";
    if (res.status !== 200 || !ct.startsWith("text/event-stream")) {
      res.body?.cancel().catch(() => {});
      if (this.readyState === FakeEventSource.CLOSED) return;
      this.readyState = FakeEventSource.CLOSED;
      this._fire("error", { type: "error" });
      return;
    }
    if (this.readyState === FakeEventSource.CLOSED) return;
    this.readyState = FakeEventSource.OPEN;
    this._fire("open", { type: "open" });
    const parser = new SSEParser();
    try {
      for await (const chunk of res.body) {
        for (const r of parser.feed(chunk)) {
          if (this.readyState === FakeEventSource.CLOSED) return;
          if (r.kind === "retry") this.reconnectionTime = r.retry;
          if (r.kind !== "event") continue;
          this.lastEventId = r.lastEventId;
          this._fire(r.type, { type: r.type, data: r.data, lastEventId: r.lastEventId });
        }
      }
    } catch {
      // a network error: reestablish
    }
    this._reestablish();
  }

  _reestablish() {
    if (this.readyState === FakeEventSource.CLOSED) return;
    this.readyState = FakeEventSource.CONNECTING;
    this._fire("error", { type: "error" });
    if (this.readyState === FakeEventSource.CLOSED) return;
    this._timer = setTimeout(() => this._connect(), this.reconnectionTime);
  }
}
