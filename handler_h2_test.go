package eventbus

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ssebus/eventbus/internal/pipenet"
)

// HTTP/2 streaming on the fake clock: an h2c (prior knowledge) server and
// client from the standard library, connected by in-memory pipes inside a
// synctest bubble, so that deadlines, heartbeats and idle periods of
// minutes take no time and fire exactly.

// h2cEnv serves h on an h2c server inside the current synctest bubble and
// returns a client that speaks HTTP/2 with prior knowledge. Cleanup closes
// both, so the bubble's goroutines end.
func h2cEnv(t *testing.T, h http.Handler) *http.Client {
	ln := pipenet.Listen()
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: h, Protocols: &p}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	tr := &http.Transport{Protocols: &p, DialContext: ln.DialContext}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		_ = srv.Close()
		<-served
	})
	return &http.Client{Transport: tr}
}

// h2Stream opens the handler's stream over client and reads it through the
// strict parser on a goroutine of the bubble; records arrive on the
// returned channel, which is closed with the read error at the end.
func h2Stream(t *testing.T, client *http.Client, hdr http.Header) (recs <-chan sseRecord, end func() error, cancel func()) {
	return h2StreamAt(t, client, "/session/s/events", hdr)
}

// h2StreamAt is h2Stream for the stream at path.
func h2StreamAt(t *testing.T, client *http.Client, path string, hdr http.Header) (recs <-chan sseRecord, end func() error, cancel func()) {
	ctx, cancelReq := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://pipe"+path, nil)
	require.NoError(t, err)
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	require.Equal(t, 2, resp.ProtoMajor)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ch := make(chan sseRecord, 1024)
	var readErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(ch)
		defer resp.Body.Close()
		r := newSSEReader(resp.Body)
		for {
			rec, err := r.next()
			if err != nil {
				readErr = err
				return
			}
			ch <- rec
		}
	}()
	t.Cleanup(func() { cancelReq(); <-done })
	return ch, func() error { <-done; return readErr }, cancelReq
}

// drain returns the records that have arrived, without waiting.
func drain(ch <-chan sseRecord) []sseRecord {
	var out []sseRecord
	for {
		select {
		case r, ok := <-ch:
			if !ok {
				return out
			}
			out = append(out, r)
		default:
			return out
		}
	}
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
