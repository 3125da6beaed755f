package daemontest

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssebus/eventbus/backplane/backplanetest"
	"github.com/ssebus/eventbus/sseclient"
)

// ReplicaHarness says how ReplicaSuite runs the replica daemon of one
// backplane engine (redisbus/cmd/sessiond-redis, pgbus/cmd/sessiond-pg,
// natsbus/cmd/sessiond-nats): the daemon's test calls ReplicaSuite with it
// from its main_test.go, which may import this package because its path
// lies under github.com/ssebus/eventbus.
type ReplicaHarness struct {
	// Daemon is the command's name ("sessiond-redis"): the start of its
	// listening log line, the realm of its -auth-token, in its -h text.
	Daemon string
	// EngineFlag names the flag of the engine's URL, without the dash
	// ("redis", "pg", "nats").
	EngineFlag string
	// Dir is the directory of the daemon's main package, which the suite
	// builds (with -race when the test binary has it); "" is the test's
	// own directory, the daemon's.
	Dir string
	// Engine starts an engine server for t, or takes the one a CI script
	// started, with a namespace no other check uses; what it starts ends
	// with t (t.Cleanup). A check that talks to no engine does not call it.
	Engine func(t *testing.T) ReplicaEngine
}

// ReplicaEngine is an engine a check's replicas share, and its controls.
// Each pair of controls is optional: a check that needs one the engine
// lacks is skipped, saying which.
type ReplicaEngine struct {
	URL   string   // the value of the engine flag
	Flags []string // added to every replica's command line: its namespace (-prefix, -schema, -stream)
	// Down makes the engine refuse connections, keeping what it holds (a
	// crash, then a restart from its store); Up makes it accept them again
	// and returns once it does.
	Down, Up func()
	// Pause hangs the engine: connections stay open and nothing is
	// answered; Resume answers again, what was sent meanwhile included.
	Pause, Resume func()
}

// replicaWait bounds every wait of the suite for a frame or an answer.
const replicaWait = 10 * time.Second

// replicaCheck is one check of the suite, a subtest of its own with its
// own engine namespace and replicas.
type replicaCheck struct {
	name  string
	needs string // "down" or "pause": the engine's controls it needs
	run   func(c *replicaRun)
}

var replicaChecks = []replicaCheck{
	{"Flags", "", checkReplicaFlags},
	{"PublishAndStream", "", checkReplicaPublishAndStream},
	{"ResumeOnAnotherReplica", "", checkReplicaResume},
	{"IDsContiguousAcrossReplicas", "", checkReplicaIDsContiguous},
	{"Signal", "", checkReplicaSignal},
	{"Status", "", checkReplicaStatus},
	{"Delete", "", checkReplicaDelete},
	{"InvalidSessionIDs", "", checkReplicaInvalidSessionIDs},
	{"IdempotencyKey", "", checkReplicaIdempotencyKey},
	{"EngineHung", "pause", checkReplicaEngineHung},
	{"EngineDown", "down", checkReplicaEngineDown},
	{"EpochIDs", "", checkReplicaEpochIDs},
	{"DisconnectModes", "", checkReplicaDisconnect},
	{"JSONErrors", "", checkReplicaJSONErrors},
	{"AuthToken", "", checkReplicaAuthToken},
	{"Shutdown", "", checkReplicaShutdown},
}

// ReplicaSuite builds the daemon h describes and runs the black-box checks
// every replica daemon answers alike, each a subtest of t over real HTTP
// against daemon processes (two replicas where the check is about
// replicas) sharing an engine h.Engine starts: publish and stream, a resume
// on the other replica, ids contiguous across replicas, signals, the
// status, DELETE, the session id rule on every route, Idempotency-Key, a
// hung engine and one down (the 503
// answers, the streams' stream_error unavailable, the recovery), -epoch-ids
// across replicas, /disconnect's modes, the JSON errors, -auth-token across
// replicas, and the shutdown frame at SIGTERM.
func ReplicaSuite(t *testing.T, h ReplicaHarness) {
	dir := h.Dir
	if dir == "" {
		dir = "."
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	bin := build(ctx, t, dir, ".", h.Daemon, raceEnabled)
	cancel()
	for _, rc := range replicaChecks {
		t.Run(rc.name, func(t *testing.T) {
			c := &replicaRun{T: t, h: h, bin: bin, client: &http.Client{}}
			t.Cleanup(c.client.CloseIdleConnections) // last: after the streams and replicas
			switch e := c.engine; {
			case rc.needs == "down" && (e().Down == nil || e().Up == nil):
				t.Skipf("%s: the harness's engine has no Down and Up", h.Daemon)
			case rc.needs == "pause" && (e().Pause == nil || e().Resume == nil):
				t.Skipf("%s: the harness's engine has no Pause and Resume", h.Daemon)
			}
			rc.run(c)
		})
	}
}

// replicaRun is one check under way.
type replicaRun struct {
	*testing.T
	h      ReplicaHarness
	bin    string
	client *http.Client // the streams' (no timeout)
	eng    *ReplicaEngine
}

// engine starts the check's engine on first use.
func (c *replicaRun) engine() *ReplicaEngine {
	if c.eng == nil {
		e := c.h.Engine(c.T)
		c.eng = &e
	}
	return c.eng
}

// replica starts a replica named name with flags, stopped with SIGTERM
// (and a clean exit expected) when the check ends.
func (c *replicaRun) replica(name string, flags ...string) *Daemon {
	c.Helper()
	e := c.engine()
	args := append([]string{"-addr", "127.0.0.1:0", "-" + c.h.EngineFlag, e.URL, "-name", name}, e.Flags...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d := start(ctx, c.T, c.command(append(args, flags...)...),
		regexp.MustCompile(`msg="`+regexp.QuoteMeta(c.h.Daemon)+` listening" addr=(\S+)`),
		func(addr string) string { return "http://" + addr })
	c.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			if err := d.terminate(15 * time.Second); err != nil {
				c.Errorf("replica %s: %v", name, err)
			}
		}
	})
	return d
}

// command is the daemon's command with args. A daemon built with -race
// waits 100 ms at exit for its last reports, not the race runtime's
// default second: the suite starts and stops some thirty.
func (c *replicaRun) command(args ...string) *exec.Cmd {
	cmd := exec.Command(c.bin, args...)
	if os.Getenv("GORACE") == "" {
		cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=100")
	}
	return cmd
}

// outage starts an outage of the engine with begin and returns what ends
// it, end, which the check's cleanup calls when the check did not (it
// failed during the outage): before its replicas stop.
func (c *replicaRun) outage(begin, end func()) func() {
	begin()
	var once sync.Once
	stop := func() { once.Do(end) }
	c.Cleanup(stop)
	return stop
}

// open opens a stream of session on d with header.
func (c *replicaRun) open(d *Daemon, session string, header map[string]string) *backplanetest.Stream {
	c.Helper()
	return backplanetest.Open(c.T, c.client, d.Base+"/session/"+session+"/events", header)
}

// publish publishes body to session on d, which must answer 200, and
// returns the answer's id and epoch.
func (c *replicaRun) publish(d *Daemon, session, body string) (uint64, string) {
	c.Helper()
	a := d.Do(http.MethodPost, "/session/"+session+"/events", body, nil)
	if a.Status != http.StatusOK {
		c.Fatalf("POST /session/%s/events on %s: %d %s", session, d.Base, a.Status, a.Raw)
	}
	return idOf(a), epochOf(a)
}

// keyed publishes body to session on d with an Idempotency-Key.
func keyed(d *Daemon, session, key, body string) Answer {
	d.t.Helper()
	return d.Do(http.MethodPost, "/session/"+session+"/events", body, http.Header{"Idempotency-Key": {key}})
}

func idOf(a Answer) uint64 {
	id, _ := a.JSON["id"].(float64)
	return uint64(id)
}

func epochOf(a Answer) string {
	e, _ := a.JSON["epoch"].(string)
	return e
}

// note is the body of a "note" event with data {"n":n}.
func note(n int) string { return `{"type":"note","data":{"n":` + strconv.Itoa(n) + `}}` }

// unavailable checks a 503 with Retry-After and the code and message of
// why: unavailable (the engine refused: nothing appended) or, when
// outcomeUnknown is allowed, publish_outcome_unknown (the answer was lost:
// the event may or may not be appended).
func unavailable(t testing.TB, what string, a Answer, outcomeUnknown bool) {
	t.Helper()
	msg, _ := a.JSON["error"].(string)
	ok := a.Status == http.StatusServiceUnavailable && a.Header.Get("Retry-After") != ""
	switch a.Code() {
	case "unavailable":
	case "publish_outcome_unknown":
		ok = ok && outcomeUnknown && strings.Contains(msg, "may or may not") && strings.Contains(msg, "same Idempotency-Key")
	default:
		ok = false
	}
	if !ok {
		t.Fatalf("%s: %d Retry-After %q %s", what, a.Status, a.Header.Get("Retry-After"), a.Raw)
	}
}

// rawStream reads a stream as sseclient.Parser gives it: the id fields as
// sent ("<epoch>:<N>" with -epoch-ids).
type rawStream struct {
	t *testing.T
	p *sseclient.Parser
}

// openRaw opens url with header; every read ends after 30 s.
func (c *replicaRun) openRaw(url string, header http.Header) *rawStream {
	c.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	c.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.client.Do(req)
	if err != nil {
		c.Fatalf("GET %s: %v", url, err)
	}
	c.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		c.Fatalf("GET %s: %s", url, resp.Status)
	}
	return &rawStream{t: c.T, p: sseclient.NewParser(resp.Body)}
}

// want checks the next events: each its id field ("" for none), its type
// and the start of its data.
func (s *rawStream) want(events ...[3]string) {
	s.t.Helper()
	for _, w := range events {
		m, err := s.p.Next()
		for err == nil && m.Kind != sseclient.KindEvent {
			m, err = s.p.Next()
		}
		if err != nil {
			s.t.Fatalf("want %q, the stream ended: %v", w, err)
		}
		if m.ID != w[0] || m.Type != w[1] || !strings.HasPrefix(string(m.Data), w[2]) {
			s.t.Fatalf("got id %q %s %s, want %q", m.ID, m.Type, m.Data, w)
		}
	}
}
