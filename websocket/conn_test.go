package websocket_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	ws "github.com/coder/websocket"
	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/websocket"
)

// frameLines returns the frame lines of lines (not the control lines).
func frameLines(lines []line) []line {
	return slices.DeleteFunc(slices.Clone(lines), func(l line) bool { return l.Op != "" })
}

// TestEnvelopesMatchSSE: every frame line over the WebSocket is the SSE
// multiplexed route's data: line, byte for byte, for events (a small one
// and one of more than 64 KiB, written from its shared bytes), signals and
// synthetic frames (the replay's replay_complete), the stream served
// beside the WebSocket with the same cursor.
func TestEnvelopesMatchSSE(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		e.session("a")
		e.session("b")
		e.publish("a", "note", 1)
		e.publish("b", "note", 2)
		big := strings.Repeat("x", 100<<10)
		if _, err := e.hub.Publish("a", eventbus.Event{Type: "big", Data: big}); err != nil {
			t.Fatal(err)
		}
		e.publish("a", "note", 3)

		r := newReader(t, e.mustDial("session=a&session=b&lastEventId=0", nil))
		sse := e.openSSE("session=a&session=b", "0")
		var got []line
		for completes := 0; completes < 2; {
			l := r.next()
			if l.Type == "replay_complete" {
				completes++
			}
			if l.Op == "" {
				got = append(got, l)
			}
		}
		if err := e.session("a").Signal("changed", "doc/1"); err != nil {
			t.Fatal(err)
		}
		got = append(got, frameLines(r.until(func(l line) bool { return l.Type == "changed" }))...)

		// Across sessions the order is the stream's: compare per session.
		want := map[string][]string{}
		for range got {
			ev := sse.next()
			s := decodeData(t, ev.data)
			want[s] = append(want[s], ev.data)
		}
		have := map[string][]string{}
		for _, l := range got {
			have[l.Session] = append(have[l.Session], l.raw)
		}
		for _, s := range []string{"a", "b"} {
			if !slices.Equal(have[s], want[s]) {
				t.Errorf("session %s: WebSocket lines\n%q\nSSE data lines\n%q", s, trim(have[s]), trim(want[s]))
			}
		}
		// a: 3 events (one big), replay_complete, the signal; b: 1 event,
		// replay_complete.
		if len(have["a"]) != 5 || len(have["b"]) != 2 {
			t.Errorf("%d and %d lines, want 5 and 2", len(have["a"]), len(have["b"]))
		}
	})
}

func decodeData(t *testing.T, data string) string { return decode(t, data).Session }

// trim shortens long lines for a failure's message.
func trim(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l[:min(len(l), 200)]
	}
	return out
}

// TestSeveralEnvelopesInOneMessage: a batch is one message: the replay of
// several events, its replay_complete, then the cursor as the last line.
func TestSeveralEnvelopesInOneMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		e.session("a")
		for i := range 5 {
			e.publish("a", "note", i)
		}
		c := e.mustDial("session=a&lastEventId=0", nil)
		readMsg(t, c) // the greeting
		lines := readMsg(t, c)
		if len(lines) != 7 {
			t.Fatalf("message of %d lines, want 5 events, replay_complete and the cursor: %q", len(lines), lines)
		}
		for i, raw := range lines[:5] {
			if l := decode(t, raw); l.Session != "a" || l.ID != uint64(i+1) || l.Type != "note" {
				t.Errorf("line %d: %s", i, raw)
			}
		}
		if l := decode(t, lines[5]); l.Type != "replay_complete" {
			t.Errorf("line 5: %s", lines[5])
		}
		if l := decode(t, lines[6]); l.Op != "cursor" {
			t.Errorf("last line: %s", lines[6])
		}
	})
}

// ids returns the event ids of lines per session.
func ids(lines []line) map[string][]uint64 {
	out := map[string][]uint64{}
	for _, l := range lines {
		if l.ID != 0 {
			out[l.Session] = append(out[l.Session], l.ID)
		}
	}
	return out
}

// TestOneCursorBothWays: a WebSocket client's cursor resumes the SSE
// multiplexed route exactly (no loss, no duplicate), and the SSE route's
// id: line resumes the WebSocket exactly.
func TestOneCursorBothWays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		e.session("a")
		e.session("b")

		// WebSocket, then SSE.
		c := e.mustDial("session=a&session=b", nil)
		r := newReader(t, c)
		r.next() // the greeting
		e.publish("a", "n", 1)
		e.publish("b", "n", 1)
		e.publish("a", "n", 2)
		var seen []line
		cursor := ""
		for len(ids(seen)["a"]) < 2 || len(ids(seen)["b"]) < 1 {
			msg := r.until(isCursor)
			seen = append(seen, msg...)
			cursor = msg[len(msg)-1].Cursor
		}
		_ = c.CloseNow()
		e.publish("b", "n", 2)
		e.publish("a", "n", 3)
		e.publish("b", "n", 3)
		sse := e.openSSE("session=a&session=b", cursor)
		got := map[string][]uint64{}
		completes := 0
		lastID := ""
		for completes < 2 || len(got["a"]) < 1 || len(got["b"]) < 2 {
			ev := sse.next()
			l := decode(t, ev.data)
			switch {
			case l.Type == "replay_complete":
				completes++
			case l.ID != 0:
				got[l.Session] = append(got[l.Session], l.ID)
				lastID = ev.id
			default:
				t.Fatalf("SSE frame %s", ev.data)
			}
		}
		if !slices.Equal(got["a"], []uint64{3}) || !slices.Equal(got["b"], []uint64{2, 3}) {
			t.Fatalf("SSE resumed with the WebSocket's cursor got %v, want a:[3] b:[2 3]", got)
		}
		sse.close()

		// SSE, then WebSocket.
		e.publish("a", "n", 4)
		e.publish("b", "n", 4)
		// As the Last-Event-ID header, which a Go client can send (a browser
		// sends lastEventId=, as the eviction test does).
		r2 := newReader(t, e.mustDial("session=b&session=a", &ws.DialOptions{HTTPHeader: http.Header{"Last-Event-ID": {lastID}}}))
		r2.next() // the greeting
		var resumed []line
		for {
			resumed = append(resumed, r2.until(isCursor)...)
			n := 0
			for _, l := range resumed {
				if l.Type == "replay_complete" {
					n++
				}
			}
			if n == 2 {
				break
			}
		}
		if got := ids(resumed); !slices.Equal(got["a"], []uint64{4}) || !slices.Equal(got["b"], []uint64{4}) {
			t.Fatalf("the WebSocket resumed with the SSE id got %v, want a:[4] b:[4]", got)
		}
	})
}

// TestEpochReset: a cursor entry of another bus of the session (deleted
// and created again) is epoch_reset for that session, then the new bus's
// ring from its start (SPEC 4.1), then live.
func TestEpochReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		e.session("a")
		e.publish("a", "n", 1)
		c := e.mustDial("session=a", nil)
		cursor := decode(t, readMsg(t, c)[0]).Cursor
		_ = c.CloseNow()
		e.hub.Delete("a")
		e.session("a")
		e.publish("a", "n", 1)

		r := newReader(t, e.mustDial("session=a&lastEventId="+cursor, nil))
		r.next() // the greeting
		l := r.next()
		if l.Type != "state_resync_required" || !strings.Contains(string(l.Data), `"reason":"epoch_reset"`) {
			t.Fatalf("first frame %s, want state_resync_required epoch_reset", l.raw)
		}
		replay := frameLines(r.until(func(l line) bool { return l.Type == "replay_complete" }))
		if len(replay) != 2 || replay[0].ID != 1 {
			t.Fatalf("then %v, want the new bus's event 1 and replay_complete", replay)
		}
		e.publish("a", "n", 2)
		if l := r.until(func(l line) bool { return l.ID != 0 }); l[len(l)-1].ID != 2 {
			t.Fatalf("then %s, want the live event 2", l[len(l)-1].raw)
		}
	})
}

// terminal reads up to the stream's last frame line and returns it.
func (r *reader) terminal() line {
	r.t.Helper()
	got := r.until(func(l line) bool { return l.Type == "stream_error" || l.Type == "client_evicted" })
	return got[len(got)-1]
}

func errorKind(l line) string {
	var d struct{ ErrorKind string }
	_ = json.Unmarshal(l.Data, &d)
	return d.ErrorKind
}

// TestEnds: a stream that ends by itself writes its last frame, then
// closes with the code of SPEC 6.10.
func TestEnds(t *testing.T) {
	cases := []struct {
		name   string
		grant  eventbus.Grant
		end    func(e *env)
		kind   string
		code   ws.StatusCode
		reason string
	}{
		{"revoked", eventbus.Grant{Subject: "alice"}, func(e *env) {
			if n := e.streams.Revoke("alice"); n != 1 {
				e.t.Errorf("Revoke ended %d streams", n)
			}
		}, "revoked", websocket.StatusRevoked, "revoked"},
		{"lifetime", eventbus.Grant{Expires: time.Now().Add(time.Hour)}, func(e *env) {
			time.Sleep(time.Hour)
		}, "reauthenticate", websocket.StatusReauthenticate, "reauthenticate"},
		{"shutdown", eventbus.Grant{}, func(e *env) {
			_ = e.session("a").CloseForShutdown(2 * time.Second)
		}, "shutdown", ws.StatusGoingAway, "shutdown"},
		{"closed", eventbus.Grant{}, func(e *env) {
			e.hub.Delete("a")
		}, "closed", ws.StatusNormalClosure, "closed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				grant := tc.grant
				if !grant.Expires.IsZero() {
					grant.Expires = time.Now().Add(time.Hour) // the bubble's clock
				}
				e := newEnv(t, func(e *env) {
					e.streams.Authorize = func(*http.Request, string, *eventbus.EventBus) (eventbus.Grant, error) {
						return grant, nil
					}
				})
				e.session("a")
				r := newReader(t, e.mustDial("session=a", nil))
				r.next()
				e.publish("a", "n", 1)
				r.until(isCursor)
				tc.end(e)
				l := r.terminal()
				if l.Type != "stream_error" || errorKind(l) != tc.kind || l.Session != "a" {
					t.Fatalf("last frame %s, want stream_error %s", l.raw, tc.kind)
				}
				if code := r.end(); code != tc.code {
					t.Fatalf("closed with %d (%v), want %d", code, r.err, tc.code)
				}
				if !strings.Contains(r.err.Error(), `"`+tc.reason+`"`) {
					t.Errorf("close %v, want reason %q", r.err, tc.reason)
				}
			})
		})
	}
}

// TestEviction: a client that stops reading is evicted by its session's
// queue cap (not by the write timeout, which is long here): once it reads
// again it gets client_evicted, then 4429, and resumes with its cursor.
func TestEviction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		e.session("a")
		c := e.mustDial("session=a&maxQueued=16", nil)
		// The client reads nothing yet: the greeting's write waits on the
		// pipe, and the session's queue overflows.
		for i := range 100 {
			e.publish("a", "n", i)
		}
		synctest.Wait()
		r := newReader(t, c)
		var cursor string
		got := r.until(func(l line) bool {
			if isCursor(l) {
				cursor = l.Cursor
			}
			return l.Type == "client_evicted"
		})
		// The evicted message ends with the cursor after its events.
		if l := r.next(); isCursor(l) {
			cursor = l.Cursor
		} else {
			t.Fatalf("after client_evicted: %s", l.raw)
		}
		if code := r.end(); code != websocket.StatusEvicted {
			t.Fatalf("closed with %d (%v), want 4429", code, r.err)
		}
		// Resume: what was missed, exactly.
		r2 := newReader(t, e.mustDial("session=a&lastEventId="+cursor, nil))
		resumed := ids(r2.until(func(l line) bool { return l.Type == "replay_complete" }))["a"]
		delivered := ids(got)["a"]
		if len(delivered)+len(resumed) != 100 || resumed[0] != uint64(len(delivered))+1 {
			t.Fatalf("delivered %d, resumed %v", len(delivered), resumed)
		}
	})
}

// TestClientThatNeverReads: a client that never reads holds at most its
// session's caps (its subscription is evicted), its write is cut at the
// write timeout (no close frame, not even the greeting got through), and
// another client of the session gets every event meanwhile.
func TestClientThatNeverReads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logRecorder{}
		e := newEnv(t, func(e *env) {
			e.streams.WriteTimeout = 5 * time.Second
			e.streams.Logger = slog.New(logs)
		})
		bus := e.session("a")
		start := time.Now()
		stuck := e.mustDial("session=a", nil)
		good := newReader(t, e.mustDial("session=a", nil))
		good.next()
		big := strings.Repeat("y", 4096)
		for i := range 1000 {
			if _, err := e.hub.Publish("a", eventbus.Event{Type: "n", Data: big}); err != nil {
				t.Fatal(i, err)
			}
			if i%100 == 0 {
				synctest.Wait()
			}
		}
		n := 0
		for n < 1000 {
			if l := good.next(); l.ID != 0 {
				n++
			}
		}
		// 4 MB published: the stuck client's queue reached its cap and was
		// evicted; the good one's never was.
		if ev := bus.Stats().Evictions; ev.QueueBytesOverflow+ev.QueueOverflow != 1 {
			t.Errorf("evictions %+v, want the stuck client's alone", ev)
		}
		time.Sleep(time.Until(start.Add(6 * time.Second)))
		at, ok := logs.find("websocket: a write blocked past the write timeout, closed")
		if !ok || at.Sub(start) != 5*time.Second {
			t.Errorf("the blocked write was cut at %v (logged: %v), want the write timeout, 5s", at.Sub(start), ok)
		}
		if n := bus.SubscriberCount(); n != 1 {
			t.Errorf("%d subscribers, want the good client's alone", n)
		}
		lines, err := tryReadMsg(stuck)
		if err == nil || ws.CloseStatus(err) != -1 {
			t.Errorf("the stuck client read %q, %v; want the connection gone without a close frame", lines, err)
		}
	})
}

// TestBlockedBatchIsCounted: the frames of a batch whose write blocked
// past the write timeout count as dropped, reason blocked (not delivered,
// not cancelled), though the reader may see the connection end first.
func TestBlockedBatchIsCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(e *env) { e.streams.WriteTimeout = 5 * time.Second })
		bus := e.session("a")
		c := e.mustDial("session=a", nil)
		readMsg(t, c) // the greeting; then the client stops reading
		for i := range 3 {
			e.publish("a", "n", i)
		}
		time.Sleep(6 * time.Second)
		st := bus.Stats()
		if st.Dropped.Blocked == 0 || st.Dropped.Blocked+st.Dropped.Cancelled != 3 || st.FramesDelivered != 0 || st.Subscribers != 0 {
			t.Fatalf("stats %+v: want the blocked batch's frames dropped as blocked, the rest cancelled", st)
		}
	})
}

// logRecorder is a slog.Handler that keeps the records' messages and
// times.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logRecorder) WithGroup(string) slog.Handler            { return l }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r)
	return nil
}

// find returns the time of the first record with message msg.
func (l *logRecorder) find(msg string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.records {
		if r.Message == msg {
			return r.Time, true
		}
	}
	return time.Time{}, false
}

// TestPingWithoutPong: after Heartbeat without a write the server pings;
// a client that reads but does not answer is cut WriteTimeout later, without
// a close frame. A client that answers stays, and its own pings are
// answered.
func TestPingWithoutPong(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(e *env) {
			e.streams.Heartbeat = 10 * time.Second
			e.streams.WriteTimeout = 5 * time.Second
		})
		e.session("a")
		var pings atomic.Int32
		mute := newReader(t, e.mustDial("session=a", &ws.DialOptions{
			OnPingReceived: func(context.Context, []byte) bool { pings.Add(1); return false },
		}))
		polite := e.mustDial("session=a", nil)
		pr := newReader(t, polite)
		mute.next()
		pr.next()
		start := time.Now()
		if code := mute.end(); code != -1 {
			t.Fatalf("closed with %d (%v), want no close frame", code, mute.err)
		}
		if d := time.Since(start); d < 15*time.Second || d > 16*time.Second || pings.Load() != 1 {
			t.Errorf("cut after %v and %d pings, want 15s (Heartbeat, then WriteTimeout) and 1", d, pings.Load())
		}
		// The polite client answered every ping: it is still served.
		time.Sleep(time.Minute)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := polite.Ping(ctx); err != nil {
			t.Fatalf("the server did not answer a ping: %v", err)
		}
		e.publish("a", "n", 1)
		if l := pr.until(func(l line) bool { return l.ID != 0 }); l[len(l)-1].ID != 1 {
			t.Fatal(raws(l))
		}
	})
}

// countingConn counts the bytes a client reads.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// TestCompression: permessage-deflate is negotiated only when
// CompressionThreshold is positive, and then compresses the messages at
// least that long, a frame of more than 64 KiB included.
func TestCompression(t *testing.T) {
	for _, threshold := range []int{0, 512} {
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t, func(e *env) { e.ws.CompressionThreshold = threshold })
			e.session("a")
			var read atomic.Int64
			tr := e.client.Transport.(*http.Transport)
			dial := tr.DialContext
			client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := dial(ctx, network, addr)
				return countingConn{c, &read}, err
			}}}
			t.Cleanup(client.Transport.(*http.Transport).CloseIdleConnections)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c, resp, err := ws.Dial(ctx, "ws://eventbus.test/ws?session=a", &ws.DialOptions{HTTPClient: client, CompressionMode: ws.CompressionNoContextTakeover})
			if err != nil {
				t.Fatal(err)
			}
			c.SetReadLimit(-1)
			r := newReader(t, c)
			ext := resp.Header.Get("Sec-WebSocket-Extensions")
			if (ext != "") != (threshold > 0) || (threshold > 0 && !strings.Contains(ext, "permessage-deflate")) {
				t.Errorf("threshold %d: Sec-WebSocket-Extensions %q", threshold, ext)
			}
			r.next()
			before := read.Load()
			data := strings.Repeat("compressible ", 10000) // 130 KB
			if _, err := e.hub.Publish("a", eventbus.Event{Type: "n", Data: data}); err != nil {
				t.Fatal(err)
			}
			l := r.until(func(l line) bool { return l.ID != 0 })
			if !strings.Contains(string(l[len(l)-1].Data), "compressible compressible") {
				t.Fatal("the event's data did not arrive")
			}
			got := read.Load() - before
			if compressed := got < int64(len(data))/10; compressed != (threshold > 0) {
				t.Errorf("threshold %d: %d bytes on the wire for %d of data", threshold, got, len(data))
			}
		})
	}
}

// TestBudgetInterrupt: a Hub whose memory budget sheds a subscriber whose
// frames a blocked batch holds interrupts the stream's transport: the
// write fails at once (not at the write timeout, an hour here), and the
// connection is closed without a close frame.
func TestBudgetInterrupt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnvHub(t, eventbus.HubOptions{Bus: eventbus.Options{MaxEventBytes: 256 << 10}, MaxTotalBytes: 1 << 20},
			func(e *env) { e.streams.WriteTimeout = time.Hour })
		bus := e.session("a")
		stuck := e.mustDial("session=a", nil)
		readMsg(t, stuck) // the greeting; then the client stops reading
		start := time.Now()
		data := strings.Repeat("z", 100<<10)
		for i := 0; e.hub.Stats().BudgetShed == 0; i++ {
			if i == 100 {
				t.Fatal("the budget shed nobody")
			}
			if _, err := e.hub.Publish("a", eventbus.Event{Type: "n", Data: data}); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
		}
		synctest.Wait()
		// The server closed the connection at once, the client still not
		// reading.
		if n, closed := bus.SubscriberCount(), e.l.closed.Load(); n != 0 || closed != 1 || time.Since(start) != 0 {
			t.Fatalf("%d subscribers, %d connections closed %v after the budget shed the stream", n, closed, time.Since(start))
		}
		var err error
		for err == nil {
			_, err = tryReadMsg(stuck)
		}
		if code := ws.CloseStatus(err); code != -1 {
			t.Errorf("a close frame %d after an interrupted write", code)
		}
	})
}

// StreamContext: ServeHTTP returns once the connection is upgraded (the
// request's context, which net/http then cancels, does not end the
// stream); cancelling the context StreamContext gave ends the stream as a
// daemon cutting it (/disconnect) does: the connection closes without a
// close frame, the subscriptions end, and done is called once, after.
// A refused handshake calls done too.
func TestStreamContextEndsTheStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			cut     context.CancelFunc
			dones   atomic.Int32
			opening atomic.Int32
		)
		e := newEnv(t, func(e *env) {
			e.ws.StreamContext = func(r *http.Request) (context.Context, func()) {
				opening.Add(1)
				ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
				cut = cancel
				return ctx, func() { dones.Add(1); cancel() }
			}
		})
		bus := e.session("a")
		c := e.mustDial("session=a", nil)
		readMsg(t, c) // the greeting
		synctest.Wait()
		if n := bus.SubscriberCount(); n != 1 || dones.Load() != 0 || e.wsReturned.Load() != 1 {
			t.Fatalf("%d subscribers, %d dones, %d ServeHTTP returned; want 1, 0 and 1 (the stream outlives its request)", n, dones.Load(), e.wsReturned.Load())
		}
		// The stream outlives its request: net/http cancelled the
		// request's context when ServeHTTP returned, and it is served.
		e.publish("a", "n", 1)
		if l := strings.Join(readMsg(t, c), "\n"); !strings.Contains(l, `"id":1`) {
			t.Fatalf("got %s", l)
		}
		cut()
		synctest.Wait()
		if _, err := tryReadMsg(c); err == nil {
			t.Fatal("the connection is still open")
		}
		if n := bus.SubscriberCount(); n != 0 || dones.Load() != 1 {
			t.Fatalf("%d subscribers, %d dones after the cut", n, dones.Load())
		}
		// A handshake refused after StreamContext (an unknown session).
		if _, resp, err := e.dial("session=nope", nil); err == nil || resp == nil || resp.StatusCode != http.StatusNotFound {
			t.Fatalf("unknown session: %v %v", resp, err)
		}
		if dones.Load() != opening.Load() {
			t.Fatalf("%d StreamContext calls, %d dones", opening.Load(), dones.Load())
		}
	})
}
