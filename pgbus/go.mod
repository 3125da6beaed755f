module github.com/ssebus/eventbus/pgbus

go 1.26.0

// Users get the root module at the release this file requires (one version
// for every module of the repository, RELEASING.md); inside the
// repository it builds against the working tree: a replace applies
// only to the main module.
replace github.com/ssebus/eventbus => ../

replace github.com/ssebus/eventbus/websocket => ../websocket

require (
	github.com/coder/websocket v1.8.15
	github.com/jackc/pgx/v5 v5.12.0
	github.com/ssebus/eventbus v0.1.0
	github.com/ssebus/eventbus/websocket v0.1.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)
