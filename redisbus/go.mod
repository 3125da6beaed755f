module github.com/ssebus/eventbus/redisbus

go 1.26.0

require (
	github.com/coder/websocket v1.8.15
	github.com/redis/go-redis/v9 v9.23.0
	github.com/ssebus/eventbus v0.1.0
	github.com/ssebus/eventbus/websocket v0.1.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

replace github.com/ssebus/eventbus => ../

replace github.com/ssebus/eventbus/websocket => ../websocket
