#!/usr/bin/env bash
# Browser end-to-end tests of cmd/sessiond (module ./e2e, chromedp + chromium).
# Installs Debian's chromium when it is missing, then runs the tests with
# CI=true so that a missing browser fails instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x /usr/bin/chromium ] && [ -z "${E2E_CHROMIUM:-}" ]; then
  echo "e2e: installing chromium" >&2
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

export CI="${CI:-true}"
cd e2e
# -v: the log shows the screenshot artifact paths the test writes.
exec go test -v -race -count=1 -timeout 5m ./...
