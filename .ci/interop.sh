#!/usr/bin/env bash
# Third-party SSE clients against the demo daemon binary (module ./interop):
# tmaxmax/go-sse and r3labs/sse/v2 in Go, npm eventsource and
# eventsource-parser in Node (versions pinned by interop/node/package-lock.json),
# on single streams and on the multiplexed one (GET /events?session=...);
# WebSocket clients on GET /ws: Python's websockets (Debian's
# python3-websockets) and npm ws, resuming and falling back to the SSE route.
# Installs Debian's nodejs and npm when node is missing, and
# python3-websockets when /usr/bin/python3 cannot import websockets, then
# runs the tests with CI=true so that a missing client fails instead of
# skipping.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "interop: installing nodejs and npm" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm >/dev/null
fi
echo "node $(node --version), npm $(npm --version)"

if ! /usr/bin/python3 -c 'import websockets' >/dev/null 2>&1; then
  echo "interop: installing python3-websockets" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3 python3-websockets >/dev/null
fi
echo "python $(/usr/bin/python3 -c 'import sys, websockets; print(sys.version.split()[0], "websockets", websockets.__version__)')"

(cd interop/node && npm ci --no-audit --no-fund --loglevel=error)

export CI="${CI:-true}"
cd interop
go vet ./...
# -v: the log says what each client saw (and how many tail events r3labs made).
go test -race -count=1 -timeout 5m -v ./...
