module github.com/ssebus/eventbus/interop

go 1.26

replace github.com/ssebus/eventbus => ../

require (
	github.com/r3labs/sse/v2 v2.10.0 // indirect
	github.com/tmaxmax/go-sse v0.12.0 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/net v0.0.0-20191116160921-f9c825593386 // indirect
	gopkg.in/cenkalti/backoff.v1 v1.1.0 // indirect
)
