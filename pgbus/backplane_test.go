package pgbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/internal/backplanetest"
)

// Events published concurrently on all three replicas reach every
// subscriber on every replica, with the same ids, bytes and order: the
// advisory lock makes commit order id order, so no reader ever sees a
// later id committed before an earlier one (a skipped id would show as a
// ring_evicted resync, and a reordering as a wrong id).
func TestThreeReplicasOneOrder(t *testing.T) {
	url, schema := testSchema(t)
	a, b, c := threeReplicas(t, url, testOptions(schema))
	total := backplanetest.ThreeReplicasOneOrder(t, a.shared, b.shared, c.shared)
	if n := queryInt(t, url, "SELECT count(*) FROM "+schema+".events WHERE session = $1", []byte("s1")); n != int64(total) {
		t.Fatalf("table holds %d rows, want %d", n, total)
	}
}

// The count bound trims the table: after it was trimmed past the cursor,
// ring_evicted, then what the table still holds.
func TestResumeAfterTrim(t *testing.T) {
	url, schema := testSchema(t)
	opts := testOptions(schema)
	opts.RingSize = 10
	a, _, c := threeReplicas(t, url, opts)
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
	if n := queryInt(t, url, "SELECT count(*) FROM "+schema+".events WHERE session = $1 AND id BETWEEN 41 AND 50", []byte("s")); n != 10 {
		t.Fatalf("table holds %d of ids 41..50", n)
	}
	if n := queryInt(t, url, "SELECT count(*) FROM "+schema+".events"); n != 10 {
		t.Fatalf("table holds %d rows, want 10", n)
	}
	sc := c.open(t, "s", map[string]string{"Last-Event-ID": "5", "Event-Epoch": epoch}, "")
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
	s2 := c.open(t, "s", map[string]string{"Last-Event-ID": "40", "Event-Epoch": epoch}, "")
	wantIDs(t, s2.Events(10, wait), 41, 50)
}

// The byte bound trims the table too, as tightly as redisbus trims its
// stream, and the byte counter stays exact.
func TestTrimByBytes(t *testing.T) {
	url, schema := testSchema(t)
	opts := testOptions(schema)
	opts.Bus.RingMaxBytes = 1000
	a := newReplica(t, url, "A", opts)
	ts := map[string]any{"serverTimestamp": 1}
	for i := range 40 {
		if _, _, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e", Data: strings.Repeat("x", i*3), Meta: ts}); err != nil {
			t.Fatal(err)
		}
	}
	in, err := a.bp.Info(context.Background(), "s")
	if err != nil {
		t.Fatal(err)
	}
	sum := uint64(queryInt(t, url, "SELECT coalesce(sum(octet_length(envelope)), 0) FROM "+schema+".events WHERE session = $1", []byte("s")))
	rows := uint64(queryInt(t, url, "SELECT count(*) FROM "+schema+".events WHERE session = $1", []byte("s")))
	if in.Bytes != sum || sum > 1000 || in.LastEventID != 40 || in.FirstEventID != 40-rows+1 {
		t.Fatalf("info %+v; table holds %d rows of %d bytes", in, rows, sum)
	}
	// The bound is tight: the newest event the trim dropped would not fit.
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
	if n := queryInt(t, url, "SELECT count(*) FROM "+schema+".events"); n != 1 {
		t.Fatalf("table holds %d rows, want 1", n)
	}
}

// A reader that was away while the table was trimmed past its last id
// tells its subscribers (ring_evicted) and goes on.
func TestReaderGapResync(t *testing.T) {
	url, schema := testSchema(t)
	opts := testOptions(schema)
	opts.RingSize = 10
	a, b, _ := threeReplicas(t, url, opts)
	g := installGate(a.bp)
	defer g.open()
	sa := a.open(t, "s", nil, "")
	for range 3 {
		b.publish(t, "s", "e", nil)
	}
	wantIDs(t, sa.Events(3, wait), 1, 3)
	g.close(t, a.bp, "s")
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
// fed n: C waits for its reader instead of answering epoch_reset.
func TestResumeOnALaggingReplica(t *testing.T) {
	url, schema := testSchema(t)
	a, _, c := threeReplicas(t, url, testOptions(schema))
	g := installGate(c.bp)
	defer g.open()
	live := c.open(t, "s", nil, "") // C's mirror exists
	g.close(t, c.bp, "s")
	sa := a.open(t, "s", nil, "")
	for range 10 {
		a.publish(t, "s", "e", nil)
	}
	wantIDs(t, sa.Events(10, wait), 1, 10)
	go func() {
		time.Sleep(200 * time.Millisecond)
		g.open()
	}()
	sc := c.open(t, "s", map[string]string{"Last-Event-ID": "10", "Event-Epoch": sa.Epoch}, "")
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
	url, schema := testSchema(t)
	opts := testOptions(schema)
	opts.IdleTimeout = 100 * time.Millisecond
	a := newReplica(t, url, "A", opts)
	s := a.open(t, "s", nil, "")
	a.publish(t, "s", "e", nil)
	wantIDs(t, s.Events(1, wait), 1, 1)
	time.Sleep(300 * time.Millisecond)
	if n := a.bp.Sessions(); n != 1 {
		t.Fatalf("a session with a subscriber was released (%d)", n)
	}
	s.Close()
	waitFor(t, wait, "idle release", func() bool { return a.bp.Sessions() == 0 })
	s2 := a.open(t, "s", map[string]string{"Last-Event-ID": "0", "Event-Epoch": s.Epoch}, "")
	wantIDs(t, s2.Events(1, wait), 1, 1)
}

// Delete forgets the session; every replica's mirror closes at once (the
// listener hears of it); the next publish starts a new epoch at id 1.
func TestDelete(t *testing.T) {
	url, schema := testSchema(t)
	a, _, c := threeReplicas(t, url, testOptions(schema))
	sa, sc := a.open(t, "s", nil, ""), c.open(t, "s", nil, "")
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
	if n := queryInt(t, url, "SELECT count(*) FROM "+schema+".events"); n != 1 {
		t.Fatalf("table holds %d rows after delete and one publish", n)
	}
	if err := a.bp.Delete(context.Background(), "unknown"); err != nil {
		t.Fatalf("delete of an unknown session: %v", err)
	}
}

// DELETE on A, then at once a new stream on B, whose listener has not
// passed the news to its mirror (its reader is held): the stream joins the
// new epoch, never the deleted one, and B's old streams end.
func TestDeleteThenNewStreamOnAnotherReplica(t *testing.T) {
	url, schema := testSchema(t)
	a, b, _ := threeReplicas(t, url, testOptions(schema))
	g := installGate(b.bp)
	defer g.open()
	old := b.open(t, "s", nil, "")
	a.publish(t, "s", "e", nil)
	wantIDs(t, old.Events(1, wait), 1, 1)
	g.close(t, b.bp, "s")
	if err := a.bp.Delete(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	sb := b.open(t, "s", map[string]string{"Last-Event-ID": "1", "Event-Epoch": old.Epoch}, "")
	if sb.Epoch == old.Epoch || len(sb.Epoch) != 32 {
		t.Fatalf("new stream on B joined epoch %q (deleted: %q)", sb.Epoch, old.Epoch)
	}
	rs := sb.Next(wait)
	if rs.Event != eventbus.TypeStateResyncRequired || rs.Str(t, "data", "reason") != "epoch_reset" {
		t.Fatalf("want epoch_reset, got %+v", rs)
	}
	old.Ended(wait)
	g.open()
	id, epoch, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
	if err != nil || id != 1 || epoch != sb.Epoch {
		t.Fatalf("publish after delete: id %d epoch %q err %v, want 1 in %q", id, epoch, err, sb.Epoch)
	}
	for f := sb.Next(wait); ; f = sb.Next(wait) {
		if f.ID != 0 {
			if f.ID != 1 {
				t.Fatalf("got id %d, want 1", f.ID)
			}
			break
		}
	}
}

// A publish through a replica whose mirror is of a deleted session (its
// reader has not noticed) releases that mirror at once.
func TestPublishReleasesStaleMirror(t *testing.T) {
	url, schema := testSchema(t)
	a, b, _ := threeReplicas(t, url, testOptions(schema))
	g := installGate(a.bp)
	defer g.open()
	sa := a.open(t, "s", nil, "")
	a.publish(t, "s", "e", nil)
	wantIDs(t, sa.Events(1, wait), 1, 1)
	g.close(t, a.bp, "s")
	if err := b.bp.Delete(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	if id := a.publish(t, "s", "e", nil); id != 1 {
		t.Fatalf("publish after delete: id %d", id)
	}
	sa.Ended(wait)
}

// Invalid and oversized events use no id, whether the local encoder or
// the publish function (which knows the id's digits) refuses them.
func TestPublishValidation(t *testing.T) {
	url, schema := testSchema(t)
	opts := testOptions(schema)
	opts.Bus.MaxEventBytes = 200
	a := newReplica(t, url, "A", opts)
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
	if _, _, err := a.bp.Publish(ctx, strings.Repeat("s", MaxSessionIDBytes+1), eventbus.Event{Type: "e"}); !errors.Is(err, ErrInvalidSession) {
		t.Fatalf("long session: %v", err)
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
// with the log's id; a session id and a type of arbitrary bytes survive
// the table and the notification exactly.
func TestEnvelope(t *testing.T) {
	url, schema := testSchema(t)
	a := newReplica(t, url, "A", testOptions(schema))
	ctx := context.Background()
	for _, session := range []string{"s", "\xff\x00 é/x"} {
		sub, err := a.bp.Subscribe(ctx, session, eventbus.SubscribeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ev := eventbus.Event{Type: "t\u2028x\xfe", Data: map[string]any{"k": "v\n"}, Meta: map[string]any{"serverTimestamp": 7, "m": 1}, OriginatorClientID: "c1"}
		if _, _, err := a.bp.Publish(ctx, session, ev); err != nil {
			t.Fatal(err)
		}
		var got eventbus.Frame
		waitFor(t, wait, "the event", func() bool {
			fs, _ := sub.AppendReady(nil)
			if len(fs) > 0 {
				got = fs[0]
			}
			return len(fs) > 0
		})
		sub.Close()
		plain, _ := eventbus.New(eventbus.Options{})
		want, err := plain.Publish(ev)
		plain.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got.ID() != 1 || got.Type() != ev.Type || string(got.JSON()) != string(want.JSON()) {
			t.Fatalf("session %q: got %d %q %s, want %s", session, got.ID(), got.Type(), got.JSON(), want.JSON())
		}
		var env map[string]any
		json.Unmarshal(got.JSON(), &env)
		if fmt.Sprint(env["id"]) != "1" {
			t.Fatalf("envelope id %v", env["id"])
		}
	}
}

// With SessionTTL, a session untouched for that long is deleted on every
// replica (its streams end); the next use starts a new epoch.
func TestSessionTTL(t *testing.T) {
	url, schema := testSchema(t)
	opts := testOptions(schema)
	opts.SessionTTL = 300 * time.Millisecond
	a, b, _ := threeReplicas(t, url, opts)
	sb := b.open(t, "s", nil, "")
	_, epoch, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
	if err != nil {
		t.Fatal(err)
	}
	wantIDs(t, sb.Events(1, wait), 1, 1)
	sb.Ended(wait)
	in, err := a.bp.Info(context.Background(), "s")
	if err != nil || in.Exists {
		t.Fatalf("info after the TTL: %+v, %v", in, err)
	}
	_, e2, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
	if err != nil || e2 == epoch {
		t.Fatalf("publish after the TTL: epoch %q (old %q), %v", e2, epoch, err)
	}
}

// New refuses invalid options.
func TestOptionsValidation(t *testing.T) {
	url, _ := testSchema(t)
	pool := newPool(t, url)
	for _, o := range []Options{
		{Schema: "Has-Upper"}, {Schema: "1x"}, {Schema: strings.Repeat("s", 49)},
		{PublishTimeout: -1}, {OutageTimeout: time.Microsecond}, {OutageTimeout: minOutageTimeout - time.Millisecond},
		{ReadCount: -1}, {SessionTTL: -1},
		{Bus: eventbus.Options{RingSize: -1}},
	} {
		if _, err := New(context.Background(), pool, o); !errors.Is(err, eventbus.ErrInvalidOption) {
			t.Errorf("New(%+v): %v", o, err)
		}
	}
	if _, err := New(context.Background(), nil, Options{}); !errors.Is(err, eventbus.ErrInvalidOption) {
		t.Errorf("New(nil pool): %v", err)
	}
}

// TestBackplane runs the tests every backplane must pass
// (internal/backplanetest.Run): Close, resuming on another replica and
// behind a late mirror and while publishing, local eviction, the replay
// budget, signals.
func TestBackplane(t *testing.T) { backplanetest.Run(t, cluster) }

// A signal's about must fit PostgreSQL's NOTIFY payload.
func TestSignalAboveTheNotifyPayloadLimit(t *testing.T) {
	url, schema := testSchema(t)
	a := newReplica(t, url, "A", testOptions(schema))
	if err := a.bp.Signal(context.Background(), "s", "t", strings.Repeat("a", 8000)); !errors.Is(err, eventbus.ErrEventTooLarge) {
		t.Fatalf("signal above the NOTIFY payload limit: %v", err)
	}
}
