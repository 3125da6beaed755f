#!/usr/bin/env bash
# The demo daemon (module ./cmd/sessiond, a module of its own so that what
# it depends on never reaches the root module's importers): vets,
# staticchecks and tests the module with -race. Its tests build the daemon
# as a process (limits_test.go, readme_test.go: the README's daemons in a
# scratch module), so they need the go command. Needs nothing but Go and
# the module proxy.
set -euo pipefail
cd "$(dirname "$0")/../cmd/sessiond"
export PATH="/usr/local/go/bin:$HOME/go/bin:$PATH"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
  echo "gofmt would rewrite:"; echo "$unformatted"; exit 1
fi
go vet ./...
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
go test -race -count=1 ./...
# Once more without the race detector, short, as the root module's tests
# run in .ci/run. No test here skips itself under -race (the daemons whose
# memory and descriptors limits_test.go measures are built without -race
# either way); this keeps what the root's run covered before the daemon
# moved out of it: the -short forms, and the tests built without -race.
go test -count=1 -short ./...
