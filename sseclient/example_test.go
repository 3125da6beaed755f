package sseclient_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/sseclient"
)

// A client that replays a session from its start, then follows it live.
// Run returns when its context ends; here the example stops it once the
// replay is complete.
func ExampleClient() {
	bus, _ := eventbus.New(eventbus.Options{})
	defer bus.Close()
	srv := httptest.NewServer(&eventbus.Handler{
		Lookup: func(*http.Request, string) (*eventbus.EventBus, error) { return bus, nil },
	})
	defer srv.Close()
	bus.Publish(eventbus.Event{Type: "greeting", Data: map[string]string{"text": "hello"}})
	bus.Publish(eventbus.Event{Type: "greeting", Data: map[string]string{"text": "again"}})

	ctx, cancel := context.WithCancel(context.Background())
	c := &sseclient.Client{
		URL:        srv.URL + "/session/demo/events",
		ResumeFrom: "0", // from the start: everything the ring holds
		OnEvent: func(e sseclient.Event) {
			fmt.Println(e.ID, e.Type, string(e.Data), e.Replayed)
		},
		OnCaughtUp: func(cu sseclient.CaughtUp) {
			fmt.Println("caught up after", cu.ReplayedCount, "events")
			cancel()
		},
		OnResync: func(r sseclient.Resync) {
			fmt.Println("lost", r.Missing.From, "to", r.Missing.To, "of epoch", r.Epoch, "because", r.Reason)
		},
	}
	err := c.Run(ctx)
	_, last, _ := c.Cursor()
	fmt.Println(err, "at", last, c.LastEventID() == bus.Epoch()+":2")
	// Output:
	// 1 greeting {"text":"hello"} true
	// 2 greeting {"text":"again"} true
	// caught up after 2 events
	// context canceled at 2 true
}

// Credentials are asked before the first connection and again when the
// server ends a stream with stream_error reauthenticate or revoked, or
// answers 401 or 403.
func ExampleClient_credentials() {
	bus, _ := eventbus.New(eventbus.Options{})
	defer bus.Close()
	h := &eventbus.Handler{Lookup: func(*http.Request, string) (*eventbus.EventBus, error) { return bus, nil }}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer fresh" {
			http.Error(w, `{"error":"token expired","code":"unauthorized"}`, http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()

	ctx, cancel := context.WithCancel(context.Background())
	c := &sseclient.Client{
		URL: srv.URL,
		Credentials: func(_ context.Context, reason sseclient.CredentialsReason) (sseclient.Credentials, error) {
			fmt.Println("credentials:", reason)
			if reason == sseclient.ReasonInitial {
				return sseclient.Credentials{Token: "stale"}, nil
			}
			return sseclient.Credentials{Token: "fresh"}, nil
		},
		OnState: func(s sseclient.StateChange) {
			if s.State == sseclient.StateOpen {
				fmt.Println("open")
				cancel()
			}
		},
		OnError: func(err error) { fmt.Println(err) },
	}
	c.Run(ctx)
	// Output:
	// credentials: initial
	// sseclient: HTTP 401 unauthorized: token expired
	// credentials: unauthorized
	// open
}

// Several sessions on one connection (eventbus.MuxHandler), from the start
// of each one's ring (ResumeFrom "0"): every value names its session, and
// each session resumes from its own place in the composite cursor. A
// session the server says is gone is dropped.
func ExampleClient_sessions() {
	hub, _ := eventbus.NewHub(eventbus.HubOptions{})
	defer hub.Close()
	srv := httptest.NewServer(&eventbus.MuxHandler{Handler: &eventbus.Handler{Lookup: hub.LookupSession}})
	defer srv.Close()
	a, _ := hub.GetOrCreate("a")
	b, _ := hub.GetOrCreate("b")
	a.Publish(eventbus.Event{Type: "note", Data: 1})
	b.Publish(eventbus.Event{Type: "note", Data: 2})

	ctx, cancel := context.WithCancel(context.Background())
	caught := 0
	c := &sseclient.Client{
		URL:        srv.URL + "/events",
		Sessions:   []string{"a", "b", "gone"},
		ResumeFrom: "0", // from the start of every session
		OnEvent: func(e sseclient.Event) {
			fmt.Println(e.Session, e.ID, string(e.Data))
		},
		OnCaughtUp: func(cu sseclient.CaughtUp) {
			if caught++; caught == 2 {
				cancel()
			}
		},
		OnSessionGone: func(g sseclient.SessionGone) { fmt.Println(g.Session, "is gone:", g.Reason) },
	}
	c.Run(ctx)
	fmt.Println(c.ActiveSessions())
	// Output:
	// gone is gone: session_not_found
	// a 1 1
	// b 1 2
	// [a b]
}

// The Parser reads any text/event-stream, here one with every line end and
// a comment.
func ExampleParser() {
	p := sseclient.NewParser(strings.NewReader("retry: 3000\r\n\r\nid: 1\nevent: note\rdata: a\r\ndata: b\n\n: heartbeat\n\n"))
	for {
		m, err := p.Next()
		if err == io.EOF {
			break
		}
		switch m.Kind {
		case sseclient.KindRetry:
			fmt.Println("retry", m.Retry)
		case sseclient.KindComment:
			fmt.Printf("comment %q\n", m.Comment)
		case sseclient.KindEvent:
			fmt.Printf("%s id=%s data=%q\n", m.Type, m.ID, m.Data)
		}
	}
	// Output:
	// retry 3s
	// note id=1 data="a\nb"
	// comment " heartbeat"
}
