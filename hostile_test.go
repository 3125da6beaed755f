package eventbus

import (
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHostileClientNeverReads: a client sends its request and never reads
// a byte, not even the response headers. One 12 MiB event (accepted: no
// live entry is queued, and the handler takes it at once) fills the
// sockets; the write blocks, hits Handler.WriteTimeout, and the
// subscription is dropped, reason blocked: not evicted, and nothing stays
// behind (subscriber count, goroutines).
func TestHostileClientNeverReads(t *testing.T) {
	var diags atomic.Int64
	b := newBus(t, Options{OnDiagnostic: func(d Diagnostic) bool {
		if d.Kind == DiagWriteFailed {
			diags.Add(1)
		}
		return true
	}})
	ts := serveSession(t, b, &Handler{WriteTimeout: 300 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	baseG := runtime.NumGoroutine()

	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(4096)
	if _, err := io.WriteString(conn, "GET /session/s/events HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	require.Eventually(t, func() bool { return b.SubscriberCount() == 1 }, 20*time.Second, time.Millisecond)
	if _, err := b.Publish(Event{Type: "big", Data: strings.Repeat("b", 12<<20)}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	require.Eventually(t, func() bool { return b.SubscriberCount() == 0 }, 20*time.Second, time.Millisecond)
	gone := time.Since(start)
	// The subscription is unregistered first; the drop is counted and the
	// diagnostic emitted right after, on the handler's goroutine.
	require.Eventually(t, func() bool { return diags.Load() > 0 }, 5*time.Second, time.Millisecond, "no write_failed diagnostic")
	st := b.Stats()
	if st.Dropped.Blocked == 0 || st.Evictions != (EvictionStats{}) || diags.Load() != 1 {
		t.Errorf("dropped %+v, evictions %+v, %d write_failed diagnostics", st.Dropped, st.Evictions, diags.Load())
	}
	conn.Close()
	if g := waitGoroutines(baseG); g > baseG {
		t.Errorf("goroutines: %d, baseline %d", g, baseG)
	}
	t.Logf("a client that never reads was dropped %v after Publish of the 12 MiB event returned (WriteTimeout 300ms)", gone.Round(time.Millisecond))
}
