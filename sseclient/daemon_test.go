package sseclient_test

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ssebus/eventbus/internal/daemontest"
	"github.com/ssebus/eventbus/sseclient"
)

// The client against the demo daemon, cmd/sessiond, as a process (issue
// 33): what it gets for a session that is gone after a restart (graceful
// or a kill -9) and after a DELETE, RetryNotFound resuming a session that
// a publish re-creates, a multiplexed stream from the start, AddSession
// and RemoveSession, error strings without the cursor.
//
// The daemon runs with -create-on-stream=false, as the README's daemon
// ("In twenty lines") does without the flag: a GET of an unknown session
// is 404 session_not_found, and only a POST (a publish) creates one.

// daemonClient is a Client of a daemon and what it reported.
type daemonClient struct {
	*muxRecorder
	c    *sseclient.Client
	stop func() error
}

// runDaemonClient starts c (with a transport of its own, closed at the
// end) and records everything it reports.
func runDaemonClient(t *testing.T, c *sseclient.Client) *daemonClient {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c.HTTPClient = &http.Client{Transport: tr}
	rc := &muxRecorder{recorder: newRecorder()}
	c.OnSessionGone = func(g sseclient.SessionGone) {
		rc.mu.Lock()
		rc.gone = append(rc.gone, g)
		rc.mu.Unlock()
		rc.note()
	}
	rc.attach(c)
	return &daemonClient{muxRecorder: rc, c: c, stop: start(t, c)}
}

// final waits for Run's end and returns its error.
func (dc *daemonClient) final(t *testing.T, d time.Duration) error {
	t.Helper()
	dc.wait(t, "Run's end", d, func() bool { _, ok := dc.closedAt(); return ok })
	err, _ := dc.snap().closedAt()
	return err
}

func TestClientAgainstTheDaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs cmd/sessiond")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	bin := daemontest.Build(ctx, t, root, false)
	startAt := func(t *testing.T, addr string, args ...string) *daemontest.Daemon {
		t.Helper()
		return daemontest.Start(ctx, t, bin, append([]string{"-create-on-stream=false", "-addr", addr, "-retry", "100ms",
			"-shutdown-retry-after", "100ms"}, args...)...)
	}
	newClient := func(d *daemontest.Daemon, session string) *sseclient.Client {
		return &sseclient.Client{URL: d.Base + "/session/" + session + "/events", InitialDelay: 50 * time.Millisecond, MaxDelay: time.Second}
	}
	newMux := func(d *daemontest.Daemon, sessions ...string) *sseclient.Client {
		return &sseclient.Client{URL: d.Base + "/events", Sessions: sessions, InitialDelay: 50 * time.Millisecond, MaxDelay: time.Second}
	}
	open := func(t *testing.T, dcs ...*daemonClient) {
		t.Helper()
		for _, dc := range dcs {
			dc.wait(t, "open", 20*time.Second, func() bool { return dc.opens() >= 1 })
		}
	}
	restart := func(t *testing.T, d *daemontest.Daemon, graceful bool, addr string) *daemontest.Daemon {
		t.Helper()
		if graceful {
			d.Stop(10 * time.Second)
		} else {
			d.Kill()
		}
		return startAt(t, addr)
	}

	for _, graceful := range []bool{true, false} {
		how := map[bool]string{true: "SIGTERM", false: "kill -9"}[graceful]

		// The contract by default: after a restart a session nobody
		// re-created is 404 session_not_found; a single stream stops
		// with it (ErrSessionGone), a multiplexed one drops the session,
		// and with none left stops (ErrNoSessions).
		t.Run("restart/"+how+"/a 404 is final", func(t *testing.T) {
			addr := daemontest.FreeAddr(t)
			d := startAt(t, addr)
			d.Publish("s", 1)
			d.Publish("m1", 1)
			d.Publish("m2", 1)
			single := runDaemonClient(t, newClient(d, "s"))
			mux := runDaemonClient(t, newMux(d, "m1", "m2"))
			open(t, single, mux)
			d = restart(t, d, graceful, addr)
			err := single.final(t, 20*time.Second)
			he := new(sseclient.HTTPError)
			if !errors.Is(err, sseclient.ErrSessionGone) || !errors.As(err, &he) || he.StatusCode != 404 {
				t.Fatalf("the single stream ended with %v, want 404 session_not_found", err)
			}
			if err := mux.final(t, 20*time.Second); !errors.Is(err, sseclient.ErrNoSessions) {
				t.Fatalf("the multiplexed stream ended with %v, want ErrNoSessions", err)
			}
			gone := mux.goneSnap()
			if len(gone) != 2 || gone[0].Reason != "session_not_found" || gone[1].Reason != "session_not_found" || !errors.Is(gone[0].Err, sseclient.ErrSessionGone) {
				t.Fatalf("gone %+v, want m1 and m2, session_not_found", gone)
			}
			d.Stop(10 * time.Second)
		})

		// RetryNotFound: the client keeps asking for a bounded time; a
		// publish re-creates the session and it resumes: epoch_reset, the
		// new epoch from id 1, nothing silently joined.
		t.Run("restart/"+how+"/RetryNotFound resumes", func(t *testing.T) {
			addr := daemontest.FreeAddr(t)
			d := startAt(t, addr)
			d.Publish("s", 1)
			d.Publish("m1", 1)
			d.Publish("m2", 1)
			sc := newClient(d, "s")
			sc.RetryNotFound = time.Minute
			mc := newMux(d, "m1", "m2")
			mc.RetryNotFound = time.Minute
			single, mux := runDaemonClient(t, sc), runDaemonClient(t, mc)
			open(t, single, mux)
			d.Publish("s", 2)
			d.Publish("m1", 2)
			single.wait(t, "s#2", 10*time.Second, func() bool { return len(single.events) == 1 })
			mux.wait(t, "m1#2", 10*time.Second, func() bool { return len(mux.events) == 1 })
			old := d.Status("s").Epoch
			d = restart(t, d, graceful, addr)
			for _, dc := range []*daemonClient{single, mux} {
				dc.wait(t, "a 404", 20*time.Second, func() bool {
					return countOf(dc.errs, func(err error) bool { return errors.Is(err, sseclient.ErrSessionGone) }) > 0
				})
			}
			d.Publish("s", 1)
			d.Publish("m1", 1)
			d.Publish("m2", 1)
			single.wait(t, "the new epoch's s#1", 20*time.Second, func() bool {
				return len(single.resyncs) == 1 && len(single.events) > 0 && single.events[len(single.events)-1].Epoch != old
			})
			mux.wait(t, "m1#1 and m2#1 of the new epochs", 20*time.Second, func() bool { return len(mux.resyncs) == 2 && len(mux.events) == 3 })
			if rs := single.snap().resyncs[0]; rs.Reason != "epoch_reset" || rs.PreviousEpoch != old || rs.Epoch != d.Status("s").Epoch {
				t.Fatalf("resync %+v, want epoch_reset from %s", rs, old)
			}
			if e := single.snap().events; e[len(e)-1].ID != 1 {
				t.Fatalf("events %+v", e)
			}
			for _, rs := range mux.snap().resyncs {
				if rs.Reason != "epoch_reset" {
					t.Fatalf("resync %+v", rs)
				}
			}
			if len(mux.goneSnap()) != 0 {
				t.Fatalf("gone %+v", mux.goneSnap())
			}
			if at := single.c.LastEventID(); at != d.Status("s").Epoch+":1" {
				t.Fatalf("LastEventID %q", at)
			}
			d.Stop(10 * time.Second)
		})
	}

	// A DELETE while streaming: the single stream says stream_error
	// closed and the client stops at once, never reconnecting; on a
	// multiplexed stream that session is dropped and the others go on.
	t.Run("delete", func(t *testing.T) {
		d := startAt(t, "127.0.0.1:0")
		d.Publish("s", 1)
		d.Publish("x", 1)
		d.Publish("y", 1)
		single := runDaemonClient(t, newClient(d, "s"))
		mux := runDaemonClient(t, newMux(d, "x", "y"))
		open(t, single, mux)
		d.Call(http.MethodDelete, "/session/s", "", http.StatusNoContent, nil)
		err := single.final(t, 10*time.Second)
		var se *sseclient.StreamError
		if !errors.Is(err, sseclient.ErrSessionGone) || !errors.As(err, &se) || se.Kind != "closed" {
			t.Fatalf("the single stream ended with %v, want stream_error closed", err)
		}
		if got := single.snap(); got.opens() != 1 || len(got.errs) != 0 || len(got.delays()) != 0 {
			t.Fatalf("%d opens, errors %v, waits %v: the end is final at once", got.opens(), got.errs, got.delays())
		}
		d.Call(http.MethodDelete, "/session/x", "", http.StatusNoContent, nil)
		mux.wait(t, "x gone", 10*time.Second, func() bool { return len(mux.gone) == 1 })
		if g := mux.goneSnap()[0]; g.Session != "x" || g.Reason != "closed" || !errors.Is(g.Err, sseclient.ErrSessionGone) {
			t.Fatalf("gone %+v", g)
		}
		d.Publish("y", 2)
		mux.wait(t, "y#2 on the same stream", 10*time.Second, func() bool { return len(mux.events) == 1 })
		if got := mux.snap(); got.opens() != 1 || got.events[0].Session != "y" {
			t.Fatalf("%d opens, events %+v", got.opens(), got.events)
		}
		d.Stop(10 * time.Second)
	})

	// "0": the single stream and every session of a multiplexed one from
	// the start of its ring (an empty one, created by the stream here,
	// included), each with its own replay_complete.
	t.Run("from the start", func(t *testing.T) {
		d := startAt(t, "127.0.0.1:0", "-create-on-stream")
		for i := range 3 {
			d.Publish("a", i)
		}
		d.Publish("b", 1)
		sc := newClient(d, "a")
		sc.ResumeFrom = "0"
		mc := newMux(d, "a", "b", "empty")
		mc.ResumeFrom = "0"
		single, mux := runDaemonClient(t, sc), runDaemonClient(t, mc)
		single.wait(t, "a's ring", 10*time.Second, func() bool { return len(single.events) == 3 && len(single.caught) == 1 })
		mux.wait(t, "every ring", 10*time.Second, func() bool { return len(mux.events) == 4 && len(mux.caught) == 3 })
		by := bySession(mux.snap().events)
		if !slices.Equal(by["a"], []uint64{1, 2, 3}) || !slices.Equal(by["b"], []uint64{1}) {
			t.Fatalf("events %v", by)
		}
		for _, x := range mux.snap().caught {
			if want := map[string]int{"a": 3, "b": 1, "empty": 0}[x.Session]; x.ReplayedCount != want {
				t.Fatalf("caught up %+v, want %d replayed", x, want)
			}
		}
		if at := single.c.LastEventID(); at != d.Status("a").Epoch+":3" {
			t.Fatalf("LastEventID %q", at)
		}
		if len(mux.c.LastEventID()) != 2+24*3 {
			t.Fatalf("LastEventID %q: the cursor of 3 sessions", mux.c.LastEventID())
		}
		// A cut: every session resumes from its position (empty from 0).
		d.Call(http.MethodPost, "/session/empty/disconnect", "", http.StatusOK, nil)
		d.Publish("empty", 1)
		mux.wait(t, "empty#1", 10*time.Second, func() bool { return len(mux.events) == 5 })
		if got := mux.snap(); len(got.resyncs) != 0 || got.events[4].Session != "empty" || got.events[4].ID != 1 {
			t.Fatalf("events %+v resyncs %+v", got.events, got.resyncs)
		}
		d.Stop(10 * time.Second)
	})

	// AddSession and RemoveSession on a running client: the stream follows
	// at once, each session from its position.
	t.Run("add and remove sessions", func(t *testing.T) {
		d := startAt(t, "127.0.0.1:0")
		d.Publish("a", 1)
		d.Publish("b", 1)
		mux := runDaemonClient(t, newMux(d, "a"))
		open(t, mux)
		if err := mux.c.AddSession("b"); err != nil {
			t.Fatal(err)
		}
		mux.wait(t, "the stream of a and b", 10*time.Second, func() bool { return mux.opens() == 2 })
		daemontest.WaitUntil(t, 10*time.Second, "b streamed", func() (bool, string) { st := d.Status("b"); return st.Subscribers == 1, "" })
		d.Publish("b", 2)
		mux.wait(t, "b#2", 10*time.Second, func() bool { return len(mux.events) == 1 })
		if err := mux.c.RemoveSession("a"); err != nil {
			t.Fatal(err)
		}
		daemontest.WaitUntil(t, 10*time.Second, "a no longer streamed", func() (bool, string) { st := d.Status("a"); return st.Subscribers == 0, "" })
		d.Publish("a", 2)
		if err := mux.c.AddSession("a"); err != nil {
			t.Fatal(err)
		}
		mux.wait(t, "a#2 resumed", 10*time.Second, func() bool { return len(mux.events) == 2 })
		if got := mux.snap(); got.events[1].Session != "a" || got.events[1].ID != 2 || len(got.errs) != 0 {
			t.Fatalf("events %+v errors %v", got.events, got.errs)
		}
		d.Stop(10 * time.Second)
	})

	// While the daemon is down, the errors reported name the stream
	// without its query: no cursor in logs.
	t.Run("error strings", func(t *testing.T) {
		addr := daemontest.FreeAddr(t)
		d := startAt(t, addr)
		d.Publish("s", 1)
		c := newClient(d, "s")
		c.ResumeFrom = "0"
		dc := runDaemonClient(t, c)
		dc.wait(t, "s#1", 10*time.Second, func() bool { return len(dc.events) == 1 })
		d.Kill()
		dc.wait(t, "two failed attempts", 10*time.Second, func() bool { return len(dc.errs) >= 3 })
		for _, err := range dc.snap().errs {
			if s := err.Error(); strings.Contains(s, "lastEventId") || strings.Contains(s, "epoch=") {
				t.Fatalf("error %q names the cursor", s)
			}
		}
	})
}
