package eventbus

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ssebus/eventbus/internal/pipenet"
)

// A shutdown says so (issue 22, point 4): every stream of a bus closed by
// CloseForShutdown, Hub.Shutdown or Hub.Close gets what was queued, then
// one stream_error {"errorKind":"shutdown","retryAfter":ms}; a client that
// never reads holds Hub.Shutdown until its deadline, and nobody else.

// shutdownData is the data of a shutdown frame with retryAfter ms.
func shutdownData(ms int) string {
	return `{"error":"` + shutdownMessage + `","errorKind":"shutdown","retryAfter":` + strconv.Itoa(ms) + `}`
}

func TestShutdownFrameWire(t *testing.T) {
	for _, c := range []struct {
		retry time.Duration
		ms    int
	}{
		{1500 * time.Millisecond, 1500},
		{0, 2000},             // the default
		{-time.Second, 2000},  // likewise
		{time.Microsecond, 1}, // at least 1 ms: 0 would mean at once
		{time.Minute, 60000},
	} {
		f := shutdownFrame(c.retry, testStamp)
		assert.True(t, f.Terminal())
		assert.True(t, f.Synthetic())
		assert.Zero(t, f.ID())
		assert.Equal(t, TypeStreamError, f.Type())
		assert.Equal(t, "event: stream_error\ndata: "+wantSynth(TypeStreamError, shutdownData(c.ms), "").Data+"\n\n", f.String(), "retry %v", c.retry)
	}
	// StreamErrorFrame and CloseWithError with the kind carry the default;
	// every other kind keeps the wire it had: no retryAfter.
	assert.Contains(t, string(StreamErrorFrame("bye", ErrorKindShutdown).JSON()),
		`"data":{"error":"bye","errorKind":"shutdown","retryAfter":2000}`)
	for _, kind := range []string{ErrorKindInternal, ErrorKindUnavailable, ErrorKindReauthenticate, ErrorKindRevoked} {
		assert.Contains(t, string(StreamErrorFrame("m", kind).JSON()), `"data":{"error":"m","errorKind":"`+kind+`"},`)
	}
}

func TestBusCloseForShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{})
		never := subscribe(t, b, SubscribeOptions{})
		polled := subscribe(t, b, SubscribeOptions{})
		behind := subscribe(t, b, SubscribeOptions{Types: []string{"nothing"}})
		publishNumbered(t, b, 2)
		require.NoError(t, b.CloseForShutdown(1500*time.Millisecond))
		require.NoError(t, b.CloseForShutdown(time.Second), "idempotent")
		require.NoError(t, b.CloseWithError(ErrorKindInternal, "again"), "only the first close counts")
		require.NoError(t, b.Close())
		want := `"data":` + shutdownData(1500) + `,`
		for name, s := range map[string]*Subscription{"never iterated": never, "polled": polled} {
			fs := collectEvents(s)
			require.Len(t, fs, 3, "%s: what was queued, then the terminal frame", name)
			assert.Equal(t, idRange(1, 2), describe(fs[:2]), name)
			assert.True(t, fs[2].Terminal(), name)
			assert.Contains(t, string(fs[2].JSON()), want, name)
			assert.ErrorIs(t, s.Err(), ErrClosed, name)
			assert.Contains(t, s.Err().Error(), `"errorKind":"shutdown"`, name)
		}
		fs := collectEvents(behind)
		require.Len(t, fs, 1, "a filter that took nothing still gets the end")
		assert.Contains(t, string(fs[0].JSON()), want)
		_, err := b.Publish(Event{Type: "x"})
		assert.ErrorIs(t, err, ErrClosed)
		assert.Equal(t, uint64(7), b.Stats().FramesDelivered, "4 events and 3 terminal frames")
	})
}

func TestHubShutdownAndCloseSendTheShutdownFrame(t *testing.T) {
	_, err := NewHub(HubOptions{ShutdownRetryAfter: -time.Second})
	require.ErrorIs(t, err, ErrInvalidOption)

	for _, how := range []string{"Shutdown", "Close"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h, err := NewHub(HubOptions{Bus: Options{Now: testNow}, ShutdownRetryAfter: 750 * time.Millisecond})
				require.NoError(t, err)
				var subs []*Subscription
				for i, id := range []string{"a", "b"} {
					b, err := h.GetOrCreate(id)
					require.NoError(t, err)
					subs = append(subs, subscribe(t, b, SubscribeOptions{}))
					publishNumbered(t, b, i+1)
				}
				deleted, err := h.GetOrCreate("deleted")
				require.NoError(t, err)
				gone := subscribe(t, deleted, SubscribeOptions{})
				require.True(t, h.Delete("deleted"))
				assert.Empty(t, collectEvents(gone), "a DELETE is no shutdown: a plain end")

				got := make(chan [][]Frame)
				go func() {
					var all [][]Frame
					for _, s := range subs {
						all = append(all, collectEvents(s))
					}
					got <- all
				}()
				start := time.Now()
				if how == "Shutdown" {
					require.NoError(t, h.Shutdown(t.Context()))
				} else {
					require.NoError(t, h.Close())
				}
				all := <-got
				assert.LessOrEqual(t, time.Since(start), 5*time.Millisecond, "at most one poll of Shutdown's for consumers that read")
				for i, fs := range all {
					require.Len(t, fs, i+2, "session %d: its events, then the shutdown frame", i)
					assert.Equal(t, idRange(1, uint64(i+1)), describe(fs[:i+1]))
					assert.Equal(t, wantSynth(TypeStreamError, shutdownData(750), "").Data, string(fs[i+1].JSON()))
				}
			})
		})
	}
}

// pipeHTTP serves h with an http.Server (HTTP/1.1 and h2c) on an in-memory
// listener of the current synctest bubble and returns the listener and a
// client of it that speaks HTTP/1.1, or h2c with h2c set. The caller ends
// the server.
func pipeHTTP(h http.Handler, h2c bool) (*pipenet.Listener, *http.Server, *http.Client, <-chan struct{}) {
	ln := pipenet.Listen()
	var sp, cp http.Protocols
	sp.SetHTTP1(true)
	sp.SetUnencryptedHTTP2(true)
	if h2c {
		cp.SetUnencryptedHTTP2(true)
	} else {
		cp.SetHTTP1(true)
	}
	srv := &http.Server{Handler: h, Protocols: &sp, ErrorLog: slog.NewLogLogger(slog.DiscardHandler, slog.LevelError)}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	return ln, srv, &http.Client{Transport: &http.Transport{Protocols: &cp, DialContext: ln.DialContext}}, served
}

// timedStream is one stream read on a goroutine of the bubble: its records
// and the fake time each arrived at, then the end.
type timedStream struct {
	mu   sync.Mutex
	recs []sseRecord
	at   []time.Time
	err  error
	done chan struct{}
}

func readTimed(t *testing.T, client *http.Client, url string) *timedStream {
	t.Helper()
	resp, err := client.Get(url)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ts := &timedStream{done: make(chan struct{})}
	go func() {
		defer close(ts.done)
		defer resp.Body.Close()
		r := newSSEReader(resp.Body)
		for {
			rec, err := r.next()
			ts.mu.Lock()
			if err != nil {
				ts.err = err
				ts.mu.Unlock()
				return
			}
			ts.recs = append(ts.recs, rec)
			ts.at = append(ts.at, time.Now())
			ts.mu.Unlock()
		}
	}()
	return ts
}

// neverReads opens the stream of session s on a raw connection that sends
// the request and never reads: the handler blocks in its first flush.
func neverReads(t *testing.T, ln *pipenet.Listener, path string) net.Conn {
	t.Helper()
	c, err := ln.DialContext(t.Context(), "", "")
	require.NoError(t, err)
	_, err = io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: pipe\r\n\r\n")
	require.NoError(t, err)
	return c
}

// Through the Handler, on HTTP/1.1 and h2c: three reading streams get their
// queued events and the shutdown frame at once; a fourth client that never
// reads holds Hub.Shutdown to its deadline, and closing the server then
// ends its handler.
func TestHandlerHubShutdown(t *testing.T) {
	for _, h2c := range []bool{false, true} {
		t.Run(map[bool]string{false: "HTTP/1.1", true: "h2c"}[h2c], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				hub, err := NewHub(HubOptions{Bus: Options{Now: testNow}, ShutdownRetryAfter: 3 * time.Second})
				require.NoError(t, err)
				bus, err := hub.GetOrCreate("s")
				require.NoError(t, err)
				mux := http.NewServeMux()
				mux.Handle("GET /session/{id}/events", &Handler{Lookup: hub.LookupRequest, RetryJitter: -1, WriteTimeout: time.Minute})
				ln, srv, client, served := pipeHTTP(mux, h2c)
				defer func() {
					client.CloseIdleConnections()
					_ = srv.Close()
					<-served
				}()
				var readers []*timedStream
				for range 3 {
					readers = append(readers, readTimed(t, client, "http://pipe/session/s/events"))
				}
				stuck := neverReads(t, ln, "/session/s/events")
				defer stuck.Close()
				synctest.Wait()
				require.Equal(t, 4, bus.SubscriberCount())
				publishN(t, bus, 5)

				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				start := time.Now()
				shut := make(chan error, 1)
				go func() { shut <- hub.Shutdown(ctx) }()
				synctest.Wait()
				want := []sseRecord{{Kind: sseRetryRecord, Retry: 3000}}
				for i := uint64(1); i <= 5; i++ {
					want = append(want, sseRecord{Kind: sseEventRecord, Event: wantEvent(i)})
				}
				want = append(want, sseRecord{Kind: sseEventRecord, Event: wantSynth(TypeStreamError, shutdownData(3000), "5")})
				for i, r := range readers {
					<-r.done // ended already: the wait returns at once
					assert.Equal(t, want, r.recs, "reader %d", i)
					assert.Equal(t, io.EOF, r.err, "reader %d: a clean end after the frame", i)
					assert.Equal(t, start, r.at[len(r.at)-1], "reader %d: at once", i)
				}
				select {
				case err := <-shut:
					t.Fatalf("Shutdown returned %v with a client that never read", err)
				default:
				}

				require.ErrorIs(t, <-shut, context.DeadlineExceeded)
				assert.Equal(t, 10*time.Second, time.Since(start), "held by the one that never reads, to the bound")
				// What a daemon does at the bound: close the connections.
				// The handler blocked writing to it returns (the deferred
				// server end waits for its goroutines: synctest would
				// report one that stayed).
				require.NoError(t, srv.Close())
				synctest.Wait()
				assert.Equal(t, 10*time.Second, time.Since(start))
			})
		})
	}
}
