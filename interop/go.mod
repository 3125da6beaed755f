module github.com/ssebus/eventbus/interop

go 1.26

// Users get the root module at the release this file requires (one version
// for every module of the repository, RELEASING.md); inside the
// repository it builds against the working tree: a replace applies
// only to the main module.
replace github.com/ssebus/eventbus => ../

require (
	github.com/r3labs/sse/v2 v2.10.0
	github.com/ssebus/eventbus v0.1.0
	github.com/tmaxmax/go-sse v0.12.0
	go.uber.org/goleak v1.3.0
	gopkg.in/cenkalti/backoff.v1 v1.1.0
)

require golang.org/x/net v0.0.0-20191116160921-f9c825593386 // indirect
