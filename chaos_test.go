package eventbus

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestChaosHTTP runs real SSE clients over loopback HTTP against three
// sessions (one with the default evict policy, one with OverflowResync,
// one with OverflowCatchUp and a stall bound of 1 s) while two publishers
// per session publish. Each client subscribes with a
// random maxQueued in [16, 2048], reads at a random speed (fast, jittery,
// slow, or stalling until the session has moved on by more than its queue
// and the sockets hold, so it is evicted or resynced), disconnects at
// random, sometimes stays away until its cursor has left the ring, and
// reconnects with its Last-Event-ID header and the Event-Epoch it saw.
//
// Invariant, per client, stitched across all its connections: the event
// ids it accepted are exactly 1..N (N the last id published), in order,
// without duplicates, except where a state_resync_required frame announced
// a gap, and then the gap is exactly (lastDeliveredId, earliestAvailableId):
// the next event it receives is earliestAvailableId. Under catch-up a
// ring_evicted may come in the middle of a stream, from exactly the last
// event the client has, and the only eviction is catch_up_stalled. Nothing
// is lost silently. Also checked: every connection starts with "retry:
// 3000..4500", the
// Event-Epoch header is the session's, replay_complete comes once per
// connection with the count of what was replayed, client_evicted is the
// last frame of its stream, the envelope id equals the SSE id, and no
// epoch_reset or stream_error ever appears. A replay_budget_exceeded
// resync makes the client reconnect from its cursor at once (the rest is
// still in the ring), so it leaves no gap.
//
// The sleeps only make slow readers slow; no check depends on timing. The
// normal form publishes for ~5 s, -short for 4 s with 36 clients;
// EVENTBUS_LONG=1 for 60 s.
func TestChaosHTTP(t *testing.T) {
	dur, maxEvents, nClients := pick(4*time.Second, 5*time.Second, 60*time.Second), pick(6000, 6000, 200_000), pick(36, 54, 64)
	base := Options{
		RingSize:          1024,
		MaxQueuedBytes:    256 << 10,
		ReplayBudgetBytes: 64 << 10,
		MaxSubscribers:    4 * nClients,
		Logger:            slog.New(slog.DiscardHandler),
	}
	evictOpts, resyncOpts, catchUpOpts := base, base, base
	resyncOpts.OverflowPolicy = OverflowResync
	catchUpOpts.OverflowPolicy = OverflowCatchUp
	catchUpOpts.CatchUpStallTimeout = time.Second
	sessions := map[string]*EventBus{}
	for name, o := range map[string]Options{"evict": evictOpts, "resync": resyncOpts, "catchup": catchUpOpts} {
		b, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		sessions[name] = b
	}
	h := &Handler{
		Lookup: func(r *http.Request, _ string) (*EventBus, error) {
			if b := sessions[r.PathValue("id")]; b != nil {
				return b, nil
			}
			return nil, ErrSessionNotFound
		},
		Logger:    slog.New(slog.DiscardHandler),
		Heartbeat: 250 * time.Millisecond,
		BareIDs:   true, // its clients resume with Event-Epoch and compare the SSE id with the envelope's
		// A stalled reader whose writes block this long is dropped (no
		// frame); it reconnects and resumes like any other. Not shorter
		// under -short: a staller must fill its queue (and be evicted)
		// before its writes have blocked this long, for the mix check.
		WriteTimeout: 3 * time.Second,
	}
	mux := http.NewServeMux()
	mux.Handle("GET /session/{id}/events", h)
	ts := httptest.NewUnstartedServer(mux)
	// Small socket buffers on both sides, so a client that stops reading
	// blocks the server's writes after a few dozen KB and its queue fills.
	ts.Listener = smallBufListener{ts.Listener}
	ts.Start()
	defer ts.Close()

	var published sync.WaitGroup
	pubDone := make(chan struct{})
	stopAt := time.Now().Add(dur)
	for _, name := range []string{"evict", "resync", "catchup"} {
		b := sessions[name]
		var count atomic.Int64
		for p := range 2 {
			published.Go(func() {
				r := rand.New(rand.NewPCG(uint64(p), uint64(len(name))))
				for time.Now().Before(stopAt) && count.Add(1) <= int64(maxEvents) {
					n := 10 + r.IntN(300)
					if r.IntN(50) == 0 {
						n = 4000
					}
					if _, err := b.Publish(Event{Type: "chaos", Data: chaosPayload[:n]}); err != nil {
						t.Errorf("publish: %v", err)
						return
					}
					if r.IntN(4) == 0 {
						time.Sleep(time.Duration(r.IntN(1000)) * time.Microsecond)
					}
				}
			})
		}
	}
	go func() { published.Wait(); close(pubDone) }()

	// A hard deadline only so a bug cannot hang the test forever.
	hardCtx, hardCancel := context.WithTimeout(context.Background(), dur+90*time.Second)
	defer hardCancel()
	clients := make([]*chaosClient, nClients)
	var wg sync.WaitGroup
	for i := range clients {
		name := "evict"
		switch i % 6 {
		case 2, 5:
			name = "resync"
		case 4:
			name = "catchup"
		}
		c := &chaosClient{
			t: t, id: i, session: name, bus: sessions[name], url: ts.URL + "/session/" + name + "/events",
			rng: rand.New(rand.NewPCG(uint64(i), 99)), pubDone: pubDone, ctx: hardCtx,
		}
		clients[i] = c
		wg.Go(c.run)
	}
	wg.Wait()

	var sum chaosCounts
	for _, c := range clients {
		sum.add(c.counts)
	}
	for name, b := range sessions {
		st := b.Stats()
		t.Logf("%s: published %d; evictions %+v; resyncs %+v; dropped %+v; warnings %d; catch-up %+v", name, st.Published,
			st.Evictions, st.Resyncs, st.Dropped, st.Warnings, st.CatchUp)
	}
	t.Logf("clients %d: connections %d, events accepted %d, replayed %d, gaps %d (%d ids announced), evicted %d, "+
		"resync frames %v, budget reconnects %d, own disconnects %d, cut by server %d, warnings %d, "+
		"overflow resyncs reporting lastDeliveredId 0 before any live event %d, ring_evicted while catching up %d",
		nClients, sum.connections, sum.accepted, sum.replayed, sum.gaps, sum.gapIDs, sum.evicted,
		sum.resyncs, sum.budgetReconnects, sum.ownDisconnects, sum.cut, sum.warnings, sum.zeroLastDelivered, sum.catchUpGaps)
	if t.Failed() {
		return
	}
	// The mix must have happened, or the invariant was checked on easy
	// streams only. Stallers wait for the session to move on by more than
	// their queue holds, so this holds whenever the publishers got going.
	if n := sessions["evict"].LastEventID(); n >= 3000 {
		if sum.evicted == 0 {
			t.Errorf("no client was evicted in %d events", n)
		}
		if sum.resyncs[ReasonRingEvicted] == 0 {
			t.Errorf("no ring_evicted resync in %d events", n)
		}
	}
	if n := sessions["resync"].LastEventID(); n >= 3000 && sum.resyncs[ReasonQueueOverflow]+sum.resyncs[ReasonQueueBytesOverflow] == 0 {
		t.Errorf("no overflow resync on the resync session in %d events", n)
	}
	if st := sessions["catchup"].Stats(); st.Published >= 3000 && st.CatchUp.Entered == 0 {
		t.Errorf("no subscriber of the catch-up session fell behind in %d events", st.Published)
	}
	for name, b := range sessions {
		_ = b.Close()
		if b.SubscriberCount() != 0 {
			t.Errorf("%s: %d subscribers left", name, b.SubscriberCount())
		}
	}
}

var chaosPayload = strings.Repeat("p", 4000)

// smallBufListener shrinks the send buffer of every accepted connection.
type smallBufListener struct{ net.Listener }

func (l smallBufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(16 << 10)
	}
	return c, err
}

type chaosCounts struct {
	connections, accepted, replayed, gaps, gapIDs, evicted, budgetReconnects int
	ownDisconnects, cut, warnings, zeroLastDelivered, catchUpGaps            int
	resyncs                                                                  map[string]int
}

func (c *chaosCounts) add(o chaosCounts) {
	c.connections += o.connections
	c.accepted += o.accepted
	c.replayed += o.replayed
	c.gaps += o.gaps
	c.gapIDs += o.gapIDs
	c.evicted += o.evicted
	c.budgetReconnects += o.budgetReconnects
	c.ownDisconnects += o.ownDisconnects
	c.cut += o.cut
	c.warnings += o.warnings
	c.zeroLastDelivered += o.zeroLastDelivered
	c.catchUpGaps += o.catchUpGaps
	if c.resyncs == nil {
		c.resyncs = map[string]int{}
	}
	for k, v := range o.resyncs {
		c.resyncs[k] += v
	}
}

type chaosClient struct {
	t       *testing.T
	id      int
	session string
	bus     *EventBus
	url     string
	rng     *rand.Rand
	pubDone <-chan struct{}
	ctx     context.Context

	cursor   uint64 // the last event id accepted; 0 before the first
	accepted uint64 // events accepted
	gapIDs   uint64 // ids announced as missed
	epoch    string
	counts   chaosCounts
}

func (c *chaosClient) finished() bool {
	select {
	case <-c.pubDone:
		return true
	default:
		return false
	}
}

func (c *chaosClient) failf(format string, args ...any) {
	c.t.Errorf("client %d (%s, cursor %d): %s", c.id, c.session, c.cursor, fmt.Sprintf(format, args...))
}

func (c *chaosClient) run() {
	c.counts.resyncs = map[string]int{}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if tc, ok := conn.(*net.TCPConn); ok {
				_ = tc.SetReadBuffer(8 << 10)
			}
			return conn, err
		},
		DisableCompression: true,
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	for {
		if c.finished() && c.cursor == c.bus.LastEventID() {
			break
		}
		if c.ctx.Err() != nil {
			c.failf("still at %d of %d at the hard deadline", c.cursor, c.bus.LastEventID())
			return
		}
		if !c.connect(hc) {
			return
		}
	}
	if c.accepted+c.gapIDs != c.cursor {
		c.failf("accepted %d ids and %d were announced missing, but the cursor is %d", c.accepted, c.gapIDs, c.cursor)
	}
}

// connect runs one connection. It returns false after a failure that makes
// going on pointless.
func (c *chaosClient) connect(hc *http.Client) bool {
	c.counts.connections++
	mq := 16 + c.rng.IntN(2033)
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.url+"?maxQueued="+strconv.Itoa(mq), nil)
	from := c.cursor
	req.Header.Set("Last-Event-ID", strconv.FormatUint(from, 10)) // 0 the first time: from the start
	if c.epoch != "" {
		req.Header.Set("Event-Epoch", c.epoch)
	}
	resp, err := hc.Do(req)
	if err != nil {
		if c.ctx.Err() == nil {
			c.failf("GET: %v", err)
		}
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		c.failf("status %d: %s", resp.StatusCode, body)
		return false
	}
	if ep := resp.Header.Get("Event-Epoch"); ep != c.bus.Epoch() {
		c.failf("Event-Epoch %q, want %q", ep, c.bus.Epoch())
		return false
	}
	c.epoch = resp.Header.Get("Event-Epoch")

	// How this connection reads.
	profile := c.rng.IntN(6) // 0-1 fast, 2 jittery, 3 slow, 4-5 staller
	disconnectAfter := -1
	if c.rng.IntN(3) == 0 {
		disconnectAfter = c.rng.IntN(800)
	}
	stallAt := c.rng.IntN(200)

	br := bufio.NewReaderSize(resp.Body, 64<<10)
	fr, err := chaosReadFrame(br)
	if err != nil && (errors.Is(err, io.EOF) || errors.Is(err, errChaosCut)) {
		c.counts.cut++
		return true
	}
	if retry, perr := strconv.Atoi(fr.data); err != nil || !fr.retry || perr != nil || retry < 3000 || retry > 4500 {
		c.failf("first record %+v %v, want retry: 3000 to 4500 (the default jitter)", fr, err)
		return false
	}
	var (
		frames, replayed int
		replayDone       bool
		liveSeen         bool
		gap              *[2]uint64 // announced, awaiting its first event
		evicted          bool
	)
	for {
		if c.finished() && c.cursor == c.bus.LastEventID() && gap == nil && replayDone {
			return true
		}
		if !c.finished() {
			if frames == disconnectAfter {
				c.counts.ownDisconnects++
				if c.rng.IntN(4) == 0 {
					// Stay away until the cursor has left the ring.
					c.waitFor(c.bus.LastEventID() + 1100)
				}
				return true
			}
			switch {
			case profile == 2 && frames%8 == 0:
				time.Sleep(time.Duration(c.rng.IntN(300)) * time.Microsecond)
			case profile == 3:
				time.Sleep(time.Duration(500+c.rng.IntN(1500)) * time.Microsecond)
			case profile >= 4 && frames == stallAt:
				// More than the queue (frames or bytes), the batch the
				// handler holds while its write blocks, and the sockets
				// can hold: this reader is evicted or resynced.
				c.waitFor(c.bus.LastEventID() + 2*uint64(min(mq, 1100)) + 1500)
			}
		}
		fr, err := chaosReadFrame(br)
		if err != nil {
			if evicted && (err == io.EOF || errors.Is(err, errChaosCut)) {
				// The end of the stream, orderly or not: a client too slow
				// to read even the end of the response within the write
				// deadline is cut after client_evicted reached it (seen
				// only on a heavily loaded machine). Nothing followed the
				// terminal frame either way.
				return true
			}
			if evicted {
				c.failf("after client_evicted: %v, want the end of the stream", err)
				return false
			}
			if !errors.Is(err, io.EOF) && !errors.Is(err, errChaosCut) {
				c.failf("malformed stream: %v", err)
				return false
			}
			// The server dropped a blocked writer (no frame): reconnect
			// and resume.
			c.counts.cut++
			return true
		}
		if evicted {
			c.failf("frame %+v after client_evicted", fr)
			return false
		}
		frames++
		switch {
		case fr.comment || fr.retry:
			continue
		case fr.hasID:
			if fr.typ != "chaos" || !strings.HasPrefix(fr.data, `{"id":`+strconv.FormatUint(fr.id, 10)+`,"v":1,"type":"chaos",`) {
				c.failf("event %d: type %q data %.60q", fr.id, fr.typ, fr.data)
				return false
			}
			switch {
			case gap != nil:
				if fr.id != gap[1] {
					c.failf("a gap (%d, %d) was announced, but the next event is %d", gap[0], gap[1], fr.id)
					return false
				}
				c.counts.gaps++
				c.counts.gapIDs += int(gap[1] - gap[0] - 1)
				c.gapIDs += gap[1] - gap[0] - 1
				gap = nil
			case fr.id != c.cursor+1:
				c.failf("event %d after %d with no resync announcing a gap", fr.id, c.cursor)
				return false
			}
			c.cursor = fr.id
			c.accepted++
			c.counts.accepted++
			if replayDone {
				liveSeen = true
			} else {
				replayed++
				c.counts.replayed++
			}
		default:
			var env chaosEnvelope
			if err := json.Unmarshal([]byte(fr.data), &env); err != nil || env.Type != fr.typ || env.V != 1 {
				c.failf("synthetic frame %q %q: %v", fr.typ, fr.data, err)
				return false
			}
			d := env.Data
			switch fr.typ {
			case TypeReplayComplete:
				if replayDone || d.ReplayedCount == nil || *d.ReplayedCount != replayed || d.Epoch != c.epoch ||
					(replayed > 0 && (d.LastReplayedEventID != c.cursor || d.LastEventID != c.cursor)) {
					c.failf("replay_complete %s after %d replayed events (twice: %v)", fr.data, replayed, replayDone)
					return false
				}
				replayDone = true
			case TypeStateResyncRequired:
				c.counts.resyncs[d.Reason]++
				if d.Epoch != c.epoch || gap != nil {
					c.failf("resync %s (pending gap %v)", fr.data, gap)
					return false
				}
				switch d.Reason {
				case ReasonRingEvicted:
					switch {
					case frames == 1 && d.LastDeliveredID == from && d.EarliestAvailableID > from+1:
						// A resume whose cursor left the ring.
					case c.session == "catchup" && d.LastDeliveredID == c.cursor && d.EarliestAvailableID > c.cursor+1:
						// Catching up, the ring moved past its cursor.
						c.counts.catchUpGaps++
					default:
						c.failf("ring_evicted %s as frame %d of a resume from %d", fr.data, frames, from)
						return false
					}
					gap = &[2]uint64{d.LastDeliveredID, d.EarliestAvailableID}
				case ReasonReplayBudgetExceeded:
					if d.LastDeliveredID != c.cursor || d.EarliestAvailableID != c.cursor+1 {
						c.failf("replay_budget_exceeded %s", fr.data)
						return false
					}
					// The rest is still in the ring: fetch it now.
					c.counts.budgetReconnects++
					return true
				case ReasonQueueOverflow, ReasonQueueBytesOverflow:
					if c.session != "resync" || d.EarliestAvailableID <= c.cursor {
						c.failf("overflow resync %s", fr.data)
						return false
					}
					if d.LastDeliveredID != c.cursor {
						// SPEC 3.5 says the last id the subscriber
						// dequeued: 0 while the handler has dequeued
						// no event of this subscription yet, although
						// the client holds its cursor (and the replay).
						if d.LastDeliveredID != 0 || liveSeen {
							c.failf("overflow resync %s, but the last event delivered is %d", fr.data, c.cursor)
							return false
						}
						c.counts.zeroLastDelivered++
					}
					gap = &[2]uint64{c.cursor, d.EarliestAvailableID}
				default:
					c.failf("unexpected resync %s", fr.data)
					return false
				}
			case TypeSlowClientWarning:
				c.counts.warnings++
			case TypeClientEvicted:
				ok := d.DroppedAfter > c.cursor && d.MaxQueued == mq
				switch d.Reason {
				case ReasonQueueOverflow:
					ok = ok && d.QueueSize == mq && c.session == "evict"
				case ReasonQueueBytesOverflow:
					ok = ok && d.EventBytes != nil && d.QueuedBytes+*d.EventBytes > d.MaxQueuedBytes && c.session == "evict"
				case ReasonRepeatedOverflow:
					ok = ok && c.session == "resync"
				case ReasonCatchUpStalled:
					ok = ok && c.session == "catchup"
				default:
					ok = false
				}
				if !ok {
					c.failf("client_evicted %s (maxQueued %d)", fr.data, mq)
					return false
				}
				c.counts.evicted++
				evicted = true
			default:
				c.failf("unexpected frame %q %s", fr.typ, fr.data)
				return false
			}
		}
	}
}

// waitFor sleeps until the session's last id reaches id, the publishers
// are done, or the hard deadline.
func (c *chaosClient) waitFor(id uint64) {
	for c.bus.LastEventID() < id && !c.finished() && c.ctx.Err() == nil {
		time.Sleep(2 * time.Millisecond)
	}
}

type chaosEnvelope struct {
	V    int    `json:"v"`
	Type string `json:"type"`
	Data struct {
		Reason              string `json:"reason"`
		Detail              string `json:"detail"`
		LastDeliveredID     uint64 `json:"lastDeliveredId"`
		EarliestAvailableID uint64 `json:"earliestAvailableId"`
		Epoch               string `json:"epoch"`
		ReplayedCount       *int   `json:"replayedCount"`
		LastReplayedEventID uint64 `json:"lastReplayedEventId"`
		LastEventID         uint64 `json:"lastEventId"`
		DroppedAfter        uint64 `json:"droppedAfter"`
		QueueSize           int    `json:"queueSize"`
		MaxQueued           int    `json:"maxQueued"`
		QueuedBytes         int    `json:"queuedBytes"`
		MaxQueuedBytes      int    `json:"maxQueuedBytes"`
		EventBytes          *int   `json:"eventBytes"`
	} `json:"data"`
}

// chaosFrame is one record of the stream.
type chaosFrame struct {
	comment, retry bool
	hasID          bool
	id             uint64
	typ, data      string
}

var errChaosCut = errors.New("stream ended inside a frame")

// chaosReadFrame reads one record of the exact format the handler writes
// ("retry: N" or ":" alone on their line, or [id: N] event: T data: J
// followed by a blank line), strictly: anything else is an error. A clean end between
// records is io.EOF; an end inside one is errChaosCut (a dropped writer
// may stop mid-frame; the client discards it, as EventSource does).
func chaosReadFrame(br *bufio.Reader) (chaosFrame, error) {
	var fr chaosFrame
	line, err := chaosLine(br)
	if err != nil {
		return fr, err
	}
	next := func() (string, error) {
		l, err := chaosLine(br)
		if err == io.EOF {
			err = errChaosCut
		}
		return l, err
	}
	end := func() error {
		l, err := next()
		if err == nil && l != "" {
			err = fmt.Errorf("want a blank line, got %q", l)
		}
		return err
	}
	switch {
	case line == ":":
		fr.comment = true
		return fr, nil
	case strings.HasPrefix(line, "retry: "):
		fr.retry, fr.data = true, line[len("retry: "):]
		return fr, nil
	case strings.HasPrefix(line, "id: "):
		id, perr := strconv.ParseUint(line[len("id: "):], 10, 64)
		if perr != nil || id == 0 {
			return fr, fmt.Errorf("bad id line %q", line)
		}
		fr.hasID, fr.id = true, id
		if line, err = next(); err != nil {
			return fr, err
		}
	}
	typ, ok := strings.CutPrefix(line, "event: ")
	if !ok {
		return fr, fmt.Errorf("want an event line, got %q", line)
	}
	fr.typ = typ
	if line, err = next(); err != nil {
		return fr, err
	}
	if fr.data, ok = strings.CutPrefix(line, "data: "); !ok {
		return fr, fmt.Errorf("want a data line, got %q", line)
	}
	return fr, end()
}

// chaosLine reads one LF-terminated line without its LF. A CR anywhere is
// an error: the handler never writes one.
func chaosLine(br *bufio.Reader) (string, error) {
	b, err := br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		buf := append([]byte(nil), b...)
		for err == bufio.ErrBufferFull {
			b, err = br.ReadSlice('\n')
			buf = append(buf, b...)
		}
		b = buf
	}
	if err != nil {
		if len(b) > 0 || err != io.EOF {
			return "", errChaosCut
		}
		return "", io.EOF
	}
	b = b[:len(b)-1]
	if bytes.IndexByte(b, '\r') >= 0 {
		return "", fmt.Errorf("CR in line %q", b)
	}
	return string(b), nil
}

// ---------------------------------------------------------------------------
// In process: publishers, and subscribers that join, resume, cancel and are
// evicted at random, checked frame by frame.

// TestStressPublishSubscribeResumeCancelEvict runs several publishers while
// subscribers join, resume with their last id, cancel (context, Close,
// breaking out of the loop) and get evicted (small MaxQueued, slow readers)
// at random, and checks every subscription's frame sequence:
//
//   - event ids strictly increase and are contiguous, except right after a
//     state_resync_required frame;
//   - a resumed subscription gets exactly the ids after its cursor (or a
//     ring_evicted resync naming where they start again), then
//     replay_complete whose data matches what was replayed;
//   - a live-only subscription starts at an id published after it began
//     subscribing and no later than the first one after Subscribe returned;
//   - a warning names the event right before it;
//   - an evicted subscription is a contiguous run, then client_evicted
//     naming the next id, then the end.
//
// It runs for about 2 s (0.3 s with -short). The sleeps only pace the
// publishers and make slow readers slow; no check depends on timing.
func TestStressPublishSubscribeResumeCancelEvict(t *testing.T) {
	dur := 2 * time.Second
	if testing.Short() {
		dur = 300 * time.Millisecond
	}
	b := newBus(t, Options{
		RingSize:          512,
		MaxQueuedBytes:    24 << 10,
		MaxSubscribers:    10,
		ReplayBudgetBytes: 48 << 10,
	})

	stop := make(chan struct{})
	var pubs sync.WaitGroup
	for p := range 4 {
		pubs.Go(func() {
			r := rand.New(rand.NewPCG(uint64(p), 42))
			for {
				select {
				case <-stop:
					return
				default:
				}
				size := r.IntN(300)
				if r.IntN(100) == 0 {
					size = 6000 // now and then a big one, for the byte caps
				}
				if _, err := b.Publish(Event{Type: "t", Data: strings.Repeat("x", size)}); err != nil {
					t.Errorf("publish: %v", err)
					return
				}
				if r.IntN(3) == 0 {
					time.Sleep(time.Duration(r.IntN(200)) * time.Microsecond)
				}
			}
		})
	}

	var st stressStats
	deadline := time.Now().Add(dur)
	var workers sync.WaitGroup
	for w := range 12 {
		workers.Go(func() { stressWorker(t, b, uint64(w), deadline, &st) })
	}
	workers.Wait()
	close(stop)
	pubs.Wait()

	t.Logf("published %d; sessions %d (resumed %d), frames %d; evicted %d, cancelled %d, limit hits %d; resyncs: ring_evicted %d, budget %d; warnings %d",
		b.LastEventID(), st.sessions.Load(), st.resumed.Load(), st.frames.Load(), st.evicted.Load(), st.cancelled.Load(),
		st.limited.Load(), st.ringEvicted.Load(), st.budget.Load(), st.warnings.Load())
	if b.SubscriberCount() != 0 {
		t.Errorf("%d subscribers left after every session ended", b.SubscriberCount())
	}
	if !testing.Short() && !t.Failed() {
		// The mix must have happened, or the test checks nothing.
		for name, n := range map[string]int64{
			"evictions": st.evicted.Load(), "cancellations": st.cancelled.Load(), "resumes": st.resumed.Load(),
		} {
			if n == 0 {
				t.Errorf("no %s in %v", name, dur)
			}
		}
	}
}

type stressStats struct {
	sessions, resumed, frames, evicted, cancelled, limited atomic.Int64
	ringEvicted, budget, warnings                          atomic.Int64
}

// stressWorker is one client: it subscribes again and again until the
// deadline, resuming from the last id it received most of the time.
func stressWorker(t *testing.T, b *EventBus, seed uint64, deadline time.Time, st *stressStats) {
	r := rand.New(rand.NewPCG(seed, 7))
	var cursor uint64
	haveCursor := false
	for time.Now().Before(deadline) {
		opts := SubscribeOptions{MaxQueued: 16 + r.IntN(64)}
		if haveCursor && r.IntN(4) != 0 {
			opts.Resume, opts.LastEventID, opts.Epoch = true, cursor, b.Epoch()
		}
		ctx, cancel := context.WithCancel(context.Background())
		lo := b.LastEventID()
		s, err := b.Subscribe(ctx, opts)
		hi := b.LastEventID()
		if errors.Is(err, ErrSubscriberLimitExceeded) {
			cancel()
			st.limited.Add(1)
			time.Sleep(100 * time.Microsecond)
			continue
		}
		if err != nil {
			cancel()
			t.Errorf("subscribe: %v", err)
			return
		}
		st.sessions.Add(1)
		if opts.Resume {
			st.resumed.Add(1)
		}

		c := &stressCheck{opts: opts, lo: lo, hi: hi}
		if opts.Resume {
			c.expect = opts.LastEventID + 1
		}
		slow := r.IntN(3) == 0
		limit := 1 + r.IntN(400) // frames to read before cancelling
		how := r.IntN(4)
		cancelled := false
		cancelNow := func() {
			cancelled = true
			switch how {
			case 0:
				cancel() // the context: ends asynchronously, frames may still come
			case 1:
				s.Close()
			case 2:
				go s.Close() // from another goroutine
			}
		}

		if r.IntN(2) == 0 {
			n := 0
			for f := range s.Events() {
				if err := c.frame(f); err != nil {
					t.Errorf("session %+v: %v\n%s", opts, err, c.history())
					cancel()
					return
				}
				n++
				if slow {
					time.Sleep(time.Duration(100+r.IntN(400)) * time.Microsecond)
				}
				if (n >= limit || time.Now().After(deadline)) && !cancelled {
					if how == 3 {
						cancelled = true
						break // breaking out closes the subscription
					}
					cancelNow()
				}
			}
		} else {
			var buf []Frame
			for open := true; open; {
				// Ready fires when the queue goes from empty to
				// non-empty: wait on it only after a take found nothing.
				if buf, open = s.AppendReady(buf[:0]); len(buf) == 0 && open {
					<-s.Ready()
					continue
				}
				for _, f := range buf {
					if err := c.frame(f); err != nil {
						t.Errorf("session %+v: %v\n%s", opts, err, c.history())
						cancel()
						return
					}
				}
				if slow {
					time.Sleep(time.Duration(200+r.IntN(800)) * time.Microsecond)
				}
				if (c.n >= limit || time.Now().After(deadline)) && !cancelled && open {
					if how == 3 {
						how = 1
					}
					cancelNow()
				}
			}
		}
		cancel()

		evicted := errors.Is(s.Err(), ErrEvicted)
		switch {
		case c.terminal && !evicted:
			t.Errorf("session %+v: client_evicted frame but Err() = %v", opts, s.Err())
		case !cancelled && !c.terminal:
			t.Errorf("session %+v ended without cancellation or client_evicted, Err() = %v\n%s", opts, s.Err(), c.history())
		case !cancelled && !evicted:
			t.Errorf("session %+v: Err() = %v, want ErrEvicted", opts, s.Err())
		case cancelled && !evicted && !errors.Is(s.Err(), context.Canceled):
			t.Errorf("session %+v: cancelled, Err() = %v", opts, s.Err())
		}
		if evicted {
			st.evicted.Add(1)
		} else {
			st.cancelled.Add(1)
		}
		st.frames.Add(int64(c.n))
		st.ringEvicted.Add(int64(c.ringEvicted))
		st.budget.Add(int64(c.budget))
		st.warnings.Add(int64(c.warnings))
		if c.last > 0 {
			cursor, haveCursor = c.last, true
		}
		if t.Failed() {
			return
		}
	}
}

// stressCheck validates one subscription's frames as they arrive.
type stressCheck struct {
	opts   SubscribeOptions
	lo, hi uint64 // LastEventID before and after Subscribe

	n, events   int
	last        uint64 // last event id received
	expect      uint64 // the next event id, 0 when any larger one is fine
	replayed    int
	replayDone  bool
	terminal    bool
	ringEvicted int
	budget      int
	warnings    int
	recent      []string
}

func (c *stressCheck) history() string { return strings.Join(c.recent, "\n") }

func (c *stressCheck) frame(f Frame) error {
	c.n++
	c.recent = append(c.recent, string(f.JSON()))
	if len(c.recent) > 8 {
		c.recent = c.recent[1:]
	}
	if c.terminal {
		return fmt.Errorf("frame %q after the terminal frame", f.Type())
	}
	if !f.Synthetic() {
		return c.event(f)
	}
	var d struct {
		Reason              string  `json:"reason"`
		LastDeliveredID     uint64  `json:"lastDeliveredId"`
		EarliestAvailableID uint64  `json:"earliestAvailableId"`
		ReplayedCount       *int    `json:"replayedCount"`
		LastEventID         uint64  `json:"lastEventId"`
		DroppedAfter        uint64  `json:"droppedAfter"`
		Epoch               *string `json:"epoch"`
	}
	var env struct {
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(f.JSON(), &env); err != nil {
		return err
	}
	if err := json.Unmarshal(env.Data, &d); err != nil {
		return err
	}
	switch f.Type() {
	case TypeStateResyncRequired:
		if !c.opts.Resume || c.replayDone {
			return errors.New("state_resync_required outside a resume's replay")
		}
		switch d.Reason {
		case ReasonRingEvicted:
			if c.n != 1 || d.LastDeliveredID != c.opts.LastEventID || d.EarliestAvailableID <= c.opts.LastEventID+1 {
				return fmt.Errorf("bad ring_evicted resync (frame %d): %s", c.n, env.Data)
			}
			c.expect = d.EarliestAvailableID
			c.ringEvicted++
		case ReasonReplayBudgetExceeded:
			if c.replayed == 0 || d.LastDeliveredID != c.last || d.EarliestAvailableID != c.last+1 {
				return fmt.Errorf("bad replay_budget_exceeded resync after %d: %s", c.last, env.Data)
			}
			c.expect = 0 // the live stream resumes later
			c.budget++
		default:
			return fmt.Errorf("unexpected resync: %s", env.Data)
		}
	case TypeReplayComplete:
		if !c.opts.Resume || c.replayDone {
			return errors.New("unexpected replay_complete")
		}
		c.replayDone = true
		if d.ReplayedCount == nil || *d.ReplayedCount != c.replayed {
			return fmt.Errorf("replay_complete %s after %d replayed frames", env.Data, c.replayed)
		}
		if c.replayed > 0 && d.LastEventID != c.last {
			return fmt.Errorf("replay_complete %s, last replayed %d", env.Data, c.last)
		}
	case TypeSlowClientWarning:
		if c.events == 0 || d.LastEventID != c.last {
			return fmt.Errorf("warning %s right after event %d", env.Data, c.last)
		}
		c.warnings++
	case TypeClientEvicted:
		if c.last == 0 || d.DroppedAfter != c.last+1 {
			return fmt.Errorf("client_evicted %s after event %d", env.Data, c.last)
		}
		c.terminal = true
	default:
		return fmt.Errorf("unexpected synthetic frame %q", f.Type())
	}
	return nil
}

func (c *stressCheck) event(f Frame) error {
	id := f.ID()
	if want := `{"id":` + strconv.FormatUint(id, 10) + `,`; !strings.HasPrefix(string(f.JSON()), want) {
		return fmt.Errorf("frame id %d, envelope %.40s", id, f.JSON())
	}
	if id <= c.last {
		return fmt.Errorf("id %d after %d", id, c.last)
	}
	if c.expect != 0 && id != c.expect {
		return fmt.Errorf("id %d, want %d", id, c.expect)
	}
	if c.events == 0 && !c.opts.Resume && (id <= c.lo || id > c.hi+1) {
		return fmt.Errorf("live-only subscription began at %d, LastEventID was %d before Subscribe and %d after", id, c.lo, c.hi)
	}
	if c.opts.Resume && !c.replayDone {
		c.replayed++
	}
	c.events++
	c.last = id
	c.expect = id + 1
	return nil
}

// TestStressCheckRejectsBadSequences makes sure the stress checker is not
// vacuous: it catches a gap, a duplicate, a wrong replay start and a frame
// after the terminal one.
func TestStressCheckRejectsBadSequences(t *testing.T) {
	ev := func(id uint64) Frame { return coreQueueFrameJSON(id) }
	c := queueCounts{maxQueued: 16}
	for name, tc := range map[string]struct {
		c      *stressCheck
		frames []Frame
	}{
		"gap":            {&stressCheck{lo: 0, hi: 0}, []Frame{ev(1), ev(3)}},
		"duplicate":      {&stressCheck{lo: 0, hi: 0}, []Frame{ev(1), ev(1)}},
		"late live":      {&stressCheck{lo: 0, hi: 3}, []Frame{ev(5)}},
		"replay start":   {&stressCheck{opts: SubscribeOptions{Resume: true, LastEventID: 3}, expect: 4}, []Frame{ev(5)}},
		"replay count":   {&stressCheck{opts: SubscribeOptions{Resume: true, LastEventID: 3}, expect: 4}, []Frame{ev(4), replayCompleteFrame(2, 4, "E", 1)}},
		"after terminal": {&stressCheck{}, []Frame{ev(1), evictedFrame(ReasonQueueOverflow, 2, c, -1, 1), ev(2)}},
		"wrong dropped":  {&stressCheck{}, []Frame{ev(1), evictedFrame(ReasonQueueOverflow, 5, c, -1, 1)}},
		"warning":        {&stressCheck{}, []Frame{ev(1), ev(2), warningFrame(c, 1, "frames", 1)}},
	} {
		var err error
		for _, f := range tc.frames {
			if err = tc.c.frame(f); err != nil {
				break
			}
		}
		if err == nil {
			t.Errorf("%s: not detected", name)
		}
	}
}

// coreQueueFrameJSON is an event frame with a real envelope prefix.
func coreQueueFrameJSON(id uint64) Frame {
	j := `{"id":` + strconv.FormatUint(id, 10) + `,"v":1,"type":"t"}`
	wire := "data: " + j + "\n\n"
	return Frame{&frame{wire: []byte(wire), json: 6, kind: kindEvent, id: id, typ: "t"}}
}
