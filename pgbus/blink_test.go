package pgbus

import (
	"context"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ssebus/eventbus"
)

// warm opens n connections of pool and puts them back, idle: after a cut,
// each is a dead connection a request could be sent on.
func warm(t testing.TB, pool *pgxpool.Pool, n int) {
	t.Helper()
	var conns []*pgxpool.Conn
	for range n {
		c, err := pool.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
}

// The replicas' connections are cut (pg_terminate_backend; the server
// stays up, as in a pooler bounce or a failover) 30 times, each time with
// 4 idle connections in each pool. After each cut, a resume on another
// replica (B, whose mirror predates the cut, so the stream first checks
// the session's epoch on a pooled connection) is served, and 4 publishes,
// with and without an idempotency key, succeed with the next ids: a dead
// pooled connection costs no request, and nothing is appended twice.
func TestConnectionsCut(t *testing.T) {
	url, schema := testSchema(t)
	opts := testOptions(schema)
	a, b := newReplica(t, url, "A", opts), newReplica(t, url, "B", opts)
	live := b.open(t, "s", nil, "")
	a.publish(t, "s", "e", nil)
	wantIDs(t, live.Events(1, wait), 1, 1)
	const rounds, idle = 30, 4
	last := uint64(1)
	for i := range rounds {
		warm(t, a.pool, idle)
		warm(t, b.pool, idle)
		// The pools' idle connections, and the listeners' (a pool may
		// have closed an idle one meanwhile: some must be cut, not all).
		if n := cutConnections(t, url, schema); n < idle {
			t.Fatalf("round %d: cut %d connections, want at least %d", i, n, idle)
		}
		resumed := b.open(t, "s", map[string]string{"Last-Event-ID": strconv.FormatUint(last-1, 10), "Event-Epoch": live.Epoch}, "")
		// B's reader may still be reconnecting after the cut, its mirror
		// at last-1: then the resume replays nothing (replay_complete
		// with 0) and last comes live, as soon as the reader catches up.
		// Either way it comes, once.
		f := resumed.Next(wait)
		if f.ID == 0 && f.Event == eventbus.TypeReplayComplete {
			f = resumed.Next(wait)
		}
		if f.ID != last {
			t.Fatalf("round %d: the resume from %d got %+v, want event %d", i, last-1, f, last)
		}
		resumed.Close()
		for k := range idle {
			ev := eventbus.Event{Type: "e", Data: map[string]int{"round": i, "k": k}}
			var id uint64
			var dup bool
			var err error
			if k%2 == 0 {
				id, _, err = a.bp.Publish(context.Background(), "s", ev)
			} else {
				id, _, dup, err = a.bp.PublishIdempotent(context.Background(), "s", strconv.Itoa(i)+"-"+strconv.Itoa(k), ev)
			}
			if err != nil || id != last+1 || dup {
				t.Fatalf("round %d: publish %d after the cut: id %d, duplicate %v, %v; want id %d", i, k, id, dup, err, last+1)
			}
			last++
		}
	}
	wantIDs(t, live.Events(int(last-1), wait), 2, last)
	if n := queryInt(t, url, "SELECT count(*) FROM "+schema+".events"); n != int64(last) {
		t.Fatalf("table holds %d events, want %d", n, last)
	}
}

// A publish whose connection PostgreSQL terminates while the request is
// under way (it waits on a lock when pg_terminate_backend cuts the
// replica's connections, as a pooler bounce or a failover does) fails
// with the true reason, the FATAL 57P01 the server sent, and as an
// outcome unknown, not as a timeout; the pool is reset, and the next
// publish succeeds on a fresh connection with the next id (the cut one
// was not applied).
func TestPublishCutAnswersTheTrueReason(t *testing.T) {
	url, schema := testSchema(t)
	opts := testOptions(schema)
	opts.PublishTimeout = 30 * time.Second // the cut, not lock_timeout or the deadline, ends the wait
	a := newReplica(t, url, "A", opts)
	a.publish(t, "s", "e", nil)
	warm(t, a.pool, 4)
	unlock := lockEvents(t, url, schema)
	errc := make(chan error, 1)
	go func() {
		_, _, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		errc <- err
	}()
	waitFor(t, wait, "the publish waiting for the events table", func() bool {
		return queryInt(t, url, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'", schema) == 1
	})
	newConns := a.pool.Stat().NewConnsCount()
	if n := cutConnections(t, url, schema); n < 2 {
		t.Fatalf("cut %d connections, want the publish's and the listener's at least", n)
	}
	var err error
	select {
	case err = <-errc:
	case <-time.After(wait):
		t.Fatal("the publish did not return after its connection was cut")
	}
	t.Logf("the cut publish: %v", err)
	if err == nil || !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("the cut publish: %v, want an error wrapping ErrUnavailable and ErrOutcomeUnknown", err)
	}
	for _, want := range []string{"PostgreSQL terminated the connection", "FATAL 57P01 admin_shutdown", "after the request was sent"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the cut publish's error %q does not say %q", err, want)
		}
	}
	for _, wrong := range []string{"PublishTimeout", "no answer", "answer was lost", "deadline"} {
		if strings.Contains(err.Error(), wrong) {
			t.Errorf("the cut publish's error %q says %q: the server said why", err, wrong)
		}
	}

	unlock()
	id, _, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
	if err != nil || id != 2 {
		t.Fatalf("the next publish: id %d, %v; want id 2", id, err)
	}
	if a.pool.Stat().NewConnsCount() == newConns {
		t.Fatal("the next publish made no new connection: it ran on one from before the cut")
	}
	if n := queryInt(t, url, "SELECT count(*) FROM "+schema+".events"); n != 2 {
		t.Fatalf("table holds %d events, want 2", n)
	}
}

// outageOptions are the demo daemons' with -outage-timeout 2s.
func outageOptions(schema string) Options {
	opts := testOptions(schema)
	opts.OutageTimeout = 2 * time.Second
	opts.PollInterval = DefaultPollInterval
	return opts
}

// checkOutageBound checks that a stream ended (with stream_error
// unavailable) within a second of OutageTimeout after PostgreSQL went away
// at since. The bound counts from PostgreSQL's last word, which the
// listener's ping had at most a ping before.
func checkOutageBound(t *testing.T, what string, s *streamT, bp *Backplane, since time.Time) time.Duration {
	t.Helper()
	ot := bp.opts.OutageTimeout
	s.EndedUnavailable(ot + 5*time.Second)
	took := time.Since(since)
	t.Logf("%s: the stream's terminal frame came %v after PostgreSQL went away (OutageTimeout %v, ping %v)",
		what, took.Round(time.Millisecond), ot, bp.ping)
	if took < ot-bp.ping-200*time.Millisecond || took > ot+time.Second {
		t.Fatalf("%s: the stream ended %v after PostgreSQL went away, want within a second of OutageTimeout %v", what, took, ot)
	}
	return took
}

// A hung PostgreSQL (every server process stopped): the streams of a
// quiet session, which rely on the listener (on a replica of a schema
// without traffic), and of a busy one end within a second of
// OutageTimeout, not a PublishTimeout and a ping later.
func TestOutageBoundHungDatabase(t *testing.T) {
	srv := control(t)
	url, quietSchema := testSchema(t)
	_, busySchema := testSchema(t)
	opts := outageOptions(busySchema)
	a, b := newReplica(t, url, "A", outageOptions(quietSchema)), newReplica(t, url, "B", opts)
	quiet, busy := a.open(t, "quiet", nil, ""), b.open(t, "busy", nil, "")
	a.publish(t, "quiet", "e", nil)
	wantIDs(t, quiet.Events(1, wait), 1, 1)
	stop := make(chan struct{})
	published := make(chan struct{})
	go func() {
		// Publishes on B keep its reader busy until the pause (and fail
		// after it).
		defer close(published)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _, _ = b.bp.Publish(context.Background(), "busy", eventbus.Event{Type: "e"})
			time.Sleep(20 * time.Millisecond)
		}
	}()
	busy.Next(wait)
	// The quiet session's last word from PostgreSQL is then the
	// listener's ping, somewhere in its cycle.
	time.Sleep(5 * a.bp.ping / 2)
	// From the start of the pause: the helper stops the processes one by
	// one (it takes some 10 ms).
	paused := time.Now()
	srv.Pause()
	defer srv.Resume()
	t.Logf("pausing took %v; the quiet replica's listener had last heard from PostgreSQL %v before",
		time.Since(paused).Round(time.Millisecond), paused.Sub(a.bp.listenerOK()).Round(time.Millisecond))
	checkOutageBound(t, "a quiet session", quiet, a.bp, paused)
	for {
		f := busy.Next(opts.OutageTimeout + 5*time.Second)
		if f.Event == eventbus.TypeStreamError {
			if f.Str(t, "data", "errorKind") != eventbus.ErrorKindUnavailable {
				t.Fatalf("busy stream ended with %+v", f)
			}
			break
		}
	}
	took := time.Since(paused)
	t.Logf("a busy session: the stream's terminal frame came %v after PostgreSQL went away", took.Round(time.Millisecond))
	if took < opts.OutageTimeout-b.bp.ping-200*time.Millisecond || took > opts.OutageTimeout+time.Second {
		t.Fatalf("busy session: the stream ended %v after PostgreSQL went away, OutageTimeout %v", took, opts.OutageTimeout)
	}
	close(stop)
	srv.Resume()
	<-published
}

// A reader's query that PostgreSQL does not answer (the events table is
// locked; the server and the listener are fine) ends the streams within a
// second of OutageTimeout after the notification that woke the reader,
// although PublishTimeout is longer.
func TestOutageBoundSlowQuery(t *testing.T) {
	url, schema := testSchema(t)
	opts := outageOptions(schema)
	opts.PublishTimeout = 5 * time.Second
	a := newReplica(t, url, "A", opts)
	s := a.open(t, "s", nil, "")
	a.publish(t, "s", "e", nil)
	wantIDs(t, s.Events(1, wait), 1, 1)
	lockEvents(t, url, schema)
	// What a publish on another replica would send: id 2 of the epoch.
	execSQL(t, url, "SELECT pg_notify($1, $2)", schema+"_events", hex.EncodeToString([]byte("s"))+" "+s.Epoch+" 2")
	checkOutageBound(t, "a reader's query blocked on a lock", s, a.bp, time.Now())
}

// The database comes back empty (its schema dropped, every connection
// cut: a new cluster at the same URL). The next query finds the schema
// missing and creates it again; the sessions start new epochs: the old
// streams end, a resume gets epoch_reset, and publishes go on from id 1.
func TestDatabaseBackEmpty(t *testing.T) {
	url, schema := testSchema(t)
	opts := testOptions(schema)
	a, b := newReplica(t, url, "A", opts), newReplica(t, url, "B", opts)
	sa, sb := a.open(t, "s", nil, ""), b.open(t, "s", nil, "")
	for range 3 {
		a.publish(t, "s", "e", nil)
	}
	wantIDs(t, sa.Events(3, wait), 1, 3)
	wantIDs(t, sb.Events(3, wait), 1, 3)
	old := sa.Epoch
	execSQL(t, url, "DROP SCHEMA "+schema+" CASCADE")
	cutConnections(t, url, schema)

	// A resume on B, whose mirror predates the loss: the epoch check finds
	// the schema missing, creates it again, and the session has a new
	// epoch.
	resumed := b.open(t, "s", map[string]string{"Last-Event-ID": "3", "Event-Epoch": old}, "")
	if resumed.Epoch == old || len(resumed.Epoch) != 32 {
		t.Fatalf("resume after the loss joined epoch %q (lost: %q)", resumed.Epoch, old)
	}
	rs := resumed.Next(wait)
	if rs.Event != eventbus.TypeStateResyncRequired || rs.Str(t, "data", "reason") != "epoch_reset" {
		t.Fatalf("want epoch_reset, got %+v", rs)
	}
	sb.Ended(wait)
	id, epoch, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
	if err != nil || id != 1 || epoch != resumed.Epoch {
		t.Fatalf("publish after the loss: id %d epoch %q %v, want 1 in %q", id, epoch, err, resumed.Epoch)
	}
	sa.Ended(wait)
	for f := resumed.Next(wait); f.ID != 1; f = resumed.Next(wait) {
		if f.ID != 0 {
			t.Fatalf("got id %d, want 1", f.ID)
		}
	}
	// A publish that finds the schema missing is applied once.
	execSQL(t, url, "DROP SCHEMA "+schema+" CASCADE")
	id, epoch, err = a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
	if err != nil || id != 1 || epoch == resumed.Epoch {
		t.Fatalf("publish on a dropped schema: id %d epoch %q %v, want 1 in a new epoch", id, epoch, err)
	}
	if n := queryInt(t, url, "SELECT count(*) FROM "+schema+".events"); n != 1 {
		t.Fatalf("table holds %d events, want 1", n)
	}
	resumed.Ended(wait)
}
