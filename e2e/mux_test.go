package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/ssebus/eventbus/internal/daemontest"
)

// Issue 25 in Chromium over HTTP/1.1: a browser opens at most 6
// connections per host, so a page with 10 single EventSources hangs its
// POSTs; the viewer watching 10 sessions on one multiplexed connection
// does not, and after a kill -9 of the daemon every session reports
// epoch_reset and resumes.

// muxColumn is one session's column of the viewer in its many-sessions
// mode (window.mux.sessions[id]).
type muxColumn struct {
	SeenIDs      []uint64 `json:"seenIds"`
	Epoch        *string  `json:"epoch"`
	EpochChanges int      `json:"epochChanges"`
	Resyncs      int      `json:"resyncs"`
	CaughtUp     int      `json:"caughtUp"`
	Gone         *string  `json:"gone"`
}

// muxViewer is the viewer's window.mux, with its connection attempts.
type muxViewer struct {
	ConnState string               `json:"connState"`
	Connects  int                  `json:"connects"`
	Sessions  map[string]muxColumn `json:"sessions"`
	Attempts  []viewerAttempt      `json:"attempts"`
}

func readMuxViewer(ctx context.Context, t *testing.T) muxViewer {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[muxViewer](`({...window.mux, attempts: window.attempts})`))
	if err != nil {
		t.Fatalf("reading the viewer: %v", err)
	}
	return v
}

func (v muxViewer) summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "conn=%s connects=%d", v.ConnState, v.Connects)
	for id, c := range v.Sessions {
		fmt.Fprintf(&b, " %s:%v/r%d/e%d", id, c.SeenIDs, c.Resyncs, c.EpochChanges)
	}
	return b.String()
}

// postFromPage POSTs a note to session from the page in tab, giving up
// after timeout; it returns the answer's status (0: no answer in time) and
// how long it took.
func postFromPage(t *testing.T, tab context.Context, session string, timeout time.Duration) (int, time.Duration) {
	t.Helper()
	type answer struct {
		Status int     `json:"status"`
		MS     float64 `json:"ms"`
	}
	a, err := chromedp.Run(tab, chromedp.Evaluate[answer](fmt.Sprintf(`(async () => {
		const t0 = performance.now();
		try {
			const r = await fetch("/session/%s/events", {method: "POST", headers: {"Content-Type": "application/json"},
				body: JSON.stringify({type: "note", data: {from: "page"}}), signal: AbortSignal.timeout(%d)});
			await r.text();
			return {status: r.status, ms: performance.now() - t0};
		} catch (e) {
			return {status: 0, ms: performance.now() - t0};
		}
	})()`, session, timeout.Milliseconds()), chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("POST from the page: %v", err)
	}
	return a.Status, time.Duration(a.MS * float64(time.Millisecond))
}

func TestViewerTenSessionsOnOneConnection(t *testing.T) {
	chromium := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bin := daemontest.Build(ctx, t, "..", raceEnabled)
	addr := daemontest.FreeAddr(t)
	d := daemontest.Start(ctx, t, bin, "-addr", addr, "-retry", "500ms")
	if !strings.HasPrefix(d.Base, "http://") {
		t.Fatalf("the daemon serves %s: this test is about HTTP/1.1", d.Base)
	}
	ids := make([]string, 10)
	for i := range ids {
		ids[i] = fmt.Sprintf("s%d", i)
		d.Publish(ids[i], 1)
	}
	br := newBrowser(ctx, t, chromium)

	// The control: 10 single EventSources on a page of the daemon's origin
	// take its 6 connections (HTTP/1.1, no h2 without TLS), and a POST
	// from the page waits for a seventh that never comes.
	control, closeControl := chromedp.NewContext(br.ctx)
	if err := chromedp.Do(control, chromedp.Navigate(d.Base+"/session/s0")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(control, chromedp.Evaluate[int](`(window.es = Array.from({length: 10}, (_, i) => new EventSource("/session/s" + i + "/events"))).length`)); err != nil {
		t.Fatal(err)
	}
	daemontest.WaitUntil(t, 20*time.Second, "6 streams open", func() (bool, string) {
		open := 0
		for _, id := range ids {
			open += d.Status(id).Subscribers
		}
		return open == 6, fmt.Sprint(open, " streams")
	})
	if status, took := postFromPage(t, control, "s0", 3*time.Second); status != 0 {
		t.Fatalf("with 10 single EventSources a POST from the page answered %d in %v: the 6-connection limit did not bite", status, took)
	}
	if _, err := chromedp.Run(control, chromedp.Evaluate[int](`(window.es.forEach((e) => e.close()), 0)`)); err != nil {
		t.Fatal(err)
	}
	closeControl()
	daemontest.WaitUntil(t, 20*time.Second, "the control's streams closed", func() (bool, string) {
		open := 0
		for _, id := range ids {
			open += d.Status(id).Subscribers
		}
		return open == 0, fmt.Sprint(open, " streams")
	})

	// The viewer on the 10 sessions: one connection.
	tab := openViewer(t, br, d.Base, "sessions="+strings.Join(ids, ","))
	daemontest.WaitUntil(t, 20*time.Second, "the viewer's stream", func() (bool, string) {
		v := readMuxViewer(tab, t)
		subscribed := 0
		for _, id := range ids {
			subscribed += d.Status(id).Subscribers
		}
		return v.ConnState == "open" && subscribed == len(ids), v.summary()
	})
	for i, id := range ids {
		d.Publish(id, 10+i) // id 2 of each
	}
	// A new page asks for every session from the start of its ring
	// (?lastEventId=0): id 1, published before the page, then id 2 live.
	daemontest.WaitUntil(t, 20*time.Second, "the history and an event in every column", func() (bool, string) {
		v := readMuxViewer(tab, t)
		for _, id := range ids {
			if c := v.Sessions[id]; !slices.Equal(c.SeenIDs, []uint64{1, 2}) || c.CaughtUp != 1 {
				return false, v.summary()
			}
		}
		return true, v.summary()
	})
	v := readMuxViewer(tab, t)
	if len(v.Attempts) != 1 || v.Connects != 1 || v.Attempts[0].LastEventID != "0" {
		t.Fatalf("attempts %+v, connects %d: want one stream, from the start (lastEventId 0)", v.Attempts, v.Connects)
	}
	for _, id := range ids {
		if st := d.Status(id); st.Streams != 1 || st.Subscribers != 1 {
			t.Fatalf("%s: %+v, want the one stream", id, st)
		}
	}
	status, took := postFromPage(t, tab, "s3", 10*time.Second)
	if status != 200 {
		t.Fatalf("a POST from the page watching 10 sessions: status %d after %v", status, took)
	}
	t.Logf("a POST from the page watching 10 sessions on one connection answered in %v", took)
	daemontest.WaitUntil(t, 20*time.Second, "the page's own event", func() (bool, string) {
		v := readMuxViewer(tab, t)
		return slices.Equal(v.Sessions["s3"].SeenIDs, []uint64{1, 2, 3}), v.summary()
	})
	old := map[string]string{}
	for _, id := range ids {
		old[id] = d.Status(id).Epoch
	}
	screenshot(tab, t, "viewer-ten-sessions.png")

	// A kill -9 and a restart on the same address: new epochs for every
	// session (the restarted daemon's -create-on-stream makes them on the
	// client's GET; a publish makes s1 and s2 first), each column says
	// epoch_reset and goes on from its new epoch.
	d.Kill()
	d = daemontest.Start(ctx, t, bin, "-addr", addr, "-retry", "500ms")
	d.Publish("s1", 1)
	d.Publish("s2", 1)
	daemontest.WaitUntil(t, 60*time.Second, "epoch_reset in every column", func() (bool, string) {
		v := readMuxViewer(tab, t)
		for _, id := range ids {
			if c := v.Sessions[id]; c.EpochChanges != 1 || c.CaughtUp == 0 {
				return false, v.summary()
			}
		}
		return v.ConnState == "open", v.summary()
	})
	for i, id := range ids {
		d.Publish(id, 100+i)
	}
	daemontest.WaitUntil(t, 20*time.Second, "the new epoch's events", func() (bool, string) {
		v := readMuxViewer(tab, t)
		for _, id := range ids {
			want := []uint64{1}
			if id == "s1" || id == "s2" {
				want = []uint64{1, 2}
			}
			if !slices.Equal(v.Sessions[id].SeenIDs, want) {
				return false, v.summary()
			}
		}
		return true, v.summary()
	})
	v = readMuxViewer(tab, t)
	for _, id := range ids {
		c := v.Sessions[id]
		if c.Epoch == nil || *c.Epoch == old[id] || *c.Epoch != d.Status(id).Epoch || c.Gone != nil {
			t.Fatalf("%s after the restart: %+v (old epoch %s, daemon %s)", id, c, old[id], d.Status(id).Epoch)
		}
	}
	if last := v.Attempts[len(v.Attempts)-1]; !strings.HasPrefix(last.LastEventID, "m1") || len(last.LastEventID) != 2+24*len(ids) {
		t.Fatalf("the last attempt resumed from %q: want the composite cursor of the %d sessions", last.LastEventID, len(ids))
	}

	// The list in the page: a DELETE greys a column out (the stream goes on
	// for the others), × removes one from the stream, Add adds one.
	d.Call("DELETE", "/session/s8", "", 204, nil)
	d.Publish("s0", 2)
	daemontest.WaitUntil(t, 20*time.Second, "s8 gone, s0 goes on", func() (bool, string) {
		v := readMuxViewer(tab, t)
		gone := v.Sessions["s8"].Gone
		return gone != nil && *gone == "closed" && len(v.Sessions["s0"].SeenIDs) == 2 && v.Connects == 2, v.summary()
	})
	if err := chromedp.Do(tab, chromedp.Click(`.col[data-session="s9"] button.remove`)); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(tab, chromedp.SendKeys("#newSession", "s10\n")); err != nil {
		t.Fatal(err)
	}
	daemontest.WaitUntil(t, 20*time.Second, "s9 removed and s10 added", func() (bool, string) {
		v := readMuxViewer(tab, t)
		_, has9 := v.Sessions["s9"]
		_, has10 := v.Sessions["s10"]
		st, ok := d.StatusIfAny("s10")
		return !has9 && has10 && ok && st.Subscribers == 1 && d.Status("s9").Subscribers == 0 && v.ConnState == "open", v.summary()
	})
	d.Publish("s10", 1)
	d.Publish("s1", 3)
	daemontest.WaitUntil(t, 20*time.Second, "s10's event", func() (bool, string) {
		v := readMuxViewer(tab, t)
		return slices.Equal(v.Sessions["s10"].SeenIDs, []uint64{1}) && slices.Equal(v.Sessions["s1"].SeenIDs, []uint64{1, 2, 3}), v.summary()
	})
	screenshot(tab, t, "viewer-ten-sessions-after-restart.png")
	if errs := br.consoleErrors(); len(errs) > 0 {
		t.Logf("console errors (the daemon was down): %v", errs)
	}
}
