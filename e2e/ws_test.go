package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/ssebus/eventbus/internal/daemontest"
)

// Issue 34 in Chromium: the viewer watching several sessions reads them
// over the daemon's WebSocket (GET /ws) with the browser's own WebSocket,
// says so, resumes across a kill -9 and a restart (epoch_reset shown in
// every column, nothing joined silently), and falls back to SSE when the
// WebSocket cannot be opened (a proxy that refuses /ws), coming back to
// the WebSocket after ?wsRetry= with the same cursor: no event lost, none
// seen twice.

// wsViewer is what the viewer shows of its transport.
type wsViewer struct {
	ConnState  string               `json:"connState"`
	Connects   int                  `json:"connects"`
	Sessions   map[string]muxColumn `json:"sessions"`
	Attempts   []viewerAttempt      `json:"attempts"`
	Transport  *string              `json:"transport"`
	Transports []string             `json:"transports"`
	Shown      string               `json:"shown"`
	Errors     []struct {
		Kind string `json:"kind"`
	} `json:"errors"`
	Texts map[string][]string `json:"texts"`
	// Duplicates is the client's count of events it dropped as seen
	// already (stats.duplicates): 0 when every resume started exactly
	// where the last connection stopped.
	Duplicates int `json:"duplicates"`
}

func readWSViewer(ctx context.Context, t *testing.T) wsViewer {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[wsViewer](`({...window.mux, attempts: window.attempts,
		duplicates: window.muxClient?.stats.duplicates ?? -1,
		shown: document.getElementById("muxTransport").textContent,
		texts: Object.fromEntries([...document.querySelectorAll(".col")].map((c) => [c.dataset.session, [...c.querySelectorAll("li")].map((li) => li.textContent)]))})`))
	if err != nil {
		t.Fatalf("reading the viewer: %v", err)
	}
	return v
}

func (v wsViewer) summary() string {
	tr := "<nil>"
	if v.Transport != nil {
		tr = *v.Transport
	}
	m := muxViewer{ConnState: v.ConnState, Connects: v.Connects, Sessions: v.Sessions}
	return fmt.Sprintf("%s transport=%s shown=%q transports=%v", m.summary(), tr, v.Shown, v.Transports)
}

func (v wsViewer) on(transport string) bool {
	return v.ConnState == "open" && v.Transport != nil && *v.Transport == transport
}

func TestViewerWebSocketAcrossRestart(t *testing.T) {
	chromium := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := daemontest.Build(ctx, t, "..", raceEnabled)
	addr := daemontest.FreeAddr(t)
	d := daemontest.Start(ctx, t, bin, "-addr", addr, "-retry", "300ms")
	ids := []string{"wr1", "wr2"}
	for _, id := range ids {
		d.Publish(id, 1)
	}
	br := newBrowser(ctx, t, chromium)
	tab := openViewer(t, br, d.Base, "sessions="+strings.Join(ids, ",")+"&wsRetry=1500")
	daemontest.WaitUntil(t, 20*time.Second, "the viewer on the WebSocket", func() (bool, string) {
		v := readWSViewer(tab, t)
		return v.on("websocket") && v.Shown == "WebSocket", v.summary()
	})
	for _, id := range ids {
		d.Publish(id, 2)
		d.Publish(id, 3)
	}
	daemontest.WaitUntil(t, 20*time.Second, "1..3 in each column", func() (bool, string) {
		v := readWSViewer(tab, t)
		for _, id := range ids {
			if !slices.Equal(v.Sessions[id].SeenIDs, idsUpTo(3)) {
				return false, v.summary()
			}
		}
		return true, v.summary()
	})
	v := readWSViewer(tab, t)
	if len(v.Attempts) != 1 || v.Attempts[0].Transport != "WebSocket" || v.Attempts[0].LastEventID != "0" {
		t.Fatalf("attempts %+v: want one WebSocket from the start", v.Attempts)
	}
	for _, id := range ids {
		if st := d.Status(id); st.Subscribers != 1 {
			t.Fatalf("%s: %+v, want the one stream", id, st)
		}
	}
	old := map[string]string{}
	for _, id := range ids {
		old[id] = d.Status(id).Epoch
	}
	screenshot(tab, t, "viewer-websocket.png")

	// A kill -9: no shutdown frame, the socket cut; the restarted daemon
	// has new epochs (wr1 made by a publish, wr2 by the client's stream).
	d.Kill()
	// Down long enough for the client's next attempts to fail: the
	// WebSocket's (no connection: SSE for wsRetry), then SSE's.
	time.Sleep(1500 * time.Millisecond)
	d = daemontest.Start(ctx, t, bin, "-addr", addr, "-retry", "300ms")
	d.Publish("wr1", 1)
	daemontest.WaitUntil(t, 60*time.Second, "epoch_reset in every column, back on the WebSocket", func() (bool, string) {
		v := readWSViewer(tab, t)
		for _, id := range ids {
			if c := v.Sessions[id]; c.EpochChanges != 1 || c.CaughtUp < 2 {
				return false, v.summary()
			}
		}
		return v.on("websocket"), v.summary()
	})
	for _, id := range ids {
		d.Publish(id, 100)
	}
	want := map[string][]uint64{"wr1": idsUpTo(2), "wr2": idsUpTo(1)}
	daemontest.WaitUntil(t, 20*time.Second, "the new epoch's events", func() (bool, string) {
		v := readWSViewer(tab, t)
		for _, id := range ids {
			if !slices.Equal(v.Sessions[id].SeenIDs, want[id]) {
				return false, v.summary()
			}
		}
		return true, v.summary()
	})
	v = readWSViewer(tab, t)
	for _, id := range ids {
		c := v.Sessions[id]
		if c.Epoch == nil || *c.Epoch == old[id] || *c.Epoch != d.Status(id).Epoch || c.Resyncs != 1 || c.Gone != nil {
			t.Fatalf("%s after the restart: %+v (old epoch %s, daemon %s)", id, c, old[id], d.Status(id).Epoch)
		}
		if !slices.ContainsFunc(v.Texts[id], func(s string) bool { return strings.HasPrefix(s, "state_resync_required: epoch_reset") }) {
			t.Fatalf("%s: the column does not show the epoch_reset: %q", id, v.Texts[id])
		}
	}
	if v.Transports[0] != "websocket" || v.Transports[len(v.Transports)-1] != "websocket" {
		t.Fatalf("transports %v: want the WebSocket first and last", v.Transports)
	}
	if last := v.Attempts[len(v.Attempts)-1]; last.Transport != "WebSocket" || !strings.HasPrefix(last.LastEventID, "m1") || len(last.LastEventID) != 2+24*len(ids) {
		t.Fatalf("the last attempt %+v: want the WebSocket, resuming from the composite cursor of the %d sessions", last, len(ids))
	}
	t.Logf("transports across the restart: %v; attempts: %d", v.Transports, len(v.Attempts))
	screenshot(tab, t, "viewer-websocket-after-restart.png")

	// × and Add on the open socket: a remove and an add, no new connection.
	attempts, connects := len(v.Attempts), v.Connects
	if err := chromedp.Do(tab, chromedp.Click(`.col[data-session="wr2"] button.remove`)); err != nil {
		t.Fatal(err)
	}
	d.Publish("wr3", 1)
	if err := chromedp.Do(tab, chromedp.SendKeys("#newSession", "wr3\n")); err != nil {
		t.Fatal(err)
	}
	daemontest.WaitUntil(t, 20*time.Second, "wr2 removed and wr3 added on the socket", func() (bool, string) {
		st, ok := d.StatusIfAny("wr3")
		return ok && st.Subscribers == 1 && d.Status("wr2").Subscribers == 0, v.summary()
	})
	d.Publish("wr3", 2)
	d.Publish("wr2", 200)
	daemontest.WaitUntil(t, 20*time.Second, "wr3's live event", func() (bool, string) {
		v = readWSViewer(tab, t)
		return slices.Equal(v.Sessions["wr3"].SeenIDs, []uint64{2}), v.summary()
	})
	v = readWSViewer(tab, t)
	if len(v.Attempts) != attempts || v.Connects != connects || !v.on("websocket") {
		t.Fatalf("attempts %d -> %d, connects %d -> %d: want the same socket (%s)", attempts, len(v.Attempts), connects, v.Connects, v.summary())
	}
	if _, ok := v.Sessions["wr2"]; ok {
		t.Fatalf("wr2 still shown: %s", v.summary())
	}
	if errs := br.consoleErrors(); len(errs) > 0 {
		t.Logf("console errors (the daemon was down): %v", errs)
	}
}

// refusingProxy is a reverse proxy to base that answers GET /ws with a
// plain 404 while refuse is set (a proxy that knows no WebSocket: no
// JSON, not the daemon's answer) and passes the rest through (the
// WebSocket's upgrade too, and SSE flushed as it comes).
func refusingProxy(t *testing.T, base string, refuse *atomic.Bool) *httptest.Server {
	t.Helper()
	target, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ws" && refuse.Load() {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv
}

func TestViewerFallsBackToSSE(t *testing.T) {
	chromium := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := daemontest.Build(ctx, t, "..", raceEnabled)
	d := daemontest.Start(ctx, t, bin, "-addr", daemontest.FreeAddr(t), "-retry", "300ms")
	ids := []string{"fb1", "fb2"}
	for _, id := range ids {
		d.Publish(id, 1)
	}
	var refuse atomic.Bool
	refuse.Store(true)
	br := newBrowser(ctx, t, chromium)
	px := refusingProxy(t, d.Base, &refuse)
	tab := openViewer(t, br, px.URL, "sessions="+strings.Join(ids, ",")+"&wsRetry=2000")
	daemontest.WaitUntil(t, 20*time.Second, "the viewer on SSE", func() (bool, string) {
		v := readWSViewer(tab, t)
		return v.on("sse") && strings.HasPrefix(v.Shown, "SSE") && slices.ContainsFunc(v.Errors, func(e struct {
			Kind string `json:"kind"`
		}) bool {
			return e.Kind == "websocket"
		}), v.summary()
	})
	for _, id := range ids {
		d.Publish(id, 2)
	}
	daemontest.WaitUntil(t, 20*time.Second, "1..2 over SSE", func() (bool, string) {
		v := readWSViewer(tab, t)
		for _, id := range ids {
			if !slices.Equal(v.Sessions[id].SeenIDs, idsUpTo(2)) {
				return false, v.summary()
			}
		}
		return true, v.summary()
	})
	screenshot(tab, t, "viewer-websocket-fallback-sse.png")

	// The WebSocket is let through: after wsRetry the client ends its SSE
	// stream and opens the WebSocket with the same cursor, while events
	// keep coming.
	refuse.Store(false)
	stop := make(chan struct{})
	published := make(chan int)
	go func() {
		n := 2
		defer func() { published <- n }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			n++
			for _, id := range ids {
				d.Publish(id, n)
			}
		}
	}()
	daemontest.WaitUntil(t, 20*time.Second, "back on the WebSocket", func() (bool, string) {
		v := readWSViewer(tab, t)
		return v.on("websocket") && v.Shown == "WebSocket", v.summary()
	})
	time.Sleep(500 * time.Millisecond)
	close(stop)
	n := <-published
	d.Publish("fb1", n+1)
	daemontest.WaitUntil(t, 20*time.Second, "every event once, in order", func() (bool, string) {
		v := readWSViewer(tab, t)
		return slices.Equal(v.Sessions["fb1"].SeenIDs, idsUpTo(n+1)) && slices.Equal(v.Sessions["fb2"].SeenIDs, idsUpTo(n)), v.summary()
	})
	v := readWSViewer(tab, t)
	if !slices.Equal(v.Transports, []string{"sse", "websocket"}) {
		t.Fatalf("transports %v: want SSE, then the WebSocket", v.Transports)
	}
	for _, id := range ids {
		if c := v.Sessions[id]; c.Resyncs != 0 || c.EpochChanges != 0 {
			t.Fatalf("%s: %+v: the switch must lose nothing", id, c)
		}
	}
	if v.Duplicates != 0 {
		t.Fatalf("the client dropped %d duplicates: a switch resumed from behind where the last connection stopped", v.Duplicates)
	}
	ws := v.Attempts[len(v.Attempts)-1]
	if ws.Transport != "WebSocket" || !strings.HasPrefix(ws.LastEventID, "m1") {
		t.Fatalf("the last attempt %+v: want the WebSocket resuming from the composite cursor", ws)
	}
	t.Logf("%d events per session across SSE and the WebSocket; attempts %+v", n, v.Attempts)
	screenshot(tab, t, "viewer-websocket-back.png")
}
