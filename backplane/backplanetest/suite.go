package backplanetest

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
)

// Backplane is what every backplane module's Backplane has (redisbus,
// pgbus): the shared tests drive a backplane through it alone.
type Backplane interface {
	Publish(ctx context.Context, session string, e eventbus.Event) (id uint64, epoch string, err error)
	Signal(ctx context.Context, session, typ, about string) error
	Subscribe(ctx context.Context, session string, opts eventbus.SubscribeOptions) (*eventbus.Subscription, error)
	Bus(ctx context.Context, session string) (*eventbus.EventBus, error)
	Sessions() int
	Handler() *eventbus.Handler
	Close() error
}

// Replica is one daemon replica in-process: a backplane and an HTTP server
// with its Handler on "GET /session/{id}/events".
type Replica struct {
	Name   string
	BP     Backplane
	Server *httptest.Server
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

// URL returns the replica's stream URL of session, with query when it is
// not empty.
func (rp *Replica) URL(session, query string) string {
	u := rp.Server.URL + "/session/" + session + "/events"
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

// Cluster starts n replicas of one backplane that share one engine and a
// namespace of their own (a key prefix, a schema), with the module's test
// options, then tune (when not nil) applied to their mirror buses'
// options. The replicas and the engine end with t.
type Cluster func(t *testing.T, n int, tune func(*eventbus.Options)) []*Replica

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

// ThreeReplicasOneOrder publishes concurrently on a, b and c (two
// publishers of 100 events each per replica, to session "s1") and checks
// that every subscriber on every replica (two each) gets every event with
// the same ids, bytes and order, each publisher's events in its own order,
// and one epoch. It returns how many events were published.
func ThreeReplicasOneOrder(t testing.TB, a, b, c *Replica) (total uint64) {
	t.Helper()
	reps := []*Replica{a, b, c}
	var subs []*Stream
	for _, rp := range reps {
		for range 2 {
			subs = append(subs, rp.Open(t, "s1", nil, ""))
		}
	}
	const per, publishers = 100, 2 // per replica: 2 publishers of 100 each
	var wg sync.WaitGroup
	ids := make([][]uint64, len(reps)*publishers)
	for i := range ids {
		rp := reps[i%len(reps)]
		wg.Go(func() {
			for n := range per {
				id, _, err := rp.BP.Publish(context.Background(), "s1", eventbus.Event{
					Type: "e", Data: map[string]int{"p": i, "n": n}})
				if err != nil {
					t.Errorf("%s: %v", rp.Name, err)
					return
				}
				ids[i] = append(ids[i], id)
			}
		})
	}
	wg.Wait()
	seen := map[uint64]bool{}
	for i := range ids {
		for k, id := range ids[i] {
			if seen[id] {
				t.Fatalf("id %d assigned twice", id)
			}
			seen[id] = true
			if k > 0 && id <= ids[i][k-1] {
				t.Fatalf("publisher %d got id %d after %d", i, id, ids[i][k-1])
			}
		}
	}
	total = uint64(len(ids) * per)
	var ref []Frame
	for i, s := range subs {
		got := s.Events(int(total), wait)
		WantIDs(t, got, 1, total)
		if i == 0 {
			ref = got
			continue
		}
		for k := range got {
			if got[k] != ref[k] {
				t.Fatalf("subscriber %d frame %d = %+v, subscriber 0 has %+v", i, k, got[k], ref[k])
			}
		}
	}
	next := make([]int64, len(ids))
	for _, f := range ref {
		p, n := f.Num(t, "data", "p"), f.Num(t, "data", "n")
		if n != next[p] {
			t.Fatalf("publisher %d: event n=%d at id %d, want n=%d", p, n, f.ID, next[p])
		}
		next[p]++
	}
	if subs[0].Epoch == "" || subs[0].Epoch != subs[5].Epoch {
		t.Fatalf("epochs differ across replicas: %q, %q", subs[0].Epoch, subs[5].Epoch)
	}
	return total
}

// wait bounds every wait for frames.
const wait = 10 * time.Second

func three(t *testing.T, cluster Cluster, tune func(*eventbus.Options)) (a, b, c *Replica) {
	rs := cluster(t, 3, tune)
	return rs[0], rs[1], rs[2]
}

// Run runs the tests every backplane must pass, each as a subtest on a
// cluster of its own.
func Run(t *testing.T, cluster Cluster) {
	t.Run("Close", func(t *testing.T) { checkClose(t, cluster) })
	t.Run("ResumeOnAnotherReplica", func(t *testing.T) { checkResumeOnAnotherReplica(t, cluster) })
	t.Run("ResumeBehindALateMirror", func(t *testing.T) { checkResumeBehindALateMirror(t, cluster) })
	t.Run("SlowSubscriberEvictedLocally", func(t *testing.T) { checkSlowSubscriberEvictedLocally(t, cluster) })
	t.Run("ResumeReplayBudget", func(t *testing.T) { checkResumeReplayBudget(t, cluster) })
	t.Run("SignalReachesEveryReplica", func(t *testing.T) { checkSignalReachesEveryReplica(t, cluster) })
	t.Run("ResumeWhilePublishing", func(t *testing.T) { checkResumeWhilePublishing(t, cluster) })
}

// checkClose: Close ends open streams, each with stream_error shutdown (at
// the default retryAfter), and every goroutine; Publish then fails.
func checkClose(t *testing.T, cluster Cluster) {
	a := cluster(t, 1, nil)[0]
	s := a.Open(t, "s", nil, "")
	for i := range 5 {
		a.Publish(t, "s"+strconv.Itoa(i), "e", nil)
	}
	a.Publish(t, "s", "e", nil)
	WantIDs(t, s.Events(1, wait), 1, 1)
	start := time.Now()
	a.BP.Close()
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Close took %v", took)
	}
	s.EndedShutdown(wait, eventbus.DefaultShutdownRetryAfter)
	if _, _, err := a.BP.Publish(context.Background(), "s", eventbus.Event{Type: "e"}); !errors.Is(err, eventbus.ErrClosed) {
		t.Fatalf("Publish after Close: %v", err)
	}
	if _, err := a.BP.Bus(context.Background(), "s"); !errors.Is(err, eventbus.ErrClosed) {
		t.Fatalf("Bus after Close: %v", err)
	}
	a.BP.Close()
}

// A client reading from A disconnects and resumes on C, which has no
// mirror of the session: it gets exactly the ids it missed, then live.
func checkResumeOnAnotherReplica(t *testing.T, cluster Cluster) {
	a, b, c := three(t, cluster, nil)
	sa := a.Open(t, "s", nil, "")
	for range 30 {
		b.Publish(t, "s", "e", nil)
	}
	got := sa.Events(20, wait)
	WantIDs(t, got, 1, 20)
	sa.Close() // the client saw 20
	for range 15 {
		b.Publish(t, "s", "e", nil)
	}
	if n := c.BP.Sessions(); n != 0 {
		t.Fatalf("C holds %d sessions before the resume", n)
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
// before it is answered from the stream, ahead of the live frames.
func checkResumeBehindALateMirror(t *testing.T, cluster Cluster) {
	a, _, c := three(t, cluster, nil)
	live := LateMirror(t, a, c) // C's mirror starts at 11
	sc := c.Open(t, "s", map[string]string{"Last-Event-ID": "5", "Event-Epoch": live.Epoch}, "")
	WantIDs(t, sc.Events(15, wait), 6, 20)
	if rc := sc.Next(wait); rc.Event != eventbus.TypeReplayComplete || rc.Num(t, "data", "replayedCount") != 15 {
		t.Fatalf("want replay_complete of 15, got %+v", rc)
	}
	a.Publish(t, "s", "e", nil)
	WantIDs(t, sc.Events(1, wait), 21, 21)
}

// A slow subscriber on B is evicted there; every other subscriber, on
// every replica, gets everything, and the other mirrors evict nobody.
func checkSlowSubscriberEvictedLocally(t *testing.T, cluster Cluster) {
	a, b, c := three(t, cluster, nil)
	var fast []*Stream
	for _, rp := range []*Replica{a, b, c} {
		fast = append(fast, rp.Open(t, "s", nil, ""))
	}
	slow, err := b.BP.Subscribe(context.Background(), "s", eventbus.SubscribeOptions{MaxQueued: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	for range 100 {
		a.Publish(t, "s", "e", nil)
	}
	for _, s := range fast {
		var got []Frame
		for len(got) < 100 {
			f := s.Next(wait)
			if f.ID == 0 {
				if f.Event != eventbus.TypeSlowClientWarning {
					t.Fatalf("fast subscriber got %s %s", f.Event, f.Data)
				}
				continue
			}
			got = append(got, f)
		}
		WantIDs(t, got, 1, 100)
	}
	var ids []uint64
	var types []string
	for f := range slow.Events() {
		if f.ID() != 0 {
			ids = append(ids, f.ID())
		} else {
			types = append(types, f.Type())
		}
	}
	if len(ids) != 16 || ids[0] != 1 || ids[15] != 16 {
		t.Fatalf("slow subscriber got ids %v, want 1..16", ids)
	}
	if len(types) != 2 || types[0] != eventbus.TypeSlowClientWarning || types[1] != eventbus.TypeClientEvicted {
		t.Fatalf("slow subscriber got synthetic frames %v", types)
	}
	if !errors.Is(slow.Err(), eventbus.ErrEvicted) {
		t.Fatalf("slow subscriber ended with %v", slow.Err())
	}
	for _, rp := range []*Replica{a, b, c} {
		bus, err := rp.BP.Bus(context.Background(), "s")
		if err != nil {
			t.Fatal(err)
		}
		want := uint64(0)
		if rp == b {
			want = 1
		}
		if got := bus.Stats().Evictions.QueueOverflow; got != want {
			t.Fatalf("%s evicted %d, want %d", rp.Name, got, want)
		}
	}
}

// The replay budget holds for resumes from the stream.
func checkResumeReplayBudget(t *testing.T, cluster Cluster) {
	a, _, c := three(t, cluster, func(o *eventbus.Options) { o.ReplayBudgetBytes = 1000 })
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
	// The budget counts envelopes (eventbus.Frame.Size, what follows
	// "data: "): the replayed ones fit in it, and one more would not (the
	// next id's envelope is at least as long as the first's).
	spent := 0
	for _, f := range got {
		spent += len(f.Data)
	}
	if spent > 1000 || spent+len(got[0].Data) <= 1000 {
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
		t.Fatalf("filtered resume replayed %d, unfiltered %d", n, len(got))
	}
}

// A signal sent on one replica reaches the session's subscribers on every
// replica, without an id.
func checkSignalReachesEveryReplica(t *testing.T, cluster Cluster) {
	a, b, c := three(t, cluster, nil)
	var subs []*Stream
	for _, rp := range []*Replica{a, b, c} {
		subs = append(subs, rp.Open(t, "s", nil, ""))
	}
	if err := b.BP.Signal(context.Background(), "s", "doc.changed", "doc/1"); err != nil {
		t.Fatal(err)
	}
	for i, s := range subs {
		f := s.Next(wait)
		if f.ID != 0 || f.Event != "doc.changed" || f.Str(t, "about") != "doc/1" {
			t.Fatalf("replica %d got %+v", i, f)
		}
	}
	if err := a.BP.Signal(context.Background(), "s", "", "x"); !errors.Is(err, eventbus.ErrInvalidEvent) {
		t.Fatalf("empty signal type: %v", err)
	}
	a.Publish(t, "s", "e", nil)
	for _, s := range subs {
		WantIDs(t, s.Events(1, wait), 1, 1)
	}
}

// Live publishing during a resume from the engine's history: the
// hand-over from history to live has no gap and no duplicate.
func checkResumeWhilePublishing(t *testing.T, cluster Cluster) {
	a, b, c := three(t, cluster, nil)
	for range 200 {
		a.Publish(t, "s", "e", nil)
	}
	warm := c.Open(t, "s", nil, "") // C's mirror, ring from 201
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var published atomic.Uint64
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
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
