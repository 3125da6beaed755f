#!/usr/bin/env bash
# WebSocket transport (module ./websocket, github.com/coder/websocket):
# gofmt, vet, staticcheck, the check that it uses no internal package of
# the root, and its tests with -race (synctest bubbles: seconds), among
# them TestScenarios, the scenario table run over the single SSE stream,
# the multiplexed SSE stream and the WebSocket (scenarios_test.go). Needs
# nothing but Go and the module proxy.
set -euo pipefail
cd "$(dirname "$0")/../websocket"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
  echo "gofmt would rewrite:"; echo "$unformatted"; exit 1
fi
go vet ./...
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
bash ../.ci/no-internal.sh websocket
go test -race -count=1 ./...
