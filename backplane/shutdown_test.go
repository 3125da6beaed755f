package backplane

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/sseclient"
)

// streamTail reads an SSE response to its end and returns the data of its
// events, in order.
func streamTail(t *testing.T, resp *http.Response) []string {
	t.Helper()
	var out []string
	p := sseclient.NewParser(resp.Body)
	for {
		m, err := p.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("reading the stream: %v", err)
		}
		if m.Kind == sseclient.KindEvent {
			out = append(out, string(m.Data))
		}
	}
}

// Close is a replica going away: every stream of every mirror gets what
// was queued, then stream_error shutdown with Config.ShutdownRetryAfter,
// through the set's Handler. Releasing one mirror is no shutdown: after a
// Delete on this replica (Deleted) its streams end with stream_error
// closed, the session they followed being gone; when its epoch ended
// otherwise (Expire: a lost log, or a Delete elsewhere, which the engine
// cannot tell apart) with stream_error unavailable, so that the client
// reconnects and learns which (epoch_reset, or a 404).
func TestCloseEndsStreamsWithTheShutdownFrame(t *testing.T) {
	set, _ := newSet(t, time.Minute)
	set.cfg.ShutdownRetryAfter = 1500 * time.Millisecond // read by Close alone
	mux := http.NewServeMux()
	mux.Handle("GET /session/{id}/events", set.Handler())
	srv := httptest.NewServer(mux)
	defer srv.Close()

	open := func(id string) *http.Response {
		t.Helper()
		resp, err := srv.Client().Get(srv.URL + "/session/" + id + "/events")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", id, resp.StatusCode)
		}
		return resp
	}
	a, b, released, deleted := open("a"), open("b"), open("c"), open("d")
	for _, id := range []string{"a", "b"} {
		bus, err := set.Bus(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if err := Append(bus, LogEntry{ID: 1, Type: "e", JSON: []byte(`{"id":1,"v":1,"type":"e"}`)}); err != nil {
			t.Fatal(err)
		}
	}
	set.Expire(set.Get("c"), "a test")
	if got := streamTail(t, released); len(got) != 1 || !strings.Contains(got[0], `"errorKind":"unavailable"`) {
		t.Fatalf("an expired mirror's stream ended with %q, want stream_error unavailable", got)
	}
	set.Deleted("d")
	if got := streamTail(t, deleted); len(got) != 1 || !strings.Contains(got[0], `"errorKind":"closed"`) {
		t.Fatalf("a deleted session's stream ended with %q, want stream_error closed", got)
	}

	set.Close(nil)
	for name, resp := range map[string]*http.Response{"a": a, "b": b} {
		got := streamTail(t, resp)
		if len(got) != 2 || got[0] != `{"id":1,"v":1,"type":"e"}` {
			t.Fatalf("stream %s: %q, want its event, then the shutdown frame", name, got)
		}
		var env struct {
			Type string `json:"type"`
			Data struct {
				ErrorKind  string `json:"errorKind"`
				RetryAfter int64  `json:"retryAfter"`
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(got[1]), &env); err != nil {
			t.Fatal(err)
		}
		if env.Type != eventbus.TypeStreamError || env.Data.ErrorKind != eventbus.ErrorKindShutdown || env.Data.RetryAfter != 1500 {
			t.Fatalf("stream %s ended with %s, want stream_error shutdown, retryAfter 1500", name, got[1])
		}
	}
}
