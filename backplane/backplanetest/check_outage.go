package backplanetest

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
)

// The outage bound the outage checks ask for, and the slack they allow
// past it (a reader's last answer may predate the outage by one call; a
// loaded machine is late).
const (
	outageBound   = time.Second
	publishBound  = 500 * time.Millisecond
	outageSlack   = publishBound + 2*time.Second
	shortOutage   = 300 * time.Millisecond
	outageNoBlips = 5 * time.Second // the bound of ShortOutage: far above the blip
)

// The engine unreachable past the outage bound: publishes fail within
// their timeout with the module's ErrUnavailable; every open stream, on
// every replica, ends with one stream_error of errorKind unavailable
// within the bound (and in-process subscriptions end); the sessions are
// released; new streams are refused with 503 and Retry-After. Once it is
// back, publishes succeed in the same epoch and a client resumes from its
// cursor without a loss.
func checkOutage(t testing.TB, h *harness) {
	rs, c := h.cluster(2, Options{OutageTimeout: outageBound, PublishTimeout: publishBound}, "outage")
	a, b := rs[0], rs[1]
	sa, sb := a.Open(t, "s", nil, ""), b.Open(t, "s", nil, "")
	sub, err := a.BP.Subscribe(context.Background(), "s", eventbus.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for range 3 {
		a.Publish(t, "s", "e", nil)
	}
	WantIDs(t, sa.Events(3, wait), 1, 3)
	WantIDs(t, sb.Events(3, wait), 1, 3)

	c.Down()
	up := false
	defer func() {
		if !up {
			c.Up()
		}
	}()
	down := time.Now()
	start := time.Now()
	_, _, err = a.BP.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
	if took := time.Since(start); err == nil || took > publishBound+time.Second {
		t.Fatalf("a publish while the engine is down: %v after %v, want an error within PublishTimeout %v", err, took, publishBound)
	}
	if h.ErrUnavailable != nil && !errors.Is(err, h.ErrUnavailable) {
		t.Fatalf("a publish while the engine is down: %v, want the module's ErrUnavailable", err)
	}
	sa.EndedUnavailable(outageBound + outageSlack + time.Second)
	sb.EndedUnavailable(outageBound + outageSlack + time.Second)
	if took := time.Since(down); took > outageBound+outageSlack {
		t.Fatalf("the streams ended %v after the engine went down, OutageTimeout %v", took, outageBound)
	}
	for range sub.Events() {
	}
	if !errors.Is(sub.Err(), eventbus.ErrClosed) || !strings.Contains(sub.Err().Error(), "unavailable") {
		t.Fatalf("the in-process subscription ended with %v, want eventbus.ErrClosed (unavailable)", sub.Err())
	}
	if a.BP.Sessions() != 0 || b.BP.Sessions() != 0 {
		t.Fatalf("sessions still held after the outage: A %d, B %d", a.BP.Sessions(), b.BP.Sessions())
	}
	resp, err := a.Server.Client().Get(a.URL("s", ""))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), `"code":"unavailable"`) {
		t.Fatalf("a new stream while the engine is down: %s %v %s, want 503 unavailable with Retry-After", resp.Status, resp.Header, body)
	}
	if _, err := a.BP.Subscribe(context.Background(), "s", eventbus.SubscribeOptions{}); err == nil || h.ErrUnavailable != nil && !errors.Is(err, h.ErrUnavailable) {
		t.Fatalf("Subscribe while the engine is down: %v, want the module's ErrUnavailable", err)
	}

	c.Up()
	up = true
	var id uint64
	var epoch string
	WaitFor(t, wait+outageSlack, "a publish after the outage", func() bool {
		id, epoch, err = a.BP.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		return err == nil
	})
	if epoch != sa.Epoch || id < 4 {
		t.Fatalf("after the outage: id %d epoch %s, want 4 or above (a publish of unknown outcome may be in) in epoch %s", id, epoch, sa.Epoch)
	}
	var again *Stream
	WaitFor(t, wait+outageSlack, "a stream on B after the outage", func() bool {
		resp, err := b.Server.Client().Get(b.URL("probe", ""))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	again = b.Open(t, "s", map[string]string{"Last-Event-ID": "3", "Event-Epoch": sa.Epoch}, "")
	WantIDs(t, again.Events(int(id-3), wait), 4, id)
	if rc := again.Next(wait); rc.Event != eventbus.TypeReplayComplete {
		t.Fatalf("want replay_complete, got %+v", rc)
	}
	a.Publish(t, "s", "e", nil)
	WantIDs(t, again.Events(1, wait), id+1, id+1)
}

// An outage much shorter than the bound ends nothing: the readers go on
// from their last id and the stream gets what follows.
func checkShortOutage(t testing.TB, h *harness) {
	rs, c := h.cluster(1, Options{OutageTimeout: outageNoBlips}, "outage")
	a := rs[0]
	s := a.Open(t, "s", nil, "")
	a.Publish(t, "s", "e", nil)
	WantIDs(t, s.Events(1, wait), 1, 1)
	c.Down()
	time.Sleep(shortOutage)
	c.Up()
	var id uint64
	WaitFor(t, wait, "a publish after the blip", func() bool {
		var err error
		id, _, err = a.BP.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		return err == nil
	})
	WantIDs(t, s.Events(int(id-1), wait), 2, id)
	if a.BP.Sessions() != 1 {
		t.Fatalf("a blip of %v released the session (OutageTimeout %v)", shortOutage, outageNoBlips)
	}
}

// The engine lost every log: ids restart at 1 in a new epoch, the
// mirrors of the lost epoch end their streams (their clients reconnect;
// at the latest once the new epoch has events, which they would miss), a
// resume with the old epoch gets epoch_reset (epoch_mismatch), one
// without an epoch past the new last id a numeric epoch_reset.
func checkLostLog(t testing.TB, h *harness) {
	rs, c := h.cluster(3, Options{}, "lose")
	a, cc := rs[0], rs[2]
	sa := a.Open(t, "s", nil, "")
	for range 10 {
		a.Publish(t, "s", "e", nil)
	}
	WantIDs(t, sa.Events(10, wait), 1, 10)
	old := sa.Epoch
	c.Lose()
	var epoch string
	for i := range 3 {
		var id uint64
		var err error
		// The first publishes may meet connections the loss broke.
		WaitFor(t, wait, "a publish after the loss", func() bool {
			id, epoch, err = cc.BP.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
			return err == nil
		})
		if id != uint64(i+1) {
			t.Fatalf("id %d after the loss, want %d", id, i+1)
		}
	}
	if epoch == old || len(epoch) != 32 {
		t.Fatalf("the epoch after the loss %q, before %q: want a new one", epoch, old)
	}
	noEvents(t, "A", sa.Ended(wait))
	sc := cc.Open(t, "s", map[string]string{"Last-Event-ID": "10", "Event-Epoch": old}, "")
	if sc.Epoch != epoch {
		t.Fatalf("Event-Epoch %q, want %q", sc.Epoch, epoch)
	}
	r := sc.Next(wait)
	if r.Event != eventbus.TypeStateResyncRequired || r.Str(t, "data", "reason") != "epoch_reset" ||
		r.Str(t, "data", "detail") != "epoch_mismatch" || r.Num(t, "data", "lastDeliveredId") != 10 ||
		r.Num(t, "data", "earliestAvailableId") != 1 || r.Str(t, "data", "epoch") != epoch {
		t.Fatalf("want epoch_reset (epoch_mismatch) 10 -> 1, got %+v", r)
	}
	WantIDs(t, sc.Events(3, wait), 1, 3)
	if rc := sc.Next(wait); rc.Event != eventbus.TypeReplayComplete || rc.Num(t, "data", "replayedCount") != 3 {
		t.Fatalf("want replay_complete of 3, got %+v", rc)
	}
	s2 := a.Open(t, "s", map[string]string{"Last-Event-ID": "10"}, "")
	if r := s2.Next(wait); r.Str(t, "data", "reason") != "epoch_reset" || r.Str(t, "data", "detail") != "" {
		t.Fatalf("want a numeric epoch_reset, got %+v", r)
	}
	WantIDs(t, s2.Events(3, wait), 1, 3)
}

// A replica whose reader has not noticed a lost log (it is held): a
// resume there checks the epoch with the engine first, so it gets
// epoch_reset in the new epoch at once, and the stale mirror's streams
// end without waiting for the reader; a client presenting the new epoch
// gets the new events, no reset.
func checkResumeOfALostEpoch(t testing.TB, h *harness) {
	rs, c := h.cluster(3, Options{}, "lose", "gates")
	a, cc := rs[0], rs[2]
	live := LateMirror(t, a, cc) // C's ring starts at 11
	cc.Gate.Hold(t, "s")
	defer cc.Gate.Release()
	c.Lose()
	sc := cc.Open(t, "s", map[string]string{"Last-Event-ID": "5", "Event-Epoch": live.Epoch}, "")
	if sc.Epoch == live.Epoch || len(sc.Epoch) != 32 {
		t.Fatalf("Event-Epoch %q after the loss, before %q: want a new one", sc.Epoch, live.Epoch)
	}
	r := sc.Next(wait)
	if r.Event != eventbus.TypeStateResyncRequired || r.Str(t, "data", "reason") != "epoch_reset" ||
		r.Str(t, "data", "detail") != "epoch_mismatch" || r.Num(t, "data", "lastDeliveredId") != 5 ||
		r.Num(t, "data", "earliestAvailableId") != 1 {
		t.Fatalf("want epoch_reset (epoch_mismatch) 5 -> 1, got %+v", r)
	}
	if rc := sc.Next(wait); rc.Event != eventbus.TypeReplayComplete || rc.Num(t, "data", "replayedCount") != 0 {
		t.Fatalf("want an empty replay_complete, got %+v", rc)
	}
	noEvents(t, "C's stale", live.Ended(wait)) // before the gate opens
	cc.Gate.Release()
	var epoch string
	for range 2 {
		WaitFor(t, wait, "a publish after the loss", func() bool {
			var err error
			_, epoch, err = a.BP.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
			return err == nil
		})
	}
	if epoch != sc.Epoch {
		t.Fatalf("the publishes' epoch %q, the new stream's %q", epoch, sc.Epoch)
	}
	WantIDs(t, sc.Events(2, wait), 1, 2)
	fresh := cc.Open(t, "s", map[string]string{"Last-Event-ID": "0", "Event-Epoch": epoch}, "")
	WantIDs(t, fresh.Events(2, wait), 1, 2)
	if rc := fresh.Next(wait); rc.Event != eventbus.TypeReplayComplete {
		t.Fatalf("a resume in the new epoch: want replay_complete, got %+v", rc)
	}
}
