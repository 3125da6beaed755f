// Command daemon is the complete daemon of the README: sessions in an
// eventbus.Hub (a session cap, idle expiry, one byte budget over every ring;
// a GET never creates a session), the library's publish and delete routes
// (a bounded body, Idempotency-Key, the JSON errors of docs/SPEC.md 6.9),
// and an HTTP server that bounds what a client can hold of it (slow
// headers, idle connections), with a graceful shutdown on SIGTERM. It is
// safe to copy: TestREADMEDaemon (cmd/sessiond/readme_test.go) builds it in
// a module of its own, runs it, publishes, reads the stream back and stops
// it.
//
//	go run ./examples/daemon -addr 127.0.0.1:8080
package main

import (
	"context"
	"errors"
	"flag"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ssebus/eventbus"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	flag.Parse()

	hub, err := eventbus.NewHub(eventbus.HubOptions{
		Bus:           eventbus.Options{MaxEventBytes: 1 << 20}, // the largest event; a POST body, 1 MiB more
		MaxSessions:   1000,                                     // a new session beyond: 503 too_many_sessions
		IdleTimeout:   10 * time.Minute,                         // no publish, no subscriber: closed and forgotten
		MaxTotalBytes: 256 << 20,                                // every session's replay ring together
	})
	if err != nil {
		log.Fatal(err)
	}
	pub := hub.Publisher() // with a backplane: its *Backplane
	mux := http.NewServeMux()
	// The stream. An unknown session is a 404: a GET or HEAD never creates one.
	mux.Handle("GET /session/{id}/events", &eventbus.Handler{Lookup: hub.LookupSession})
	// Publish {"type":"...","data":...}, creating the session: a body of at
	// most MaxEventBytes + 1 MiB arriving within 30 s, at most 4 such
	// bodies read at once (8 MiB), Idempotency-Key honoured.
	mux.Handle("POST /session/{id}/events", &eventbus.PublishHandler{Publisher: pub, BodyTimeout: 30 * time.Second})
	// Close the session and forget it (its streams drain and end): 204.
	mux.Handle("DELETE /session/{id}", &eventbus.DeleteHandler{Deleter: pub})

	srv := &http.Server{
		Addr:              *addr,
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second, // slowloris
		MaxHeaderBytes:    64 << 10,
		IdleTimeout:       2 * time.Minute,
		// No ReadTimeout or WriteTimeout: streams are long-lived. The
		// Handler puts a deadline on each of its writes instead, and
		// PublishHandler one on each body.
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
			log.Fatal(err)
		}
	}()
	<-ctx.Done()
	// The order of docs/hub.md#shutting-down, within one deadline: the
	// server stops accepting, then the hub closes every bus beside the
	// server's shutdown (each stream gets what is queued, then
	// stream_error shutdown: its client comes back after retryAfter, here
	// or elsewhere), and the server waits for the streams to end; at the
	// deadline the connections left (a client that does not read) are
	// closed.
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hubDone := make(chan error, 1)
	srv.RegisterOnShutdown(func() { hubDone <- hub.Shutdown(shutdown) }) // once the listener is closed
	if srv.Shutdown(shutdown) != nil {
		srv.Close()
	}
	<-hubDone
}
