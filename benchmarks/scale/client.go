//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	ws "github.com/coder/websocket"
	ebws "github.com/ssebus/eventbus/websocket"
)

// The clients: one raw TCP connection and one goroutine per SSE stream,
// with a parser that does only what the measurement needs, so that the
// parent, which shares the machine with the server, costs it little; for
// the WebSocket, a github.com/coder/websocket client connection per
// stream and one goroutine reading its messages.

// route is how the clients of an implementation open and read their
// streams.
type route int

const (
	// routeSingle: GET /session/{id}/events, the event's id in its id:
	// line ("N", or "<epoch>:<N>").
	routeSingle route = iota
	// routeMux: GET /events?session=ID, the multiplexed SSE route, whose
	// id: line is the composite cursor: the event's id is read from the
	// data envelope's "id" member.
	routeMux
	// routeWS: GET /ws?session=ID, the WebSocket (docs/SPEC.md 6.10):
	// each message is lines, a frame's line the multiplexed envelope, a
	// control line {"op":...}; the heartbeat is the server's ping, counted
	// when the client's reader answers it.
	routeWS
	// routeWSSmallBuf: the same on GET /ws-smallbuf?session=ID, the
	// instrument ws-smallbuf.
	routeWSSmallBuf
)

// routeOf is the route the clients of impl use.
func routeOf(impl string) route {
	switch impl {
	case "mux":
		return routeMux
	case "websocket":
		return routeWS
	case "ws-smallbuf":
		return routeWSSmallBuf
	}
	return routeSingle
}

// path is the request path of a stream of session s.
func (rt route) path(s int) string {
	switch rt {
	case routeMux:
		return "/events?session=s" + strconv.Itoa(s)
	case routeWS:
		return "/ws?session=s" + strconv.Itoa(s)
	case routeWSSmallBuf:
		return "/ws-smallbuf?session=s" + strconv.Itoa(s)
	}
	return "/session/s" + strconv.Itoa(s) + "/events"
}

const (
	// perSourceAddr is how many connections share a source address: a new
	// 127.0.0.x every 10,000 keeps each address well inside the ephemeral
	// port range (32768-60999 by default, 28,232 ports).
	perSourceAddr = 10_000
	// dialAttempts bounds the tries of one connection (a full listen
	// backlog, a port the kernel had not yet freed).
	dialAttempts = 8
	// handshakeTimeout bounds a connect and its response's head.
	handshakeTimeout = 30 * time.Second
)

// conn is one client connection.
type conn struct {
	nc      net.Conn // set once open succeeds, before the fleet's connect returns
	session int

	heartbeats atomic.Int64 // heartbeat lines (":" comments and retry: lines)
	frames     atomic.Int64 // event frames of a round
	frameBytes atomic.Int64 // their bytes on the wire: id: line to blank line
	arrived    []atomic.Int64
	sent       []atomic.Int64 // per round: the timestamp its event carried
	err        error          // why reading ended; written before done
	done       atomic.Bool
}

// fleet is every connection of one measurement.
type fleet struct {
	conns  []*conn
	got    []atomic.Int64 // per round: connections that have its event
	rounds int
	// idBase is the id before round 1's event: round k's event (from 0)
	// has id idBase+k+1.
	idBase  uint64
	route   route
	readers sync.WaitGroup
	closing atomic.Bool
	ended   atomic.Int64 // connections whose stream ended before we closed it
	// unexpected counts frames that are no round's event (no id, an id
	// out of range, no timestamp) and second copies of one.
	unexpected atomic.Int64
}

// sourceIP is the source address of the block-th group of connections:
// 127.0.0.1, 127.0.0.2, ... (Linux routes all of 127/8 to the loopback).
func sourceIP(block int) net.IP {
	n := block + 1
	return net.IPv4(127, byte(n>>16), byte(n>>8), byte(n))
}

// connect opens n connections to addr, spread evenly over sessions, at most
// inflight at a time, and returns once every one has its response's head
// (the 200 and the first flush). Round k's event (from 0) has id
// idBase+k+1. On an error it closes what it opened.
func connect(addr string, rt route, n, sessions, rounds int, idBase uint64, inflight int) (*fleet, error) {
	f := &fleet{conns: make([]*conn, n), got: make([]atomic.Int64, rounds), rounds: rounds, idBase: idBase, route: rt}
	sem := make(chan struct{}, inflight)
	var (
		opened sync.WaitGroup
		mu     sync.Mutex
		first  error
		failed atomic.Bool
	)
	for i := range n {
		if failed.Load() {
			break
		}
		c := &conn{session: i % sessions, arrived: make([]atomic.Int64, rounds), sent: make([]atomic.Int64, rounds)}
		f.conns[i] = c
		sem <- struct{}{}
		opened.Add(1)
		f.readers.Add(1)
		go func() {
			defer f.readers.Done()
			var (
				body *bufio.Reader
				wc   *ws.Conn
				err  error
			)
			if rt == routeWS || rt == routeWSSmallBuf {
				wc, err = c.openWS(addr, sourceIP(i/perSourceAddr), rt.path(c.session))
			} else {
				body, err = c.open(addr, sourceIP(i/perSourceAddr), rt.path(c.session))
			}
			<-sem
			if err != nil {
				mu.Lock()
				if first == nil {
					first = fmt.Errorf("connection %d: %w", i, err)
				}
				mu.Unlock()
				failed.Store(true)
				opened.Done()
				return
			}
			opened.Done()
			if wc != nil {
				c.readWS(wc, f)
			} else {
				c.read(body, f)
			}
		}()
	}
	opened.Wait()
	if first != nil {
		f.close()
		return nil, first
	}
	return f, nil
}

// statusError is a response other than a 200 event stream: no retry.
type statusError struct{ msg string }

func (e *statusError) Error() string { return e.msg }

// open connects from src, sends the GET and reads the response's head,
// retrying what a loaded loopback can fail. It returns the decoded body.
func (c *conn) open(addr string, src net.IP, path string) (*bufio.Reader, error) {
	var err error
	for attempt := range dialAttempts {
		if attempt > 0 {
			time.Sleep(time.Duration(attempt) * 100 * time.Millisecond)
		}
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}, Timeout: handshakeTimeout}
		var nc net.Conn
		if nc, err = d.Dial("tcp", addr); err != nil {
			continue
		}
		var body *bufio.Reader
		if body, err = handshake(nc, addr, path); err != nil {
			abort(nc)
			var se *statusError
			if errors.As(err, &se) {
				return nil, err
			}
			continue
		}
		c.nc = nc
		return body, nil
	}
	return nil, err
}

// handshake writes an HTTP/1.1 GET and reads the response's head. The body
// is chunked (the server streams without a length), so the SSE lines are
// read from a chunk decoder over the connection's reader.
func handshake(nc net.Conn, host, path string) (*bufio.Reader, error) {
	if err := nc.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		return nil, err
	}
	req := "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nAccept: text/event-stream\r\nCache-Control: no-cache\r\n\r\n"
	if _, err := io.WriteString(nc, req); err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(nc, 1024)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, &statusError{fmt.Sprintf("GET %s: %s: %s", path, resp.Status, bytes.TrimSpace(b))}
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		return nil, &statusError{fmt.Sprintf("GET %s: Content-Type %q", path, resp.Header.Get("Content-Type"))}
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	return bufio.NewReaderSize(resp.Body, 1024), nil
}

// abort closes nc with a reset instead of a FIN: no TIME_WAIT holds its
// source port, so repeated runs never run out of ports.
func abort(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = nc.Close()
}

// read parses the stream until it ends: it counts heartbeat lines, and for
// each event frame records when its data line arrived and the timestamp it
// carries. An event's id is its round (every session gets one event per
// round) after the fleet's idBase; an id "<epoch>:<N>" (eventbus's

// fail records that the connection's read ended with err, counting it as a
// stream that ended early unless the fleet is closing.
func (c *conn) fail(f *fleet, err error) {
	c.err = err
	c.done.Store(true)
	if !f.closing.Load() {
		f.ended.Add(1)
	}
}

// EpochIDs, sessiond's default) is read as N.
func (c *conn) read(r *bufio.Reader, f *fleet) {
	var (
		inFrame bool
		size    int
		id      uint64
		sent    int64
		at      int64
	)
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			c.fail(f, err)
			return
		}
		switch {
		case len(line) == 1 || (len(line) == 2 && line[0] == '\r'): // blank: dispatch
			if inFrame {
				c.frame(f, id, sent, at, size+len(line))
			}
			inFrame, size, id, sent, at = false, 0, 0, 0, 0
		case line[0] == ':':
			c.heartbeats.Add(1)
		case bytes.HasPrefix(line, []byte("retry:")) && !inFrame:
			// eventbus's first heartbeat after a frame is the retry: line
			// again (docs/SPEC.md section 5.3).
			c.heartbeats.Add(1)
		default:
			inFrame = true
			size += len(line)
			switch {
			case bytes.HasPrefix(line, []byte("id: ")):
				v := bytes.TrimRight(line[4:], "\r\n")
				if i := bytes.LastIndexByte(v, ':'); i >= 0 {
					v = v[i+1:]
				}
				id, _ = strconv.ParseUint(string(v), 10, 64)
			case bytes.HasPrefix(line, []byte("data: ")):
				at = time.Now().UnixNano()
				sent = parseSent(line)
				if f.route == routeMux {
					id = envelopeID(line)
				}
			}
		}
	}
}

// parseSent returns the number after "sent": in a data line, or 0.
func parseSent(line []byte) int64 { return int64(numberAfter(line, `"sent":`)) }

// envelopeID returns the number after the first "id": of an envelope (the
// multiplexed one: {"session":"s0","id":7,...}), or 0.
func envelopeID(line []byte) uint64 { return numberAfter(line, `"id":`) }

// numberAfter returns the decimal number right after the first key in
// line, or 0.
func numberAfter(line []byte, key string) uint64 {
	_, v, ok := bytes.Cut(line, []byte(key))
	if !ok {
		return 0
	}
	end := 0
	for end < len(v) && v[end] >= '0' && v[end] <= '9' {
		end++
	}
	n, _ := strconv.ParseUint(string(v[:end]), 10, 64)
	return n
}

// openWS opens the WebSocket of path from src with coder/websocket,
// retrying what a loaded loopback can fail, and keeps the TCP connection
// under it (c.nc) so that close can reset it. Each connection has an
// http.Transport of its own, whose dial binds the source address and
// records the connection; the pings it receives count as its heartbeats
// (coder's reader answers them while readWS reads).
func (c *conn) openWS(addr string, src net.IP, path string) (*ws.Conn, error) {
	var err error
	for attempt := range dialAttempts {
		if attempt > 0 {
			time.Sleep(time.Duration(attempt) * 100 * time.Millisecond)
		}
		var nc net.Conn
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}, Timeout: handshakeTimeout}
		tr := &http.Transport{
			DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
				conn, err := d.DialContext(ctx, network, a)
				nc = conn
				return conn, err
			},
		}
		ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
		var (
			wc   *ws.Conn
			resp *http.Response
		)
		wc, resp, err = ws.Dial(ctx, "ws://"+addr+path, &ws.DialOptions{
			HTTPClient:   &http.Client{Transport: tr},
			Subprotocols: []string{ebws.Subprotocol},
			OnPingReceived: func(context.Context, []byte) bool {
				c.heartbeats.Add(1)
				return true // coder answers with the pong
			},
		})
		cancel()
		if err != nil {
			if nc != nil {
				abort(nc)
			}
			if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
				return nil, &statusError{fmt.Sprintf("GET %s: %s: %v", path, resp.Status, err)}
			}
			continue
		}
		wc.SetReadLimit(-1)
		c.nc = nc
		return wc, nil
	}
	return nil, err
}

// readWS reads the WebSocket's messages until it ends: each line of a
// message is a frame's envelope, or a control line ({"op":"cursor"...},
// which every batch ends with), the latter skipped. The bytes of a
// message that carried a round's event (its cursor line and the
// WebSocket frame's header included) count as that event's frame bytes.
func (c *conn) readWS(wc *ws.Conn, f *fleet) {
	for {
		_, p, err := wc.Read(context.Background())
		if err != nil {
			c.fail(f, err)
			return
		}
		at := time.Now().UnixNano()
		wire := int64(len(p)) + wsHeaderLen(len(p))
		before := c.frameBytes.Load()
		framed := c.frames.Load()
		for rest := p; len(rest) > 0; {
			var line []byte
			line, rest, _ = bytes.Cut(rest, []byte("\n"))
			if len(line) == 0 || bytes.HasPrefix(line, []byte(`{"op":`)) {
				continue
			}
			c.frame(f, envelopeID(line), parseSent(line), at, len(line))
		}
		if c.frames.Load() > framed {
			c.frameBytes.Store(before + wire)
		}
	}
}

// wsHeaderLen is the length of the header of an unmasked server frame of
// n bytes of payload (RFC 6455 5.2).
func wsHeaderLen(n int) int64 {
	switch {
	case n < 126:
		return 2
	case n <= 0xffff:
		return 4
	}
	return 10
}

func (c *conn) frame(f *fleet, id uint64, sent, at int64, size int) {
	if id <= f.idBase || id > f.idBase+uint64(f.rounds) || sent == 0 || at == 0 {
		f.unexpected.Add(1)
		return
	}
	k := id - f.idBase - 1
	if c.arrived[k].Load() != 0 {
		f.unexpected.Add(1)
		return
	}
	c.sent[k].Store(sent)
	c.arrived[k].Store(at)
	c.frames.Add(1)
	c.frameBytes.Add(int64(size))
	f.got[k].Add(1)
}

// firstEnd returns why the first connection found ended did, or nil.
func (f *fleet) firstEnd() error {
	for _, c := range f.conns {
		if c.done.Load() {
			return c.err
		}
	}
	return nil
}

// heartbeats returns every connection's heartbeat count now.
func (f *fleet) heartbeats() []int64 {
	out := make([]int64, len(f.conns))
	for i, c := range f.conns {
		out[i] = c.heartbeats.Load()
	}
	return out
}

// totalHeartbeats sums every connection's heartbeat count now.
func (f *fleet) totalHeartbeats() int64 {
	var n int64
	for _, c := range f.conns {
		n += c.heartbeats.Load()
	}
	return n
}

// waitRound waits until every connection has round k's event, or until
// every one that has not has ended, or timeout. It returns how many have
// it.
func (f *fleet) waitRound(k int, timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	for {
		got := int(f.got[k].Load())
		if got == len(f.conns) || time.Now().After(deadline) {
			return got
		}
		if f.ended.Load() > 0 && got+f.endedWithout(k) >= len(f.conns) {
			return got
		}
		// The latencies are the receivers' own timestamps: how soon this
		// loop notices the last one does not change them.
		time.Sleep(2 * time.Millisecond)
	}
}

// endedWithout counts the connections that ended without round k's event.
func (f *fleet) endedWithout(k int) int {
	n := 0
	for _, c := range f.conns {
		if c.done.Load() && c.arrived[k].Load() == 0 {
			n++
		}
	}
	return n
}

// close resets every connection and waits (a bounded time) for the readers.
func (f *fleet) close() {
	f.closing.Store(true)
	for _, c := range f.conns {
		if c != nil && c.nc != nil {
			abort(c.nc)
		}
	}
	done := make(chan struct{})
	go func() { f.readers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
	}
}
