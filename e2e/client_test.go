package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/debugger"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/ssebus/eventbus/internal/daemontest"
)

// What the viewer's JavaScript client (EventBusClient) rides out where a
// browser's own EventSource stops, read from the page state its callbacks
// feed.

// viewerState is the viewer's state with what its client reported.
type viewerState struct {
	pageState
	Epoch       *string         `json:"epoch"`
	SilentJoins int             `json:"silentJoins"`
	Errors      []viewerError   `json:"errors"`
	Attempts    []viewerAttempt `json:"attempts"`
	Banner      string          `json:"banner"`
	Epochs      string          `json:"epochBanner"`
	// Access control (-auth-token).
	AuthState   string `json:"authState"`
	Reauths     int    `json:"reauths"`
	Revocations int    `json:"revocations"`
	AuthStatus  string `json:"authStatus"`
}

// viewerError is an EventBusError the client reported.
type viewerError struct {
	Kind       string  `json:"kind"`
	Status     int     `json:"status"`
	Code       string  `json:"code"`
	RetryAfter float64 `json:"retryAfter"` // ms
	Final      bool    `json:"final"`
	Message    string  `json:"message"`
}

// viewerAttempt is one connection attempt of the client.
type viewerAttempt struct {
	Transport   string `json:"transport"` // "EventSource" or "fetch"
	LastEventID string `json:"lastEventId"`
	Epoch       string `json:"epoch"`
}

func readViewer(ctx context.Context, t *testing.T) viewerState {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[viewerState](`({connState: window.connState, seenIds: window.seenIds,
		reconnects: window.reconnects, resyncs: window.resyncs, frames: window.frames, epoch: window.epoch,
		silentJoins: window.silentJoins, errors: window.errors, attempts: window.attempts,
		authState: window.authState, reauths: window.reauths, revocations: window.revocations,
		authStatus: document.getElementById("authStatus").textContent,
		banner: document.getElementById("streamBanner").className + ": " + document.getElementById("streamBanner").textContent,
		epochBanner: document.getElementById("epochBanner").className + ": " + document.getElementById("epochBanner").textContent})`))
	if err != nil {
		t.Fatalf("reading the viewer: %v", err)
	}
	return v
}

func (v viewerState) summary() string {
	return fmt.Sprintf("%s errors %+v attempts %+v banner %q auth=%s reauths=%d revocations=%d status=%q",
		v.pageState.summary(), v.Errors, v.Attempts, v.Banner, v.AuthState, v.Reauths, v.Revocations, v.AuthStatus)
}

func (v viewerState) framesOf(typ string) []pageFrame {
	var out []pageFrame
	for _, f := range v.Frames {
		if f.Synthetic && f.Type == typ {
			out = append(out, f)
		}
	}
	return out
}

// call runs one DevTools protocol command on the tab of ctx.
func call[P, R any](ctx context.Context, t *testing.T, c cdp.Command[P, R], p P) R {
	t.Helper()
	r, err := chromedp.Run(ctx, func(ctx context.Context, tg *chromedp.Target) (R, error) { return cdp.Call(ctx, tg, c, p) })
	if err != nil {
		t.Fatalf("%s: %v", c.Method, err)
	}
	return r
}

// blockStream makes the tab's requests for session's stream fail (as a
// network that lost the route to the daemon would) until unblock.
func blockStream(ctx context.Context, t *testing.T, session string) (unblock func()) {
	t.Helper()
	call(ctx, t, network.Enable, network.EnableParams{})
	path := "/session/" + url.PathEscape(session) + "/events"
	call(ctx, t, network.SetBlockedURLs, network.SetBlockedURLsParams{URLPatterns: []*network.BlockPattern{
		{URLPattern: "*://*:*" + path, Block: true},
		{URLPattern: "*://*:*" + path + "?*", Block: true},
	}})
	return func() {
		t.Helper()
		call(ctx, t, network.SetBlockedURLs, network.SetBlockedURLsParams{URLPatterns: []*network.BlockPattern{}})
	}
}

// holdStream holds the tab's requests for session's stream (a reconnect
// waits, as behind a slow network, instead of failing) until release lets
// them through. held reports how many it holds.
func holdStream(ctx context.Context, t *testing.T, session string) (held func() int, release func()) {
	t.Helper()
	ectx, stop := context.WithCancel(ctx)
	paused := chromedp.Events(ectx, fetch.RequestPaused)
	call(ctx, t, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{
		{URLPattern: "*/session/" + url.PathEscape(session) + "/events*"},
	}})
	var mu sync.Mutex
	var ids []fetch.RequestID
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev, err := range paused {
			if err != nil {
				return
			}
			mu.Lock()
			ids = append(ids, ev.RequestID)
			mu.Unlock()
		}
	}()
	held = func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(ids)
	}
	release = func() {
		t.Helper()
		mu.Lock()
		heldIDs := ids
		ids = nil
		mu.Unlock()
		for _, id := range heldIDs {
			call(ctx, t, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: id})
		}
		call(ctx, t, fetch.Disable, cdp.Empty{})
		stop()
		<-done
	}
	return held, release
}

// openViewer opens the viewer on session in a new tab of br.
func openViewer(t *testing.T, br *browser, base, query string) context.Context {
	t.Helper()
	tab, closeTab := chromedp.NewContext(br.ctx)
	t.Cleanup(closeTab)
	if err := chromedp.Do(tab, chromedp.Navigate(base+"/?"+query)); err != nil {
		t.Fatal(err)
	}
	return tab
}

// openWithThree opens the viewer on session, waits for its stream, publishes
// ids 1..3 and waits for the page to have them.
func openWithThree(t *testing.T, br *browser, d *daemontest.Daemon, session string) context.Context {
	t.Helper()
	tab := openViewer(t, br, d.Base, "session="+session)
	daemontest.WaitUntil(t, 20*time.Second, "the viewer to subscribe", func() (bool, string) {
		return readViewer(tab, t).ConnState == "open" && d.Status(session).Subscribers == 1, readViewer(tab, t).summary()
	})
	for n := 1; n <= 3; n++ {
		d.Publish(session, n)
	}
	daemontest.WaitUntil(t, 20*time.Second, "3 events", func() (bool, string) {
		return len(readViewer(tab, t).SeenIDs) == 3, readViewer(tab, t).summary()
	})
	return tab
}

// TestViewerRidesOutRefusals: what stops a native EventSource for good, a
// 429 for a full session and a 503, the viewer's client waits out
// (Retry-After), then streams. A bare EventSource on the same full session,
// the control, stops for good.
func TestViewerRidesOutRefusals(t *testing.T) {
	chromium := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ps := pageServer(t)
	d := daemontest.Start(ctx, t, daemontest.Build(ctx, t, "..", raceEnabled),
		"-retry", "300ms", "-max-subscribers", "1", "-max-sessions", "2", "-cors-origin", ps.URL)
	br := newBrowser(ctx, t, chromium)

	// A subscriber that holds the session's one slot.
	hctx, release := context.WithCancel(ctx)
	defer release()
	req, _ := http.NewRequestWithContext(hctx, http.MethodGet, d.Base+"/session/full/events", nil)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := tr.RoundTrip(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the holder: %v %v", resp, err)
	}
	defer resp.Body.Close()

	tab := openViewer(t, br, d.Base, "session=full")
	var v viewerState
	daemontest.WaitUntil(t, 20*time.Second, "the viewer's 429", func() (bool, string) {
		v = readViewer(tab, t)
		return slices.ContainsFunc(v.Errors, func(e viewerError) bool { return e.Status == 429 }), v.summary()
	})
	refusedAt := time.Now()
	e := v.Errors[slices.IndexFunc(v.Errors, func(e viewerError) bool { return e.Status == 429 })]
	if e.Code != "subscriber_limit_exceeded" || e.RetryAfter != 5000 || e.Final || v.ConnState != "reconnecting" {
		t.Fatalf("the 429: %+v, state %s", e, v.ConnState)
	}
	// The EventSource could not say why it failed; the next attempt asked
	// with fetch, which read the status and Retry-After.
	if len(v.Attempts) < 2 || v.Attempts[0].Transport != "EventSource" || v.Attempts[1].Transport != "fetch" {
		t.Fatalf("attempts %+v, want EventSource then fetch", v.Attempts)
	}

	// The control: a bare EventSource on the same full session.
	plain, closePlain := chromedp.NewContext(br.ctx)
	defer closePlain()
	if err := chromedp.Do(plain, chromedp.Navigate(ps.URL+"/?src="+url.QueryEscape(d.Base+"/session/full/events"))); err != nil {
		t.Fatal(err)
	}
	daemontest.WaitUntil(t, 20*time.Second, "the bare EventSource to stop for good", func() (bool, string) {
		p := readPlain(plain, t)
		return p.ReadyState == 2 && p.Errors >= 1, fmt.Sprintf("%+v", p)
	})

	release()
	daemontest.WaitUntil(t, 20*time.Second, "the viewer to stream once the slot is free", func() (bool, string) {
		v = readViewer(tab, t)
		return v.ConnState == "open" && d.Status("full").Subscribers == 1, v.summary()
	})
	if waited := time.Since(refusedAt); waited < 4*time.Second {
		t.Fatalf("the viewer connected %v after the 429, before its Retry-After (5 s)", waited)
	}
	d.Publish("full", 1)
	daemontest.WaitUntil(t, 20*time.Second, "the event", func() (bool, string) {
		v = readViewer(tab, t)
		return slices.Equal(v.SeenIDs, []uint64{1}), v.summary()
	})
	if p := readPlain(plain, t); p.Opens != 0 || len(p.Log) != 0 || p.ReadyState != 2 {
		t.Fatalf("the bare EventSource came back: %+v", p)
	}
	screenshot(tab, t, "viewer-after-429.png")

	// A 503 (too many sessions, Retry-After: 1), then success once a
	// session is deleted.
	d.Publish("other", 1) // the second session: the daemon's limit
	tab503 := openViewer(t, br, d.Base, "session=third")
	daemontest.WaitUntil(t, 20*time.Second, "the viewer's 503", func() (bool, string) {
		v = readViewer(tab503, t)
		return slices.ContainsFunc(v.Errors, func(e viewerError) bool { return e.Status == 503 }), v.summary()
	})
	e = v.Errors[slices.IndexFunc(v.Errors, func(e viewerError) bool { return e.Status == 503 })]
	if e.Code != "too_many_sessions" || e.RetryAfter != 1000 || e.Final {
		t.Fatalf("the 503: %+v", e)
	}
	time.Sleep(1500 * time.Millisecond) // at least one more refusal
	d.Call(http.MethodDelete, "/session/other", "", http.StatusNoContent, nil)
	daemontest.WaitUntil(t, 20*time.Second, "the viewer to stream once a session is free", func() (bool, string) {
		v = readViewer(tab503, t)
		return v.ConnState == "open", v.summary()
	})
	d.Publish("third", 1)
	daemontest.WaitUntil(t, 20*time.Second, "the event", func() (bool, string) {
		v = readViewer(tab503, t)
		return slices.Equal(v.SeenIDs, []uint64{1}), v.summary()
	})
	// Refused for 1.5 s at least: the 503 seen with fetch, and the attempt
	// after its Retry-After (an EventSource, refused without a reason) at
	// least.
	if len(v.Errors) < 3 || slices.ContainsFunc(v.Errors, func(e viewerError) bool { return e.Final }) {
		t.Fatalf("errors %+v: want three refusals or more, none final", v.Errors)
	}
}

// TestViewerAcrossARestart: the daemon restarts while the viewer cannot
// reach it, and five events of the new epoch are published before it comes
// back with its cursor (id 3 of the old epoch): the client is told
// (epoch_reset, epoch_mismatch), the page says the epoch changed, and it has
// the new epoch's ids from 1, never a silent join at id 4.
func TestViewerAcrossARestart(t *testing.T) {
	chromium := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := daemontest.Build(ctx, t, "..", raceEnabled)
	args := []string{"-addr", daemontest.FreeAddr(t), "-retry", "300ms"}
	d := daemontest.Start(ctx, t, bin, args...)
	tab := openWithThree(t, newBrowser(ctx, t, chromium), d, "rs")
	old := d.Status("rs").Epoch

	unblock := blockStream(tab, t, "rs")
	d.Stop(20 * time.Second)
	d = daemontest.Start(ctx, t, bin, args...)
	for n := 1; n <= 5; n++ {
		d.Publish("rs", n)
	}
	fresh := d.Status("rs").Epoch
	unblock()
	var v viewerState
	daemontest.WaitUntil(t, 30*time.Second, "the viewer in the new epoch", func() (bool, string) {
		v = readViewer(tab, t)
		return v.ConnState == "open" && len(v.SeenIDs) == 5, v.summary()
	})
	d.Publish("rs", 6)
	daemontest.WaitUntil(t, 20*time.Second, "a live event", func() (bool, string) {
		v = readViewer(tab, t)
		return len(v.SeenIDs) == 6, v.summary()
	})
	rs := v.framesOf("state_resync_required")
	if !slices.Equal(v.SeenIDs, idsUpTo(6)) || v.Epoch == nil || *v.Epoch != fresh || v.SilentJoins != 0 || v.Resyncs != 1 ||
		len(rs) != 1 || rs[0].Data["reason"] != "epoch_reset" || rs[0].Data["detail"] != "epoch_mismatch" ||
		rs[0].Data["previousEpoch"] != old || rs[0].Data["epoch"] != fresh ||
		!strings.HasPrefix(v.Epochs, "banner changed: Epoch changed: "+old+" → "+fresh) {
		t.Fatalf("after the restart: %s; resyncs %+v; epoch banner %q (old %s, new %s)", v.summary(), rs, v.Epochs, old, fresh)
	}
	last := v.Attempts[len(v.Attempts)-1]
	if st := d.Status("rs"); st.LastResumeFrom != old+":3" || last.Epoch != old {
		t.Fatalf("the new daemon saw a resume from %q (last attempt %+v), want %s:3", st.LastResumeFrom, last, old)
	}
	screenshot(tab, t, "viewer-restart.png")
}

// TestViewerLossEvictionAndABigEvent: events the ring no longer holds
// when the viewer comes back are announced with their exact ids; a viewer
// that stops reading (its page paused in the debugger) is evicted, then
// resumes with every id once; a 1 MiB event arrives whole.
func TestViewerLossEvictionAndABigEvent(t *testing.T) {
	chromium := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d := daemontest.Start(ctx, t, daemontest.Build(ctx, t, "..", raceEnabled), "-retry", "300ms", "-ring", "100")
	br := newBrowser(ctx, t, chromium)

	// Loss: 3 events, then the viewer cannot reconnect while 150 more are
	// published into a ring of 100.
	tab := openWithThree(t, br, d, "ring")
	unblock := blockStream(tab, t, "ring")
	d.Call(http.MethodPost, "/session/ring/disconnect", "", http.StatusOK, nil)
	daemontest.WaitUntil(t, 20*time.Second, "the cut", func() (bool, string) {
		st := d.Status("ring")
		return st.Streams == 0, fmt.Sprintf("%+v", st)
	})
	for n := 4; n <= 153; n++ {
		d.Publish("ring", n)
	}
	unblock()
	var v viewerState
	daemontest.WaitUntil(t, 30*time.Second, "the resume", func() (bool, string) {
		v = readViewer(tab, t)
		return len(v.framesOf("replay_complete")) == 1, v.summary()
	})
	rs := v.framesOf("state_resync_required")
	missing, _ := rs[0].Data["missing"].(map[string]any)
	if len(rs) != 1 || rs[0].Data["reason"] != "ring_evicted" || missing["from"] != float64(4) || missing["to"] != float64(53) ||
		!slices.Equal(v.SeenIDs, append(idsUpTo(3), daemontest.IDs(54, 153)...)) ||
		!strings.HasPrefix(v.Banner, "banner lost: Events lost (ring_evicted): ids 4–53 ") {
		t.Fatalf("after the loss: resyncs %+v; %s", rs, v.summary())
	}
	screenshot(tab, t, "viewer-loss.png")

	// Eviction: a viewer with a queue of 16 frames whose page stops (the
	// debugger pauses it), so the browser stops reading its stream.
	slow := openViewer(t, br, d.Base, "session=slow&maxQueued=16")
	daemontest.WaitUntil(t, 20*time.Second, "the slow viewer to subscribe", func() (bool, string) {
		return readViewer(slow, t).ConnState == "open" && d.Status("slow").Subscribers == 1, readViewer(slow, t).summary()
	})
	call(slow, t, debugger.Enable, debugger.EnableParams{})
	call(slow, t, debugger.Pause, cdp.Empty{})
	payload := strings.Repeat("p", 256<<10)
	const big = 80 // 20 MiB: past the browser's and the kernel's buffers, and the 8 MiB replay budget
	for n := 1; n <= big; n++ {
		d.Call(http.MethodPost, "/session/slow/events", fmt.Sprintf(`{"type":"note","data":{"n":%d,"p":%q}}`, n, payload), http.StatusOK, nil)
	}
	daemontest.WaitUntil(t, 30*time.Second, "the daemon to evict the paused viewer", func() (bool, string) {
		st := d.Status("slow")
		return st.Subscribers == 0, fmt.Sprintf("%+v", st)
	})
	call(slow, t, debugger.Resume, debugger.ResumeParams{})
	call(slow, t, debugger.Disable, cdp.Empty{})
	daemontest.WaitUntil(t, 60*time.Second, "every event after the eviction", func() (bool, string) {
		v = readViewer(slow, t)
		return len(v.SeenIDs) >= big, v.summary()
	})
	if !slices.Equal(v.SeenIDs, idsUpTo(big)) || len(v.framesOf("client_evicted")) == 0 || v.Resyncs != 0 || v.Reconnects < 1 {
		t.Fatalf("after the eviction: evicted %+v; %s", v.framesOf("client_evicted"), v.summary())
	}

	// A 1 MiB event.
	var b strings.Builder
	for b.Len() < 1<<20 {
		b.WriteString("0123456789abcdef\u00e9\u4e16")
	}
	d.Call(http.MethodPost, "/session/ring/events", fmt.Sprintf(`{"type":"note","data":{"s":%q}}`, b.String()), http.StatusOK, nil)
	daemontest.WaitUntil(t, 20*time.Second, "the 1 MiB event", func() (bool, string) {
		n, err := chromedp.Run(tab, chromedp.Evaluate[int](`window.seenIds.at(-1) === 154 ? window.frames.at(-1).data.s.length : -1`))
		return err == nil && n == len([]rune(b.String())), fmt.Sprint(n, err)
	})
	same, err := chromedp.Run(tab, chromedp.Evaluate[bool](fmt.Sprintf(`window.frames.at(-1).data.s === %q`, b.String())))
	if err != nil || !same {
		t.Fatalf("the 1 MiB event arrived altered: %v", err)
	}
}
