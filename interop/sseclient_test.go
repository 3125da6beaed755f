package interop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssebus/eventbus/internal/daemontest"
	"github.com/ssebus/eventbus/sseclient"
)

// Our Go client, sseclient, against the demo daemon binary in the
// scenarios of the checks that TestThirdPartyClients does not run
// (that one covers both cuts and a restart, with sseclient as its
// reference): a 429 then success, a 503, an eviction, a ring_evicted loss,
// stream lifetimes, a logout, a 401 before any stream, a 1 MiB event. The
// JS client runs the same against the same daemon (clients/js/test).

// goClient is a sseclient.Client on a daemon's session and what it
// reported.
type goClient struct {
	c *sseclient.Client

	mu      sync.Mutex
	events  []sseclient.Event
	caught  []sseclient.CaughtUp
	resyncs []sseclient.Resync
	evicted []sseclient.Eviction
	states  []sseclient.StateChange
	errs    []error
	at      []time.Time // of each error
}

// newGoClient returns a client of url that records everything; onEvent,
// when set, runs first for each event (it may block the stream).
func newGoClient(t *testing.T, url string, onEvent func(sseclient.Event)) *goClient {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	g := &goClient{}
	lock := func(f func()) { g.mu.Lock(); defer g.mu.Unlock(); f() }
	g.c = &sseclient.Client{
		URL:        url,
		HTTPClient: &http.Client{Transport: tr},
		OnEvent: func(e sseclient.Event) {
			if onEvent != nil {
				onEvent(e)
			}
			lock(func() { g.events = append(g.events, e) })
		},
		OnCaughtUp: func(c sseclient.CaughtUp) { lock(func() { g.caught = append(g.caught, c) }) },
		OnResync:   func(r sseclient.Resync) { lock(func() { g.resyncs = append(g.resyncs, r) }) },
		OnEvicted:  func(e sseclient.Eviction) { lock(func() { g.evicted = append(g.evicted, e) }) },
		OnState:    func(s sseclient.StateChange) { lock(func() { g.states = append(g.states, s) }) },
		OnError: func(err error) {
			lock(func() { g.errs = append(g.errs, err); g.at = append(g.at, time.Now()) })
		},
	}
	return g
}

// run starts the client until the test ends (or stop); stop returns Run's
// error.
func (g *goClient) run(t *testing.T) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.c.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

func (g *goClient) ids() []uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	var ids []uint64
	for _, e := range g.events {
		ids = append(ids, e.ID)
	}
	return ids
}

func (g *goClient) opens() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, s := range g.states {
		if s.State == sseclient.StateOpen {
			n++
		}
	}
	return n
}

func (g *goClient) String() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	ids := make([]uint64, len(g.events))
	for i, e := range g.events {
		ids[i] = e.ID
	}
	return fmt.Sprintf("ids %v, resyncs %+v, evicted %d, errors %v", ids, g.resyncs, len(g.evicted), g.errs)
}

// httpErrors returns the *sseclient.HTTPError among what g reported.
func (g *goClient) httpErrors() []*sseclient.HTTPError {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []*sseclient.HTTPError
	for _, err := range g.errs {
		var he *sseclient.HTTPError
		if errors.As(err, &he) {
			out = append(out, he)
		}
	}
	return out
}

func TestGoClientAgainstTheDaemon(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bin := daemontest.Build(ctx, t, "..", raceEnabled)

	t.Run("429 then success", func(t *testing.T) {
		d := daemontest.Start(ctx, t, bin, "-retry", "100ms", "-max-subscribers", "1")
		holder := newGoClient(t, d.Base+"/session/full/events", nil)
		stopHolder := holder.run(t)
		daemontest.WaitUntil(t, 20*time.Second, "the holder", func() (bool, string) { return holder.opens() == 1, holder.String() })
		g := newGoClient(t, d.Base+"/session/full/events", nil)
		g.run(t)
		daemontest.WaitUntil(t, 20*time.Second, "the 429", func() (bool, string) { return len(g.httpErrors()) == 1, g.String() })
		refused := time.Now()
		he := g.httpErrors()[0]
		if he.StatusCode != 429 || he.Code != "subscriber_limit_exceeded" || he.RetryAfter != 5*time.Second {
			t.Fatalf("the 429: %+v", he)
		}
		stopHolder()
		daemontest.WaitUntil(t, 20*time.Second, "open after Retry-After", func() (bool, string) { return g.opens() == 1, g.String() })
		if since := time.Since(refused); since < 4900*time.Millisecond {
			t.Fatalf("opened %v after the 429", since)
		}
		d.Publish("full", 1)
		daemontest.WaitUntil(t, 20*time.Second, "the event", func() (bool, string) { return slices.Equal(g.ids(), []uint64{1}), g.String() })
	})

	t.Run("503 with Retry-After then success", func(t *testing.T) {
		d := daemontest.Start(ctx, t, bin, "-retry", "100ms", "-max-sessions", "1")
		d.Publish("first", 1)
		g := newGoClient(t, d.Base+"/session/second/events", nil)
		g.c.InitialDelay = 50 * time.Millisecond
		g.run(t)
		daemontest.WaitUntil(t, 20*time.Second, "two 503s", func() (bool, string) { return len(g.httpErrors()) == 2, g.String() })
		for _, he := range g.httpErrors() {
			if he.StatusCode != 503 || he.Code != "too_many_sessions" || he.RetryAfter != time.Second {
				t.Fatalf("the 503: %+v", he)
			}
		}
		g.mu.Lock()
		gap := g.at[1].Sub(g.at[0])
		g.mu.Unlock()
		if gap < 950*time.Millisecond {
			t.Fatalf("retried %v after the 503, before its Retry-After", gap)
		}
		d.Call(http.MethodDelete, "/session/first", "", http.StatusNoContent, nil)
		daemontest.WaitUntil(t, 20*time.Second, "open", func() (bool, string) { return g.opens() == 1, g.String() })
		d.Publish("second", 1)
		daemontest.WaitUntil(t, 20*time.Second, "the event", func() (bool, string) { return slices.Equal(g.ids(), []uint64{1}), g.String() })
	})

	t.Run("eviction then a resume through the replay budget", func(t *testing.T) {
		d := daemontest.Start(ctx, t, bin, "-retry", "100ms")
		release := make(chan struct{})
		var once sync.Once
		defer once.Do(func() { close(release) })
		g := newGoClient(t, d.Base+"/session/slow/events", func(e sseclient.Event) {
			if e.ID == 1 {
				<-release // stop reading: the daemon's queue for this client fills
			}
		})
		g.c.MaxQueued = 16
		g.run(t)
		daemontest.WaitUntil(t, 20*time.Second, "open", func() (bool, string) { return g.opens() == 1, g.String() })
		payload := strings.Repeat("p", 256<<10)
		const n = 80 // 20 MiB: past loopback's socket buffers and the 8 MiB replay budget
		for i := 1; i <= n; i++ {
			d.Call(http.MethodPost, "/session/slow/events", fmt.Sprintf(`{"type":"big","data":{"i":%d,"p":%q}}`, i, payload), http.StatusOK, nil)
		}
		daemontest.WaitUntil(t, 20*time.Second, "the eviction", func() (bool, string) {
			st := d.Status("slow")
			return st.Subscribers == 0, fmt.Sprintf("%+v", st)
		})
		once.Do(func() { close(release) })
		daemontest.WaitUntil(t, 60*time.Second, "every event", func() (bool, string) { return len(g.ids()) >= n, g.String() })
		opens := g.opens()
		g.mu.Lock()
		defer g.mu.Unlock()
		// Resumed twice at least: the replay of more than the 8 MiB budget
		// is cut, and continued at once (its replay_complete is not
		// reported: nothing was lost).
		if !slices.Equal(idsOfEvents(g.events), daemontest.IDs(1, n)) || len(g.evicted) == 0 || len(g.resyncs) != 0 || opens < 3 || len(g.caught) != 1 {
			t.Fatalf("ids %v, evicted %+v, resyncs %+v, %d streams, %d replay_complete: want 1..%d once, evicted, resumed twice or more, no loss",
				idsOfEvents(g.events), g.evicted, g.resyncs, opens, len(g.caught), n)
		}
	})

	t.Run("ring_evicted with the exact missing range", func(t *testing.T) {
		d := daemontest.Start(ctx, t, bin, "-retry", "100ms", "-ring", "10")
		hold := make(chan struct{})
		g := newGoClient(t, d.Base+"/session/ring/events", nil)
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		var holding sync.Mutex
		g.c.HTTPClient = &http.Client{Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
			holding.Lock()
			h := hold
			holding.Unlock()
			select {
			case <-h:
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
			return tr.RoundTrip(r)
		})}
		close(hold)
		g.run(t)
		daemontest.WaitUntil(t, 20*time.Second, "open", func() (bool, string) { return g.opens() == 1, g.String() })
		for i := 1; i <= 3; i++ {
			d.Publish("ring", i)
		}
		daemontest.WaitUntil(t, 20*time.Second, "3 events", func() (bool, string) { return len(g.ids()) == 3, g.String() })
		holding.Lock()
		hold = make(chan struct{})
		holding.Unlock()
		d.Call(http.MethodPost, "/session/ring/disconnect", "", http.StatusOK, nil)
		daemontest.WaitUntil(t, 20*time.Second, "the cut", func() (bool, string) { return d.Status("ring").Streams == 0, "" })
		for i := 4; i <= 53; i++ {
			d.Publish("ring", i)
		}
		holding.Lock()
		close(hold)
		holding.Unlock()
		daemontest.WaitUntil(t, 20*time.Second, "the resume", func() (bool, string) {
			g.mu.Lock()
			defer g.mu.Unlock()
			return len(g.caught) == 1, ""
		})
		g.mu.Lock()
		defer g.mu.Unlock()
		if len(g.resyncs) != 1 || g.resyncs[0].Reason != "ring_evicted" || g.resyncs[0].Missing != (sseclient.IDRange{From: 4, To: 43}) ||
			!slices.Equal(idsOfEvents(g.events), append(daemontest.IDs(1, 3), daemontest.IDs(44, 53)...)) {
			t.Fatalf("resyncs %+v, ids %v", g.resyncs, idsOfEvents(g.events))
		}
	})

	t.Run("a 1 MiB event", func(t *testing.T) {
		d := daemontest.Start(ctx, t, bin)
		g := newGoClient(t, d.Base+"/session/big/events", nil)
		g.run(t)
		daemontest.WaitUntil(t, 20*time.Second, "open", func() (bool, string) { return g.opens() == 1, g.String() })
		var b strings.Builder
		for b.Len() < 1<<20 {
			b.WriteString("0123456789abcdef\u00e9\u4e16")
		}
		d.Call(http.MethodPost, "/session/big/events", fmt.Sprintf(`{"type":"blob","data":{"s":%q}}`, b.String()), http.StatusOK, nil)
		daemontest.WaitUntil(t, 20*time.Second, "the event", func() (bool, string) { return len(g.ids()) == 1, g.String() })
		var data struct{ S string }
		g.mu.Lock()
		err := json.Unmarshal(g.events[0].Data, &data)
		g.mu.Unlock()
		if err != nil || data.S != b.String() {
			t.Fatalf("the 1 MiB event: %d bytes, %v", len(data.S), err)
		}
	})

	t.Run("access control", func(t *testing.T) {
		const token = "interop-token"
		d := daemontest.Start(ctx, t, bin, "-retry", "100ms", "-auth-token", token, "-token-lifetime", "1500ms")
		d.Header = http.Header{"Authorization": {"Bearer " + token}}

		// A 401 before any stream: final without credentials.
		g := newGoClient(t, d.Base+"/session/auth/events", nil)
		var he *sseclient.HTTPError
		if err := g.c.Run(ctx); !errors.As(err, &he) || he.StatusCode != 401 || he.Challenge != `Bearer realm="sessiond"` {
			t.Fatalf("without credentials: %v", err)
		}

		// Lifetimes: every id once across two of them, credentials asked at
		// each end.
		var mu sync.Mutex
		var reasons []sseclient.CredentialsReason
		g = newGoClient(t, d.Base+"/session/auth/events", nil)
		g.c.Credentials = func(_ context.Context, reason sseclient.CredentialsReason) (sseclient.Credentials, error) {
			mu.Lock()
			reasons = append(reasons, reason)
			mu.Unlock()
			return sseclient.Credentials{Token: token}, nil
		}
		stopLifetimes := g.run(t)
		daemontest.WaitUntil(t, 20*time.Second, "open", func() (bool, string) { return g.opens() == 1, g.String() })
		stop := make(chan struct{})
		published := make(chan int)
		go func() {
			n := 0
			defer func() { published <- n }()
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				req, _ := http.NewRequest(http.MethodPost, d.Base+"/session/auth/events", strings.NewReader(`{"type":"note"}`))
				req.Header = d.Header.Clone()
				resp, err := d.HTTP.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				n++
			}
		}()
		daemontest.WaitUntil(t, 20*time.Second, "two lifetimes", func() (bool, string) { return g.opens() == 3, g.String() })
		close(stop)
		total := <-published
		daemontest.WaitUntil(t, 20*time.Second, "every event", func() (bool, string) { return len(g.ids()) >= total, g.String() })
		mu.Lock()
		r := fmt.Sprint(reasons)
		mu.Unlock()
		if !slices.Equal(g.ids(), daemontest.IDs(1, uint64(total))) || r != "[initial reauthenticate reauthenticate]" {
			t.Fatalf("ids %v (want 1..%d), reasons %s", g.ids(), total, r)
		}
		stopLifetimes()

		// A logout: one reconnect with the (now revoked) login cookie, then
		// the 401 is final.
		cookie := login(t, d, token, "alice")
		reasons = nil
		g = newGoClient(t, d.Base+"/session/auth/events", nil)
		g.c.Credentials = func(_ context.Context, reason sseclient.CredentialsReason) (sseclient.Credentials, error) {
			mu.Lock()
			reasons = append(reasons, reason)
			mu.Unlock()
			return sseclient.Credentials{Header: http.Header{"Cookie": {cookie}}}, nil
		}
		done := make(chan error, 1)
		go func() { done <- g.c.Run(ctx) }()
		daemontest.WaitUntil(t, 20*time.Second, "open", func() (bool, string) { return g.opens() == 1, g.String() })
		var out struct {
			Subject string `json:"subject"`
			Revoked int    `json:"revoked"`
		}
		req, _ := http.NewRequest(http.MethodPost, d.Base+"/logout", nil)
		req.Header.Set("Cookie", cookie)
		resp, err := d.HTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if out.Subject != "alice" || out.Revoked != 1 {
			t.Fatalf("logout: %+v", out)
		}
		err = <-done
		mu.Lock()
		r = fmt.Sprint(reasons)
		mu.Unlock()
		var se *sseclient.StreamError
		if !errors.As(err, &he) || he.StatusCode != 401 || r != "[initial revoked]" || len(g.errs) != 1 || !errors.As(g.errs[0], &se) || se.Kind != "revoked" || g.opens() != 1 {
			t.Fatalf("after the logout: %v, reasons %s, %s", err, r, g)
		}
	})
}

func idsOfEvents(evs []sseclient.Event) []uint64 {
	out := make([]uint64, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// login makes POST /login as subject and returns its cookie ("name=value").
func login(t *testing.T, d *daemontest.Daemon, token, subject string) string {
	t.Helper()
	resp, err := d.HTTP.Post(d.Base+"/login", "application/json", strings.NewReader(`{"token":"`+token+`","subject":"`+subject+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, c := range resp.Cookies() {
		return c.Name + "=" + c.Value
	}
	t.Fatalf("no login cookie: %s", resp.Status)
	return ""
}
