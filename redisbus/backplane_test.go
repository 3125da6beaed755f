package redisbus

import (
	"context"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane/backplanetest"
)

const wait = 10 * time.Second // bound of every wait for frames

// TestBackplane runs the conformance suite (package backplanetest): ids,
// order, epochs, resumes, trims, the replay budget, evictions, signals,
// DELETE, idempotency, outages, lost streams, idle release, Close.
func TestBackplane(t *testing.T) { backplanetest.Run(t, harness) }

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

// A resume whose history read fails (Redis answers XRANGE with an error;
// here the stream key holds a string): the client is told what it missed
// cannot be read, then gets the live events.
func TestResumeHistoryUnavailable(t *testing.T) {
	r := startRedis(t)
	a, _, c := threeReplicas(t, r, testOptions(t))
	live := backplanetest.LateMirror(t, a.shared, c.shared) // C's ring starts at 11
	c.gate.Hold(t, "s")
	defer c.gate.Release()
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
