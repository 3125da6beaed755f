// Command daemon is the complete daemon of the README: sessions in an
// eventbus.Hub (a session cap, idle expiry, one byte budget over every ring;
// a GET never creates a session), a POST that publishes, and an HTTP server
// that bounds what a client can hold of it (slow headers, slow or large
// bodies, idle connections), with a graceful shutdown on SIGTERM. It is safe
// to copy: TestREADMEDaemon (cmd/sessiond/readme_test.go) builds it in a
// module of its own, runs it, publishes, reads the stream back and stops it.
//
//	go run ./examples/daemon -addr 127.0.0.1:8080
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
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
		MaxSessions:   1000,             // a new session beyond: ErrHubFull
		IdleTimeout:   10 * time.Minute, // no publish, no subscriber: closed and forgotten
		MaxTotalBytes: 256 << 20,        // every session's replay ring together
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	// The stream. An unknown session is a 404: a GET or HEAD never creates one.
	mux.Handle("GET /session/{id}/events", &eventbus.Handler{Lookup: hub.LookupSession})
	// Publish {"type":"...","data":...}, creating the session.
	bodies := make(chan struct{}, 16) // at most 16 bodies (16 MiB) read at once
	mux.HandleFunc("POST /session/{id}/events", func(w http.ResponseWriter, r *http.Request) {
		select {
		case bodies <- struct{}{}:
			defer func() { <-bodies }()
		default:
			w.Header().Set("Retry-After", "1")
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		// A deadline on the body alone: a server-wide ReadTimeout would cut the streams.
		http.NewResponseController(w).SetReadDeadline(time.Now().Add(30 * time.Second))
		var req struct {
			Type string          `json:"type"`
			Data json.RawMessage `json:"data"`
		}
		err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req)
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
			return
		case errors.Is(err, os.ErrDeadlineExceeded):
			http.Error(w, "body too slow", http.StatusRequestTimeout)
			return
		case err != nil:
			http.Error(w, "bad body: "+err.Error(), http.StatusBadRequest)
			return
		}
		f, err := hub.Publish(r.PathValue("id"), eventbus.Event{Type: req.Type, Data: req.Data})
		switch {
		case errors.Is(err, eventbus.ErrHubFull), errors.Is(err, eventbus.ErrClosed):
			w.Header().Set("Retry-After", "1")
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		case err != nil: // an invalid session id (CheckSessionID), an invalid or too large event
			http.Error(w, err.Error(), http.StatusBadRequest)
		default:
			fmt.Fprintf(w, "{\"id\":%d}\n", f.ID())
		}
	})

	srv := &http.Server{
		Addr:              *addr,
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second, // slowloris
		MaxHeaderBytes:    64 << 10,
		IdleTimeout:       2 * time.Minute,
		// No ReadTimeout or WriteTimeout: streams are long-lived. The
		// Handler puts a deadline on each of its writes instead.
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
			log.Fatal(err)
		}
	}()
	<-ctx.Done()
	// Every stream gets what is queued, then stream_error shutdown (its
	// client comes back after retryAfter, here or elsewhere), and ends; the
	// server stops accepting at once and waits for those. At the bound the
	// connections left (a client that does not read) are closed.
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go hub.Shutdown(shutdown)
	if srv.Shutdown(shutdown) != nil {
		srv.Close()
	}
}
