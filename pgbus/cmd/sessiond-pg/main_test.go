package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ssebus/eventbus/backplane/backplanetest"
	"github.com/ssebus/eventbus/internal/daemontest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestReplicaSuite runs the black-box checks every replica daemon answers
// alike (internal/daemontest.ReplicaSuite) on sessiond-pg processes, each
// check in a schema of its own on the test server.
func TestReplicaSuite(t *testing.T) {
	daemontest.ReplicaSuite(t, daemontest.ReplicaHarness{Daemon: "sessiond-pg", EngineFlag: "pg", Engine: startPG})
}

// startPG returns the test server (.ci/pg.sh sets PGBUS_TEST_URL) behind a
// proxy of the test's own, and a schema dropped when the test ends. The
// proxy is the engine's controls (Down resets the connections and refuses
// new ones, Pause holds them): the server itself is shared with the
// module's other tests, which run beside these.
func startPG(t *testing.T) daemontest.ReplicaEngine {
	dsn := backplanetest.Env(t, "PGBUS_TEST_URL", "run bash .ci/pg.sh to test against a real PostgreSQL")
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("PGBUS_TEST_URL: %v", err)
	}
	var b [6]byte
	rand.Read(b[:])
	schema := "d_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Errorf("drop schema: %v", err)
			return
		}
		defer conn.Close(ctx)
		conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	})
	p := daemontest.NewProxy(t, u.Host)
	u.Host = p.Addr()
	return daemontest.ReplicaEngine{
		URL: u.String(), Flags: []string{"-schema", schema, "-pg-pool", "8"},
		Down: p.Down, Up: p.Up, Pause: p.Pause, Resume: p.Resume,
	}
}
