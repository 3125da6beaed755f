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
	"github.com/ssebus/eventbus/backplane"
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
		// The Handler's own answers to what Authorize returns: a 503 with
		// Retry-After (Unavailable), a 500 for a plain error, and other 5xx
		// from StatusErrors.
		n := 0
		s := newServer(t, serverConfig{pipe: true, handler: func(h *eventbus.Handler) {
			h.Retry = 3 * time.Second
			h.Authorize = func(r *http.Request, _ string, _ *eventbus.EventBus) (eventbus.Grant, error) {
				n++
				switch n {
				case 1:
					return eventbus.Grant{}, eventbus.Unavailable(2*time.Second, "the identity provider is down")
				case 2:
					return eventbus.Grant{}, errors.New("boom")
				case 3:
					return eventbus.Grant{}, &eventbus.StatusError{Status: http.StatusBadGateway, Code: "bad_gateway"}
				case 4:
					return eventbus.Grant{}, &eventbus.StatusError{Status: http.StatusGatewayTimeout}
				}
				return eventbus.Grant{}, nil
			}
		}})
		c, rc := pipeClient(s, "a")
		start(t, c)
		rc.wait(t, "open", time.Minute, func() bool { return len(rc.openedAt()) == 1 })
		var codes []string
		for _, err := range rc.snap().errs {
			var he *sseclient.HTTPError
			if errors.As(err, &he) {
				codes = append(codes, fmt.Sprint(he.StatusCode, " ", he.Code, " ", he.RetryAfter))
			}
		}
		if fmt.Sprint(codes) != "[503 unavailable 2s 500 internal 0s 502 bad_gateway 0s 504 gateway_timeout 0s]" {
			t.Fatalf("answers %v", codes)
		}
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

func TestUnavailableAndInternalBackOffAndResume(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newServer(t, serverConfig{pipe: true, handler: func(h *eventbus.Handler) { h.Retry = time.Second }})
		c, rc := pipeClient(s, "a")
		start(t, c)
		rc.wait(t, "open", time.Minute, func() bool { return len(rc.openedAt()) == 1 })
		s.publish("a", "note", nil)
		rc.wait(t, "1", time.Minute, func() bool { return len(rc.events) == 1 })
		// What a backplane's bus does when its engine stayed unreachable:
		// its streams end with stream_error unavailable. The session comes
		// back as a new bus, so a new epoch (an in-memory bus keeps none).
		old := s.bus("a")
		s.mu.Lock()
		delete(s.buses, "a")
		s.mu.Unlock()
		backplane.CloseWithError(old, eventbus.ErrorKindUnavailable, "the backplane is unreachable")
		rc.wait(t, "reopened", time.Minute, func() bool { return len(rc.openedAt()) == 2 && len(rc.resyncs) == 1 })
		s.publish("a", "note", nil)
		rc.wait(t, "the new bus's first event", time.Minute, func() bool { return len(rc.events) == 2 })
		// Nothing the Handler does on demand ends a stream with "internal"
		// (a panic, a subscription failing for a reason of its own): the
		// frame is written after the handler returns.
		s.cut("a", old.StreamErrorFrame("boom", eventbus.ErrorKindInternal).SSE())
		rc.wait(t, "reopened again", time.Minute, func() bool { return len(rc.openedAt()) == 3 })
		s.publish("a", "note", nil)
		rc.wait(t, "3", time.Minute, func() bool { return len(rc.events) == 3 })
		v := rc.snap()
		wantIDs(t, v.ids(), []uint64{1, 1, 2})
		if rs := v.resyncs[0]; rs.Reason != "epoch_reset" || rs.PreviousEpoch != old.Epoch() || rs.Epoch != s.bus("a").Epoch() {
			t.Fatalf("resync %+v", rs)
		}
		var kinds []string
		for _, err := range v.errs {
			var se *sseclient.StreamError
			if errors.As(err, &se) {
				kinds = append(kinds, se.Kind)
			}
		}
		if fmt.Sprint(kinds) != "[unavailable internal]" {
			t.Fatalf("errors %v", v.errs)
		}
		// Two short connections in a row that ended in errors: the caps are
		// retry: (1 s), then 2 s.
		d := v.delays()
		if len(d) != 2 || d[0] >= time.Second || d[1] >= 2*time.Second {
			t.Fatalf("delays %v", d)
		}
	})
}

func TestCancelWhileWaitingReturnsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newServer(t, serverConfig{pipe: true, handler: func(h *eventbus.Handler) {
			h.Authorize = func(*http.Request, string, *eventbus.EventBus) (eventbus.Grant, error) {
				return eventbus.Grant{}, eventbus.Unavailable(time.Hour, "down for maintenance")
			}
		}})
		c, rc := pipeClient(s, "a")
		stop := start(t, c)
		// OnError comes first, then the wait (OnState with its Delay).
		rc.wait(t, "the 503 and the wait", time.Minute, func() bool { return len(rc.errs) == 1 && len(rc.delays()) == 1 })
		var he *sseclient.HTTPError
		if !errors.As(rc.snap().errs[0], &he) || he.RetryAfter != time.Hour || rc.snap().delays()[0] < time.Hour {
			t.Fatalf("errors %v, delays %v", rc.snap().errs, rc.snap().delays())
		}
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
		c.ResumeFrom, c.ResumeEpoch = "7", epochA
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
		c.ResumeFrom = "0"
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
