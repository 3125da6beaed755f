package sseclient_test

// The scenarios where time matters (Retry-After, backoff, idle timeouts,
// immediate reconnects) run in testing/synctest bubbles, against the real
// eventbus.Handler served over in-memory pipes: the fake clock makes the
// delays exact and costs no wall time.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/sseclient"
)

// pipeClient is a Client of s's session id over its pipes, recording into
// a new recorder.
func pipeClient(s *server, id string) (*sseclient.Client, *recorder) {
	rc := newRecorder()
	c := &sseclient.Client{URL: s.url(id), HTTPClient: s.httpClient(), InitialDelay: 100 * time.Millisecond}
	rc.attach(c)
	return c, rc
}

// delays returns the Delay of every StateReconnecting change.
func (rc *recorder) delays() []time.Duration {
	var out []time.Duration
	for _, s := range rc.states {
		if s.State == sseclient.StateReconnecting {
			out = append(out, s.Delay)
		}
	}
	return out
}

// openedAt returns when each StateOpen arrived.
func (rc *recorder) openedAt() []time.Time {
	var out []time.Time
	for i, s := range rc.states {
		if s.State == sseclient.StateOpen {
			out = append(out, rc.stamps[i])
		}
	}
	return out
}

func TestRetryAfterOn429IsHonoured(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newServer(t, serverConfig{pipe: true, opts: eventbus.Options{MaxSubscribers: 1}})
		holder, err := s.bus("a").Subscribe(context.Background(), eventbus.SubscribeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c, rc := pipeClient(s, "a")
		t0 := time.Now()
		start(t, c)
		rc.wait(t, "the 429", time.Minute, func() bool { return len(rc.errs) == 1 })
		var he *sseclient.HTTPError
		if !errors.As(rc.snap().errs[0], &he) || he.StatusCode != 429 || he.Code != "subscriber_limit_exceeded" || he.RetryAfter != 5*time.Second {
			t.Fatalf("error %v", rc.snap().errs[0])
		}
		time.Sleep(time.Second)
		holder.Close()
		rc.wait(t, "open", time.Minute, func() bool { return len(rc.openedAt()) == 1 })
		d := rc.snap().delays()[0]
		if d < 5*time.Second || d > 5*time.Second+5*time.Second/4 {
			t.Fatalf("waited %v after Retry-After: 5", d)
		}
		if got := rc.snap().openedAt()[0].Sub(t0); got != d {
			t.Fatalf("opened %v after the start, want the delay %v", got, d)
		}
	})
}

func Test503WithRetryAfterAnd5xxBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newServer(t, serverConfig{pipe: true, handler: func(h *eventbus.Handler) { h.Retry = 3 * time.Second }})
		n := 0
		s.before = func(w http.ResponseWriter, r *http.Request) bool {
			n++
			switch n {
			case 1:
				w.Header().Set("Retry-After", "2")
				http.Error(w, `{"error":"shutting down","code":"shutting_down"}`, http.StatusServiceUnavailable)
			case 2, 3, 4:
				http.Error(w, `{"error":"x","code":"internal"}`, 500+n)
			default:
				return true
			}
			return false
		}
		c, rc := pipeClient(s, "a")
		start(t, c)
		rc.wait(t, "open", time.Minute, func() bool { return len(rc.openedAt()) == 1 })
		d := rc.snap().delays()
		if len(d) != 4 || d[0] < 2*time.Second || d[0] > 2500*time.Millisecond {
			t.Fatalf("delays %v", d)
		}
		// Full jitter: [0, 100ms * 2^k) for the 2nd, 3rd and 4th failure.
		for i, x := range d[1:] {
			if limit := 100 * time.Millisecond << (i + 1); x >= limit {
				t.Fatalf("delay %d = %v, want < %v (all %v)", i+1, x, limit, d)
			}
		}
		// The stream's retry: (3 s) is the base from now on.
		s.publish("a", "note", nil)
		rc.wait(t, "event", time.Minute, func() bool { return len(rc.events) == 1 })
		s.cut("a", nil)
		rc.wait(t, "reopened", time.Minute, func() bool { return len(rc.openedAt()) == 2 })
		if x := rc.snap().delays()[4]; x >= 3*time.Second {
			t.Fatalf("delay after a cut %v, want < retry: 3s", x)
		}
	})
}

func TestIdleTimeoutAndHeartbeats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// No heartbeat for 10 minutes: the client gives up on the silent
		// connection after its IdleTimeout and resumes.
		s := newServer(t, serverConfig{pipe: true, handler: func(h *eventbus.Handler) { h.Heartbeat = 10 * time.Minute }})
		c, rc := pipeClient(s, "a")
		c.IdleTimeout = 30 * time.Second
		start(t, c)
		rc.wait(t, "open", time.Minute, func() bool { return len(rc.openedAt()) == 1 })
		s.publish("a", "note", nil)
		rc.wait(t, "a second connection", 2*time.Minute, func() bool { return len(rc.openedAt()) == 2 })
		if !errors.Is(rc.snap().errs[0], sseclient.ErrIdleTimeout) {
			t.Fatalf("errors %v", rc.snap().errs)
		}
		if got := rc.snap().stamps[len(rc.snap().stamps)-1].Sub(rc.snap().openedAt()[0]); got < 30*time.Second {
			t.Fatalf("reconnected after %v", got)
		}
		s.publish("a", "note", nil)
		rc.wait(t, "resumed", time.Minute, func() bool { return len(rc.events) == 2 })
		wantIDs(t, rc.snap().ids(), seq(1, 2))
	})
	synctest.Test(t, func(t *testing.T) {
		s := newServer(t, serverConfig{pipe: true, handler: func(h *eventbus.Handler) { h.Heartbeat = 10 * time.Second }})
		c, rc := pipeClient(s, "a")
		c.IdleTimeout = 30 * time.Second
		start(t, c)
		time.Sleep(5 * time.Minute)
		if n := len(rc.snap().openedAt()); n != 1 || len(rc.snap().errs) != 0 {
			t.Fatalf("%d connections, errors %v: heartbeats must keep it", n, rc.snap().errs)
		}
	})
}

// endWith ends session id's streams with a stream_error frame of kind.
func endWith(s *server, id, kind string) {
	s.cut(id, eventbus.StreamErrorFrame("the stream ends ("+kind+")", kind).AppendSSE(nil))
}

func TestReauthenticateGetsFreshCredentialsAndResumesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newServer(t, serverConfig{pipe: true, handler: func(h *eventbus.Handler) { h.Retry = 10 * time.Second }})
		var tokens []string
		s.before = func(w http.ResponseWriter, r *http.Request) bool {
			tokens = append(tokens, r.Header.Get("Authorization")+" "+r.URL.Query().Get("lastEventId"))
			return true
		}
		c, rc := pipeClient(s, "a")
		var reasons []sseclient.CredentialsReason
		c.Credentials = func(_ context.Context, reason sseclient.CredentialsReason) (sseclient.Credentials, error) {
			reasons = append(reasons, reason)
			return sseclient.Credentials{Token: fmt.Sprint("t", len(reasons)), Header: http.Header{"X-Tenant": {"acme"}}}, nil
		}
		start(t, c)
		rc.wait(t, "open", time.Minute, func() bool { return len(rc.openedAt()) == 1 })
		s.publish("a", "note", nil)
		s.publish("a", "note", nil)
		rc.wait(t, "2 events", time.Minute, func() bool { return len(rc.events) == 2 })
		time.Sleep(2 * time.Second) // a stream lifetime, not a server asking in a loop
		endWith(s, "a", "reauthenticate")
		rc.wait(t, "reopened", time.Minute, func() bool { return len(rc.openedAt()) == 2 })
		if d := rc.snap().delays(); len(d) != 1 || d[0] != 0 {
			t.Fatalf("delays %v, want one immediate reconnect", d)
		}
		var se *sseclient.StreamError
		if !errors.As(rc.snap().errs[0], &se) || se.Kind != "reauthenticate" {
			t.Fatalf("errors %v", rc.snap().errs)
		}
		if fmt.Sprint(reasons) != "[initial reauthenticate]" || fmt.Sprint(tokens) != "[Bearer t1  Bearer t2 2]" {
			t.Fatalf("reasons %v, requests %q", reasons, tokens)
		}
		// A server that asks again right away gets the backoff, not a loop.
		endWith(s, "a", "reauthenticate")
		rc.wait(t, "third", time.Minute, func() bool { return len(rc.openedAt()) == 3 })
		v := rc.snap()
		if d := v.delays(); len(d) != 2 || d[1] == 0 || !v.openedAt()[2].Equal(v.openedAt()[1].Add(d[1])) {
			t.Fatalf("delays %v: a quick second re-authentication must back off", d)
		}
	})
}

func TestRevokedThenForbiddenIsFinal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newServer(t, serverConfig{pipe: true})
		revoked := false
		s.before = func(w http.ResponseWriter, r *http.Request) bool {
			if revoked {
				http.Error(w, `{"error":"no","code":"forbidden"}`, http.StatusForbidden)
				return false
			}
			return true
		}
		c, rc := pipeClient(s, "a")
		var reasons []sseclient.CredentialsReason
		c.Credentials = func(_ context.Context, reason sseclient.CredentialsReason) (sseclient.Credentials, error) {
			reasons = append(reasons, reason)
			return sseclient.Credentials{Token: string(reason)}, nil
		}
		done := make(chan error, 1)
		go func() { done <- c.Run(context.Background()) }()
		rc.wait(t, "open", time.Minute, func() bool { return len(rc.openedAt()) == 1 })
		revoked = true
		endWith(s, "a", "revoked")
		err := <-done
		var he *sseclient.HTTPError
		if !errors.As(err, &he) || he.StatusCode != 403 {
			t.Fatalf("Run returned %v", err)
		}
		if fmt.Sprint(reasons) != "[initial revoked]" {
			t.Fatalf("reasons %v", reasons)
		}
	})
}

func TestUnauthorizedAsksOnceAndForbiddenRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newServer(t, serverConfig{pipe: true})
		s.before = func(w http.ResponseWriter, r *http.Request) bool {
			if r.Header.Get("Authorization") != "Bearer good" {
				http.Error(w, `{"error":"no","code":"unauthorized"}`, http.StatusUnauthorized)
				return false
			}
			return true
		}
		var reasons []sseclient.CredentialsReason
		creds := func(token string) func(context.Context, sseclient.CredentialsReason) (sseclient.Credentials, error) {
			return func(_ context.Context, reason sseclient.CredentialsReason) (sseclient.Credentials, error) {
				reasons = append(reasons, reason)
				return sseclient.Credentials{Token: token}, nil
			}
		}
		c, _ := pipeClient(s, "a")
		c.Credentials = creds("bad")
		var he *sseclient.HTTPError
		if err := c.Run(context.Background()); !errors.As(err, &he) || he.StatusCode != 401 {
			t.Fatalf("Run returned %v", err)
		}
		if fmt.Sprint(reasons) != "[initial unauthorized]" {
			t.Fatalf("reasons %v", reasons)
		}

		reasons = nil
		c2, rc := pipeClient(s, "a")
		c2.Credentials = func(_ context.Context, reason sseclient.CredentialsReason) (sseclient.Credentials, error) {
			reasons = append(reasons, reason)
			if reason == sseclient.ReasonInitial {
				return sseclient.Credentials{Token: "stale"}, nil
			}
			return sseclient.Credentials{Token: "good"}, nil
		}
		start(t, c2)
		rc.wait(t, "open", time.Minute, func() bool { return len(rc.openedAt()) == 1 })

		c3, _ := pipeClient(s, "a")
		c3.Credentials = func(context.Context, sseclient.CredentialsReason) (sseclient.Credentials, error) {
			return sseclient.Credentials{}, errors.New("logged out")
		}
		if err := c3.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "logged out") {
			t.Fatalf("a failing Credentials: %v", err)
		}
	})
}

func TestUnavailableAndInternalBackOffAndResume(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newServer(t, serverConfig{pipe: true, handler: func(h *eventbus.Handler) { h.Retry = time.Second }})
		c, rc := pipeClient(s, "a")
		start(t, c)
		rc.wait(t, "open", time.Minute, func() bool { return len(rc.openedAt()) == 1 })
		s.publish("a", "note", nil)
		rc.wait(t, "1", time.Minute, func() bool { return len(rc.events) == 1 })
		endWith(s, "a", "unavailable")
		s.publish("a", "note", nil)
		rc.wait(t, "2", time.Minute, func() bool { return len(rc.events) == 2 && len(rc.openedAt()) == 2 })
		endWith(s, "a", "internal")
		rc.wait(t, "reopened", time.Minute, func() bool { return len(rc.openedAt()) == 3 })
		s.publish("a", "note", nil)
		rc.wait(t, "3", time.Minute, func() bool { return len(rc.events) == 3 })
		wantIDs(t, rc.snap().ids(), seq(1, 3))
		var kinds []string
		for _, err := range rc.snap().errs {
			var se *sseclient.StreamError
			if errors.As(err, &se) {
				kinds = append(kinds, se.Kind)
			}
		}
		if fmt.Sprint(kinds) != "[unavailable internal]" {
			t.Fatalf("errors %v", rc.snap().errs)
		}
		// Two short connections in a row that ended in errors: the caps are
		// retry: (1 s), then 2 s.
		d := rc.snap().delays()
		if len(d) != 2 || d[0] >= time.Second || d[1] >= 2*time.Second {
			t.Fatalf("delays %v", d)
		}
	})
}

func TestCancelWhileWaitingReturnsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newServer(t, serverConfig{pipe: true})
		s.before = func(w http.ResponseWriter, r *http.Request) bool {
			w.Header().Set("Retry-After", "3600")
			http.Error(w, "{}", http.StatusServiceUnavailable)
			return false
		}
		c, rc := pipeClient(s, "a")
		stop := start(t, c)
		rc.wait(t, "the 503", time.Minute, func() bool { return len(rc.errs) == 1 })
		t0 := time.Now()
		if err := stop(); !errors.Is(err, context.Canceled) {
			t.Fatalf("Run returned %v", err)
		}
		if time.Since(t0) != 0 {
			t.Fatalf("Run took %v to return", time.Since(t0))
		}
	})
}

// scripted serves each request with the next of a list of raw streams
// (the last one repeats), with Event-Epoch epoch; it records the cursors.
func scripted(s *server, epoch string, streams ...string) *[]string {
	var cursors []string
	n := 0
	s.before = func(w http.ResponseWriter, r *http.Request) bool {
		cursors = append(cursors, r.URL.Query().Get("lastEventId")+"@"+r.URL.Query().Get("epoch"))
		body := streams[min(n, len(streams)-1)]
		n++
		w.Header().Set("Content-Type", "text/event-stream")
		if epoch != "" {
			w.Header().Set("Event-Epoch", epoch)
		}
		w.Write([]byte("retry: 100\n\n" + body))
		if n < len(streams) {
			return false
		}
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
		return false
	}
	return &cursors
}

func ev(id uint64, idLine string) string {
	if idLine == "" {
		idLine = fmt.Sprint(id)
	}
	return fmt.Sprintf("id: %s\nevent: note\ndata: {\"id\":%d,\"v\":1,\"type\":\"note\"}\n\n", idLine, id)
}

func syn(typ, data string) string {
	return fmt.Sprintf("event: %s\ndata: {\"v\":1,\"type\":%q,\"data\":%s}\n\n", typ, typ, data)
}

var (
	epochA = strings.Repeat("a", 32)
	epochB = strings.Repeat("b", 32)
)

func TestEpochIDsGoBackInTheSameForm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newServer(t, serverConfig{pipe: true})
		cursors := scripted(s, epochA,
			ev(1, epochA+":1")+ev(2, epochA+":2"),
			syn("replay_complete", `{"replayedCount":0,"epoch":"`+epochA+`"}`)+ev(3, epochA+":3"))
		c, rc := pipeClient(s, "a")
		start(t, c)
		rc.wait(t, "3 events", time.Minute, func() bool { return len(rc.events) == 3 })
		if got := (*cursors)[1]; got != epochA+":2@"+epochA {
			t.Fatalf("resumed with %s", got)
		}
		for _, e := range rc.snap().events {
			if e.Epoch != epochA {
				t.Fatalf("event %+v", e)
			}
		}
	})
}

func TestDuplicatesAreDroppedByID(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newServer(t, serverConfig{pipe: true})
		// A server that ignores the cursor and starts from 1 every time.
		scripted(s, epochA, ev(1, "")+ev(2, ""), ev(1, "")+ev(2, "")+ev(3, ""), ev(1, "")+ev(2, "")+ev(3, "")+ev(4, ""))
		c, rc := pipeClient(s, "a")
		start(t, c)
		rc.wait(t, "4 events", time.Minute, func() bool { return len(rc.events) == 4 })
		time.Sleep(time.Second)
		wantIDs(t, rc.snap().ids(), seq(1, 4))
	})
}

func TestANewEpochWithoutEpochResetIsReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newServer(t, serverConfig{pipe: true})
		// A server that ignores the epoch it is sent and joins numerically.
		cursors := scripted(s, epochB, ev(8, "")+ev(9, ""))
		c, rc := pipeClient(s, "a")
		c.Resume, c.LastEventID, c.Epoch = true, 7, epochA
		start(t, c)
		rc.wait(t, "2 events", time.Minute, func() bool { return len(rc.events) == 2 })
		want := sseclient.Resync{Reason: "epoch_reset", Detail: "epoch_changed", LastDeliveredID: 7, EarliestAvailableID: 8, Epoch: epochB, PreviousEpoch: epochA, Missing: sseclient.IDRange{From: 1, To: 7}}
		if len(rc.snap().resyncs) != 1 || rc.snap().resyncs[0] != want {
			t.Fatalf("resyncs %+v", rc.snap().resyncs)
		}
		if (*cursors)[0] != "7@"+epochA || rc.snap().events[0].Epoch != epochB {
			t.Fatalf("cursor %s, events %+v", (*cursors)[0], rc.snap().events)
		}
	})
}

func TestOverflowResyncRangeAndReplayBudgetCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newServer(t, serverConfig{pipe: true})
		cursors := scripted(s, epochA,
			ev(1, "")+ev(2, "")+ev(3, "")+
				// The server's lastDeliveredId (1) is behind what the client holds (3).
				syn("state_resync_required", `{"reason":"queue_overflow","lastDeliveredId":1,"earliestAvailableId":6,"epoch":"`+epochA+`"}`)+
				ev(6, "")+
				// A resync whose range the client already holds is not reported.
				syn("state_resync_required", `{"reason":"queue_overflow","lastDeliveredId":0,"earliestAvailableId":7,"epoch":"`+epochA+`"}`)+
				ev(7, "")+ev(8, "")+
				syn("state_resync_required", `{"reason":"replay_budget_exceeded","lastDeliveredId":8,"earliestAvailableId":9,"epoch":"`+epochA+`"}`)+
				syn("replay_complete", `{"replayedCount":3,"lastReplayedEventId":8,"lastEventId":8,"epoch":"`+epochA+`"}`)+
				ev(20, ""), // live, past what was not replayed: never delivered
			ev(9, "")+ev(10, "")+syn("replay_complete", `{"replayedCount":2,"lastReplayedEventId":10,"lastEventId":10,"epoch":"`+epochA+`"}`))
		c, rc := pipeClient(s, "a")
		c.Resume = true
		start(t, c)
		rc.wait(t, "caught up", time.Minute, func() bool { return len(rc.caught) == 1 })
		wantIDs(t, rc.snap().ids(), []uint64{1, 2, 3, 6, 7, 8, 9, 10})
		if len(rc.snap().resyncs) != 1 || rc.snap().resyncs[0].Missing != (sseclient.IDRange{From: 4, To: 5}) {
			t.Fatalf("resyncs %+v", rc.snap().resyncs)
		}
		if (*cursors)[1] != "8@"+epochA || rc.snap().delays()[0] != 0 || rc.snap().caught[0].ReplayedCount != 2 {
			t.Fatalf("cursors %v delays %v caught %+v", *cursors, rc.snap().delays(), rc.snap().caught)
		}
	})
}
