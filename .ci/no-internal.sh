#!/usr/bin/env bash
# Usage: bash .ci/no-internal.sh DIR
# Checks that the backplane module in DIR builds on the public kit only: no
# package of it but its daemons under cmd/ imports (in its code or its
# tests) an internal package of github.com/ssebus/eventbus, which a module
# outside this repository could not import. The internal packages the root
# package eventbus itself uses (go list -deps lists them too) are the
# root's business, not the module's.
set -euo pipefail
cd "$(dirname "$0")/../$1"
pkgs=$(go list ./... | grep -v '/cmd/')
bad=$(go list -f '{{.ImportPath}}:{{range .Imports}} {{.}}{{end}}{{range .TestImports}} {{.}}{{end}}{{range .XTestImports}} {{.}}{{end}}' $pkgs |
  grep -E ' github\.com/ssebus/eventbus/internal/' || true)
if [ -n "$bad" ]; then
  echo "$1: imports internal packages of github.com/ssebus/eventbus:" >&2
  echo "$bad" >&2
  exit 1
fi
# go list -deps lists the root's internal packages that package eventbus
# itself uses: those, and only those, may show there.
root=$(go list -deps github.com/ssebus/eventbus | grep '^github.com/ssebus/eventbus/internal/' || true)
via=$(go list -deps -test $pkgs | grep '^github.com/ssebus/eventbus/internal/' || true)
extra=$(comm -23 <(echo "$via" | sort -u) <(echo "$root" | sort -u) | grep . || true)
if [ -n "$extra" ]; then
  echo "$1: depends on internal packages of github.com/ssebus/eventbus other than package eventbus's own:" >&2
  echo "$extra" >&2
  exit 1
fi
echo "$1: imports no github.com/ssebus/eventbus/internal/... package (go list -deps -test shows ${via:-none}, package eventbus's own)"
