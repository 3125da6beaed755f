package ebprom_test

import (
	"bufio"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/ssebus/eventbus"
	ebprom "github.com/ssebus/eventbus/prometheus"
)

// A daemon serves its hub's metrics on /metrics beside its streams.
func Example() {
	hub, err := eventbus.NewHub(eventbus.HubOptions{})
	if err != nil {
		panic(err)
	}
	defer hub.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(ebprom.NewCollector(hub))
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("GET /session/{id}/events", &eventbus.Handler{Lookup: hub.LookupSession})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	hub.Publish("room-1", eventbus.Event{Type: "note", Data: []byte(`{"text":"hi"}`)})

	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "eventbus_sessions ") || strings.HasPrefix(line, "eventbus_events_published_total ") {
			fmt.Println(line)
		}
	}
	// Output:
	// eventbus_events_published_total 1
	// eventbus_sessions 1
}
