package redisbus

import (
	"context"
	"errors"
	"fmt"
	"net"
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
