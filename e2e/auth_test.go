package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/ssebus/eventbus/internal/daemontest"
)

// TestViewerLoginLifetimeAndLogout runs the daemon with -auth-token and a
// short -token-lifetime. The viewer shows its login form and opens no
// stream until the user logs in through it; then each login (and its
// stream) ends after the lifetime with stream_error reauthenticate, the
// page logs in again with the token it was given and reopens the stream
// from its last id, and it sees every id exactly once while events are
// published throughout. Log out revokes the subject: the stream ends with
// stream_error revoked, the page's one reconnection is refused, and it
// stops.
func TestViewerLoginLifetimeAndLogout(t *testing.T) {
	chromium := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const token, lifetime = "e2e-token", 3 * time.Second
	d := daemontest.Start(ctx, t, daemontest.Build(ctx, t, "..", raceEnabled),
		"-retry", "300ms", "-auth-token", token, "-token-lifetime", lifetime.String())
	d.Header = http.Header{"Authorization": {"Bearer " + token}}
	const session = "auth"

	br := newBrowser(ctx, t, chromium)
	if err := chromedp.Do(br.ctx, chromedp.Navigate(d.Base+"/?session="+session)); err != nil {
		t.Fatal(err)
	}
	daemontest.WaitUntil(t, 20*time.Second, "the viewer to ask for a login", func() (bool, string) {
		p := readViewer(br.ctx, t)
		return p.AuthState == "needed" && strings.Contains(p.AuthStatus, "log in"), p.summary()
	})
	d.Call(http.MethodGet, "/session/"+session, "", http.StatusNotFound, nil) // no stream was tried: no session
	screenshot(br.ctx, t, "viewer-login.png")

	if err := chromedp.Do(br.ctx,
		chromedp.SendKeys("#token", token),
		chromedp.SetValue("#subject", "alice"),
		chromedp.Click("#login"),
	); err != nil {
		t.Fatal(err)
	}
	daemontest.WaitUntil(t, 20*time.Second, "the stream to open after the login", func() (bool, string) {
		p := readViewer(br.ctx, t)
		return p.ConnState == "open" && p.AuthState == "in" && d.Status(session).Subscribers == 1, p.summary()
	})
	epoch := d.Status(session).Epoch

	// Publish every 20 ms through two lifetimes and a bit.
	stop := make(chan struct{})
	lastID := make(chan int, 1)
	go func() {
		n := 0
		defer func() { lastID <- n }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			req, _ := http.NewRequest(http.MethodPost, d.Base+"/session/"+session+"/events", strings.NewReader(fmt.Sprintf(`{"type":"note","data":{"n":%d}}`, n+1)))
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := d.HTTP.Do(req)
			if err != nil {
				t.Errorf("POST %d: %v", n+1, err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("POST %d: %s", n+1, resp.Status)
				return
			}
			n++
		}
	}()
	var p viewerState
	daemontest.WaitUntil(t, 40*time.Second, "two lifetimes to end and the page to resume after each", func() (bool, string) {
		p = readViewer(br.ctx, t)
		return p.Reauths == 2 && p.ConnState == "open", p.summary()
	})
	close(stop)
	total := <-lastID
	daemontest.WaitUntil(t, 20*time.Second, fmt.Sprintf("the page to see every id up to %d", total), func() (bool, string) {
		p = readViewer(br.ctx, t)
		return len(p.SeenIDs) >= total, p.summary()
	})
	time.Sleep(300 * time.Millisecond) // let a duplicate, if any, arrive
	p = readViewer(br.ctx, t)
	if !slices.Equal(p.SeenIDs, idsUpTo(total)) {
		t.Fatalf("the page saw ids %v, want exactly 1..%d once each", p.SeenIDs, total)
	}
	t.Logf("the page saw ids 1..%d exactly once across 2 stream lifetimes", total)
	var ends []string
	for _, f := range p.Frames {
		if f.Type == "stream_error" {
			ends = append(ends, fmt.Sprint(f.Data["errorKind"]))
		}
	}
	if !slices.Equal(ends, []string{"reauthenticate", "reauthenticate"}) || p.Resyncs != 0 {
		t.Fatalf("stream_error kinds %v, resyncs %d; want two reauthenticate, no resync", ends, p.Resyncs)
	}
	st := d.Status(session)
	if st.Epoch != epoch || st.StreamsResumed != 2 || !strings.HasPrefix(st.LastResumeFrom, epoch+":") {
		t.Fatalf("server status %+v: want two streams resumed with an id of epoch %s", st, epoch)
	}
	if !strings.Contains(d.LogText(), `msg="stream opened" session=auth`) {
		t.Fatalf("no stream in the daemon log:\n%s", d.LogText())
	}
	// The client asked the page for credentials at each lifetime's end (the
	// page logged in again), and kept the EventSource: the cookie needs no
	// header.
	if r := credentialReasons(br.ctx, t); !slices.Equal(r, []string{"initial", "reauthenticate", "reauthenticate"}) {
		t.Fatalf("credentials asked for %v", r)
	}
	v := readViewer(br.ctx, t)
	if len(v.Attempts) != 3 || slices.ContainsFunc(v.Attempts, func(a viewerAttempt) bool { return a.Transport != "EventSource" }) ||
		v.Attempts[0].LastEventID != "" || !strings.HasPrefix(v.Attempts[2].LastEventID, epoch+":") {
		t.Fatalf("attempts %+v, want three EventSources, the last two resuming", v.Attempts)
	}
	screenshot(br.ctx, t, "viewer-reauthenticated.png")

	// Log out: revoked, one refused reconnection, then the page stops.
	if err := chromedp.Do(br.ctx, chromedp.Click("#logout")); err != nil {
		t.Fatal(err)
	}
	daemontest.WaitUntil(t, 20*time.Second, "the page to stop after the logout", func() (bool, string) {
		p = readViewer(br.ctx, t)
		return p.Revocations == 1 && p.ConnState == "closed" && p.AuthState == "needed", p.summary()
	})
	opened := d.Status(session).StreamsOpened
	time.Sleep(time.Second)
	if st := d.Status(session); st.Subscribers != 0 || st.StreamsOpened != opened {
		t.Fatalf("after the logout: %+v (streams opened before the pause: %d); want no stream and no retry loop", st, opened)
	}
	if !strings.Contains(readViewer(br.ctx, t).AuthStatus, "401") && !strings.Contains(readViewer(br.ctx, t).AuthStatus, "logged out") {
		t.Fatalf("auth status %q", readViewer(br.ctx, t).AuthStatus)
	}
	// One reconnection after the revocation, refused: final.
	if r := credentialReasons(br.ctx, t); !slices.Equal(r, []string{"initial", "reauthenticate", "reauthenticate", "revoked"}) {
		t.Fatalf("credentials asked for %v", r)
	}
	v = readViewer(br.ctx, t)
	if last := v.Errors[len(v.Errors)-1]; !last.Final || last.Status != http.StatusUnauthorized || last.Code != "unauthorized" {
		t.Fatalf("errors %+v, want a final 401 last", v.Errors)
	}
	screenshot(br.ctx, t, "viewer-logged-out.png")
}

func credentialReasons(ctx context.Context, t *testing.T) []string {
	t.Helper()
	r, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`window.credentialReasons`))
	if err != nil {
		t.Fatal(err)
	}
	return r
}
