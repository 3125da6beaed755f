module github.com/ssebus/eventbus/websocket

go 1.25

// Users get the root module at the release this file requires (one version
// for every module of the repository, RELEASING.md); inside the
// repository it builds against the working tree: a replace applies
// only to the main module.
replace github.com/ssebus/eventbus => ../

require (
	github.com/coder/websocket v1.8.15
	github.com/ssebus/eventbus v0.1.0
	go.uber.org/goleak v1.3.0
)
