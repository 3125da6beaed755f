//go:build linux

package main

import (
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
	"github.com/ssebus/eventbus/benchmarks/internal/naive"
)

// The floors: what is left of a fan-out when the per-connection goroutine's
// wake-up is gone, to tell how far below the naive handler any server that
// writes each client's socket once can go (issue 26, point 3). They are
// measuring instruments, not designs to copy: no queue, no cap, no
// catch-up, nothing for a slow client but a write that blocks a worker.
//
//   - floor: net/http's ResponseWriter, written and flushed from a pool of
//     GOMAXPROCS workers; each connection's handler goroutine waits only for
//     the client to leave. One publish hands every connection to the pool,
//     so a delivery is one Write and one Flush on a worker, with no goroutine
//     woken for the connection.
//   - floor-raw: the same pool writing hijacked connections, the chunk
//     framed by hand: one write system call per delivery and nothing of
//     net/http's on the way. The handler returns after the hijack, so a
//     connection has no goroutine at all.
//
// Both keep the connection alive with one ticker for every connection (the
// pool writes the heartbeat too), instead of the naive handler's ticker per
// connection. Their frames are the naive handler's bytes. Two publishes'
// writes to one connection are not ordered (each publish has its own
// workers): the program's rounds are half a second apart, and a heartbeat
// is a comment.

// floorChunk is how many connections a worker takes at a time.
const floorChunk = 64

// floorConn is one client's stream.
type floorConn struct {
	mu    sync.Mutex // held by the writer, and by the handler as it returns
	w     func([]byte) error
	dead  bool
	chunk bool // frame the bytes as an HTTP/1.1 chunk (floor-raw)
}

// send writes p; a failed write ends the stream.
func (c *floorConn) send(p, framed []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return
	}
	if c.chunk {
		p = framed
	}
	if err := c.w(p); err != nil {
		c.dead = true
	}
}

// floorSession is one session's connections.
type floorSession struct {
	mu    sync.Mutex
	conns []*floorConn
	next  uint64
}

// floorServer is both floors: raw selects floor-raw.
type floorServer struct {
	raw      bool
	sessions []*floorSession
	enc      *backplane.Encoder
	workers  int
}

func newFloorServer(ids []string, heartbeat time.Duration, raw bool) (*floorServer, http.Handler, error) {
	enc, err := backplane.NewEncoder(eventbus.Options{})
	if err != nil {
		return nil, nil, err
	}
	s := &floorServer{raw: raw, enc: enc, workers: runtime.GOMAXPROCS(0)}
	var byID map[string]*floorSession
	s.sessions, byID = newSessions[floorSession](ids)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /session/{id}/events", func(w http.ResponseWriter, r *http.Request) {
		fs := byID[r.PathValue("id")]
		if fs == nil {
			http.NotFound(w, r)
			return
		}
		if raw {
			s.serveRaw(w, fs)
			return
		}
		s.serve(w, r, fs)
	})
	// The child's lifetime is the ticker's: it stops with the process.
	go func() {
		hb := []byte(":\n")
		framed := chunkOf(hb)
		for range time.Tick(heartbeat) {
			s.writeAll(func(int) ([]byte, []byte) { return hb, framed })
		}
	}()
	return s, mux, nil
}

func (fs *floorSession) add(c *floorConn) {
	fs.mu.Lock()
	fs.conns = append(fs.conns, c)
	fs.mu.Unlock()
}

// snapshot returns the connections so far. No copy is needed: add only
// appends past the returned length, so these entries never change.
func (fs *floorSession) snapshot() []*floorConn {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.conns
}

// serve is floor's handler: the headers and the first flush, then a wait
// for the client to leave, with the writers kept out once it has.
func (s *floorServer) serve(w http.ResponseWriter, r *http.Request, fs *floorSession) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	naive.SetSSEHeaders(w)
	w.WriteHeader(http.StatusOK)
	fl.Flush()
	c := &floorConn{w: func(p []byte) error {
		if _, err := w.Write(p); err != nil {
			return err
		}
		fl.Flush()
		return nil
	}}
	fs.add(c)
	<-r.Context().Done()
	c.mu.Lock()
	c.dead = true // the ResponseWriter is not to be used once we return
	c.mu.Unlock()
}

// rawHead is floor-raw's response head, the naive handler's headers.
const rawHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nX-Accel-Buffering: no\r\nTransfer-Encoding: chunked\r\n\r\n"

// serveRaw is floor-raw's handler: it takes the connection from net/http,
// writes the response head, and leaves the connection to the writers.
func (s *floorServer) serveRaw(w http.ResponseWriter, fs *floorSession) {
	nc, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if rw.Reader.Buffered() > 0 {
		nc.Close() // a pipelined request: not an SSE client
		return
	}
	if _, err := nc.Write([]byte(rawHead)); err != nil {
		nc.Close()
		return
	}
	fs.add(&floorConn{chunk: true, w: func(p []byte) error {
		_, err := nc.Write(p)
		if err != nil {
			nc.Close()
		}
		return err
	}})
}

// chunkOf frames p as one HTTP/1.1 chunk.
func chunkOf(p []byte) []byte {
	b := strconv.AppendUint(nil, uint64(len(p)), 16)
	b = append(b, "\r\n"...)
	b = append(b, p...)
	return append(b, "\r\n"...)
}

// floorItem is one delivery: the bytes, and the bytes as a chunk.
type floorItem struct {
	c             *floorConn
	frame, framed []byte
}

// writeAll hands the pool of workers a delivery to every connection of
// every session, frameOf(i) to session i's, and returns without waiting for
// the writes, as a publish into queues does.
func (s *floorServer) writeAll(frameOf func(i int) (frame, framed []byte)) {
	var items []floorItem
	for i, fs := range s.sessions {
		frame, framed := frameOf(i)
		for _, c := range fs.snapshot() {
			items = append(items, floorItem{c, frame, framed})
		}
	}
	var next atomic.Int64
	for range s.workers {
		go func() {
			for {
				i := int(next.Add(floorChunk)) - floorChunk
				if i >= len(items) {
					return
				}
				for _, it := range items[i:min(i+floorChunk, len(items))] {
					it.c.send(it.frame, it.framed)
				}
			}
		}()
	}
}

// publishAll encodes the event once per session, as the naive server does,
// and hands every connection's delivery to the workers.
func (s *floorServer) publishAll(sent int64) error {
	frames := make([][2][]byte, len(s.sessions))
	for i, fs := range s.sessions {
		e, err := s.enc.Encode(eventbus.Event{Type: eventType, Data: tick{Sent: sent}})
		if err != nil {
			return err
		}
		fs.mu.Lock()
		fs.next++
		id := fs.next
		fs.mu.Unlock()
		f := appendNaiveFrame(nil, id, e)
		frames[i] = [2][]byte{f, chunkOf(f)}
	}
	s.writeAll(func(i int) ([]byte, []byte) { return frames[i][0], frames[i][1] })
	return nil
}
