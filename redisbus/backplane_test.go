package redisbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/internal/backplanetest"
)

const wait = 10 * time.Second // bound of every wait for frames

func threeReplicas(t *testing.T, r *redisServer, opts Options) (a, b, c *replica) {
	return newReplica(t, r, "A", opts), newReplica(t, r, "B", opts), newReplica(t, r, "C", opts)
}

// Events published concurrently on all three replicas reach every
// subscriber on every replica, with the same ids, bytes and order.
func TestThreeReplicasOneOrder(t *testing.T) {
	r := startRedis(t)
	a, b, c := threeReplicas(t, r, testOptions(t))
	backplanetest.ThreeReplicasOneOrder(t, a.shared, b.shared, c.shared)
}

// After the stream was trimmed past the cursor: ring_evicted, then what
// the stream still holds.
func TestResumeAfterTrim(t *testing.T) {
	r := startRedis(t)
	opts := testOptions(t)
	opts.RingSize = 10
	a, _, c := threeReplicas(t, r, opts)
	var epoch string
	for range 50 {
		_, e, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e", Data: "x"})
		if err != nil {
			t.Fatal(err)
		}
		epoch = e
	}
	in, err := a.bp.Info(context.Background(), "s")
	if err != nil {
		t.Fatal(err)
	}
	if in.FirstEventID != 41 || in.LastEventID != 50 || in.Epoch != epoch {
		t.Fatalf("info %+v, want ids 41..50 of epoch %s", in, epoch)
	}
	if n := r.do(t, "XLEN", "t:"+t.Name()+":{s}:s:"+epoch); n != int64(10) {
		t.Fatalf("XLEN %v, want 10", n)
	}
	sc := openSSE(t, c, "s", map[string]string{"Last-Event-ID": "5", "Event-Epoch": epoch}, "")
	rs := sc.Next(wait)
	if rs.Event != eventbus.TypeStateResyncRequired || rs.Str(t, "data", "reason") != "ring_evicted" ||
		rs.Num(t, "data", "lastDeliveredId") != 5 || rs.Num(t, "data", "earliestAvailableId") != 41 ||
		rs.Str(t, "data", "epoch") != epoch {
		t.Fatalf("want ring_evicted 5 -> 41, got %+v", rs)
	}
	wantIDs(t, sc.Events(10, wait), 41, 50)
	if rc := sc.Next(wait); rc.Event != eventbus.TypeReplayComplete || rc.Num(t, "data", "replayedCount") != 10 {
		t.Fatalf("want replay_complete of 10, got %+v", rc)
	}
	// A resume inside what is held is exact.
	s2 := openSSE(t, c, "s", map[string]string{"Last-Event-ID": "40", "Event-Epoch": epoch}, "")
	wantIDs(t, s2.Events(10, wait), 41, 50)
}

// The byte bound trims the stream too, and the byte counter stays exact.
func TestTrimByBytes(t *testing.T) {
	r := startRedis(t)
	opts := testOptions(t)
	opts.Bus.RingMaxBytes = 1000
	a := newReplica(t, r, "A", opts)
	var epoch string
	ts := map[string]any{"serverTimestamp": 1}
	for i := range 40 {
		_, e, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e", Data: strings.Repeat("x", i*3), Meta: ts})
		if err != nil {
			t.Fatal(err)
		}
		epoch = e
	}
	in, err := a.bp.Info(context.Background(), "s")
	if err != nil {
		t.Fatal(err)
	}
	key := "t:" + t.Name() + ":{s}:s:" + epoch
	entries := r.do(t, "XRANGE", key, "-", "+").([]any)
	var sum uint64
	for _, e := range entries {
		fields := e.([]any)[1].([]any)
		sum += uint64(len(fields[3].(string)))
	}
	if in.Bytes != sum || sum > 1000 || in.LastEventID != 40 || in.FirstEventID != 40-uint64(len(entries))+1 {
		t.Fatalf("info %+v; stream holds %d entries of %d bytes", in, len(entries), sum)
	}
	// The bound is tight: the newest entry the trim dropped would not fit.
	dropped := in.FirstEventID - 1
	ev, err := a.bp.encoder.Encode(eventbus.Event{Type: "e", Data: strings.Repeat("x", int(dropped-1)*3), Meta: ts})
	if err != nil {
		t.Fatal(err)
	}
	if size := len(ev.Envelope(dropped)); sum+uint64(size) <= 1000 {
		t.Fatalf("id %d (%d bytes) was dropped although %d+%d fits 1000", dropped, size, sum, size)
	}
	// A single event above the byte bound still stays, alone.
	if _, _, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e", Data: strings.Repeat("y", 2000)}); err != nil {
		t.Fatal(err)
	}
	in, _ = a.bp.Info(context.Background(), "s")
	if in.FirstEventID != 41 || in.LastEventID != 41 {
		t.Fatalf("after a big event: %+v, want only id 41", in)
	}
}

// Redis restarted without persistence: the stream is lost, mirrors close,
// ids restart at 1 in a new epoch, and a client presenting the old epoch
// gets epoch_reset.
func TestRedisRestartEpochReset(t *testing.T) {
	r := startRedis(t)
	a, _, c := threeReplicas(t, r, testOptions(t))
	sa := openSSE(t, a, "s", nil, "")
	for range 10 {
		a.publish(t, "s", "e", nil)
	}
	wantIDs(t, sa.Events(10, wait), 1, 10)
	old := sa.Epoch

	r.restart()
	// A's mirror is of a lost stream: its stream ends, so that the client
	// reconnects.
	if rest := sa.Ended(wait); len(rest) != 0 {
		t.Fatalf("frames after the restart: %+v", rest)
	}
	var epoch string
	for i := range 3 {
		var id uint64
		var err error
		// The first publishes may meet connections the restart broke.
		waitFor(t, wait, "publish after restart", func() bool {
			id, epoch, err = c.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
			return err == nil
		})
		if id != uint64(i+1) {
			t.Fatalf("id %d after the restart, want %d", id, i+1)
		}
	}
	if epoch == old || len(epoch) != 32 {
		t.Fatalf("epoch after the restart %q, before %q", epoch, old)
	}
	sc := openSSE(t, c, "s", map[string]string{"Last-Event-ID": "10", "Event-Epoch": old}, "")
	if sc.Epoch != epoch {
		t.Fatalf("Event-Epoch %q, want %q", sc.Epoch, epoch)
	}
	rs := sc.Next(wait)
	if rs.Event != eventbus.TypeStateResyncRequired || rs.Str(t, "data", "reason") != "epoch_reset" ||
		rs.Str(t, "data", "detail") != "epoch_mismatch" || rs.Num(t, "data", "lastDeliveredId") != 10 ||
		rs.Num(t, "data", "earliestAvailableId") != 1 || rs.Str(t, "data", "epoch") != epoch {
		t.Fatalf("want epoch_reset (epoch_mismatch) 10 -> 1, got %+v", rs)
	}
	wantIDs(t, sc.Events(3, wait), 1, 3)
	if rc := sc.Next(wait); rc.Event != eventbus.TypeReplayComplete || rc.Num(t, "data", "replayedCount") != 3 {
		t.Fatalf("want replay_complete of 3, got %+v", rc)
	}
	// Without an epoch, the cursor above the last id is the reset (A makes
	// a new mirror of the new epoch).
	s2 := openSSE(t, a, "s", map[string]string{"Last-Event-ID": "10"}, "")
	rs = s2.Next(wait)
	if rs.Str(t, "data", "reason") != "epoch_reset" || rs.Str(t, "data", "detail") != "" {
		t.Fatalf("want numeric epoch_reset, got %+v", rs)
	}
	wantIDs(t, s2.Events(3, wait), 1, 3)
}

// Redis down (refusing connections, or hung): Publish fails within its
// timeout and never hangs; afterwards it works again.
func TestRedisDownPublishFails(t *testing.T) {
	r := startRedis(t)
	opts := testOptions(t)
	opts.PublishTimeout = 300 * time.Millisecond
	a := newReplica(t, r, "A", opts)
	a.publish(t, "s", "e", nil)

	check := func(what string) {
		t.Helper()
		for range 3 {
			start := time.Now()
			_, _, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
			took := time.Since(start)
			if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("%s: Publish returned %v, want ErrUnavailable", what, err)
			}
			if took > opts.PublishTimeout+200*time.Millisecond {
				t.Fatalf("%s: Publish took %v, timeout %v", what, took, opts.PublishTimeout)
			}
		}
	}
	r.pause()
	check("hung redis")
	r.resume()
	waitFor(t, wait, "publish after resume", func() bool {
		_, _, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		return err == nil
	})
	r.stop()
	check("stopped redis")
	// The HTTP route answers 503 with Retry-After when it cannot open a
	// session (the Handler's Lookup returns an eventbus.StatusError).
	resp, err := a.srv.Client().Get(a.srv.URL + "/session/other/events")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" || !strings.Contains(string(body), `"code":"unavailable"`) {
		t.Fatalf("GET with redis down: %s %v %s", resp.Status, resp.Header, body)
	}
}

// Readers reconnect after their connections die and go on from their last
// id: nothing is lost, and nobody is told to resync.
func TestReaderReconnects(t *testing.T) {
	r := startRedis(t)
	a, b, _ := threeReplicas(t, r, testOptions(t))
	sa := openSSE(t, a, "s", nil, "")
	for range 5 {
		b.publish(t, "s", "e", nil)
	}
	wantIDs(t, sa.Events(5, wait), 1, 5)
	r.do(t, "CLIENT", "KILL", "TYPE", "normal")
	for i := range 5 {
		waitFor(t, wait, "publish after CLIENT KILL", func() bool {
			id, _, err := b.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
			if err == nil && id != uint64(6+i) {
				t.Fatalf("id %d, want %d", id, 6+i)
			}
			return err == nil
		})
	}
	wantIDs(t, sa.Events(5, wait), 6, 10)
	// A hung Redis for a while: the reader's XREAD times out and retries.
	r.pause()
	time.Sleep(300 * time.Millisecond)
	r.resume()
	for range 5 {
		waitFor(t, wait, "publish after pause", func() bool {
			_, _, err := b.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
			return err == nil
		})
	}
	wantIDs(t, sa.Events(5, wait), 11, 15)
	sa.Quiet(50 * time.Millisecond)
}

// gate pauses a backplane's readers: while closed, a reader waits before
// its next XREAD. parked reports readers waiting.
type gate struct {
	mu     sync.Mutex
	ch     chan struct{} // nil: open
	parked chan string
}

func installGate(bp *Backplane) *gate {
	g := &gate{parked: make(chan string, 16)}
	hook := func(ctx context.Context, session string) {
		g.mu.Lock()
		ch := g.ch
		g.mu.Unlock()
		if ch == nil {
			return
		}
		select {
		case g.parked <- session:
		default:
		}
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
	bp.readHook.Store(&hook)
	return g
}

func (g *gate) close(t testing.TB) {
	g.mu.Lock()
	g.ch = make(chan struct{})
	g.mu.Unlock()
	select {
	case <-g.parked:
	case <-time.After(wait):
		t.Fatal("reader did not park")
	}
}

func (g *gate) open() {
	g.mu.Lock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
	g.mu.Unlock()
}

// A reader that was away while the stream was trimmed past its last id
// tells its subscribers (ring_evicted) and goes on.
func TestReaderGapResync(t *testing.T) {
	r := startRedis(t)
	opts := testOptions(t)
	opts.RingSize = 10
	a, b, _ := threeReplicas(t, r, opts)
	g := installGate(a.bp)
	sa := openSSE(t, a, "s", nil, "")
	for range 3 {
		b.publish(t, "s", "e", nil)
	}
	wantIDs(t, sa.Events(3, wait), 1, 3)
	g.close(t)
	for range 30 {
		b.publish(t, "s", "e", nil)
	}
	g.open()
	rs := sa.Next(wait)
	if rs.Event != eventbus.TypeStateResyncRequired || rs.Str(t, "data", "reason") != "ring_evicted" ||
		rs.Num(t, "data", "lastDeliveredId") != 3 || rs.Num(t, "data", "earliestAvailableId") != 24 {
		t.Fatalf("want ring_evicted 3 -> 24, got %+v", rs)
	}
	wantIDs(t, sa.Events(10, wait), 24, 33)
}

// A client that read id n through A resumes on C before C's reader has
// seen n: C waits for its reader instead of answering epoch_reset.
func TestResumeOnALaggingReplica(t *testing.T) {
	r := startRedis(t)
	a, _, c := threeReplicas(t, r, testOptions(t))
	g := installGate(c.bp)
	live := openSSE(t, c, "s", nil, "") // C's mirror exists
	g.close(t)
	sa := openSSE(t, a, "s", nil, "")
	for range 10 {
		a.publish(t, "s", "e", nil)
	}
	wantIDs(t, sa.Events(10, wait), 1, 10)
	go func() {
		time.Sleep(200 * time.Millisecond)
		g.open()
	}()
	sc := openSSE(t, c, "s", map[string]string{"Last-Event-ID": "10", "Event-Epoch": sa.Epoch}, "")
	if rc := sc.Next(wait); rc.Event != eventbus.TypeReplayComplete || rc.Num(t, "data", "replayedCount") != 0 {
		t.Fatalf("want an empty replay_complete, got %+v", rc)
	}
	wantIDs(t, live.Events(10, wait), 1, 10)
	a.publish(t, "s", "e", nil)
	wantIDs(t, sc.Events(1, wait), 11, 11)
}

// Sessions without local subscribers are released after IdleTimeout, with
// their reader; the next lookup makes a new mirror of the same epoch.
func TestIdleRelease(t *testing.T) {
	r := startRedis(t)
	opts := testOptions(t)
	opts.IdleTimeout = 100 * time.Millisecond
	a, s := liveReplica(t, r, opts)
	time.Sleep(300 * time.Millisecond)
	if n := a.bp.Sessions(); n != 1 {
		t.Fatalf("a session with a subscriber was released (%d)", n)
	}
	s.Close()
	waitFor(t, wait, "idle release", func() bool { return a.bp.Sessions() == 0 })
	s2 := openSSE(t, a, "s", map[string]string{"Last-Event-ID": "0", "Event-Epoch": s.Epoch}, "")
	wantIDs(t, s2.Events(1, wait), 1, 1)
}

// Delete forgets the session in Redis; every replica's mirror closes; the
// next publish starts a new epoch at id 1.
func TestDelete(t *testing.T) {
	r := startRedis(t)
	a, _, c := threeReplicas(t, r, testOptions(t))
	sa, sc := openSSE(t, a, "s", nil, ""), openSSE(t, c, "s", nil, "")
	a.publish(t, "s", "e", nil)
	wantIDs(t, sa.Events(1, wait), 1, 1)
	wantIDs(t, sc.Events(1, wait), 1, 1)
	if err := a.bp.Delete(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	sa.Ended(wait)
	sc.Ended(wait)
	id, epoch, err := c.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
	if err != nil || id != 1 || epoch == sa.Epoch {
		t.Fatalf("publish after delete: id %d epoch %q err %v (old epoch %q)", id, epoch, err, sa.Epoch)
	}
}

// Invalid and oversized events use no id, whether the local encoder or
// the script (which knows the id's digits) refuses them.
func TestPublishValidation(t *testing.T) {
	r := startRedis(t)
	opts := testOptions(t)
	opts.Bus.MaxEventBytes = 200
	a := newReplica(t, r, "A", opts)
	ctx := context.Background()
	if _, _, err := a.bp.Publish(ctx, "s", eventbus.Event{Type: ""}); !errors.Is(err, eventbus.ErrInvalidEvent) {
		t.Fatalf("empty type: %v", err)
	}
	if _, _, err := a.bp.Publish(ctx, "s", eventbus.Event{Type: "e", Data: func() {}}); !errors.Is(err, eventbus.ErrInvalidEvent) {
		t.Fatalf("func data: %v", err)
	}
	if _, _, err := a.bp.Publish(ctx, "", eventbus.Event{Type: "e"}); !errors.Is(err, ErrInvalidSession) {
		t.Fatalf("empty session: %v", err)
	}
	ts := map[string]any{"serverTimestamp": 1}
	for range 9 {
		if _, _, err := a.bp.Publish(ctx, "s", eventbus.Event{Type: "e", Meta: ts}); err != nil {
			t.Fatal(err)
		}
	}
	// An event that fits with a one-digit id but not with id 10.
	enc, err := a.bp.encoder.Encode(eventbus.Event{Type: "e", Data: "", Meta: ts})
	if err != nil {
		t.Fatal(err)
	}
	pad := 200 - len(enc.Envelope(1))
	ev := eventbus.Event{Type: "e", Data: strings.Repeat("p", pad), Meta: ts}
	enc, _ = a.bp.encoder.Encode(ev)
	if n := len(enc.Envelope(1)); n != 200 {
		t.Fatalf("crafted envelope of %d bytes", n)
	}
	if _, _, err := a.bp.Publish(ctx, "s", ev); !errors.Is(err, eventbus.ErrEventTooLarge) {
		t.Fatalf("event of 201 bytes with id 10: %v", err)
	}
	id, _, err := a.bp.Publish(ctx, "s", eventbus.Event{Type: "e"})
	if err != nil || id != 10 {
		t.Fatalf("next publish: id %d, %v; want 10", id, err)
	}
}

// The envelope a subscriber receives is what a plain bus would publish,
// with the log's id.
func TestEnvelope(t *testing.T) {
	r := startRedis(t)
	a := newReplica(t, r, "A", testOptions(t))
	s := openSSE(t, a, "s", nil, "")
	ctx := context.Background()
	ev := eventbus.Event{Type: "t\u2028x", Data: map[string]any{"k": "v\n"}, Meta: map[string]any{"serverTimestamp": 7, "m": 1}, OriginatorClientID: "c1"}
	if _, _, err := a.bp.Publish(ctx, "s", ev); err != nil {
		t.Fatal(err)
	}
	f := s.Next(wait)
	plain, _ := eventbus.New(eventbus.Options{})
	defer plain.Close()
	want, err := plain.Publish(ev)
	if err != nil {
		t.Fatal(err)
	}
	if f.ID != 1 || f.Event != ev.Type || f.Data != string(want.JSON()) {
		t.Fatalf("got %+v, want %s", f, want.JSON())
	}
	var env map[string]any
	json.Unmarshal([]byte(f.Data), &env)
	if fmt.Sprint(env["id"]) != "1" {
		t.Fatalf("envelope id %v", env["id"])
	}
}

// A's mirror is of a lost stream its reader has not noticed yet: a client
// presenting the newer epoch gets a new mirror (no epoch_reset), and the
// stale mirror's streams end.
func TestStaleMirrorReplacedForNewerEpoch(t *testing.T) {
	r := startRedis(t)
	a, _, c := threeReplicas(t, r, testOptions(t))
	g := installGate(a.bp)
	defer g.open()
	sa := openSSE(t, a, "s", nil, "")
	for range 3 {
		c.publish(t, "s", "e", nil)
	}
	wantIDs(t, sa.Events(3, wait), 1, 3)
	g.close(t) // A's reader will not notice the restart
	r.restart()
	var epoch string
	for range 2 {
		waitFor(t, wait, "publish after restart", func() bool {
			var err error
			_, epoch, err = c.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
			return err == nil
		})
	}
	s2 := openSSE(t, a, "s", map[string]string{"Last-Event-ID": "0", "Event-Epoch": epoch}, "")
	if s2.Epoch != epoch {
		t.Fatalf("Event-Epoch %q, want the new %q", s2.Epoch, epoch)
	}
	wantIDs(t, s2.Events(2, wait), 1, 2)
	if rc := s2.Next(wait); rc.Event != eventbus.TypeReplayComplete {
		t.Fatalf("want replay_complete, got %+v", rc)
	}
	sa.Ended(wait)
}

// A publish through a replica whose mirror is of a lost stream releases
// that mirror at once.
func TestPublishReleasesStaleMirror(t *testing.T) {
	r := startRedis(t)
	a := newReplica(t, r, "A", testOptions(t))
	g := installGate(a.bp)
	defer g.open()
	sa := openSSE(t, a, "s", nil, "")
	a.publish(t, "s", "e", nil)
	wantIDs(t, sa.Events(1, wait), 1, 1)
	g.close(t)
	r.restart()
	waitFor(t, wait, "publish after restart", func() bool {
		_, _, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		return err == nil
	})
	sa.Ended(wait)
}

// A resume on a replica whose mirror is of a lost stream (Redis restarted
// and this replica's reader has not noticed): the stream's open checks the
// epoch with Redis, so the client gets epoch_reset on the new epoch at once,
// and the stale mirror's streams end without waiting for the reader.
func TestResumeOfALostEpoch(t *testing.T) {
	r := startRedis(t)
	a, _, c := threeReplicas(t, r, testOptions(t))
	live := backplanetest.LateMirror(t, a.shared, c.shared) // C's ring starts at 11
	g := installGate(c.bp)
	defer g.open()
	g.close(t)
	r.restart()
	sc := openSSE(t, c, "s", map[string]string{"Last-Event-ID": "5", "Event-Epoch": live.Epoch}, "")
	if sc.Epoch == live.Epoch || len(sc.Epoch) != 32 {
		t.Fatalf("Event-Epoch %q after the restart, before %q", sc.Epoch, live.Epoch)
	}
	rs := sc.Next(wait)
	if rs.Event != eventbus.TypeStateResyncRequired || rs.Str(t, "data", "reason") != "epoch_reset" ||
		rs.Str(t, "data", "detail") != "epoch_mismatch" || rs.Num(t, "data", "lastDeliveredId") != 5 ||
		rs.Num(t, "data", "earliestAvailableId") != 1 {
		t.Fatalf("want epoch_reset (epoch_mismatch) 5 -> 1, got %+v", rs)
	}
	if rc := sc.Next(wait); rc.Event != eventbus.TypeReplayComplete || rc.Num(t, "data", "replayedCount") != 0 {
		t.Fatalf("want an empty replay_complete, got %+v", rc)
	}
	live.Ended(wait) // before the gate opens
}

// A resume whose history read fails (Redis answers XRANGE with an error;
// here the stream key holds a string): the client is told what it missed
// cannot be read, then gets the live events.
func TestResumeHistoryUnavailable(t *testing.T) {
	r := startRedis(t)
	a, _, c := threeReplicas(t, r, testOptions(t))
	live := backplanetest.LateMirror(t, a.shared, c.shared) // C's ring starts at 11
	g := installGate(c.bp)
	defer g.open()
	g.close(t)
	r.do(t, "SET", "t:"+t.Name()+":{s}:s:"+live.Epoch, "not a stream")
	sc := openSSE(t, c, "s", map[string]string{"Last-Event-ID": "5", "Event-Epoch": live.Epoch}, "")
	rs := sc.Next(wait)
	if rs.Event != eventbus.TypeStateResyncRequired || rs.Str(t, "data", "reason") != "ring_evicted" ||
		rs.Str(t, "data", "detail") != "history_unavailable" || rs.Num(t, "data", "lastDeliveredId") != 5 ||
		rs.Num(t, "data", "earliestAvailableId") != 21 {
		t.Fatalf("want ring_evicted (history_unavailable) 5 -> 21, got %+v", rs)
	}
	if rc := sc.Next(wait); rc.Event != eventbus.TypeReplayComplete || rc.Num(t, "data", "replayedCount") != 0 {
		t.Fatalf("want an empty replay_complete, got %+v", rc)
	}
}

// TestBackplane runs the tests every backplane must pass
// (internal/backplanetest.Run): Close, resuming on another replica and
// behind a late mirror and while publishing, local eviction, the replay
// budget, signals.
func TestBackplane(t *testing.T) { backplanetest.Run(t, cluster) }
