package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.uber.org/goleak"
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

// daemon is a running cmd/sessiond.
type daemon struct {
	t    *testing.T
	cmd  *exec.Cmd
	base string // http://127.0.0.1:port, or https:// with -tls-cert
	http *http.Client

	mu   sync.Mutex
	logs bytes.Buffer
	done chan struct{} // closed when stderr hits EOF
}

func (d *daemon) logText() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.logs.String()
}

// buildDaemon compiles ../cmd/sessiond (in the root module) into a temp dir.
func buildDaemon(ctx context.Context, t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the daemon: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "sessiond")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "./cmd/sessiond")
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = ".." // the root module
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

// startDaemon runs bin on a free loopback port and waits for its listening
// log line. Cleanup kills it if the test did not stop it.
func startDaemon(ctx context.Context, t *testing.T, bin string, args ...string) *daemon {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"-addr", "127.0.0.1:0"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, cmd: cmd, done: make(chan struct{}), http: &http.Client{Timeout: 10 * time.Second}}
	addrCh := make(chan string, 1)
	go func() {
		defer close(d.done)
		addrRE := regexp.MustCompile(`msg="sessiond listening" addr=\S+ url=(\S+)/`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			d.mu.Lock()
			d.logs.WriteString(line + "\n")
			d.mu.Unlock()
			if m := addrRE.FindStringSubmatch(line); m != nil {
				select {
				case addrCh <- m[1]:
				default:
				}
			}
		}
		io.Copy(io.Discard, stderr) // after a scanner error
	}()
	t.Cleanup(func() {
		d.http.CloseIdleConnections()
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-d.done
			cmd.Wait()
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.logText())
		}
	})
	select {
	case url := <-addrCh:
		d.base = url
	case <-d.done:
		t.Fatalf("the daemon exited before listening:\n%s", d.logText())
	case <-ctx.Done():
		t.Fatalf("the daemon did not start listening: %v\n%s", ctx.Err(), d.logText())
	}
	return d
}

// stop sends SIGTERM and expects a clean exit: every bus closed, then the
// HTTP server shut down while the browser still holds its stream open.
func (d *daemon) stop(timeout time.Duration) {
	d.t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		d.t.Fatal(err)
	}
	select {
	case <-d.done:
	case <-time.After(timeout):
		d.t.Fatalf("the daemon did not exit within %v of SIGTERM", timeout)
	}
	if err := d.cmd.Wait(); err != nil {
		d.t.Fatalf("the daemon exited with %v after SIGTERM", err)
	}
}

// call sends a request and decodes a JSON answer into out (when non-nil).
func (d *daemon) call(method, path, body string, wantStatus int, out any) {
	d.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, d.base+path, rd)
	if err != nil {
		d.t.Fatal(err)
	}
	resp, err := d.http.Do(req)
	if err != nil {
		d.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		d.t.Fatal(err)
	}
	if resp.StatusCode != wantStatus {
		d.t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, b, wantStatus)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			d.t.Fatalf("%s %s: %q: %v", method, path, b, err)
		}
	}
}

type sessionStatus struct {
	Epoch          string `json:"epoch"`
	LastEventID    uint64 `json:"lastEventId"`
	Subscribers    int    `json:"subscribers"`
	Streams        int    `json:"streams"`
	StreamsOpened  int    `json:"streamsOpened"`
	StreamsResumed int    `json:"streamsResumed"`
	LastResumeFrom string `json:"lastResumeFrom"`
}

func (d *daemon) status(session string) sessionStatus {
	d.t.Helper()
	var st sessionStatus
	d.call(http.MethodGet, "/session/"+session, "", http.StatusOK, &st)
	return st
}

// publish posts one "note" event (a type the viewer listens for) and
// returns its id.
func (d *daemon) publish(session string, n int) uint64 {
	d.t.Helper()
	var res struct {
		ID uint64 `json:"id"`
	}
	body := fmt.Sprintf(`{"type":"note","data":{"n":%d},"originatorClientId":"e2e"}`, n)
	d.call(http.MethodPost, "/session/"+session+"/events", body, http.StatusOK, &res)
	return res.ID
}

// waitUntil polls cond every 20 ms until it is true or timeout passes.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; last state: %s", timeout, what, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
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

func (p pageState) summary() string {
	return fmt.Sprintf("conn=%s reconnects=%d resyncs=%d seen=%d ids (last %v)",
		p.ConnState, p.Reconnects, p.Resyncs, len(p.SeenIDs), p.SeenIDs[max(0, len(p.SeenIDs)-3):])
}

// TestViewerResumesAfterTheServerCutsTheStream opens the viewer page in
// headless chromium, publishes events, makes the daemon cut the page's stream
// (POST /session/{id}/disconnect, as a load balancer would), publishes while
// the page is disconnected, and checks that the browser's own EventSource
// reconnected, sent Last-Event-ID, and saw every id exactly once, in order.
// A second phase cuts the stream twice while events are being published.
func TestViewerResumesAfterTheServerCutsTheStream(t *testing.T) {
	chromium := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	bin := buildDaemon(ctx, t)
	// -retry 1s: the browser waits this long before reconnecting.
	d := startDaemon(ctx, t, bin, "-retry", "1s", "-ring", "1000")
	const session = "e2e"

	br := newBrowser(ctx, t, chromium)
	bctx := br.ctx

	if err := chromedp.Do(bctx, chromedp.Navigate(d.base+"/?session="+session)); err != nil {
		t.Fatalf("navigating to the viewer: %v", err)
	}
	waitUntil(t, 20*time.Second, "the page's EventSource to open and subscribe", func() (bool, string) {
		p := readPage(bctx, t)
		st := d.status(session)
		return p.ConnState == "open" && st.Subscribers == 1, fmt.Sprintf("page %s, server %+v", p.summary(), st)
	})
	epoch := d.status(session).Epoch

	// Phase 1: 20 events live, cut, 20 while disconnected, 10 live again.
	next := 1
	publishUpTo := func(last int) {
		for ; next <= last; next++ {
			if id := d.publish(session, next); id != uint64(next) {
				t.Fatalf("POST %d got id %d", next, id)
			}
		}
	}
	waitSeen := func(n int, what string) pageState {
		var p pageState
		waitUntil(t, 30*time.Second, what, func() (bool, string) {
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
	d.call(http.MethodPost, "/session/"+session+"/disconnect", "", http.StatusOK, &cut)
	if cut.Disconnected != 1 {
		t.Fatalf("the disconnect route cut %d streams, want the page's 1", cut.Disconnected)
	}
	// Publish only once the old stream is gone, so that ids 21..40 can only
	// reach the page through the resume.
	waitUntil(t, 10*time.Second, "the cut stream to unsubscribe", func() (bool, string) {
		st := d.status(session)
		return st.Subscribers == 0 && st.Streams == 0, fmt.Sprintf("%+v", st)
	})
	publishUpTo(40)
	p := waitSeen(40, "the page to reconnect and replay ids 21..40")
	if p.Reconnects != 1 {
		t.Errorf("page counted %d reconnects, want 1", p.Reconnects)
	}
	st := d.status(session)
	// -epoch-ids is on: the browser's own Last-Event-ID names the epoch.
	if st.StreamsOpened != 2 || st.StreamsResumed != 1 || st.LastResumeFrom != epoch+":20" {
		t.Errorf("server saw %+v; want 2 streams opened, the second resumed with Last-Event-ID %s:20", st, epoch)
	}
	if !regexp.MustCompile(`msg="stream opened" session=e2e epoch=` + epoch + ` lastEventId=` + epoch + `:20 `).MatchString(d.logText()) {
		t.Errorf("the daemon log has no stream resumed from Last-Event-ID %s:20:\n%s", epoch, d.logText())
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
			resp, err := d.http.Post(d.base+"/session/"+session+"/events", "application/json", strings.NewReader(body))
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
		d.call(http.MethodPost, "/session/"+session+"/disconnect", "", http.StatusOK, &cut)
		if cut.Disconnected != 1 {
			t.Fatalf("cut %d closed %d streams, want 1", i+2, cut.Disconnected)
		}
		waitUntil(t, 30*time.Second, fmt.Sprintf("the page to reconnect after cut %d", i+2), func() (bool, string) {
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

	want := make([]uint64, total)
	for i := range want {
		want[i] = uint64(i + 1)
	}
	if !slices.Equal(p.SeenIDs, want) {
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
	if st := d.status(session); st.StreamsResumed != 3 || st.Epoch != epoch {
		t.Errorf("server status %+v: want 3 resumed streams in epoch %s", st, epoch)
	}
	if errs := br.consoleErrors(); len(errs) > 0 {
		// A reconnecting EventSource logs nothing; any error is a page bug.
		t.Errorf("the page logged errors: %q", errs)
	}

	screenshot(bctx, t, "viewer-final.png")

	// SIGTERM while the page still streams: the daemon closes the bus, the
	// stream drains and ends, and the server shuts down cleanly.
	d.stop(20 * time.Second)
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
