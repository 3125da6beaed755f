//go:build linux

package main

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ssebus/eventbus/backplane"
	"github.com/ssebus/eventbus/benchmarks/internal/naive"
)

// The naive baseline: package naive's broker and handler, the peer
// harness's naiveHTTP(false), with two additions a real naive server needs
// and the harness does not: a heartbeat (a ticker per connection in the
// handler's select, the way a naive handler keeps an idle connection alive)
// and one broker per session behind a /session/{id}/events route. The frame
// a message carries is encoded once at publish, with eventbus's own
// encoder (backplane.Encoder), so that it holds the same bytes as the
// eventbus frame of the same event (TestNaiveFrameMatchesEventbus).

// naiveQueue is each subscriber's channel capacity, the harness's default
// queue (and eventbus's default MaxQueued).
const naiveQueue = 256

// naiveSession is a session's broker and its last id.
type naiveSession struct {
	naive.Broker
	next atomic.Uint64 // the last id published (the harness numbers events itself)
}

// naiveHandler serves GET /session/{id}/events from the session's broker:
// naive.Handler, one Write and one Flush per batch of what the channel
// holds, with the heartbeat ticker.
func naiveHandler(sessions map[string]*naiveSession, heartbeat time.Duration) http.HandlerFunc {
	return naive.Handler(naive.HandlerOptions{
		Broker: func(r *http.Request) *naive.Broker {
			if s := sessions[r.PathValue("id")]; s != nil {
				return &s.Broker
			}
			return nil
		},
		Queue:     naiveQueue,
		Frame:     func(dst []byte, m naive.Msg) []byte { return append(dst, m.Data...) },
		Heartbeat: heartbeat,
	})
}

// appendNaiveFrame appends the SSE frame of the event e numbered id:
// "id: N\nevent: T\ndata: <envelope>\n\n", the envelope being e.Envelope(id)
// written in place. The bytes are those of eventbus's Frame.SSE for the
// same event and id.
func appendNaiveFrame(dst []byte, id uint64, e backplane.EncodedEvent) []byte {
	dst = append(dst, "id: "...)
	dst = strconv.AppendUint(dst, id, 10)
	dst = append(dst, "\nevent: "...)
	dst = append(dst, e.Type...)
	dst = append(dst, "\ndata: {\"id\":"...)
	dst = strconv.AppendUint(dst, id, 10)
	dst = append(dst, e.Tail...)
	return append(dst, "\n\n"...)
}
