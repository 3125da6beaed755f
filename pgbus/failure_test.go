package pgbus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/internal/backplanetest"
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

// A hung database (every server process stopped): Publish answers within
// its timeout, saying the outcome is unknown; past OutageTimeout every
// stream ends with stream_error unavailable; once the database is back a
// client resumes where it was.
func TestHungDatabase(t *testing.T) {
	srv := control(t)
	url, schema := testSchema(t)
	opts := testOptions(schema)
	opts.PublishTimeout = 500 * time.Millisecond
	opts.OutageTimeout = 2 * time.Second
	a, b, _ := threeReplicas(t, url, opts)
	sa, sb := a.open(t, "s", nil, ""), b.open(t, "s", nil, "")
	for range 5 {
		a.publish(t, "s", "e", nil)
	}
	wantIDs(t, sa.Events(5, wait), 1, 5)
	wantIDs(t, sb.Events(5, wait), 1, 5)

	srv.Pause()
	paused := time.Now()
	unknown := 0 // publishes whose outcome is unknown: each may be applied later
	for i := range 3 {
		start := time.Now()
		_, _, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		took := time.Since(start)
		if errors.Is(err, ErrOutcomeUnknown) {
			unknown++
		}
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("publish %d on a hung database: %v", i, err)
		}
		if i == 0 && !errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("publish sent to a hung database: %v, want ErrOutcomeUnknown", err)
		}
		if took > opts.PublishTimeout+300*time.Millisecond {
			t.Fatalf("publish %d took %v, PublishTimeout %v", i, took, opts.PublishTimeout)
		}
	}
	for _, s := range []*streamT{sa, sb} {
		s.EndedUnavailable(opts.OutageTimeout + 5*time.Second)
		took := time.Since(paused)
		// The bound counts from the last word from PostgreSQL, which the
		// listener's ping had at most listenPing before the pause.
		if took < opts.OutageTimeout-listenPing || took > opts.OutageTimeout+listenPing+opts.PublishTimeout+3*time.Second {
			t.Fatalf("stream ended %v after the pause, OutageTimeout %v", took, opts.OutageTimeout)
		}
	}
	if a.bp.Sessions() != 0 || b.bp.Sessions() != 0 {
		t.Fatalf("mirrors left after the outage: %d, %d", a.bp.Sessions(), b.bp.Sessions())
	}
	srv.Resume()
	var id uint64
	waitFor(t, wait, "publish after resume", func() bool {
		var err error
		id, _, err = a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		if errors.Is(err, ErrOutcomeUnknown) {
			unknown++ // a retry right after the resume can time out too
		}
		return err == nil
	})
	// Each publish whose outcome was unknown may have been applied after
	// the resume (the first one was sent to the hung database for sure);
	// none that failed otherwise was.
	if id < 6 || id > uint64(6+unknown) {
		t.Fatalf("id after the outage %d, want 6 to %d (%d publishes of unknown outcome)", id, 6+unknown, unknown)
	}
	s := b.open(t, "s", map[string]string{"Last-Event-ID": "5", "Event-Epoch": sa.Epoch}, "")
	wantIDs(t, s.Events(int(id-5), wait), 6, id)
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

// A hung database refuses new streams (the epoch check cannot be made)
// rather than joining a mirror that may be of a dead epoch.
func TestNewStreamOnHungDatabase(t *testing.T) {
	srv := control(t)
	url, schema := testSchema(t)
	opts := testOptions(schema)
	opts.PublishTimeout = 500 * time.Millisecond
	a := newReplica(t, url, "A", opts)
	live := a.open(t, "s", nil, "")
	a.publish(t, "s", "e", nil)
	wantIDs(t, live.Events(1, wait), 1, 1)
	srv.Pause()
	start := time.Now()
	if _, err := a.bp.Subscribe(context.Background(), "s", eventbus.SubscribeOptions{}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Subscribe on a hung database: %v", err)
	}
	if took := time.Since(start); took > opts.PublishTimeout+500*time.Millisecond {
		t.Fatalf("Subscribe took %v", took)
	}
	srv.Resume()
	a.publish(t, "s", "e", nil)
	wantIDs(t, live.Events(1, wait), 2, 2)
}

// A publish that timed out on a hung database and is retried with the
// same idempotency key once the database is back is appended once: the
// first attempt may have been applied after all (then the retry answers
// duplicate with its id), or not (then the retry appends it).
func TestIdempotentRetryAfterTimeout(t *testing.T) {
	srv := control(t)
	url, schema := testSchema(t)
	opts := testOptions(schema)
	opts.PublishTimeout = time.Second
	a, b, _ := threeReplicas(t, url, opts)
	sb := b.open(t, "s", nil, "")
	a.publish(t, "s", "e", nil)
	wantIDs(t, sb.Events(1, wait), 1, 1)
	ev := eventbus.Event{Type: "order.placed", Data: map[string]string{"order": "o-1"}}
	srv.Pause()
	_, _, _, err := a.bp.PublishIdempotent(context.Background(), "s", "order-o-1", ev)
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("publish to a hung database: %v, want ErrOutcomeUnknown", err)
	}
	srv.Resume()
	var id uint64
	var dup bool
	waitFor(t, wait, "the retry", func() bool {
		// The retry goes to another replica, as a client's would.
		id, _, dup, err = b.bp.PublishIdempotent(context.Background(), "s", "order-o-1", ev)
		return err == nil
	})
	if id != 2 {
		t.Fatalf("retry: id %d (duplicate %v), want 2", id, dup)
	}
	if n := queryInt(t, url, "SELECT count(*) FROM "+schema+".events WHERE session = $1", []byte("s")); n != 2 {
		t.Fatalf("table holds %d events, want 2", n)
	}
	got := sb.Events(1, wait)
	wantIDs(t, got, 2, 2)
	if got[0].Str(t, "data", "order") != "o-1" {
		t.Fatalf("event %+v", got[0])
	}
	sb.Quiet(100 * time.Millisecond)
	t.Logf("the timed-out attempt was applied: %v", dup)
}
