#!/usr/bin/env bash
# Prometheus collector (module ./prometheus, github.com/prometheus/client_golang):
# vets, staticchecks and tests the module with -race. Needs nothing but Go
# and the module proxy.
set -euo pipefail
cd "$(dirname "$0")/../prometheus"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
  echo "gofmt would rewrite:"; echo "$unformatted"; exit 1
fi
go vet ./...
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
go test -race -count=1 ./...
