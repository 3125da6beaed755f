package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane/backplanetest"
	"github.com/ssebus/eventbus/internal/daemontest"
	"github.com/ssebus/eventbus/sseclient"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestReplicaSuite runs the black-box checks every replica daemon answers
// alike (internal/daemontest.ReplicaSuite) on sessiond-nats processes,
// each check against a JetStream server of its own. (The three-node
// cluster's outages are natsbus's own tests: cluster_test.go.)
func TestReplicaSuite(t *testing.T) {
	daemontest.ReplicaSuite(t, daemontest.ReplicaHarness{Daemon: "sessiond-nats", EngineFlag: "nats", Engine: startNATS})
}

// startNATS runs a JetStream server embedded in the test binary, with its
// store in a temporary directory, until the test ends. Down shuts it down
// (clients see their connections close, then refused) and Up starts it
// again from its store on the same port; the daemons reach it through a
// proxy, whose Pause and Resume hang it (an embedded server cannot be
// stopped with SIGSTOP).
func startNATS(t *testing.T) daemontest.ReplicaEngine {
	_, port, _ := net.SplitHostPort(daemontest.FreeAddr(t))
	n, _ := strconv.Atoi(port)
	opts := server.Options{Host: "127.0.0.1", Port: n, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true}
	var (
		mu  sync.Mutex
		srv *server.Server
	)
	up := func() {
		mu.Lock()
		defer mu.Unlock()
		if srv != nil {
			return
		}
		o := opts // NewServer keeps and changes its options
		s, err := server.NewServer(&o)
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			s.Shutdown()
			t.Fatal("nats-server did not start")
		}
		srv = s
	}
	down := func() {
		mu.Lock()
		defer mu.Unlock()
		if srv != nil {
			srv.Shutdown()
			srv.WaitForShutdown()
			srv = nil
		}
	}
	up()
	t.Cleanup(down)
	p := daemontest.NewProxy(t, "127.0.0.1:"+port)
	return daemontest.ReplicaEngine{
		URL: "nats://" + p.Addr(), Flags: []string{"-stream", "D"},
		Down: down, Up: up, Pause: p.Pause, Resume: p.Resume,
	}
}

// TestKickedReplicaAnswersResumes is issue 32's scenario: nats-server cuts
// replica B's connection and stays up (a kick of its client connection),
// and a client resumes on B at once, eight times. Every resume is
// answered (none refused with 503 unavailable) with the events after its
// cursor, B's connection is back within milliseconds, and a stream open on
// B through the eight kicks gets every id once, in order.
func TestKickedReplicaAnswersResumes(t *testing.T) {
	const rounds = 8
	srv := kickableNATS(t)
	url := srv.ClientURL()
	a, b := inProcess(t, url, "A"), inProcess(t, url, "B")
	client := &http.Client{Timeout: 10 * time.Second}
	t.Cleanup(client.CloseIdleConnections)

	publish := func(n int) (uint64, string) {
		t.Helper()
		resp, err := client.Post(a+"/session/s/events", "application/json", strings.NewReader(`{"type":"note","data":{"n":`+strconv.Itoa(n)+`}}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			ID    uint64 `json:"id"`
			Epoch string `json:"epoch"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("publish on A: %s %v", resp.Status, err)
		}
		return out.ID, out.Epoch
	}
	_, epoch := publish(1)
	live := backplanetest.Open(t, client, b+"/session/s/events", map[string]string{"Last-Event-ID": "1", "Event-Epoch": epoch})
	if f := live.Next(10 * time.Second); f.Event != eventbus.TypeReplayComplete {
		t.Fatalf("want replay_complete, got %+v", f)
	}
	publish(2)
	backplanetest.WantIDs(t, live.Events(1, 10*time.Second), 2, 2)

	var refused []string
	var gaps []time.Duration
	for round := range rounds {
		last, _ := publish(3 + round)
		cid := clientOf(t, srv, "sessiond-nats B", 0)
		kicked := time.Now()
		if err := srv.DisconnectClientByID(cid); err != nil {
			t.Fatal(err)
		}
		// The resume goes out at once; B's new connection is watched
		// beside it, from the server's side.
		back := make(chan time.Duration, 1)
		go func() {
			clientOf(t, srv, "sessiond-nats B", cid)
			back <- time.Since(kicked)
		}()
		status, ids, err := resume(client, b+"/session/s/events", epoch, last)
		gaps = append(gaps, <-back)
		switch {
		case err != nil:
			t.Fatalf("round %d: resume on B: %v", round, err)
		case status != "200 OK":
			refused = append(refused, status)
		case !slices.Equal(ids, daemontest.IDs(2, last)):
			t.Fatalf("round %d: the resume from 1 got ids %v, want 2..%d", round, ids, last)
		}
	}
	t.Logf("B back after each kick in %v", gaps)
	if len(refused) > 0 {
		t.Errorf("%d of %d resumes right after a kick were refused: %v", len(refused), rounds, refused)
	}
	for _, g := range gaps {
		// The old first reconnect waited 250 ms and more.
		if g >= 250*time.Millisecond {
			t.Errorf("B came back %v after a kick, want milliseconds", g)
		}
	}
	backplanetest.WantIDs(t, live.Events(rounds, 10*time.Second), 3, 2+rounds)
	live.Quiet(50 * time.Millisecond) // and nothing twice
}

// kickableNATS runs a JetStream server embedded in the test binary that
// the test reaches directly, so that it can cut its clients' connections
// (DisconnectClientByID) while it stays up.
func kickableNATS(t *testing.T) *server.Server {
	_, port, _ := net.SplitHostPort(daemontest.FreeAddr(t))
	n, _ := strconv.Atoi(port)
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: n, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	return s
}

// clientOf waits (polling the server's connections, for 10 s at most) for
// a client connection named name other than the one with id not, and
// returns its id.
func clientOf(t *testing.T, s *server.Server, name string, not uint64) uint64 {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		cz, err := s.Connz(&server.ConnzOptions{})
		if err != nil {
			t.Error(err)
			return 0
		}
		for _, c := range cz.Conns {
			if c.Name == name && c.Cid != not {
				return c.Cid
			}
		}
		time.Sleep(time.Millisecond)
	}
	t.Errorf("no connection %q but %d within 10s", name, not)
	return 0
}

// inProcess runs a replica of sessiond-nats in the test binary (run, as
// main does) against url, until the test ends, and returns its base URL.
func inProcess(t *testing.T, url, name string) string {
	return daemontest.RunReplica(t, run, "nats", daemontest.ReplicaEngine{URL: url, Flags: []string{"-stream", "K"}}, name)
}

// resume resumes url from id 1 of epoch and returns the status and, on
// 200, the ids the stream sends (the replay, then live events) up to last.
func resume(client *http.Client, url, epoch string, last uint64) (status string, ids []uint64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Last-Event-ID", "1")
	req.Header.Set("Event-Epoch", epoch)
	resp, err := client.Do(req)
	if err != nil {
		return "", nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return resp.Status + " " + strings.TrimSpace(string(body)), nil, nil
	}
	p := sseclient.NewParser(resp.Body)
	for len(ids) == 0 || ids[len(ids)-1] < last {
		m, err := p.Next()
		if err != nil {
			return resp.Status, ids, fmt.Errorf("after ids %v: %w", ids, err)
		}
		if m.Kind != sseclient.KindEvent || !m.HasID {
			continue // replay_complete, heartbeats
		}
		_, n, _ := strings.Cut(m.ID, ":") // "<epoch>:<N>" (-epoch-ids)
		id, err := strconv.ParseUint(n, 10, 64)
		if err != nil {
			return resp.Status, ids, fmt.Errorf("id %q", m.ID)
		}
		ids = append(ids, id)
	}
	return resp.Status, ids, nil
}
