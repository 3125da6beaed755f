package interop

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	r3 "github.com/r3labs/sse/v2"
	gosse "github.com/tmaxmax/go-sse"
	"gopkg.in/cenkalti/backoff.v1"

	"github.com/ssebus/eventbus/sseclient"
)

// record is one thing a client reported, in the order it reported it.
type record struct {
	Kind string `json:"kind"` // "event"; "open"; "end" or "error": a connection ended
	Type string `json:"type"` // the event type as the client reports it ("" or "message": unnamed)
	ID   string `json:"id"`   // the last event id the client holds after this event
	Data string `json:"data"`
}

// client is one third-party SSE client reading one session's stream.
type client struct {
	name    string
	session string

	mu   sync.Mutex
	recs []record
}

func (c *client) add(r record) {
	c.mu.Lock()
	c.recs = append(c.recs, r)
	c.mu.Unlock()
}

func (c *client) records() []record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]record(nil), c.recs...)
}

// events counts the published events the client has seen (those whose
// envelope has an "id").
func (c *client) events() int {
	n := 0
	for _, r := range c.records() {
		var env struct {
			ID *uint64 `json:"id"`
		}
		if r.Kind == "event" && json.Unmarshal([]byte(r.Data), &env) == nil && env.ID != nil {
			n++
		}
	}
	return n
}

// starter starts a client on url until ctx is done; the returned func
// waits for it to have stopped.
type starter func(t *testing.T, ctx context.Context, c *client, url string) (wait func())

// startGoSSE runs a tmaxmax/go-sse Connection, which reconnects by itself
// after any end of the response, with Last-Event-ID, after the server's
// retry: (or its backoff).
func startGoSSE(t *testing.T, ctx context.Context, c *client, url string) func() {
	tr := &http.Transport{}
	cl := &gosse.Client{
		HTTPClient:        &http.Client{Transport: tr},
		ResponseValidator: gosse.DefaultValidator,
		Backoff:           gosse.Backoff{InitialInterval: 100 * time.Millisecond, Multiplier: 1, Jitter: 0.5},
		OnRetry:           func(err error, _ time.Duration) { c.add(record{Kind: "end", Data: err.Error()}) },
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	conn := cl.NewConnection(req)
	conn.SubscribeToAll(func(e gosse.Event) {
		c.add(record{Kind: "event", Type: e.Type, ID: e.LastEventID, Data: e.Data})
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = conn.Connect() // returns once ctx is done
	}()
	return func() { <-done; tr.CloseIdleConnections() }
}

// startR3labs runs an r3labs/sse Client. Its Subscribe returns for good
// when a response ends cleanly (it retries only errors), so the loop
// subscribes again, as its users must; the client keeps its LastEventID
// across calls and sends it back.
func startR3labs(t *testing.T, ctx context.Context, c *client, url string) func() {
	tr := &http.Transport{}
	cl := r3.NewClient(url)
	cl.Connection = &http.Client{Transport: tr}
	// With ctx: RetryNotify retries a failed request until its backoff
	// says stop, and a constant backoff alone never does, so a request
	// that fails because ctx ended would be retried forever.
	cl.ReconnectStrategy = backoff.WithContext(backoff.NewConstantBackOff(100*time.Millisecond), ctx)
	cl.OnDisconnect(func(*r3.Client) { c.add(record{Kind: "end", Data: "disconnected"}) })
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			err := cl.SubscribeRawWithContext(ctx, func(m *r3.Event) {
				c.add(record{Kind: "event", Type: string(m.Event), ID: string(m.ID), Data: string(m.Data)})
			})
			if err == nil {
				c.add(record{Kind: "end", Data: "the response ended; Subscribe returned"})
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	return func() { <-done; tr.CloseIdleConnections() }
}

// startSSEClient runs our own client, sseclient, as the harness's
// reference: it must see what the third-party clients see, with no
// exception. It reports typed callbacks, not raw frames; each becomes the
// record the wire would have given a client that reads it right: events
// with their envelope and "<epoch>:<id>" SSE id, replay_complete and
// state_resync_required as the frames that carried them.
func startSSEClient(t *testing.T, ctx context.Context, c *client, url string) func() {
	tr := &http.Transport{}
	add := func(typ string, v any, id string) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Error(err)
		}
		c.add(record{Kind: "event", Type: typ, ID: id, Data: string(b)})
	}
	cl := &sseclient.Client{
		URL:        url,
		HTTPClient: &http.Client{Transport: tr},
		OnEvent: func(e sseclient.Event) {
			add(e.Type, map[string]any{"id": e.ID, "type": e.Type, "data": e.Data}, e.Epoch+":"+strconv.FormatUint(e.ID, 10))
		},
		OnCaughtUp: func(cu sseclient.CaughtUp) {
			add("replay_complete", map[string]any{"type": "replay_complete", "data": cu}, "")
		},
		OnResync: func(r sseclient.Resync) {
			add("state_resync_required", map[string]any{"type": "state_resync_required", "data": map[string]any{
				"reason": r.Reason, "detail": r.Detail, "epoch": r.Epoch, "lastDeliveredId": r.LastDeliveredID}}, "")
		},
		OnState: func(s sseclient.StateChange) {
			switch s.State {
			case sseclient.StateOpen:
				c.add(record{Kind: "open"})
			case sseclient.StateReconnecting:
				c.add(record{Kind: "end", Data: fmt.Sprint(s.Err)})
			}
		},
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := cl.Run(ctx); !errors.Is(err, context.Canceled) {
			t.Errorf("sseclient: Run returned %v", err)
		}
	}()
	return func() { <-done; tr.CloseIdleConnections() }
}

// nodeDir is where the Node clients and their node_modules are.
const nodeDir = "node"

// nodeAvailable skips the test without node or node_modules (npm ci in
// interop/node), unless CI=true, where it fails.
func nodeAvailable(t *testing.T) {
	_, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(nodeDir, "node_modules", "eventsource"))
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("node or interop/node/node_modules missing (CI=true): %v; run .ci/interop.sh", err)
		}
		t.Skipf("node or interop/node/node_modules missing: %v (cd interop/node && npm ci)", err)
	}
}

// startNode runs one of the Node clients, which prints its records as JSON
// lines; closing its stdin stops it.
func startNode(script string) starter {
	return func(t *testing.T, ctx context.Context, c *client, url string) func() {
		cmd := exec.Command("node", script, url)
		cmd.Dir = nodeDir
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		read := make(chan struct{})
		go func() {
			defer close(read)
			sc := bufio.NewScanner(stdout)
			sc.Buffer(make([]byte, 64<<10), 16<<20)
			for sc.Scan() {
				var r record
				if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
					c.add(record{Kind: "garbage", Data: sc.Text()})
					continue
				}
				if r.Kind == "error" {
					r.Kind = "end"
				}
				c.add(r)
			}
		}()
		go func() {
			<-ctx.Done()
			stdin.Close()
		}()
		return func() {
			<-read
			if err := cmd.Wait(); err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("%s: %v", script, err)
			}
		}
	}
}
