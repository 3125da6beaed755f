module github.com/ssebus/eventbus/interop

go 1.26

replace github.com/ssebus/eventbus => ../

require (
	github.com/r3labs/sse/v2 v2.10.0
	github.com/ssebus/eventbus v0.0.0-00010101000000-000000000000
	github.com/tmaxmax/go-sse v0.12.0
	go.uber.org/goleak v1.3.0
	gopkg.in/cenkalti/backoff.v1 v1.1.0
)

require golang.org/x/net v0.0.0-20191116160921-f9c825593386 // indirect
