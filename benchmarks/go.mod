module github.com/ssebus/eventbus/benchmarks

go 1.26.0

// Users get the root module at the release this file requires (one version
// for every module of the repository, RELEASING.md); inside the
// repository it builds against the working tree: a replace applies
// only to the main module.
replace github.com/ssebus/eventbus => ../

// The scale program serves the WebSocket transport module of the working
// tree beside the SSE routes.
replace github.com/ssebus/eventbus/websocket => ../websocket

require (
	github.com/coder/websocket v1.8.15
	github.com/cskr/pubsub/v2 v2.0.2
	github.com/r3labs/sse/v2 v2.10.0
	github.com/ssebus/eventbus/websocket v0.1.0
	github.com/tmaxmax/go-sse v0.11.0
	go.uber.org/goleak v1.3.0
	golang.org/x/exp v0.0.0-20261113113407-e3970619a1a4
	gonum.org/v1/plot v0.17.0
)

require (
	codeberg.org/go-fonts/liberation v0.5.0 // indirect
	codeberg.org/go-latex/latex v0.2.0 // indirect
	codeberg.org/go-pdf/fpdf v0.11.1 // indirect
	git.sr.ht/~sbinet/gg v0.7.0 // indirect
	github.com/ajstarks/svgo v0.0.0-20211024235047-1546f124cd8b // indirect
	github.com/golang/freetype v0.0.0-20170609003504-e2365dfdc4a0 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/image v0.30.0 // indirect
	golang.org/x/text v0.44.0 // indirect
)

require (
	github.com/ssebus/eventbus v0.1.0
	golang.org/x/net v0.63.0
	gopkg.in/cenkalti/backoff.v1 v1.1.0 // indirect
)
