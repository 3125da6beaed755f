package eventbus

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// fakePublisher is a Publisher that is not a Hub: it records its calls and
// answers err when set, else ids from 1 and the epoch "fake".
type fakePublisher struct {
	mu    sync.Mutex
	err   error
	calls []fakeCall
	keys  map[string]uint64
	next  uint64
	block chan struct{} // when set, each call waits for it
}

type fakeCall struct {
	session, key string
	keyed        bool
	event        Event
	ctx          context.Context
}

func (f *fakePublisher) Publish(ctx context.Context, session string, e Event) (uint64, string, error) {
	id, epoch, _, err := f.publish(ctx, session, "", false, e)
	return id, epoch, err
}

func (f *fakePublisher) PublishIdempotent(ctx context.Context, session, key string, e Event) (uint64, string, bool, error) {
	return f.publish(ctx, session, key, true, e)
}

func (f *fakePublisher) publish(ctx context.Context, session, key string, keyed bool, e Event) (uint64, string, bool, error) {
	if f.block != nil {
		<-f.block
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fakeCall{session, key, keyed, e, ctx})
	if f.err != nil {
		return 0, "", false, f.err
	}
	if id, ok := f.keys[key]; keyed && ok {
		return id, "fake", true, nil
	}
	f.next++
	if keyed {
		if f.keys == nil {
			f.keys = map[string]uint64{}
		}
		f.keys[key] = f.next
	}
	return f.next, "fake", false, nil
}

func (f *fakePublisher) set(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

func (f *fakePublisher) last() fakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[len(f.calls)-1]
}

// writeRoutes serves the write routes on p (a Publisher, Deleter and
// Signaler when it is one) as a daemon mounts them.
func writeRoutes(ph *PublishHandler) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("POST /session/{id}/events", ph)
	if d, ok := ph.Publisher.(Deleter); ok {
		mux.Handle("DELETE /session/{id}", &DeleteHandler{Deleter: d, Logger: ph.Logger})
	}
	if s, ok := ph.Publisher.(Signaler); ok {
		mux.Handle("POST /session/{id}/signal", &SignalHandler{Signaler: s, Logger: ph.Logger})
	}
	return mux
}

// post sends body to h (through a ServeMux, for the path value) with the
// Idempotency-Key values keys and returns the recorder.
func post(h http.Handler, path, body string, keys ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	for _, k := range keys {
		r.Header.Add(IdempotencyKeyHeader, k)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// answer decodes a JSON answer.
func answer(t *testing.T, w *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	var v map[string]any
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &v), "body %q", w.Body)
	return v
}

var discard = slog.New(slog.DiscardHandler)

// Every row of the table, through the handler: a Publisher that is not a
// Hub returns each error (plain and keyed), and the answer is the table's.
func TestPublishHandlerAnswersTheTable(t *testing.T) {
	fp := &fakePublisher{}
	h := writeRoutes(&PublishHandler{Publisher: fp, Logger: discard})
	for _, row := range errorTable() {
		if row.err == nil {
			continue // a Publisher's error is never nil
		}
		for _, keys := range [][]string{nil, {"k-" + row.name}} {
			t.Run(fmt.Sprintf("%s/keyed=%v", row.name, keys != nil), func(t *testing.T) {
				fp.set(row.err)
				w := post(h, "/session/s/events", `{"type":"t"}`, keys...)
				checkAnswer(t, row, w)
				require.Equal(t, keys != nil, fp.last().keyed)
			})
		}
	}
}

// A Publisher that is not a Hub gets the session, the key, the decoded
// event and the request's context; its answer is {"id","epoch"}, with
// "duplicate":true for a retry.
func TestPublishHandlerOnAnotherPublisher(t *testing.T) {
	fp := &fakePublisher{}
	ph := &PublishHandler{Publisher: fp, Logger: discard}
	h := writeRoutes(ph)
	type ctxKey struct{}
	r := httptest.NewRequest(http.MethodPost, "/session/caf%C3%A9/events",
		strings.NewReader(`{"Type":"note","DATA":{"a": [1, 2]},"originatorClientId":"c1"}`))
	r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, "mine"))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	require.Equal(t, "{\"id\":1,\"epoch\":\"fake\"}\n", w.Body.String())
	require.Equal(t, "application/json", w.Header().Get("Content-Type"))
	require.Equal(t, "no-store", w.Header().Get("Cache-Control"))
	c := fp.last()
	require.Equal(t, "caf\u00e9", c.session)
	require.False(t, c.keyed)
	require.Equal(t, Event{Type: "note", Data: json.RawMessage(`{"a": [1, 2]}`), OriginatorClientID: "c1"}, c.event)
	require.Equal(t, "mine", c.ctx.Value(ctxKey{}))

	// Absent data stays absent; null is kept.
	post(h, "/session/s/events", `{"type":"a"}`)
	require.Nil(t, fp.last().event.Data)
	post(h, "/session/s/events", `{"type":"a","data":null}`)
	require.Equal(t, json.RawMessage("null"), fp.last().event.Data)

	w = post(h, "/session/s/events", `{"type":"a"}`, "k1")
	require.Equal(t, "{\"id\":4,\"epoch\":\"fake\"}\n", w.Body.String())
	require.Equal(t, fakeCall{"s", "k1", true, Event{Type: "a"}, nil}, func() fakeCall { c := fp.last(); c.ctx = nil; return c }())
	w = post(h, "/session/s/events", `{"type":"a"}`, "k1")
	require.Equal(t, "{\"id\":4,\"epoch\":\"fake\",\"duplicate\":true}\n", w.Body.String())

	// The default body bound of a Publisher that is not a Hub:
	// DefaultMaxEventBytes and 1 MiB.
	require.Equal(t, int64(DefaultMaxEventBytes+PublishBodySlack), ph.limits().max)
	require.Equal(t, 4*ph.limits().max, ph.limits().budget)
	require.Equal(t, DefaultBodyTimeout, ph.limits().timeout)
}

// The body's rules: one JSON object with the known keys, each once,
// nothing after it; the refusals are 400 invalid_body, and nothing is
// published.
func TestPublishHandlerRefusesBadBodies(t *testing.T) {
	fp := &fakePublisher{}
	h := writeRoutes(&PublishHandler{Publisher: fp, MaxBodyBytes: 64, Logger: discard})
	for _, c := range []struct{ body, msg string }{
		{``, "empty body"},
		{` `, "empty body"},
		{`not json`, "invalid character"},
		{`[1]`, "not an object"},
		{`"a"`, "not an object"},
		{`{"type":"a"`, "unexpected end"},
		{`{"type":"a"} {"type":"b"}`, "more than one JSON value"},
		{`{"type":"a","id":7}`, `unknown field "id"`},
		{`{"type":"a","Type":"b"}`, "given twice"},
		{`{"type":1}`, `field "type"`},
		{`{"type":"a","originatorClientId":7}`, `field "originatorClientId"`},
		{`{"type":"a","data":{x}}`, "invalid character"},
	} {
		for _, chunked := range []bool{false, true} {
			r := httptest.NewRequest(http.MethodPost, "/session/s/events", strings.NewReader(c.body))
			if chunked {
				r.ContentLength = -1
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			v := answer(t, w)
			require.Equal(t, http.StatusBadRequest, w.Code, "%q", c.body)
			require.Equal(t, "invalid_body", v["code"], "%q", c.body)
			require.Contains(t, v["error"], "malformed body: ")
			require.Contains(t, v["error"], c.msg, "%q", c.body)
		}
	}
	require.Empty(t, fp.calls, "a refused body was published")
	// Past MaxBodyBytes: 413, with and without a Content-Length.
	big := `{"type":"` + strings.Repeat("x", 100) + `"}`
	for _, chunked := range []bool{false, true} {
		r := httptest.NewRequest(http.MethodPost, "/session/s/events", strings.NewReader(big))
		if chunked {
			r.ContentLength = -1
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		require.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
		require.Equal(t, "body_too_large", answer(t, w)["code"])
		require.Contains(t, answer(t, w)["error"], "larger than 64 bytes")
	}
	require.Empty(t, fp.calls)
}

// The refusals before the body, in their order: the method, the session
// id, the key; none reaches the Publisher.
func TestPublishHandlerRefusesBeforeTheBody(t *testing.T) {
	fp := &fakePublisher{}
	ph := &PublishHandler{Publisher: fp, Logger: discard}
	h := writeRoutes(ph)
	w := httptest.NewRecorder()
	ph.ServeHTTP(w, httptest.NewRequest(http.MethodPut, "/session/s/events", nil))
	require.Equal(t, http.StatusMethodNotAllowed, w.Code)
	require.Equal(t, "POST", w.Header().Get("Allow"))
	require.Equal(t, "method_not_allowed", answer(t, w)["code"])

	long := strings.Repeat("s", MaxSessionIDBytes+1)
	for _, path := range []string{"/session/a%FF/events", "/session/" + long + "/events"} {
		w := post(h, path, `{"type":"a"}`, "k")
		require.Equal(t, http.StatusBadRequest, w.Code)
		require.Equal(t, "invalid_session_id", answer(t, w)["code"])
		require.True(t, strings.HasPrefix(answer(t, w)["error"].(string), "eventbus: invalid session id: "))
	}
	for _, keys := range [][]string{{""}, {"caf\u00e9"}, {strings.Repeat("k", MaxIdempotencyKeyBytes+1)}, {"a", "a"}, {"a", "b"}} {
		// A body that is not even JSON: the key is refused first.
		w := post(h, "/session/s/events", `not json`, keys...)
		require.Equal(t, http.StatusBadRequest, w.Code, "%q", keys)
		require.Equal(t, "invalid_idempotency_key", answer(t, w)["code"], "%q", keys)
	}
	require.Contains(t, answer(t, post(h, "/session/s/events", `{}`, "a", "b"))["error"], "sent 2 times")
	require.Empty(t, fp.calls)
}

// On a Hub: ids and epochs, the Hub's refusals (an invalid event, a full
// hub, a shut down one) as the table says, idempotency, and the default
// body bound taken from the hub's MaxEventBytes.
func TestPublishHandlerOnAHub(t *testing.T) {
	hub := newTestHub(t, HubOptions{Bus: Options{MaxEventBytes: 1024}, MaxSessions: 1, Logger: discard})
	pub := hub.Publisher()
	ph := &PublishHandler{Publisher: pub, Logger: discard}
	require.Equal(t, int64(1024+PublishBodySlack), ph.limits().max)
	h := writeRoutes(ph)

	w := post(h, "/session/s/events", `{"type":"chat","data":{"text":"hi"},"originatorClientId":""}`)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	v := answer(t, w)
	bus, ok := hub.Lookup("s")
	require.True(t, ok)
	require.Equal(t, map[string]any{"id": float64(1), "epoch": bus.Epoch()}, v)
	require.Regexp(t, regexp.MustCompile(`^[0-9a-f]{32}$`), v["epoch"])
	sub, err := bus.Subscribe(t.Context(), SubscribeOptions{Resume: true, LastEventID: 0})
	require.NoError(t, err)
	var f Frame
	for f = range sub.Events() {
		break
	}
	sub.Close()
	require.Equal(t, uint64(1), f.ID())
	require.Contains(t, string(f.JSON()), `"data":{"text":"hi"}`)
	require.NotContains(t, string(f.JSON()), "originatorClientId", "an empty originatorClientId was kept")

	for _, c := range []struct{ body, code string }{
		{`{"data":1}`, "invalid_event"},
		{`{"type":"a\nb"}`, "invalid_event"},
		{`{"type":"` + TypeStreamError + `"}`, "invalid_event"},
		{`{"type":"blob","data":"` + strings.Repeat("x", 2000) + `"}`, "event_too_large"},
	} {
		for _, keys := range [][]string{nil, {"k-bad"}} {
			w := post(h, "/session/s/events", c.body, keys...)
			require.Equal(t, c.code, answer(t, w)["code"], "%s %q", c.body, keys)
		}
	}
	// Whitespace that compaction removes does not count toward the event.
	w = post(h, "/session/s/events", `{"type":"blob","data":[`+strings.Repeat(" ", 4000)+`1]}`)
	require.Equal(t, float64(2), answer(t, w)["id"])

	// Idempotency: a retry answers the first id, another event under the
	// key is 422.
	first := answer(t, post(h, "/session/s/events", `{"type":"order","data":{"n":1}}`, "order-1"))
	again := answer(t, post(h, "/session/s/events", `{"type":"order","data":{ "n" : 1 }}`, "order-1"))
	require.Equal(t, first["id"], again["id"])
	require.Equal(t, true, again["duplicate"])
	require.Nil(t, first["duplicate"])
	w = post(h, "/session/s/events", `{"type":"order","data":{"n":2}}`, "order-1")
	require.Equal(t, http.StatusUnprocessableEntity, w.Code)
	require.Equal(t, "idempotency_key_reused", answer(t, w)["code"])

	// A second session in a hub of one live session: 503
	// too_many_sessions with Retry-After, plain and keyed.
	for _, keys := range [][]string{nil, {"k"}} {
		w = post(h, "/session/other/events", `{"type":"a"}`, keys...)
		require.Equal(t, http.StatusServiceUnavailable, w.Code)
		require.Equal(t, "too_many_sessions", answer(t, w)["code"])
		require.Equal(t, "1", w.Header().Get("Retry-After"))
	}

	// DELETE: 204, the session gone, an unknown one 204 too; an invalid
	// id 400.
	del := func(path string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodDelete, path, nil))
		return w
	}
	require.Equal(t, http.StatusNoContent, del("/session/s").Code)
	_, ok = hub.Lookup("s")
	require.False(t, ok)
	require.Equal(t, http.StatusNoContent, del("/session/s").Code)
	w = del("/session/a%FF")
	require.Equal(t, http.StatusBadRequest, w.Code)
	require.Equal(t, "invalid_session_id", answer(t, w)["code"])
	// Room again: a new session, a new epoch.
	w = post(h, "/session/s/events", `{"type":"a"}`)
	require.Equal(t, float64(1), answer(t, w)["id"])
	require.NotEqual(t, bus.Epoch(), answer(t, w)["epoch"])

	require.NoError(t, hub.Close())
	for _, keys := range [][]string{nil, {"k"}} {
		w = post(h, "/session/s/events", `{"type":"a"}`, keys...)
		require.Equal(t, http.StatusServiceUnavailable, w.Code)
		require.Equal(t, "shutting_down", answer(t, w)["code"])
		require.Equal(t, "1", w.Header().Get("Retry-After"))
	}
}

// SignalHandler on a Hub: a signal reaches the session's subscribers, one
// to a session that does not exist is 204 and creates nothing, an invalid
// signal is 400 invalid_event whether or not the session exists.
func TestSignalHandlerOnAHub(t *testing.T) {
	hub := newTestHub(t, HubOptions{Logger: discard})
	h := writeRoutes(&PublishHandler{Publisher: hub.Publisher(), Logger: discard})
	bus, err := hub.GetOrCreate("s")
	require.NoError(t, err)
	sub, err := bus.Subscribe(t.Context(), SubscribeOptions{})
	require.NoError(t, err)
	defer sub.Close()

	w := post(h, "/session/s/signal", `{"type":"doc.changed","about":"d1"}`)
	require.Equal(t, http.StatusNoContent, w.Code, w.Body.String())
	for f := range sub.Events() { // queued already: no wait
		require.Equal(t, "doc.changed", f.Type())
		require.Contains(t, string(f.JSON()), `"about":"d1"`)
		break
	}
	require.Equal(t, http.StatusNoContent, post(h, "/session/nobody/signal", `{"type":"doc.changed"}`).Code)
	_, ok := hub.Lookup("nobody")
	require.False(t, ok, "a signal created a session")
	for _, id := range []string{"s", "nobody"} {
		for _, body := range []string{`{"type":""}`, `{"type":"` + TypeReplayComplete + `"}`} {
			w := post(h, "/session/"+id+"/signal", body)
			require.Equal(t, http.StatusBadRequest, w.Code)
			require.Equal(t, "invalid_event", answer(t, w)["code"])
		}
	}
	for _, body := range []string{``, `{"type":"a","data":1}`, `{"type":"a"} 1`} {
		w := post(h, "/session/s/signal", body)
		require.Equal(t, "invalid_body", answer(t, w)["code"], "%q", body)
	}
	w = post(h, "/session/a%FF/signal", `{"type":"a"}`)
	require.Equal(t, "invalid_session_id", answer(t, w)["code"])
	require.NoError(t, hub.Close())
	w = post(h, "/session/s/signal", `{"type":"a"}`)
	require.Equal(t, "shutting_down", answer(t, w)["code"])
}

// rawPost writes a POST of /session/s/events with header lines extra on a
// new connection to ln and returns the connection and its reader.
func rawConn(t *testing.T, dial func(context.Context, string, string) (net.Conn, error), head string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := dial(t.Context(), "", "")
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	_, err = io.WriteString(c, head)
	require.NoError(t, err)
	return c, bufio.NewReader(c)
}

// readAnswer reads one response and its JSON body.
func readAnswer(t *testing.T, br *bufio.Reader) (*http.Response, map[string]any) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	var v map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
	return resp, v
}

// wantClosedConn fails unless the server has closed the connection.
func wantClosedConn(t *testing.T, br *bufio.Reader) {
	t.Helper()
	_, err := br.ReadByte()
	require.Error(t, err, "the connection is still open")
}

// On a real server: a Content-Length above MaxBodyBytes is 413 at once,
// before a byte of the body is read, and the connection closes; a chunked
// body is cut at MaxBodyBytes; a body while the budget is spent is 503
// server_busy with Retry-After, before it is read; the budget comes back
// once the body's publish returns.
func TestPublishHandlerBoundsBodiesOnTheWire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fp := &fakePublisher{block: make(chan struct{})}
		ph := &PublishHandler{Publisher: fp, MaxBodyBytes: 1000, BodyBudget: 1500, Logger: discard}
		ln, srv, client, served := pipeHTTP(writeRoutes(ph), false)
		defer func() {
			client.CloseIdleConnections()
			_ = srv.Close()
			<-served
			time.Sleep(time.Second) // the connections' lingering closes (500 ms)
		}()
		head := func(n int64) string {
			return fmt.Sprintf("POST /session/s/events HTTP/1.1\r\nHost: pipe\r\nContent-Length: %d\r\n\r\n", n)
		}
		start := time.Now()
		_, br := rawConn(t, ln.DialContext, head(1<<40)) // and never a byte of it
		resp, v := readAnswer(t, br)
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
		require.Equal(t, "body_too_large", v["code"])
		require.True(t, resp.Close)
		require.Zero(t, time.Since(start), "the 413 waited for the body")
		wantClosedConn(t, br)

		// Chunked: cut at 1000 bytes, 413, the rest never read.
		c, br := rawConn(t, ln.DialContext, "POST /session/s/events HTTP/1.1\r\nHost: pipe\r\nTransfer-Encoding: chunked\r\n\r\n")
		stop := make(chan struct{})
		wrote := make(chan int64)
		go func() {
			var n int64
			defer func() { wrote <- n }()
			chunk := fmt.Sprintf("%x\r\n%s\r\n", 100, strings.Repeat("x", 100))
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := io.WriteString(c, chunk); err != nil {
					return
				}
				n += 100
			}
		}()
		resp, v = readAnswer(t, br)
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
		require.Equal(t, "body_too_large", v["code"])
		close(stop)
		c.Close()
		require.Less(t, <-wrote, int64(1000+300<<10), "the server read on past the limit") // its buffers at most

		// The budget: a body of 1000 whose publish blocks holds 1000 of
		// 1500; a second of 600 is 503 at once; one of 500 fits.
		hold, brHold := rawConn(t, ln.DialContext, head(1000))
		_, err := io.WriteString(hold, `{"type":"a","data":"`+strings.Repeat("x", 1000-22)+`"}`)
		require.NoError(t, err)
		synctest.Wait() // the publish blocks, holding its reservation
		_, br = rawConn(t, ln.DialContext, head(600))
		resp, v = readAnswer(t, br)
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		require.Equal(t, "server_busy", v["code"])
		require.Equal(t, "1", resp.Header.Get("Retry-After"))
		require.True(t, resp.Close)
		wantClosedConn(t, br)
		small := `{"type":"b","data":"` + strings.Repeat("y", 500-22) + `"}`
		fits, brFits := rawConn(t, ln.DialContext, head(int64(len(small))))
		_, err = io.WriteString(fits, small)
		require.NoError(t, err)
		synctest.Wait()
		close(fp.block) // both publishes return
		resp, _ = readAnswer(t, brHold)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		resp, _ = readAnswer(t, brFits)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		// Released: the 600 fits now.
		again, br := rawConn(t, ln.DialContext, head(600))
		_, err = io.WriteString(again, `{"type":"c","data":"`+strings.Repeat("z", 600-22)+`"}`)
		require.NoError(t, err)
		resp, _ = readAnswer(t, br)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		ph.bodies.mu.Lock()
		require.Zero(t, ph.bodies.reserved)
		ph.bodies.mu.Unlock()
	})
}

// A body that trickles in is answered 408 request_timeout exactly at
// BodyTimeout from the handler's start, and the connection closes; over
// HTTP/2 too. Nothing is published.
func TestPublishHandlerSlowBodyIs408(t *testing.T) {
	for _, h2c := range []bool{false, true} {
		t.Run(map[bool]string{false: "HTTP/1.1", true: "h2c"}[h2c], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				fp := &fakePublisher{}
				ph := &PublishHandler{Publisher: fp, BodyTimeout: 5 * time.Second, Logger: discard}
				ln, srv, client, served := pipeHTTP(writeRoutes(ph), h2c)
				defer func() {
					client.CloseIdleConnections()
					_ = srv.Close()
					<-served
					time.Sleep(time.Second) // the connections' lingering closes (500 ms)
				}()
				start := time.Now()
				trickle := func(w io.Writer) {
					w.Write([]byte(`{"type":"x","data":"`))
					for {
						time.Sleep(200 * time.Millisecond)
						if _, err := w.Write([]byte("y")); err != nil {
							return
						}
					}
				}
				trickled := make(chan struct{})
				if !h2c {
					// The probe: headers announcing 1,000,000
					// bytes, then a trickle.
					c, br := rawConn(t, ln.DialContext, "POST /session/s/events HTTP/1.1\r\nHost: pipe\r\nContent-Length: 1000000\r\n\r\n")
					go func() {
						defer close(trickled)
						trickle(c)
					}()
					resp, v := readAnswer(t, br)
					require.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
					require.Equal(t, "request_timeout", v["code"])
					require.True(t, resp.Close)
					require.Equal(t, 5*time.Second, time.Since(start))
					wantClosedConn(t, br)
					c.Close()
				} else {
					body, bw := io.Pipe()
					go func() {
						defer close(trickled)
						trickle(bw)
					}()
					req, _ := http.NewRequest(http.MethodPost, "http://pipe/session/s/events", body)
					resp, err := client.Do(req)
					require.NoError(t, err)
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					require.Equal(t, http.StatusRequestTimeout, resp.StatusCode, string(b))
					require.Contains(t, string(b), `"code":"request_timeout"`)
					require.Equal(t, 5*time.Second, time.Since(start))
					bw.CloseWithError(errors.New("done"))
				}
				<-trickled
				require.Empty(t, fp.calls)
			})
		})
	}
}

// Many clients publish at once, plain and keyed, to a few sessions of a
// Hub through one handler: every publish gets its own id, each session's
// ids are 1..N without a gap, and each key is appended once.
func TestPublishHandlerConcurrent(t *testing.T) {
	hub := newTestHub(t, HubOptions{})
	srv := httptest.NewServer(writeRoutes(&PublishHandler{Publisher: hub.Publisher(), Logger: discard}))
	defer srv.Close()
	client := srv.Client()
	defer client.CloseIdleConnections()
	const workers, each = 8, 25
	var mu sync.Mutex
	ids := map[string]map[float64]int{}
	var wg sync.WaitGroup
	var failed atomic.Int32
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				session := fmt.Sprintf("s%d", (w+i)%3)
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/session/"+session+"/events", strings.NewReader(`{"type":"t","data":{"i":`+fmt.Sprint(i)+`}}`))
				if i%5 == 0 { // the same key from every worker: appended once
					req.Header.Set(IdempotencyKeyHeader, fmt.Sprintf("k%d", i))
					req.Body = io.NopCloser(strings.NewReader(`{"type":"t","data":{"i":-1}}`))
					req.ContentLength = -1
				}
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					return
				}
				var v map[string]any
				err = json.NewDecoder(resp.Body).Decode(&v)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					failed.Add(1)
					return
				}
				mu.Lock()
				if ids[session] == nil {
					ids[session] = map[float64]int{}
				}
				if v["duplicate"] != true {
					ids[session][v["id"].(float64)]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Zero(t, failed.Load())
	for session, got := range ids {
		bus, ok := hub.Lookup(session)
		require.True(t, ok)
		require.Len(t, got, int(bus.LastEventID()), "session %s", session)
		for id, n := range got {
			require.Equal(t, 1, n, "session %s id %v answered twice", session, id)
			require.LessOrEqual(t, id, float64(bus.LastEventID()))
		}
	}
}

// A hostile client cannot raise the daemon's memory: bodies announcing a
// terabyte, and endless chunked bodies from many connections at once, cost
// the server at most its budget of bodies; what it allocates does not grow
// with what the clients send.
func TestPublishHandlerMemoryIsBoundedAgainstHostileClients(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 64 MiB")
	}
	fp := &fakePublisher{}
	const maxBody = 64 << 10
	ph := &PublishHandler{Publisher: fp, MaxBodyBytes: maxBody, BodyBudget: 4 * maxBody, Logger: discard}
	srv := httptest.NewServer(writeRoutes(ph))
	defer srv.Close()
	addr := srv.Listener.Addr().String()
	const clients, perClient = 32, 2 << 20 // each tries 2 MiB: 64 MiB in all
	chunk := []byte(fmt.Sprintf("%x\r\n%s\r\n", 16<<10, strings.Repeat("x", 16<<10)))
	run := func() (sent int64) {
		var wg sync.WaitGroup
		var total atomic.Int64
		for i := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Error(err)
					return
				}
				defer c.Close()
				if i%4 == 0 { // a terabyte announced, a trickle sent
					fmt.Fprintf(c, "POST /session/s/events HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{", int64(1)<<40)
				} else {
					io.WriteString(c, "POST /session/s/events HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
				}
				answered := make(chan int, 1)
				go func() {
					resp, err := http.ReadResponse(bufio.NewReader(c), nil)
					if err != nil {
						answered <- 0
						return
					}
					resp.Body.Close()
					answered <- resp.StatusCode
				}()
				for n := 0; n < perClient && i%4 != 0; n += 16 << 10 {
					c.SetWriteDeadline(time.Now().Add(10 * time.Second))
					if _, err := c.Write(chunk); err != nil {
						break
					}
					total.Add(16 << 10)
				}
				select {
				case code := <-answered:
					// 0: the server cut the connection before its answer
					// was read (a reset).
					if code != http.StatusRequestEntityTooLarge && code != http.StatusServiceUnavailable && code != 0 {
						t.Errorf("client %d: answered %d, want 413 or 503", i, code)
					}
				case <-time.After(30 * time.Second):
					t.Errorf("client %d: no answer", i)
				}
			}()
		}
		wg.Wait()
		return total.Load()
	}
	run() // warm up the server's pools
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	sent := run()
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("clients sent %d KiB; the process allocated %d KiB (peak heap %d KiB)", sent>>10, alloc>>10, after.HeapInuse>>10)
	// Each body the handler admits costs at most about 2*maxBody (a
	// buffer doubling up to maxBody), each connection its server's few
	// KiB: 32 connections, well under 16 MiB whatever the clients send.
	require.Less(t, alloc, uint64(16<<20), "the server's allocations grew with what the clients sent")
	ph.bodies.mu.Lock()
	require.Zero(t, ph.bodies.reserved)
	ph.bodies.mu.Unlock()
	require.Empty(t, fp.calls)
}

// The decoding of the two bodies, at the edge of each rule.
func TestDecodeObject(t *testing.T) {
	e, err := decodePublish([]byte(` {"TYPE":"a","Data":{"n":1},"OriginatorClientID":"c"} `))
	require.NoError(t, err)
	require.Equal(t, Event{Type: "a", Data: json.RawMessage(`{"n":1}`), OriginatorClientID: "c"}, e)
	e, err = decodePublish([]byte(`{"type":null}`))
	require.NoError(t, err)
	require.Equal(t, Event{}, e) // refused by the publisher: an empty type
	typ, about, err := decodeSignal([]byte(`{"type":"t","about":"x"}`))
	require.NoError(t, err)
	require.Equal(t, [2]string{"t", "x"}, [2]string{typ, about})
	_, _, err = decodeSignal([]byte(`{"type":"t","about":1}`))
	require.ErrorContains(t, err, `field "about"`)
	// The data is a slice of the body, not a copy.
	body := []byte(`{"type":"a","data":[1]}`)
	e, err = decodePublish(body)
	require.NoError(t, err)
	require.Same(t, &body[19], &e.Data.(json.RawMessage)[0])
}
