module github.com/ssebus/eventbus/cmd/sessiond

go 1.25

// Users get the root module at the release this file requires (one version
// for every module of the repository, RELEASING.md); inside the
// repository it builds against the working tree: a replace applies
// only to the main module.
replace github.com/ssebus/eventbus => ../..

replace github.com/ssebus/eventbus/websocket => ../../websocket

require (
	github.com/ssebus/eventbus v0.1.0
	github.com/ssebus/eventbus/websocket v0.1.0
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	github.com/coder/websocket v1.8.15 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
