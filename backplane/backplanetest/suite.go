package backplanetest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
)

// Backplane is what the suite drives: the methods of a backplane module's
// Backplane built on package backplane (redisbus, pgbus and natsbus have
// them all). Their contracts are in package backplane's documentation.
type Backplane interface {
	Publish(ctx context.Context, session string, e eventbus.Event) (id uint64, epoch string, err error)
	PublishIdempotent(ctx context.Context, session, key string, e eventbus.Event) (id uint64, epoch string, duplicate bool, err error)
	Signal(ctx context.Context, session, typ, about string) error
	Delete(ctx context.Context, session string) error
	Info(ctx context.Context, session string) (backplane.Info, error)
	Subscribe(ctx context.Context, session string, opts eventbus.SubscribeOptions) (*eventbus.Subscription, error)
	Bus(ctx context.Context, session string) (*eventbus.EventBus, error)
	Sessions() int
	Handler() *eventbus.Handler
	Close() error
}

// Options is what a check asks of the replicas it starts. A zero field
// leaves the harness's own setting; a harness sets the others on its
// module's options (Apply).
type Options struct {
	RingSize          int // events a session's log keeps: the engine trims to it
	RingMaxBytes      int // envelope bytes a session's log keeps (Harness.TrimsBytes)
	MaxEventBytes     int
	ReplayBudgetBytes int
	MaxQueued         int // a subscriber's queue: the checks that publish bursts raise it

	PublishTimeout    time.Duration
	OutageTimeout     time.Duration
	IdleTimeout       time.Duration
	IdempotencyWindow time.Duration
}

// Apply sets o's non-zero fields on a module's options: the bus fields
// on bus, the durations on the four (nil for one the module lacks).
func (o Options) Apply(bus *eventbus.Options, publishTimeout, outageTimeout, idleTimeout, idempotencyWindow *time.Duration) {
	setInt := func(dst *int, v int) {
		if v != 0 {
			*dst = v
		}
	}
	setInt(&bus.RingSize, o.RingSize)
	setInt(&bus.RingMaxBytes, o.RingMaxBytes)
	setInt(&bus.MaxEventBytes, o.MaxEventBytes)
	setInt(&bus.ReplayBudgetBytes, o.ReplayBudgetBytes)
	setInt(&bus.MaxQueued, o.MaxQueued)
	for _, d := range []struct {
		dst *time.Duration
		v   time.Duration
	}{{publishTimeout, o.PublishTimeout}, {outageTimeout, o.OutageTimeout}, {idleTimeout, o.IdleTimeout}, {idempotencyWindow, o.IdempotencyWindow}} {
		if d.dst != nil && d.v != 0 {
			*d.dst = d.v
		}
	}
}

// Cluster is what a harness started for one check: replicas of the
// backplane sharing one engine, and a namespace of their own in it (a key
// prefix, a schema, a stream), with the controls the harness has. Each
// control is optional: the checks that need one it lacks are skipped,
// saying which.
type Cluster struct {
	// Replicas are the n replicas, in the order of the replica names the
	// suite gives them (A, B, C ...).
	Replicas []Backplane
	// Gates, when set, holds each replica's readers: Gates[i]'s Wait is
	// the hook Replicas[i]'s readers call before they read the log and
	// before they check the epoch (see Gate). The checks of a replica
	// that lags behind the log need them.
	Gates []*Gate
	// Down and Up make the engine unreachable from every replica, without
	// losing what it holds (hung, or refusing connections, as the harness
	// can), and reachable again. The outage checks need them. Up runs
	// once for every Down, and is not called twice in a row.
	Down, Up func()
	// Lose makes the engine lose every session it holds, the way the
	// engine can lose data (a restart without persistence, its stream
	// deleted): the checks of a lost log need it. An engine whose logs
	// cannot be lost but by Delete leaves it nil.
	Lose func()
}

// Harness is what a module's test gives Run.
type Harness struct {
	// Start starts n replicas with o applied, in a namespace no other
	// check uses, and returns them; they and what Start started end with
	// t (t.Cleanup). It fails t when it cannot start them.
	Start func(t testing.TB, n int, o Options) Cluster
	// ErrUnavailable, ErrOutcomeUnknown and ErrInvalidSession are the
	// module's sentinels: the checks match errors with them (errors.Is).
	ErrUnavailable, ErrOutcomeUnknown, ErrInvalidSession error
	// TrimsBytes reports that the engine trims a session's log to
	// RingMaxBytes too, and that Info.Bytes counts the envelope bytes it
	// holds (a JetStream subject has no byte limit: natsbus leaves it
	// false).
	TrimsBytes bool
}

// wait bounds every wait for frames.
const wait = 10 * time.Second

// A check tests one promise of the backplane contract on a cluster of its
// own (a check that needs a control the harness lacks skips). Its
// failures say which promise broke (promised).
type check struct {
	name   string // the subtest's name
	broken string // what a failure means, as the start of its message
	needs  string // "bytes": skipped unless Harness.TrimsBytes
	run    func(t testing.TB, h *harness)
}

// checks are the suite, in the order Run runs them.
var checks = []check{
	{"IDsContiguous", "ids are not contiguous from 1 across replicas", "", checkIDsContiguous},
	{"OneOrderEverywhere", "replicas do not deliver one order", "", checkOneOrderEverywhere},
	{"EpochKept", "the session's epoch is not kept", "", checkEpochKept},
	{"Envelope", "the envelope delivered is not what a plain bus publishes", "", checkEnvelope},
	{"PublishValidation", "an invalid publish is not refused without using an id", "", checkPublishValidation},
	{"ReservedTypes", "a synthetic frame's type is not refused without using an id", "", checkReservedTypes},
	{"InvalidSessionIDs", "a session id the shared rule refuses is not refused with the module's ErrInvalidSession", "", checkInvalidSessionIDs},
	{"ResumeOnAnotherReplica", "a resume on another replica is not exact", "", checkResumeOnAnotherReplica},
	{"ResumeBehindALateMirror", "a resume from before a mirror's ring is not answered from the log", "", checkResumeBehindALateMirror},
	{"ResumeWhilePublishing", "the hand-over from history to live has a gap or a duplicate", "", checkResumeWhilePublishing},
	{"ResumeOnALaggingReplica", "a resume on a replica whose reader lags is not exact", "", checkResumeOnALaggingReplica},
	{"TrimRingEvicted", "a trimmed log does not answer ring_evicted", "", checkTrimRingEvicted},
	{"TrimByBytes", "the log is not trimmed to RingMaxBytes", "bytes", checkTrimByBytes},
	{"ReaderGap", "a reader that fell behind a trim does not tell its subscribers", "", checkReaderGap},
	{"ReplayBudget", "the replay budget does not hold for resumes from the log", "", checkReplayBudget},
	{"SlowSubscriberEvictedLocally", "a slow subscriber's eviction is not local", "", checkSlowSubscriberEvictedLocally},
	{"Signals", "a signal does not reach every replica, without an id", "", checkSignals},
	{"Delete", "DELETE does not start a new epoch on every replica", "", checkDelete},
	{"DeleteThenNewStream", "a new stream joined a deleted epoch", "", checkDeleteThenNewStream},
	{"PublishReleasesStaleMirror", "a publish left a mirror of a deleted epoch open", "", checkPublishReleasesStaleMirror},
	{"IdempotentPublish", "an idempotent publish is not applied once", "", checkIdempotentPublish},
	{"IdempotencyKeys", "idempotency keys are not checked", "", checkIdempotencyKeys},
	{"IdempotentConcurrent", "concurrent publishes of one key did not append once", "", checkIdempotentConcurrent},
	{"IdempotencyWindow", "an idempotency key is not forgotten after its window", "", checkIdempotencyWindow},
	{"IdempotentRetryAfterOutage", "a publish retried with its key across an outage is not appended once", "", checkIdempotentRetryAfterOutage},
	{"Outage", "an engine outage is not bounded and announced", "", checkOutage},
	{"ShortOutage", "an outage shorter than the bound ended streams", "", checkShortOutage},
	{"LostLog", "a lost log does not start a new epoch", "", checkLostLog},
	{"ResumeOfALostEpoch", "a stream joined a mirror of a lost epoch", "", checkResumeOfALostEpoch},
	{"IdleRelease", "an idle mirror is not released, or its session changed", "", checkIdleRelease},
	{"Close", "Close does not end the replica's streams with stream_error shutdown", "", checkClose},
}

// Run runs the conformance suite on the backplane h starts: every check
// as a subtest of t (go test -run 'TestX/Outage' runs one), each on a
// cluster of its own. A check whose control the harness lacks is skipped.
// A failure's message starts with "backplanetest: " and the promise the
// backplane broke, then what the check saw.
func Run(t *testing.T, h Harness) {
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) { runCheck(t, c, h) })
	}
}

// runCheck runs c on t; the suite's own tests run it on a recorder.
func runCheck(t testing.TB, c check, h Harness) {
	if c.needs == "bytes" && !h.TrimsBytes {
		t.Skipf("backplanetest: %s: the engine does not trim by bytes (Harness.TrimsBytes)", c.name)
	}
	p := promised{TB: t, broken: c.broken}
	c.run(p, &harness{Harness: h, t: p})
}

// harness is a Harness during one check.
type harness struct {
	Harness
	t testing.TB
}

// cluster starts n replicas with o and serves each (Replica); names are
// A, B, C ... needs are the controls the check needs ("gates", "outage",
// "lose"): without one the check is skipped.
func (h *harness) cluster(n int, o Options, needs ...string) ([]*Replica, Cluster) {
	t := h.t
	t.Helper()
	c := h.Start(t, n, o)
	if len(c.Replicas) != n {
		t.Fatalf("Harness.Start returned %d replicas, want %d", len(c.Replicas), n)
	}
	for _, need := range needs {
		switch {
		case need == "gates" && len(c.Gates) != n:
			t.Skip("backplanetest: the harness has no Cluster.Gates")
		case need == "outage" && (c.Down == nil || c.Up == nil):
			t.Skip("backplanetest: the harness has no Cluster.Down and Up")
		case need == "lose" && c.Lose == nil:
			t.Skip("backplanetest: the harness has no Cluster.Lose")
		}
	}
	out := make([]*Replica, n)
	for i, bp := range c.Replicas {
		out[i] = NewReplica(t, string(rune('A'+i)), bp)
		if i < len(c.Gates) {
			out[i].Gate = c.Gates[i]
		}
	}
	return out, c
}

// three starts three replicas with o.
func (h *harness) three(o Options) (a, b, c *Replica) {
	h.t.Helper()
	rs, _ := h.cluster(3, o)
	return rs[0], rs[1], rs[2]
}

// promised is a check's testing.TB: its failures start with
// "backplanetest: " and the promise the backplane broke.
type promised struct {
	testing.TB
	broken string
}

func (p promised) prefix() string { return "backplanetest: " + p.broken + ": " }

func (p promised) Fatalf(format string, args ...any) {
	p.TB.Helper()
	p.TB.Fatalf(p.prefix()+format, args...)
}

func (p promised) Errorf(format string, args ...any) {
	p.TB.Helper()
	p.TB.Errorf(p.prefix()+format, args...)
}

func (p promised) Fatal(args ...any) {
	p.TB.Helper()
	p.TB.Fatal(p.prefix() + fmt.Sprint(args...))
}

func (p promised) Error(args ...any) {
	p.TB.Helper()
	p.TB.Error(p.prefix() + fmt.Sprint(args...))
}

// Replica is one daemon replica in-process: a backplane and an HTTP
// server with its Handler on "GET /session/{id}/events" (heartbeats off).
type Replica struct {
	Name   string
	BP     Backplane
	Server *httptest.Server
	// Gate holds the replica's readers (Cluster.Gates), nil without one.
	Gate *Gate
}

// NewReplica serves bp's Handler (heartbeats off: an hour) on a test
// server closed when t ends. The caller closes bp.
func NewReplica(t testing.TB, name string, bp Backplane) *Replica {
	t.Helper()
	mux := http.NewServeMux()
	h := bp.Handler()
	h.Heartbeat = time.Hour
	mux.Handle("GET /session/{id}/events", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &Replica{Name: name, BP: bp, Server: srv}
}

// URL returns the replica's stream URL of session (path-escaped), with
// query when it is not empty.
func (rp *Replica) URL(session, query string) string {
	u := rp.Server.URL + "/session/" + url.PathEscape(session) + "/events"
	if query != "" {
		u += "?" + query
	}
	return u
}

// Open opens session's stream on rp with the given headers and query (see
// the package's Open).
func (rp *Replica) Open(t testing.TB, session string, header map[string]string, query string) *Stream {
	t.Helper()
	return Open(t, rp.Server.Client(), rp.URL(session, query), header)
}

// Publish publishes an event of type typ with data on session, failing the
// test on an error, and returns its id.
func (rp *Replica) Publish(t testing.TB, session, typ string, data any) uint64 {
	t.Helper()
	id, _, err := rp.BP.Publish(context.Background(), session, eventbus.Event{Type: typ, Data: data})
	if err != nil {
		t.Fatalf("%s: publish: %v", rp.Name, err)
	}
	return id
}

// LateMirror publishes 20 events of session "s" on a while c's only live
// stream of it opens after the 10th, so that c's ring starts at 11; it
// returns that stream, which has read 11 to 20.
func LateMirror(t testing.TB, a, c *Replica) *Stream {
	t.Helper()
	for range 10 {
		a.Publish(t, "s", "e", nil)
	}
	live := c.Open(t, "s", nil, "")
	for range 10 {
		a.Publish(t, "s", "e", nil)
	}
	WantIDs(t, live.Events(10, wait), 11, 20)
	return live
}
