package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.uber.org/goleak"

	"github.com/ssebus/eventbus/internal/daemontest"
)

func TestMain(m *testing.M) {
	// chromedp ends its goroutines when the browser and allocator contexts
	// are cancelled (the test waits for both), so no ignore option is needed.
	goleak.VerifyTestMain(m)
}

// chromiumPath finds the browser, or skips the test (fails it under CI=true).
func chromiumPath(t *testing.T) string {
	t.Helper()
	path := os.Getenv("E2E_CHROMIUM")
	if path == "" {
		path = "/usr/bin/chromium"
	}
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("chromium not found at %s (CI=true, so this fails instead of skipping): %v; run .ci/e2e.sh, which installs it", path, err)
		}
		t.Skipf("chromium not found at %s: install it (apt-get install chromium) or set E2E_CHROMIUM; skipping the browser test", path)
	}
	return path
}

// pageState is what the viewer page exposes on window for tests.
type pageState struct {
	ConnState  string      `json:"connState"`
	SeenIDs    []uint64    `json:"seenIds"`
	Reconnects int         `json:"reconnects"`
	Resyncs    int         `json:"resyncs"`
	Frames     []pageFrame `json:"frames"`
}

type pageFrame struct {
	ID        *uint64        `json:"id"`
	Type      string         `json:"type"`
	Data      map[string]any `json:"data"`
	Synthetic bool           `json:"synthetic"`
}

func readPage(ctx context.Context, t *testing.T) pageState {
	t.Helper()
	st, err := chromedp.Run(ctx, chromedp.Evaluate[pageState](
		`({connState: window.connState, seenIds: window.seenIds, reconnects: window.reconnects, resyncs: window.resyncs, frames: window.frames})`))
	if err != nil {
		t.Fatalf("reading the page state: %v", err)
	}
	return st
}

// idsUpTo returns 1..n.
func idsUpTo(n int) []uint64 { return daemontest.IDs(1, uint64(n)) }

func (p pageState) summary() string {
	return fmt.Sprintf("conn=%s reconnects=%d resyncs=%d seen=%d ids (last %v)",
		p.ConnState, p.Reconnects, p.Resyncs, len(p.SeenIDs), p.SeenIDs[max(0, len(p.SeenIDs)-3):])
}

// TestViewerResumesAfterTheServerCutsTheStream opens the viewer page in
// headless chromium, publishes events, makes the daemon cut the page's stream
// (POST /session/{id}/disconnect, as a load balancer would), publishes while
// the page is disconnected (its reconnect held back meanwhile), and checks
// that the viewer's client reconnected, resumed from its last id, and saw
// every id exactly once, in order. A second phase cuts the stream twice
// while events are being published.
func TestViewerResumesAfterTheServerCutsTheStream(t *testing.T) {
	chromium := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	bin := daemontest.Build(ctx, t, "..", raceEnabled)
	// -retry 1s: the browser waits this long before reconnecting.
	d := daemontest.Start(ctx, t, bin, "-retry", "1s", "-ring", "1000")
	const session = "e2e"

	br := newBrowser(ctx, t, chromium)
	bctx := br.ctx

	if err := chromedp.Do(bctx, chromedp.Navigate(d.Base+"/?session="+session)); err != nil {
		t.Fatalf("navigating to the viewer: %v", err)
	}
	daemontest.WaitUntil(t, 20*time.Second, "the page's EventSource to open and subscribe", func() (bool, string) {
		p := readPage(bctx, t)
		st, _ := d.StatusIfAny(session) // the page's stream creates the session
		return p.ConnState == "open" && st.Subscribers == 1, fmt.Sprintf("page %s, server %+v", p.summary(), st)
	})
	epoch := d.Status(session).Epoch

	// Phase 1: 20 events live, cut, 20 while disconnected, 10 live again.
	next := 1
	publishUpTo := func(last int) {
		for ; next <= last; next++ {
			if id := d.Publish(session, next); id != uint64(next) {
				t.Fatalf("POST %d got id %d", next, id)
			}
		}
	}
	waitSeen := func(n int, what string) pageState {
		var p pageState
		daemontest.WaitUntil(t, 30*time.Second, what, func() (bool, string) {
			p = readPage(bctx, t)
			return len(p.SeenIDs) >= n, p.summary()
		})
		return p
	}
	publishUpTo(20)
	waitSeen(20, "the page to see ids 1..20")

	var cut struct {
		Disconnected int `json:"disconnected"`
	}
	d.Call(http.MethodPost, "/session/"+session+"/disconnect", "", http.StatusOK, &cut)
	if cut.Disconnected != 1 {
		t.Fatalf("the disconnect route cut %d streams, want the page's 1", cut.Disconnected)
	}
	// Publish only once the old stream is gone, so that ids 21..40 can only
	// reach the page through the resume, and hold the reconnect until they
	// are published (the client's backoff may be as short as it likes), so
	// that the resume replays all of them.
	held, release := holdStream(bctx, t, session)
	daemontest.WaitUntil(t, 10*time.Second, "the cut stream to unsubscribe", func() (bool, string) {
		st := d.Status(session)
		return st.Subscribers == 0 && st.Streams == 0, fmt.Sprintf("%+v", st)
	})
	publishUpTo(40)
	daemontest.WaitUntil(t, 10*time.Second, "the page's reconnect", func() (bool, string) { return held() == 1, "" })
	release()
	p := waitSeen(40, "the page to reconnect and replay ids 21..40")
	if p.Reconnects != 1 {
		t.Errorf("page counted %d reconnects, want 1", p.Reconnects)
	}
	st := d.Status(session)
	// -epoch-ids is on: the browser's own Last-Event-ID names the epoch.
	if st.StreamsOpened != 2 || st.StreamsResumed != 1 || st.LastResumeFrom != epoch+":20" {
		t.Errorf("server saw %+v; want 2 streams opened, the second resumed with Last-Event-ID %s:20", st, epoch)
	}
	if !regexp.MustCompile(`msg="stream opened" session=e2e epoch=` + epoch + ` lastEventId=` + epoch + `:20 `).MatchString(d.LogText()) {
		t.Errorf("the daemon log has no stream resumed from Last-Event-ID %s:20:\n%s", epoch, d.LogText())
	}
	var replays []pageFrame
	for _, f := range p.Frames {
		if f.Type == "replay_complete" {
			replays = append(replays, f)
		}
	}
	if len(replays) != 1 || !replays[0].Synthetic || replays[0].ID != nil ||
		replays[0].Data["replayedCount"] != float64(20) || replays[0].Data["lastReplayedEventId"] != float64(40) ||
		replays[0].Data["epoch"] != epoch {
		t.Errorf("replay_complete frames on the page: %+v; want one, replayedCount 20, lastReplayedEventId 40, epoch %s", replays, epoch)
	}
	// The top of the table now shows replay_complete, the replayed ids and
	// the page's notes about the lost and reopened connection.
	screenshot(bctx, t, "viewer-resume.png")
	publishUpTo(50)
	waitSeen(50, "the page to see live ids 41..50")

	// Phase 2: a producer publishes every 10 ms from id 51 on while the
	// daemon cuts the page's stream twice; it stops once the page has
	// reconnected after both cuts and seen 20 more live events.
	stop := make(chan struct{})
	lastID := make(chan int, 1)
	go func() {
		n := 50
		defer func() { lastID <- n }()
		for n < 5000 {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			body := fmt.Sprintf(`{"type":"note","data":{"n":%d}}`, n+1)
			resp, err := d.HTTP.Post(d.Base+"/session/"+session+"/events", "application/json", strings.NewReader(body))
			if err != nil {
				t.Errorf("POST %d: %v", n+1, err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("POST %d: %s", n+1, resp.Status)
				return
			}
			n++
		}
	}()
	stopped := false
	stopProducer := func() int {
		if !stopped {
			stopped = true
			close(stop)
		}
		return <-lastID
	}
	defer func() {
		if !stopped {
			stopProducer()
		}
	}()
	seen := 50
	for i, reconnects := range []int{2, 3} {
		p = waitSeen(seen+20, fmt.Sprintf("the page to see 20 more live ids before cut %d", i+2))
		d.Call(http.MethodPost, "/session/"+session+"/disconnect", "", http.StatusOK, &cut)
		if cut.Disconnected != 1 {
			t.Fatalf("cut %d closed %d streams, want 1", i+2, cut.Disconnected)
		}
		daemontest.WaitUntil(t, 30*time.Second, fmt.Sprintf("the page to reconnect after cut %d", i+2), func() (bool, string) {
			p = readPage(bctx, t)
			return p.Reconnects >= reconnects, p.summary()
		})
		seen = len(p.SeenIDs)
	}
	waitSeen(seen+20, "the page to see 20 more live ids after the last cut")
	total := stopProducer()
	waitSeen(total, fmt.Sprintf("the page to see every id up to %d", total))
	time.Sleep(300 * time.Millisecond) // let a duplicate, if any, arrive
	p = readPage(bctx, t)

	if !slices.Equal(p.SeenIDs, idsUpTo(total)) {
		t.Errorf("the page's EventSource saw ids %v, want exactly 1..%d once each", p.SeenIDs, total)
	}
	t.Logf("the page saw ids 1..%d exactly once across 3 server-side cuts", total)
	if p.Reconnects != 3 {
		t.Errorf("page counted %d reconnects, want 3", p.Reconnects)
	}
	if p.Resyncs != 0 {
		t.Errorf("page saw %d state_resync_required frames, want none", p.Resyncs)
	}
	replays = replays[:0]
	for _, f := range p.Frames {
		if f.Type == "replay_complete" {
			replays = append(replays, f)
		}
	}
	if len(replays) != 3 {
		t.Errorf("page saw %d replay_complete frames, want one per reconnect (3)", len(replays))
	}
	if st := d.Status(session); st.StreamsResumed != 3 || st.Epoch != epoch {
		t.Errorf("server status %+v: want 3 resumed streams in epoch %s", st, epoch)
	}
	if errs := br.consoleErrors(); len(errs) > 0 {
		// A reconnecting EventSource logs nothing; any error is a page bug.
		t.Errorf("the page logged errors: %q", errs)
	}

	screenshot(bctx, t, "viewer-final.png")

	// SIGTERM while the page still streams: the daemon closes the bus, the
	// stream drains and ends, and the server shuts down cleanly.
	d.Stop(20 * time.Second)
}

// browser is a headless chromium with one tab (ctx) whose console errors
// and uncaught exceptions are collected. The test's cleanup closes it.
type browser struct {
	ctx context.Context

	mu     sync.Mutex
	errors []string
}

func (b *browser) consoleErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.errors)
}

// newBrowser starts chromium with the flags this machine needs (no
// background networking: its connections are refused here) and extra.
func newBrowser(ctx context.Context, t *testing.T, chromium string, extra ...chromedp.ExecAllocatorOption) *browser {
	t.Helper()
	opts := append([]chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	}, extra...)
	// Not ended by ctx: the cleanup closes the browser gracefully after the
	// test function (and its deferred cancel of ctx) returned.
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.WithoutCancel(ctx), opts...)
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	b := &browser{ctx: bctx}
	consoleDone := make(chan struct{})
	console := chromedp.Console(bctx) // starts the browser
	go func() {
		defer close(consoleDone)
		for m, err := range console {
			if err != nil {
				return
			}
			if m.IsException() || m.Type == chromedp.ConsoleError {
				b.mu.Lock()
				b.errors = append(b.errors, m.String())
				b.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		// Close the browser gracefully, bounded, then free the contexts; that
		// also ends the console reader, and cancelAlloc waits for the
		// browser process to exit.
		cctx, ccancel := context.WithTimeout(bctx, 15*time.Second)
		defer ccancel()
		if err := chromedp.Cancel(cctx); err != nil {
			t.Logf("closing the browser: %v", err)
		}
		cancelBrowser()
		<-consoleDone
		cancelAlloc()
	})
	return b
}

// screenshot saves the page's viewport as name under $E2E_ARTIFACTS, or under
// e2e/artifacts (ignored by git), and logs the path.
func screenshot(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	dir := os.Getenv("E2E_ARTIFACTS")
	if dir == "" {
		dir = "artifacts"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path, err := filepath.Abs(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot of the viewer: %s", path)
}

// TestViewerSaysWhenTheSessionDoesNotExist opens the viewer on a session
// the daemon does not have (a GET never creates one): the EventSource
// stops for good on the 404, and the page says plainly that the session
// does not exist or has ended and offers to watch again; once a publish
// has created the session, "Watch again" streams it; a DELETE then ends
// it for good, and the page says so.
func TestViewerSaysWhenTheSessionDoesNotExist(t *testing.T) {
	chromium := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := daemontest.Start(ctx, t, daemontest.Build(ctx, t, "..", raceEnabled), "-create-on-stream=false")
	br := newBrowser(ctx, t, chromium)
	bctx := br.ctx
	const session = "gone"
	if err := chromedp.Do(bctx, chromedp.Navigate(d.Base+"/?session="+session)); err != nil {
		t.Fatalf("navigating to the viewer: %v", err)
	}
	type view struct {
		Banner, BannerClass string
		AgainHidden         bool
		ConnState           string
		SeenIDs             []uint64
	}
	read := func() view {
		v, err := chromedp.Run(bctx, chromedp.Evaluate[view](`({Banner: document.getElementById("streamBanner").textContent,
			BannerClass: document.getElementById("streamBanner").className, AgainHidden: document.getElementById("watchAgain").hidden,
			ConnState: window.connState, SeenIDs: window.seenIds})`))
		if err != nil {
			t.Fatalf("reading the page: %v", err)
		}
		return v
	}
	var v view
	daemontest.WaitUntil(t, 20*time.Second, "the page to say the session does not exist", func() (bool, string) {
		v = read()
		return strings.Contains(v.Banner, `Session "gone" does not exist or has ended`) && !v.AgainHidden, fmt.Sprintf("%+v", v)
	})
	if !strings.Contains(v.Banner, "404 session_not_found") || v.BannerClass != "banner final" {
		t.Fatalf("the banner: %+v", v)
	}
	var st daemontest.Status
	d.Call(http.MethodGet, "/session/"+session, "", http.StatusNotFound, nil) // the page's GETs created nothing
	screenshot(bctx, t, "viewer-session-not-found.png")

	d.Publish(session, 1) // the session starts
	if err := chromedp.Do(bctx, chromedp.Click("#watchAgain")); err != nil {
		t.Fatalf("clicking Watch again: %v", err)
	}
	daemontest.WaitUntil(t, 20*time.Second, "the page to stream the session", func() (bool, string) {
		st = d.Status(session)
		return st.Subscribers == 1, fmt.Sprintf("%+v, page %+v", st, read())
	})
	d.Publish(session, 2)
	daemontest.WaitUntil(t, 20*time.Second, "the page to see id 2", func() (bool, string) {
		v = read()
		return slices.Contains(v.SeenIDs, 2), fmt.Sprintf("%+v", v)
	})
	if v.BannerClass != "banner" || !v.AgainHidden {
		t.Fatalf("after Watch again the banner stays: %+v", v)
	}

	// A DELETE while the page watches: stream_error closed, which the page
	// says at once, offering to watch again; the client does not reconnect
	// (issue 33: it used to take the end for a cut and meet a 404).
	d.Call(http.MethodDelete, "/session/"+session, "", http.StatusNoContent, nil)
	daemontest.WaitUntil(t, 20*time.Second, "the page to say the session was deleted", func() (bool, string) {
		v = read()
		return strings.Contains(v.Banner, `Session "gone" was deleted while you watched it (stream_error closed)`) && !v.AgainHidden &&
			v.ConnState == "closed", fmt.Sprintf("%+v", v)
	})
	type attempt struct {
		Transport string `json:"transport"`
	}
	attempts, err := chromedp.Run(bctx, chromedp.Evaluate[[]attempt](`window.attempts`))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	again, err := chromedp.Run(bctx, chromedp.Evaluate[[]attempt](`window.attempts`))
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != len(attempts) {
		t.Fatalf("attempts after the delete: %d, then %d: the client reconnected", len(attempts), len(again))
	}
	d.Stop(20 * time.Second)
}
