//go:build linux

package main

import (
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ssebus/eventbus"
)

// The naive baseline: the broker and handler of naiveHTTP(false) in
// benchmarks/httpbench.go and benchmarks/adapters.go (that harness is
// package main, so they are copied here), with two changes a real naive
// server needs and the harness does not: a heartbeat (a ticker per
// connection in the handler's select, the way a naive handler keeps an idle
// connection alive) and one broker per session behind a
// /session/{id}/events route. The frame a message carries is encoded once
// at publish, with eventbus's own Encoder, so that it holds the same bytes
// as the eventbus frame of the same event (TestNaiveFrameMatchesEventbus).

// naiveQueue is each subscriber's channel capacity, the harness's default
// queue (and eventbus's default MaxQueued).
const naiveQueue = 256

// naiveHeartbeat is the heartbeat line: a comment, as eventbus writes it.
var naiveHeartbeat = []byte(":\n")

type naiveMsg struct {
	id   uint64
	data []byte // the complete SSE frame
}

// naiveBroker is the harness's broker: an RWMutex and a slice of buffered
// channels, a publish that sends to each (blocking when one is full).
type naiveBroker struct {
	mu     sync.RWMutex
	subs   []chan naiveMsg
	closed bool
	next   atomic.Uint64 // the last id published (not in the harness, which numbers events itself)
}

func (b *naiveBroker) subscribe(capacity int) chan naiveMsg {
	ch := make(chan naiveMsg, capacity)
	b.mu.Lock()
	if b.closed {
		close(ch)
	} else {
		b.subs = append(b.subs, ch)
	}
	b.mu.Unlock()
	return ch
}

// unsubscribe removes ch; the caller must keep draining ch until it is closed
// (a publisher may be blocked sending to it while holding the read lock).
func (b *naiveBroker) unsubscribe(ch chan naiveMsg) {
	b.mu.Lock()
	for i, c := range b.subs {
		if c == ch {
			b.subs = append(b.subs[:i], b.subs[i+1:]...)
			close(ch)
			break
		}
	}
	b.mu.Unlock()
}

func (b *naiveBroker) publish(m naiveMsg) {
	b.mu.RLock()
	for _, c := range b.subs {
		c <- m
	}
	b.mu.RUnlock()
}

// appendNaiveFrame appends the SSE frame of the event e numbered id:
// "id: N\nevent: T\ndata: <envelope>\n\n", the envelope being e.Envelope(id)
// written in place. The bytes are those of eventbus's Frame.SSE for the
// same event and id.
func appendNaiveFrame(dst []byte, id uint64, e eventbus.EncodedEvent) []byte {
	dst = append(dst, "id: "...)
	dst = strconv.AppendUint(dst, id, 10)
	dst = append(dst, "\nevent: "...)
	dst = append(dst, e.Type...)
	dst = append(dst, "\ndata: {\"id\":"...)
	dst = strconv.AppendUint(dst, id, 10)
	dst = append(dst, e.Tail...)
	return append(dst, "\n\n"...)
}

func setSSEHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
}

// naiveHandler serves GET /session/{id}/events from the session's broker:
// naiveHTTP(false)'s handler (one Write and one Flush per batch of what the
// channel holds), plus the heartbeat ticker.
func naiveHandler(brokers map[string]*naiveBroker, heartbeat time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b := brokers[r.PathValue("id")]
		if b == nil {
			http.NotFound(w, r)
			return
		}
		fl, ok := w.(http.Flusher)
		if !ok {
			http.Error(w, "no flush", http.StatusInternalServerError)
			return
		}
		setSSEHeaders(w)
		ch := b.subscribe(naiveQueue)
		defer func() {
			go func() {
				for range ch { //nolint:revive // drain so a blocked publisher gets through
				}
			}()
			b.unsubscribe(ch)
		}()
		w.WriteHeader(http.StatusOK)
		fl.Flush()
		buf := make([]byte, 0, 4096)
		hb := time.NewTicker(heartbeat)
		defer hb.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-hb.C:
				if _, err := w.Write(naiveHeartbeat); err != nil {
					return
				}
				fl.Flush()
			case m, ok := <-ch:
				if !ok {
					return
				}
				buf = append(buf[:0], m.data...)
			batch:
				for {
					select {
					case m, ok = <-ch:
						if !ok {
							break batch
						}
						buf = append(buf, m.data...)
					default:
						break batch
					}
				}
				if _, err := w.Write(buf); err != nil {
					return
				}
				fl.Flush()
				if !ok {
					return
				}
			}
		}
	}
}
