package eventbus

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Idempotent publish on a Hub (hub_idempotency.go): the rules of
// docs/SPEC.md section 8.3 as the in-memory daemon applies them, and the
// records' place in the byte budget (section 7).

// idemKey is a key of 36 bytes, as a UUID is.
func idemKey(session, i int) string {
	return fmt.Sprintf("%08d-0000-4000-8000-%012d", session, i)
}

// keysCost sums what the budget counts for keys.
func keysCost(keys ...string) int64 {
	var sum int64
	for _, k := range keys {
		sum += idemCost(k)
	}
	return sum
}

// remembers reports whether session id holds a record of key.
func remembers(h *Hub, id, key string) bool {
	s := h.lookupSession(id)
	if s == nil {
		return false
	}
	s.idem.mu.Lock()
	defer s.idem.mu.Unlock()
	return s.idem.findLocked(key, maphash.String(h.seed, key)) != nil
}

// lookupSession returns the live session id, or nil.
func (h *Hub) lookupSession(id string) *hubSession {
	sh := h.shard(id)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	if s := sh.m[id]; s != nil && !s.bus.isClosed.Load() {
		return s
	}
	return nil
}

func TestHubPublishIdempotent(t *testing.T) {
	h := newTestHub(t, HubOptions{})
	id, epoch, dup, err := h.PublishIdempotent("s", "k", hubEvent(1))
	require.NoError(t, err)
	require.False(t, dup)
	require.Equal(t, uint64(1), id)
	b, ok := h.Lookup("s")
	require.True(t, ok)
	require.Equal(t, b.Epoch(), epoch)

	// The same event again (its serverTimestamp may differ): the first id,
	// nothing appended.
	again := hubEvent(1)
	again.Meta = map[string]any{"serverTimestamp": 12345}
	id, epoch2, dup, err := h.PublishIdempotent("s", "k", again)
	require.NoError(t, err)
	assert.True(t, dup)
	assert.Equal(t, uint64(1), id)
	assert.Equal(t, epoch, epoch2)
	assert.Equal(t, uint64(1), b.LastEventID())

	// Another event with the key: refused, nothing appended.
	_, _, _, err = h.PublishIdempotent("s", "k", hubEvent(2))
	require.ErrorIs(t, err, ErrIdempotencyKeyReused)
	assert.True(t, strings.HasPrefix(err.Error(), "eventbus: "), err.Error())
	assert.Contains(t, err.Error(), "first publish has id 1")
	assert.Equal(t, uint64(1), b.LastEventID())

	// Keys are per session, and a plain Publish records nothing.
	id, _, dup, err = h.PublishIdempotent("t", "k", hubEvent(2))
	require.NoError(t, err)
	assert.False(t, dup)
	assert.Equal(t, uint64(1), id)
	f, err := h.Publish("s", hubEvent(3))
	require.NoError(t, err)
	id, _, dup, err = h.PublishIdempotent("s", "k2", hubEvent(3))
	require.NoError(t, err)
	assert.False(t, dup)
	assert.Equal(t, f.ID()+1, id)
	assert.Equal(t, 3, h.Stats().IdempotencyKeys)

	// Refusals create nothing and record nothing.
	for _, c := range []struct {
		id, key string
		e       Event
		want    error
	}{
		{"new", "", hubEvent(1), ErrInvalidIdempotencyKey},
		{"new", "k\n", hubEvent(1), ErrInvalidIdempotencyKey},
		{"new", strings.Repeat("k", MaxIdempotencyKeyBytes+1), hubEvent(1), ErrInvalidIdempotencyKey},
		{"new", "k", Event{Type: ""}, ErrInvalidEvent},
		{"new", "k", Event{Type: "client_evicted"}, ErrInvalidEvent},
		{"new", "k", Event{Type: "t", Data: sizedData(DefaultMaxEventBytes + 1)}, ErrEventTooLarge},
		{"a\xff", "k", hubEvent(1), ErrInvalidSessionID},
		{"", "k", hubEvent(1), ErrInvalidSessionID},
	} {
		_, _, _, err := h.PublishIdempotent(c.id, c.key, c.e)
		require.ErrorIs(t, err, c.want, "%q %q", c.id, c.key)
		assert.True(t, strings.HasPrefix(err.Error(), "eventbus: "), err.Error())
	}
	_, ok = h.Lookup("new")
	assert.False(t, ok, "a refused publish created its session")
	assert.Equal(t, 2, h.Len())
	assert.Equal(t, 3, h.Stats().IdempotencyKeys)

	// A closed hub.
	require.NoError(t, h.Close())
	_, _, _, err = h.PublishIdempotent("s", "k", hubEvent(1))
	require.ErrorIs(t, err, ErrClosed)
}

func TestHubIdempotencyOptions(t *testing.T) {
	for _, o := range []HubOptions{{IdempotencyWindow: -time.Second}, {MaxIdempotencyKeys: -1}} {
		_, err := NewHub(o)
		require.ErrorIs(t, err, ErrInvalidOption)
		assert.True(t, strings.HasPrefix(err.Error(), "eventbus: "), err.Error())
	}
	h := newTestHub(t, HubOptions{})
	assert.Equal(t, DefaultIdempotencyWindow.Milliseconds(), h.idemWindow)
	assert.Equal(t, DefaultMaxIdempotencyKeys, h.idemMax)
	assert.Equal(t, 10*time.Minute, DefaultIdempotencyWindow)
	assert.Equal(t, 256, DefaultMaxIdempotencyKeys)
}

// A key is remembered for the window from its first publish, on the
// session's clock; the sweep forgets it past the window even when the
// session is never published to again.
func TestHubIdempotencyWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, err := NewHub(HubOptions{IdempotencyWindow: time.Minute})
		require.NoError(t, err)
		defer h.Close()
		id, _, _, err := h.PublishIdempotent("s", "k", hubEvent(1))
		require.NoError(t, err)
		require.Equal(t, uint64(1), id)
		time.Sleep(time.Minute - time.Millisecond)
		id, _, dup, err := h.PublishIdempotent("s", "k", hubEvent(1))
		require.NoError(t, err)
		assert.True(t, dup, "forgotten within the window")
		assert.Equal(t, uint64(1), id)
		time.Sleep(time.Millisecond) // the window, from the first publish
		id, _, dup, err = h.PublishIdempotent("s", "k", hubEvent(1))
		require.NoError(t, err)
		assert.False(t, dup, "remembered past the window")
		assert.Equal(t, uint64(2), id)
		// Past the window, the event could be another one: a new record.
		_, _, dup, err = h.PublishIdempotent("s", "k", hubEvent(1))
		require.NoError(t, err)
		assert.True(t, dup)

		// Nobody publishes to s again, and a subscriber keeps it from
		// expiring: the sweep forgets the key past its window.
		b, _ := h.Lookup("s")
		sub, err := b.Subscribe(t.Context(), SubscribeOptions{})
		require.NoError(t, err)
		defer sub.Close()
		require.Equal(t, 1, h.Stats().IdempotencyKeys)
		time.Sleep(time.Minute + 2*h.sweepPeriod(DefaultIdleTimeout))
		synctest.Wait()
		st := h.Stats()
		assert.Zero(t, st.IdempotencyKeys)
		assert.Zero(t, st.IdempotencyBytes)
		assert.Equal(t, st.RingBytes, h.budget.used.Load())
	})
}

// At most MaxIdempotencyKeys keys a session; the oldest goes first, and
// what it cost goes back to the budget.
func TestHubIdempotencyCap(t *testing.T) {
	h := newTestHub(t, HubOptions{MaxIdempotencyKeys: 3})
	keys := []string{"a", "bb", "ccc", "dddd"}
	for i, k := range keys {
		_, _, _, err := h.PublishIdempotent("s", k, hubEvent(i))
		require.NoError(t, err)
	}
	st := h.Stats()
	assert.Equal(t, 3, st.IdempotencyKeys)
	assert.Equal(t, keysCost(keys[1:]...), st.IdempotencyBytes)
	assert.Equal(t, st.RingBytes+st.IdempotencyBytes, h.budget.used.Load())
	assert.False(t, remembers(h, "s", "a"))
	id, _, dup, err := h.PublishIdempotent("s", "dddd", hubEvent(3))
	require.NoError(t, err)
	assert.True(t, dup)
	assert.Equal(t, uint64(4), id)
	id, _, dup, err = h.PublishIdempotent("s", "a", hubEvent(0))
	require.NoError(t, err)
	assert.False(t, dup, "the oldest key was not forgotten")
	assert.Equal(t, uint64(5), id)
	assert.False(t, remembers(h, "s", "bb"))
}

// Concurrent publishes with one key append once and all answer its id.
func TestHubIdempotencyConcurrent(t *testing.T) {
	h := newTestHub(t, HubOptions{})
	const n = 16
	var wg sync.WaitGroup
	ids := make([]uint64, n)
	dups := make([]bool, n)
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			ids[i], _, dups[i], errs[i] = h.PublishIdempotent("s", "k", hubEvent(7))
		})
	}
	close(start)
	wg.Wait()
	firsts := 0
	for i := range n {
		require.NoError(t, errs[i])
		assert.Equal(t, uint64(1), ids[i])
		if !dups[i] {
			firsts++
		}
	}
	assert.Equal(t, 1, firsts)
	b, _ := h.Lookup("s")
	assert.Equal(t, uint64(1), b.Stats().Published)
}

// A new bus of the session forgets its keys, whichever way the old one
// ended, and gives their bytes back.
func TestHubIdempotencyNewBusForgets(t *testing.T) {
	clock := newHubClock()
	h := newTestHub(t, HubOptions{IdleTimeout: time.Minute, Bus: Options{Now: clock.now}})
	ends := []struct {
		name string
		end  func(b *EventBus)
	}{
		{"Delete", func(*EventBus) { require.True(t, h.Delete("s")) }},
		{"owner Close", func(b *EventBus) { require.NoError(t, b.Close()) }},
		{"CloseWithError", func(b *EventBus) { b.closeWithError(ErrorKindUnavailable, "gone") }},
		{"idle expiry", func(*EventBus) {
			clock.advance(2 * time.Minute)
			h.sweep()
			_, ok := h.Lookup("s")
			require.False(t, ok)
		}},
	}
	for _, c := range ends {
		id, epoch, dup, err := h.PublishIdempotent("s", "k", hubEvent(1))
		require.NoError(t, err, c.name)
		require.False(t, dup, c.name)
		require.Equal(t, uint64(1), id, c.name)
		b, _ := h.Lookup("s")
		require.Equal(t, epoch, b.Epoch())
		require.Greater(t, h.Stats().IdempotencyBytes, int64(0))
		c.end(b)
		assert.Zero(t, h.budget.used.Load(), c.name)
		assert.Zero(t, h.budget.records.Load(), c.name)
		// The next publish starts a new bus, which has never seen k.
		id, epoch2, dup, err := h.PublishIdempotent("s", "k", hubEvent(1))
		require.NoError(t, err, c.name)
		assert.False(t, dup, c.name)
		assert.Equal(t, uint64(1), id, c.name)
		assert.NotEqual(t, epoch, epoch2, c.name)
		require.True(t, h.Delete("s"))
	}
	// Shutdown and Close give everything back.
	for i := range 10 {
		_, _, _, err := h.PublishIdempotent("s"+strconv.Itoa(i), "k", hubEvent(i))
		require.NoError(t, err)
	}
	require.Equal(t, 10, h.Stats().IdempotencyKeys)
	require.NoError(t, h.Shutdown(t.Context()))
	assert.Zero(t, h.budget.used.Load())
	assert.Zero(t, h.budget.records.Load())
	assert.Zero(t, h.Stats().IdempotencyKeys)
}

// Each record counts idemCost in the budget's used from its publish to
// its forgetting: Stats says so, and Delete gives everything back.
func TestHubIdempotencyBudgetAccounting(t *testing.T) {
	h := newTestHub(t, HubOptions{MaxIdempotencyKeys: 1000})
	assert.Equal(t, int64(128+16), idemCost("k"))
	assert.Equal(t, int64(128+48), idemCost(idemKey(0, 0)))
	assert.Equal(t, int64(128+256), idemCost(strings.Repeat("k", MaxIdempotencyKeyBytes)))
	var keys []string
	for i := range 300 { // past idemLinear, so that the index is made, grown and shrunk
		k := strconv.Itoa(i) + "-" + strings.Repeat("x", i%40)
		before := h.budget.used.Load()
		ring := h.Stats().RingBytes
		_, _, dup, err := h.PublishIdempotent("s", k, hubEvent(i))
		require.NoError(t, err)
		if dup {
			continue
		}
		keys = append(keys, k)
		st := h.Stats()
		require.Equal(t, idemCost(k), h.budget.used.Load()-before-(st.RingBytes-ring), "publish %d", i)
		require.Equal(t, keysCost(keys...), st.IdempotencyBytes)
		require.Equal(t, len(keys), st.IdempotencyKeys)
		require.Equal(t, st.RingBytes+st.IdempotencyBytes, h.budget.used.Load())
		require.Equal(t, ringsHeld(h), st.RingBytes)
	}
	// A duplicate and a reused key cost nothing.
	used := h.budget.used.Load()
	_, _, dup, err := h.PublishIdempotent("s", keys[len(keys)-1], hubEvent(299))
	require.NoError(t, err)
	require.True(t, dup)
	_, _, _, err = h.PublishIdempotent("s", keys[len(keys)-1], hubEvent(-1))
	require.ErrorIs(t, err, ErrIdempotencyKeyReused)
	assert.Equal(t, used, h.budget.used.Load())
	// Nor does a publish that fails on the bus: a bus closed under it.
	b, _ := h.Lookup("s")
	require.True(t, h.Delete("s"))
	assert.Zero(t, h.budget.used.Load())
	assert.Zero(t, h.Stats().IdempotencyBytes)
	s := b.owner.(*hubSession)
	_, _, err = s.publishIdempotent("k", [16]byte{}, hubEvent(1))
	require.ErrorIs(t, err, ErrClosed)
	assert.Zero(t, h.budget.used.Load())
}

// Records press on the budget as rings do: the rings are trimmed first,
// largest first; when they are empty and the records alone keep the
// budget over, the oldest records of the session holding the most go.
// Through it all, rings plus records stay within MaxTotalBytes.
func TestHubIdempotencyRecordsPressTheBudget(t *testing.T) {
	const budgetBytes = 64 << 10
	h := newTestHub(t, HubOptions{MaxTotalBytes: budgetBytes, MaxIdempotencyKeys: 1 << 20, Bus: Options{MaxEventBytes: 4 << 10}})
	check := func(what string) HubStats {
		t.Helper()
		st := h.Stats()
		require.LessOrEqual(t, st.RingBytes+st.IdempotencyBytes, int64(budgetBytes), what)
		require.Equal(t, st.RingBytes+st.IdempotencyBytes, h.budget.used.Load(), what)
		require.Equal(t, ringsHeld(h), st.RingBytes, what)
		return st
	}
	// Rings of plain publishes, about half the budget.
	for i := range 40 {
		_, err := h.Publish("r"+strconv.Itoa(i%4), Event{Type: "t", Data: sizedData(600)})
		require.NoError(t, err)
	}
	st := check("rings")
	require.Greater(t, st.RingBytes, int64(budgetBytes/3))
	require.Zero(t, st.BudgetTrimmed)

	// Records of 255-byte keys (384 bytes each), twice as many on a as on
	// b, each with a small event.
	key := func(s string, i int) string { return fmt.Sprintf("%s-%0253d", s, i) }
	published := map[string]int{}
	forgotten := false
	for i := 0; i < 600; i++ {
		s := "a"
		if i%3 == 2 {
			s = "b"
		}
		_, _, dup, err := h.PublishIdempotent(s, key(s, published[s]), hubEvent(i))
		require.NoError(t, err)
		require.False(t, dup)
		published[s]++
		st := check("record " + strconv.Itoa(i))
		if !forgotten && st.IdempotencyKeys < published["a"]+published["b"] {
			forgotten = true
			// The first records forgotten: every ring of plain events was
			// emptied before, and the forgotten are a's oldest.
			for r := range 4 {
				b, _ := h.Lookup("r" + strconv.Itoa(r))
				assert.Zero(t, b.Stats().RingLen, "ring r%d still holds events while records are forgotten", r)
			}
			assert.Positive(t, st.BudgetTrimmed)
			assert.False(t, remembers(h, "a", key("a", 0)))
			assert.True(t, remembers(h, "b", key("b", 0)), "b's records went before a's, which holds more")
			assert.True(t, remembers(h, "a", key("a", published["a"]-1)))
		}
	}
	require.True(t, forgotten, "the records never pressed the budget")
	st = check("end")
	assert.Greater(t, st.IdempotencyBytes, int64(budgetBytes/2), "the records hold most of the budget")
	// The newest records of each session are remembered, the oldest not.
	for _, s := range []string{"a", "b"} {
		assert.True(t, remembers(h, s, key(s, published[s]-1)))
		assert.False(t, remembers(h, s, key(s, 0)))
	}
	t.Logf("rings %d + records %d (%d keys) of %d; %d events trimmed", st.RingBytes, st.IdempotencyBytes, st.IdempotencyKeys, budgetBytes, st.BudgetTrimmed)
	h.Delete("a")
	h.Delete("b")
	st = check("deleted")
	assert.Zero(t, st.IdempotencyBytes)
}

// Many publishers, keyed and not, with Deletes among them: once they
// stop, the budget's count is exact, and Close gives every byte back.
func TestHubIdempotencyConcurrentAccounting(t *testing.T) {
	h := newTestHub(t, HubOptions{MaxTotalBytes: 256 << 10, MaxIdempotencyKeys: 50, Bus: Options{MaxEventBytes: 4 << 10}})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range pick(300, 2000, 5000) {
				s := "s" + strconv.Itoa((g+i)%5)
				switch {
				case i%97 == 0:
					h.Delete(s)
				case i%5 == 0:
					_, _ = h.Publish(s, Event{Type: "t", Data: sizedData(2000)})
				default:
					_, _, _, err := h.PublishIdempotent(s, "k"+strconv.Itoa(i%200), hubEvent(i%200))
					if err != nil && !errors.Is(err, ErrClosed) { // closed twice in a row by Deletes
						t.Error(err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	st := h.Stats()
	assert.Equal(t, st.RingBytes+st.IdempotencyBytes, h.budget.used.Load())
	assert.Equal(t, st.IdempotencyBytes, h.budget.records.Load())
	assert.LessOrEqual(t, st.RingBytes+st.IdempotencyBytes, st.MaxTotalBytes)
	var keys int
	for _, e := range h.snapshot() {
		keys += e.s.idem.n
		assert.LessOrEqual(t, e.s.idem.n, 50)
	}
	assert.Equal(t, keys, st.IdempotencyKeys)
	require.NoError(t, h.Close())
	assert.Zero(t, h.budget.used.Load())
	assert.Zero(t, h.budget.records.Load())
}

// The store against a map: lookups, the oldest first, and the index made,
// grown, shrunk and dropped as the records come and go.
func TestIdemStoreModel(t *testing.T) {
	seed := maphash.MakeSeed()
	rng := rand.New(rand.NewPCG(1, 2))
	var st idemStore
	model := map[string]uint64{}
	var order []string
	next := uint64(0)
	steps := pick(20_000, 60_000, 200_000)
	for step := range steps {
		grow := step/(steps/10)%2 == 0
		if len(order) > 0 && (rng.IntN(3) == 0 || !grow && rng.IntN(2) == 0) {
			st.popLocked()
			delete(model, order[0])
			order = order[1:]
		} else {
			k := strconv.Itoa(rng.IntN(1 << 20))
			if _, ok := model[k]; ok {
				continue
			}
			next++
			st.pushLocked(&idemRecord{key: k, hash: maphash.String(seed, k), id: next}, idemCost(k))
			model[k] = next
			order = append(order, k)
		}
		require.Equal(t, len(order), st.n)
		if st.index != nil {
			require.LessOrEqual(t, len(st.index)+1, 8*st.n, "step %d: more than 8 slots per record", step)
			require.LessOrEqual(t, 2*st.n, len(st.index)+1, "step %d: more than half full", step)
		} else {
			require.LessOrEqual(t, st.n, idemLinear)
		}
		if step%97 == 0 {
			for k, id := range model {
				r := st.findLocked(k, maphash.String(seed, k))
				require.NotNil(t, r, "step %d: %s lost", step, k)
				require.Equal(t, id, r.id)
			}
			k := "absent" + strconv.Itoa(step)
			require.Nil(t, st.findLocked(k, maphash.String(seed, k)))
		}
	}
	var cost int64
	for _, k := range order {
		cost += idemCost(k)
	}
	require.Equal(t, cost, st.bytes.Load())
	require.Equal(t, cost, st.clearLocked())
	require.Zero(t, st.bytes.Load())
}

// What a record costs the budget, idemCost, is at least what it holds in
// the heap: measured over many sessions' records after a collection, at
// every fill of a session (no index up to 8 records; then an index, grown,
// and shrunk as the oldest go), with keys of 16 and 36 bytes.
func TestHubIdempotencyCostMeasured(t *testing.T) {
	seed := maphash.MakeSeed()
	for _, keyLen := range []int{16, 36} {
		for _, fill := range []int{1, 8, 9, 16, 17, 33, 64, 129, 256, 1025} {
			for _, pop := range []int{0, fill / 2, fill * 7 / 8} {
				stores := make([]idemStore, max(pick(2000, 8000, 32000)/fill, 20))
				keys := make([]string, 0, len(stores)*fill)
				for i := range len(stores) * fill {
					keys = append(keys, fmt.Sprintf("%0*d", keyLen, i))
				}
				before := liveHeap()
				for i := range stores {
					for _, k := range keys[i*fill : (i+1)*fill] {
						k = strings.Clone(k) // a fresh key, as a request's header holds it
						stores[i].pushLocked(&idemRecord{key: k, hash: maphash.String(seed, k)}, idemCost(k))
					}
					for range pop {
						stores[i].popLocked()
					}
				}
				grown := int64(liveHeap()) - int64(before)
				records := len(stores) * (fill - pop)
				charged := int64(records) * idemCost(keys[0])
				runtime.KeepAlive(stores)
				runtime.KeepAlive(keys)
				perRecord := float64(grown) / float64(records)
				if fill == 256 && pop == 0 || perRecord > float64(idemCost(keys[0])) {
					t.Logf("keys of %d bytes, %d records a session (of %d): %.1f B a record in the heap, %d counted",
						keyLen, fill-pop, fill, perRecord, idemCost(keys[0]))
				}
				// A few bytes of slack a record for what else the runtime
				// allocates meanwhile.
				assert.LessOrEqual(t, grown, charged+int64(records)*2,
					"keys of %d bytes, %d of %d records: %.1f B a record, %d counted", keyLen, fill-pop, fill, perRecord, idemCost(keys[0]))
			}
		}
	}
}

// The issue's measurement: 25,600 distinct keys (36 bytes, as UUIDs) over
// 100 sessions (256 each, the default cap). The budget counts them at
// idemCost each, the heap grows by less, and with a budget smaller than
// what they cost, rings plus records stay within it.
func TestHubIdempotencyIssueMeasurement(t *testing.T) {
	const sessions, perSession = 100, DefaultMaxIdempotencyKeys
	publishAll := func(h *Hub, keyed bool) {
		for s := range sessions {
			for i := range perSession {
				id := "session-" + strconv.Itoa(s)
				if keyed {
					_, _, dup, err := h.PublishIdempotent(id, idemKey(s, i), hubEvent(i))
					require.NoError(t, err)
					require.False(t, dup)
				} else {
					_, err := h.Publish(id, hubEvent(i))
					require.NoError(t, err)
				}
			}
		}
	}
	// The same publishes without and with keys, on rings of one event:
	// the difference is the records.
	grown := func(keyed bool) (int64, HubStats) {
		h := newTestHub(t, HubOptions{Bus: Options{RingSize: 1}})
		before := liveHeap()
		publishAll(h, keyed)
		after := liveHeap()
		st := h.Stats()
		runtime.KeepAlive(h)
		return int64(after) - int64(before), st
	}
	plain, _ := grown(false)
	keyed, st := grown(true)
	keys := int64(sessions * perSession)
	cost := idemCost(idemKey(0, 0))
	require.Equal(t, int(keys), st.IdempotencyKeys)
	require.Equal(t, keys*cost, st.IdempotencyBytes)
	perKey := float64(keyed-plain) / float64(keys)
	t.Logf("%d keys of 36 bytes: the heap grew by %.1f B a key (%.2f MiB), the budget counts %d B a key (%.2f MiB)",
		keys, perKey, float64(keyed-plain)/(1<<20), cost, float64(keys*cost)/(1<<20))
	assert.LessOrEqual(t, perKey, float64(cost)+4, "the budget counts less than a record holds")

	// A budget of half what the records cost: it holds.
	limit := keys * cost / 2
	h := newTestHub(t, HubOptions{MaxTotalBytes: limit, Bus: Options{MaxEventBytes: 4 << 10}})
	publishAll(h, true)
	st = h.Stats()
	assert.LessOrEqual(t, st.RingBytes+st.IdempotencyBytes, limit)
	assert.Equal(t, st.RingBytes+st.IdempotencyBytes, h.budget.used.Load())
	assert.Less(t, st.IdempotencyKeys, int(keys))
	t.Logf("MaxTotalBytes %d: rings %d + %d records %d", limit, st.RingBytes, st.IdempotencyKeys, st.IdempotencyBytes)
	for _, e := range h.snapshot() {
		assert.Positive(t, e.s.idem.n, "a session lost every record")
	}
}
