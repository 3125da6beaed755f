#!/usr/bin/env bash
# Redis Streams backplane (module ./redisbus): installs Debian's
# redis-server when it is missing, then vets and tests the module against
# real redis-server processes (the tests start their own on free loopback
# ports, without persistence, and stop them by PID). CI=true makes a
# missing redis-server a test failure instead of a skip.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis: installing redis-server" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi
# Debian's package starts a system service on port 6379; the tests do not
# use it (they run their own servers).
redis-server --version

export CI="${CI:-true}"
bash .ci/no-internal.sh redisbus
cd redisbus
go vet ./...
go test -race -count=1 -timeout 5m ./...
