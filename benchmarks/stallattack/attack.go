package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// config is one attack (issue 32): clients that open multiplexed streams
// of many sessions and never read them, while events are published to
// every session, and the daemon's resident memory watched from outside.
type config struct {
	base     string // the daemon's http://host:port
	pid      int    // the daemon's process, for its RSS
	sessions int    // sessions per stream: s0, s1, ...
	// rounds is how many stalled streams are opened, one per round; after
	// each, perRound events of eventBytes are published to every session.
	rounds, perRound, eventBytes int
	// h2 opens every round's stream on one h2c connection instead of an
	// HTTP/1.1 connection each.
	h2 bool
	// rcvbuf is the clients' socket receive buffer (SO_RCVBUF).
	rcvbuf int
	// settle is how long RSS is watched after each round's publishes.
	settle time.Duration
	// path is the stream's route: "/events" (the multiplexed stream, with
	// a session parameter per session) or "/session/{id}/events" with
	// sessions 1.
	single bool
}

// roundResult is what one round left: the peak RSS seen while it was
// watched, and the daemon's view of its memory.
type roundResult struct {
	Round   int
	PeakRSS int64 // bytes
}

// result is an attack's outcome.
type result struct {
	Rounds  []roundResult
	PeakRSS int64
}

// streamPath is the GET of one stalled stream.
func (c config) streamPath() string {
	if c.single {
		return "/session/s0/events"
	}
	q := url.Values{}
	for i := range c.sessions {
		q.Add("session", "s"+strconv.Itoa(i))
	}
	return "/events?" + q.Encode()
}

// run creates the sessions, then runs the rounds. The stalled clients are
// closed when ctx ends or run returns.
func run(ctx context.Context, c config) (result, error) {
	var res result
	hc := &http.Client{Timeout: 30 * time.Second}
	for i := range c.sessions {
		if err := publish(ctx, hc, c.base, "s"+strconv.Itoa(i), 1); err != nil {
			return res, fmt.Errorf("create session s%d: %w", i, err)
		}
	}
	host := strings.TrimPrefix(c.base, "http://")
	var conns []net.Conn
	defer func() {
		for _, nc := range conns {
			_ = nc.Close()
		}
	}()
	var h2 *h2conn
	for r := range c.rounds {
		before, err := subscribers(ctx, hc, c.base, lastSession(c))
		if err != nil {
			return res, err
		}
		if c.h2 {
			if h2 == nil {
				nc, err := dial(ctx, host, c.rcvbuf)
				if err != nil {
					return res, err
				}
				conns = append(conns, nc)
				if h2, err = newH2Conn(nc, host); err != nil {
					return res, err
				}
			}
			if err := h2.open(c.streamPath()); err != nil {
				return res, err
			}
		} else {
			nc, err := dial(ctx, host, c.rcvbuf)
			if err != nil {
				return res, err
			}
			conns = append(conns, nc)
			if err := openHTTP1(nc, host, c.streamPath()); err != nil {
				return res, err
			}
		}
		// The stream subscribes on its request's goroutine: wait for it.
		if err := waitSubscribed(ctx, hc, c, before+1); err != nil {
			return res, fmt.Errorf("round %d: %w", r+1, err)
		}
		watch := startWatch(c.pid)
		if err := publishAll(ctx, hc, c); err != nil {
			watch.stop()
			return res, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(c.settle):
		}
		peak := watch.stop()
		res.Rounds = append(res.Rounds, roundResult{Round: r + 1, PeakRSS: peak})
		res.PeakRSS = max(res.PeakRSS, peak)
		if err := ctx.Err(); err != nil {
			return res, err
		}
	}
	return res, nil
}

// dial connects to host with a receive buffer of rcvbuf bytes, set before
// the handshake so the window the client advertises stays small.
func dial(ctx context.Context, host string, rcvbuf int) (net.Conn, error) {
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf)
		})
		return errors.Join(err, serr)
	}}
	return d.DialContext(ctx, "tcp", host)
}

// openHTTP1 sends the stream's GET and reads nothing back.
func openHTTP1(nc net.Conn, host, path string) error {
	_, err := fmt.Fprintf(nc, "GET %s HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\n\r\n", path, host)
	return err
}

// h2conn is an h2c connection with prior knowledge whose streams get a
// 4 KiB flow-control window and are never read: no WINDOW_UPDATE is ever
// sent, and nothing the server writes is read from the socket.
type h2conn struct {
	nc     net.Conn
	fr     *http2.Framer
	host   string
	nextID uint32
	mu     sync.Mutex
}

func newH2Conn(nc net.Conn, host string) (*h2conn, error) {
	if _, err := io.WriteString(nc, http2.ClientPreface); err != nil {
		return nil, err
	}
	c := &h2conn{nc: nc, fr: http2.NewFramer(nc, nc), host: host, nextID: 1}
	// A small window: the server may send each stream this much before
	// it waits for a WINDOW_UPDATE that never comes.
	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 4096}); err != nil {
		return nil, err
	}
	return c, nil
}

// open starts a GET of path on a new stream.
func (c *h2conn) open(path string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", c.host}, {":path", path}, {"accept", "text/event-stream"}} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			return err
		}
	}
	id := c.nextID
	c.nextID += 2
	return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true})
}

// publish posts n events of the smallest kind to session (it creates it).
func publish(ctx context.Context, hc *http.Client, base, session string, n int) error {
	for range n {
		if err := post(ctx, hc, base, session, []byte(`{"type":"hello","data":1}`)); err != nil {
			return err
		}
	}
	return nil
}

func post(ctx context.Context, hc *http.Client, base, session string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/session/"+session+"/events", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s %s", session, resp.Status, b)
	}
	return nil
}

// publishAll publishes perRound events of about eventBytes to every
// session, from as many goroutines as there are sessions' worth of work
// split over 4, as a busy publisher would.
func publishAll(ctx context.Context, hc *http.Client, c config) error {
	body := bigEvent(c.eventBytes)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < c.sessions; i += 4 {
				for range c.perRound {
					if err := post(ctx, hc, c.base, "s"+strconv.Itoa(i), body); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// bigEvent is an event whose envelope is about n bytes.
func bigEvent(n int) []byte {
	pad := max(n-64, 1)
	return []byte(`{"type":"big","data":"` + strings.Repeat("x", pad) + `"}`)
}

// lastSession is the stream's last session, the last one it subscribes.
func lastSession(c config) string {
	if c.single {
		return "s0"
	}
	return "s" + strconv.Itoa(c.sessions-1)
}

// waitSubscribed waits until the stream's last session counts n
// subscribers: the stream just opened has subscribed to all of them.
func waitSubscribed(ctx context.Context, hc *http.Client, c config, n int) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := subscribers(ctx, hc, c.base, lastSession(c))
		if err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the stream did not subscribe within 10s (%d subscribers, want %d)", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// subscribers returns the subscriber count of session, from its status.
func subscribers(ctx context.Context, hc *http.Client, base, session string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/session/"+session, nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var st struct {
		Subscribers *int `json:"subscribers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || st.Subscribers == nil {
		return 0, fmt.Errorf("status of %s: no subscriber count (%v)", session, err)
	}
	return *st.Subscribers, nil
}

// watch samples a process's RSS every 10ms until stopped, and keeps the
// peak.
type watch struct {
	stopc chan struct{}
	done  chan int64
}

func startWatch(pid int) *watch {
	w := &watch{stopc: make(chan struct{}), done: make(chan int64, 1)}
	go func() {
		var peak int64
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			if rss, err := readRSS(pid); err == nil {
				peak = max(peak, rss)
			}
			select {
			case <-w.stopc:
				w.done <- peak
				return
			case <-t.C:
			}
		}
	}()
	return w
}

func (w *watch) stop() int64 {
	close(w.stopc)
	return <-w.done
}

// readRSS returns VmRSS of pid, in bytes.
func readRSS(pid int) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS")
}
