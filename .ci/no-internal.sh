#!/usr/bin/env bash
# Usage: bash .ci/no-internal.sh DIR
# Checks that the backplane module in DIR builds on the public kit only: no
# package of it (tests included) but its daemons under cmd/ depends on an
# internal package of github.com/ssebus/eventbus, which a module outside
# this repository could not import. Prints the dependency list's verdict.
set -euo pipefail
cd "$(dirname "$0")/../$1"
pkgs=$(go list ./... | grep -v '/cmd/')
bad=$(go list -deps -test $pkgs | grep '^github.com/ssebus/eventbus/internal/' || true)
if [ -n "$bad" ]; then
  echo "$1: imports internal packages of github.com/ssebus/eventbus:" >&2
  echo "$bad" >&2
  exit 1
fi
echo "$1: go list -deps -test (but cmd/): no github.com/ssebus/eventbus/internal/... package"
