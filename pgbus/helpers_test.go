package pgbus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane/backplanetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const wait = 10 * time.Second // bound of every wait for frames

// pgURL returns the test server's URL (.ci/pg.sh starts one and sets
// PGBUS_TEST_URL); without it the test is skipped, unless CI=true.
func pgURL(t testing.TB) string {
	t.Helper()
	return backplanetest.Env(t, "PGBUS_TEST_URL",
		"run bash .ci/pg.sh (or bash .ci/pg.sh shell, then go test) to test against a real PostgreSQL")
}

// control returns the controls of the test server (.ci/pg.sh's helper,
// PGBUS_TEST_PGCTL): restart, and pause and resume (SIGSTOP and SIGCONT
// of every server process: a hung database).
func control(t testing.TB) *backplanetest.Control {
	t.Helper()
	pgURL(t)
	return backplanetest.NewControl(t, backplanetest.Env(t, "PGBUS_TEST_PGCTL",
		"this test restarts or pauses the server; .ci/pg.sh sets it"))
}

// testSchema returns a schema of its own for t (dropped when t ends) and
// the test server's URL.
func testSchema(t testing.TB) (url, schema string) {
	t.Helper()
	url = pgURL(t)
	var b [6]byte
	rand.Read(b[:])
	schema = "t_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return url, schema
}

// withConn runs f on a throwaway connection to url.
func withConn(t testing.TB, url string, f func(ctx context.Context, conn *pgx.Conn) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := f(ctx, conn); err != nil {
		t.Fatal(err)
	}
}

// execSQL runs one statement on a throwaway connection.
func execSQL(t testing.TB, url, sql string, args ...any) {
	t.Helper()
	withConn(t, url, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, sql, args...)
		return err
	})
}

// queryInt runs a query returning one integer on a throwaway connection.
func queryInt(t testing.TB, url, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	withConn(t, url, func(ctx context.Context, conn *pgx.Conn) error {
		return conn.QueryRow(ctx, sql, args...).Scan(&n)
	})
	return n
}

// testOptions are quick to notice changes and to close; every replica of
// a test shares its schema. PublishTimeout is the default: a loaded
// machine can hold a query for more than a second, and only the failure
// tests, which set a shorter one, wait for it to pass.
//
// Streams keep up to 4096 frames (instead of 256): the tests' SSE clients
// run on the same two cores as three replicas and the database, and are
// not the slow subscribers some tests are about.
func testOptions(schema string) Options {
	return Options{
		Bus:            eventbus.Options{MaxQueued: 4096},
		Schema:         schema,
		PublishTimeout: DefaultPublishTimeout,
		IdleTimeout:    time.Hour,
		PollInterval:   100 * time.Millisecond,
	}
}

// replica is one daemon replica in-process: its own pool, backplane,
// readers' gate and HTTP server.
type replica struct {
	name   string
	pool   *pgxpool.Pool
	bp     *Backplane
	gate   *backplanetest.Gate
	srv    *httptest.Server
	shared *backplanetest.Replica // the same, for the shared helpers
}

// newPool returns a pool for url, closed when t ends (after everything
// registered later, such as the backplane using it).
func newPool(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func newReplica(t testing.TB, url, name string, opts Options) *replica {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil)).With("replica", name)
	}
	// The schema names the replica's connections (cutConnections).
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	pool := newPool(t, url+sep+"application_name="+opts.Schema)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	bp, err := New(ctx, pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bp.Close() })
	// The gate wakes the reader it is to hold: a quiet reader sleeps until
	// a notification.
	g := backplanetest.NewGate()
	g.Poke = func(session string) {
		if s := bp.set.Ready(session); s != nil {
			s.poke()
		}
	}
	hook := g.Wait
	bp.readHook.Store(&hook)
	shared := backplanetest.NewReplica(t, name, bp)
	return &replica{name: name, pool: pool, bp: bp, gate: g, srv: shared.Server, shared: shared}
}

// cutConnections terminates every connection of the replicas of schema
// (their pools' and listeners', named by application_name; see
// newReplica) while the server stays up, as a pooler bounce or a failover
// does, and returns how many once those backends have exited (their FATAL
// 57P01 is then in the clients' sockets).
func cutConnections(t testing.TB, url, schema string) int {
	t.Helper()
	var pids []int32
	withConn(t, url, func(ctx context.Context, conn *pgx.Conn) error {
		err := conn.QueryRow(ctx, "SELECT coalesce(array_agg(pid) FILTER (WHERE pg_terminate_backend(pid)), '{}') "+
			"FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND application_name = $1", schema).Scan(&pids)
		if err != nil {
			return err
		}
		for {
			var left int
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)", pids).Scan(&left); err != nil {
				return err
			}
			if left == 0 {
				return nil
			}
			time.Sleep(time.Millisecond)
		}
	})
	return len(pids)
}

// lockEvents holds an exclusive lock on schema's events table from a
// transaction of its own (reads and publishes of every session wait)
// until unlock or the end of t.
func lockEvents(t testing.TB, url, schema string) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	locker, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	unlock = func() { once.Do(func() { locker.Close(ctx) }) } // the close rolls back
	t.Cleanup(unlock)
	if _, err := locker.Exec(ctx, "BEGIN; LOCK TABLE "+schema+".events IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	return unlock
}

func threeReplicas(t testing.TB, url string, opts Options) (a, b, c *replica) {
	return newReplica(t, url, "A", opts), newReplica(t, url, "B", opts), newReplica(t, url, "C", opts)
}

func (rp *replica) publish(t testing.TB, session, typ string, data any) uint64 {
	t.Helper()
	return rp.shared.Publish(t, session, typ, data)
}

// open opens GET /session/{session}/events on rp with the given headers
// and query.
func (rp *replica) open(t testing.TB, session string, header map[string]string, query string) *backplanetest.Stream {
	t.Helper()
	return rp.shared.Open(t, session, header, query)
}

// testWriter writes a backplane's log lines to its test's log (every
// goroutine that logs ends in a cleanup, before the test completes).
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// Short names for the shared checks.
var (
	wantIDs = backplanetest.WantIDs
	waitFor = backplanetest.WaitFor
)

type streamT = backplanetest.Stream

// harness is the conformance suite's: n replicas on a schema of their own
// in the test server; with .ci/pg.sh's control helper, Down pauses the
// server (a hung database); Lose drops the schema (a database back empty:
// the backplane creates it again, and every session a new epoch).
var harness = backplanetest.Harness{
	Start: func(t testing.TB, n int, o backplanetest.Options) backplanetest.Cluster {
		url, schema := testSchema(t)
		opts := testOptions(schema)
		o.Apply(&opts.Bus, &opts.PublishTimeout, &opts.OutageTimeout, &opts.IdleTimeout, &opts.IdempotencyWindow)
		var c backplanetest.Cluster
		for i := range n {
			rp := newReplica(t, url, string(rune('A'+i)), opts)
			c.Replicas = append(c.Replicas, rp.bp)
			c.Gates = append(c.Gates, rp.gate)
		}
		if ctl := os.Getenv("PGBUS_TEST_PGCTL"); ctl != "" {
			srv := backplanetest.NewControl(t, ctl)
			c.Down, c.Up = srv.Pause, srv.Resume
		}
		c.Lose = func() { execSQL(t, url, "DROP SCHEMA "+schema+" CASCADE") }
		return c
	},
	ErrUnavailable:    ErrUnavailable,
	ErrOutcomeUnknown: ErrOutcomeUnknown,
	ErrInvalidSession: ErrInvalidSession,
	TrimsBytes:        true,
}
