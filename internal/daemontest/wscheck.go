package daemontest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ssebus/eventbus/internal/muxcursor"
	"github.com/ssebus/eventbus/sseclient"
)

// ReplicaRun is a replica daemon's run function, as its main calls it:
// args without the program name, its log to logOut, ready called with the
// listening address.
type ReplicaRun func(ctx context.Context, args []string, logOut io.Writer, ready func(addr string)) error

// RunReplica runs a replica in the test's process (run, as the daemon's
// main does) on the engine e, whose URL goes in the flag engineFlag
// (without the dash), until the test ends, and returns its base URL; a
// replica that fails to start or ends with an error fails t.
func RunReplica(t *testing.T, run ReplicaRun, engineFlag string, e ReplicaEngine, name string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	done := make(chan error, 1)
	args := append([]string{"-addr", "127.0.0.1:0", "-" + engineFlag, e.URL, "-name", name}, e.Flags...)
	go func() { done <- run(ctx, args, io.Discard, func(a string) { addr <- a }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("replica %s: %v", name, err)
		}
	})
	select {
	case a := <-addr:
		return "http://" + a
	case err := <-done:
		t.Fatalf("replica %s: %v", name, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("replica %s did not start", name)
	}
	return ""
}

// WebSocketAcrossReplicas checks the WebSocket (GET /ws) and the
// multiplexed SSE stream (GET /events) of two replicas a and b (base URLs,
// as RunReplica returns them) on one engine: the cursor line read over
// the WebSocket on A resumes on B over the WebSocket and over SSE with
// nothing lost and nothing twice, and the SSE stream's cursor resumes the
// WebSocket; a forged, oversized or stale cursor gets the multiplexed
// route's answer (state_resync_required cursor_invalid, or epoch_reset),
// never a silent gap; the handshake's refusals are the route's JSON, an
// unknown session is not created by either route, and an add message
// with a cursor past 8 KiB closes the socket with 1009.
//
// The replica daemons' tests (redisbus/cmd/sessiond-redis,
// pgbus/cmd/sessiond-pg, natsbus/cmd/sessiond-nats) call it with their
// engine's replicas: this module speaks WebSocket only through dialer
// (github.com/ssebus/eventbus/websocket's Dialer, which offers the
// subprotocol eventbus.v1), and closeStatus returns the close code of the
// error that ended a ReadMessage (-1 when it is no close frame's), which
// the WebSocket library knows.
func WebSocketAcrossReplicas(t *testing.T, a, b string, dialer sseclient.WebSocketDialer, closeStatus func(error) int) {
	w := &wsCheck{dialer: dialer, closeStatus: closeStatus}
	w.scenario(t, a, b)
}

// wsCheck is WebSocketAcrossReplicas under way: the client's WebSocket.
type wsCheck struct {
	dialer      sseclient.WebSocketDialer
	closeStatus func(error) int
}

// wsWait bounds every wait for a frame or an answer.
const wsWait = 15 * time.Second

// wsMessageTooBig is the close code of a message too big to process
// (RFC 6455 7.4.1).
const wsMessageTooBig = 1009

// wsFrame is one frame of a multiplexed stream, from its envelope.
type wsFrame struct {
	Session string
	ID      uint64
	Type    string
	Reason  string // a state_resync_required's
}

func (f wsFrame) String() string {
	if f.ID != 0 {
		return fmt.Sprintf("%s#%d", f.Session, f.ID)
	}
	return fmt.Sprintf("%s:%s(%s)", f.Session, f.Type, f.Reason)
}

func parseEnvelope(t *testing.T, line string) wsFrame {
	t.Helper()
	var env struct {
		Session string `json:"session"`
		ID      uint64 `json:"id"`
		Type    string `json:"type"`
		Reason  string `json:"reason"`
		Data    struct {
			Reason string `json:"reason"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(line), &env); err != nil {
		t.Fatalf("envelope %q: %v", line, err)
	}
	f := wsFrame{Session: env.Session, ID: env.ID, Type: env.Type, Reason: env.Reason}
	if f.Reason == "" {
		f.Reason = env.Data.Reason
	}
	return f
}

// muxStream is an open multiplexed stream, over either transport: frames
// in order, and the cursor after the last frame read.
type muxStream struct {
	t      *testing.T
	next   func() (frames []wsFrame, cursor string, err error) // one message, or one SSE event
	cursor string
	close  func()
}

// read returns the next frames until want returns true for the frames
// read so far (events and synthetic frames; heartbeats skipped).
func (s *muxStream) read(want func([]wsFrame) bool) []wsFrame {
	s.t.Helper()
	var got []wsFrame
	for !want(got) {
		fs, cursor, err := s.next()
		if err != nil {
			s.t.Fatalf("after %v: %v", got, err)
		}
		got = append(got, fs...)
		if cursor != "" {
			s.cursor = cursor
		}
	}
	return got
}

// quiet fails the test if a frame comes within d.
func (s *muxStream) quiet(d time.Duration) {
	s.t.Helper()
	type res struct {
		fs  []wsFrame
		err error
	}
	ch := make(chan res, 1)
	timer := time.AfterFunc(d, s.close)
	defer timer.Stop()
	go func() {
		for {
			fs, cursor, err := s.next()
			if cursor != "" {
				s.cursor = cursor
			}
			if err != nil || len(fs) > 0 {
				ch <- res{fs, err}
				return
			}
		}
	}()
	if r := <-ch; len(r.fs) > 0 {
		s.t.Fatalf("unexpected frames %v", r.fs)
	}
}

// events returns the event frames of fs (those with an id).
func events(fs []wsFrame) []string {
	var out []string
	for _, f := range fs {
		if f.ID != 0 {
			out = append(out, f.String())
		}
	}
	slices.Sort(out)
	return out
}

// hasAll reports whether fs holds every frame of want (by String).
func hasAll(want ...string) func([]wsFrame) bool {
	return func(fs []wsFrame) bool {
		seen := map[string]bool{}
		for _, f := range fs {
			seen[f.String()] = true
		}
		for _, w := range want {
			if !seen[w] {
				return false
			}
		}
		return true
	}
}

func wsURL(base string) string { return "ws" + strings.TrimPrefix(base, "http") }

// openWS opens GET /ws?query on base (lastEventId in the query when
// cursor is set); it fails the test unless the handshake succeeds.
func (w *wsCheck) openWS(t *testing.T, base, query, cursor string) *muxStream {
	t.Helper()
	c, resp, err := w.dial(base, query, cursor)
	if err != nil {
		t.Fatalf("GET /ws?%s: %v %v", query, err, resp)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &muxStream{t: t}
	s.close = func() { cancel(); c.Close() }
	t.Cleanup(s.close)
	var pending []string
	s.next = func() ([]wsFrame, string, error) {
		if pending == nil {
			rctx, rcancel := context.WithTimeout(ctx, wsWait)
			defer rcancel()
			p, err := c.ReadMessage(rctx)
			if err != nil {
				return nil, "", err
			}
			pending = strings.Split(string(p), "\n")
		}
		lines := pending
		pending = nil
		var fs []wsFrame
		var cursor string
		for _, l := range lines {
			if strings.HasPrefix(l, `{"op":`) {
				var ctl struct{ Op, Cursor string }
				if err := json.Unmarshal([]byte(l), &ctl); err != nil {
					return nil, "", err
				}
				if ctl.Op == "cursor" {
					cursor = ctl.Cursor
				}
				continue
			}
			fs = append(fs, parseEnvelope(t, l))
		}
		return fs, cursor, nil
	}
	return s
}

// dial opens the WebSocket GET /ws?query on base (lastEventId in the
// query when cursor is set), with the subprotocol eventbus.v1.
func (w *wsCheck) dial(base, query, cursor string) (sseclient.WebSocketConn, *http.Response, error) {
	if cursor != "" {
		query += "&lastEventId=" + cursor
	}
	ctx, cancel := context.WithTimeout(context.Background(), wsWait)
	defer cancel()
	return w.dialer.DialWebSocket(ctx, wsURL(base)+"/ws?"+query, nil)
}

// openSSE opens GET /events?query on base with Last-Event-ID: cursor.
func openSSE(t *testing.T, base, query, cursor string) *muxStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/events?"+query, nil)
	if cursor != "" {
		req.Header.Set("Last-Event-ID", cursor)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("GET /events?%s: %s %s", query, resp.Status, body)
	}
	s := &muxStream{t: t}
	s.close = func() { cancel(); resp.Body.Close() }
	t.Cleanup(s.close)
	p := sseclient.NewParser(resp.Body)
	s.next = func() ([]wsFrame, string, error) {
		timer := time.AfterFunc(wsWait, s.close)
		defer timer.Stop()
		for {
			m, err := p.Next()
			if err != nil {
				return nil, "", err
			}
			if m.Kind != sseclient.KindEvent {
				continue
			}
			f := parseEnvelope(t, string(m.Data))
			cursor := ""
			if m.HasID {
				cursor = m.ID
			}
			return []wsFrame{f}, cursor, nil
		}
	}
	return s
}

// publishTo posts an event to session on base and returns its id.
func publishTo(t *testing.T, base, session string) uint64 {
	t.Helper()
	resp, err := http.Post(base+"/session/"+session+"/events", "application/json", strings.NewReader(`{"type":"note"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ ID uint64 }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("publish to %s on %s: %s %v", session, base, resp.Status, err)
	}
	return out.ID
}

// getJSON answers GET url: its status and JSON body.
func getJSON(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]any
	json.NewDecoder(resp.Body).Decode(&v)
	return resp.StatusCode, v
}

// scenario is WebSocketAcrossReplicas's.
func (w *wsCheck) scenario(t *testing.T, a, b string) {
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	const both = "session=a&session=b"
	for _, p := range []struct{ base, s string }{{a, "a"}, {b, "a"}, {a, "a"}, {b, "b"}, {a, "b"}} {
		publishTo(t, p.base, p.s)
	}

	// Everything from the start over A's WebSocket, one more live, and the
	// cursor line after it.
	sa := w.openWS(t, a, both, "0")
	got := sa.read(hasAll("a#1", "a#2", "a#3", "b#1", "b#2"))
	publishTo(t, b, "a")
	got = append(got, sa.read(hasAll("a#4"))...)
	if ev := events(got); !slices.Equal(ev, []string{"a#1", "a#2", "a#3", "a#4", "b#1", "b#2"}) {
		t.Fatalf("A's WebSocket: %v", ev)
	}
	cursor := sa.cursor
	if !strings.HasPrefix(cursor, "m1") {
		t.Fatalf("the cursor line %q", cursor)
	}
	sa.close()

	// Missed while away, published on both replicas.
	publishTo(t, a, "a") // a#5
	publishTo(t, b, "b") // b#3
	publishTo(t, a, "b") // b#4

	// B's WebSocket from that cursor: exactly what was missed, then live.
	sb := w.openWS(t, b, both, cursor)
	got = sb.read(hasAll("a#5", "b#3", "b#4", "a:replay_complete()", "b:replay_complete()"))
	publishTo(t, a, "a") // a#6, live
	got = append(got, sb.read(hasAll("a#6"))...)
	sb.quiet(300 * time.Millisecond)
	if ev := events(got); !slices.Equal(ev, []string{"a#5", "a#6", "b#3", "b#4"}) {
		t.Fatalf("B's WebSocket from %s: %v, want a#5 a#6 b#3 b#4 once each", cursor, ev)
	}
	wsCursor := sb.cursor
	sb.close()

	// B's SSE stream from the same cursor: the same events.
	se := openSSE(t, b, both, cursor)
	got = se.read(hasAll("a#5", "a#6", "b#3", "b#4", "a:replay_complete()", "b:replay_complete()"))
	se.quiet(300 * time.Millisecond)
	if ev := events(got); !slices.Equal(ev, []string{"a#5", "a#6", "b#3", "b#4"}) {
		t.Fatalf("B's SSE stream from %s: %v", cursor, ev)
	}
	se.close()

	// The WebSocket's last cursor on SSE, and the SSE stream's last
	// cursor on A's WebSocket: nothing again, then only the new event.
	se = openSSE(t, b, both, wsCursor)
	se.read(hasAll("a:replay_complete()", "b:replay_complete()"))
	publishTo(t, a, "b") // b#5
	if got := se.read(hasAll("b#5")); !slices.Equal(events(got), []string{"b#5"}) {
		t.Fatalf("B's SSE stream from the WebSocket's cursor: %v, want b#5 alone", got)
	}
	sseCursor := se.cursor
	se.close()
	sa = w.openWS(t, a, both, sseCursor)
	got = sa.read(hasAll("a:replay_complete()", "b:replay_complete()"))
	publishTo(t, b, "a") // a#7
	got = append(got, sa.read(hasAll("a#7"))...)
	if ev := events(got); !slices.Equal(ev, []string{"a#7"}) {
		t.Fatalf("A's WebSocket from the SSE stream's cursor: %v, want a#7 alone", got)
	}
	sa.close()

	t.Run("HostileCursors", func(t *testing.T) { w.hostile(t, a, b, cursor) })
}

// hostile: cursors a client must not be silently served from, on both
// routes alike, and the handshake's refusals.
func (w *wsCheck) hostile(t *testing.T, a, b, good string) {
	const both = "session=a&session=b"
	invalid := []string{"a:state_resync_required(cursor_invalid)", "b:state_resync_required(cursor_invalid)"}
	group := good[len(muxcursor.Prefix) : len(muxcursor.Prefix)+muxcursor.EntryLen]
	var epochA string
	if code, v := getJSON(t, a+"/session/a"); code == 200 {
		epochA, _ = v["epoch"].(string)
	}
	stale := muxcursor.Cursor{muxcursor.NewEntry("a", "ffffffffffff"+strings.Repeat("0", 20), 3)}.String()
	forgedID := muxcursor.Cursor{muxcursor.NewEntry("a", epochA, 1<<40)}.String()
	for _, c := range []struct {
		name, cursor string
		want         []string
		replay       bool // a's frame is epoch_reset: its whole ring follows, then replay_complete
	}{
		{"Malformed", "m1!!notacursor", invalid, false},
		{"SingleStreamID", "3", invalid, false},
		{"TooManyEntries", muxcursor.Prefix + strings.Repeat(group, muxcursor.MaxEntries+1), invalid, false},
		{"OtherEpoch", stale, []string{"a:state_resync_required(epoch_reset)"}, true},
		// An id past the session's last: not a silent wait for events
		// that do not exist (4.1).
		{"IDFromTheFuture", forgedID, []string{"a:state_resync_required(epoch_reset)"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var answers [2][]string
			for i, open := range []func(*testing.T, string, string, string) *muxStream{w.openWS, openSSE} {
				_, st := getJSON(t, a+"/session/a")
				last := uint64(st["lastEventId"].(float64))
				s := open(t, b, both, c.cursor)
				want := c.want
				if c.replay {
					want = append(slices.Clip(want), "a:replay_complete()")
				}
				got := s.read(hasAll(want...))
				var synth, ev []string
				for _, f := range got {
					if f.ID == 0 {
						synth = append(synth, f.String())
						continue
					}
					if !c.replay || len(synth) == 0 || f.Session != "a" {
						t.Fatalf("an event before the refusal: %v", got)
					}
					ev = append(ev, f.String())
				}
				if c.replay {
					var all []string
					for id := uint64(1); id <= last; id++ {
						all = append(all, fmt.Sprintf("a#%d", id))
					}
					if !slices.Equal(ev, all) {
						t.Fatalf("after epoch_reset: %v, want a#1..a#%d once each", got, last)
					}
				}
				n := publishTo(t, a, "a")
				got = s.read(hasAll(fmt.Sprintf("a#%d", n)))
				if ev := events(got); len(ev) != 1 {
					t.Fatalf("live after the refusal: %v", got)
				}
				s.close()
				slices.Sort(synth)
				answers[i] = synth
			}
			if !slices.Equal(answers[0], answers[1]) {
				t.Fatalf("the WebSocket answered %v, the SSE route %v", answers[0], answers[1])
			}
		})
	}

	t.Run("Handshake", func(t *testing.T) {
		many := strings.Repeat("session=x&", 32) + "session=y"
		for _, c := range []struct {
			query, code string
			status      int
		}{
			{"session=a&session=nope", "session_not_found", 404},
			{"session=a&session=a", "invalid_sessions", 400},
			{many, "invalid_sessions", 400},
			{"session=a%FF", "invalid_sessions", 400},
		} {
			_, resp, err := w.dial(b, c.query, "")
			if err == nil || resp == nil {
				t.Fatalf("/ws?%s: the handshake succeeded (%v)", c.query, err)
			}
			var v map[string]any
			json.NewDecoder(resp.Body).Decode(&v)
			resp.Body.Close()
			status, sse := getJSON(t, b+"/events?"+c.query)
			if resp.StatusCode != c.status || v["code"] != c.code || status != c.status || sse["code"] != c.code {
				t.Fatalf("?%s: /ws %d %v, /events %d %v; want %d %s", c.query, resp.StatusCode, v, status, sse, c.status, c.code)
			}
		}
		if code, v := getJSON(t, a+"/session/nope"); code != 404 {
			t.Fatalf("the multiplexed routes made session nope: %d %v", code, v)
		}
	})

	// A cursor past 8 KiB in an add message: the socket closes with 1009,
	// it is not read as no cursor.
	t.Run("OversizedAdd", func(t *testing.T) {
		c, _, err := w.dial(b, "session=a", "")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), wsWait)
		defer cancel()
		msg := `{"op":"add","session":"b","lastEventId":"` + muxcursor.Prefix + strings.Repeat(group, 400) + `"}`
		if err := c.WriteMessage(ctx, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := c.ReadMessage(ctx); err != nil {
				if st := w.closeStatus(err); st != wsMessageTooBig {
					t.Fatalf("the socket ended with %v (%d), want 1009", err, st)
				}
				return
			}
		}
	})
}
