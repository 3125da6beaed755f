module github.com/ssebus/eventbus/benchmarks

go 1.25

replace github.com/ssebus/eventbus => ../

require (
	github.com/cskr/pubsub/v2 v2.0.2
	github.com/r3labs/sse/v2 v2.10.0
	github.com/tmaxmax/go-sse v0.11.0
)

require go.yaml.in/yaml/v3 v3.0.6 // indirect

require (
	github.com/ssebus/eventbus v0.0.0-00010101000000-000000000000
	golang.org/x/net v0.0.0-20191116160921-f9c825593386 // indirect
	gopkg.in/cenkalti/backoff.v1 v1.1.0 // indirect
)
