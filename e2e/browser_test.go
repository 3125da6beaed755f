package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	shared "github.com/ssebus/eventbus/internal/daemon"
	"github.com/ssebus/eventbus/internal/daemontest"
)

// plainPage is a page with a bare EventSource and no epoch code of its own:
// what most browser code does. It logs the frames of the types it listens
// for, with the SSE id the browser keeps (and sends back as Last-Event-ID).
const plainPage = `<!doctype html><meta charset="utf-8"><title>plain EventSource</title>
<script>
window.log = []; window.opens = 0; window.errors = 0;
const es = new EventSource(new URLSearchParams(location.search).get("src"));
window.es = es;
for (const t of ["note", "replay_complete", "state_resync_required"]) {
  es.addEventListener(t, (e) => log.push({type: e.type, lastEventId: e.lastEventId, data: JSON.parse(e.data)}));
}
es.onopen = () => { window.opens++; };
es.onerror = () => { window.errors++; };
</script>`

// pageServer serves plainPage on an origin of its own (another port than
// the daemon's: another origin).
func pageServer(t *testing.T) *httptest.Server {
	ps := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, plainPage)
	}))
	t.Cleanup(ps.Close)
	return ps
}

type plainState struct {
	Log        []plainFrame `json:"log"`
	Opens      int          `json:"opens"`
	Errors     int          `json:"errors"`
	ReadyState int          `json:"readyState"`
}

type plainFrame struct {
	Type        string `json:"type"`
	LastEventID string `json:"lastEventId"`
	Data        struct {
		ID   *uint64        `json:"id"`
		Data map[string]any `json:"data"`
	} `json:"data"`
}

func readPlain(ctx context.Context, t *testing.T) plainState {
	t.Helper()
	st, err := chromedp.Run(ctx, chromedp.Evaluate[plainState](`({log: window.log, opens: window.opens, errors: window.errors, readyState: window.es.readyState})`))
	if err != nil {
		t.Fatalf("reading the page: %v", err)
	}
	return st
}

// TestPlainEventSourceAcrossARestart: a page with a bare EventSource reads
// three events, the daemon restarts (a new epoch, in which five events are
// published before the browser comes back), and the browser's own
// Last-Event-ID, "<old epoch>:3", gets epoch_reset and the new epoch from id
// 1, never the new epoch's id 4 as if nothing had happened.
func TestPlainEventSourceAcrossARestart(t *testing.T) {
	chromium := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := daemontest.Build(ctx, t, "..", raceEnabled)
	ps := pageServer(t)
	addr := daemontest.FreeAddr(t)
	// -retry 4s, no jitter: the browser waits that long after the stream
	// ends, time enough to restart the daemon and publish first.
	args := []string{"-addr", addr, "-cors-origin", ps.URL, "-retry", "4s", "-retry-jitter", "-1ns"}
	d1 := daemontest.Start(ctx, t, bin, args...)
	br := newBrowser(ctx, t, chromium)
	src := d1.Base + "/session/e2e/events"
	if err := chromedp.Do(br.ctx, chromedp.Navigate(ps.URL+"/?src="+url.QueryEscape(src))); err != nil {
		t.Fatal(err)
	}
	daemontest.WaitUntil(t, 20*time.Second, "the page's EventSource to open", func() (bool, string) {
		p := readPlain(br.ctx, t)
		return p.Opens == 1 && d1.Status("e2e").Subscribers == 1, fmt.Sprintf("%+v", p)
	})
	old := d1.Status("e2e").Epoch
	for n := 1; n <= 3; n++ {
		d1.Publish("e2e", n)
	}
	var p plainState
	daemontest.WaitUntil(t, 20*time.Second, "three events", func() (bool, string) {
		p = readPlain(br.ctx, t)
		return len(p.Log) == 3, fmt.Sprintf("%+v", p)
	})
	for i, f := range p.Log {
		if want := old + ":" + strconv.Itoa(i+1); f.Type != "note" || f.LastEventID != want || *f.Data.ID != uint64(i+1) {
			t.Fatalf("frame %d: %+v, want a note with SSE id %s", i, f, want)
		}
	}

	d1.Stop(20 * time.Second)
	stoppedAt := time.Now()
	d2 := daemontest.Start(ctx, t, bin, args...)
	for n := 1; n <= 5; n++ {
		d2.Publish("e2e", n)
	}
	if since := time.Since(stoppedAt); since > 3*time.Second {
		t.Fatalf("the restart took %v: the browser may have come back before the five events", since)
	}
	next := d2.Status("e2e").Epoch
	daemontest.WaitUntil(t, 30*time.Second, "the browser to come back and be told", func() (bool, string) {
		p = readPlain(br.ctx, t)
		return len(p.Log) >= 3+7, fmt.Sprintf("%+v", p)
	})
	got := p.Log[3:]
	if f := got[0]; f.Type != "state_resync_required" || f.Data.Data["reason"] != "epoch_reset" || f.Data.Data["detail"] != "epoch_mismatch" ||
		f.Data.Data["lastDeliveredId"] != float64(3) || f.Data.Data["earliestAvailableId"] != float64(1) || f.Data.Data["epoch"] != next {
		t.Fatalf("first frame after the restart: %+v", f)
	}
	for i, f := range got[1:6] {
		if want := next + ":" + strconv.Itoa(i+1); f.Type != "note" || f.LastEventID != want {
			t.Fatalf("frame %d after the resync: %+v, want SSE id %s", i, f, want)
		}
	}
	if f := got[6]; f.Type != "replay_complete" || f.Data.Data["replayedCount"] != float64(5) || f.Data.Data["epoch"] != next {
		t.Fatalf("last replayed frame: %+v", f)
	}
	if st := d2.Status("e2e"); st.LastResumeFrom != old+":3" || st.StreamsResumed != 1 {
		t.Fatalf("the new daemon saw %+v; want one resume from %s:3", st, old)
	}
	d2.Publish("e2e", 6)
	daemontest.WaitUntil(t, 20*time.Second, "a live event of the new epoch", func() (bool, string) {
		p = readPlain(br.ctx, t)
		return len(p.Log) == 11 && p.Log[10].LastEventID == next+":6", fmt.Sprintf("%+v", p.Log[len(p.Log)-1])
	})
	t.Logf("epoch %s ids 1-3, then epoch_reset and epoch %s ids 1-6: no silent join", old, next)
}

// TestCrossOriginPage: a page on another origin opens the stream when the
// daemon lists its origin (-cors-origin), and its EventSource fails (the
// browser refuses the answer) when it does not.
func TestCrossOriginPage(t *testing.T) {
	chromium := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin := daemontest.Build(ctx, t, "..", raceEnabled)
	ps := pageServer(t)
	allowed := daemontest.Start(ctx, t, bin, "-cors-origin", ps.URL)
	other := daemontest.Start(ctx, t, bin, "-cors-origin", "https://somewhere.else.example")
	refused := daemontest.Start(ctx, t, bin)
	br := newBrowser(ctx, t, chromium)

	open := func(d *daemontest.Daemon) context.Context {
		tab, closeTab := chromedp.NewContext(br.ctx)
		t.Cleanup(closeTab)
		if err := chromedp.Do(tab, chromedp.Navigate(ps.URL+"/?src="+url.QueryEscape(d.Base+"/session/cors/events"))); err != nil {
			t.Fatal(err)
		}
		return tab
	}
	tab := open(allowed)
	daemontest.WaitUntil(t, 20*time.Second, "the allowed page to open", func() (bool, string) {
		p := readPlain(tab, t)
		return p.Opens == 1, fmt.Sprintf("%+v", p)
	})
	allowed.Publish("cors", 1)
	daemontest.WaitUntil(t, 20*time.Second, "the allowed page to get the event", func() (bool, string) {
		p := readPlain(tab, t)
		return len(p.Log) == 1 && p.Log[0].Type == "note", fmt.Sprintf("%+v", p)
	})

	for name, d := range map[string]*daemontest.Daemon{"another origin listed": other, "no -cors-origin": refused} {
		tab := open(d)
		daemontest.WaitUntil(t, 20*time.Second, name+": the page's EventSource to fail for good", func() (bool, string) {
			p := readPlain(tab, t)
			return p.Errors >= 1 && p.ReadyState == 2, fmt.Sprintf("%+v", p)
		})
		d.Publish("cors", 1)
		time.Sleep(300 * time.Millisecond)
		if p := readPlain(tab, t); p.Opens != 0 || len(p.Log) != 0 {
			t.Fatalf("%s: the page read the stream: %+v", name, p)
		}
	}
}

// TestTenViewerTabsOverHTTP2: ten viewer tabs of one session in one browser,
// over TLS with HTTP/2: all ten streams share one connection, all stay live,
// and the tenth tab's "Publish test event" works (over HTTP/1.1 a browser
// opens at most six connections per host, and the seventh tab waited).
func TestTenViewerTabsOverHTTP2(t *testing.T) {
	chromium := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := daemontest.Build(ctx, t, "..", raceEnabled)
	certFile, keyFile, cert, err := shared.WriteSelfSignedCert(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d := daemontest.Start(ctx, t, bin, "-tls-cert", certFile, "-tls-key", keyFile)
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	d.HTTP.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
	br := newBrowser(ctx, t, chromium, chromedp.Flag("ignore-certificate-errors", true))

	const tabs = 10
	var ctxs []context.Context
	for i := range tabs {
		tab, closeTab := chromedp.NewContext(br.ctx)
		t.Cleanup(closeTab)
		if err := chromedp.Do(tab, chromedp.Navigate(d.Base+"/?session=tabs")); err != nil {
			t.Fatalf("tab %d: %v", i+1, err)
		}
		ctxs = append(ctxs, tab)
	}
	daemontest.WaitUntil(t, 60*time.Second, "ten open streams", func() (bool, string) {
		open := 0
		for _, tab := range ctxs {
			if readPage(tab, t).ConnState == "open" {
				open++
			}
		}
		st, _ := d.StatusIfAny("tabs") // the first tab's stream creates the session
		return open == tabs && st.Subscribers == tabs, fmt.Sprintf("%d tabs open, server %+v", open, st)
	})
	for i, tab := range ctxs {
		proto, err := chromedp.Run(tab, chromedp.Evaluate[string](`performance.getEntriesByType("navigation")[0].nextHopProtocol`))
		if err != nil || proto != "h2" {
			t.Fatalf("tab %d loaded over %q (%v), want h2", i+1, proto, err)
		}
	}

	// The tenth tab publishes with its own button: a request beside ten
	// open streams.
	last := ctxs[tabs-1]
	if err := chromedp.Do(last, chromedp.Click("#publish")); err != nil {
		t.Fatal(err)
	}
	daemontest.WaitUntil(t, 20*time.Second, "the tab's publish to be answered", func() (bool, string) {
		return d.Status("tabs").LastEventID == 1, fmt.Sprintf("%+v", d.Status("tabs"))
	})
	for n := 2; n <= 20; n++ {
		d.Publish("tabs", n)
	}
	for i, tab := range ctxs {
		daemontest.WaitUntil(t, 30*time.Second, fmt.Sprintf("tab %d to see ids 1..20", i+1), func() (bool, string) {
			p := readPage(tab, t)
			return len(p.SeenIDs) == 20 && p.SeenIDs[19] == 20, p.summary()
		})
	}
	result, err := chromedp.Run(last, chromedp.Evaluate[string](`document.getElementById("actionResult").textContent`))
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		ID uint64 `json:"id"`
	}
	if _, after, ok := strings.Cut(result, "→ 200 "); !ok || json.Unmarshal([]byte(after), &body) != nil || body.ID != 1 {
		t.Fatalf("the tab's publish: %q", result)
	}
	if errs := br.consoleErrors(); len(errs) > 0 {
		t.Errorf("the tabs logged errors: %q", errs)
	}
	screenshot(last, t, "viewer-h2-tab10.png")
}

// TestViewerEpoch: the viewer takes the epoch from the stream's own word,
// never from application data (an event whose data has an "epoch"; a
// publish that calls itself replay_complete is refused), says a DELETE of
// the session plainly and stops (stream_error closed; "Watch again" follows
// the new session of that name, a new epoch), and takes over from its
// cursor when it is told to listen for another type.
func TestViewerEpoch(t *testing.T) {
	chromium := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := daemontest.Start(ctx, t, daemontest.Build(ctx, t, "..", raceEnabled), "-retry", "300ms")
	br := newBrowser(ctx, t, chromium)
	if err := chromedp.Do(br.ctx, chromedp.Navigate(d.Base+"/?session=ep")); err != nil {
		t.Fatal(err)
	}
	type viewerEpoch struct {
		Epoch        *string `json:"epoch"`
		EpochChanges int     `json:"epochChanges"`
		SilentJoins  int     `json:"silentJoins"`
		Resyncs      int     `json:"resyncs"`
		Frames       int     `json:"frames"`
		Banner       string  `json:"banner"`
	}
	read := func() viewerEpoch {
		v, err := chromedp.Run(br.ctx, chromedp.Evaluate[viewerEpoch](`({epoch: window.epoch, epochChanges: window.epochChanges,
			silentJoins: window.silentJoins, resyncs: window.resyncs, frames: window.frames.length,
			banner: document.getElementById("epochBanner").className + ": " + document.getElementById("epochBanner").textContent})`))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	var v viewerEpoch
	daemontest.WaitUntil(t, 20*time.Second, "the viewer to learn the epoch (Event-Epoch of a HEAD)", func() (bool, string) {
		v = read()
		return v.Epoch != nil, fmt.Sprintf("%+v", v)
	})
	first := *v.Epoch
	if first != d.Status("ep").Epoch {
		t.Fatalf("viewer epoch %s, daemon %s", first, d.Status("ep").Epoch)
	}
	const fake = "00000000000000000000000000000000"
	d.Call(http.MethodPost, "/session/ep/events", `{"type":"note","data":{"epoch":"`+fake+`"}}`, http.StatusOK, nil)
	// A publish that calls itself a synthetic frame is refused (SPEC 5.2):
	// it never reaches the viewer.
	for _, body := range []string{
		`{"type":"replay_complete","data":{"epoch":"` + fake + `","replayedCount":0}}`,
		`{"type":"state_resync_required","data":{"reason":"epoch_reset","epoch":"` + fake + `"}}`,
	} {
		if a := d.Do(http.MethodPost, "/session/ep/events", body, nil); a.Status != http.StatusBadRequest || a.Code() != "invalid_event" {
			t.Fatalf("POST %s: %d %s, want 400 invalid_event", body, a.Status, a.Raw)
		}
	}
	daemontest.WaitUntil(t, 20*time.Second, "the published event", func() (bool, string) {
		v = read()
		return v.Frames == 1, fmt.Sprintf("%+v", v)
	})
	if *v.Epoch != first || v.EpochChanges != 0 || v.Resyncs != 0 {
		t.Fatalf("application data moved the viewer: %+v", v)
	}

	// A DELETE ends the session: the stream says stream_error closed, the
	// client stops without reconnecting (it used to take the end for a cut
	// and, the daemon creating sessions on a stream, follow a new session
	// of that name), and the page says so. "Watch again" follows the new
	// session of that name, a new epoch, which the page shows.
	d.Call(http.MethodDelete, "/session/ep", "", http.StatusNoContent, nil)
	streamBanner := func() string {
		b, err := chromedp.Run(br.ctx, chromedp.Evaluate[string](`document.getElementById("streamBanner").textContent`))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	daemontest.WaitUntil(t, 20*time.Second, "the viewer to say the session was deleted", func() (bool, string) {
		b := streamBanner()
		return strings.Contains(b, `Session "ep" was deleted while you watched it`), b
	})
	if _, ok := d.StatusIfAny("ep"); ok {
		t.Fatal("the viewer reconnected after the DELETE: the daemon made the session again")
	}
	screenshot(br.ctx, t, "viewer-session-deleted.png")
	if err := chromedp.Do(br.ctx, chromedp.Click("#watchAgain")); err != nil {
		t.Fatal(err)
	}
	daemontest.WaitUntil(t, 20*time.Second, "the viewer on the new session", func() (bool, string) {
		v = read()
		st, ok := d.StatusIfAny("ep")
		return ok && v.Epoch != nil && *v.Epoch == st.Epoch, fmt.Sprintf("%+v", v)
	})
	if *v.Epoch == first || v.SilentJoins != 0 {
		t.Fatalf("after the DELETE and Watch again: %+v (first epoch %s)", v, first)
	}

	// "Also listen for type": an event of a type the page's EventSource does
	// not listen for passes it by; once the type is added, the new client
	// resumes from the old one's cursor and gets it, replayed, then live.
	d.Publish("ep", 1)
	daemontest.WaitUntil(t, 20*time.Second, "a note of the new epoch", func() (bool, string) {
		p := readPage(br.ctx, t)
		return slices.Equal(p.SeenIDs, []uint64{1}), p.summary()
	})
	d.Call(http.MethodPost, "/session/ep/events", `{"type":"custom","data":{"n":2}}`, http.StatusOK, nil)
	time.Sleep(300 * time.Millisecond)
	if p := readPage(br.ctx, t); len(p.SeenIDs) != 1 {
		t.Fatalf("the page got a type it does not listen for: %s", p.summary())
	}
	if err := chromedp.Do(br.ctx, chromedp.SendKeys("#extraType", "custom"), chromedp.Click("#addType")); err != nil {
		t.Fatal(err)
	}
	d.Call(http.MethodPost, "/session/ep/events", `{"type":"custom","data":{"n":3}}`, http.StatusOK, nil)
	var p pageState
	daemontest.WaitUntil(t, 20*time.Second, "the custom events", func() (bool, string) {
		p = readPage(br.ctx, t)
		return len(p.SeenIDs) == 3, p.summary()
	})
	var custom []uint64
	for _, f := range p.Frames {
		if f.Type == "custom" && !f.Synthetic {
			custom = append(custom, *f.ID)
		}
	}
	if !slices.Equal(p.SeenIDs, []uint64{1, 2, 3}) || !slices.Equal(custom, []uint64{2, 3}) {
		t.Fatalf("after listening for custom: %s, custom events %v", p.summary(), custom)
	}
}

// TestViewerBothCuts: the viewer's two cut buttons. "Cut streams" ends the
// response, "Abort connections" resets the TCP connection; after each the
// viewer's client reconnects by itself and the page has every id once. With
// both of its transports: the browser's EventSource (what it uses when it
// can) and fetch streaming (?transport=fetch).
func TestViewerBothCuts(t *testing.T) {
	for _, transport := range []string{"EventSource", "fetch"} {
		t.Run(transport, func(t *testing.T) { testViewerBothCuts(t, transport) })
	}
}

func testViewerBothCuts(t *testing.T, transport string) {
	chromium := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	d := daemontest.Start(ctx, t, daemontest.Build(ctx, t, "..", raceEnabled), "-retry", "300ms")
	br := newBrowser(ctx, t, chromium)
	query := "?session=cuts"
	if transport == "fetch" {
		query += "&transport=fetch"
	}
	if err := chromedp.Do(br.ctx, chromedp.Navigate(d.Base+"/"+query)); err != nil {
		t.Fatal(err)
	}
	daemontest.WaitUntil(t, 20*time.Second, "the viewer to subscribe", func() (bool, string) {
		return readPage(br.ctx, t).ConnState == "open" && d.Status("cuts").Subscribers == 1, readPage(br.ctx, t).summary()
	})
	n := 0
	publish := func(k int) {
		for range k {
			n++
			d.Publish("cuts", n)
		}
	}
	publish(5)
	for i, button := range []string{"#cut", "#abort"} {
		daemontest.WaitUntil(t, 20*time.Second, fmt.Sprintf("%d ids before %s", n, button), func() (bool, string) {
			p := readPage(br.ctx, t)
			return len(p.SeenIDs) == n, p.summary()
		})
		if err := chromedp.Do(br.ctx, chromedp.Click(button)); err != nil {
			t.Fatal(err)
		}
		daemontest.WaitUntil(t, 20*time.Second, button+" to cut the stream", func() (bool, string) {
			st := d.Status("cuts")
			return st.Subscribers == 0 || st.StreamsOpened > i+1, fmt.Sprintf("%+v", st)
		})
		publish(5)
		daemontest.WaitUntil(t, 20*time.Second, "the viewer to come back after "+button, func() (bool, string) {
			p := readPage(br.ctx, t)
			return p.Reconnects == i+1 && len(p.SeenIDs) == n, p.summary()
		})
	}
	p := readPage(br.ctx, t)
	for i, id := range p.SeenIDs {
		if id != uint64(i+1) {
			t.Fatalf("ids %v, want 1..%d once each", p.SeenIDs, n)
		}
	}
	if p.Resyncs != 0 {
		t.Fatalf("%d resyncs", p.Resyncs)
	}
	// Three streams, each with the transport asked for; the two resumes
	// with the cursor in the epoch form.
	v := readViewer(br.ctx, t)
	epoch := d.Status("cuts").Epoch
	if len(v.Attempts) != 3 || v.Attempts[1].LastEventID != epoch+":5" || v.Attempts[2].LastEventID != epoch+":10" ||
		slices.ContainsFunc(v.Attempts, func(a viewerAttempt) bool { return a.Transport != transport }) {
		t.Fatalf("attempts %+v, want three over %s resuming after %s:5 and :10", v.Attempts, transport, epoch)
	}
	screenshot(br.ctx, t, "viewer-both-cuts-"+transport+".png")
}
