#!/usr/bin/env python3
"""A WebSocket client of eventbus (docs/SPEC.md 6.10) on Python's
`websockets` library (Debian's python3-websockets), driven by the Go test
interop/websocket_test.go.

It reads commands, one JSON object a line, on stdin, and writes what it
sees, one JSON object a line, on stdout:

  {"cmd":"open","ws":URL,"sse":URL,"resume":true|false,"cursor":C}
      connects to the WebSocket URL with lastEventId= (its own last cursor
      when resume is set, else C when not empty). When the handshake is
      answered 404 (no /ws there: a proxy or a daemon without the route) it
      falls back to the multiplexed SSE route URL, with the same cursor as
      Last-Event-ID, and reads it the same way.
  {"cmd":"send","text":T} / {"cmd":"sendbinary","text":T}
  {"cmd":"close"}   the client leaves (a close frame 1000, or the SSE
                    connection closed); then {"kind":"closed"}
  {"cmd":"quit"}

Records: open (transport ws, the subprotocol), fallback (the status that
made it fall back), refused (a handshake answered otherwise), frame (a
frame line, or an SSE event's data, with its SSE id), cursor (a cursor
line), control (another control line), close (the close code and reason,
or code 0 without a close frame), closed, error.

The cursor it keeps is the last cursor line of the WebSocket or the last id
of the SSE stream: one composite cursor for both transports.
"""

import asyncio
import json
import socket
import sys
import threading
import urllib.parse
import http.client

import websockets
import websockets.exceptions


def out(**o):
    sys.stdout.write(json.dumps(o) + "\n")
    sys.stdout.flush()


def with_cursor(url, cursor):
    if not cursor:
        return url
    sep = "&" if "?" in url else "?"
    return url + sep + urllib.parse.urlencode({"lastEventId": cursor})


def handshake_status(e):
    # websockets 10.x: InvalidStatusCode(status_code); 11+: InvalidStatus(response).
    code = getattr(e, "status_code", None)
    if code is None and getattr(e, "response", None) is not None:
        code = getattr(e.response, "status_code", None)
    return code


def close_of(e):
    # websockets 10.x: e.code, e.reason; 11+: e.rcvd (None without a close frame).
    rcvd = getattr(e, "rcvd", None)
    if rcvd is not None:
        return rcvd.code, rcvd.reason
    if hasattr(e, "rcvd"):
        return 0, ""
    code = getattr(e, "code", 0)
    if code == 1006:  # no close frame received
        return 0, ""
    return code, getattr(e, "reason", "")


class Client:
    def __init__(self):
        self.cursor = ""
        self.ws = None
        self.task = None
        self.sse_sock = None

    async def open(self, cmd):
        cursor = self.cursor if cmd.get("resume") else cmd.get("cursor", "")
        try:
            self.ws = await websockets.connect(
                with_cursor(cmd["ws"], cursor),
                subprotocols=["eventbus.v1"],
                max_size=None,
                compression=None,
            )
        except websockets.exceptions.InvalidHandshake as e:
            status = handshake_status(e)
            if status == 404 and cmd.get("sse"):
                out(kind="fallback", status=status)
                self.task = asyncio.ensure_future(asyncio.to_thread(self.read_sse, cmd["sse"], cursor))
                return
            out(kind="refused", status=status or 0, message=str(e))
            return
        out(kind="open", transport="ws", subprotocol=self.ws.subprotocol or "")
        self.task = asyncio.ensure_future(self.read_ws(self.ws))

    async def read_ws(self, ws):
        try:
            async for msg in ws:
                if isinstance(msg, bytes):
                    out(kind="error", message="a binary message")
                    continue
                for line in msg.split("\n"):
                    if line.startswith('{"op":'):
                        ctl = json.loads(line)
                        if ctl.get("op") == "cursor":
                            self.cursor = ctl["cursor"]
                            out(kind="cursor", cursor=ctl["cursor"])
                        else:
                            out(kind="control", data=line)
                    else:
                        out(kind="frame", transport="ws", data=line)
            # The iteration ends on a normal closure (1000, 1001).
            out(kind="close", code=ws.close_code or 0, reason=ws.close_reason or "")
        except websockets.exceptions.ConnectionClosed as e:
            code, reason = close_of(e)
            out(kind="close", code=code, reason=reason)

    def read_sse(self, url, cursor):
        u = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(u.hostname, u.port)
        headers = {"Accept": "text/event-stream"}
        if cursor:
            headers["Last-Event-ID"] = cursor
        conn.request("GET", u.path + ("?" + u.query if u.query else ""), headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            out(kind="refused", status=resp.status, message=resp.read().decode())
            conn.close()
            return
        self.sse_sock = conn.sock
        out(kind="open", transport="sse", subprotocol="")
        ev_id, data = "", ""
        try:
            while True:
                raw = resp.fp.readline()
                if not raw:
                    break
                line = raw.decode().rstrip("\n")
                if line == "":
                    if data:
                        if ev_id:
                            self.cursor = ev_id
                        out(kind="frame", transport="sse", data=data, id=ev_id)
                    ev_id, data = "", ""
                elif line.startswith("id: "):
                    ev_id = line[4:]
                elif line.startswith("data: "):
                    data = line[6:]
        except (OSError, ValueError):
            pass
        out(kind="close", code=0, reason="sse")
        conn.close()

    async def close(self):
        if self.ws is not None:
            await self.ws.close()
            self.ws = None
        if self.sse_sock is not None:
            try:
                self.sse_sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sse_sock = None
        if self.task is not None:
            await self.task
            self.task = None
        out(kind="closed")


async def main():
    c = Client()
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        cmd = json.loads(line)
        op = cmd["cmd"]
        try:
            if op == "open":
                await c.open(cmd)
            elif op == "send":
                await c.ws.send(cmd["text"])
            elif op == "sendbinary":
                await c.ws.send(cmd["text"].encode())
            elif op == "close":
                await c.close()
            elif op == "quit":
                break
        except Exception as e:  # reported, the Go test decides
            out(kind="error", message=repr(e))
    await c.close()


if __name__ == "__main__":
    asyncio.run(main())
