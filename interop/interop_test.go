package interop

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ssebus/eventbus/internal/daemontest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The daemon's settings for the run: a short retry: with jitter, and a
// heartbeat short enough that one is always pending when a stream is cut
// (the scenario idles longer than it before every cut).
var daemonArgs = []string{"-retry", "300ms", "-retry-jitter", "200ms", "-heartbeat", "150ms", "-ring", "1000"}

const idleBeforeCut = 500 * time.Millisecond

// TestThirdPartyClients drives four SSE clients nobody here wrote against the
// demo daemon binary (epoch ids on, its default), each on a session of its
// own: tmaxmax/go-sse, r3labs/sse/v2, npm eventsource (a WHATWG
// EventSource) and a fetch loop on npm eventsource-parser. Each receives
// events live, through a clean end of its stream, an abrupt TCP reset, and a
// daemon restart (a new epoch), and must have seen exactly the published
// events of both epochs, each once and in order, with "<epoch>:<id>" SSE
// ids, plus the synthetic frames (a replay_complete per resume, at most one
// stream_error shutdown as the old daemon goes, one epoch_reset after the
// restart; sseclient reports the shutdown as an error, the others as an
// event), and nothing else: neither retry: nor the
// heartbeats may surface as an event. The one exception is r3labs, which
// turns the unterminated tail of a stream (heartbeat lines after the last
// event) into an empty event when the connection ends; that is checked to be
// exactly that and nothing more (see README).
func TestThirdPartyClients(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	clients := []driven{
		{&client{name: "sseclient (ours, the reference)", session: "sseclient"}, startSSEClient, false},
		{&client{name: "tmaxmax/go-sse", session: "gosse"}, startGoSSE, false},
		{&client{name: "r3labs/sse", session: "r3labs"}, startR3labs, false},
		{&client{name: "npm eventsource", session: "npmes"}, startNode("eventsource-client.mjs"), true},
		{&client{name: "npm eventsource-parser", session: "npmparser"}, startNode("parser-client.mjs"), true},
	}
	needNode(t, clients)
	bin := daemontest.Build(ctx, t, "..", raceEnabled)
	addr := daemontest.FreeAddr(t)
	args := append([]string{"-addr", addr}, daemonArgs...)
	d := daemontest.Start(ctx, t, bin, args...)

	stop, all := drive(t, ctx, clients, func(c *client) string { return d.Base + "/session/" + c.session + "/events" })
	defer stop()
	subscribed := func(c *client) (bool, string) {
		var st struct {
			Subscribers int `json:"subscribers"`
		}
		d.Call(http.MethodGet, "/session/"+c.session, "", http.StatusOK, &st)
		return st.Subscribers == 1, fmt.Sprintf("%+v", st)
	}
	published := map[string]int{} // per session, in the current epoch
	publish := func(n int) {
		for _, cl := range clients {
			for range n {
				published[cl.c.session]++
				d.Publish(cl.c.session, published[cl.c.session])
			}
		}
	}
	seenAll := func(total int) func(*client) (bool, string) {
		return func(c *client) (bool, string) {
			return c.events() == total, fmt.Sprintf("%d events seen, want %d", c.events(), total)
		}
	}
	cut := func(mode string) {
		time.Sleep(idleBeforeCut)
		for _, cl := range clients {
			var res struct {
				Disconnected int `json:"disconnected"`
			}
			d.Call(http.MethodPost, "/session/"+cl.c.session+"/disconnect?mode="+mode, "", http.StatusOK, &res)
			if res.Disconnected != 1 {
				t.Fatalf("%s: %s cut %d streams", cl.c.name, mode, res.Disconnected)
			}
		}
	}

	// Live: each session is created by its client's first GET.
	for _, cl := range clients {
		daemontest.WaitUntil(t, 30*time.Second, cl.c.name+" to subscribe", func() (bool, string) {
			var st map[string]any
			resp, err := d.HTTP.Get(d.Base + "/session/" + cl.c.session)
			if err != nil {
				return false, err.Error()
			}
			defer resp.Body.Close()
			json.NewDecoder(resp.Body).Decode(&st)
			return resp.StatusCode == 200 && st["subscribers"] == float64(1), fmt.Sprintf("%d %v", resp.StatusCode, st)
		})
	}
	publish(5)
	all("5 live events", seenAll(5))

	// A clean end of every stream, then events while they are away.
	cut("clean")
	publish(5)
	all("10 events after the clean cut", seenAll(10))
	all("to be back", subscribed)

	// A TCP reset.
	cut("abort")
	publish(5)
	all("15 events after the abort", seenAll(15))
	all("to be back", subscribed)

	// A daemon restart: a new epoch on the same address.
	time.Sleep(idleBeforeCut)
	first := map[string]string{}
	for _, cl := range clients {
		first[cl.c.session] = d.Status(cl.c.session).Epoch
	}
	d.Stop(20 * time.Second)
	d = daemontest.Start(ctx, t, bin, args...)
	clear(published)
	publish(5) // each session is created anew, by this POST or by the client's GET
	all("5 events of the new epoch", seenAll(20))
	all("to be back", subscribed)
	publish(3)
	all("3 live events of the new epoch", seenAll(23))
	second := map[string]string{}
	for _, cl := range clients {
		second[cl.c.session] = d.Status(cl.c.session).Epoch
	}
	time.Sleep(300 * time.Millisecond) // let anything extra arrive
	stop()

	for _, cl := range clients {
		t.Run(cl.c.name, func(t *testing.T) {
			tails := verify(t, cl.c, first[cl.c.session], second[cl.c.session], []int{15, 8}, 3)
			if cl.c.name == "r3labs/sse" {
				t.Logf("r3labs: %d empty events, each the tail of a stream that ended after heartbeat lines", tails)
			} else if tails > 0 {
				t.Errorf("%d empty events", tails)
			}
		})
	}
}

// verify checks c's records against what was published: counts[i] events
// in epoch i (ids 1..counts[i], once each, in order, with "<epoch>:<id>" SSE
// ids), an epoch_reset (detail epoch_mismatch, from the first epoch's last
// id) before any event of the second, resumes replay_complete frames, and
// nothing else. It returns how many empty events ended a connection (only
// r3labs makes them; the caller decides).
func verify(t *testing.T, c *client, epoch1, epoch2 string, counts []int, resumes int) (tails int) {
	recs := c.records()
	epochs := []string{epoch1, epoch2}
	phase, next := 0, uint64(1)
	replays, resets, shutdowns := 0, 0, 0
	idRE := regexp.MustCompile(`^([0-9a-f]{32}):([0-9]+)$`)
	for i, r := range recs {
		switch r.Kind {
		case "open", "end":
			continue
		case "event":
		default:
			t.Fatalf("record %d: %+v", i, r)
		}
		var env struct {
			ID   *uint64         `json:"id"`
			Type string          `json:"type"`
			Data json.RawMessage `json:"data"`
		}
		if r.Data == "" {
			// Only as the last thing of a connection: r3labs reports the end
			// on another goroutine, so the end may be recorded just before.
			end := func(j int) bool { return j >= 0 && j < len(recs) && recs[j].Kind == "end" }
			if !end(i-1) && !end(i+1) && i+1 < len(recs) {
				t.Fatalf("record %d: an empty event in the middle of a stream: %+v (next %+v)", i, r, recs[i+1])
			}
			tails++
			continue
		}
		if err := json.Unmarshal([]byte(r.Data), &env); err != nil {
			t.Fatalf("record %d: an event that is not an envelope: %+v", i, r)
		}
		typ := r.Type
		if typ == "" || typ == "message" {
			t.Fatalf("record %d: an unnamed event: %+v", i, r)
		}
		if typ != env.Type {
			t.Fatalf("record %d: event type %q, envelope type %q", i, typ, env.Type)
		}
		if env.ID == nil {
			switch typ {
			case "replay_complete":
				replays++
			case "state_resync_required":
				var d struct {
					Reason, Detail, Epoch string
					LastDeliveredID       uint64 `json:"lastDeliveredId"`
				}
				json.Unmarshal(env.Data, &d)
				if phase != 0 || next != uint64(counts[0])+1 || d.Reason != "epoch_reset" || d.Detail != "epoch_mismatch" ||
					d.Epoch != epoch2 || d.LastDeliveredID != uint64(counts[0]) {
					t.Fatalf("record %d: %+v after %d events of epoch %d", i, d, next-1, phase+1)
				}
				resets++
				phase, next = 1, 1
			case "stream_error":
				// The restart's SIGTERM: the old daemon says it is going
				// away, once, after every event of its epoch.
				var d struct {
					ErrorKind  string `json:"errorKind"`
					RetryAfter int64  `json:"retryAfter"`
				}
				json.Unmarshal(env.Data, &d)
				if phase != 0 || next != uint64(counts[0])+1 || d.ErrorKind != "shutdown" || d.RetryAfter <= 0 || shutdowns > 0 {
					t.Fatalf("record %d: stream_error %+v after %d events of epoch %d (%d before)", i, d, next-1, phase+1, shutdowns)
				}
				shutdowns++
			default:
				t.Fatalf("record %d: synthetic %q", i, typ)
			}
			continue
		}
		m := idRE.FindStringSubmatch(r.ID)
		if typ != "note" || *env.ID != next || m == nil || m[1] != epochs[phase] || m[2] != fmt.Sprint(next) {
			t.Fatalf("record %d: %+v, want note %d of epoch %s with SSE id %s:%d", i, r, next, epochs[phase], epochs[phase], next)
		}
		next++
	}
	if phase != 1 || next != uint64(counts[1])+1 || resets != 1 || replays != resumes {
		t.Fatalf("ended in epoch %d at id %d, %d epoch_reset, %d replay_complete; want epoch 2, %d events, 1, %d",
			phase+1, next-1, resets, replays, counts[1], resumes)
	}
	t.Logf("%s: %d events of epoch 1 and %d of epoch 2 exactly once, 1 epoch_reset, %d replay_complete, %d stream_error shutdown (as an event), %d connection ends",
		c.name, counts[0], counts[1], replays, shutdowns, strings.Count(kinds(recs), "end"))
	return tails
}

// driven is a client with its starter; node: it needs Node.
type driven struct {
	c     *client
	start starter
	node  bool
}

// needNode skips (or with CI=true fails) the test when a client needs Node
// and it is missing.
func needNode(t *testing.T, clients []driven) {
	for _, cl := range clients {
		if cl.node {
			nodeAvailable(t)
		}
	}
}

// drive starts every client on its URL; stop ends them all and waits for
// them (once; later calls do nothing), all waits until cond holds for
// every client, failing the test with its records after 30 s.
func drive(t *testing.T, ctx context.Context, clients []driven, urlOf func(*client) string) (stop func(), all func(what string, cond func(*client) (bool, string))) {
	cctx, stopClients := context.WithCancel(ctx)
	var waits []func()
	for _, cl := range clients {
		waits = append(waits, cl.start(t, cctx, cl.c, urlOf(cl.c)))
	}
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			stopClients()
			for _, w := range waits {
				w()
			}
		}
	}
	all = func(what string, cond func(c *client) (bool, string)) {
		t.Helper()
		for _, cl := range clients {
			daemontest.WaitUntil(t, 30*time.Second, cl.c.name+": "+what, func() (bool, string) {
				ok, state := cond(cl.c)
				return ok, fmt.Sprintf("%s; records %+v", state, cl.c.records())
			})
		}
	}
	return stop, all
}

func kinds(recs []record) string {
	var b strings.Builder
	for _, r := range recs {
		b.WriteString(r.Kind + " ")
	}
	return b.String()
}
