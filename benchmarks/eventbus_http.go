package main

import (
	"log/slog"
	"net/http"

	"github.com/ssebus/eventbus"
)

// eventbus.Handler over the same bus options as the in-process adapter; the
// client asks for ?maxQueued=<-queue>. Handler sends the headers right after
// subscribing, so the response headers mean "subscribed".

func init() {
	httpLibraries = append(httpLibraries,
		httpLibrary{name: "eventbus Handler", new: eventbusHTTP(0)},
		httpLibrary{name: "eventbus Handler catchup", new: eventbusHTTP(eventbus.OverflowCatchUp)},
	)
}

func eventbusHTTP(policy eventbus.OverflowPolicy) func(cfg config) *httpServer {
	return func(cfg config) *httpServer { return eventbusServer(cfg, policy) }
}

func eventbusServer(cfg config, policy eventbus.OverflowPolicy) *httpServer {
	bus, err := eventbus.New(busOptions(cfg, policy))
	if err != nil {
		panic(err) // options are static; a failure here is a harness bug
	}
	h := &eventbus.Handler{
		Lookup: func(*http.Request, string) (*eventbus.EventBus, error) { return bus, nil },
		Logger: slog.New(slog.DiscardHandler),
		// The peers send bare ids, and so do the naive handlers: the same
		// wire for all (BenchmarkHandler measures the default epoch ids).
		BareIDs: true,
	}
	return &httpServer{
		handler: h,
		publish: func(uint64) error {
			_, err := bus.Publish(eventbus.Event{Type: "bench", Data: benchData})
			return err
		},
		closeLib: func() { _ = bus.Close() },
	}
}
