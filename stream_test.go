package eventbus

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ssebus/eventbus/internal/pipenet"
)

// ---------------------------------------------------------------------------
// Response headers and the first bytes.

func TestHandlerResponseHeaders(t *testing.T) {
	check := func(t *testing.T, resp *http.Response, b *EventBus) {
		t.Helper()
		h := resp.Header
		require.Equal(t, []string{"text/event-stream"}, h.Values("Content-Type"))
		require.Equal(t, []string{"no-cache, no-transform"}, h.Values("Cache-Control"))
		require.Equal(t, []string{"no"}, h.Values("X-Accel-Buffering"))
		require.Equal(t, []string{b.Epoch()}, h.Values("Event-Epoch"))
		require.Regexp(t, regexp.MustCompile(`^[0-9a-f]{32}$`), h.Get("Event-Epoch"))
		require.Equal(t, []string{"Event-Epoch"}, h.Values("Access-Control-Expose-Headers"))
		require.Empty(t, h.Values("Content-Length"))
		require.Equal(t, int64(-1), resp.ContentLength)
	}

	t.Run("HTTP/1.1", func(t *testing.T) {
		e := newEnv(t, envOptions{})
		b := e.bus(t, "s", Options{})
		c := e.stream(t, "/session/s/events", nil)
		require.Equal(t, 1, c.resp.ProtoMinor)
		check(t, c.resp, b)
		require.Equal(t, []string{"keep-alive"}, c.resp.Header.Values("Connection"))
		require.Equal(t, "retry: 3000\n", string(c.raw()), "the retry directive comes first, alone, flushed at once")
	})
	t.Run("HTTP/2", func(t *testing.T) {
		e := newEnv(t, envOptions{http2: true})
		b := e.bus(t, "s", Options{})
		c := e.stream(t, "/session/s/events", nil)
		require.Equal(t, 2, c.resp.ProtoMajor)
		check(t, c.resp, b)
		require.Empty(t, c.resp.Header.Values("Connection"), "no connection-specific header on HTTP/2")
		publishN(t, b, 1)
		c.expect(wantEvent(1))
	})
	t.Run("HTTP/1.0", func(t *testing.T) {
		e := newEnv(t, envOptions{})
		e.bus(t, "s", Options{})
		conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
		require.NoError(t, err)
		defer conn.Close()
		require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
		_, err = io.WriteString(conn, "GET /session/s/events HTTP/1.0\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.NotEqual(t, "keep-alive", resp.Header.Get("Connection"), "keep-alive is for HTTP/1.1 only")
		buf := make([]byte, len("retry: 3000\n"))
		_, err = io.ReadFull(resp.Body, buf)
		require.NoError(t, err)
		require.Equal(t, "retry: 3000\n", string(buf))
	})
}

func TestHandlerRetryDirective(t *testing.T) {
	for _, tc := range []struct {
		retry time.Duration
		want  int64
	}{
		{0, 3000},
		{1500 * time.Millisecond, 1500},
		{time.Minute, 60000},
	} {
		t.Run(tc.retry.String(), func(t *testing.T) {
			e := newEnv(t, envOptions{handler: &Handler{Retry: tc.retry}})
			e.bus(t, "s", Options{})
			c := e.open(t, "/session/s/events", nil)
			require.Equal(t, sseRecord{Kind: sseRetryRecord, Retry: tc.want}, c.next())
			require.Equal(t, fmt.Sprintf("retry: %d\n", tc.want), string(c.raw()))
		})
	}
}

// ---------------------------------------------------------------------------
// Heartbeat and write deadlines, on the fake clock of a synctest bubble with
// in-memory writers (the real network is not durably blocking).

func TestHandlerHeartbeat(t *testing.T) {
	for _, tc := range []struct {
		name  string
		every time.Duration
	}{
		{"default", 0},
		{"custom", 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				every := orDefault(tc.every, DefaultHeartbeat)
				logs := &logCapture{}
				b := newBus(t, logs.capture(Options{}))
				h := busHandler(b, logs)
				h.Heartbeat = tc.every
				w := newMemWriter() // no SetWriteDeadline: ErrNotSupported is fine
				cancel, done := serveMem(h, w, "/session/s/events", nil)
				synctest.Wait()
				require.Equal(t, "retry: 3000\n", w.state().body)
				require.Equal(t, 1, w.state().flushes)

				// A heartbeat is a ":" line, or the retry: line again when
				// the stream has had an event since its last one.
				beats := func() int {
					n := -1 // the retry: line that opens the stream
					for line := range strings.SplitSeq(w.state().body, "\n") {
						if line == ":" || line == "retry: 3000" {
							n++
						}
					}
					return n
				}
				time.Sleep(every - time.Nanosecond)
				synctest.Wait()
				require.Equal(t, 0, beats(), "no heartbeat before the idle time")
				time.Sleep(time.Nanosecond)
				synctest.Wait()
				require.Equal(t, 1, beats())
				require.Equal(t, "retry: 3000\n:\n", w.state().body, "the retry: line already gave the tail a field")
				require.Equal(t, 2, w.state().flushes, "a heartbeat is flushed")

				// A write postpones the next heartbeat to a full idle time after it.
				time.Sleep(every / 2)
				publishN(t, b, 1)
				synctest.Wait()
				require.Equal(t, 3, w.state().flushes)
				time.Sleep(every - time.Nanosecond)
				synctest.Wait()
				require.Equal(t, 1, beats())
				time.Sleep(time.Nanosecond)
				synctest.Wait()
				require.Equal(t, 2, beats())
				require.True(t, strings.HasSuffix(w.state().body, "\n\nretry: 3000\n"), "the first heartbeat after an event is the retry: line")

				// And it keeps beating while idle.
				time.Sleep(3 * every)
				synctest.Wait()
				require.Equal(t, 5, beats())

				cancel()
				<-done
				recs := parseBody(t, w.state().body)
				comment := sseRecord{Kind: sseCommentRecord, Comment: ""}
				retry := sseRecord{Kind: sseRetryRecord, Retry: 3000}
				require.Equal(t, []sseRecord{
					retry, comment,
					{Kind: sseEventRecord, Event: wantEvent(1)}, retry, comment, comment, comment,
				}, recs, "a heartbeat is a comment: it never goes through the queue or dispatches an event")
				require.Zero(t, b.SubscriberCount())
			})
		})
	}
}

// serveProto is serveMem for a GET of /session/s/events over HTTP/major.
func serveProto(h *Handler, w http.ResponseWriter, major int) (cancel func(), done <-chan struct{}) {
	ctx, cancelCtx := context.WithCancel(context.Background())
	req := httptest.NewRequest(http.MethodGet, "/session/s/events", nil).WithContext(ctx)
	req.ProtoMajor, req.ProtoMinor = major, 0
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		h.ServeHTTP(w, req)
	}()
	return cancelCtx, ch
}

func TestHandlerWriteDeadline(t *testing.T) {
	// On HTTP/2 every batch sets a deadline and clears it after its flush:
	// an idle stream must have none. On HTTP/1.x the deadline stays and a
	// batch sets a new one only when it is older than WriteTimeout/8.
	for _, tc := range []struct {
		major int
		want  func(at func(time.Duration) time.Time) []deadlineSet
	}{
		{2, func(at func(time.Duration) time.Time) []deadlineSet {
			return []deadlineSet{
				{at(0), at(DefaultWriteTimeout)},                                 // retry:
				{at(0), time.Time{}},                                             // cleared
				{at(5 * time.Second), at(5*time.Second + DefaultWriteTimeout)},   // the batch
				{at(5 * time.Second), time.Time{}},                               // cleared
				{at(6 * time.Second), at(6*time.Second + DefaultWriteTimeout)},   // the next batch
				{at(6 * time.Second), time.Time{}},                               // cleared
				{at(21 * time.Second), at(21*time.Second + DefaultWriteTimeout)}, // the heartbeat
				{at(21 * time.Second), time.Time{}},                              // cleared
			}
		}},
		{1, func(at func(time.Duration) time.Time) []deadlineSet {
			return []deadlineSet{
				{at(0), at(DefaultWriteTimeout)},                               // retry:
				{at(5 * time.Second), at(5*time.Second + DefaultWriteTimeout)}, // the batch: 5s > 30s/8 later
				// The next batch, 1s later, keeps it: 29s of it are left.
				{at(21 * time.Second), at(21*time.Second + DefaultWriteTimeout)}, // the heartbeat
				{at(21 * time.Second), time.Time{}},                              // cleared as the client leaves
			}
		}},
	} {
		t.Run(fmt.Sprintf("HTTP/%d", tc.major), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				logs := &logCapture{}
				b := newBus(t, logs.capture(Options{}))
				w := newDeadlineWriter(0)
				start := time.Now()
				cancel, done := serveProto(busHandler(b, logs), w, tc.major)
				synctest.Wait()
				time.Sleep(5 * time.Second)
				publishN(t, b, 1) // a batch at 5s
				synctest.Wait()
				time.Sleep(time.Second)
				publishN(t, b, 1) // a batch at 6s
				synctest.Wait()
				time.Sleep(DefaultHeartbeat) // a heartbeat at 21s
				synctest.Wait()
				cancel()
				<-done
				at := func(d time.Duration) time.Time { return start.Add(d) }
				require.Equal(t, tc.want(at), w.deadlineSets())
				require.Equal(t, 4, w.state().writes)
			})
		})
	}

	for _, tc := range []struct {
		name      string
		timeout   time.Duration
		blockFrom int                         // the write that blocks
		trigger   func(*testing.T, *EventBus) // makes that write happen
		at        time.Duration               // when the write starts
	}{
		{"retry line blocks", 0, 1, func(*testing.T, *EventBus) {}, 0},
		{"batch blocks", 2 * time.Second, 2, func(t *testing.T, b *EventBus) {
			time.Sleep(5 * time.Second)
			publishN(t, b, 3)
		}, 5 * time.Second},
		{"heartbeat blocks", time.Second, 2, func(*testing.T, *EventBus) {}, DefaultHeartbeat},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				timeout := orDefault(tc.timeout, DefaultWriteTimeout)
				logs := &logCapture{}
				b := newBus(t, logs.capture(Options{}))
				h := busHandler(b, logs)
				h.WriteTimeout = tc.timeout
				w := newDeadlineWriter(tc.blockFrom)
				start := time.Now()
				_, done := serveMem(h, w, "/session/s/events", nil)
				synctest.Wait()
				require.Equal(t, 1, b.SubscriberCount())
				tc.trigger(t, b)
				synctest.Wait()

				time.Sleep(tc.at + timeout - time.Since(start) - time.Nanosecond)
				synctest.Wait()
				require.Equal(t, 1, b.SubscriberCount(), "still blocked just before the deadline")
				select {
				case <-done:
					require.FailNow(t, "handler returned before the deadline")
				default:
				}
				time.Sleep(time.Nanosecond)
				synctest.Wait()
				select {
				case <-done:
				default:
					require.FailNow(t, "handler still running at the deadline")
				}
				require.Equal(t, tc.at+timeout, time.Since(start))
				require.Zero(t, b.SubscriberCount(), "a blocked write cancels the subscription at once")

				st := w.state()
				if tc.blockFrom == 1 {
					require.Empty(t, st.body)
				} else {
					require.Equal(t, "retry: 3000\n", st.body, "no frame after a failed write")
				}
				require.Len(t, logs.kind(DiagWriteFailed), 1)
				require.Equal(t, uint64(3*boolInt(tc.name == "batch blocks")), b.Stats().Dropped.Blocked,
					"the frames of the failed batch count as dropped, reason blocked")
				require.Zero(t, b.Stats().Dropped.Cancelled)

				// The bus is unharmed.
				publishN(t, b, 1)
			})
		})
	}
}

// cancelOnHeader ends the request's context as the handler writes the
// status, after subscribing and before its first write: the client reset
// the stream in between.
type cancelOnHeader struct {
	*deadlineWriter
	cancel func()
}

func (w cancelOnHeader) WriteHeader(code int) {
	w.cancel()
	w.deadlineWriter.WriteHeader(code)
}

// No exit of the stream loop leaves a write deadline behind, but the one an
// HTTP/1.x response's last chunk gets; none is set once the request is
// done. On HTTP/2 a deadline left on a reset stream is a timer that keeps
// the stream alive for the whole WriteTimeout (rapid reset, see
// TestHandlerHTTP2RapidResetHeap).
func TestHandlerWriteDeadlineOnExit(t *testing.T) {
	cleared := func(t *testing.T, sets []deadlineSet) {
		t.Helper()
		require.NotEmpty(t, sets)
		require.Zero(t, sets[len(sets)-1].deadline, "the last deadline set is cleared: %v", sets)
	}
	t.Run("a failed write", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := newBus(t, Options{})
			w := newDeadlineWriter(2)
			h := busHandler(b, &logCapture{})
			_, done := serveProto(h, w, 2)
			synctest.Wait()
			publishN(t, b, 1)
			<-done
			sets := w.deadlineSets()
			require.Len(t, sets, 4, "retry:, cleared, the batch, cleared after it failed: %v", sets)
			cleared(t, sets)
			require.EqualValues(t, 1, b.Stats().Dropped.Blocked)
		})
	})
	t.Run("the client leaves while idle", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := newBus(t, Options{})
			w := newDeadlineWriter(0)
			cancel, done := serveProto(busHandler(b, &logCapture{}), w, 2)
			synctest.Wait()
			cancel()
			<-done
			require.Len(t, w.deadlineSets(), 2, "retry: and its clear")
			cleared(t, w.deadlineSets())
		})
	})
	t.Run("the client left before the first write", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := newBus(t, Options{})
			ctx, cancel := context.WithCancel(context.Background())
			w := cancelOnHeader{newDeadlineWriter(0), cancel}
			req := httptest.NewRequest(http.MethodGet, "/session/s/events", nil).WithContext(ctx)
			req.ProtoMajor, req.ProtoMinor = 2, 0
			busHandler(b, &logCapture{}).ServeHTTP(w, req)
			require.Empty(t, w.deadlineSets(), "no deadline once the request is done")
			require.Empty(t, w.state().body, "nothing written")
			require.Zero(t, b.SubscriberCount())
			require.Zero(t, b.Stats().Dropped.Blocked, "a client that left is no blocked writer")
		})
	})
	for _, tc := range []struct {
		protoMajor int
		lastChunk  bool
		closeAt    time.Duration // when the bus closes
	}{{1, true, 0}, {1, true, 10 * time.Second}, {2, false, 0}} {
		t.Run(fmt.Sprintf("the bus closes at %v, HTTP/%d", tc.closeAt, tc.protoMajor), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := newBus(t, Options{})
				w := newDeadlineWriter(0)
				start := time.Now()
				_, done := serveProto(busHandler(b, &logCapture{}), w, tc.protoMajor)
				synctest.Wait()
				publishN(t, b, 1)
				synctest.Wait()
				time.Sleep(tc.closeAt)
				require.NoError(t, b.Close())
				<-done
				sets := w.deadlineSets()
				if !tc.lastChunk {
					cleared(t, sets)
					return
				}
				// The deadline the last batch left stays for net/http's last
				// chunk, or a new one when that is older than WriteTimeout/8.
				want := []deadlineSet{{start, start.Add(DefaultWriteTimeout)}}
				if tc.closeAt > DefaultWriteTimeout/8 {
					want = append(want, deadlineSet{start.Add(tc.closeAt), start.Add(tc.closeAt + DefaultWriteTimeout)})
				}
				require.Equal(t, want, sets, "net/http's last chunk has a deadline, never a cleared one")
			})
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Go's HTTP/2 server resets a stream when its write deadline passes, also
// while the handler writes nothing. The handler clears the deadline after
// every flush, so a stream may stay idle longer than WriteTimeout: here a
// heartbeat of 60 s against a write timeout of 5 s, for 10 minutes.
func TestHandlerHTTP2IdleLongerThanWriteTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logCapture{}
		b := newBus(t, logs.capture(Options{}))
		h := busHandler(b, logs)
		h.WriteTimeout = 5 * time.Second
		h.Heartbeat = time.Minute
		recs, _, _ := h2Stream(t, h2cEnv(t, h), nil)
		synctest.Wait()
		require.Equal(t, []sseRecord{{Kind: sseRetryRecord, Retry: 3000}}, drain(recs))

		time.Sleep(45 * time.Second) // 9 write timeouts without a write
		synctest.Wait()
		require.Empty(t, drain(recs))
		require.Equal(t, 1, b.SubscriberCount(), "the idle stream is alive")
		publishN(t, b, 1)
		synctest.Wait()
		require.Equal(t, []sseRecord{{Kind: sseEventRecord, Event: wantEvent(1)}}, drain(recs), "flushed at once")

		for i := range 10 { // one heartbeat a minute, each flushed
			time.Sleep(time.Minute)
			synctest.Wait()
			want := sseRecord{Kind: sseCommentRecord}
			if i == 0 {
				want = sseRecord{Kind: sseRetryRecord, Retry: 3000} // the first after an event
			}
			require.Equal(t, []sseRecord{want}, drain(recs))
		}
		publishN(t, b, 1)
		synctest.Wait()
		require.Equal(t, []sseRecord{{Kind: sseEventRecord, Event: wantEvent(2)}}, drain(recs))
		require.Empty(t, logs.kind(DiagWriteFailed))
		require.Zero(t, b.Stats().Dropped.Blocked)
	})
}

// h2Reset is a hand-written HTTP/2 client for the rapid-reset attack
// (CVE-2023-44487): on one connection it opens streams with a HEADERS frame
// and resets each at once with RST_STREAM, without waiting for an answer.
// Frames are written by hand because the standard library's client does not
// reset a stream it has not seen answered yet on purpose.
type h2Reset struct {
	conn   net.Conn
	next   uint32        // the next stream id (odd)
	read   chan error    // the reader's end
	ready  chan struct{} // closed once the server's SETTINGS arrived
	header []byte        // the HPACK block of GET /session/s/events
}

// dialH2Reset opens a connection to ln with the client preface, SETTINGS and
// a large connection window (the server's answers to streams it has not yet
// seen reset spend it), and discards what the server writes.
func dialH2Reset(t *testing.T, ln *pipenet.Listener) *h2Reset {
	conn, err := ln.DialContext(context.Background(), "", "")
	require.NoError(t, err)
	c := &h2Reset{conn: conn, next: 1, read: make(chan error, 1), ready: make(chan struct{})}
	// HPACK (RFC 7541): :method GET and :scheme http from the static table,
	// then :path and :authority as literals without indexing on their
	// static names, no Huffman coding.
	c.header = []byte{0x82, 0x86}
	for _, kv := range []struct {
		index byte
		value string
	}{{4, "/session/s/events"}, {1, "pipe"}} {
		c.header = append(append(c.header, kv.index, byte(len(kv.value))), kv.value...)
	}
	go func() {
		hdr := make([]byte, 9)
		settings := false
		for {
			if _, err := io.ReadFull(conn, hdr); err != nil {
				c.read <- err
				return
			}
			n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
			if _, err := io.CopyN(io.Discard, conn, int64(n)); err != nil {
				c.read <- err
				return
			}
			if hdr[3] == 0x4 && hdr[4]&0x1 == 0 && !settings { // SETTINGS, not an ACK
				settings = true
				close(c.ready)
			}
		}
	}()
	_, err = io.WriteString(conn, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	require.NoError(t, err)
	c.frame(0x4, 0, 0, nil) // SETTINGS
	<-c.ready
	c.frame(0x4, 0x1, 0, nil)                                     // SETTINGS ACK
	c.frame(0x8, 0, 0, binary.BigEndian.AppendUint32(nil, 1<<30)) // WINDOW_UPDATE
	t.Cleanup(func() {
		_ = conn.Close()
		<-c.read
	})
	return c
}

func (c *h2Reset) frame(typ, flags byte, stream uint32, payload []byte) {
	b := make([]byte, 9, 9+len(payload))
	b[0], b[1], b[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	b[3], b[4] = typ, flags
	binary.BigEndian.PutUint32(b[5:], stream)
	// A failed write shows as the reader's end, checked by the caller.
	_, _ = c.conn.Write(append(b, payload...))
}

// openReset opens one stream (HEADERS with END_HEADERS and END_STREAM) and
// resets it at once (RST_STREAM, CANCEL).
func (c *h2Reset) openReset() {
	id := c.next
	c.next += 2
	c.frame(0x1, 0x1|0x4, id, c.header)
	c.frame(0x3, 0, id, binary.BigEndian.AppendUint32(nil, 0x8))
}

// lateHeader holds the response's header until the client has reset the
// stream, so that the handler writes its first batch, as in the attack's
// worst case, on a stream already closed.
type lateHeader struct {
	http.ResponseWriter
	reset <-chan struct{}
}

func (w lateHeader) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w lateHeader) WriteHeader(code int) {
	<-w.reset
	w.ResponseWriter.WriteHeader(code)
}

// A client that opens streams and resets them at once (HTTP/2 rapid reset)
// must leave nothing behind once the handlers have returned. Each reset
// stream used to be kept alive by a write-deadline timer armed after the
// reset, for the whole WriteTimeout (here 30 s): Go's HTTP/2 server stops
// a stream's timer when the stream closes, but a deadline set after that
// starts one that nothing stops, so the heap grew with the reset rate times
// the write timeout (issue 22: 322 MiB of live heap). Half the streams run
// as they come (the reset lands anywhere in the handler), half write their
// first batch only once the reset has arrived (the worst case).
func TestHandlerHTTP2RapidResetHeap(t *testing.T) {
	const conns = 4
	resets := 8000 // over all connections
	if testing.Short() {
		resets = 2000
	}
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		h := &Handler{
			Lookup:       func(*http.Request, string) (*EventBus, error) { return b, nil },
			Logger:       slog.New(slog.DiscardHandler),
			WriteTimeout: 30 * time.Second,
		}
		// At most inFlight handlers at once, fewer than the server's 250
		// concurrent streams: past those a stream waits for a handler, may
		// never run once reset, and 1000 waiting end the connection
		// (ENHANCE_YOUR_CALM).
		const inFlight = 100
		slots := make(chan struct{}, inFlight)
		var served atomic.Int64
		counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() { <-slots }()
			if served.Add(1)%2 == 0 {
				w = lateHeader{w, r.Context().Done()}
			}
			h.ServeHTTP(w, r)
		})
		ln := h2cServe(t, counted)
		clients := make([]*h2Reset, conns)
		for i := range clients {
			clients[i] = dialH2Reset(t, ln)
		}
		burst := func(n int) {
			var wg sync.WaitGroup
			for _, c := range clients {
				wg.Go(func() {
					for range n / conns {
						slots <- struct{}{}
						c.openReset()
					}
				})
			}
			wg.Wait()
			for range inFlight { // every handler has returned
				slots <- struct{}{}
			}
			for range inFlight {
				<-slots
			}
		}
		heap := func() uint64 {
			// What the server frees on its own once the connections are
			// idle is not kept: let the bubble's clock move by a
			// millisecond, far from the write timeout.
			time.Sleep(time.Millisecond)
			synctest.Wait()
			var ms runtime.MemStats
			runtime.GC()
			runtime.GC()
			runtime.ReadMemStats(&ms)
			return ms.HeapAlloc
		}
		burst(4 * inFlight) // warm up the server's pools and maps
		before := heap()
		burst(resets)
		after := heap()
		for _, c := range clients {
			select {
			case err := <-c.read:
				require.FailNow(t, "the server ended a connection", "%v", err)
			default:
			}
		}
		require.EqualValues(t, 4*inFlight+resets, served.Load(), "every stream ran the handler")
		require.Zero(t, b.SubscriberCount())
		grown := int64(after) - int64(before)
		t.Logf("%d reset streams: heap %d -> %d bytes (%+d, %.0f per stream)", resets, before, after, grown, float64(grown)/float64(resets))
		// A stream pinned by its timer holds about 550 bytes, so half of
		// them pinned is some 275 per stream; what the server keeps
		// otherwise (its maps, the goroutines' records) is 10-40.
		require.Less(t, grown, int64(100*resets), "reset streams are kept alive")
	})
}

// ---------------------------------------------------------------------------
// Ending a stream: disconnect, a reader that never reads, bus Close,
// eviction, unexpected errors.

func TestHandlerClientDisconnect(t *testing.T) {
	e := newEnv(t, envOptions{})
	b := e.bus(t, "s", Options{})
	c := e.stream(t, "/session/s/events", nil)
	publishN(t, b, 3)
	c.expect(wantEvent(1), wantEvent(2), wantEvent(3))
	require.Equal(t, 1, b.SubscriberCount())

	start := time.Now()
	require.NoError(t, c.resp.Body.Close())
	require.Eventually(t, func() bool { return b.SubscriberCount() == 0 }, 5*time.Second, time.Millisecond,
		"a client disconnect cancels the subscription")
	t.Logf("subscription gone %v after the disconnect", time.Since(start))
	require.Zero(t, b.Stats().Dropped.Blocked, "a disconnect is a cancellation, not a blocked writer")
	require.Empty(t, e.logs.kind(DiagWriteFailed))
	publishN(t, b, 1)
}

func TestHandlerSlowReaderDropped(t *testing.T) {
	const writeTimeout = 200 * time.Millisecond
	setup := func(t *testing.T, http2 bool) (*testEnv, *countingMiddleware, *EventBus) {
		mw := &countingMiddleware{}
		e := newEnv(t, envOptions{handler: &Handler{WriteTimeout: writeTimeout}, wrap: mw.wrap, http2: http2})
		// Caps high enough that the queue never evicts: only the write
		// deadline may drop this subscriber.
		b := e.bus(t, "s", Options{MaxQueued: 1 << 20, MaxQueuedBytes: 1 << 30})
		return e, mw, b
	}
	// flood publishes 128 KiB events until the subscriber is gone.
	flood := func(t *testing.T, e *testEnv, mw *countingMiddleware, b *EventBus) {
		require.Equal(t, 1, b.SubscriberCount())
		payload := strings.Repeat("x", 128<<10)
		start := time.Now()
		var slowestPublish time.Duration
		var publishedAt []time.Time
		for b.SubscriberCount() > 0 && time.Since(start) < 20*time.Second {
			t0 := time.Now()
			_, err := b.Publish(Event{Type: "big", Data: payload})
			slowestPublish = max(slowestPublish, time.Since(t0))
			require.NoError(t, err)
			publishedAt = append(publishedAt, time.Now())
			time.Sleep(2 * time.Millisecond)
		}
		published := len(publishedAt)
		gone := time.Since(start)
		require.Zero(t, b.SubscriberCount(), "a client that never reads is dropped")
		_, _, failures, slowest := mw.writer().counts()
		t.Logf("dropped after %v and %d events of 128 KiB; slowest write or flush %v; slowest publish %v",
			gone, published, slowest, slowestPublish)
		// Publish never waits for a blocked writer: publishes completed
		// while the handler sat in its blocked write. (A bound on the
		// slowest publish alone would measure the machine's load.)
		from, to := mw.writer().slowestSpan()
		during := 0
		for _, at := range publishedAt {
			if at.After(from) && at.Before(to) {
				during++
			}
		}
		require.Positive(t, during, "publishes went on during the blocked write")
		require.Less(t, slowestPublish, 5*time.Second)
		require.GreaterOrEqual(t, failures, 1)
		require.Less(t, slowest, writeTimeout+2*time.Second, "no write or flush outlives its deadline by much")
		require.Len(t, e.logs.kind(DiagWriteFailed), 1, "a blocked writer, not a client that left")
		st := b.Stats()
		require.Positive(t, st.Dropped.Blocked)
		require.Zero(t, st.Dropped.Cancelled)
		require.Zero(t, st.Evictions.QueueOverflow+st.Evictions.QueueBytesOverflow, "dropped by the deadline, not evicted")
		_, err := b.Publish(Event{Type: "after"})
		require.NoError(t, err)
	}

	t.Run("HTTP/1.1", func(t *testing.T) {
		e, mw, b := setup(t, false)
		conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
		require.NoError(t, err)
		defer conn.Close()
		require.NoError(t, conn.(*net.TCPConn).SetReadBuffer(4096))
		require.NoError(t, conn.SetDeadline(time.Now().Add(30*time.Second)))
		_, err = io.WriteString(conn, "GET /session/s/events HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		buf := make([]byte, len("retry: 3000\n"))
		_, err = io.ReadFull(resp.Body, buf)
		require.NoError(t, err)
		// From now on the client never reads.
		flood(t, e, mw, b)
	})
	t.Run("HTTP/2", func(t *testing.T) {
		e, mw, b := setup(t, true)
		resp := e.do(t, http.MethodGet, "/session/s/events", nil)
		require.Equal(t, 2, resp.ProtoMajor)
		// The body is never read: the stream's flow-control window fills.
		flood(t, e, mw, b)
	})
}

// A plain Close (a Hub's Delete) ends a single stream after what was
// queued with stream_error closed: the session is gone, and the client
// must not take the end for a cut and reconnect (SPEC 5.2).
func TestHandlerBusCloseEndsStream(t *testing.T) {
	closed := wantSynth(TypeStreamError, `{"error":"session closed","errorKind":"closed"}`, "")
	t.Run("over HTTP", func(t *testing.T) {
		e := newEnv(t, envOptions{})
		b := e.bus(t, "s", Options{})
		publishN(t, b, 20)
		c := e.stream(t, "/session/s/events", hdr("Last-Event-ID", "0"))
		publishN(t, b, 5)
		require.NoError(t, b.Close())
		var want []sseRecord
		for i := uint64(1); i <= 20; i++ {
			want = append(want, sseRecord{Kind: sseEventRecord, Event: wantEvent(i)})
		}
		want = append(want, sseRecord{Kind: sseEventRecord, Event: wantSynth(TypeReplayComplete,
			`{"replayedCount":20,"lastReplayedEventId":20,"lastEventId":20,"epoch":"`+b.Epoch()+`"}`, "20")})
		for i := uint64(21); i <= 25; i++ {
			want = append(want, sseRecord{Kind: sseEventRecord, Event: wantEvent(i)})
		}
		closed := closed
		closed.ID = "25"
		want = append(want, sseRecord{Kind: sseEventRecord, Event: closed})
		require.Equal(t, want, c.rest(), "every buffered frame, stream_error closed, then EOF")
		require.Zero(t, b.SubscriberCount())
	})
	t.Run("frames buffered at Close", func(t *testing.T) {
		logs := &logCapture{}
		b := newBus(t, logs.capture(Options{}))
		w := newMemWriter()
		reached, release := gateFirstFlush(w)
		_, done := serveMem(busHandler(b, logs), w, "/session/s/events", nil)
		waitClosed(t, reached, "handler did not reach its first flush")
		publishN(t, b, 50)
		require.NoError(t, b.Close())
		release()
		waitClosed(t, done, "Close must end the stream without a cancellation")
		recs := parseBody(t, w.state().body)
		require.Len(t, recs, 52)
		for i := 1; i <= 50; i++ {
			require.Equal(t, wantEvent(uint64(i)), recs[i].Event)
		}
		closed := closed
		closed.ID = "50"
		require.Equal(t, closed, recs[51].Event, "once, last")
		require.Equal(t, 1, strings.Count(w.state().body, "event: "+TypeStreamError))
	})
	t.Run("subscribing to a closed bus", func(t *testing.T) {
		e := newEnv(t, envOptions{})
		b := e.bus(t, "s", Options{})
		require.NoError(t, b.Close())
		c := e.stream(t, "/session/s/events", nil)
		require.Equal(t, []sseRecord{{Kind: sseEventRecord, Event: closed}}, c.rest())
	})
	t.Run("shutdown is its own frame", func(t *testing.T) {
		// A Hub's Shutdown (CloseForShutdown) is no end of the session:
		// stream_error shutdown, never closed.
		e := newEnv(t, envOptions{})
		b := e.bus(t, "s", Options{})
		c := e.stream(t, "/session/s/events", nil)
		publishN(t, b, 1)
		require.NoError(t, b.CloseForShutdown(3*time.Second))
		shutdown := wantSynth(TypeStreamError, `{"error":"`+shutdownMessage+`","errorKind":"shutdown","retryAfter":3000}`, "1")
		require.Equal(t, []sseRecord{{Kind: sseEventRecord, Event: wantEvent(1)}, {Kind: sseEventRecord, Event: shutdown}}, c.rest())
	})
}

func TestHandlerCloseWithErrorWritesOneTerminalFrame(t *testing.T) {
	logs := &logCapture{}
	b := newBus(t, logs.capture(Options{}))
	w := newMemWriter()
	reached, release := gateFirstFlush(w)
	defer release()
	_, done := serveMem(busHandler(b, logs), w, "/session/s/events", nil)
	waitClosed(t, reached, "handler did not reach its first flush")
	publishN(t, b, 2)
	require.NoError(t, b.closeWithError(ErrorKindUnavailable, "backplane unreachable"))
	release()
	waitClosed(t, done, "the stream ends after its terminal frame")
	recs := parseBody(t, w.state().body)
	require.Equal(t, []sseRecord{
		{Kind: sseRetryRecord, Retry: 3000},
		{Kind: sseEventRecord, Event: wantEvent(1)},
		{Kind: sseEventRecord, Event: wantEvent(2)},
		{Kind: sseEventRecord, Event: wantSynth(TypeStreamError, `{"error":"backplane unreachable","errorKind":"unavailable"}`, "2")},
	}, recs, "exactly one stream_error, after what was queued")
}

func TestHandlerEviction(t *testing.T) {
	logs := &logCapture{}
	b := newBus(t, logs.capture(Options{}))
	w := newMemWriter()
	reached, release := gateFirstFlush(w)
	defer release()
	_, done := serveMem(busHandler(b, logs), w, "/session/s/events?maxQueued=16", nil)
	waitClosed(t, reached, "handler did not reach its first flush")
	fs := publishN(t, b, 17)
	require.Zero(t, b.SubscriberCount(), "the 17th live frame evicts")
	queued, at12 := 0, 0
	for i, f := range fs[:16] {
		queued += f.Size()
		if i == 11 {
			at12 = queued
		}
	}
	release()
	waitClosed(t, done, "an evicted stream ends by itself")
	recs := parseBody(t, w.state().body)
	var want []sseRecord
	want = append(want, sseRecord{Kind: sseRetryRecord, Retry: 3000})
	for i := uint64(1); i <= 16; i++ {
		want = append(want, sseRecord{Kind: sseEventRecord, Event: wantEvent(i)})
		if i == 12 {
			want = append(want, sseRecord{Kind: sseEventRecord, Event: wantSynth(TypeSlowClientWarning, fmt.Sprintf(
				`{"queueSize":12,"maxQueued":16,"lastEventId":12,"queuedBytes":%d,"maxQueuedBytes":%d,"threshold":"frames"}`,
				at12, DefaultMaxQueuedBytes), "12")})
		}
	}
	want = append(want, sseRecord{Kind: sseEventRecord, Event: wantSynth(TypeClientEvicted, fmt.Sprintf(
		`{"reason":"queue_overflow","droppedAfter":17,"queueSize":16,"maxQueued":16,"queuedBytes":%d,"maxQueuedBytes":%d}`,
		queued, DefaultMaxQueuedBytes), "16")})
	require.Equal(t, want, recs, "the terminal frame ends the stream; no stream_error after it")
}

func TestHandlerStreamError(t *testing.T) {
	t.Run("the subscription ends with an unexpected error", func(t *testing.T) {
		logs := &logCapture{}
		b := newBus(t, logs.capture(Options{}))
		w := newMemWriter()
		_, done := serveMem(busHandler(b, logs), w, "/session/s/events", nil)
		require.Eventually(t, func() bool { return w.state().flushes == 1 }, 5*time.Second, time.Millisecond)
		publishN(t, b, 1)
		require.Eventually(t, func() bool { return w.state().flushes == 2 }, 5*time.Second, time.Millisecond)

		// What a failure below the HTTP layer would do: the subscription
		// ends, with drain, for a reason that is neither eviction, Close
		// nor cancellation.
		b.mu.Lock()
		require.Len(t, b.subs, 1)
		sub := b.subs[0]
		b.removeLocked(sub)
		b.mu.Unlock()
		sub.end(errors.New(`history read failed: "boom"`))
		sub.q.close(true)

		waitClosed(t, done, "the stream ends")
		recs := parseBody(t, w.state().body)
		require.Len(t, recs, 3)
		require.Equal(t, wantEvent(1), recs[1].Event)
		last := recs[2].Event
		require.Equal(t, TypeStreamError, last.Type)
		require.Equal(t, "1", last.ID, "stream_error has no id line")
		var env struct {
			V    int             `json:"v"`
			Type string          `json:"type"`
			Data json.RawMessage `json:"data"`
			Meta struct {
				ServerTimestamp int64 `json:"serverTimestamp"`
			} `json:"_meta"`
		}
		dec := json.NewDecoder(strings.NewReader(last.Data))
		dec.DisallowUnknownFields()
		require.NoError(t, dec.Decode(&env))
		require.Equal(t, 1, env.V)
		require.Equal(t, TypeStreamError, env.Type)
		require.JSONEq(t, `{"error":"history read failed: \"boom\"","errorKind":"internal"}`, string(env.Data))
		require.Equal(t, `{"error":"history read failed: \"boom\"","errorKind":"internal"}`, string(env.Data), "field order")
		require.Positive(t, env.Meta.ServerTimestamp)
		require.Zero(t, b.SubscriberCount())
	})

	t.Run("a panic while writing", func(t *testing.T) {
		logs := &logCapture{}
		b := newBus(t, logs.capture(Options{}))
		w := newMemWriter()
		w.beforeWrite = func(n int, p []byte) error {
			if n == 2 {
				panic("writer bug")
			}
			return nil
		}
		_, done := serveMem(busHandler(b, logs), w, "/session/s/events", nil)
		require.Eventually(t, func() bool { return w.state().flushes == 1 }, 5*time.Second, time.Millisecond)
		publishN(t, b, 1)
		waitClosed(t, done, "the stream ends after a panic, without taking the process down")
		recs := parseBody(t, w.state().body)
		require.Len(t, recs, 2)
		require.Equal(t, TypeStreamError, recs[1].Event.Type)
		require.Contains(t, recs[1].Event.Data, `"data":{"error":"internal error","errorKind":"internal"}`)
		require.Len(t, logs.find("panicked"), 1)
		require.Zero(t, b.SubscriberCount())
	})
}

// A client that cancels its HTTP/2 request resets the stream: the handler
// sees its context end at once and unsubscribes, the connection stays up
// for the next request.
func TestHandlerHTTP2Disconnect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logCapture{}
		b := newBus(t, logs.capture(Options{}))
		h := busHandler(b, logs)
		client := h2cEnv(t, h)
		recs, end, cancel := h2Stream(t, client, nil)
		publishN(t, b, 2)
		synctest.Wait()
		require.Len(t, drain(recs), 3)
		require.Equal(t, 1, b.SubscriberCount())

		cancel()
		synctest.Wait()
		require.Zero(t, b.SubscriberCount(), "the reset ended the subscription")
		require.ErrorIs(t, end(), context.Canceled)
		require.Zero(t, b.Stats().Dropped.Blocked)
		require.Empty(t, logs.kind(DiagWriteFailed), "a client that left is no blocked writer")

		// The same connection serves a resume.
		recs, _, _ = h2Stream(t, client, hdr("Last-Event-ID", "1"))
		synctest.Wait()
		got := drain(recs)
		require.Len(t, got, 3, "retry:, event 2, replay_complete: %+v", got)
		require.Equal(t, wantEvent(2), got[1].Event)
	})
}

// A stream whose client stops reading on HTTP/2 fills its flow-control
// window; the write then blocks until the deadline resets the stream, and
// the subscription is dropped, reason blocked.
func TestHandlerHTTP2BlockedClient(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logCapture{}
		b := newBus(t, logs.capture(Options{MaxQueued: 1 << 20, MaxQueuedBytes: 1 << 30}))
		h := busHandler(b, logs)
		h.WriteTimeout = 2 * time.Second
		client := h2cEnv(t, h)
		req, err := http.NewRequest(http.MethodGet, "http://pipe/session/s/events", nil)
		require.NoError(t, err)
		resp, err := client.Do(req) // never read
		require.NoError(t, err)
		defer resp.Body.Close()
		payload := make([]byte, 256<<10)
		for i := range payload {
			payload[i] = 'x'
		}
		for range 40 { // 10 MiB, more than the client's 4 MiB stream window
			_, err := b.Publish(Event{Type: "big", Data: string(payload)})
			require.NoError(t, err)
		}
		synctest.Wait()
		require.Equal(t, 1, b.SubscriberCount(), "blocked, the deadline has not passed")
		time.Sleep(2 * time.Second)
		synctest.Wait()
		require.Zero(t, b.SubscriberCount())
		require.Positive(t, b.Stats().Dropped.Blocked)
		require.Len(t, logs.kind(DiagWriteFailed), 1)
		_, err = io.Copy(io.Discard, resp.Body)
		require.Error(t, err, "the stream was reset")
		require.False(t, errors.Is(err, io.EOF))
	})
}

// ---------------------------------------------------------------------------
// Batching.

func TestHandlerBatchOneFlush(t *testing.T) {
	t.Run("live frames ready together", func(t *testing.T) {
		logs := &logCapture{}
		b := newBus(t, logs.capture(Options{}))
		w := newMemWriter()
		reached, release := gateFirstFlush(w)
		defer release()
		cancel, done := serveMem(busHandler(b, logs), w, "/session/s/events", nil)
		defer func() { cancel(); waitClosed(t, done, "handler did not return") }()
		waitClosed(t, reached, "handler did not reach its first flush")
		publishN(t, b, 100) // ready before the handler reads
		release()
		require.Eventually(t, func() bool { return strings.Count(w.state().body, "event: e\n") == 100 },
			5*time.Second, time.Millisecond)
		st := w.state()
		require.Equal(t, 2, st.flushes, "retry, then one flush for the batch of 100")
		require.Equal(t, 2, st.writes, "small frames are copied into one write")
		require.Len(t, parseBody(t, st.body), 101)
	})

	t.Run("replay over HTTP with a wrapping writer", func(t *testing.T) {
		var mw countingMiddleware
		e := newEnv(t, envOptions{wrap: mw.wrap})
		b := e.bus(t, "s", Options{})
		publishN(t, b, 100)
		c := e.stream(t, "/session/s/events", hdr("Last-Event-ID", "0"))
		for i := uint64(1); i <= 100; i++ {
			c.expect(wantEvent(i))
		}
		require.Equal(t, TypeReplayComplete, c.nextEvent().Type)
		// The batch is larger than net/http's write buffer, so its bytes
		// reach the client before the handler's Flush call: wait for it.
		flushes := func() int { _, n, _, _ := mw.writer().counts(); return n }
		require.Eventually(t, func() bool { return flushes() >= 2 }, 5*time.Second, time.Millisecond)
		require.Equal(t, 2, flushes(), "retry, then the 101 replayed frames with one flush")
	})

	t.Run("large frames are written directly, still one flush", func(t *testing.T) {
		logs := &logCapture{}
		b := newBus(t, logs.capture(Options{}))
		big := strings.Repeat("y", sseDirectWriteSize)
		var want []sseEvent
		for i := range 6 {
			typ, data := "small", any(i)
			if i%2 == 1 {
				typ, data = "big", big
			}
			f, err := b.Publish(Event{Type: typ, Data: data})
			require.NoError(t, err)
			want = append(want, sseEvent{Type: typ, Data: string(f.JSON()), ID: strconv.FormatUint(f.ID(), 10)})
		}
		w := newMemWriter()
		cancel, done := serveMem(busHandler(b, logs), w, "/session/s/events", hdr("Last-Event-ID", "0"))
		require.Eventually(t, func() bool { return strings.Contains(w.state().body, "event: replay_complete") },
			5*time.Second, time.Millisecond)
		cancel()
		waitClosed(t, done, "handler did not return")
		st := w.state()
		require.Equal(t, 2, st.flushes, "the retry's, then the batch's (under TakeReady's 256 KiB)")
		require.Greater(t, st.writes, 2, "big frames go out from their shared bytes")
		evs := sseEvents(parseBody(t, st.body))
		require.Len(t, evs, 7)
		require.Equal(t, want, evs[:6], "order kept across direct and copied writes")
	})
}

// Without BareIDs the writer puts "id: <epoch>:" before each event's
// shared bytes: framing a batch allocates nothing, as with bare ids.
func TestEpochIDsFramingDoesNotAllocate(t *testing.T) {
	b := newBus(t, Options{RingSize: 64})
	frames := publishN(t, b, 16)
	frames = append(frames, replayCompleteFrame(1, 16, b.Epoch(), 0))
	m := newMember("s", b)
	st := &Stream{order: []*Member{m}}
	st.layCursor()
	batch := &Batch{st: st, frames: frames, owners: slices.Repeat([]*Member{m}, len(frames))}
	for _, epochIDs := range []bool{false, true} {
		s := &sseTransport{w: newMemWriter()}
		if epochIDs {
			s.idPrefix = []byte("id: " + b.Epoch() + ":")
		}
		s.reserve(batch)
		allocs := testing.AllocsPerRun(100, func() {
			s.buf = s.buf[:0]
			s.reserve(batch)
			for _, f := range frames {
				s.add(f)
			}
		})
		require.Zero(t, allocs, "epochIDs=%v", epochIDs)
		recs, err := parseSSE(s.buf)
		require.NoError(t, err)
		require.Len(t, recs, 17)
		for i, r := range recs[:16] {
			want := strconv.Itoa(i + 1)
			if epochIDs {
				want = b.Epoch() + ":" + want
			}
			require.Equal(t, want, r.Event.ID)
		}
	}
}

// ---------------------------------------------------------------------------
// Event types cannot inject SSE lines.

func TestHandlerRejectsInjectedTypes(t *testing.T) {
	e := newEnv(t, envOptions{})
	b := e.bus(t, "s", Options{})
	c := e.stream(t, "/session/s/events", nil)
	for _, typ := range []string{
		"", "x\nid: 999", "x\rdata: evil", "x\r\n\r\nevent: evil", "\n", "\r", "evil\n\n",
	} {
		_, err := b.Publish(Event{Type: typ, Data: "evil"})
		require.ErrorIs(t, err, ErrInvalidEvent, "%q", typ)
		require.Zero(t, b.LastEventID(), "a rejected event uses no id")
	}
	// Characters that matter to SSE elsewhere are harmless on the event line.
	var want []sseEvent
	for _, typ := range []string{"ok", "a: b", " leading space", "data: not data", ":colon", "id: 7", "tab\there", "nul\x00", "\u2028sep"} {
		f, err := b.Publish(Event{Type: typ, Data: "fine"})
		require.NoError(t, err, "%q", typ)
		want = append(want, sseEvent{Type: typ, Data: string(f.JSON()), ID: strconv.FormatUint(f.ID(), 10)})
	}
	c.expect(want...)
	require.NotContains(t, string(c.raw()), "evil")
}

// ---------------------------------------------------------------------------
// Framing for lenient clients, and the retry jitter.

// requireEveryBlockHasData fails when a blank line of body ends a block
// without a data: line. Several common clients dispatch such a block as an
// empty event: r3labs/sse and sseclient-py split the stream at blank
// lines, go-sse dispatches a block with a retry: field, httpx-sse every
// blank line once it has seen an id (it keeps the last id, as the standard
// says, and dispatches whenever that is set).
func requireEveryBlockHasData(t *testing.T, body string) {
	t.Helper()
	hasData, lines := false, 0
	// Every line ends with LF; the text after the last one is no line.
	for line := range strings.SplitSeq(strings.TrimSuffix(body, "\n"), "\n") {
		lines++
		switch {
		case line == "":
			require.True(t, hasData, "line %d: a blank line ends a block without data in %q", lines, body[:min(len(body), 2048)])
			hasData = false
		case strings.HasPrefix(line, "data:"):
			hasData = true
		}
	}
}

func TestHandlerFramingForLenientClients(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		logs := &logCapture{}
		b := newBus(t, logs.capture(Options{MaxQueued: 16}))
		publishN(t, b, 3)
		h := busHandler(b, logs)
		h.Heartbeat = time.Second
		h.BareIDs = false
		w := newMemWriter()
		_, done := serveMem(h, w, "/session/s/events", hdr("Last-Event-ID", "1"))
		synctest.Wait()
		require.Equal(t, "retry: 3000\nid: "+b.Epoch()+":2\n", w.state().body[:len("retry: 3000\nid: ")+len(b.Epoch())+3],
			"retry: and the replay share a block")
		time.Sleep(3 * time.Second) // three heartbeats
		synctest.Wait()
		publishN(t, b, 2)
		synctest.Wait()
		time.Sleep(time.Second)
		synctest.Wait()
		b.Close() // the stream ends after a heartbeat, with stream_error closed
		<-done
		body := w.state().body
		// Heartbeats: the retry: line and two ":" after the replay, the
		// retry: line after the live events, in the block of the frame
		// that ends the stream.
		require.Equal(t, 2, strings.Count(body, "\n:"), "lines that start with a colon")
		require.Equal(t, 3, strings.Count(body, "retry: 3000\n"))
		require.True(t, strings.HasSuffix(body, "}\n\nretry: 3000\nevent: stream_error\ndata: "+
			wantSynth(TypeStreamError, `{"error":"session closed","errorKind":"closed"}`, "").Data+"\n\n"), "%q", body[max(0, len(body)-200):])
		requireEveryBlockHasData(t, body)
		recs := parseBody(t, body)
		require.Equal(t, sseRecord{Kind: sseRetryRecord, Retry: 3000}, recs[0], "a conforming parser applies retry: at once")
		require.Len(t, sseEvents(recs), 6, "events 2..5, replay_complete and stream_error closed")
	})

	t.Run("a live stream that gets nothing", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			logs := &logCapture{}
			b := newBus(t, logs.capture(Options{}))
			h := busHandler(b, logs)
			w := newMemWriter()
			cancel, done := serveMem(h, w, "/session/s/events", nil)
			synctest.Wait()
			time.Sleep(2 * DefaultHeartbeat)
			synctest.Wait()
			cancel()
			<-done
			require.Equal(t, "retry: 3000\n:\n:\n", w.state().body, "no blank line at all: nothing a client could dispatch, and a field in the tail")
		})
	})

	t.Run("terminal frames", func(t *testing.T) {
		e := newEnv(t, envOptions{})
		b := e.bus(t, "s", Options{MaxQueued: 16})
		c := e.stream(t, "/session/s/events?maxQueued=16", nil)
		publishN(t, b, 1)
		c.expect(wantEvent(1))
		sub := b.SubscriberCount()
		require.Equal(t, 1, sub)
		b.Close()
		c.rest()
		requireEveryBlockHasData(t, string(c.raw()))
	})
}

func TestHandlerRetryJitter(t *testing.T) {
	retries := func(t *testing.T, h *Handler, n int) map[int64]int {
		e := newEnv(t, envOptions{handler: h})
		e.h.RetryJitter = h.RetryJitter // 0 too: the default
		e.bus(t, "s", Options{})
		seen := map[int64]int{}
		for range n {
			c := e.open(t, "/session/s/events", nil)
			r := c.next()
			require.Equal(t, sseRetryRecord, r.Kind)
			seen[r.Retry]++
			require.NoError(t, c.resp.Body.Close())
		}
		return seen
	}
	t.Run("default: up to half of Retry more, per connection", func(t *testing.T) {
		seen := retries(t, &Handler{RetryJitter: 0}, 100)
		for ms := range seen {
			require.GreaterOrEqual(t, ms, int64(3000))
			require.LessOrEqual(t, ms, int64(4500))
		}
		require.Greater(t, len(seen), 50, "100 connections spread over 1501 values: %v", seen)
	})
	t.Run("custom", func(t *testing.T) {
		seen := retries(t, &Handler{Retry: time.Second, RetryJitter: 3 * time.Millisecond}, 60)
		for ms := range seen {
			require.GreaterOrEqual(t, ms, int64(1000))
			require.LessOrEqual(t, ms, int64(1003))
		}
		require.Len(t, seen, 4, "each of 1000..1003 in 60 draws: %v", seen)
	})
	t.Run("negative: none", func(t *testing.T) {
		require.Equal(t, map[int64]int{1500: 20}, retries(t, &Handler{Retry: 1500 * time.Millisecond, RetryJitter: -1}, 20))
	})
	t.Run("jitter is drawn without allocating", func(t *testing.T) {
		h := &Handler{}
		require.Zero(t, testing.AllocsPerRun(100, func() { sseRetryMillis(h) }))
	})
}

// deepStack grows the calling goroutine's stack past 16 KiB and returns.
//
//go:noinline
func deepStack(n int) byte {
	var pad [1024]byte
	pad[n%len(pad)] = byte(n)
	if n > 0 {
		return deepStack(n-1) + pad[0]
	}
	return pad[0]
}

// framed is middleware with a frame of half a kilobyte that stays on the
// goroutine while the handler under it serves, as a daemon's layers do.
func framed(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var pad [512]byte
		pad[len(r.URL.Path)%len(pad)] = 1
		next.ServeHTTP(w, r)
		if pad[0] == 2 {
			panic("unreachable")
		}
	})
}

// A stream waits with a shallow stack: the frames that the request's
// checks, Lookup and Subscribe used are gone by then, so a stack a deep
// Lookup grew shrinks at the next collections to what a naive handler
// under the same middleware keeps (issue 26; before, the demo daemon's
// streams kept 18 KiB of stacks each where the naive handler kept 10).
//
// The frame sizes it depends on are a build's without -race (the race
// detector's instrumentation makes every frame larger), so under -race it
// is skipped, and .ci/run runs the suite once more without. It measures
// the whole process's StackInuse, which the package's other tests
// running beside it would move, so it measures in a process of its own
// (runAlone), whatever command runs it.
func TestStreamStackShrinksAfterADeepLookup(t *testing.T) {
	if raceEnabled() {
		t.Skip("frame sizes under -race are not a daemon's; .ci/run runs the suite without -race too")
	}
	if os.Getenv(aloneEnv) != t.Name() {
		runAlone(t)
		return
	}
	const conns, depth = 100, 20
	b := newBus(t, Options{MaxSubscribers: conns})
	h := &Handler{Logger: slog.New(slog.DiscardHandler), Heartbeat: time.Hour,
		Lookup: func(*http.Request, string) (*EventBus, error) { deepStack(depth); return b, nil }}
	naive := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		deepStack(depth)
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	stacksPerConn := func(handler http.Handler) float64 {
		srv := httptest.NewServer(framed(handler))
		defer srv.Close()
		stacks := func() uint64 {
			var m runtime.MemStats
			for range 4 { // a collection halves a stack at most once
				runtime.GC()
			}
			runtime.ReadMemStats(&m)
			return m.StackInuse
		}
		before := stacks()
		// Raw connections: the stacks counted are the server's (its handler
		// and net/http's reader), not an HTTP client's.
		var open []net.Conn
		for range conns {
			c, err := net.Dial("tcp", srv.Listener.Addr().String())
			require.NoError(t, err)
			_, err = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			require.NoError(t, err)
			line, err := bufio.NewReader(c).ReadString('\n')
			require.NoError(t, err)
			require.Contains(t, line, "200")
			open = append(open, c)
		}
		per := float64(stacks()-before) / conns
		for _, c := range open {
			c.Close()
		}
		return per
	}
	eb, nv := stacksPerConn(h), stacksPerConn(naive)
	t.Logf("server stacks per connection: eventbus %.1f KiB, naive %.1f KiB", eb/1024, nv/1024)
	require.LessOrEqual(t, eb, nv+2048, "a stream keeps at most the naive handler's stack")
	require.Eventually(t, func() bool { return b.SubscriberCount() == 0 }, 5*time.Second, 10*time.Millisecond)
}

// aloneEnv names, in the environment of a process runAlone starts, the
// one test that process runs.
const aloneEnv = "EVENTBUS_TEST_ALONE"

// runAlone runs test t again in a process of its own, the test binary
// with only t selected and aloneEnv naming it (t then measures instead of
// calling runAlone), and fails t with that process's output unless t
// passed there.
func runAlone(t *testing.T) {
	t.Helper()
	bin, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.CommandContext(t.Context(), bin,
		"-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.count=1", "-test.v", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), aloneEnv+"="+t.Name())
	out, err := cmd.CombinedOutput()
	// The PASS line, not only the exit status: a child that ran no test
	// (a renamed test, a -run that matched nothing) also exits 0.
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()+" (") {
		t.Fatalf("%s in a process of its own: %v\n%s", t.Name(), err, out)
	}
	t.Logf("%s in a process of its own:\n%s", t.Name(), out)
}
