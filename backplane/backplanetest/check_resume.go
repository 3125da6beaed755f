package backplanetest

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
)

// A client reading from A disconnects and resumes on C, which has no
// mirror of the session: it gets exactly the ids it missed, then live.
func checkResumeOnAnotherReplica(t testing.TB, h *harness) {
	a, b, c := h.three(Options{})
	sa := a.Open(t, "s", nil, "")
	for range 30 {
		b.Publish(t, "s", "e", nil)
	}
	WantIDs(t, sa.Events(20, wait), 1, 20)
	sa.Close() // the client saw 20
	for range 15 {
		b.Publish(t, "s", "e", nil)
	}
	if n := c.BP.Sessions(); n != 0 {
		t.Fatalf("C holds %d sessions before the resume, want 0 (it served none)", n)
	}
	sc := c.Open(t, "s", map[string]string{"Last-Event-ID": "20", "Event-Epoch": sa.Epoch}, "")
	if sc.Epoch != sa.Epoch {
		t.Fatalf("C's epoch %q, A's %q", sc.Epoch, sa.Epoch)
	}
	WantIDs(t, sc.Events(25, wait), 21, 45)
	rc := sc.Next(wait)
	if rc.Event != eventbus.TypeReplayComplete || rc.Num(t, "data", "replayedCount") != 25 || rc.Num(t, "data", "lastReplayedEventId") != 45 {
		t.Fatalf("want replay_complete of 25 up to 45, got %+v", rc)
	}
	a.Publish(t, "s", "e", nil)
	WantIDs(t, sc.Events(1, wait), 46, 46)
}

// C already mirrors the session, but only from a late id: a resume from
// before it is answered from the log, ahead of the live frames.
func checkResumeBehindALateMirror(t testing.TB, h *harness) {
	a, _, c := h.three(Options{})
	live := LateMirror(t, a, c) // C's mirror starts at 11
	sc := c.Open(t, "s", map[string]string{"Last-Event-ID": "5", "Event-Epoch": live.Epoch}, "")
	WantIDs(t, sc.Events(15, wait), 6, 20)
	if rc := sc.Next(wait); rc.Event != eventbus.TypeReplayComplete || rc.Num(t, "data", "replayedCount") != 15 {
		t.Fatalf("want replay_complete of 15, got %+v", rc)
	}
	a.Publish(t, "s", "e", nil)
	WantIDs(t, sc.Events(1, wait), 21, 21)
}

// Live publishing during resumes from the log's history: the hand-over
// from history to live has no gap and no duplicate.
func checkResumeWhilePublishing(t testing.TB, h *harness) {
	a, b, c := h.three(Options{MaxQueued: burstQueue})
	for range 200 {
		a.Publish(t, "s", "e", nil)
	}
	warm := c.Open(t, "s", nil, "") // C's mirror, ring from 201
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var published atomic.Uint64
	wg.Go(func() {
		// Paced and bounded, so that the resumed streams' queues (behind
		// their replays) hold it on any engine, however fast.
		for range 100 {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			published.Store(b.Publish(t, "s", "e", nil))
		}
	})
	time.Sleep(20 * time.Millisecond)
	var resumed []*Stream
	for _, from := range []string{"0", "50", "199"} {
		resumed = append(resumed, c.Open(t, "s", map[string]string{"Last-Event-ID": from, "Event-Epoch": warm.Epoch}, ""))
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	close(stop)
	wg.Wait()
	last := published.Load()
	for i, s := range resumed {
		from := []uint64{1, 51, 200}[i]
		var ids []uint64
		sawComplete := false
		for len(ids) == 0 || ids[len(ids)-1] < last {
			f := s.Next(wait)
			if f.Event == eventbus.TypeSlowClientWarning {
				continue // the queue behind the replay filled up for a while
			}
			if f.ID == 0 {
				if f.Event != eventbus.TypeReplayComplete || sawComplete {
					t.Fatalf("resume %d: unexpected %s %s", i, f.Event, f.Data)
				}
				sawComplete = true
				continue
			}
			ids = append(ids, f.ID)
		}
		if !sawComplete {
			t.Fatalf("resume %d: no replay_complete", i)
		}
		for k, id := range ids {
			if id != from+uint64(k) {
				t.Fatalf("resume %d: event %d has id %d, want %d", i, k, id, from+uint64(k))
			}
		}
	}
}

// A client that read id 10 through A resumes on C before C's reader has
// fed 10: C waits for its reader (the log's Head says how far it is)
// instead of answering epoch_reset.
func checkResumeOnALaggingReplica(t testing.TB, h *harness) {
	rs, _ := h.cluster(3, Options{}, "gates")
	a, c := rs[0], rs[2]
	live := c.Open(t, "s", nil, "") // C's mirror exists
	c.Gate.Hold(t, "s")
	defer c.Gate.Release()
	sa := a.Open(t, "s", nil, "")
	for range 10 {
		a.Publish(t, "s", "e", nil)
	}
	WantIDs(t, sa.Events(10, wait), 1, 10)
	go func() {
		time.Sleep(200 * time.Millisecond)
		c.Gate.Release()
	}()
	sc := c.Open(t, "s", map[string]string{"Last-Event-ID": "10", "Event-Epoch": sa.Epoch}, "")
	if rc := sc.Next(wait); rc.Event != eventbus.TypeReplayComplete || rc.Num(t, "data", "replayedCount") != 0 {
		t.Fatalf("want an empty replay_complete, got %+v", rc)
	}
	WantIDs(t, live.Events(10, wait), 1, 10)
	a.Publish(t, "s", "e", nil)
	WantIDs(t, sc.Events(1, wait), 11, 11)
}

// The replay budget holds for resumes from the log.
func checkReplayBudget(t testing.TB, h *harness) {
	a, _, c := h.three(Options{ReplayBudgetBytes: 1000})
	for range 40 {
		a.Publish(t, "s", "e", strings.Repeat("z", 100))
	}
	sc := c.Open(t, "s", map[string]string{"Last-Event-ID": "0"}, "")
	var got []Frame
	for {
		f := sc.Next(wait)
		if f.ID == 0 {
			if f.Event != eventbus.TypeStateResyncRequired || f.Str(t, "data", "reason") != "replay_budget_exceeded" {
				t.Fatalf("want replay_budget_exceeded, got %+v", f)
			}
			n := uint64(len(got))
			if f.Num(t, "data", "lastDeliveredId") != int64(n) || f.Num(t, "data", "earliestAvailableId") != int64(n+1) {
				t.Fatalf("budget resync %+v after %d events", f, n)
			}
			break
		}
		got = append(got, f)
	}
	// The budget counts envelopes (what follows "data: "): the replayed
	// ones fit in it, and one more would not (the next id's envelope is
	// at least as long as the first's).
	spent := 0
	for _, f := range got {
		spent += len(f.Data)
	}
	if len(got) == 0 || spent > 1000 || spent+len(got[0].Data) <= 1000 {
		t.Fatalf("replayed %d events of %d envelope bytes within a budget of 1000", len(got), spent)
	}
	WantIDs(t, got, 1, uint64(len(got)))
	if rc := sc.Next(wait); rc.Event != eventbus.TypeReplayComplete || rc.Num(t, "data", "replayedCount") != int64(len(got)) {
		t.Fatalf("want replay_complete, got %+v", rc)
	}
	// With a type filter the whole range is read; the budget still holds.
	sf := c.Open(t, "s", map[string]string{"Last-Event-ID": "0"}, "types=e")
	n := 0
	for f := sf.Next(wait); f.ID != 0; f = sf.Next(wait) {
		n++
	}
	if n != len(got) {
		t.Fatalf("a filtered resume replayed %d, an unfiltered one %d", n, len(got))
	}
}
