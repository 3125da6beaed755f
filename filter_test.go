package eventbus

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ssebus/eventbus/sseclient"
)

// Type filters (SPEC 2.4).

func TestFilterGrammarValid(t *testing.T) {
	wild256 := strings.Repeat("a", 254) + ".*"
	require.Len(t, wild256, 256)
	for _, f := range []string{
		// Exact names: any valid event type without '*'.
		"a", "session_update", "A", "Foo Bar", "a-b", "x.y.z", "plugin.tool.github",
		"plugin.tool.github.", ".leading", "a..b", "ünïcödé", "tab\there", "{}[]\"'\\",
		strings.Repeat("e", 256),
		// Trailing wildcards: segments of [a-z0-9_]+, dot-separated, then ".*".
		"a.*", "plugin.tool.github.*", "a_1.b2.*", "0.*", "_.*", "a.b.c.d.e.*",
		wild256,
	} {
		_, err := compileFilters([]string{f})
		assert.NoError(t, err, "filter %q", f)
		b := newBus(t, Options{})
		_, err = b.Subscribe(t.Context(), SubscribeOptions{Types: []string{f}})
		assert.NoError(t, err, "filter %q", f)
	}
}

func TestFilterGrammarInvalid(t *testing.T) {
	for _, f := range []string{
		"", "*", ".*", "a..*", "A.*", "a-b.*", "a.*.b", "a*", "a.b*", "*.a", "a.**", "a.B.*",
		"a .*", "é.*", "a\n", "\r", "a\r\nb", "a.\n.*",
		strings.Repeat("e", 257),
		strings.Repeat("a", 255) + ".*",
	} {
		_, err := compileFilters([]string{"ok", f})
		require.Error(t, err, "filter %q", f)
		assert.ErrorIs(t, err, ErrInvalidFilter, "filter %q", f)
		assert.Contains(t, err.Error(), strconv.Quote(truncate(f, 64)), "the message names the bad filter")

		b := newBus(t, Options{})
		s, err := b.Subscribe(t.Context(), SubscribeOptions{Types: []string{f}})
		assert.ErrorIs(t, err, ErrInvalidFilter, "filter %q", f)
		assert.Nil(t, s)
		assert.Equal(t, 0, b.SubscriberCount())
	}
}

func TestFilterCountLimit(t *testing.T) {
	filters := make([]string, MaxTypeFilters+1)
	for i := range filters {
		filters[i] = fmt.Sprintf("t%d.*", i)
	}
	b := newBus(t, Options{})
	_, err := b.Subscribe(t.Context(), SubscribeOptions{Types: filters[:MaxTypeFilters]})
	assert.NoError(t, err, "32 filters are accepted")
	_, err = b.Subscribe(t.Context(), SubscribeOptions{Types: filters})
	assert.ErrorIs(t, err, ErrInvalidFilter, "33 filters are not")
	assert.Contains(t, err.Error(), "33")
}

func TestFilterWildcardMatch(t *testing.T) {
	f, err := compileFilters([]string{"plugin.tool.github.*"})
	require.NoError(t, err)
	for typ, want := range map[string]bool{
		"plugin.tool.github.pr_opened": true,
		"plugin.tool.github.a.b":       true,
		"plugin.tool.github.X":         true, // the matched type is any valid type
		"plugin.tool.github":           false,
		"plugin.tool.github.":          false,
		"plugin.tool.gitlab.x":         false,
		"plugin.tool.githubx":          false,
		"plugin.tool.githubx.y":        false,
		"xplugin.tool.github.y":        false,
		"plugin":                       false,
		"":                             false,
	} {
		assert.Equal(t, want, f.match(typ), "type %q", typ)
	}
}

func TestFilterExactMatch(t *testing.T) {
	f, err := compileFilters([]string{"a", "Foo Bar", "x.y"})
	require.NoError(t, err)
	for typ, want := range map[string]bool{
		"a": true, "Foo Bar": true, "x.y": true,
		"a.b": false, "ab": false, "A": false, "foo bar": false, "x.y.z": false, "x": false,
	} {
		assert.Equal(t, want, f.match(typ), "type %q", typ)
	}
}

func TestFilterEmptyMatchesEverything(t *testing.T) {
	for _, types := range [][]string{nil, {}} {
		f, err := compileFilters(types)
		require.NoError(t, err)
		assert.True(t, f.match("anything"))
		b := newBus(t, Options{})
		s := subscribe(t, b, SubscribeOptions{Types: types})
		publishType(t, b, "x")
		publishType(t, b, "y.z")
		assert.Equal(t, []string{"#1", "#2"}, describe(readyNow(s)))
	}
}

func TestFilterMatchDoesNotAllocate(t *testing.T) {
	filters := []string{"a", "b.c", "plugin.tool.github.*", "x.*"}
	for i := range 20 {
		filters = append(filters, fmt.Sprintf("f%d.*", i))
	}
	f, err := compileFilters(filters)
	require.NoError(t, err)
	types := []string{"a", "zzz", "plugin.tool.github.pr", "plugin.tool.gitlab.pr", "f19.x", "b.c"}
	allocs := testing.AllocsPerRun(100, func() {
		for _, typ := range types {
			_ = f.match(typ)
		}
	})
	assert.Zero(t, allocs)
	var nilFilter *typeFilter
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = nilFilter.match("a") }))
}

func TestFilterSyntheticFramesAlwaysPass(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16})
	publishTypeN(t, b, "other", 3)
	// Epoch mismatch: state_resync_required, then replay_complete; none of
	// the ring's events match.
	s := subscribe(t, b, SubscribeOptions{Types: []string{"zzz"}, Resume: true, LastEventID: 1, Epoch: "not-this-bus"})
	publishTypeN(t, b, "zzz", 17) // warning at 12, eviction at 17
	fs := collectEvents(s)
	assert.Equal(t, seqOf(TypeStateResyncRequired, TypeReplayComplete, idRange(4, 15), TypeSlowClientWarning, idRange(16, 19), TypeClientEvicted),
		describe(fs))
	assert.Contains(t, dataOf(t, fs[0]), `"detail":"epoch_mismatch"`)
	assert.Contains(t, dataOf(t, fs[1]), `"replayedCount":0`)
}

func TestFilterFilteredOutEventsNeverCountTowardCaps(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16, MaxQueuedBytes: 4096})
	s := subscribe(t, b, SubscribeOptions{Types: []string{"wanted.*"}})
	for range 10_000 {
		_, err := b.Publish(Event{Type: "unwanted", Data: strings.Repeat("x", 500)})
		require.NoError(t, err)
	}
	assert.Equal(t, 1, b.SubscriberCount(), "a filtered subscriber that never reads is not evicted")
	assert.Equal(t, queueCounts{0, 16, 0, 4096}, s.q.counts())
	assert.Zero(t, s.q.len())
	st := b.Stats()
	assert.Zero(t, st.Warnings)
	assert.Equal(t, EvictionStats{}, st.Evictions)

	publishType(t, b, "wanted.x")
	assert.Equal(t, []string{"#10001"}, describe(readyNow(s)))
}

func TestFilterReplayCountsMatchingFramesOnly(t *testing.T) {
	b := newBus(t, Options{})
	for _, typ := range []string{"a", "b", "a.x", "b", "c", "a.y", "b"} { // #1..#7
		publishType(t, b, typ)
	}
	s := subscribe(t, b, SubscribeOptions{Types: []string{"a", "a.*"}, Resume: true, LastEventID: 0})
	fs := readyNow(s)
	assert.Equal(t, []string{"#1", "#3", "#6", TypeReplayComplete}, describe(fs))
	assert.JSONEq(t, fmt.Sprintf(`{"replayedCount":3,"lastReplayedEventId":6,"lastEventId":6,"epoch":%q}`, b.Epoch()),
		dataOf(t, fs[3]))

	// Nothing after the cursor matches: replayedCount 0.
	s2 := subscribe(t, b, SubscribeOptions{Types: []string{"a"}, Resume: true, LastEventID: 1})
	fs = readyNow(s2)
	assert.Equal(t, []string{TypeReplayComplete}, describe(fs))
	assert.JSONEq(t, fmt.Sprintf(`{"replayedCount":0,"epoch":%q}`, b.Epoch()), dataOf(t, fs[0]))
}

func TestFilterReplayBudgetCountsMatchingFramesOnly(t *testing.T) {
	b := newBus(t, Options{ReplayBudgetBytes: 250})
	publishSized(t, b, "a", 100)  // #1
	publishSized(t, b, "b", 1000) // #2: filtered out, does not spend the budget
	publishSized(t, b, "a", 100)  // #3: 200
	publishSized(t, b, "a", 100)  // #4: 300 > 250, not replayed
	publishSized(t, b, "b", 100)  // #5: filtered out, not counted as dropped
	publishSized(t, b, "a", 100)  // #6: not replayed

	s := subscribe(t, b, SubscribeOptions{Types: []string{"a"}, Resume: true, LastEventID: 0})
	fs := readyNow(s)
	assert.Equal(t, []string{"#1", "#3", TypeStateResyncRequired, TypeReplayComplete}, describe(fs))
	assert.JSONEq(t, fmt.Sprintf(`{"reason":"replay_budget_exceeded","lastDeliveredId":3,"earliestAvailableId":4,"epoch":%q}`, b.Epoch()),
		dataOf(t, fs[2]))
	assert.JSONEq(t, fmt.Sprintf(`{"replayedCount":2,"lastReplayedEventId":3,"lastEventId":3,"epoch":%q}`, b.Epoch()),
		dataOf(t, fs[3]))
	st := b.Stats()
	assert.Equal(t, uint64(2), st.Dropped.ReplayBudget, "#4 and #6; the filtered-out #5 is not due to this subscriber")
	assert.Equal(t, uint64(1), st.Resyncs.ReplayBudgetExceeded)

	// The first matching frame is replayed whatever its size.
	b2 := newBus(t, Options{ReplayBudgetBytes: 250})
	publishSized(t, b2, "b", 100)
	publishSized(t, b2, "a", 1000)
	s2 := subscribe(t, b2, SubscribeOptions{Types: []string{"a"}, Resume: true, LastEventID: 0})
	assert.Equal(t, []string{"#2", TypeReplayComplete}, describe(readyNow(s2)))
}

func TestFilterResyncRulesGoByIDs(t *testing.T) {
	b := newBus(t, Options{RingSize: 3})
	for _, typ := range []string{"a", "b", "b", "b", "a"} { // the ring holds #3..#5
		publishType(t, b, typ)
	}
	t.Run("ring_evicted although the evicted ids were filtered out", func(t *testing.T) {
		// #2, gone from the ring, is a "b" the subscriber would not have
		// received: the rule still goes by ids.
		s := subscribe(t, b, SubscribeOptions{Types: []string{"a"}, Resume: true, LastEventID: 1})
		fs := readyNow(s)
		assert.Equal(t, []string{TypeStateResyncRequired, "#5", TypeReplayComplete}, describe(fs))
		assert.JSONEq(t, fmt.Sprintf(`{"reason":"ring_evicted","lastDeliveredId":1,"earliestAvailableId":3,"epoch":%q}`, b.Epoch()),
			dataOf(t, fs[0]))
	})
	t.Run("no resync at the ring start although nothing there matches", func(t *testing.T) {
		s := subscribe(t, b, SubscribeOptions{Types: []string{"zzz"}, Resume: true, LastEventID: 2})
		assert.Equal(t, []string{TypeReplayComplete}, describe(readyNow(s)))
	})
	t.Run("epoch_reset by ids", func(t *testing.T) {
		s := subscribe(t, b, SubscribeOptions{Types: []string{"zzz"}, Resume: true, LastEventID: 9})
		fs := readyNow(s)
		assert.Equal(t, []string{TypeStateResyncRequired, TypeReplayComplete}, describe(fs))
		assert.JSONEq(t, fmt.Sprintf(`{"reason":"epoch_reset","lastDeliveredId":9,"earliestAvailableId":3,"epoch":%q}`, b.Epoch()),
			dataOf(t, fs[0]))
	})
	st := b.Stats()
	assert.Equal(t, uint64(1), st.Resyncs.RingEvicted)
	assert.Equal(t, uint64(1), st.Resyncs.EpochReset)
}

func TestFilterIDsIncreasingNotContiguous(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{Types: []string{"keep.*"}})
	for i := range 100 {
		if i%3 == 0 {
			publishType(t, b, "keep.x")
		} else {
			publishType(t, b, "drop")
		}
	}
	fs := readyNow(s)
	require.Len(t, fs, 34)
	for i, f := range fs {
		assert.Equal(t, uint64(3*i+1), f.ID())
	}
}

func TestFilterOverHTTP(t *testing.T) {
	b := newBus(t, Options{})
	srv := serveBus(t, b)
	c := openStream(t, srv, "/session/s/events?types="+url.QueryEscape("a,b.*"), nil)
	require.Equal(t, http.StatusOK, c.resp.StatusCode)
	require.Equal(t, 1, b.SubscriberCount())

	for _, typ := range []string{"a", "b", "b.x", "c", "a.y", "ab"} { // #1..#6
		publishType(t, b, typ)
	}
	sendSignal(t, b, "b.sig", "r")
	sendSignal(t, b, "c", "r")
	publishType(t, b, "b.x.y") // #7
	publishType(t, b, "a")     // #8

	evs := c.messagesUntil(func(m sseclient.Message) bool { return m.ID == "8" })
	var got []string
	for _, e := range evs {
		got = append(got, e.ID+":"+e.Type)
	}
	assert.Equal(t, []string{"1:a", "3:b.x", ":b.sig", "7:b.x.y", "8:a"}, got)
}

func TestFilterOverHTTPRepeatedParameter(t *testing.T) {
	b := newBus(t, Options{})
	srv := serveBus(t, b)
	c := openStream(t, srv, "/session/s/events?types=a&types=b.*", nil)
	require.Equal(t, http.StatusOK, c.resp.StatusCode)
	for _, typ := range []string{"a", "c", "b.x"} {
		publishType(t, b, typ)
	}
	evs := c.messagesUntil(func(m sseclient.Message) bool { return m.ID == "3" })
	require.Len(t, evs, 2)
	assert.Equal(t, "1", evs[0].ID)
	assert.Equal(t, "3", evs[1].ID)
}

func TestFilterOverHTTPInvalidIs400(t *testing.T) {
	b := newBus(t, Options{})
	srv := serveBus(t, b)
	for _, types := range []string{"A.*", "a,b..*", "a*", "*", "a.*.b", strings.Repeat("a", 257)} {
		resp := openStream(t, srv, "/session/s/events?types="+url.QueryEscape(types), nil).resp
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "types=%q", types)
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		var e struct{ Error, Code string }
		require.NoError(t, json.Unmarshal(body, &e), "%s", body)
		assert.Equal(t, "invalid_filter", e.Code)
		bad := types[strings.LastIndex(types, ",")+1:]
		assert.Contains(t, e.Error, strconv.Quote(truncate(bad, 64)), "the message names the bad filter")
	}
	assert.Equal(t, 0, b.SubscriberCount())
	assert.Equal(t, 0, b.Stats().PeakSubscribers)
}
