#!/usr/bin/env bash
# NATS JetStream backplane (module ./natsbus): vets, staticchecks and tests
# the module. Nothing to install: the tests embed nats-server
# (github.com/nats-io/nats-server/v2) in the test binary, single servers
# and a three-node cluster on free loopback ports, each with a store in a
# temporary directory.
set -euo pipefail
cd "$(dirname "$0")/../natsbus"

export CI="${CI:-true}"
bash ../.ci/no-internal.sh natsbus
go vet ./...
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
go test -race -count=1 -timeout 10m ./...
