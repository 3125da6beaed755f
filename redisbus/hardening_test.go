package redisbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ssebus/eventbus"
)

// The tests of the three hardening points of issue 14: a retried publish
// appends at most once, a new stream never joins a dead epoch, and a Redis
// outage past its bound ends the streams with a terminal frame.

// streamLen is the number of entries session's stream of epoch holds.
func streamLen(t *testing.T, r *redisServer, session, epoch string) int64 {
	t.Helper()
	n, _ := r.do(t, "XLEN", "t:"+t.Name()+":{"+session+"}:s:"+epoch).(int64)
	return n
}

// A publish that times out on a hung Redis is applied when Redis comes
// back; the retry with the same key returns its id as a duplicate, and the
// stream holds the event once.
func TestIdempotentRetryAfterTimeout(t *testing.T) {
	r := startRedis(t)
	opts := testOptions(t)
	opts.PublishTimeout = 300 * time.Millisecond
	a, b := newReplica(t, r, "A", opts), newReplica(t, r, "B", opts)
	sb := openSSE(t, b, "s", nil, "")
	for range 3 {
		a.publish(t, "s", "e", nil)
	}
	wantIDs(t, sb.Events(3, wait), 1, 3)
	ctx := context.Background()
	ev := eventbus.Event{Type: "order.placed", Data: map[string]any{"n": 1, "sku": "x"}, OriginatorClientID: "c1"}

	r.pause()
	start := time.Now()
	_, _, dup, err := a.bp.PublishIdempotent(ctx, "s", "order-42", ev)
	took := time.Since(start)
	r.resume()
	if !errors.Is(err, ErrOutcomeUnknown) || !errors.Is(err, ErrUnavailable) || dup {
		t.Fatalf("publish to a hung Redis: dup %v, err %v; want ErrOutcomeUnknown (and ErrUnavailable)", dup, err)
	}
	if took > opts.PublishTimeout+200*time.Millisecond {
		t.Fatalf("publish took %v, timeout %v", took, opts.PublishTimeout)
	}
	// Redis runs the script it had received once it runs again.
	waitFor(t, wait, "the timed-out publish to be applied", func() bool {
		in, err := a.bp.Info(ctx, "s")
		return err == nil && in.LastEventID == 4
	})
	// The retry: the same event, stamped later, its data spaced otherwise
	// (the identity is the encoding: spacing does not count, member order
	// does).
	retry := ev
	retry.Data = json.RawMessage(`{ "n": 1, "sku": "x" }`)
	var id uint64
	var epoch string
	waitFor(t, wait, "the retry", func() bool {
		id, epoch, dup, err = a.bp.PublishIdempotent(ctx, "s", "order-42", retry)
		return err == nil
	})
	if id != 4 || !dup || epoch != sb.Epoch {
		t.Fatalf("retry: id %d dup %v epoch %s; want id 4, a duplicate of epoch %s", id, dup, epoch, sb.Epoch)
	}
	// Through another replica too.
	if id, _, dup, err = b.bp.PublishIdempotent(ctx, "s", "order-42", ev); err != nil || id != 4 || !dup {
		t.Fatalf("retry on B: id %d dup %v err %v", id, dup, err)
	}
	if next := a.publish(t, "s", "e", nil); next != 5 {
		t.Fatalf("next publish has id %d, want 5", next)
	}
	got := sb.Events(2, wait)
	wantIDs(t, got, 4, 5)
	if got[0].Event != "order.placed" {
		t.Fatalf("id 4 is %+v", got[0])
	}
	sb.Quiet(50 * time.Millisecond)
	if n := streamLen(t, r, "s", epoch); n != 5 {
		t.Fatalf("the stream holds %d entries, want 5", n)
	}
}

// A connection that breaks after the script was written: go-redis would
// send it again on a new connection (and append twice); the backplane sends
// it once and reports the outcome unknown. The keyed retry then finds it.
func TestPublishScriptSentOnce(t *testing.T) {
	r := startRedis(t)
	p := startCutProxy(t, r.Addr)
	opts := testOptions(t)
	bp, err := New(testClient(t, p.Addr), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bp.Close() })
	ctx := context.Background()
	if _, _, err := bp.Publish(ctx, "s", eventbus.Event{Type: "e"}); err != nil { // loads the script
		t.Fatal(err)
	}
	p.cutting.Store(true)
	_, _, err = bp.Publish(ctx, "s", eventbus.Event{Type: "e"})
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("publish whose reply was lost: %v, want ErrOutcomeUnknown", err)
	}
	_, _, _, err = bp.PublishIdempotent(ctx, "s", "k", eventbus.Event{Type: "e", Data: 3})
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("keyed publish whose reply was lost: %v, want ErrOutcomeUnknown", err)
	}
	p.cutting.Store(false)
	if n := p.cuts.Load(); n != 2 {
		t.Fatalf("%d replies cut, want 2 (one per publish: nothing was sent again)", n)
	}
	id, epoch, dup, err := bp.PublishIdempotent(ctx, "s", "k", eventbus.Event{Type: "e", Data: 3})
	if err != nil || id != 3 || !dup {
		t.Fatalf("keyed retry: id %d dup %v err %v; want id 3, a duplicate", id, dup, err)
	}
	if n := streamLen(t, r, "s", epoch); n != 3 {
		t.Fatalf("the stream holds %d entries, want 3", n)
	}
}

// A publish that cannot reach Redis at all was not sent: ErrUnavailable,
// not ErrOutcomeUnknown.
func TestPublishUnavailableNotSent(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	opts := testOptions(t)
	opts.PublishTimeout = 500 * time.Millisecond
	bp, err := New(testClient(t, addr), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bp.Close() })
	for range 3 {
		_, _, _, err := bp.PublishIdempotent(context.Background(), "s", "k", eventbus.Event{Type: "e"})
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("publish with nothing listening: %v; want ErrUnavailable without ErrOutcomeUnknown", err)
		}
	}
}

// The same key with another event is refused, and appends nothing; what
// counts as the same event.
func TestIdempotencyKeyReused(t *testing.T) {
	r := startRedis(t)
	a := newReplica(t, r, "A", testOptions(t))
	ctx := context.Background()
	ev := eventbus.Event{Type: "e", Data: map[string]int{"n": 1}, OriginatorClientID: "c1", Meta: map[string]any{"trace": "t1"}}
	id, epoch, dup, err := a.bp.PublishIdempotent(ctx, "s", "k", ev)
	if err != nil || id != 1 || dup {
		t.Fatalf("first publish: id %d dup %v err %v", id, dup, err)
	}
	for name, other := range map[string]eventbus.Event{
		"type":       {Type: "f", Data: ev.Data, OriginatorClientID: "c1", Meta: ev.Meta},
		"data":       {Type: "e", Data: map[string]int{"n": 2}, OriginatorClientID: "c1", Meta: ev.Meta},
		"no data":    {Type: "e", OriginatorClientID: "c1", Meta: ev.Meta},
		"originator": {Type: "e", Data: ev.Data, OriginatorClientID: "c2", Meta: ev.Meta},
		"meta":       {Type: "e", Data: ev.Data, OriginatorClientID: "c1", Meta: map[string]any{"trace": "t2"}},
	} {
		_, _, _, err := a.bp.PublishIdempotent(ctx, "s", "k", other)
		if !errors.Is(err, eventbus.ErrIdempotencyKeyReused) {
			t.Fatalf("same key, other %s: %v, want ErrIdempotencyKeyReused", name, err)
		}
	}
	// The stamp is not the event's identity, whoever sets it.
	stamped := ev
	stamped.Meta = map[string]any{"trace": "t1", "serverTimestamp": 12345}
	if id, _, dup, err := a.bp.PublishIdempotent(ctx, "s", "k", stamped); err != nil || id != 1 || !dup {
		t.Fatalf("same event with its own serverTimestamp: id %d dup %v err %v", id, dup, err)
	}
	if n := streamLen(t, r, "s", epoch); n != 1 {
		t.Fatalf("the stream holds %d entries, want 1", n)
	}
	// Keys are per session, and a plain Publish does not see them.
	if id, _, dup, err := a.bp.PublishIdempotent(ctx, "s2", "k", eventbus.Event{Type: "x"}); err != nil || id != 1 || dup {
		t.Fatalf("the key in another session: id %d dup %v err %v", id, dup, err)
	}
	if id := a.publish(t, "s", "e", nil); id != 2 {
		t.Fatalf("plain publish: id %d, want 2", id)
	}
}

func TestInvalidIdempotencyKey(t *testing.T) {
	r := startRedis(t)
	a := newReplica(t, r, "A", testOptions(t))
	ctx := context.Background()
	for _, k := range []string{"", strings.Repeat("k", 256), "a\nb", "tab\t", "caf\u00e9", "\x7f"} {
		if _, _, _, err := a.bp.PublishIdempotent(ctx, "s", k, eventbus.Event{Type: "e"}); !errors.Is(err, eventbus.ErrInvalidIdempotencyKey) {
			t.Fatalf("key %q: %v, want ErrInvalidIdempotencyKey", k, err)
		}
	}
	for i, k := range []string{strings.Repeat("k", 255), " spaced key ~!", "550e8400-e29b-41d4-a716-446655440000"} {
		if id, _, dup, err := a.bp.PublishIdempotent(ctx, "s", k, eventbus.Event{Type: "e"}); err != nil || id != uint64(i+1) || dup {
			t.Fatalf("key %q: id %d dup %v err %v", k, id, dup, err)
		}
	}
	if in, _ := a.bp.Info(ctx, "s"); in.LastEventID != 3 {
		t.Fatalf("invalid keys appended: last id %d, want 3", in.LastEventID)
	}
}

// After the window a key is forgotten: the same publish appends again.
// Expired records are removed by later keyed publishes (64 at most each),
// and the records' keys expire at most a second after the window.
func TestIdempotencyWindowExpires(t *testing.T) {
	r := startRedis(t)
	opts := testOptions(t)
	opts.IdempotencyWindow = 600 * time.Millisecond
	a := newReplica(t, r, "A", opts)
	ctx := context.Background()
	ev := eventbus.Event{Type: "e", Data: 1}
	publish := func(key string) (uint64, bool) {
		t.Helper()
		id, _, dup, err := a.bp.PublishIdempotent(ctx, "s", key, ev)
		if err != nil {
			t.Fatal(err)
		}
		return id, dup
	}
	if id, dup := publish("k"); id != 1 || dup {
		t.Fatalf("first: %d %v", id, dup)
	}
	if id, dup := publish("k"); id != 1 || !dup {
		t.Fatalf("within the window: %d %v", id, dup)
	}
	for i := range 99 {
		publish(fmt.Sprintf("other-%d", i))
	}
	in, _ := a.bp.Info(ctx, "s")
	ik := "t:" + t.Name() + ":{s}:i:" + in.Epoch
	if n := r.do(t, "HLEN", ik); n != int64(100) {
		t.Fatalf("%v records, want 100", n)
	}
	// The records' keys expire at most a second after their last record.
	for _, k := range []string{ik, "t:" + t.Name() + ":{s}:x:" + in.Epoch} {
		if ttl, _ := r.do(t, "PTTL", k).(int64); ttl <= 0 || ttl > 600+1000 {
			t.Fatalf("PTTL of %s: %d ms, want within the window of 600 ms and a second", k, ttl)
		}
	}
	time.Sleep(350 * time.Millisecond)
	late, _ := publish("late")
	time.Sleep(300 * time.Millisecond) // the first 100 have expired, "late" has not
	if id, dup := publish("k"); id != late+1 || dup {
		t.Fatalf("after the window: id %d dup %v, want a new event %d", id, dup, late+1)
	}
	if id, dup := publish("late"); id != late || !dup {
		t.Fatalf("within its window: %d %v, want a duplicate of %d", id, dup, late)
	}
	// The publish of k forgot the 64 oldest expired records (k's among
	// them) and recorded k again: 101 - 64 + 1.
	if n := r.do(t, "HLEN", ik); n != int64(38) {
		t.Fatalf("%v records after one keyed publish, want 38", n)
	}
	time.Sleep(1700 * time.Millisecond)
	if n := r.do(t, "EXISTS", ik, "t:"+t.Name()+":{s}:x:"+in.Epoch); n != int64(0) {
		t.Fatalf("%v record keys remain a second after the window", n)
	}
}

// Delete removes the keys' records; the next publish with a key is new,
// in a new epoch.
func TestDeleteForgetsIdempotencyKeys(t *testing.T) {
	r := startRedis(t)
	a := newReplica(t, r, "A", testOptions(t))
	ctx := context.Background()
	_, epoch, _, err := a.bp.PublishIdempotent(ctx, "s", "k", eventbus.Event{Type: "e"})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.bp.Delete(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	base := "t:" + t.Name() + ":{s}:"
	if n := r.do(t, "EXISTS", base+"i:"+epoch, base+"x:"+epoch, base+"m", base+"s:"+epoch); n != int64(0) {
		t.Fatalf("%v keys of the session remain after Delete", n)
	}
	id, epoch2, dup, err := a.bp.PublishIdempotent(ctx, "s", "k", eventbus.Event{Type: "e"})
	if err != nil || id != 1 || dup || epoch2 == epoch {
		t.Fatalf("after Delete: id %d dup %v epoch %s (old %s) err %v", id, dup, epoch2, epoch, err)
	}
}

// A DELETE on A, then at once a new live stream on B (whose reader has not
// noticed the delete): the stream is of the new epoch and gets its events;
// B's stream of the dead epoch ends.
func TestDeleteThenNewStreamOnAnotherReplica(t *testing.T) {
	r := startRedis(t)
	a, b := newReplica(t, r, "A", testOptions(t)), newReplica(t, r, "B", testOptions(t))
	old := openSSE(t, b, "s", nil, "")
	a.publish(t, "s", "e", nil)
	wantIDs(t, old.Events(1, wait), 1, 1)
	g := installGate(b.bp)
	defer g.open()
	g.close(t) // B's reader will not notice the delete
	if err := a.bp.Delete(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	fresh := openSSE(t, b, "s", nil, "")
	if fresh.Epoch == old.Epoch || len(fresh.Epoch) != 32 {
		t.Fatalf("new stream on B has epoch %q, the deleted one was %q", fresh.Epoch, old.Epoch)
	}
	old.Ended(wait) // without its reader: the new stream released the mirror
	g.open()
	id, epoch, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
	if err != nil || id != 1 || epoch != fresh.Epoch {
		t.Fatalf("publish on A after the delete: id %d epoch %s err %v; want 1 in %s", id, epoch, err, fresh.Epoch)
	}
	wantIDs(t, fresh.Events(1, wait), 1, 1)

	// In-process subscribers too.
	g.close(t)
	if err := a.bp.Delete(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	sub, err := b.bp.Subscribe(context.Background(), "s", eventbus.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	g.open()
	fresh.Ended(wait)
	// The dead epoch's mirror would never see the new stream's id 1.
	if id := a.publish(t, "s", "e", nil); id != 1 {
		t.Fatalf("publish after the second delete: id %d", id)
	}
	select {
	case <-sub.Ready():
	case <-time.After(wait):
		t.Fatal("the in-process subscription got nothing of the new epoch")
	}
	if got, _ := sub.AppendReady(nil); len(got) != 1 || got[0].ID() != 1 {
		t.Fatalf("in-process subscription got %v, want id 1", got)
	}
}

// Redis hung past OutageTimeout: every open stream ends with a terminal
// stream_error "unavailable", the session is released, new streams are
// refused while Redis is down, and a client reconnecting afterwards
// resumes from its cursor without a loss.
func TestOutageEndsStreams(t *testing.T) {
	r := startRedis(t)
	opts := testOptions(t)
	opts.OutageTimeout = 500 * time.Millisecond
	opts.PublishTimeout = 300 * time.Millisecond
	a, b := newReplica(t, r, "A", opts), newReplica(t, r, "B", opts)
	sa, sb := openSSE(t, a, "s", nil, ""), openSSE(t, b, "s", nil, "")
	sub, err := a.bp.Subscribe(context.Background(), "s", eventbus.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for range 3 {
		a.publish(t, "s", "e", nil)
	}
	wantIDs(t, sa.Events(3, wait), 1, 3)
	wantIDs(t, sb.Events(3, wait), 1, 3)

	r.pause()
	defer r.resume()
	start := time.Now()
	sa.EndedUnavailable(wait)
	sb.EndedUnavailable(wait)
	// The bound counts from the reader's last answer (at most a ReadBlock
	// before the pause), and is kept within one short call.
	if took := time.Since(start); took > opts.OutageTimeout+time.Second {
		t.Fatalf("streams ended %v after the pause, OutageTimeout %v", took, opts.OutageTimeout)
	}
	var n int
	for range sub.Events() {
		n++
	}
	if !errors.Is(sub.Err(), eventbus.ErrClosed) || !strings.Contains(sub.Err().Error(), "unavailable") {
		t.Fatalf("in-process subscription ended with %v", sub.Err())
	}
	if a.bp.Sessions() != 0 || b.bp.Sessions() != 0 {
		t.Fatalf("sessions still held: A %d, B %d", a.bp.Sessions(), b.bp.Sessions())
	}
	// New streams while Redis is down: 503 with Retry-After, in-process an
	// ErrUnavailable.
	resp, err := a.srv.Client().Get(a.srv.URL + "/session/s/events")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("new stream while Redis is down: %s %v", resp.Status, resp.Header)
	}
	if _, err := a.bp.Subscribe(context.Background(), "s", eventbus.SubscribeOptions{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Subscribe while Redis is down: %v", err)
	}

	r.resume()
	waitFor(t, wait, "publish after the outage", func() bool {
		_, _, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		return err == nil
	})
	again := openSSE(t, b, "s", map[string]string{"Last-Event-ID": "3", "Event-Epoch": sa.Epoch}, "")
	wantIDs(t, again.Events(1, wait), 4, 4)
	if rc := again.Next(wait); rc.Event != eventbus.TypeReplayComplete {
		t.Fatalf("want replay_complete, got %+v", rc)
	}
	a.publish(t, "s", "e", nil)
	wantIDs(t, again.Events(1, wait), 5, 5)
}

// Redis refusing connections past OutageTimeout ends streams the same way.
func TestOutageRedisDown(t *testing.T) {
	r := startRedis(t)
	opts := testOptions(t)
	opts.OutageTimeout = 500 * time.Millisecond
	_, sa := liveReplica(t, r, opts)
	r.stop()
	sa.EndedUnavailable(wait)
}

// The outage bound with the demo daemon's -outage-timeout 2s (and its
// other defaults: ReadBlock 1s, PublishTimeout 2s), measured from the
// moment Redis goes away (hung, then stopped) to the stream's terminal
// frame: within a second of OutageTimeout. The bound counts from the
// reader's last answer, which a quiet session's XREAD had at most a
// ReadBlock before.
func TestOutageBound(t *testing.T) {
	opts := testOptions(t)
	opts.ReadBlock = DefaultReadBlock
	opts.PublishTimeout = DefaultPublishTimeout
	opts.OutageTimeout = 2 * time.Second
	for _, how := range []string{"paused", "stopped"} {
		r := startRedis(t)
		_, s := liveReplica(t, r, opts)
		if how == "paused" {
			r.pause()
		} else {
			r.stop()
		}
		gone := time.Now()
		s.EndedUnavailable(opts.OutageTimeout + 5*time.Second)
		took := time.Since(gone)
		t.Logf("Redis %s: the stream's terminal frame came %v later (OutageTimeout %v, ReadBlock %v)",
			how, took.Round(time.Millisecond), opts.OutageTimeout, opts.ReadBlock)
		if took < opts.OutageTimeout-opts.ReadBlock-200*time.Millisecond || took > opts.OutageTimeout+time.Second {
			t.Fatalf("Redis %s: the stream ended %v later, want within a second of OutageTimeout %v", how, took, opts.OutageTimeout)
		}
		if how == "paused" {
			r.resume()
		}
	}
}

// A short blip (shorter than OutageTimeout) ends nothing.
func TestShortOutageEndsNothing(t *testing.T) {
	r := startRedis(t)
	opts := testOptions(t)
	opts.OutageTimeout = 2 * time.Second
	a, sa := liveReplica(t, r, opts)
	r.pause()
	time.Sleep(500 * time.Millisecond)
	r.resume()
	waitFor(t, wait, "publish after the blip", func() bool {
		_, _, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		return err == nil
	})
	wantIDs(t, sa.Events(1, wait), 2, 2)
	if a.bp.Sessions() != 1 {
		t.Fatalf("the session was released by a blip")
	}
}

func TestNewRejectsInvalidOptions(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	for name, o := range map[string]Options{
		"negative window":     {IdempotencyWindow: -1},
		"window below 1ms":    {IdempotencyWindow: time.Microsecond},
		"negative outage":     {OutageTimeout: -1},
		"outage below block":  {OutageTimeout: time.Second, ReadBlock: 2 * time.Second},
		"negative read block": {ReadBlock: -1},
	} {
		if bp, err := New(c, o); !errors.Is(err, eventbus.ErrInvalidOption) {
			if bp != nil {
				bp.Close()
			}
			t.Fatalf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
}
