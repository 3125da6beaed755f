package eventbus

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ---------------------------------------------------------------------------
// Resuming: Last-Event-ID, lastEventId, epochs, and the resync frames.

func TestHandlerResume(t *testing.T) {
	e := newEnv(t, envOptions{})
	setup := func(t *testing.T) (string, *EventBus) { return e.sessionWithEvents(t, 5) }
	rc := func(b *EventBus, count int, last uint64) sseEvent {
		lastID := ""
		if count > 0 {
			lastID = strconv.FormatUint(last, 10)
		}
		return wantReplayComplete(b, count, last, lastID)
	}
	events := func(from, to uint64) []sseEvent {
		var evs []sseEvent
		for i := from; i <= to; i++ {
			evs = append(evs, wantEvent(i))
		}
		return evs
	}
	for _, tc := range []struct {
		name   string
		query  string
		header http.Header
		want   func(b *EventBus) []sseEvent
	}{
		{"header", "", hdr("Last-Event-ID", "3"), func(b *EventBus) []sseEvent {
			return append(events(4, 5), rc(b, 2, 5))
		}},
		{"query when the header is absent", "?lastEventId=2", nil, func(b *EventBus) []sseEvent {
			return append(events(3, 5), rc(b, 3, 5))
		}},
		{"query when the header is empty", "?lastEventId=2", hdr("Last-Event-ID", ""), func(b *EventBus) []sseEvent {
			return append(events(3, 5), rc(b, 3, 5))
		}},
		{"header wins over query", "?lastEventId=1", hdr("Last-Event-ID", "4"), func(b *EventBus) []sseEvent {
			return append(events(5, 5), rc(b, 1, 5))
		}},
		{"repeated header: the first counts", "", hdr("Last-Event-ID", "4", "Last-Event-ID", "1"), func(b *EventBus) []sseEvent {
			return append(events(5, 5), rc(b, 1, 5))
		}},
		{"repeated query: the first counts", "?lastEventId=4&lastEventId=1", nil, func(b *EventBus) []sseEvent {
			return append(events(5, 5), rc(b, 1, 5))
		}},
		{"zero means from the start", "", hdr("Last-Event-ID", "0"), func(b *EventBus) []sseEvent {
			return append(events(1, 5), rc(b, 5, 5))
		}},
		{"leading zeros", "", hdr("Last-Event-ID", "0003"), func(b *EventBus) []sseEvent {
			return append(events(4, 5), rc(b, 2, 5))
		}},
		{"up to date", "", hdr("Last-Event-ID", "5"), func(b *EventBus) []sseEvent {
			return []sseEvent{rc(b, 0, 0)}
		}},
		{"the largest id a client may send", "", hdr("Last-Event-ID", "9007199254740991"), func(b *EventBus) []sseEvent {
			resync := wantSynth(TypeStateResyncRequired,
				`{"reason":"epoch_reset","lastDeliveredId":9007199254740991,"earliestAvailableId":1,"epoch":"`+b.Epoch()+`"}`, "")
			return append(append([]sseEvent{resync}, events(1, 5)...), rc(b, 5, 5))
		}},
		{"matching epoch", "", hdr("Last-Event-ID", "4", "Event-Epoch", "<epoch>"), func(b *EventBus) []sseEvent {
			return append(events(5, 5), rc(b, 1, 5))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, b := setup(t)
			for _, vs := range tc.header {
				for i, v := range vs {
					if v == "<epoch>" {
						vs[i] = b.Epoch()
					}
				}
			}
			c := e.stream(t, path+tc.query, tc.header)
			c.expect(tc.want(b)...)
			// Then live, with nothing in between.
			publishN(t, b, 1)
			c.expect(wantEvent(6))
		})
	}
}

func TestHandlerMalformedLastEventID(t *testing.T) {
	e := newEnv(t, envOptions{maxHeaderBytes: 16 << 20})
	size := pick(1<<20, 10<<20, 10<<20)           // 1 MB with -short
	huge := strings.Repeat("9", size)             // 10 MB of digits: overflows early
	hugeJunk := strings.Repeat("\u00e9x", size/3) // 10 MB, cut inside a rune at 64 bytes
	values := []string{
		"abc", "-1", "+1", "1.0", " 1", "1 ", "0x1", "1e3", "1_000",
		"9007199254740992",     // 2^53
		"18446744073709551615", // 2^64-1
		"18446744073709551616", // 2^64
		"\u0661",               // ARABIC-INDIC DIGIT ONE
		"1\x00", "\t1",
		strings.Repeat("7", 65), // digits, too long, longer than the quote
	}
	n := 0
	check := func(t *testing.T, raw, query string, header http.Header) {
		n++
		id := "s" + strconv.Itoa(n)
		b := e.bus(t, id, Options{})
		publishN(t, b, 3)
		before := len(e.logs.find("malformed Last-Event-ID"))
		c := e.stream(t, "/session/"+id+"/events"+query, header)
		// Live only: no replay, no resync, no replay_complete.
		publishN(t, b, 1)
		c.expect(wantEvent(4))
		logs := e.logs.find("malformed Last-Event-ID")
		require.Len(t, logs, before+1, "one diagnostic")
		requireQuotedPrefix(t, raw, logs[len(logs)-1].Attrs["value"])
	}
	for _, raw := range values {
		name := strconv.Quote(raw[:min(len(raw), 12)])
		t.Run("query "+name, func(t *testing.T) {
			check(t, raw, "?lastEventId="+url.QueryEscape(raw), nil)
		})
		if strings.TrimSpace(raw) == raw && !strings.ContainsAny(raw, "\x00") {
			// A server trims header values, so spaces are tested via the
			// query and in memory only.
			t.Run("header "+name, func(t *testing.T) {
				check(t, raw, "", hdr("Last-Event-ID", raw))
			})
			t.Run("header wins over a valid query "+name, func(t *testing.T) {
				check(t, raw, "?lastEventId=1", hdr("Last-Event-ID", raw))
			})
		}
	}
	t.Run("10 MB header", func(t *testing.T) {
		check(t, huge, "", hdr("Last-Event-ID", huge))
	})

	// In memory: values a server would trim, and the other 10 MB cases
	// without the cost of parsing them as HTTP.
	for _, tc := range []struct {
		name          string
		header, query string
	}{
		{"leading space", " 1", ""},
		{"trailing space", "1 ", ""},
		{"tab", "\t1", ""},
		{"NUL", "1\x00", ""},
		{"10 MB non-digits header", hugeJunk, ""},
		{"10 MB digits query", "", huge},
		{"10 MB non-digits query", "", strings.Repeat("x", size)},
	} {
		t.Run("in memory "+tc.name, func(t *testing.T) {
			logs := &logCapture{}
			b := newBus(t, logs.capture(Options{}))
			publishN(t, b, 3)
			w := newMemWriter()
			target, raw := "/session/s/events", tc.header
			var header http.Header
			if tc.header != "" {
				header = hdr("Last-Event-ID", tc.header)
			} else {
				target, raw = target+"?lastEventId="+url.QueryEscape(tc.query), tc.query
			}
			cancel, done := serveMem(busHandler(b, logs), w, target, header)
			require.Eventually(t, func() bool { return b.SubscriberCount() == 1 && w.state().flushes == 1 }, 5*time.Second, time.Millisecond)
			publishN(t, b, 1)
			require.Eventually(t, func() bool { return w.state().flushes == 2 }, 5*time.Second, time.Millisecond)
			cancel()
			waitClosed(t, done, "handler did not return")
			st := w.state()
			require.Equal(t, http.StatusOK, st.status)
			require.Equal(t, []sseRecord{{Kind: sseRetryRecord, Retry: 3000}, {Kind: sseEventRecord, Event: wantEvent(4)}},
				parseBody(t, st.body))
			found := logs.find("malformed Last-Event-ID")
			require.Len(t, found, 1)
			requireQuotedPrefix(t, raw, found[0].Attrs["value"])
		})
	}
	t.Run("missing or empty is not logged", func(t *testing.T) {
		before := len(e.logs.find("malformed"))
		e.bus(t, "quiet", Options{})
		e.stream(t, "/session/quiet/events", nil)
		e.stream(t, "/session/quiet/events", hdr("Last-Event-ID", ""))
		e.stream(t, "/session/quiet/events?lastEventId=", nil)
		require.Len(t, e.logs.find("malformed"), before)
	})
}

// requireQuotedPrefix checks a logged value: a Go-quoted string of the
// first min(len(raw), 64) bytes of raw.
func requireQuotedPrefix(t *testing.T, raw, quoted string) {
	t.Helper()
	v, err := strconv.Unquote(quoted)
	require.NoError(t, err, "the value is quoted: %s", quoted)
	require.Equal(t, raw[:min(len(raw), 64)], v, "at most 64 bytes of the value")
}

func TestHandlerResyncReasons(t *testing.T) {
	e := newEnv(t, envOptions{})
	const otherEpoch = "0123456789abcdef0123456789abcdef"
	n := 0
	// ring: RingSize 3 after 10 events holds 8, 9, 10; nextID is 11.
	ringBus := func(t *testing.T, opts Options) (string, *EventBus) {
		n++
		id := "s" + strconv.Itoa(n)
		if opts.RingSize == 0 {
			opts.RingSize = 3
		}
		b := e.bus(t, id, opts)
		publishN(t, b, 10)
		return "/session/" + id + "/events", b
	}
	resync := func(b *EventBus, fields, lastID string) sseEvent {
		return wantSynth(TypeStateResyncRequired, "{"+fields+`,"epoch":"`+b.Epoch()+`"}`, lastID)
	}
	complete := func(b *EventBus, count int, last uint64) sseEvent {
		return wantSynth(TypeReplayComplete, fmt.Sprintf(`{"replayedCount":%d,"lastReplayedEventId":%d,"lastEventId":%d,"epoch":"%s"}`,
			count, last, last, b.Epoch()), strconv.FormatUint(last, 10))
	}
	for _, tc := range []struct {
		name   string
		opts   Options
		query  string
		header http.Header
		want   func(b *EventBus) []sseEvent
	}{
		{"ring_evicted", Options{}, "", hdr("Last-Event-ID", "2"), func(b *EventBus) []sseEvent {
			return []sseEvent{
				resync(b, `"reason":"ring_evicted","lastDeliveredId":2,"earliestAvailableId":8`, ""),
				wantEvent(8), wantEvent(9), wantEvent(10), complete(b, 3, 10),
			}
		}},
		{"no resync right before the ring", Options{}, "", hdr("Last-Event-ID", "7"), func(b *EventBus) []sseEvent {
			return []sseEvent{wantEvent(8), wantEvent(9), wantEvent(10), complete(b, 3, 10)}
		}},
		{"epoch_reset by cursor", Options{}, "", hdr("Last-Event-ID", "50"), func(b *EventBus) []sseEvent {
			return []sseEvent{
				resync(b, `"reason":"epoch_reset","lastDeliveredId":50,"earliestAvailableId":8`, ""),
				wantEvent(8), wantEvent(9), wantEvent(10), complete(b, 3, 10),
			}
		}},
		{"epoch_reset at nextID", Options{}, "", hdr("Last-Event-ID", "11"), func(b *EventBus) []sseEvent {
			return []sseEvent{
				resync(b, `"reason":"epoch_reset","lastDeliveredId":11,"earliestAvailableId":8`, ""),
				wantEvent(8), wantEvent(9), wantEvent(10), complete(b, 3, 10),
			}
		}},
		{"epoch_mismatch via Event-Epoch", Options{}, "", hdr("Last-Event-ID", "9", "Event-Epoch", otherEpoch), func(b *EventBus) []sseEvent {
			return []sseEvent{
				resync(b, `"reason":"epoch_reset","detail":"epoch_mismatch","lastDeliveredId":9,"earliestAvailableId":8`, ""),
				wantEvent(8), wantEvent(9), wantEvent(10), complete(b, 3, 10),
			}
		}},
		{"epoch_mismatch via ?epoch=", Options{}, "?epoch=" + otherEpoch, hdr("Last-Event-ID", "9"), func(b *EventBus) []sseEvent {
			return []sseEvent{
				resync(b, `"reason":"epoch_reset","detail":"epoch_mismatch","lastDeliveredId":9,"earliestAvailableId":8`, ""),
				wantEvent(8), wantEvent(9), wantEvent(10), complete(b, 3, 10),
			}
		}},
		{"epoch_mismatch with ?lastEventId and ?epoch", Options{}, "?lastEventId=9&epoch=" + otherEpoch, nil, func(b *EventBus) []sseEvent {
			return []sseEvent{
				resync(b, `"reason":"epoch_reset","detail":"epoch_mismatch","lastDeliveredId":9,"earliestAvailableId":8`, ""),
				wantEvent(8), wantEvent(9), wantEvent(10), complete(b, 3, 10),
			}
		}},
		{"Event-Epoch header wins over ?epoch=", Options{}, "?epoch=" + otherEpoch, hdr("Last-Event-ID", "9", "Event-Epoch", "<epoch>"), func(b *EventBus) []sseEvent {
			return []sseEvent{wantEvent(10), complete(b, 1, 10)}
		}},
		{"an epoch over 64 bytes is ignored", Options{}, "?epoch=" + strings.Repeat("a", 65), hdr("Last-Event-ID", "9"), func(b *EventBus) []sseEvent {
			return []sseEvent{wantEvent(10), complete(b, 1, 10)}
		}},
		{"replay_budget_exceeded", Options{RingSize: 100, ReplayBudgetBytes: 2 * len(wantEvent(1).Data)}, "", hdr("Last-Event-ID", "0"), func(b *EventBus) []sseEvent {
			return []sseEvent{
				wantEvent(1), wantEvent(2),
				resync(b, `"reason":"replay_budget_exceeded","lastDeliveredId":2,"earliestAvailableId":3`, "2"),
				complete(b, 2, 2),
			}
		}},
		{"ring_evicted then replay_budget_exceeded", Options{RingSize: 5, ReplayBudgetBytes: 2*len(wantEvent(1).Data) + 1}, "", hdr("Last-Event-ID", "1"), func(b *EventBus) []sseEvent {
			return []sseEvent{
				resync(b, `"reason":"ring_evicted","lastDeliveredId":1,"earliestAvailableId":6`, ""),
				wantEvent(6), wantEvent(7),
				resync(b, `"reason":"replay_budget_exceeded","lastDeliveredId":7,"earliestAvailableId":8`, "7"),
				complete(b, 2, 7),
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, b := ringBus(t, tc.opts)
			for _, vs := range tc.header {
				for i, v := range vs {
					if v == "<epoch>" {
						vs[i] = b.Epoch()
					}
				}
			}
			c := e.stream(t, path+tc.query, tc.header)
			c.expect(tc.want(b)...)
			publishN(t, b, 1)
			c.expect(wantEvent(11))
		})
	}
	t.Run("epoch ignored without a last id", func(t *testing.T) {
		path, b := ringBus(t, Options{})
		c := e.stream(t, path, hdr("Event-Epoch", otherEpoch))
		publishN(t, b, 1)
		c.expect(wantEvent(11))
	})
}

// ---------------------------------------------------------------------------
// Epoch ids on the wire (Handler.EpochIDs) and ParseEventID.

// epochEvent is wantEvent(id) as a stream with EpochIDs carries it: the
// SSE id is "<epoch>:<id>", the envelope's "id" stays the number.
func epochEvent(epoch string, id uint64) sseEvent {
	ev := wantEvent(id)
	ev.ID = epoch + ":" + ev.ID
	return ev
}

func TestHandlerEpochIDs(t *testing.T) {
	e := newEnv(t, envOptions{handler: &Handler{EpochIDs: true}})
	setup := func(t *testing.T) (string, *EventBus) { return e.sessionWithEvents(t, 5) }
	const other = "0123456789abcdef0123456789abcdef"
	rc := wantReplayComplete
	events := func(b *EventBus, from, to uint64) []sseEvent {
		var evs []sseEvent
		for i := from; i <= to; i++ {
			evs = append(evs, epochEvent(b.Epoch(), i))
		}
		return evs
	}
	reset := func(b *EventBus, last uint64, detail string) sseEvent {
		if detail != "" {
			detail = `"detail":"` + detail + `",`
		}
		return wantSynth(TypeStateResyncRequired, fmt.Sprintf(`{"reason":"epoch_reset",%s"lastDeliveredId":%d,"earliestAvailableId":1,"epoch":"%s"}`,
			detail, last, b.Epoch()), "")
	}
	for _, tc := range []struct {
		name   string
		query  string
		header http.Header
		want   func(b *EventBus) []sseEvent
	}{
		{"live", "", nil, func(b *EventBus) []sseEvent { return nil }},
		{"the epoch form in the header", "", hdr("Last-Event-ID", "<epoch>:3"), func(b *EventBus) []sseEvent {
			return append(events(b, 4, 5), rc(b, 2, 5, b.Epoch()+":5"))
		}},
		{"the epoch form in the query", "?lastEventId=<epoch>:2", nil, func(b *EventBus) []sseEvent {
			return append(events(b, 3, 5), rc(b, 3, 5, b.Epoch()+":5"))
		}},
		{"leading zeros after the epoch", "", hdr("Last-Event-ID", "<epoch>:0004"), func(b *EventBus) []sseEvent {
			return append(events(b, 5, 5), rc(b, 1, 5, b.Epoch()+":5"))
		}},
		{"zero after the epoch: from the start", "", hdr("Last-Event-ID", "<epoch>:0"), func(b *EventBus) []sseEvent {
			return append(events(b, 1, 5), rc(b, 5, 5, b.Epoch()+":5"))
		}},
		{"up to date", "", hdr("Last-Event-ID", "<epoch>:5"), func(b *EventBus) []sseEvent {
			return []sseEvent{rc(b, 0, 0, "")}
		}},
		{"the plain form still resumes", "", hdr("Last-Event-ID", "3"), func(b *EventBus) []sseEvent {
			return append(events(b, 4, 5), rc(b, 2, 5, b.Epoch()+":5"))
		}},
		{"another epoch: epoch_reset, the whole ring", "", hdr("Last-Event-ID", other+":3"), func(b *EventBus) []sseEvent {
			return append(append([]sseEvent{reset(b, 3, "epoch_mismatch")}, events(b, 1, 5)...), rc(b, 5, 5, b.Epoch()+":5"))
		}},
		{"another epoch with a cursor beyond the bus", "?lastEventId=" + other + ":9007199254740991", nil, func(b *EventBus) []sseEvent {
			return append(append([]sseEvent{reset(b, 9007199254740991, "epoch_mismatch")}, events(b, 1, 5)...), rc(b, 5, 5, b.Epoch()+":5"))
		}},
		{"Event-Epoch that agrees", "", hdr("Last-Event-ID", "<epoch>:4", "Event-Epoch", "<epoch>"), func(b *EventBus) []sseEvent {
			return append(events(b, 5, 5), rc(b, 1, 5, b.Epoch()+":5"))
		}},
		{"?epoch= that agrees", "?epoch=<epoch>", hdr("Last-Event-ID", "<epoch>:4"), func(b *EventBus) []sseEvent {
			return append(events(b, 5, 5), rc(b, 1, 5, b.Epoch()+":5"))
		}},
		{"an over-long Event-Epoch is ignored, the id's counts", "", hdr("Last-Event-ID", other+":4", "Event-Epoch", strings.Repeat("e", 65)), func(b *EventBus) []sseEvent {
			return append(append([]sseEvent{reset(b, 4, "epoch_mismatch")}, events(b, 1, 5)...), rc(b, 5, 5, b.Epoch()+":5"))
		}},
		{"Event-Epoch that disagrees: live only", "", hdr("Last-Event-ID", "<epoch>:3", "Event-Epoch", other), func(b *EventBus) []sseEvent {
			return nil
		}},
		{"?epoch= that disagrees: live only", "?epoch=" + other + "&lastEventId=<epoch>:3", nil, func(b *EventBus) []sseEvent {
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, b := setup(t)
			for _, vs := range tc.header {
				for i, v := range vs {
					vs[i] = strings.ReplaceAll(v, "<epoch>", b.Epoch())
				}
			}
			before := len(e.logs.find("disagree"))
			c := e.stream(t, path+strings.ReplaceAll(tc.query, "<epoch>", b.Epoch()), tc.header)
			want := tc.want(b)
			c.expect(want...)
			publishN(t, b, 1)
			c.expect(epochEvent(b.Epoch(), 6))
			require.Contains(t, string(c.raw()), "\nid: "+b.Epoch()+":6\nevent: e\ndata: {\"id\":6,", "the envelope's id stays the number")
			disagree := e.logs.find("disagree")[before:]
			if strings.Contains(tc.name, "disagrees") {
				require.Len(t, disagree, 1)
				require.Empty(t, e.logs.find("malformed"))
			} else {
				require.Empty(t, disagree)
			}
		})
	}

	t.Run("off: the SPEC wire, both forms still accepted", func(t *testing.T) {
		e := newEnv(t, envOptions{})
		b := e.bus(t, "s", Options{})
		publishN(t, b, 3)
		c := e.stream(t, "/session/s/events", hdr("Last-Event-ID", b.Epoch()+":1"))
		c.expect(wantEvent(2), wantEvent(3), wantSynth(TypeReplayComplete, `{"replayedCount":2,"lastReplayedEventId":3,"lastEventId":3,"epoch":"`+b.Epoch()+`"}`, "3"))
		require.NotContains(t, string(c.raw()), b.Epoch()+":", "no epoch on the id lines")
	})

	t.Run("frames written from their shared bytes and signals", func(t *testing.T) {
		b := e.bus(t, "big", Options{})
		c := e.stream(t, "/session/big/events", nil)
		big := strings.Repeat("x", directWriteSize)
		_, err := b.Publish(Event{Type: "big", Data: big})
		require.NoError(t, err)
		require.NoError(t, b.Signal("sig", "doc/1"))
		publishN(t, b, 1)
		ev := c.nextEvent()
		require.Equal(t, b.Epoch()+":1", ev.ID)
		require.Equal(t, "big", ev.Type)
		require.Contains(t, ev.Data, `{"id":1,"v":1,"type":"big","data":"`+big+`"`)
		ev = c.nextEvent()
		require.Equal(t, "sig", ev.Type)
		require.Equal(t, b.Epoch()+":1", ev.ID, "a signal carries no id line")
		c.expect(epochEvent(b.Epoch(), 2))
	})
}

// A browser across a daemon restart: the plain EventSource sends back the
// id it last saw, and the new bus (a new epoch, already past that id) must
// answer epoch_reset instead of resuming in the middle of its own sequence.
func TestHandlerEpochIDsAcrossARestart(t *testing.T) {
	e := newEnv(t, envOptions{handler: &Handler{EpochIDs: true}})
	old := e.bus(t, "s", Options{})
	publishN(t, old, 3)
	c := e.stream(t, "/session/s/events", hdr("Last-Event-ID", "0"))
	c.expect(epochEvent(old.Epoch(), 1), epochEvent(old.Epoch(), 2), epochEvent(old.Epoch(), 3))
	c.nextEvent() // replay_complete
	last := c.r.lastEventID()

	restarted := e.bus(t, "s", Options{}) // replaces the session
	publishN(t, restarted, 22)
	c = e.stream(t, "/session/s/events", hdr("Last-Event-ID", last))
	resync := c.nextEvent()
	require.Equal(t, TypeStateResyncRequired, resync.Type)
	require.Contains(t, resync.Data, `"reason":"epoch_reset","detail":"epoch_mismatch","lastDeliveredId":3,"earliestAvailableId":1`)
	for i := uint64(1); i <= 22; i++ {
		require.Equal(t, epochEvent(restarted.Epoch(), i), c.nextEvent())
	}

	// The same cursor as a plain id would have joined the two epochs.
	c = e.stream(t, "/session/s/events", hdr("Last-Event-ID", "3"))
	require.Equal(t, epochEvent(restarted.Epoch(), 4), c.nextEvent(), "what EpochIDs prevents")
}

// refParseEventID is the reference: the plain form, or 32 characters of
// [0-9a-f], a colon and the plain form.
var refEventIDPattern = regexp.MustCompile(`^(?:([0-9a-f]{32}):)?([0-9]+)$`)

func refParseEventID(s string) (string, uint64, bool) {
	m := refEventIDPattern.FindStringSubmatch(s)
	if m == nil {
		return "", 0, false
	}
	id, ok := refParseLastEventID(m[2])
	if !ok {
		return "", 0, false
	}
	return m[1], id, true
}

func TestParseEventID(t *testing.T) {
	const ep = "0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		in    string
		epoch string
		id    uint64
		ok    bool
	}{
		{"7", "", 7, true},
		{"0", "", 0, true},
		{ep + ":7", ep, 7, true},
		{ep + ":0", ep, 0, true},
		{ep + ":007", ep, 7, true},
		{ep + ":9007199254740991", ep, 1<<53 - 1, true},
		{ep + ":9007199254740992", "", 0, false},
		{ep + ":18446744073709551616", "", 0, false},
		{"9007199254740992", "", 0, false},
		{ep + ":", "", 0, false},
		{ep, "", 0, false},
		{":7", "", 0, false},
		{ep[:31] + ":7", "", 0, false},
		{ep + "0:7", "", 0, false},
		{strings.ToUpper(ep) + ":7", "", 0, false},
		{"0123456789ABCDEF0123456789abcdef:7", "", 0, false},
		{"g123456789abcdef0123456789abcdef:7", "", 0, false},
		{ep + ": 7", "", 0, false},
		{ep + ":7 ", "", 0, false},
		{ep + ":+7", "", 0, false},
		{ep + ":-7", "", 0, false},
		{ep + ":7:8", "", 0, false},
		{ep + "::7", "", 0, false},
		{" " + ep + ":7", "", 0, false},
		{ep + ":\u0667", "", 0, false},
		{ep + ":7\x00", "", 0, false},
		{"", "", 0, false},
	} {
		epoch, id, ok := ParseEventID(tc.in)
		require.Equal(t, tc.ok, ok, "%q", tc.in)
		require.Equal(t, tc.epoch, epoch, "%q", tc.in)
		require.Equal(t, tc.id, id, "%q", tc.in)
	}
	huge := ep + ":" + strings.Repeat("9", 10<<20)
	ok := true
	require.Zero(t, testing.AllocsPerRun(10, func() { _, _, ok = ParseEventID(huge) }), "a hostile value allocates nothing")
	require.False(t, ok)
}

func FuzzParseEventID(f *testing.F) {
	const ep = "0123456789abcdef0123456789abcdef"
	for _, s := range []string{"", "1", ep + ":1", ep + ":", ep + ":9007199254740992", strings.ToUpper(ep) + ":1", ep[:31] + "::1", ep + ":1:2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		epoch, id, ok := ParseEventID(s)
		wantEpoch, wantID, wantOK := refParseEventID(s)
		require.Equal(t, wantOK, ok, "%q", s)
		require.Equal(t, wantEpoch, epoch, "%q", s)
		require.Equal(t, wantID, id, "%q", s)
	})
}

// With EpochIDs the writer puts "id: <epoch>:" before each event's shared
// bytes: framing a batch allocates nothing, as without it.
func TestEpochIDsFramingDoesNotAllocate(t *testing.T) {
	b := newBus(t, Options{RingSize: 64})
	frames := publishN(t, b, 16)
	frames = append(frames, replayCompleteFrame(1, 16, b.Epoch(), 0))
	for _, epochIDs := range []bool{false, true} {
		s := stream{w: newMemWriter()}
		if epochIDs {
			s.idPrefix = []byte("id: " + b.Epoch() + ":")
		}
		s.reserve(frames)
		allocs := testing.AllocsPerRun(100, func() {
			s.buf = s.buf[:0]
			s.reserve(frames)
			for _, f := range frames {
				s.add(f)
			}
		})
		require.Zero(t, allocs, "epochIDs=%v", epochIDs)
		recs, err := parseSSE(s.buf)
		require.NoError(t, err)
		require.Len(t, recs, 17)
		for i, r := range recs[:16] {
			want := strconv.Itoa(i + 1)
			if epochIDs {
				want = b.Epoch() + ":" + want
			}
			require.Equal(t, want, r.Event.ID)
		}
	}
}
