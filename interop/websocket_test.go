package interop

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssebus/eventbus/internal/daemontest"
)

// TestWebSocketClients drives two WebSocket clients nobody here wrote,
// Python's websockets (Debian's python3-websockets, python/ws_client.py)
// and npm ws (node/ws-client.mjs), against the demo daemon's GET /ws,
// through a reverse proxy (net/http/httputil, which carries the upgrade)
// that can answer /ws 404 as a deployment without the route does. Each
// client, on two sessions of its own:
//
//   - reads from the start (lastEventId=0): every event once, each
//     session's replay_complete, the cursor line; then live events;
//   - leaves (a close frame 1000), and comes back with lastEventId=<its
//     last cursor>: exactly what it missed, each session's
//     replay_complete, then live;
//   - falls back: /ws answers 404, and the client reads GET /events (the
//     multiplexed SSE route) with the WebSocket's cursor as Last-Event-ID:
//     exactly the rest, then live, the SSE ids (composite cursors) kept;
//   - and back to /ws with the SSE route's last id as lastEventId: exactly
//     the rest again.
//
// Over the whole run each session's events arrive exactly once and in
// order. Then the hostile part: a forged cursor is state_resync_required
// cursor_invalid for each session (never an error), a message over 8 KiB
// closes with 1009, one that is not a client message with 1008
// invalid_message, a binary one with 1003.
func TestWebSocketClients(t *testing.T) {
	clients := []struct {
		name  string
		start func(t *testing.T) *wsClient
	}{
		{"python websockets", startPythonWS},
		{"npm ws", startNodeWS},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bin := daemontest.Build(ctx, t, "..", raceEnabled)
	d := daemontest.Start(ctx, t, bin, append([]string{"-addr", daemontest.FreeAddr(t)}, daemonArgs...)...)
	target, err := url.Parse(d.Base)
	if err != nil {
		t.Fatal(err)
	}
	var wsDown atomic.Bool
	rp := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ws" && wsDown.Load() {
			http.NotFound(w, r) // a deployment without the route: a plain 404 page
			return
		}
		rp.ServeHTTP(w, r)
	}))
	defer proxy.Close()
	wsBase := "ws" + strings.TrimPrefix(proxy.URL, "http")

	for i, cl := range clients {
		t.Run(cl.name, func(t *testing.T) {
			c := cl.start(t)
			a, b := fmt.Sprintf("ws%d-a", i), fmt.Sprintf("ws%d-b", i)
			q := url.Values{"session": {a, b}}.Encode()
			wsURL, sseURL := wsBase+"/ws?"+q, proxy.URL+"/events?"+q
			published := map[string]int{}
			publish := func(s string, n int) {
				for range n {
					published[s]++
					d.Publish(s, published[s])
				}
			}
			wantAll := func(what string) {
				t.Helper()
				c.waitFor(t, what, func(recs []wsRecord) (bool, string) {
					got := sessionIDs(t, recs)
					return len(got[a]) == published[a] && len(got[b]) == published[b], fmt.Sprintf("seen %v, published %v", got, published)
				})
			}
			completes := func() int {
				n := 0
				for _, f := range frames(t, c.records()) {
					if f.Type == "replay_complete" {
						n++
					}
				}
				return n
			}
			open := func(what string, cmd map[string]any, transport string) {
				t.Helper()
				mark := len(c.records())
				c.send(t, cmd)
				c.waitFor(t, what+": open", func(recs []wsRecord) (bool, string) {
					for _, r := range recs[mark:] {
						if r.Kind == "open" {
							return r.Transport == transport, fmt.Sprintf("%+v", r)
						}
						if r.Kind == "refused" || r.Kind == "error" {
							t.Fatalf("%s: %+v", what, r)
						}
					}
					return false, "no open yet"
				})
			}
			leave := func() {
				t.Helper()
				mark := len(c.records())
				c.send(t, map[string]any{"cmd": "close"})
				c.waitFor(t, "closed", func(recs []wsRecord) (bool, string) {
					return slices.ContainsFunc(recs[mark:], func(r wsRecord) bool { return r.Kind == "closed" }), "not closed"
				})
			}
			// The sessions exist before the client comes: /ws, like
			// /events, never creates one.
			publish(a, 3)
			publish(b, 2)

			// 1. From the start, then live.
			open("from 0", map[string]any{"cmd": "open", "ws": wsURL, "cursor": "0"}, "ws")
			wantAll("the rings")
			publish(a, 2)
			publish(b, 2)
			wantAll("live events")
			if n := completes(); n != 2 {
				t.Fatalf("%d replay_complete, want one per session", n)
			}
			if sp := c.firstOpen().Subprotocol; sp != "eventbus.v1" {
				t.Errorf("subprotocol %q, want eventbus.v1", sp)
			}

			// 2. Leave, miss events, resume with the cursor.
			leave()
			publish(a, 3)
			publish(b, 1)
			open("resume", map[string]any{"cmd": "open", "ws": wsURL, "resume": true}, "ws")
			wantAll("the missed events")
			publish(a, 1)
			wantAll("live after the resume")

			// 3. /ws gone: the client falls back to the SSE route with the
			// WebSocket's cursor.
			leave()
			wsDown.Store(true)
			publish(a, 2)
			publish(b, 3)
			open("fall back", map[string]any{"cmd": "open", "ws": wsURL, "sse": sseURL, "resume": true}, "sse")
			wantAll("the rest over SSE")
			publish(b, 1)
			wantAll("live over SSE")
			if !slices.ContainsFunc(c.records(), func(r wsRecord) bool { return r.Kind == "fallback" && r.Status == http.StatusNotFound }) {
				t.Fatal("no fallback on the 404")
			}

			// 4. Back to /ws with the SSE route's last id.
			leave()
			wsDown.Store(false)
			publish(a, 2)
			publish(b, 2)
			open("back", map[string]any{"cmd": "open", "ws": wsURL, "sse": sseURL, "resume": true}, "ws")
			wantAll("the rest over the WebSocket again")
			leave()
			if n := completes(); n != 8 {
				t.Errorf("%d replay_complete, want one per session and resume (8)", n)
			}
			checkExactlyOnce(t, c.records(), map[string]int{a: published[a], b: published[b]})

			// 5. Hostile.
			mark := len(c.records())
			open("forged cursor", map[string]any{"cmd": "open", "ws": wsURL, "cursor": "m1forged!"}, "ws")
			c.waitFor(t, "cursor_invalid for each session", func(recs []wsRecord) (bool, string) {
				n := 0
				for _, f := range frames(t, recs[mark:]) {
					if f.Type == "state_resync_required" && f.reason(t) == "cursor_invalid" {
						n++
					}
				}
				return n == 2, fmt.Sprint(n, " cursor_invalid")
			})
			c.send(t, map[string]any{"cmd": "send", "text": `{"op":"add","session":"` + strings.Repeat("x", 9<<10) + `"}`})
			c.waitClose(t, mark, 1009, "message_too_big")
			leave()
			for _, h := range []struct {
				cmd, text string
				code      int
				reason    string
			}{
				{"send", `{"op":"subscribe-everything"}`, 1008, "invalid_message"},
				{"send", `not json`, 1008, "invalid_message"},
				{"sendbinary", `{"op":"remove","session":"x"}`, 1003, "unsupported_data"},
			} {
				mark := len(c.records())
				open("hostile "+h.text, map[string]any{"cmd": "open", "ws": wsURL}, "ws")
				c.waitFor(t, "the greeting", func(recs []wsRecord) (bool, string) {
					return slices.ContainsFunc(recs[mark:], func(r wsRecord) bool { return r.Kind == "cursor" }), "no cursor line"
				})
				c.send(t, map[string]any{"cmd": h.cmd, "text": h.text})
				c.waitClose(t, mark, h.code, h.reason)
				leave()
			}
			t.Logf("%s: %v events once each in order over ws, ws after a resume, SSE after a fallback and ws again; forged cursor and hostile messages answered by the spec", cl.name, published)
		})
	}
}

// wsRecord is one line a WebSocket client printed.
type wsRecord struct {
	Kind        string `json:"kind"`
	Transport   string `json:"transport"`
	Subprotocol string `json:"subprotocol"`
	Data        string `json:"data"`
	ID          string `json:"id"`
	Cursor      string `json:"cursor"`
	Code        int    `json:"code"`
	Reason      string `json:"reason"`
	Status      int    `json:"status"`
	Message     string `json:"message"`
}

// wsClient is a client process driven by JSON lines on its stdin.
type wsClient struct {
	stdin io.WriteCloser
	mu    sync.Mutex
	recs  []wsRecord
}

func startWSClient(t *testing.T, dir string, name string, args ...string) *wsClient {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
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
	c := &wsClient{stdin: stdin}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			var r wsRecord
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				r = wsRecord{Kind: "garbage", Data: sc.Text()}
			}
			c.mu.Lock()
			c.recs = append(c.recs, r)
			c.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan error, 1)
		go func() { <-read; done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return c
}

func (c *wsClient) send(t *testing.T, cmd map[string]any) {
	t.Helper()
	b, _ := json.Marshal(cmd)
	if _, err := c.stdin.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
}

func (c *wsClient) records() []wsRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.recs)
}

func (c *wsClient) firstOpen() wsRecord {
	for _, r := range c.records() {
		if r.Kind == "open" {
			return r
		}
	}
	return wsRecord{}
}

func (c *wsClient) waitFor(t *testing.T, what string, cond func([]wsRecord) (bool, string)) {
	t.Helper()
	daemontest.WaitUntil(t, 30*time.Second, what, func() (bool, string) {
		recs := c.records()
		for _, r := range recs {
			if r.Kind == "garbage" || r.Kind == "error" {
				t.Fatalf("%s: the client printed %+v", what, r)
			}
		}
		return cond(recs)
	})
}

// waitClose waits for the close of the connection opened after mark.
func (c *wsClient) waitClose(t *testing.T, mark, code int, reason string) {
	t.Helper()
	c.waitFor(t, fmt.Sprintf("close %d %s", code, reason), func(recs []wsRecord) (bool, string) {
		for _, r := range recs[mark:] {
			if r.Kind == "close" {
				if r.Code != code || r.Reason != reason {
					t.Fatalf("closed with %d %q, want %d %q", r.Code, r.Reason, code, reason)
				}
				return true, ""
			}
		}
		return false, "not closed"
	})
}

// wsFrame is a frame line's envelope.
type wsFrame struct {
	Session string          `json:"session"`
	ID      uint64          `json:"id"`
	Type    string          `json:"type"`
	Data    json.RawMessage `json:"data"`
	rec     wsRecord
}

func (f wsFrame) reason(t *testing.T) string {
	var d struct{ Reason string }
	if err := json.Unmarshal(f.Data, &d); err != nil {
		t.Fatalf("%+v: %v", f.rec, err)
	}
	return d.Reason
}

func frames(t *testing.T, recs []wsRecord) []wsFrame {
	var out []wsFrame
	for _, r := range recs {
		if r.Kind != "frame" {
			continue
		}
		var f wsFrame
		if err := json.Unmarshal([]byte(r.Data), &f); err != nil {
			t.Fatalf("a frame that is not an envelope: %+v", r)
		}
		f.rec = r
		out = append(out, f)
	}
	return out
}

// sessionIDs is every session's event ids, in the order they came.
func sessionIDs(t *testing.T, recs []wsRecord) map[string][]uint64 {
	got := map[string][]uint64{}
	for _, f := range frames(t, recs) {
		if f.ID != 0 {
			got[f.Session] = append(got[f.Session], f.ID)
		}
	}
	return got
}

// checkExactlyOnce: each session's events 1..n once, in order; the only
// synthetic frames are replay_complete; SSE frames carry a composite
// cursor as their id.
func checkExactlyOnce(t *testing.T, recs []wsRecord, want map[string]int) {
	t.Helper()
	for s, ids := range sessionIDs(t, recs) {
		if !slices.Equal(ids, daemontest.IDs(1, uint64(want[s]))) {
			t.Fatalf("session %s: ids %v, want 1..%d once each in order", s, ids, want[s])
		}
	}
	for _, f := range frames(t, recs) {
		if f.ID == 0 && f.Type != "replay_complete" {
			t.Fatalf("synthetic frame %s", f.rec.Data)
		}
		if f.rec.Transport == "sse" && f.ID != 0 && !strings.HasPrefix(f.rec.ID, "m1") {
			t.Fatalf("SSE id %q is no composite cursor", f.rec.ID)
		}
	}
}

// pythonWithWebsockets is the first python3 that imports websockets:
// Debian's /usr/bin/python3 (python3-websockets), else the one on PATH.
func pythonWithWebsockets() (string, error) {
	var last error
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		path, err := exec.LookPath(p)
		if err != nil {
			last = err
			continue
		}
		if out, err := exec.Command(path, "-c", "import websockets").CombinedOutput(); err != nil {
			last = fmt.Errorf("%s: %v: %s", path, err, out)
			continue
		}
		return path, nil
	}
	return "", last
}

func missing(t *testing.T, what string, err error) {
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s missing (CI=true): %v; run .ci/interop.sh", what, err)
	}
	t.Skipf("%s missing: %v", what, err)
}

func startPythonWS(t *testing.T) *wsClient {
	py, err := pythonWithWebsockets()
	if err != nil {
		missing(t, "python3 with websockets (Debian's python3-websockets)", err)
	}
	return startWSClient(t, "python", py, "-u", "ws_client.py")
}

func startNodeWS(t *testing.T) *wsClient {
	_, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(nodeDir, "node_modules", "ws"))
	}
	if err != nil {
		missing(t, "node or interop/node/node_modules/ws (npm ci in interop/node)", err)
	}
	return startWSClient(t, nodeDir, "node", "ws-client.mjs")
}
