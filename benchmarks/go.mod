module github.com/ssebus/eventbus/benchmarks

go 1.26.0

// Users get the root module at the release this file requires (one version
// for every module of the repository, RELEASING.md); inside the
// repository it builds against the working tree: a replace applies
// only to the main module.
replace github.com/ssebus/eventbus => ../

require (
	github.com/cskr/pubsub/v2 v2.0.2
	github.com/r3labs/sse/v2 v2.10.0
	github.com/tmaxmax/go-sse v0.11.0
	go.uber.org/goleak v1.3.0
	golang.org/x/exp v0.0.0-20261113113407-e3970619a1a4
)

require (
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/text v0.44.0 // indirect
)

require (
	github.com/ssebus/eventbus v0.1.0
	golang.org/x/net v0.63.0
	gopkg.in/cenkalti/backoff.v1 v1.1.0 // indirect
)
