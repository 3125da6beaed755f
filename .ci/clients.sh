#!/usr/bin/env bash
# Tests of the JavaScript client (clients/js) under Node: the parser, scripted
# servers, the demo daemon (cmd/sessiond, built here: GET /events and GET /ws),
# and headless Chromium.
# Installs Debian's nodejs (and chromium) when missing; CI=true makes a
# missing browser a failure instead of a skip. The Go client (sseclient) is
# tested by the root module's go test ./... already.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$HOME/go/bin:$PATH"

need=()
command -v node >/dev/null || need+=(nodejs npm)
if [ ! -x /usr/bin/chromium ] && [ -z "${CHROMIUM:-}" ]; then need+=(chromium); fi
if [ ${#need[@]} -gt 0 ]; then
  echo "clients: installing ${need[*]}" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
node --version

# One build of the demo daemon for every test file (a module of its own:
# built in its folder).
bin="$(mktemp -d)"
trap 'rm -rf "$bin"' EXIT
(cd cmd/sessiond && go build -o "$bin/sessiond" .)

export CI="${CI:-true}" SESSIOND="$bin/sessiond"
cd clients/js
# The tests' one dependency (the npm ws package, a WebSocket client nobody
# here wrote, for the WebSocket transport under Node 20), as package-lock.json
# pins it; the client itself has none.
npm ci --no-audit --no-fund --loglevel=error
node --test test/
