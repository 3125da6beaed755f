module github.com/ssebus/eventbus/websocket

go 1.26.0

replace github.com/ssebus/eventbus => ../

require (
	github.com/coder/websocket v1.8.15
	github.com/ssebus/eventbus v0.1.0
	go.uber.org/goleak v1.3.0
)
