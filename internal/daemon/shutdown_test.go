package daemon

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/internal/pipenet"
	"github.com/ssebus/eventbus/sseclient"
)

// tailed is a stream read to its end on a goroutine of the bubble: the
// data of its events and the fake time it ended at.
type tailed struct {
	data []string
	end  time.Time
	err  error
	done chan struct{}
}

func tail(t *testing.T, client *http.Client, url string) *tailed {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	s := &tailed{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer resp.Body.Close()
		p := sseclient.NewParser(resp.Body)
		for {
			m, err := p.Next()
			if err != nil {
				if err != io.EOF {
					s.err = err
				}
				break
			}
			if m.Kind == sseclient.KindEvent {
				s.data = append(s.data, string(m.Data))
			}
		}
		s.end = time.Now()
	}()
	return s
}

// The shutdown sequence of Run with a Hub behind the SSE handler, on the
// fake clock: at the signal the listener closes, every reading stream gets
// what was queued and the stream_error shutdown and ends at once, and a
// client that never reads (its handler blocked in a write) is cut at
// ShutdownTimeout, when Run returns: neither earlier nor later, and nobody
// waits for it.
func TestServerRunShutdownSaysSoAndCutsAClientThatNeverReads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		quiet := slog.New(slog.DiscardHandler)
		hub, err := eventbus.NewHub(eventbus.HubOptions{Logger: quiet, ShutdownRetryAfter: 2500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		bus, err := hub.GetOrCreate("s")
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /session/{id}/events", &eventbus.Handler{Lookup: hub.LookupSession, Logger: quiet})
		ln := pipenet.Listen()
		var logs logBuffer
		s := &Server{
			Name:            "testd",
			Listener:        ln,
			Handler:         mux,
			Logger:          slog.New(slog.NewTextHandler(&logs, nil)),
			Close:           func(ctx context.Context) { _ = hub.Shutdown(ctx) },
			ShutdownTimeout: 10 * time.Second,
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := runServer(ctx, s)
		client := &http.Client{Transport: &http.Transport{DialContext: ln.DialContext}}
		defer client.CloseIdleConnections()

		var readers []*tailed
		for range 3 {
			readers = append(readers, tail(t, client, "http://pipe/session/s/events"))
		}
		// Sends its request and never reads a byte: the handler blocks in
		// its first flush, its subscription holding what is published.
		never, err := ln.DialContext(context.Background(), "", "")
		if err != nil {
			t.Fatal(err)
		}
		defer never.Close()
		if _, err := io.WriteString(never, "GET /session/s/events HTTP/1.1\r\nHost: pipe\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if n := bus.SubscriberCount(); n != 4 {
			t.Fatalf("%d subscribers, want 4", n)
		}
		for i := range 20 {
			if _, err := bus.Publish(eventbus.Event{Type: "e", Data: i}); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()

		start := time.Now()
		cancel()
		synctest.Wait()
		for i, r := range readers {
			select {
			case <-r.done:
			default:
				t.Fatalf("reader %d is still open after the shutdown began", i)
			}
			if r.err != nil || !r.end.Equal(start) {
				t.Fatalf("reader %d ended at +%v with %v, want at once, cleanly", i, r.end.Sub(start), r.err)
			}
			if len(r.data) != 21 || !strings.HasPrefix(r.data[19], `{"id":20,`) {
				t.Fatalf("reader %d got %d frames, want the 20 events and the shutdown frame: %q", i, len(r.data), r.data)
			}
			want := `"data":{"error":"the server is shutting down: reconnect after retryAfter ms and resume","errorKind":"shutdown","retryAfter":2500}`
			if !strings.Contains(r.data[20], want) {
				t.Fatalf("reader %d's last frame %s, want %s", i, r.data[20], want)
			}
		}
		if c, err := ln.DialContext(context.Background(), "", ""); err == nil {
			c.Close()
			t.Error("the listener still accepts after the shutdown began")
		}
		select {
		case err := <-done:
			t.Fatalf("Run returned (%v) while a stream was blocked in a write", err)
		default:
		}

		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		if took := time.Since(start); took != s.ShutdownTimeout {
			t.Fatalf("Run returned %v after the signal, want exactly ShutdownTimeout %v", took, s.ShutdownTimeout)
		}
		if !strings.Contains(logs.String(), `msg="shutdown timed out; closing connections"`) {
			t.Fatalf("no timeout line:\n%s", logs.String())
		}
		if st := hub.Stats(); st.Sessions != 0 || st.Buses.Subscribers != 0 {
			t.Fatalf("after Run: %d sessions, %d subscribers", st.Sessions, st.Buses.Subscribers)
		}
	})
}
