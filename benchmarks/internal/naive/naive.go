// Package naive is the baseline every comparison of this module measures
// against: the pub/sub and the SSE handler a Go programmer writes first.
// The broker is an RWMutex and one buffered channel per subscriber, and a
// publish is a blocking send to each; the handler writes what its channel
// holds and flushes. The peer harness (package main of benchmarks) and the
// scale program (benchmarks/scale) both use it, so that their "naive" is
// one and the same code.
package naive

import (
	"net/http"
	"sync"
	"time"
)

// Msg is one published message: its id and its bytes (an envelope, or a
// whole SSE frame, as the handler's Frame makes of it).
type Msg struct {
	ID   uint64
	Data []byte
}

// Broker is the naive bus: an RWMutex and a slice of buffered channels. Its
// zero value is ready to use; its methods are safe for concurrent use.
type Broker struct {
	mu     sync.RWMutex
	subs   []chan Msg
	closed bool
}

// Subscribe adds a subscriber with a channel of the given capacity; on a
// closed broker the channel comes closed.
func (b *Broker) Subscribe(capacity int) chan Msg {
	ch := make(chan Msg, capacity)
	b.mu.Lock()
	if b.closed {
		close(ch)
	} else {
		b.subs = append(b.subs, ch)
	}
	b.mu.Unlock()
	return ch
}

// Unsubscribe removes ch and closes it. The caller must keep draining ch
// until it is closed: a publisher may be blocked sending to it while
// holding the read lock.
func (b *Broker) Unsubscribe(ch chan Msg) {
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

// Publish sends m to every subscriber, blocking on a full channel.
func (b *Broker) Publish(m Msg) {
	b.mu.RLock()
	for _, c := range b.subs {
		c <- m
	}
	b.mu.RUnlock()
}

// Close closes every subscriber's channel; later subscribers get a closed
// one.
func (b *Broker) Close() {
	b.mu.Lock()
	if !b.closed {
		b.closed = true
		for _, c := range b.subs {
			close(c)
		}
		b.subs = nil
	}
	b.mu.Unlock()
}

// SetSSEHeaders sets the naive handler's response headers.
func SetSSEHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
}

// heartbeatLine is the heartbeat: a comment, as eventbus writes it.
var heartbeatLine = []byte(":\n")

// HandlerOptions configures Handler.
type HandlerOptions struct {
	// Broker is the request's broker; nil answers 404.
	Broker func(r *http.Request) *Broker
	// Queue is each subscriber's channel capacity.
	Queue int
	// Frame appends the SSE frame of m to dst.
	Frame func(dst []byte, m Msg) []byte
	// FlushEach writes and flushes every frame on its own; otherwise the
	// handler writes what the channel holds as one batch and flushes once.
	FlushEach bool
	// Heartbeat, when positive, is a ticker per connection in the handler's
	// select that writes and flushes a ":" line: the way a naive handler
	// keeps an idle connection alive.
	Heartbeat time.Duration
}

// Handler is the naive SSE handler: subscribe, send the headers, then
// write each message the channel brings (with what else it holds, unless
// FlushEach) and flush, until the client leaves or the broker closes.
func Handler(o HandlerOptions) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b := o.Broker(r)
		if b == nil {
			http.NotFound(w, r)
			return
		}
		fl, ok := w.(http.Flusher)
		if !ok {
			http.Error(w, "no flush", http.StatusInternalServerError)
			return
		}
		SetSSEHeaders(w)
		ch := b.Subscribe(o.Queue)
		defer func() {
			go func() {
				for range ch { //nolint:revive // drain so a blocked publisher gets through
				}
			}()
			b.Unsubscribe(ch)
		}()
		w.WriteHeader(http.StatusOK)
		fl.Flush()
		buf := make([]byte, 0, 4096)
		var beat <-chan time.Time
		if o.Heartbeat > 0 {
			t := time.NewTicker(o.Heartbeat)
			defer t.Stop()
			beat = t.C
		}
		for {
			select {
			case <-r.Context().Done():
				return
			case <-beat:
				if _, err := w.Write(heartbeatLine); err != nil {
					return
				}
				fl.Flush()
			case m, ok := <-ch:
				if !ok {
					return
				}
				buf = o.Frame(buf[:0], m)
				if !o.FlushEach {
				batch:
					for {
						select {
						case m, ok = <-ch:
							if !ok {
								break batch
							}
							buf = o.Frame(buf, m)
						default:
							break batch
						}
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
