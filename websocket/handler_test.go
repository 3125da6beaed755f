package websocket_test

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"

	ws "github.com/coder/websocket"
	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/websocket"
)

// TestHandshakeRefusals: each check of SPEC 6.10's handshake, with its
// status and JSON code, in order (the method before the origin, the origin
// before the handshake, the handshake before the lookup).
func TestHandshakeRefusals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(e *env) {
			e.streams.CORS = &eventbus.CORS{Origins: []string{"https://app.example"}}
			e.mux.MaxStreamSessions = 2
		})
		e.session("a")
		evil := map[string]string{"Origin": "https://evil.example"}
		cases := []struct {
			name   string
			method string
			query  string
			plain  bool
			extra  map[string]string
			status int
			code   string
		}{
			{"POST", http.MethodPost, "session=a", false, nil, 405, "method_not_allowed"},
			{"HEAD", http.MethodHead, "session=a", false, nil, 405, ""},
			{"method before origin", http.MethodPost, "session=a", true, evil, 405, "method_not_allowed"},
			{"cross-origin", http.MethodGet, "session=a", false, evil, 403, "origin_not_allowed"},
			{"origin before handshake", http.MethodGet, "session=nope", true, evil, 403, "origin_not_allowed"},
			{"no upgrade", http.MethodGet, "session=a", true, nil, 426, "upgrade_required"},
			{"handshake before lookup", http.MethodGet, "session=nope", true, nil, 426, "upgrade_required"},
			{"version", http.MethodGet, "session=a", false, map[string]string{"Sec-WebSocket-Version": "8"}, 426, "upgrade_required"},
			{"unknown session", http.MethodGet, "session=a&session=nope", false, nil, 404, "session_not_found"},
			{"no session", http.MethodGet, "", false, nil, 400, "invalid_sessions"},
			{"too many sessions", http.MethodGet, "session=a&session=b&session=c", false, nil, 400, "invalid_sessions"},
			{"bad maxQueued", http.MethodGet, "session=a&maxQueued=1", false, nil, 400, "invalid_max_queued"},
			{"no origin", http.MethodGet, "session=a", false, nil, 101, ""},
			{"same host", http.MethodGet, "session=a", false, map[string]string{"Origin": "http://eventbus.test"}, 101, ""},
			{"allowed by CORS", http.MethodGet, "session=a", false, map[string]string{"Origin": "https://app.example"}, 101, ""},
		}
		for _, tc := range cases {
			status, code, hd := e.handshake(tc.method, tc.query, tc.plain, tc.extra)
			if status != tc.status || (tc.method != http.MethodHead && code != tc.code) {
				t.Errorf("%s: %d %q, want %d %q", tc.name, status, code, tc.status, tc.code)
			}
			if status == 405 && hd.Get("Allow") != "GET" {
				t.Errorf("%s: Allow %q", tc.name, hd.Get("Allow"))
			}
			if status == 426 && (hd.Get("Upgrade") != "websocket" || hd.Get("Sec-WebSocket-Version") != "13") {
				t.Errorf("%s: headers %v", tc.name, hd)
			}
			if status == 101 && hd.Get("Access-Control-Allow-Origin") != "" {
				t.Errorf("%s: a CORS header on the upgrade", tc.name)
			}
		}
		// Every refused handshake left no subscription behind, and the
		// accepted ones end when their clients leave.
		synctest.Wait()
		if n := e.session("a").SubscriberCount(); n != 0 {
			t.Errorf("%d subscribers left", n)
		}
	})
}

// TestUnknownSessionOverDial: coder's client gets the 404 as the failed
// handshake's response.
func TestUnknownSessionOverDial(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		_, resp, err := e.dial("session=nope", nil)
		if err == nil || resp == nil || resp.StatusCode != http.StatusNotFound {
			t.Fatalf("dial: %v, %v", resp, err)
		}
	})
}

// failingHijacker is a ResponseWriter whose connection cannot be taken
// over after all: the upgrade fails after the stream was opened.
type failingHijacker struct{ *httptest.ResponseRecorder }

func (failingHijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, errors.New("no connection here")
}

// TestUpgradeFailureClosesTheStream: when Accept fails after OpenStream
// subscribed, the stream is closed; a writer that cannot be hijacked at all
// is refused before any lookup.
func TestUpgradeFailureClosesTheStream(t *testing.T) {
	bus, err := eventbus.New(eventbus.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer bus.Close()
	looked, contexts, dones := 0, 0, 0
	h := &websocket.Handler{Mux: &eventbus.MuxHandler{Handler: &eventbus.Handler{
		Logger: slog.New(slog.DiscardHandler),
		Lookup: func(r *http.Request, id string) (*eventbus.EventBus, error) {
			looked++
			if id == "boom" {
				panic("the embedder's Lookup")
			}
			return bus, nil
		},
	}}, StreamContext: func(r *http.Request) (context.Context, func()) {
		contexts++
		return context.WithoutCancel(r.Context()), func() { dones++ }
	}}
	req := func() *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/ws?session=a", nil)
		r.Header.Set("Connection", "Upgrade")
		r.Header.Set("Upgrade", "websocket")
		r.Header.Set("Sec-WebSocket-Version", "13")
		r.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		return r
	}

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req())
	if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), `"code":"streaming_unsupported"`) || looked != 0 {
		t.Errorf("a writer without Hijack: %d %s, %d lookups", rec.Code, rec.Body, looked)
	}

	h.ServeHTTP(failingHijacker{httptest.NewRecorder()}, req())
	if looked != 1 {
		t.Errorf("%d lookups, want 1", looked)
	}
	if n := bus.SubscriberCount(); n != 0 {
		t.Errorf("%d subscribers after a failed upgrade, want 0", n)
	}
	// A panic in the embedder's Lookup (net/http recovers it) still calls
	// StreamContext's func: a daemon's tracking does not leak the stream.
	func() {
		defer func() { _ = recover() }()
		r := req()
		r.URL.RawQuery = "session=boom"
		h.ServeHTTP(failingHijacker{httptest.NewRecorder()}, r)
	}()
	if contexts != 2 || dones != 2 {
		t.Errorf("StreamContext called %d times, its func %d times; want each once per opening that reached it (2)", contexts, dones)
	}
}

// TestGreeting: the first message is the stream's cursor alone, naming
// every session; the subprotocol is eventbus.v1 when offered, none
// otherwise.
func TestGreeting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		e.session("a")
		e.session("b")
		c := e.mustDial("session=a&session=b", &ws.DialOptions{Subprotocols: []string{"other", "eventbus.v1"}})
		if got := c.Subprotocol(); got != websocket.Subprotocol {
			t.Errorf("subprotocol %q, want %q", got, websocket.Subprotocol)
		}
		lines := readMsg(t, c)
		if len(lines) != 1 {
			t.Fatalf("greeting %q, want one line", lines)
		}
		if l := decode(t, lines[0]); l.Op != "cursor" || len(l.Cursor) != 2+2*24 || !strings.HasPrefix(l.Cursor, "m1") {
			t.Fatalf("greeting %s", l.raw)
		}
		_ = c.Close(ws.StatusNormalClosure, "")

		c2 := e.mustDial("session=a", &ws.DialOptions{Subprotocols: []string{"other"}})
		if got := c2.Subprotocol(); got != "" {
			t.Errorf("subprotocol %q, want none", got)
		}
		_ = c2.Close(ws.StatusNormalClosure, "")
		synctest.Wait()
		if n := e.session("a").SubscriberCount(); n != 0 {
			t.Errorf("%d subscribers after the clients closed", n)
		}
	})
}

// TestCloseCodes: the close frame of each way a stream ends (SPEC 6.10),
// none when the client left or a write failed.
func TestCloseCodes(t *testing.T) {
	want := map[eventbus.StreamEnd]struct {
		code   ws.StatusCode
		reason string
	}{
		eventbus.StreamClosed:   {1000, "closed"},
		eventbus.StreamShutdown: {1001, "shutdown"},
		eventbus.StreamExpired:  {4401, "reauthenticate"},
		eventbus.StreamRevoked:  {4403, "revoked"},
		eventbus.StreamEvicted:  {4429, "evicted"},
		eventbus.StreamPanicked: {1011, "internal"},
	}
	for end := eventbus.StreamGone; end <= eventbus.StreamPanicked; end++ {
		code, reason, ok := websocket.CloseCode(end)
		w, closes := want[end]
		if ok != closes || code != w.code || reason != w.reason {
			t.Errorf("%s: %d %q %v, want %d %q %v", end, code, reason, ok, w.code, w.reason, closes)
		}
	}
}

// TestPanicInAdd: a Lookup that panics while a client adds a session ends
// that connection with 1011 internal; the daemon and its other clients go
// on.
func TestPanicInAdd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(env *env) {
			lookup := env.streams.Lookup
			env.streams.Lookup = func(r *http.Request, id string) (*eventbus.EventBus, error) {
				if id == "boom" {
					panic("a bug in the embedder's Lookup")
				}
				return lookup(r, id)
			}
		})
		e.session("a")
		c := e.mustDial("session=a", nil)
		r := newReader(t, c)
		r.next()
		other := newReader(t, e.mustDial("session=a", nil))
		other.next()
		send(t, c, `{"op":"add","session":"boom"}`)
		if code := r.end(); code != ws.StatusInternalError {
			t.Fatalf("closed with %d (%v), want 1011", code, r.err)
		}
		e.publish("a", "n", 1)
		if l := other.until(func(l line) bool { return l.ID != 0 }); l[len(l)-1].ID != 1 {
			t.Fatal(raws(l))
		}
	})
}
