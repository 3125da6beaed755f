package sseclient_test

import (
	"errors"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
	"github.com/ssebus/eventbus/sseclient"
)

// A stream_error shutdown (issue 22, point 4) is a server going away: the
// client waits a random delay in [retryAfter, 2*retryAfter], capped, and
// resumes from its cursor, here on the "next replica": a mirror of the
// same epoch that goes on from the next id, so nothing is lost or resynced.
func TestShutdownReconnectsAfterRetryAfterAndResumes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newServer(t, serverConfig{pipe: true})
		var mu sync.Mutex
		var cursors []string // the lastEventId and epoch of every request
		s.before = func(w http.ResponseWriter, r *http.Request) bool {
			mu.Lock()
			cursors = append(cursors, r.URL.Query().Get("lastEventId")+"@"+r.URL.Query().Get("epoch"))
			mu.Unlock()
			return true
		}
		enc, err := backplane.NewEncoder(eventbus.Options{})
		if err != nil {
			t.Fatal(err)
		}
		first := s.bus("a")
		epoch := first.Epoch()
		c, rc := pipeClient(s, "a")
		start(t, c)
		rc.wait(t, "open", time.Minute, func() bool { return len(rc.openedAt()) == 1 })
		s.publish("a", "e", 1)

		const ra = 4 * time.Second
		const rounds = 8
		var delays []time.Duration
		for round := range rounds {
			id := uint64(round + 1)
			rc.wait(t, "the event", time.Minute, func() bool { return len(rc.events) == int(id) })
			// The next replica, where the load balancer sends the client.
			next, err := backplane.NewMirror(eventbus.Options{Logger: quietLogger()}, backplane.MirrorOptions{Epoch: epoch, NextID: id + 1})
			if err != nil {
				t.Fatal(err)
			}
			s.mu.Lock()
			old := s.buses["a"]
			s.buses["a"] = next
			s.mu.Unlock()
			ended := time.Now()
			old.CloseForShutdown(ra)
			rc.wait(t, "the reconnect", time.Minute, func() bool { return len(rc.openedAt()) == round+2 })
			snap := rc.snap()
			d := snap.openedAt()[round+1].Sub(ended)
			if d < ra || d > 2*ra {
				t.Fatalf("round %d: reconnected %v after the shutdown, want within [%v, %v]", round, d, ra, 2*ra)
			}
			if got := snap.delays()[round]; got != d {
				t.Fatalf("round %d: StateReconnecting's Delay %v, waited %v", round, got, d)
			}
			var se *sseclient.StreamError
			if !errors.As(snap.errs[len(snap.errs)-1], &se) || se.Kind != "shutdown" || se.RetryAfter != ra {
				t.Fatalf("round %d: reported %v, want a StreamError of kind shutdown with RetryAfter %v", round, snap.errs[len(snap.errs)-1], ra)
			}
			delays = append(delays, d)
			ev, err := enc.Encode(eventbus.Event{Type: "e", Data: id + 1})
			if err != nil {
				t.Fatal(err)
			}
			if err := backplane.Append(next, backplane.LogEntry{ID: id + 1, Type: "e", JSON: ev.Envelope(id + 1)}); err != nil {
				t.Fatal(err)
			}
		}
		rc.wait(t, "the last event", time.Minute, func() bool { return len(rc.events) == rounds+1 })
		snap := rc.snap()
		wantIDs(t, snap.ids(), seq(1, rounds+1))
		if len(snap.resyncs) != 0 {
			t.Fatalf("resyncs %+v: a resume on the next replica loses nothing", snap.resyncs)
		}
		mu.Lock()
		defer mu.Unlock()
		for i, cur := range cursors[1:] {
			if want := strconv.Itoa(i+1) + "@" + epoch; cur != want {
				t.Fatalf("reconnect %d resumed from %q, want %q", i+1, cur, want)
			}
		}
		spread := false
		for _, d := range delays[1:] {
			spread = spread || d != delays[0]
		}
		if !spread {
			t.Fatalf("every delay was %v: no jitter", delays[0])
		}
	})
}

// The hint is capped at MaxDelay/2, so the wait never passes MaxDelay; a
// shutdown frame without retryAfter (an older server's) means 2 s.
func TestShutdownRetryAfterCappedOrDefault(t *testing.T) {
	for _, c := range []struct {
		name     string
		maxDelay time.Duration
		end      func(s *server)
		lo, hi   time.Duration
	}{
		{"capped", 3 * time.Second, func(s *server) { s.bus("a").CloseForShutdown(time.Hour) }, 1500 * time.Millisecond, 3 * time.Second},
		{"absent", 0, func(s *server) {
			s.cut("a", []byte(`event: stream_error`+"\n"+`data: {"v":1,"type":"stream_error","data":{"error":"bye","errorKind":"shutdown"}}`+"\n\n"))
		}, 2 * time.Second, 4 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := newServer(t, serverConfig{pipe: true})
				c1, rc := pipeClient(s, "a")
				c1.MaxDelay = c.maxDelay
				start(t, c1)
				rc.wait(t, "open", time.Minute, func() bool { return len(rc.openedAt()) == 1 })
				s.publish("a", "e", 1)
				rc.wait(t, "the event", time.Minute, func() bool { return len(rc.events) == 1 })
				c.end(s)
				rc.wait(t, "the wait", time.Minute, func() bool { return len(rc.delays()) == 1 })
				if d := rc.snap().delays()[0]; d < c.lo || d > c.hi {
					t.Fatalf("waited %v, want within [%v, %v]", d, c.lo, c.hi)
				}
			})
		})
	}
}
