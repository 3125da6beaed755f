package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/internal/daemontest"
)

// tailFrame is one frame a reading client got, and when.
type tailFrame struct {
	frame sseFrame
	at    time.Time
}

// readAll reads s to its end on a goroutine of its own, sending every frame
// (with the time it arrived) on the returned channel, closed at the end.
func readAll(s *sseStream) <-chan tailFrame {
	ch := make(chan tailFrame, 64)
	go func() {
		defer close(ch)
		for {
			f, err := s.next()
			if err != nil {
				return
			}
			ch <- tailFrame{f, time.Now()}
		}
	}()
	return ch
}

// Issue 22, point 4, against the daemon as a process on real sockets: on
// SIGTERM every reading stream gets what was published and the stream_error
// shutdown with -shutdown-retry-after at once, while a client that never
// reads (a raw connection with a small receive buffer, its handler blocked
// in a write) holds nobody and is cut at -shutdown-timeout, when the
// process exits. Under the default overflow policy that client has been
// evicted by then (only its blocked write holds the HTTP server's
// shutdown); under catchup it is still subscribed (and holds Hub.Shutdown
// too, until closing its connection at the bound discards its queue).
func TestDaemonShutdownSaysSoAndCutsAClientThatNeverReads(t *testing.T) {
	bin := buildDaemon(t)
	for _, overflow := range []string{"evict", "catchup"} {
		t.Run(overflow, func(t *testing.T) { testDaemonShutdown(t, bin, overflow) })
	}
}

func testDaemonShutdown(t *testing.T, bin, overflow string) {
	const bound = 3 * time.Second
	d, addr := startDaemon(t, bin, "-shutdown-timeout", bound.String(), "-shutdown-retry-after", "1500ms", "-overflow", overflow)
	url := d.Base + "/session/s/events"

	var readers []<-chan tailFrame
	for range 3 {
		readers = append(readers, readAll(openStream(t, url, nil)))
	}
	never, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer never.Close()
	if err := never.(*net.TCPConn).SetReadBuffer(4096); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(never, "GET /session/s/events HTTP/1.1\r\nHost: %s\r\n\r\n", addr)
	daemontest.WaitUntil(t, 5*time.Second, "4 subscribers", func() (bool, string) {
		st := d.Status("s")
		return st.Subscribers == 4, fmt.Sprint(st.Subscribers)
	})

	// Events of 512 KiB, each read by every reader before the next goes
	// out (no reader falls behind), until the never-reading connection's
	// handler is blocked in a write for sure: its socket buffers (4 MiB at
	// most here) and, under evict, its queue (2 MiB, then it is evicted)
	// are full.
	const size = 512 << 10
	body := `{"type":"big","data":"` + strings.Repeat("x", size) + `"}`
	published := 0
	publish := func() {
		t.Helper()
		d.Call(http.MethodPost, "/session/s/events", body, http.StatusOK, nil)
		published++
		for i, r := range readers {
			for got := false; !got; {
				select {
				case f, ok := <-r:
					if !ok {
						t.Fatalf("reader %d ended after %d events", i, published-1)
					}
					got = f.frame.event == "big"
				case <-time.After(20 * time.Second):
					t.Fatalf("reader %d did not get event %d", i, published)
				}
			}
		}
	}
	if overflow == "evict" {
		for d.Status("s").Subscribers == 4 {
			if published == 64 {
				t.Fatalf("the never-reading client was not evicted after %d events of %d bytes", published, size)
			}
			publish()
		}
	} else {
		for range 24 { // 12 MiB
			publish()
		}
		if n := d.Status("s").Subscribers; n != 4 {
			t.Fatalf("%d subscribers under catchup, want 4: the never-reading one stays", n)
		}
	}
	t.Logf("%d events of %d bytes published", published, size)

	start := time.Now()
	exited := make(chan time.Duration, 1)
	go func() {
		d.Stop(bound + 5*time.Second)
		exited <- time.Since(start)
	}()
	var slowest time.Duration
	for i, r := range readers {
		var last tailFrame
		var rest []string
		for f := range r {
			last = f
			rest = append(rest, f.frame.event)
		}
		if len(rest) != 1 || last.frame.event != eventbus.TypeStreamError {
			t.Fatalf("reader %d ended with %q, want one stream_error", i, rest)
		}
		var env struct {
			Data struct {
				ErrorKind  string `json:"errorKind"`
				RetryAfter int64  `json:"retryAfter"`
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(last.frame.data), &env); err != nil {
			t.Fatal(err)
		}
		if env.Data.ErrorKind != eventbus.ErrorKindShutdown || env.Data.RetryAfter != 1500 {
			t.Fatalf("reader %d's last frame %s, want errorKind shutdown, retryAfter 1500", i, last.frame.data)
		}
		took := last.at.Sub(start)
		if took > time.Second {
			t.Fatalf("reader %d got the shutdown frame %v after SIGTERM, want at once (the bound is %v)", i, took, bound)
		}
		slowest = max(slowest, took)
	}
	took := <-exited
	t.Logf("the readers had the shutdown frame %v after SIGTERM at the latest; the daemon exited after %v (bound %v)",
		slowest.Round(time.Millisecond), took.Round(time.Millisecond), bound)
	if took < bound-100*time.Millisecond || took > bound+time.Second {
		t.Fatalf("the daemon exited %v after SIGTERM, want at the bound %v (held by the client that never reads, no longer)", took, bound)
	}
	if !strings.Contains(d.LogText(), `msg="shutdown timed out; closing connections"`) {
		t.Fatalf("no timeout line in the log:\n%s", d.LogText())
	}
}
