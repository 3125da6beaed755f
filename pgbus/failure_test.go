package pgbus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane/backplanetest"
)

// publishUntilApplied publishes event n with an idempotency key of its
// own, retrying until PostgreSQL answers: each logical event is appended
// exactly once, however many attempts a failure costs. It returns the id.
func publishUntilApplied(t testing.TB, rp *replica, session string, n int) uint64 {
	t.Helper()
	var id uint64
	waitFor(t, 30*time.Second, fmt.Sprintf("publish %d on %s", n, rp.name), func() bool {
		var err error
		id, _, _, err = rp.bp.PublishIdempotent(context.Background(), session, "event-"+strconv.Itoa(n),
			eventbus.Event{Type: "e", Data: map[string]int{"n": n}})
		if err != nil && !errors.Is(err, ErrUnavailable) {
			t.Fatalf("publish %d: %v", n, err)
		}
		return err == nil
	})
	return id
}

// checkOnce reads n events from every stream: ids 1..n in order, event k
// carrying data n=k-1 (each logical event exactly once), and no synthetic
// frame (nothing was lost that the table still holds).
func checkOnce(t *testing.T, streams []*streamT, n int) {
	t.Helper()
	for i, s := range streams {
		got := s.Events(n, 30*time.Second)
		wantIDs(t, got, 1, uint64(n))
		for k, f := range got {
			if f.Num(t, "data", "n") != int64(k) {
				t.Fatalf("stream %d: id %d carries n=%d, want %d", i, f.ID, f.Num(t, "data", "n"), k)
			}
		}
	}
}

// The database restarts while publishers on every replica publish: the
// listeners and readers reconnect and catch up from the table, and no
// subscriber on any replica loses an event or sees one twice (retries
// carry idempotency keys) or is told to resync.
func TestDatabaseRestart(t *testing.T) {
	srv := control(t)
	url, schema := testSchema(t)
	reps := []*replica{}
	a, b, c := threeReplicas(t, url, testOptions(schema))
	reps = append(reps, a, b, c)
	var streams []*streamT
	for _, rp := range reps {
		streams = append(streams, rp.open(t, "s", nil, ""), rp.open(t, "s", nil, ""))
	}
	// One publisher, rotating over the replicas, so that event n has id
	// n+1; the restart happens while it publishes.
	const total = 150
	restarted := make(chan struct{})
	for n := range total {
		if n == total/3 {
			go func() {
				defer close(restarted)
				srv.Restart()
			}()
		}
		publishUntilApplied(t, reps[n%len(reps)], "s", n)
	}
	<-restarted
	checkOnce(t, streams, total)
	for _, s := range streams {
		s.Quiet(50 * time.Millisecond)
	}
}

// Every client connection is killed (pg_terminate_backend) while a
// publisher publishes: listeners and readers reconnect and catch up.
func TestConnectionsKilled(t *testing.T) {
	url, schema := testSchema(t)
	a, b, c := threeReplicas(t, url, testOptions(schema))
	reps := []*replica{a, b, c}
	var streams []*streamT
	for _, rp := range reps {
		streams = append(streams, rp.open(t, "s", nil, ""))
	}
	const total = 60
	for n := range total {
		if n%20 == 10 {
			execSQL(t, url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "+
				"WHERE pid <> pg_backend_pid() AND datname = current_database() AND backend_type = 'client backend'")
		}
		publishUntilApplied(t, reps[n%len(reps)], "s", n)
	}
	checkOnce(t, streams, total)
}

// A replica is closed (shut down): its streams end after what they had
// queued; their clients resume on another replica and lose nothing, while
// the others go on publishing.
func TestReplicaClosed(t *testing.T) {
	url, schema := testSchema(t)
	a, b, c := threeReplicas(t, url, testOptions(schema))
	sa, sb := a.open(t, "s", nil, ""), b.open(t, "s", nil, "")
	for range 10 {
		c.publish(t, "s", "e", nil)
	}
	wantIDs(t, sa.Events(10, wait), 1, 10)
	a.bp.Close()
	sa.Ended(wait)
	for range 10 {
		c.publish(t, "s", "e", nil)
	}
	wantIDs(t, sb.Events(20, wait), 1, 20)
	resumed := b.open(t, "s", map[string]string{"Last-Event-ID": "10", "Event-Epoch": sa.Epoch}, "")
	wantIDs(t, resumed.Events(10, wait), 11, 20)
}

// A replica's pool is closed under it (the replica is broken, not shut
// down): its Publish fails at once with ErrUnavailable (nothing was
// sent), its streams end past OutageTimeout with stream_error
// unavailable, and their clients resume on another replica without loss;
// the other replicas never notice.
func TestReplicaPoolClosed(t *testing.T) {
	url, schema := testSchema(t)
	opts := testOptions(schema)
	opts.OutageTimeout = time.Second
	a, b, c := threeReplicas(t, url, opts)
	sa, sb := a.open(t, "s", nil, ""), b.open(t, "s", nil, "")
	for range 5 {
		c.publish(t, "s", "e", nil)
	}
	wantIDs(t, sa.Events(5, wait), 1, 5)
	a.pool.Close()
	start := time.Now()
	_, _, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
	if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("publish on a closed pool: %v", err)
	}
	// A's reader learns of the next publish and cannot read it.
	for range 5 {
		c.publish(t, "s", "e", nil)
	}
	sa.EndedUnavailable(wait)
	took := time.Since(start)
	if took < opts.OutageTimeout || took > opts.OutageTimeout+3*time.Second {
		t.Fatalf("A's stream ended %v after the failure, OutageTimeout %v", took, opts.OutageTimeout)
	}
	wantIDs(t, sb.Events(10, wait), 1, 10)
	resumed := b.open(t, "s", map[string]string{"Last-Event-ID": "5", "Event-Epoch": sa.Epoch}, "")
	wantIDs(t, resumed.Events(5, wait), 6, 10)
	resp, err := a.srv.Client().Get(a.srv.URL + "/session/s/events")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("GET on the broken replica: %s %v", resp.Status, resp.Header)
	}
}

// A resume the mirror's ring cannot answer while the events table cannot
// be read (another transaction holds an exclusive lock on it; the epoch
// check, on the sessions table, passes): the client is told at once what
// it missed cannot be read now (history_unavailable) and goes on live.
func TestResumeHistoryUnavailable(t *testing.T) {
	url, schema := testSchema(t)
	opts := testOptions(schema)
	opts.PublishTimeout = time.Second
	a, _, c := threeReplicas(t, url, opts)
	live := backplanetest.LateMirror(t, a.shared, c.shared) // C's ring starts at 11
	unlock := lockEvents(t, url, schema)
	sc := c.open(t, "s", map[string]string{"Last-Event-ID": "5", "Event-Epoch": live.Epoch}, "")
	rs := sc.Next(wait)
	if rs.Event != eventbus.TypeStateResyncRequired || rs.Str(t, "data", "reason") != "ring_evicted" ||
		rs.Str(t, "data", "detail") != "history_unavailable" || rs.Num(t, "data", "lastDeliveredId") != 5 ||
		rs.Num(t, "data", "earliestAvailableId") != 21 {
		t.Fatalf("want ring_evicted (history_unavailable) 5 -> 21, got %+v", rs)
	}
	if rc := sc.Next(wait); rc.Event != eventbus.TypeReplayComplete || rc.Num(t, "data", "replayedCount") != 0 {
		t.Fatalf("want an empty replay_complete, got %+v", rc)
	}
	unlock()
	a.publish(t, "s", "e", nil)
	wantIDs(t, sc.Events(1, wait), 21, 21)
}
