package eventbus

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ssebus/eventbus/internal/pipenet"
)

// The Hub (hub.go): lookup without create, get-or-create, the session cap,
// idle expiry, age retention, shutdown and stats. The byte budget's tests
// are in hub_budget_test.go.

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func TestHubInvalidOptions(t *testing.T) {
	for name, o := range map[string]HubOptions{
		"MaxSessions":         {MaxSessions: -1},
		"MaxTotalBytes":       {MaxTotalBytes: -1},
		"MaxTotalBytes small": {MaxTotalBytes: 1000, Bus: Options{MaxEventBytes: 2000}},
		"Bus":                 {Bus: Options{RingSize: -1}},
		"Bus MaxAge":          {Bus: Options{MaxAge: -time.Second}},
	} {
		_, err := NewHub(o)
		assert.ErrorIs(t, err, ErrInvalidOption, name)
	}
}

func TestHubLookupNeverCreates(t *testing.T) {
	h := newTestHub(t, HubOptions{})
	_, ok := h.Lookup("a")
	assert.False(t, ok)
	assert.Zero(t, h.Len())

	b, err := h.GetOrCreate("a")
	require.NoError(t, err)
	got, ok := h.Lookup("a")
	require.True(t, ok)
	assert.Same(t, b, got)
	again, err := h.GetOrCreate("a")
	require.NoError(t, err)
	assert.Same(t, b, again)
	assert.Equal(t, 1, h.Len())

	f, err := h.Publish("b", hubEvent(1))
	require.NoError(t, err)
	assert.Equal(t, uint64(1), f.ID())
	assert.Equal(t, 2, h.Len())
	st := h.Stats()
	assert.Equal(t, uint64(2), st.Created)
	assert.Equal(t, 2, st.Sessions)

	ids := map[string]bool{}
	for id, bus := range h.Sessions() {
		ids[id] = true
		assert.False(t, bus.closedOrZero())
	}
	assert.Equal(t, map[string]bool{"a": true, "b": true}, ids)

	assert.True(t, h.Delete("a"))
	assert.False(t, h.Delete("a"))
	assert.True(t, b.closedOrZero())
	_, ok = h.Lookup("a")
	assert.False(t, ok)
	assert.Equal(t, uint64(1), h.Stats().Deleted)
}

func TestHubMaxSessions(t *testing.T) {
	h := newTestHub(t, HubOptions{MaxSessions: 2, IdleTimeout: -1})
	for _, id := range []string{"a", "b"} {
		_, err := h.GetOrCreate(id)
		require.NoError(t, err)
	}
	_, err := h.GetOrCreate("c")
	require.ErrorIs(t, err, ErrHubFull)
	_, err = h.Publish("c", hubEvent(1))
	require.ErrorIs(t, err, ErrHubFull)
	assert.Equal(t, uint64(2), h.Stats().Refused)
	// An existing session is still served.
	_, err = h.Publish("a", hubEvent(1))
	require.NoError(t, err)
	// A deleted one makes room, and a bus closed by its owner too.
	h.Delete("a")
	_, err = h.GetOrCreate("c")
	require.NoError(t, err)
	b, _ := h.Lookup("b")
	require.NoError(t, b.Close())
	nb, err := h.GetOrCreate("b")
	require.NoError(t, err)
	assert.NotSame(t, b, nb)
	assert.Equal(t, 2, h.Len())
}

func TestHubIdleExpiry(t *testing.T) {
	clock := newHubClock()
	h := newTestHub(t, HubOptions{IdleTimeout: time.Minute, Bus: Options{Now: clock.now}})
	b, err := h.GetOrCreate("s")
	require.NoError(t, err)
	epoch := b.Epoch()
	clock.advance(50 * time.Second)
	_, err = h.Publish("s", hubEvent(1)) // activity: the publish
	require.NoError(t, err)
	clock.advance(59 * time.Second)
	h.sweep()
	_, ok := h.Lookup("s")
	require.True(t, ok, "59s after the last publish")
	clock.advance(time.Second)
	h.sweep()
	_, ok = h.Lookup("s")
	require.False(t, ok, "a minute after the last publish")
	assert.True(t, b.closedOrZero())
	st := h.Stats()
	assert.Equal(t, uint64(1), st.Expired)
	assert.Zero(t, st.Sessions)
	assert.Zero(t, h.Len())

	nb, err := h.GetOrCreate("s")
	require.NoError(t, err)
	assert.NotEqual(t, epoch, nb.Epoch(), "the next use starts a new epoch")
}

func TestHubExpiryNeverClosesASubscribedSession(t *testing.T) {
	clock := newHubClock()
	h := newTestHub(t, HubOptions{IdleTimeout: time.Minute, Bus: Options{Now: clock.now}})
	b, err := h.GetOrCreate("s")
	require.NoError(t, err)
	s, err := b.Subscribe(context.Background(), SubscribeOptions{})
	require.NoError(t, err)
	clock.advance(time.Hour)
	h.sweep()
	_, ok := h.Lookup("s")
	require.True(t, ok, "a session with a subscriber never expires")
	assert.Zero(t, h.Stats().Expired)

	s.Close() // the idle time starts now
	clock.advance(59 * time.Second)
	h.sweep()
	_, ok = h.Lookup("s")
	require.True(t, ok, "counted from the last subscriber leaving")
	clock.advance(time.Second)
	h.sweep()
	_, ok = h.Lookup("s")
	require.False(t, ok)
}

// A subscriber that comes between the sweep's first look and its decision
// keeps the session: the decision is taken again under the bus lock.
func TestHubExpiryRacesSubscribe(t *testing.T) {
	clock := newHubClock()
	h := newTestHub(t, HubOptions{IdleTimeout: time.Minute, MaxSessions: 5000, Bus: Options{Now: clock.now}})
	const n = 2000
	buses := make([]*EventBus, n)
	for i := range buses {
		var err error
		buses[i], err = h.GetOrCreate("s" + strconv.Itoa(i))
		require.NoError(t, err)
	}
	clock.advance(time.Hour)
	subs := make([]*Subscription, n)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i, b := range buses {
			subs[i], _ = b.Subscribe(context.Background(), SubscribeOptions{})
		}
	})
	h.sweep()
	wg.Wait()
	for i, b := range buses {
		if b.closedOrZero() {
			// Expired first: its subscription is an ended one.
			_, open := subs[i].AppendReady(nil)
			assert.False(t, open)
			continue
		}
		assert.Equal(t, 1, b.SubscriberCount())
		_, ok := h.Lookup("s" + strconv.Itoa(i))
		assert.True(t, ok)
		subs[i].Close()
	}
}

func TestHubFullOfIdleSessionsAdmitsANewOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const idle = 8 * time.Second // the goroutine sweeps every second
		h := newTestHub(t, HubOptions{MaxSessions: 3, IdleTimeout: idle})
		time.Sleep(500 * time.Millisecond) // between two sweeps
		for _, id := range []string{"a", "b", "c"} {
			_, err := h.Publish(id, hubEvent(1))
			require.NoError(t, err)
		}
		_, err := h.GetOrCreate("d")
		require.ErrorIs(t, err, ErrHubFull, "none idle yet")
		b, _ := h.Lookup("b")
		s, err := b.Subscribe(t.Context(), SubscribeOptions{})
		require.NoError(t, err)
		// Past IdleTimeout, before the goroutine's next sweep: the full
		// GetOrCreate makes room itself.
		time.Sleep(idle + time.Millisecond)
		assert.Equal(t, 3, h.Len())
		_, err = h.GetOrCreate("d")
		require.NoError(t, err)
		_, ok := h.Lookup("b")
		assert.True(t, ok, "the subscribed session stays")
		assert.Equal(t, 2, h.Len())
		assert.Equal(t, uint64(2), h.Stats().Expired)
		s.Close()
		require.NoError(t, h.Close())
	})
}

// The hub's goroutine expires sessions by itself, and Close ends it.
func TestHubGoroutineExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, err := NewHub(HubOptions{IdleTimeout: time.Minute})
		require.NoError(t, err)
		_, err = h.Publish("s", hubEvent(1))
		require.NoError(t, err)
		time.Sleep(time.Minute - time.Millisecond)
		synctest.Wait()
		assert.Equal(t, 1, h.Len())
		time.Sleep(time.Minute/8 + time.Millisecond)
		synctest.Wait()
		assert.Zero(t, h.Len())
		require.NoError(t, h.Close())
		require.NoError(t, h.Close())
		_, err = h.GetOrCreate("s")
		require.ErrorIs(t, err, ErrClosed)
		// synctest.Test fails if the goroutine is still running.
	})
}

// hubWithQueued returns a hub whose session "s" has a subscriber with n
// events queued.
func hubWithQueued(t *testing.T, n int) (*Hub, *Subscription) {
	h, err := NewHub(HubOptions{})
	require.NoError(t, err)
	b, err := h.GetOrCreate("s")
	require.NoError(t, err)
	s, err := b.Subscribe(t.Context(), SubscribeOptions{})
	require.NoError(t, err)
	for i := range n {
		_, err := b.Publish(hubEvent(i))
		require.NoError(t, err)
	}
	return h, s
}

func TestHubShutdownDrains(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, s := hubWithQueued(t, 5)
		got := make(chan int)
		go func() {
			time.Sleep(time.Second) // a consumer that comes late
			n := 0
			for f := range s.Events() {
				if f.Terminal() {
					assert.Contains(t, string(f.JSON()), `"errorKind":"shutdown"`)
					continue
				}
				n++
			}
			got <- n
		}()
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		start := time.Now()
		require.NoError(t, h.Shutdown(ctx))
		assert.Less(t, time.Since(start), 2*time.Second)
		assert.Equal(t, 5, <-got, "every queued frame reached the consumer, then the shutdown frame")
		_, err := h.GetOrCreate("t")
		require.ErrorIs(t, err, ErrClosed)
		_, err = h.Publish("s", hubEvent(1))
		require.ErrorIs(t, err, ErrClosed)
		_, ok := h.Lookup("s")
		assert.False(t, ok)
	})
}

func TestHubShutdownRespectsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, s := hubWithQueued(t, 1)
		// Nobody reads s: Shutdown gives up at the deadline.
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		start := time.Now()
		require.ErrorIs(t, h.Shutdown(ctx), context.DeadlineExceeded)
		assert.Equal(t, 3*time.Second, time.Since(start).Round(10*time.Millisecond))
		fs, open := s.AppendReady(nil)
		assert.Empty(t, fs, "closed without drain")
		assert.False(t, open)
		require.NoError(t, h.Shutdown(t.Context()), "again: nothing left")
	})
}

func TestHubStatsSum(t *testing.T) {
	h := newTestHub(t, HubOptions{})
	var want Stats
	for i := range 5 {
		id := "s" + strconv.Itoa(i)
		for j := range i + 1 {
			_, err := h.Publish(id, hubEvent(j))
			require.NoError(t, err)
		}
		b, _ := h.Lookup(id)
		require.NoError(t, b.Signal("sig", "x"))
		_, err := b.Subscribe(t.Context(), SubscribeOptions{})
		require.NoError(t, err)
		want.add(b.Stats())
	}
	st := h.Stats()
	assert.Equal(t, want, st.Buses)
	assert.Equal(t, uint64(15), st.Buses.Published)
	assert.Equal(t, uint64(5), st.Buses.Signals)
	assert.Equal(t, 5, st.Buses.Subscribers)
	assert.Equal(t, 15, st.Buses.RingLen)
	held := 0
	for _, b := range h.Sessions() {
		for i := range b.ring.Len() {
			f := b.ring.at(i)
			held += len(f.wire) + len(f.typ) + frameOverhead + 2*(maxDigits-digits(f.id))
		}
	}
	assert.Equal(t, int64(held), st.RingBytes, "every byte of every frame")
	assert.Greater(t, st.RingBytes, int64(st.Buses.RingBytes))
	assert.Equal(t, st.RingBytes, h.budget.used.Load(), "the budget counts exactly the rings")
	assert.Equal(t, int64(DefaultMaxTotalBytes), st.MaxTotalBytes)
}

// Stats.add sums every field: a field added to Stats and forgotten there
// fails this test.
func TestStatsAddEveryField(t *testing.T) {
	var one Stats
	fillOnes(t, &one)
	var sum Stats
	sum.add(one)
	sum.add(one)
	var two Stats
	fillOnes(t, &two)
	two.add(one)
	assert.Equal(t, two, sum)
	assert.NotEqual(t, one, sum)
}

// fillOnes sets every numeric field of *s, nested ones too, to 1, through
// JSON so that no field can be missed.
func fillOnes(t *testing.T, s *Stats) {
	var m map[string]any
	require.NoError(t, json.Unmarshal(mustJSON(*s), &m))
	var set func(m map[string]any)
	set = func(m map[string]any) {
		for k, v := range m {
			if sub, ok := v.(map[string]any); ok {
				set(sub)
			} else {
				m[k] = 1
			}
		}
	}
	set(m)
	require.NoError(t, json.Unmarshal(mustJSON(m), s))
}

func TestHubLookupSession(t *testing.T) {
	h := newTestHub(t, HubOptions{})
	mux := http.NewServeMux()
	mux.Handle("GET /s/{id}/events", &Handler{Lookup: h.LookupSession})
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		req := httptest.NewRequest(method, "/s/nobody/events", nil)
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, req)
		assert.Equal(t, http.StatusNotFound, w.Code, method)
		if method == http.MethodGet {
			assert.Contains(t, w.Body.String(), "session_not_found")
		}
	}
	assert.Zero(t, h.Len(), "a GET or HEAD never creates a session")
	r := httptest.NewRequest("GET", "/", nil)
	_, err := h.LookupSession(r, "nobody")
	assert.ErrorIs(t, err, ErrSessionNotFound)
	// A route without {id}: the empty id, which no session has.
	_, err = h.LookupSession(r, "")
	assert.ErrorIs(t, err, ErrInvalidSessionID)
}

// A resume across an idle expiry gets epoch_reset: through the Handler,
// with epoch ids, with Event-Epoch, and with a bare id past the new bus.
func TestHubResumeAcrossExpiryIsEpochReset(t *testing.T) {
	clock := newHubClock()
	h := newTestHub(t, HubOptions{IdleTimeout: time.Minute, Bus: Options{Now: clock.now}})
	mux := http.NewServeMux()
	mux.Handle("GET /s/{id}/events", &Handler{Lookup: h.LookupSession})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	url := srv.URL + "/s/x/events"

	for i := range 3 {
		_, err := h.Publish("x", hubEvent(i))
		require.NoError(t, err)
	}
	old, _ := h.Lookup("x")
	oldEpoch := old.Epoch()
	fs := hubStream(t, url, http.Header{"Last-Event-Id": {oldEpoch + ":1"}}, TypeReplayComplete)
	require.Len(t, fs, 3)
	assert.Equal(t, oldEpoch+":3", fs[1].ID)

	// The handler ends its subscription once it sees the client gone.
	require.Eventually(t, func() bool { return old.SubscriberCount() == 0 }, 10*time.Second, time.Millisecond)
	clock.advance(time.Minute)
	h.sweep()
	require.Zero(t, h.Len())
	_, err := h.Publish("x", hubEvent(9)) // the session exists again
	require.NoError(t, err)
	nb, _ := h.Lookup("x")
	require.NotEqual(t, oldEpoch, nb.Epoch())

	for name, hdr := range map[string]http.Header{
		"epoch id":    {"Last-Event-Id": {oldEpoch + ":3"}},
		"Event-Epoch": {"Last-Event-Id": {"3"}, "Event-Epoch": {oldEpoch}},
	} {
		fs := hubStream(t, url, hdr, TypeReplayComplete)
		require.Equal(t, TypeStateResyncRequired, fs[0].Type, name)
		assert.Contains(t, fs[0].Data, `"reason":"epoch_reset","detail":"epoch_mismatch"`, name)
		assert.Contains(t, fs[0].Data, `"epoch":"`+nb.Epoch()+`"`, name)
	}
	fs = hubStream(t, url, http.Header{"Last-Event-Id": {"3"}}, TypeReplayComplete)
	require.Equal(t, TypeStateResyncRequired, fs[0].Type)
	assert.Contains(t, fs[0].Data, `"reason":"epoch_reset"`, "a cursor past the new bus's last id")
}

func TestHubPublishRetriesOnAnExpiredBus(t *testing.T) {
	h := newTestHub(t, HubOptions{})
	b, err := h.GetOrCreate("s")
	require.NoError(t, err)
	// Closed under the hub's feet, still in the map: Publish goes to a new
	// bus.
	require.NoError(t, b.Close())
	f, err := h.Publish("s", hubEvent(1))
	require.NoError(t, err)
	assert.Equal(t, uint64(1), f.ID())
	nb, ok := h.Lookup("s")
	require.True(t, ok)
	assert.NotSame(t, b, nb)
	assert.Equal(t, uint64(1), nb.LastEventID())
	require.True(t, errors.Is(b.Signal("x", "y"), ErrClosed))
}

// A GetOrCreate racing Close either fails with ErrClosed or returns a bus
// that Close closed: nothing is left open behind a closed hub.
func TestHubCloseRacesGetOrCreate(t *testing.T) {
	for range 20 {
		h, err := NewHub(HubOptions{})
		require.NoError(t, err)
		var mu sync.Mutex
		var got []*EventBus
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for i := range 200 {
					b, err := h.GetOrCreate("g" + strconv.Itoa(g) + "-" + strconv.Itoa(i))
					if err != nil {
						assert.ErrorIs(t, err, ErrClosed)
						return
					}
					mu.Lock()
					got = append(got, b)
					mu.Unlock()
				}
			})
		}
		require.NoError(t, h.Close())
		wg.Wait()
		for _, b := range got {
			assert.True(t, b.closedOrZero())
		}
		assert.Zero(t, h.Len())
	}
}

// The publish path of one session takes no hub-wide lock: with another
// session's bus lock, the budget's trim lock and the sweep lock held, and
// every shard read-locked, Hub.Publish and Lookup of a session still go
// through.
func TestHubPublishTakesNoHubWideLock(t *testing.T) {
	h := newTestHub(t, HubOptions{})
	_, err := h.Publish("a", hubEvent(1))
	require.NoError(t, err)
	_, err = h.Publish("b", hubEvent(1))
	require.NoError(t, err)
	a, _ := h.Lookup("a")
	a.mu.Lock()
	h.budget.mu.Lock()
	h.sweepMu.Lock()
	for i := range h.shards {
		h.shards[i].mu.RLock()
	}
	done := make(chan error)
	go func() {
		_, err := h.Publish("b", hubEvent(2))
		if _, ok := h.Lookup("b"); !ok {
			err = errors.New("lookup failed")
		}
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Hub.Publish waited for a lock of another session or of the hub")
	}
	for i := range h.shards {
		h.shards[i].mu.RUnlock()
	}
	h.sweepMu.Unlock()
	h.budget.mu.Unlock()
	a.mu.Unlock()
}

// The summed counters cover the sessions that ended too, and never go down
// while sessions come and go (a Prometheus counter must not).
func TestHubStatsCountersNeverGoDown(t *testing.T) {
	clock := newHubClock()
	h := newTestHub(t, HubOptions{IdleTimeout: time.Minute, Bus: Options{Now: clock.now}})
	const n = 3000
	stop := make(chan struct{})
	var watched sync.WaitGroup
	watched.Go(func() {
		last := uint64(0)
		for {
			select {
			case <-stop:
				return
			default:
			}
			p := h.Stats().Buses.Published
			if p < last {
				t.Errorf("Published went down: %d after %d", p, last)
				return
			}
			last = p
		}
	})
	for i := range n {
		id := "s" + strconv.Itoa(i%50)
		_, err := h.Publish(id, hubEvent(i))
		require.NoError(t, err)
		switch i % 7 {
		case 0:
			h.Delete(id)
		case 3:
			clock.advance(time.Minute)
			h.sweep()
		}
	}
	close(stop)
	watched.Wait()
	st := h.Stats()
	assert.Equal(t, uint64(n), st.Buses.Published)
	assert.Positive(t, st.Expired)
	assert.Positive(t, st.Deleted)
	require.NoError(t, h.Close())
	after := h.Stats()
	assert.Equal(t, uint64(n), after.Buses.Published, "after Close too")
	assert.Zero(t, after.Buses.RingLen, "current values: live buses only")
	assert.Zero(t, after.Sessions)
}

// A full hub of busy sessions answers ErrHubFull without scanning the
// sessions again until one can have become idle past IdleTimeout; then it
// admits a new session at once.
func TestHubFullSweepsOnlyWhenSomethingCanHaveExpired(t *testing.T) {
	clock := newHubClock()
	h := newTestHub(t, HubOptions{MaxSessions: 2, IdleTimeout: time.Minute, Bus: Options{Now: clock.now}})
	var subs []*Subscription
	for _, id := range []string{"a", "b"} {
		b, err := h.GetOrCreate(id)
		require.NoError(t, err)
		subs = append(subs, subscribe(t, b, SubscribeOptions{}))
	}
	_, err := h.GetOrCreate("c")
	require.ErrorIs(t, err, ErrHubFull)
	assert.Equal(t, clock.ms.Load()+time.Minute.Milliseconds(), h.nextEligible.Load(), "nothing can expire for a minute")

	clock.advance(10 * time.Second)
	subs[0].Close() // a is idle from now: eligible in a minute
	clock.advance(time.Minute - time.Millisecond)
	_, err = h.GetOrCreate("c")
	require.ErrorIs(t, err, ErrHubFull)
	clock.advance(time.Millisecond)
	_, err = h.GetOrCreate("c")
	require.NoError(t, err, "a expired, c took its place")
	_, ok := h.Lookup("a")
	assert.False(t, ok)
	assert.Equal(t, uint64(2), h.Stats().Refused)
}

// ---------------------------------------------------------------------------
// Age retention and the hub's lifecycle over many sessions.

// A publish drops what aged meanwhile, and a quiet session's ring is
// emptied by the hub's sweep.
func TestMaxAgeAtPublishAndSweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, err := NewHub(HubOptions{IdleTimeout: time.Hour, Bus: Options{MaxAge: 10 * time.Second}})
		require.NoError(t, err)
		defer h.Close()
		_, err = h.Publish("s", hubEvent(1))
		require.NoError(t, err)
		time.Sleep(11 * time.Second)
		_, err = h.Publish("s", hubEvent(2))
		require.NoError(t, err)
		b, _ := h.Lookup("s")
		assert.Equal(t, 1, b.Stats().RingLen, "the publish dropped the aged event")
		b.mu.Lock()
		assert.Equal(t, uint64(2), b.ring.firstID())
		b.mu.Unlock()
		time.Sleep(12 * time.Second) // the sweep, every 1.25s, drops id 2
		synctest.Wait()
		assert.Zero(t, b.Stats().RingLen)
		assert.Zero(t, h.Stats().RingBytes)
		assert.Zero(t, h.budget.used.Load(), "aged bytes go back to the budget")
		assert.Equal(t, 1, h.Len(), "age retention does not expire the session")
	})
}

// The check: 100,000 sessions created and expired leave no
// goroutine and no memory behind.
func TestHubCreateExpireCyclesLeaveNothing(t *testing.T) {
	rounds, perRound := pick(10, 100, 1000), 1000
	clock := newHubClock()
	h := newTestHub(t, HubOptions{MaxSessions: perRound, IdleTimeout: time.Minute, Bus: Options{Now: clock.now}})
	cycle := func(round int) {
		for i := range perRound {
			id := "r" + strconv.Itoa(round) + "s" + strconv.Itoa(i)
			_, err := h.Publish(id, hubEvent(i))
			require.NoError(t, err)
			if i%10 == 0 {
				b, _ := h.Lookup(id)
				s, err := b.Subscribe(t.Context(), SubscribeOptions{Resume: true})
				require.NoError(t, err)
				s.Close()
			}
		}
		require.Equal(t, perRound, h.Len())
		clock.advance(time.Minute)
		h.sweep()
		require.Zero(t, h.Len())
	}
	cycle(0) // warm up: maps and pools at their size
	goroutines := runtime.NumGoroutine()
	base := liveHeap()
	for r := 1; r < rounds; r++ {
		cycle(r)
	}
	heap := liveHeap()
	st := h.Stats()
	t.Logf("%d sessions created and expired: live heap %+.2f MiB after GC (from %.2f MiB), goroutines %d -> %d",
		st.Expired, (float64(heap)-float64(base))/(1<<20), float64(base)/(1<<20), goroutines, runtime.NumGoroutine())
	assert.Equal(t, uint64(rounds*perRound), st.Expired)
	assert.Equal(t, uint64(rounds*perRound), st.Created)
	assert.Zero(t, st.RingBytes)
	assert.Zero(t, h.budget.used.Load())
	assert.LessOrEqual(t, runtime.NumGoroutine(), goroutines)
	assert.Less(t, float64(heap), float64(base)+1<<20, "no memory left behind")
}

// ---------------------------------------------------------------------------
// A shutdown says so (issue 22, point 4): every stream of a bus closed by
// CloseForShutdown, Hub.Shutdown or Hub.Close gets what was queued, then
// one stream_error {"errorKind":"shutdown","retryAfter":ms}; a client that
// never reads holds Hub.Shutdown until its deadline, and nobody else.

func TestHubShutdownAndCloseSendTheShutdownFrame(t *testing.T) {
	_, err := NewHub(HubOptions{ShutdownRetryAfter: -time.Second})
	require.ErrorIs(t, err, ErrInvalidOption)

	for _, how := range []string{"Shutdown", "Close"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h, err := NewHub(HubOptions{Bus: Options{Now: testNow}, ShutdownRetryAfter: 750 * time.Millisecond})
				require.NoError(t, err)
				var subs []*Subscription
				for i, id := range []string{"a", "b"} {
					b, err := h.GetOrCreate(id)
					require.NoError(t, err)
					subs = append(subs, subscribe(t, b, SubscribeOptions{}))
					publishNumbered(t, b, i+1)
				}
				deleted, err := h.GetOrCreate("deleted")
				require.NoError(t, err)
				gone := subscribe(t, deleted, SubscribeOptions{})
				require.True(t, h.Delete("deleted"))
				assert.Empty(t, collectEvents(gone), "a DELETE is no shutdown: a plain end")

				got := make(chan [][]Frame)
				go func() {
					var all [][]Frame
					for _, s := range subs {
						all = append(all, collectEvents(s))
					}
					got <- all
				}()
				start := time.Now()
				if how == "Shutdown" {
					require.NoError(t, h.Shutdown(t.Context()))
				} else {
					require.NoError(t, h.Close())
				}
				all := <-got
				assert.LessOrEqual(t, time.Since(start), 5*time.Millisecond, "at most one poll of Shutdown's for consumers that read")
				for i, fs := range all {
					require.Len(t, fs, i+2, "session %d: its events, then the shutdown frame", i)
					assert.Equal(t, idRange(1, uint64(i+1)), describe(fs[:i+1]))
					assert.Equal(t, wantSynth(TypeStreamError, shutdownData(750), "").Data, string(fs[i+1].JSON()))
				}
			})
		})
	}
}

// pipeHTTP serves h with an http.Server (HTTP/1.1 and h2c) on an in-memory
// listener of the current synctest bubble and returns the listener and a
// client of it that speaks HTTP/1.1, or h2c with h2c set. The caller ends
// the server.
func pipeHTTP(h http.Handler, h2c bool) (*pipenet.Listener, *http.Server, *http.Client, <-chan struct{}) {
	ln := pipenet.Listen()
	var sp, cp http.Protocols
	sp.SetHTTP1(true)
	sp.SetUnencryptedHTTP2(true)
	if h2c {
		cp.SetUnencryptedHTTP2(true)
	} else {
		cp.SetHTTP1(true)
	}
	srv := &http.Server{Handler: h, Protocols: &sp, ErrorLog: slog.NewLogLogger(slog.DiscardHandler, slog.LevelError)}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	return ln, srv, &http.Client{Transport: &http.Transport{Protocols: &cp, DialContext: ln.DialContext}}, served
}

// timedStream is one stream read on a goroutine of the bubble: its records
// and the fake time each arrived at, then the end.
type timedStream struct {
	mu   sync.Mutex
	recs []sseRecord
	at   []time.Time
	err  error
	done chan struct{}
}

func readTimed(t *testing.T, client *http.Client, url string) *timedStream {
	t.Helper()
	resp, err := client.Get(url)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ts := &timedStream{done: make(chan struct{})}
	go func() {
		defer close(ts.done)
		defer resp.Body.Close()
		r := newSSEReader(resp.Body)
		for {
			rec, err := r.next()
			ts.mu.Lock()
			if err != nil {
				ts.err = err
				ts.mu.Unlock()
				return
			}
			ts.recs = append(ts.recs, rec)
			ts.at = append(ts.at, time.Now())
			ts.mu.Unlock()
		}
	}()
	return ts
}

// neverReads opens the stream of session s on a raw connection that sends
// the request and never reads: the handler blocks in its first flush.
func neverReads(t *testing.T, ln *pipenet.Listener, path string) net.Conn {
	t.Helper()
	c, err := ln.DialContext(t.Context(), "", "")
	require.NoError(t, err)
	_, err = io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: pipe\r\n\r\n")
	require.NoError(t, err)
	return c
}

// Through the Handler, on HTTP/1.1 and h2c: three reading streams get their
// queued events and the shutdown frame at once; a fourth client that never
// reads holds Hub.Shutdown to its deadline, and closing the server then
// ends its handler.
func TestHandlerHubShutdown(t *testing.T) {
	for _, h2c := range []bool{false, true} {
		t.Run(map[bool]string{false: "HTTP/1.1", true: "h2c"}[h2c], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				hub, err := NewHub(HubOptions{Bus: Options{Now: testNow}, ShutdownRetryAfter: 3 * time.Second})
				require.NoError(t, err)
				bus, err := hub.GetOrCreate("s")
				require.NoError(t, err)
				mux := http.NewServeMux()
				mux.Handle("GET /session/{id}/events", &Handler{Lookup: hub.LookupSession, RetryJitter: -1, WriteTimeout: time.Minute, BareIDs: true})
				ln, srv, client, served := pipeHTTP(mux, h2c)
				defer func() {
					client.CloseIdleConnections()
					_ = srv.Close()
					<-served
				}()
				var readers []*timedStream
				for range 3 {
					readers = append(readers, readTimed(t, client, "http://pipe/session/s/events"))
				}
				stuck := neverReads(t, ln, "/session/s/events")
				defer stuck.Close()
				synctest.Wait()
				require.Equal(t, 4, bus.SubscriberCount())
				publishN(t, bus, 5)

				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				start := time.Now()
				shut := make(chan error, 1)
				go func() { shut <- hub.Shutdown(ctx) }()
				synctest.Wait()
				want := []sseRecord{{Kind: sseRetryRecord, Retry: 3000}}
				for i := uint64(1); i <= 5; i++ {
					want = append(want, sseRecord{Kind: sseEventRecord, Event: wantEvent(i)})
				}
				want = append(want, sseRecord{Kind: sseEventRecord, Event: wantSynth(TypeStreamError, shutdownData(3000), "5")})
				for i, r := range readers {
					<-r.done // ended already: the wait returns at once
					assert.Equal(t, want, r.recs, "reader %d", i)
					assert.Equal(t, io.EOF, r.err, "reader %d: a clean end after the frame", i)
					assert.Equal(t, start, r.at[len(r.at)-1], "reader %d: at once", i)
				}
				select {
				case err := <-shut:
					t.Fatalf("Shutdown returned %v with a client that never read", err)
				default:
				}

				require.ErrorIs(t, <-shut, context.DeadlineExceeded)
				assert.Equal(t, 10*time.Second, time.Since(start), "held by the one that never reads, to the bound")
				// What a daemon does at the bound: close the connections.
				// The handler blocked writing to it returns (the deferred
				// server end waits for its goroutines: synctest would
				// report one that stayed).
				require.NoError(t, srv.Close())
				synctest.Wait()
				assert.Equal(t, 10*time.Second, time.Since(start))
			})
		})
	}
}

// A Hub's Delete ends the session's single streams after what was queued
// with stream_error closed (the session is gone: a client must not take it
// for a cut); a Shutdown's frame is shutdown (TestHandlerHubShutdown).
func TestHandlerHubDeleteSaysClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hub, err := NewHub(HubOptions{Bus: Options{Now: testNow}})
		require.NoError(t, err)
		defer hub.Close()
		bus, err := hub.GetOrCreate("s")
		require.NoError(t, err)
		mux := http.NewServeMux()
		mux.Handle("GET /session/{id}/events", &Handler{Lookup: hub.LookupSession, RetryJitter: -1, BareIDs: true})
		_, srv, client, served := pipeHTTP(mux, false)
		defer func() {
			client.CloseIdleConnections()
			_ = srv.Close()
			<-served
		}()
		r := readTimed(t, client, "http://pipe/session/s/events")
		synctest.Wait()
		publishN(t, bus, 2)
		require.True(t, hub.Delete("s"))
		<-r.done
		want := []sseRecord{{Kind: sseRetryRecord, Retry: 3000},
			{Kind: sseEventRecord, Event: wantEvent(1)}, {Kind: sseEventRecord, Event: wantEvent(2)},
			{Kind: sseEventRecord, Event: wantSynth(TypeStreamError, `{"error":"session closed","errorKind":"closed"}`, "2")}}
		require.Equal(t, want, r.recs)
		require.Equal(t, io.EOF, r.err)
	})
}
