#!/usr/bin/env bash
# Release checks (RELEASING.md), done by internal/releasecheck, a module of
# its own so that the library gains no dependency:
#   - its tests, on a small fixture repository: a module that still
#     requires the root at v0.0.0 fails the install check, an API break
#     fails the API check, an addition passes;
#   - modules: every go.mod requires the root at one release version with
#     a replace beside it; the published modules, zipped from the working
#     tree, are served at that version by a file:// module proxy, and a
#     module outside the repository go-gets each and builds a program that
#     imports it, as a user does;
#   - api: apidiff against the last tag v*, or the baseline in
#     internal/releasecheck/api while nothing is tagged.
# Needs Go, git, and the module proxy for third-party modules that are not
# in the module cache yet.
#
#   bash .ci/release.sh             all of it (CI)
#   bash .ci/release.sh write-api   re-cut the API baseline
#   RELEASE_VERSION=v0.2.0 bash .ci/release.sh
#                                   also assert the version every go.mod requires
set -euo pipefail
cd "$(dirname "$0")/../internal/releasecheck"
export PATH="/usr/local/go/bin:$HOME/go/bin:$PATH"

# The modules nobody imports (test harnesses, this tool, the demo daemon,
# which is run from a checkout): never tagged. Every other folder with a
# go.mod is published, and so checked here.
UNPUBLISHED=e2e,interop,benchmarks,internal/releasecheck,cmd/sessiond

cmd="${1:-check}"
if [ "$cmd" = check ]; then
  go vet ./...
  go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
  go test -race -count=1 ./...
fi
exec go run . -repo ../.. -unpublished "$UNPUBLISHED" ${RELEASE_VERSION:+-version "$RELEASE_VERSION"} "$cmd"
