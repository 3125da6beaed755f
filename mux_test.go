package eventbus

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ssebus/eventbus/internal/muxcursor"
)

// The multiplexed stream (MuxHandler), through the test environment's
// "GET /events" route, over HTTP/1.1 on loopback and HTTP/2 (h2c) on
// in-memory pipes inside a synctest bubble.

// muxPath is the multiplexed stream of sessions ids, with extra query
// pairs (key, value, ...).
func muxPath(ids []string, extra ...string) string {
	v := url.Values{"session": ids}
	for i := 0; i < len(extra); i += 2 {
		v.Add(extra[i], extra[i+1])
	}
	return "/events?" + v.Encode()
}

// muxFrame is one frame of a multiplexed stream as a test reads it: its
// session, and the event as a single stream of that session would carry
// it (Data without the session member; ID is the client's last event ID,
// the composite cursor).
type muxFrame struct {
	Session string
	sseEvent
}

// splitMux takes the session member out of a multiplexed frame's data,
// requiring it first in the envelope.
func splitMux(t testing.TB, ev sseEvent) muxFrame {
	t.Helper()
	var m struct {
		Session *string `json:"session"`
	}
	require.NoError(t, json.Unmarshal([]byte(ev.Data), &m), ev.Data)
	require.NotNil(t, m.Session, "every frame names its session: %s", ev.Data)
	member := `{"session":` + string(appendJSONString(nil, *m.Session)) + `,`
	require.True(t, strings.HasPrefix(ev.Data, member), "the session member comes first: %s", ev.Data)
	ev.Data = "{" + ev.Data[len(member):]
	return muxFrame{*m.Session, ev}
}

// nextMux returns the next frame, skipping comments and retry directives.
func nextMux(c *sseStream) muxFrame {
	c.t.Helper()
	return splitMux(c.t, c.skipToEvent())
}

// readMux reads n frames.
func readMux(c *sseStream, n int) []muxFrame {
	c.t.Helper()
	out := make([]muxFrame, n)
	for i := range out {
		out[i] = nextMux(c)
	}
	return out
}

// describeMux renders frames as "<session>#<id>" for events and
// "<session>:<type>" for the others.
func describeMux(fs []muxFrame) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		var env struct{ ID uint64 }
		_ = json.Unmarshal([]byte(f.Data), &env)
		if env.ID != 0 {
			out[i] = f.Session + "#" + strconv.FormatUint(env.ID, 10)
		} else {
			out[i] = f.Session + ":" + f.Type
		}
	}
	return out
}

// requireCursor requires the cursor c to hold exactly these (session,
// bus, last id) entries, in any order.
func requireCursor(t testing.TB, c string, want map[string]struct {
	bus *EventBus
	id  uint64
}) {
	t.Helper()
	cur, err := ParseCursor(c)
	require.NoError(t, err, "cursor %q", c)
	require.Len(t, cur, len(want), "cursor %q", c)
	for id, w := range want {
		e, ok := cur.Entry(id)
		require.True(t, ok, "cursor names %s", id)
		require.Equal(t, NewCursorEntry(id, w.bus.Epoch(), w.id), e, "entry of %s", id)
	}
}

type at = struct {
	bus *EventBus
	id  uint64
}

// muxEnvs runs f over HTTP/1.1 and over h2c (inside a synctest bubble).
func muxEnvs(t *testing.T, o envOptions, f func(t *testing.T, e *testEnv)) {
	t.Run("http1", func(t *testing.T) { f(t, newEnv(t, o)) })
	t.Run("h2c", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			o := o
			o.h2c = true
			f(t, newEnv(t, o))
		})
	})
}

// Every frame names its session first in its envelope, events carry the
// composite cursor as their id, synthetic frames and signals carry none;
// the rest of each envelope is the single stream's.
func TestMuxWire(t *testing.T) {
	muxEnvs(t, envOptions{}, func(t *testing.T, e *testEnv) {
		a, b := e.bus(t, "a", Options{}), e.bus(t, "b", Options{})
		publishN(t, a, 2)
		publishN(t, b, 1)
		c := e.stream(t, muxPath([]string{"a", "b"}), nil)
		require.Equal(t, a.Epoch()+","+b.Epoch(), c.resp.Header.Get("Event-Epochs"))
		require.Equal(t, "Event-Epochs", c.resp.Header.Get("Access-Control-Expose-Headers"))
		require.Empty(t, c.resp.Header.Get("Event-Epoch"))
		require.Equal(t, "no-cache, no-transform", c.resp.Header.Get("Cache-Control"))

		publishN(t, a, 1)
		f := nextMux(c)
		require.Equal(t, "a", f.Session)
		require.Equal(t, wantEvent(3).Data, f.Data, "live: no replay, no replay_complete")
		require.Equal(t, "e", f.Type, "the event: line is the type")
		requireCursor(t, f.ID, map[string]at{"a": {a, 3}, "b": {b, 1}})
		first := f.ID

		publishN(t, b, 1)
		f = nextMux(c)
		require.Equal(t, "b", f.Session)
		require.Equal(t, wantEvent(2).Data, f.Data)
		requireCursor(t, f.ID, map[string]at{"a": {a, 3}, "b": {b, 2}})
		require.Len(t, f.ID, 2+24*2, "16 + 24 × sessions bytes at most")

		require.NoError(t, a.Signal("changed", "doc/1"))
		f = nextMux(c)
		require.Equal(t, "a", f.Session)
		require.Equal(t, "changed", f.Type)
		require.Equal(t, `{"v":1,"type":"changed","about":"doc/1","_meta":{"serverTimestamp":1719000000000}}`, f.Data)
		require.NotEqual(t, first, f.ID)

		raw := string(c.raw())
		require.Contains(t, raw, "id: "+first+"\nevent: e\ndata: {\"session\":\"a\",\"id\":3,\"v\":1,\"type\":\"e\",\"data\":3,")
		require.Contains(t, raw, "\nevent: changed\ndata: {\"session\":\"a\",\"v\":1,", "a signal has no id line")
		require.NotContains(t, raw, "id: 3\n", "no single-stream id line")
		c.close()
	})
}

// A session's own synthetic frames (replay_complete, resyncs) and a
// session id that JSON must escape.
func TestMuxSyntheticFramesNameTheirSession(t *testing.T) {
	e := newEnv(t, envOptions{})
	id := `quote"and\back`
	a := e.bus(t, id, Options{})
	publishN(t, a, 2)
	cur := Cursor{NewCursorEntry(id, a.Epoch(), 1)}
	c := e.stream(t, muxPath([]string{id}), hdr("Last-Event-ID", cur.String()))
	fs := readMux(c, 2)
	require.Equal(t, id, fs[0].Session)
	require.Equal(t, wantEvent(2).Data, fs[0].Data)
	require.Equal(t, id, fs[1].Session)
	require.Equal(t, TypeReplayComplete, fs[1].Type)
	require.Equal(t, wantReplayComplete(a, 1, 2, "").Data, fs[1].Data)
	require.Equal(t, fs[0].ID, fs[1].ID, "a synthetic frame has no id line: the client keeps the cursor")
	require.Contains(t, string(c.raw()), `data: {"session":"quote\"and\\back","v":1,"type":"replay_complete"`)
}

// The request rules of point 2: the session list, then the single
// stream's query rules, then Lookup, Authorize and the subscriptions, all
// or none; every answer about one session names it.
func TestMuxRequestRules(t *testing.T) {
	e := newEnv(t, envOptions{mux: &MuxHandler{MaxStreamSessions: 3}})
	a := e.bus(t, "a", Options{})
	e.bus(t, "b", Options{})
	full := e.bus(t, "full", Options{MaxSubscribers: 1})
	subscribe(t, full, SubscribeOptions{})

	get := func(path string) *http.Response { return e.do(t, http.MethodGet, path, nil) }
	for _, tc := range []struct{ name, path string }{
		{"none", "/events"},
		{"none but other parameters", "/events?types=e"},
		{"more than MaxStreamSessions", muxPath([]string{"a", "b", "c", "d"})},
		{"empty", muxPath([]string{"a", ""})},
		{"repeated", muxPath([]string{"a", "b", "a"})},
		{"undecodable", "/events?session=a&session=%zz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := requireHTTPError(t, get(tc.path), http.StatusBadRequest, "invalid_sessions")
			require.NotContains(t, m, "session")
		})
	}
	t.Run("unknown", func(t *testing.T) {
		m := requireHTTPError(t, get(muxPath([]string{"a", "x", "y"})), http.StatusNotFound, "session_not_found")
		require.Equal(t, "x", m["session"], "the first unknown id")
	})
	t.Run("invalid filter", func(t *testing.T) {
		requireHTTPError(t, get(muxPath([]string{"a"}, "types", "Bad*")), http.StatusBadRequest, "invalid_filter")
	})
	t.Run("invalid maxQueued", func(t *testing.T) {
		requireHTTPError(t, get(muxPath([]string{"a"}, "maxQueued", "3")), http.StatusBadRequest, "invalid_max_queued")
		requireHTTPError(t, get("/events?session=a&maxQueued=%zz"), http.StatusBadRequest, "invalid_max_queued")
	})
	t.Run("full bus: all or none", func(t *testing.T) {
		resp := get(muxPath([]string{"a", "full"}))
		m := requireHTTPError(t, resp, http.StatusTooManyRequests, "subscriber_limit_exceeded")
		require.Equal(t, "full", m["session"])
		require.Equal(t, "5", resp.Header.Get("Retry-After"))
		require.Zero(t, a.SubscriberCount(), "the subscription made before the refusal is closed")
		require.Equal(t, 1, a.Stats().PeakSubscribers)
	})
	t.Run("HEAD subscribes to nothing", func(t *testing.T) {
		resp := e.do(t, http.MethodHead, muxPath([]string{"a", "full"}), nil)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
		require.Equal(t, a.Epoch()+","+full.Epoch(), resp.Header.Get("Event-Epochs"))
		require.Zero(t, a.SubscriberCount())
		resp = e.do(t, http.MethodHead, muxPath([]string{"a", "nope"}), nil)
		require.Equal(t, http.StatusNotFound, resp.StatusCode)
	})
	t.Run("the lastEventId and types parameters", func(t *testing.T) {
		publishEvent(t, a, Event{Type: "x"})
		publishEvent(t, a, Event{Type: "y"})
		cur := Cursor{NewCursorEntry("a", a.Epoch(), 0)}
		c := e.stream(t, muxPath([]string{"a"}, "lastEventId", cur.String(), "types", "y"), nil)
		fs := readMux(c, 2)
		require.Equal(t, []string{"a#2", "a:replay_complete"}, describeMux(fs))
		c.close()
	})
}

// Lookup's own answers name the session too.
func TestMuxLookupStatusError(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.bus(t, "a", Options{})
	e.h.Lookup = func(r *http.Request, id string) (*EventBus, error) {
		if id == "down" {
			return nil, Unavailable(2*time.Second, "store unreachable")
		}
		return e.lookupSession(r, id)
	}
	resp := e.do(t, http.MethodGet, muxPath([]string{"a", "down"}), nil)
	m := requireHTTPError(t, resp, http.StatusServiceUnavailable, "unavailable")
	require.Equal(t, "down", m["session"])
	require.Equal(t, "2", resp.Header.Get("Retry-After"))
}

// Authorize is asked for every session, in order; the first refusal
// answers, naming its session, and nothing is subscribed.
func TestMuxAuthorize(t *testing.T) {
	var asked []string
	o := envOptions{handler: &Handler{Authorize: func(r *http.Request, id string, _ *EventBus) (Grant, error) {
		asked = append(asked, id)
		if id == "b" && r.Header.Get("Authorization") != "Bearer yes" {
			return Grant{}, Forbidden("not yours")
		}
		return Grant{Subject: "user-" + id}, nil
	}}}
	e := newEnv(t, o)
	a, b := e.bus(t, "a", Options{}), e.bus(t, "b", Options{})
	e.bus(t, "c", Options{})
	m := requireHTTPError(t, e.do(t, http.MethodGet, muxPath([]string{"a", "b", "c"}), nil), http.StatusForbidden, "forbidden")
	require.Equal(t, "b", m["session"])
	require.Equal(t, []string{"a", "b"}, asked, "asked in order, up to the first refusal")
	require.Zero(t, a.Stats().PeakSubscribers)

	// Revoke by the subject of one session's Grant ends the stream with a
	// stream_error naming that session, and nothing queued after it.
	asked = nil
	c := e.stream(t, muxPath([]string{"a", "b", "c"}), hdr("Authorization", "Bearer yes"))
	require.Equal(t, []string{"a", "b", "c"}, asked)
	publishN(t, a, 1)
	require.Equal(t, []string{"a#1"}, describeMux(readMux(c, 1)))
	require.Equal(t, 1, e.mux.Revoke("user-b"), "one stream, filed under each subject once")
	f := nextMux(c)
	require.Equal(t, "b", f.Session)
	require.Equal(t, TypeStreamError, f.Type)
	require.Contains(t, f.Data, `"errorKind":"revoked"`)
	require.Empty(t, sseEvents(c.rest()))
	require.Zero(t, b.SubscriberCount())
	require.Zero(t, e.h.Revoke("user-a"), "the stream left the registry")
}

// The Handler's Authorize serves the multiplexed route too when the
// MuxHandler has none: once per session, with its bus.
func TestMuxAuthorizeFromHandler(t *testing.T) {
	var buses []*EventBus
	e := newEnv(t, envOptions{handler: &Handler{Authorize: func(_ *http.Request, _ string, bus *EventBus) (Grant, error) {
		buses = append(buses, bus)
		return Grant{}, nil
	}}})
	a, b := e.bus(t, "a", Options{}), e.bus(t, "b", Options{})
	c := e.stream(t, muxPath([]string{"b", "a"}), nil)
	require.Equal(t, []*EventBus{b, a}, buses)
	c.close()
}

// A Grant's lifetime ends the stream after what was queued, with
// stream_error reauthenticate naming the session whose Grant expires
// first.
func TestMuxLifetime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := envOptions{h2c: true, handler: &Handler{Authorize: func(_ *http.Request, id string, _ *EventBus) (Grant, error) {
			d := time.Hour
			if id == "b" {
				d = time.Minute
			}
			return Grant{Expires: time.Now().Add(d)}, nil
		}}}
		e := newEnv(t, o)
		a, b := e.bus(t, "a", Options{}), e.bus(t, "b", Options{})
		recs, end, _ := h2StreamAt(t, e.client, muxPath([]string{"a", "b"}), nil)
		publishN(t, a, 1)
		synctest.Wait()
		got := drain(recs)
		require.Len(t, got, 2, "retry:, a#1")
		require.Equal(t, "a", splitMux(t, got[1].Event).Session)
		time.Sleep(time.Minute - time.Millisecond)
		synctest.Wait()
		require.Empty(t, sseEvents(drain(recs)), "heartbeats only")
		time.Sleep(time.Millisecond)
		synctest.Wait()
		evs := sseEvents(drain(recs))
		require.Len(t, evs, 1)
		f := splitMux(t, evs[0])
		require.Equal(t, "b", f.Session)
		require.Contains(t, f.Data, `"errorKind":"reauthenticate"`)
		require.ErrorIs(t, end(), io.EOF, "the stream ended on an event boundary")
		require.Zero(t, a.SubscriberCount()+b.SubscriberCount())
	})
}

// Given back with the same sessions in another order, each session resumes
// as its own single stream would: what it missed and its own
// replay_complete; a session of the URL the cursor does not name starts
// live, without replay_complete.
func TestMuxResume(t *testing.T) {
	muxEnvs(t, envOptions{}, func(t *testing.T, e *testEnv) {
		a, b, c := e.bus(t, "a", Options{}), e.bus(t, "b", Options{}), e.bus(t, "c", Options{})
		s := e.stream(t, muxPath([]string{"a", "b"}), nil)
		publishN(t, a, 2)
		publishN(t, b, 1)
		fs := readMux(s, 3)
		require.Equal(t, []string{"a#1", "a#2", "b#1"}, describeMux(fs))
		cursor := fs[2].ID
		s.close()

		publishN(t, a, 1) // a#3
		publishN(t, b, 2) // b#2, b#3
		publishN(t, c, 1) // c#1, before the stream: not replayed
		for _, how := range []string{"header", "query"} {
			live := c.LastEventID() // c's entry: a resume from it loses nothing
			var r *sseStream
			if how == "header" {
				r = e.stream(t, muxPath([]string{"c", "b", "a"}), hdr("Last-Event-ID", cursor))
			} else {
				r = e.stream(t, muxPath([]string{"c", "b", "a"}, "lastEventId", cursor), nil)
			}
			fs = readMux(r, 5)
			got := describeMux(fs)
			// Order within a session is the bus's; across sessions the
			// stream takes in URL order.
			require.Equal(t, []string{"b#2", "b#3", "b:replay_complete", "a#3", "a:replay_complete"}, got, how)
			require.Equal(t, wantReplayComplete(b, 2, 3, "").Data, fs[2].Data)
			require.Equal(t, wantReplayComplete(a, 1, 3, "").Data, fs[4].Data)
			requireCursor(t, fs[4].ID, map[string]at{"a": {a, 3}, "b": {b, 3}, "c": {c, live}})
			publishN(t, c, 1)
			f := nextMux(r)
			require.Equal(t, "c", f.Session, "c is live")
			require.Equal(t, wantEvent(live+1).Data, f.Data)
			r.close()
		}
	})
}

// A cursor that cannot be parsed is logged and served live, never an
// error, and every session says so first: state_resync_required
// cursor_invalid with the first id it will deliver; a single stream's id is
// no cursor, and neither is one of more than MaxCursorEntries entries.
func TestMuxGarbageCursor(t *testing.T) {
	var huge Cursor
	for i := range MaxCursorEntries + 1 {
		huge = append(huge, NewCursorEntry("s"+strconv.Itoa(i), NewEpoch(), 1))
	}
	buf, _ := muxcursor.Append(nil, func() []muxcursor.Entry {
		var es []muxcursor.Entry
		for _, e := range huge {
			es = append(es, muxcursor.Entry(e))
		}
		return es
	}())
	for _, garbage := range []string{"57", "0123456789abcdef0123456789abcdef:5", "m1", "m1" + strings.Repeat("A", 23), "m1" + strings.Repeat("!", 24),
		"m2" + strings.Repeat("A", 24), "x y,\"z\"", string(buf)} {
		t.Run(garbage[:min(len(garbage), 40)], func(t *testing.T) {
			e := newEnv(t, envOptions{})
			a, b := e.bus(t, "a", Options{}), e.bus(t, "b", Options{})
			publishN(t, a, 3)
			c := e.stream(t, muxPath([]string{"a", "b"}), hdr("Last-Event-ID", garbage))
			publishN(t, a, 1)
			publishN(t, b, 1)
			by := map[string][]string{}
			for _, f := range readMux(c, 4) {
				by[f.Session] = append(by[f.Session], f.Data)
			}
			// Each session's notice before its first live frame, and no
			// replay_complete; across sessions nothing is promised.
			require.Equal(t, []string{wantCursorInvalid(a, 4, "").Data, wantEvent(4).Data}, by["a"])
			require.Equal(t, []string{wantCursorInvalid(b, 1, "").Data, wantEvent(1).Data}, by["b"])
			require.Len(t, e.logs.find("malformed multiplexed cursor"), 1)
			require.Equal(t, uint64(1), a.Stats().Resyncs.CursorInvalid)
			c.close()
		})
	}
}

// A cursor with two entries for one session cannot say where it stands:
// that session is live after its cursor_invalid notice (and logged), the
// others resume.
func TestMuxCursorAmbiguousEntry(t *testing.T) {
	e := newEnv(t, envOptions{})
	a, b := e.bus(t, "a", Options{}), e.bus(t, "b", Options{})
	publishN(t, a, 2)
	publishN(t, b, 2)
	cursor := Cursor{NewCursorEntry("a", a.Epoch(), 1), NewCursorEntry("a", a.Epoch(), 2), NewCursorEntry("b", b.Epoch(), 1)}.String()
	c := e.stream(t, muxPath([]string{"a", "b"}), hdr("Last-Event-ID", cursor))
	publishN(t, a, 1)
	by := map[string][]string{}
	for _, f := range readMux(c, 4) {
		by[f.Session] = append(by[f.Session], f.Data)
	}
	require.Equal(t, []string{wantCursorInvalid(a, 3, "").Data, wantEvent(3).Data}, by["a"])
	require.Equal(t, []string{wantEvent(2).Data, wantReplayComplete(b, 1, 2, "").Data}, by["b"])
	require.Len(t, e.logs.find("names a session ambiguously"), 1)
	c.close()
}

// Issue 32 point 3: a cursor as served plus 30 entries for sessions the
// URL does not name (794 bytes, more than the default 32 sessions' 770)
// resumes the URL's sessions exactly; the others' entries are ignored.
func TestMuxCursorLongerThanTheStreamResumes(t *testing.T) {
	e := newEnv(t, envOptions{})
	ids := []string{"ca", "cb", "cc"}
	buses := map[string]*EventBus{}
	for _, id := range ids {
		buses[id] = e.bus(t, id, Options{})
	}
	c := e.stream(t, muxPath(ids), nil)
	publishN(t, buses["ca"], 2)
	publishN(t, buses["cb"], 1)
	publishN(t, buses["cc"], 1)
	fs := readMux(c, 4)
	c.close()
	served, err := ParseCursor(fs[3].ID)
	require.NoError(t, err)
	require.Len(t, served, 3)
	for i := range 30 {
		served = served.Set("other-"+strconv.Itoa(i), NewEpoch(), uint64(i+1))
	}
	cursor := served.String()
	require.Len(t, cursor, 794)
	publishN(t, buses["ca"], 2) // missed while disconnected: ca#3, ca#4
	c = e.stream(t, muxPath([]string{"cc", "ca", "cb"}), hdr("Last-Event-ID", cursor))
	by := map[string][]string{}
	for _, f := range readMux(c, 5) {
		by[f.Session] = append(by[f.Session], describeMux([]muxFrame{f})[0])
	}
	require.Equal(t, map[string][]string{"ca": {"ca#3", "ca#4", "ca:replay_complete"}, "cb": {"cb:replay_complete"}, "cc": {"cc:replay_complete"}}, by)
	require.Empty(t, e.logs.find("multiplexed cursor"), "nothing to log: the cursor was used")
	require.Zero(t, buses["ca"].Stats().Resyncs.CursorInvalid)
	c.close()
}

// A ring eviction in one session: that session gets ring_evicted with
// exact ids, the others resume exactly.
func TestMuxResumeRingEvicted(t *testing.T) {
	muxEnvs(t, envOptions{}, func(t *testing.T, e *testEnv) {
		a, b := e.bus(t, "a", Options{RingSize: 4}), e.bus(t, "b", Options{})
		s := e.stream(t, muxPath([]string{"a", "b"}), nil)
		publishN(t, a, 1)
		publishN(t, b, 1)
		fs := readMux(s, 2)
		cursor := fs[1].ID
		s.close()
		publishN(t, a, 6) // a#2..7; the ring keeps 4..7
		publishN(t, b, 2) // b#2, b#3

		r := e.stream(t, muxPath([]string{"a", "b"}), hdr("Last-Event-ID", cursor))
		fs = readMux(r, 9)
		require.Equal(t, []string{"a:state_resync_required", "a#4", "a#5", "a#6", "a#7", "a:replay_complete", "b#2", "b#3", "b:replay_complete"}, describeMux(fs))
		require.Equal(t, wantSynth(TypeStateResyncRequired, `{"reason":"ring_evicted","lastDeliveredId":1,"earliestAvailableId":4,"epoch":"`+a.Epoch()+`"}`, "").Data, fs[0].Data)
		require.Equal(t, wantReplayComplete(b, 2, 3, "").Data, fs[8].Data)
		r.close()
	})
}

// A DELETE and re-creation of one session (a new bus, a new epoch) is
// epoch_reset for it only, with the replay of its new epoch; the others
// resume exactly. The same holds for every session after a daemon restart.
func TestMuxResumeEpochReset(t *testing.T) {
	muxEnvs(t, envOptions{}, func(t *testing.T, e *testEnv) {
		a, b := e.bus(t, "a", Options{}), e.bus(t, "b", Options{})
		s := e.stream(t, muxPath([]string{"a", "b"}), nil)
		publishN(t, a, 2)
		publishN(t, b, 1)
		cursor := readMux(s, 3)[2].ID
		s.close()

		old := a
		a = e.bus(t, "a", Options{}) // re-created: a new bus
		_ = old.Close()
		publishN(t, a, 1)
		publishN(t, b, 1)
		r := e.stream(t, muxPath([]string{"b", "a"}), hdr("Last-Event-ID", cursor))
		fs := readMux(r, 5)
		require.Equal(t, []string{"b#2", "b:replay_complete", "a:state_resync_required", "a#1", "a:replay_complete"}, describeMux(fs))
		require.Equal(t, wantSynth(TypeStateResyncRequired, `{"reason":"epoch_reset","detail":"epoch_mismatch","lastDeliveredId":2,"earliestAvailableId":1,"epoch":"`+a.Epoch()+`"}`, "").Data, fs[2].Data)
		requireCursor(t, fs[4].ID, map[string]at{"a": {a, 1}, "b": {b, 2}})
		r.close()

		// After the reset the cursor is of the new epoch: a plain resume.
		publishN(t, a, 1)
		r = e.stream(t, muxPath([]string{"a", "b"}), hdr("Last-Event-ID", fs[4].ID))
		require.Equal(t, []string{"a#2", "a:replay_complete", "b:replay_complete"}, describeMux(readMux(r, 3)))
		r.close()

		// A cursor that names a recreated session with no event of its new
		// epoch delivered resumes it from the start of that epoch.
		c := e.bus(t, "c", Options{})
		publishN(t, c, 1)
		stale := Cursor{NewCursorEntry("c", NewEpoch(), 9)}
		r = e.stream(t, muxPath([]string{"c"}), hdr("Last-Event-ID", stale.String()))
		fs = readMux(r, 3)
		require.Equal(t, []string{"c:state_resync_required", "c#1", "c:replay_complete"}, describeMux(fs))
		requireCursor(t, fs[1].ID, map[string]at{"c": {c, 1}})
		r.close()
	})
}

// The replay budget applies per session.
func TestMuxResumeReplayBudget(t *testing.T) {
	e := newEnv(t, envOptions{})
	size := len(wantEvent(1).Data)
	a, b := e.bus(t, "a", Options{ReplayBudgetBytes: 2 * size}), e.bus(t, "b", Options{})
	cur := Cursor{NewCursorEntry("a", a.Epoch(), 0), NewCursorEntry("b", b.Epoch(), 0)}
	publishN(t, a, 5)
	publishN(t, b, 3)
	r := e.stream(t, muxPath([]string{"a", "b"}), hdr("Last-Event-ID", cur.String()))
	fs := readMux(r, 8)
	require.Equal(t, []string{"a#1", "a#2", "a:state_resync_required", "a:replay_complete", "b#1", "b#2", "b#3", "b:replay_complete"}, describeMux(fs))
	require.Contains(t, fs[2].Data, `"reason":"replay_budget_exceeded","lastDeliveredId":2,"earliestAvailableId":3`)
	r.close()
}

// The cursor "0" (Last-Event-ID or ?lastEventId=; "00" as a single stream
// reads it) starts every session from the start of its ring, each as its
// single stream with Last-Event-ID 0: its replay and its replay_complete
// (with replayedCount 0 for an empty ring), ring_evicted first for a ring
// that lost its start, the replay budget per session; then live.
func TestMuxFromTheStart(t *testing.T) {
	for _, how := range []string{"header", "query", "00"} {
		t.Run(how, func(t *testing.T) {
			muxEnvs(t, envOptions{}, func(t *testing.T, e *testEnv) {
				size := len(wantEvent(1).Data)
				a := e.bus(t, "a", Options{})
				empty := e.bus(t, "empty", Options{})
				budget := e.bus(t, "budget", Options{ReplayBudgetBytes: 2 * size})
				evicted := e.bus(t, "evicted", Options{RingSize: 2})
				publishN(t, a, 3)
				publishN(t, budget, 5)
				publishN(t, evicted, 4)
				ids := []string{"a", "empty", "budget", "evicted"}
				var s *sseStream
				switch how {
				case "header":
					s = e.stream(t, muxPath(ids), hdr("Last-Event-ID", "0"))
				case "query":
					s = e.stream(t, muxPath(ids, "lastEventId", "0"), nil)
				default:
					s = e.stream(t, muxPath(ids), hdr("Last-Event-ID", "00"))
				}
				fs := readMux(s, 13)
				by := map[string][]string{}
				data := map[string][]string{}
				for _, f := range fs {
					by[f.Session] = append(by[f.Session], describeMux([]muxFrame{f})[0])
					data[f.Session] = append(data[f.Session], f.Data)
				}
				require.Equal(t, map[string][]string{
					"a":       {"a#1", "a#2", "a#3", "a:replay_complete"},
					"empty":   {"empty:replay_complete"},
					"budget":  {"budget#1", "budget#2", "budget:state_resync_required", "budget:replay_complete"},
					"evicted": {"evicted:state_resync_required", "evicted#3", "evicted#4", "evicted:replay_complete"},
				}, by)
				require.Equal(t, wantReplayComplete(a, 3, 3, "").Data, data["a"][3])
				require.Equal(t, wantReplayComplete(empty, 0, 0, "").Data, data["empty"][0])
				require.Contains(t, data["budget"][2], `"reason":"replay_budget_exceeded","lastDeliveredId":2,"earliestAvailableId":3`)
				require.Equal(t, wantReplayComplete(budget, 2, 2, "").Data, data["budget"][3])
				require.Contains(t, data["evicted"][0], `"reason":"ring_evicted","lastDeliveredId":0,"earliestAvailableId":3`)
				require.Empty(t, e.logs.find("malformed multiplexed cursor"), "0 is a cursor")

				// Live: the cursor holds every session, an empty one at 0.
				publishN(t, empty, 1)
				f := nextMux(s)
				require.Equal(t, []string{"empty#1"}, describeMux([]muxFrame{f}))
				requireCursor(t, f.ID, map[string]at{"a": {a, 3}, "empty": {empty, 1}, "budget": {budget, 2}, "evicted": {evicted, 4}})
				s.close()
			})
		})
	}
}

// The cursor of 32 sessions, the most by default, is 2 + 24×32 bytes, and
// resumes all of them.
func TestMuxCursorLengthBound(t *testing.T) {
	e := newEnv(t, envOptions{})
	ids := make([]string, DefaultMaxStreamSessions)
	buses := make([]*EventBus, len(ids))
	for i := range ids {
		ids[i] = strings.Repeat("session-with-a-long-id-", 8) + strconv.Itoa(i)
		buses[i] = e.bus(t, ids[i], Options{})
	}
	s := e.stream(t, muxPath(ids), nil)
	for _, b := range buses {
		publishN(t, b, 1)
	}
	fs := readMux(s, len(ids))
	for _, f := range fs {
		require.LessOrEqual(t, len(f.ID), 16+24*len(ids))
		require.Len(t, f.ID, 2+24*len(ids))
		require.NotContains(t, f.ID, " ")
		require.NotContains(t, f.ID, ",")
		require.NotContains(t, f.ID, `"`)
	}
	cursor := fs[len(fs)-1].ID
	s.close()
	for _, b := range buses {
		publishN(t, b, 1)
	}
	r := e.stream(t, muxPath(ids), hdr("Last-Event-ID", cursor))
	fs = readMux(r, 2*len(ids))
	for i, id := range ids {
		require.Equal(t, []string{id + "#2", id + ":replay_complete"}, describeMux(fs[2*i:2*i+2]))
	}
	r.close()
	resp := e.do(t, http.MethodGet, muxPath(append(ids, "one-more")), nil)
	requireHTTPError(t, resp, http.StatusBadRequest, "invalid_sessions")
}

// Backpressure stays per session: an eviction of one session ends the
// whole stream with its client_evicted.
func TestMuxEviction(t *testing.T) {
	logs := &logCapture{}
	a := newBus(t, logs.capture(Options{MaxQueued: 16}))
	b := newBus(t, logs.capture(Options{}))
	hm := serveHeldMux(t, logs, a, b, nil)
	publishN(t, b, 1)
	<-hm.started // the writer holds b's event
	publishN(t, a, 17)
	require.Zero(t, a.SubscriberCount(), "a's queue overflowed: evicted")
	require.Equal(t, 1, b.SubscriberCount(), "b's own queue is fine")
	close(hm.release)
	<-hm.done
	fs := hm.frames(t)
	got := describeMux(fs)
	require.Equal(t, "b#1", got[0])
	require.Equal(t, "a:client_evicted", got[len(got)-1], "the stream ends with a's eviction")
	require.Contains(t, fs[len(fs)-1].Data, `"reason":"queue_overflow"`)
	require.Zero(t, b.SubscriberCount(), "the whole stream ended")
}

// Under OverflowCatchUp nothing is evicted: a session that falls behind
// catches up from its ring, the other goes on.
func TestMuxCatchUp(t *testing.T) {
	logs := &logCapture{}
	a := newBus(t, logs.capture(Options{MaxQueued: 16, OverflowPolicy: OverflowCatchUp}))
	b := newBus(t, logs.capture(Options{}))
	hm := serveHeldMux(t, logs, a, b, nil)
	publishN(t, b, 1)
	<-hm.started
	publishN(t, a, 100)
	require.Equal(t, 1, a.SubscriberCount(), "behind, not evicted")
	close(hm.release)
	require.Eventually(t, func() bool { return strings.Count(hm.w.state().body, `"session":"a","id":`) == 100 }, 10*time.Second, time.Millisecond)
	hm.cancel()
	<-hm.done
	require.Zero(t, a.Stats().Evictions.QueueOverflow)
	require.Positive(t, a.Stats().CatchUp.Entered)
	require.Equal(t, uint64(101), a.Stats().FramesDelivered, "100 events and the slow_client_warning")
	require.Contains(t, hm.w.state().body, `data: {"session":"a","v":1,"type":"slow_client_warning"`)
}

// A session whose bus closes while streaming sends its queued frames and a
// terminal frame and leaves the stream; the others go on; the stream ends
// with its last session.
func TestMuxSessionClosed(t *testing.T) {
	muxEnvs(t, envOptions{}, func(t *testing.T, e *testEnv) {
		a, b, c := e.bus(t, "a", Options{}), e.bus(t, "b", Options{}), e.bus(t, "c", Options{})
		s := e.stream(t, muxPath([]string{"a", "b", "c"}), nil)
		publishN(t, a, 1)
		require.Equal(t, []string{"a#1"}, describeMux(readMux(s, 1)))

		publishN(t, b, 2)
		_ = b.Close() // a Hub's Delete
		fs := readMux(s, 3)
		require.Equal(t, []string{"b#1", "b#2", "b:stream_error"}, describeMux(fs))
		require.Equal(t, wantSynth(TypeStreamError, `{"error":"session closed","errorKind":"closed"}`, "").Data, fs[2].Data)

		_ = c.closeWithError(ErrorKindUnavailable, "engine down")
		f := nextMux(s)
		require.Equal(t, "c", f.Session)
		require.Equal(t, wantSynth(TypeStreamError, `{"error":"engine down","errorKind":"unavailable"}`, "").Data, f.Data, "the bus's own terminal frame, once")

		publishN(t, a, 1)
		f = nextMux(s)
		require.Equal(t, []string{"a#2"}, describeMux([]muxFrame{f}), "a goes on")
		requireCursor(t, f.ID, map[string]at{"a": {a, 2}, "b": {b, 2}, "c": {c, 0}})

		_ = a.Close()
		rest := s.rest()
		evs := sseEvents(rest)
		require.Len(t, evs, 1)
		require.Equal(t, "a:stream_error", describeMux([]muxFrame{splitMux(t, evs[0])})[0])
	})
}

// Idle streams: heartbeats as on a single stream, and no write deadline
// while idle on HTTP/2 (an idle period longer than WriteTimeout).
func TestMuxHeartbeatAndIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, envOptions{h2c: true, handler: &Handler{Heartbeat: time.Minute, WriteTimeout: 5 * time.Second}})
		a, b := e.bus(t, "a", Options{}), e.bus(t, "b", Options{})
		recs, _, cancel := h2StreamAt(t, e.client, muxPath([]string{"a", "b"}), nil)
		defer cancel()
		synctest.Wait()
		require.Equal(t, []sseRecord{{Kind: sseRetryRecord, Retry: 3000}}, drain(recs))
		time.Sleep(45 * time.Second)
		synctest.Wait()
		require.Empty(t, drain(recs))
		publishN(t, b, 1)
		synctest.Wait()
		got := drain(recs)
		require.Len(t, got, 1)
		require.Equal(t, "b", splitMux(t, got[0].Event).Session)
		for i := range 3 {
			time.Sleep(time.Minute)
			synctest.Wait()
			want := sseRecord{Kind: sseCommentRecord}
			if i == 0 {
				want = sseRecord{Kind: sseRetryRecord, Retry: 3000}
			}
			require.Equal(t, []sseRecord{want}, drain(recs))
		}
		require.Equal(t, 1, a.SubscriberCount())
		require.Zero(t, a.Stats().Dropped.Blocked+b.Stats().Dropped.Blocked)
	})
}

// One write and one flush per batch: frames of several sessions ready at
// once go out together, and each bus counts its own delivered frames.
func TestMuxOneWritePerBatch(t *testing.T) {
	logs := &logCapture{}
	a := newBus(t, logs.capture(Options{}))
	b := newBus(t, logs.capture(Options{}))
	hm := serveHeldMux(t, logs, a, b, nil)
	publishN(t, a, 1)
	<-hm.started
	publishN(t, a, 3)
	publishN(t, b, 3)
	close(hm.release)
	require.Eventually(t, func() bool { return strings.Count(hm.w.state().body, "\nevent: e\n") == 7 }, 10*time.Second, time.Millisecond)
	st := hm.w.state()
	require.Equal(t, 3, st.writes, "the retry: line, a#1, then a#2..4 and b#1..3 in one write")
	require.Equal(t, 3, st.flushes)
	hm.cancel()
	<-hm.done
	require.Equal(t, uint64(4), a.Stats().FramesDelivered)
	require.Equal(t, uint64(3), b.Stats().FramesDelivered)
	require.Equal(t, []string{"a#1", "a#2", "a#3", "a#4", "b#1", "b#2", "b#3"}, describeMux(hm.frames(t)))
}

// A write that fails drops every session's subscription, counting the
// frames of the failed batch as blocked, each on its own bus.
func TestMuxWriteFailed(t *testing.T) {
	logs := &logCapture{}
	a := newBus(t, logs.capture(Options{}))
	b := newBus(t, logs.capture(Options{}))
	hm := serveHeldMux(t, logs, a, b, errors.New("broken pipe"))
	publishN(t, a, 1)
	<-hm.started
	publishN(t, a, 2)
	publishN(t, b, 3)
	close(hm.release)
	<-hm.done
	require.Zero(t, a.SubscriberCount()+b.SubscriberCount())
	require.Equal(t, uint64(2), a.Stats().Dropped.Blocked)
	require.Equal(t, uint64(3), b.Stats().Dropped.Blocked)
	require.Equal(t, uint64(1), a.Stats().FramesDelivered)
	require.Len(t, logs.kind(DiagWriteFailed), 2)
}

// heldMux is a multiplexed stream of sessions "a" and "b" served into a
// memWriter whose second write (the first batch after the retry: line)
// blocks until release is closed; with fail set, the third write fails.
type heldMux struct {
	w                *memWriter
	started, release chan struct{} // the blocked write has started; let it go on
	done             chan struct{} // ServeHTTP returned
	cancel           context.CancelFunc
}

// serveHeldMux starts it and returns once both sessions are subscribed.
func serveHeldMux(t *testing.T, logs *logCapture, a, b *EventBus, fail error) *heldMux {
	m := &MuxHandler{Handler: withLookup(&Handler{Logger: logs.logger(), RetryJitter: testJitter(0)}, busesByID(map[string]*EventBus{"a": a, "b": b}))}
	hm := &heldMux{w: newMemWriter(), started: make(chan struct{}), release: make(chan struct{}), done: make(chan struct{})}
	subscribed := make(chan struct{})
	hm.w.beforeWrite = func(n int, _ []byte) error {
		switch n {
		case 1: // the retry: line, after every Subscribe
			close(subscribed)
		case 2:
			close(hm.started)
			<-hm.release
		case 3:
			return fail
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	hm.cancel = cancel
	t.Cleanup(func() { cancel(); <-hm.done })
	go func() {
		defer close(hm.done)
		m.ServeHTTP(hm.w, muxRequest(t, []string{"a", "b"}, nil).WithContext(ctx))
	}()
	<-subscribed
	return hm
}

// frames parses what the stream wrote.
func (hm *heldMux) frames(t *testing.T) []muxFrame {
	recs, err := parseSSE([]byte(hm.w.state().body))
	require.NoError(t, err)
	var fs []muxFrame
	for _, ev := range sseEvents(recs) {
		fs = append(fs, splitMux(t, ev))
	}
	return fs
}

// busesByID is a MuxHandler Lookup over a fixed map.
func busesByID(m map[string]*EventBus) func(*http.Request, string) (*EventBus, error) {
	return func(_ *http.Request, id string) (*EventBus, error) {
		if b, ok := m[id]; ok {
			return b, nil
		}
		return nil, ErrSessionNotFound
	}
}

// muxRequest is a GET of the multiplexed stream of ids.
func muxRequest(t testing.TB, ids []string, h http.Header) *http.Request {
	r, err := http.NewRequest(http.MethodGet, "http://x"+muxPath(ids), nil)
	require.NoError(t, err)
	for k, vs := range h {
		r.Header[k] = vs
	}
	return r
}

// Through a Hub: LookupSession never creates a session; a Delete ends that
// session's part of the stream; after its re-creation a resume is
// epoch_reset for it alone.
func TestMuxHubDeleteAndRecreate(t *testing.T) {
	hub := newTestHub(t, HubOptions{Bus: Options{Now: testNow}})
	m := &MuxHandler{Handler: &Handler{RetryJitter: testJitter(0), Logger: (&logCapture{}).logger(), Lookup: hub.LookupSession}}
	srv := httptest.NewServer(m)
	t.Cleanup(srv.Close)
	open := func(cursor string) *sseStream {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+muxPath([]string{"a", "b"}), nil)
		require.NoError(t, err)
		if cursor != "" {
			req.Header.Set("Last-Event-ID", cursor)
		}
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { _ = resp.Body.Close() })
		return newSSEStream(t, resp)
	}
	c := open("")
	m404 := requireHTTPError(t, c.resp, http.StatusNotFound, "session_not_found")
	require.Equal(t, "a", m404["session"])
	require.Zero(t, hub.Len(), "a stream creates no session")

	a, err := hub.GetOrCreate("a")
	require.NoError(t, err)
	b, err := hub.GetOrCreate("b")
	require.NoError(t, err)
	c = open("")
	publishN(t, a, 1)
	publishN(t, b, 1)
	fs := readMux(c, 2)
	cursor := fs[1].ID
	require.True(t, hub.Delete("b"))
	f := nextMux(c)
	require.Equal(t, []string{"b:stream_error"}, describeMux([]muxFrame{f}))
	require.Contains(t, f.Data, `"errorKind":"closed"`)
	publishN(t, a, 1)
	require.Equal(t, []string{"a#2"}, describeMux(readMux(c, 1)), "a goes on")
	c.close()

	b2, err := hub.GetOrCreate("b")
	require.NoError(t, err)
	publishN(t, b2, 1)
	c = open(cursor)
	fs = readMux(c, 5)
	require.Equal(t, []string{"a#2", "a:replay_complete", "b:state_resync_required", "b#1", "b:replay_complete"}, describeMux(fs))
	require.Contains(t, fs[2].Data, `"reason":"epoch_reset","detail":"epoch_mismatch","lastDeliveredId":1`)
	c.close()
}

// CORS is the Handler's: a refused origin gets 403 before any lookup, an
// allowed one the stream with its headers, a preflight its answer.
func TestMuxCORS(t *testing.T) {
	e := newEnv(t, envOptions{anyMethod: true, handler: &Handler{CORS: &CORS{Origins: []string{"https://app.example"}}}})
	e.bus(t, "a", Options{})
	resp := e.do(t, http.MethodGet, muxPath([]string{"a"}), hdr("Origin", "https://evil.example"))
	requireHTTPError(t, resp, http.StatusForbidden, "origin_not_allowed")
	resp = e.do(t, http.MethodOptions, muxPath([]string{"a"}), hdr("Origin", "https://app.example", "Access-Control-Request-Method", "GET", "Access-Control-Request-Headers", "last-event-id"))
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	require.Equal(t, "https://app.example", resp.Header.Get("Access-Control-Allow-Origin"))
	resp = e.do(t, http.MethodPost, muxPath([]string{"a"}), nil)
	requireHTTPError(t, resp, http.StatusMethodNotAllowed, "method_not_allowed")
	c := e.stream(t, muxPath([]string{"a"}), hdr("Origin", "https://app.example"))
	require.Equal(t, "https://app.example", c.resp.Header.Get("Access-Control-Allow-Origin"))
	require.Equal(t, "Event-Epochs", c.resp.Header.Get("Access-Control-Expose-Headers"))
	c.close()
}

// The Handler's EpochIDs changes the single stream's id lines only: the
// multiplexed stream's cursor always carries the epochs.
func TestMuxEpochIDsSetting(t *testing.T) {
	for _, on := range []bool{false, true} {
		e := newEnv(t, envOptions{epochIDs: on})
		a := e.bus(t, "a", Options{})
		publishN(t, a, 1)
		single := e.stream(t, "/session/a/events", hdr("Last-Event-ID", "0"))
		want := "1"
		if on {
			want = a.Epoch() + ":1"
		}
		require.Equal(t, want, single.nextEvent().ID)
		single.close()
		c := e.stream(t, muxPath([]string{"a"}), hdr("Last-Event-ID", Cursor{NewCursorEntry("a", a.Epoch(), 0)}.String()))
		f := nextMux(c)
		requireCursor(t, f.ID, map[string]at{"a": {a, 1}})
		c.close()
	}
}

// A Hub's Shutdown: every session of the stream gets its own shutdown
// frame, after what was queued for it, and the stream ends with the last.
// The order between sessions is whichever bus the Hub closed first and the
// stream found ready first, not a contract: each session's own order is.
func TestMuxHubShutdown(t *testing.T) {
	hub := newTestHub(t, HubOptions{Bus: Options{Now: testNow}})
	m := &MuxHandler{Handler: &Handler{RetryJitter: testJitter(0), Logger: (&logCapture{}).logger(), Lookup: hub.LookupSession}}
	srv := httptest.NewServer(m)
	t.Cleanup(srv.Close)
	a, err := hub.GetOrCreate("a")
	require.NoError(t, err)
	_, err = hub.GetOrCreate("b")
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+muxPath([]string{"a", "b"}), nil)
	require.NoError(t, err)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	c := newSSEStream(t, resp)
	t.Cleanup(c.close)
	publishN(t, a, 1)
	require.NoError(t, hub.Shutdown(t.Context()))
	var fs []muxFrame
	for _, ev := range sseEvents(c.rest()) {
		fs = append(fs, splitMux(t, ev))
	}
	bySession := map[string][]string{}
	for i, d := range describeMux(fs) {
		bySession[fs[i].Session] = append(bySession[fs[i].Session], d)
		if fs[i].Type == "stream_error" {
			require.Contains(t, fs[i].Data, `"errorKind":"shutdown"`)
		}
	}
	require.Equal(t, map[string][]string{"a": {"a#1", "a:stream_error"}, "b": {"b:stream_error"}}, bySession)
	require.Equal(t, "stream_error", fs[len(fs)-1].Type, "the stream ends with a session's shutdown frame")
}

// Framing a multiplexed batch allocates nothing once the batch buffer is
// reserved (SPEC 6.8: 0 allocations per event on the stream): each event's
// shared bytes are copied with the session member spliced in and the
// cursor in place of its id line, with no re-encoding; a synthetic frame
// likewise. The serve loop's per-frame work, as serve does it.
func TestMuxFramingDoesNotAllocate(t *testing.T) {
	a, b := newBus(t, Options{RingSize: 64}), newBus(t, Options{RingSize: 64})
	ma, mb := newMember("a", a), newMember(`b"`, b)
	var frames []Frame
	var owners []*Member
	for i, f := range publishN(t, a, 8) {
		frames, owners = append(frames, f, publishN(t, b, 1)[0]), append(owners, ma, mb)
		if i == 3 {
			frames, owners = append(frames, replayCompleteFrame(1, 4, a.Epoch(), 0)), append(owners, ma)
		}
	}
	st := &Stream{order: []*Member{ma, mb}}
	st.layCursor()
	batch := &Batch{st: st, frames: frames, owners: owners}
	s := &sseTransport{w: newMemWriter(), multiplexed: true}
	frame := func() {
		s.buf = s.buf[:0]
		ma.entry.ID, mb.entry.ID = 0, 0
		batch.applied = 0
		s.reserve(batch)
		for k := range frames {
			s.addMux(batch, k)
		}
	}
	frame()
	require.Zero(t, testing.AllocsPerRun(100, frame))

	recs, err := parseSSE(s.buf)
	require.NoError(t, err)
	var fs []muxFrame
	for _, ev := range sseEvents(recs) {
		fs = append(fs, splitMux(t, ev))
	}
	require.Len(t, fs, len(frames))
	require.Equal(t, []string{"a#1", `b"#1`, "a#2", `b"#2`, "a#3", `b"#3`, "a#4", `b"#4`, "a:replay_complete", "a#5"}, describeMux(fs[:10]))
	for k, f := range fs {
		want := frames[k].JSON()
		require.Equal(t, string(want), f.Data, "frame %d: the shared envelope, unchanged but for the session member", k)
	}
	requireCursor(t, fs[len(fs)-1].ID, map[string]at{"a": {a, 8}, `b"`: {b, 8}})
}

// The stream holds at most the sum of its subscriptions' caps: one batch
// (what is written before one flush) takes from each session at most its
// frame cap and its byte cap (Frame.Size, the envelope without the session
// member), so never more than the sums of both. Two sessions fall far
// behind a blocked writer under OverflowCatchUp (whose ring could give
// more): a's small events meet its frame cap, b's 1 KiB events its byte
// cap, both in the largest batches.
func TestMuxBatchWithinTheSumOfCaps(t *testing.T) {
	const frameCap, byteCap = 16, 12 << 10
	logs := &logCapture{}
	opts := Options{RingSize: 1024, MaxQueued: frameCap, MaxQueuedBytes: byteCap, OverflowPolicy: OverflowCatchUp}
	a, b := newBus(t, logs.capture(opts)), newBus(t, logs.capture(opts))
	hm := serveHeldMux(t, logs, a, b, nil)
	var flushedAt []int // the body's length at each flush
	hm.w.mu.Lock()
	hm.w.beforeFlush = func(int) { flushedAt = append(flushedAt, len(hm.w.state().body)) }
	hm.w.mu.Unlock()
	publishN(t, b, 1)
	<-hm.started // the writer holds b#1
	publishN(t, a, 200)
	for i := range 100 {
		publishEvent(t, b, sizedEvent(t, uint64(i+2), 1<<10))
	}
	close(hm.release)
	require.Eventually(t, func() bool {
		body := hm.w.state().body
		return strings.Count(body, `"session":"a","id":`) == 200 && strings.Count(body, `"session":"b","id":`) == 101
	}, 10*time.Second, time.Millisecond)
	hm.cancel()
	<-hm.done

	body := hm.w.state().body
	largest := map[string]int{}
	from := 0
	for _, to := range flushedAt {
		recs, err := parseSSE([]byte(body[from:to]))
		require.NoError(t, err)
		from = to
		frames, bytes := map[string]int{}, map[string]int{}
		for _, ev := range sseEvents(recs) {
			f := splitMux(t, ev)
			if f.Type == TypeSlowClientWarning {
				continue // synthetic: no cap counts it
			}
			frames[f.Session]++
			bytes[f.Session] += len(f.Data) // the envelope, Size
		}
		for _, s := range []string{"a", "b"} {
			require.LessOrEqual(t, frames[s], frameCap, "session %s: frames of one batch", s)
			require.LessOrEqual(t, bytes[s], byteCap, "session %s: bytes of one batch", s)
			largest[s] = max(largest[s], frames[s])
		}
		require.LessOrEqual(t, frames["a"]+frames["b"], 2*frameCap, "one batch: at most the sum of the frame caps")
		require.LessOrEqual(t, bytes["a"]+bytes["b"], 2*byteCap, "one batch: at most the sum of the byte caps")
	}
	require.Equal(t, len(body), from, "every byte was flushed")
	require.Equal(t, frameCap, largest["a"], "a's batches reach its frame cap")
	require.Equal(t, byteCap>>10, largest["b"], "b's batches reach its byte cap: 12 events of 1 KiB")
	require.Zero(t, a.Stats().Evictions.QueueOverflow+b.Stats().Evictions.QueueOverflow)
}

// steadyGoroutines returns runtime.NumGoroutine once it has stayed the same
// for 100 ms (net/http's goroutines start and end asynchronously).
func steadyGoroutines(t *testing.T) int {
	t.Helper()
	last, since := runtime.NumGoroutine(), time.Now()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
		if n := runtime.NumGoroutine(); n != last {
			last, since = n, time.Now()
		} else if time.Since(since) >= 100*time.Millisecond {
			return n
		}
	}
	require.FailNow(t, "the number of goroutines did not settle", "last %d", last)
	return 0
}

// No goroutine per session: one multiplexed stream over 32 sessions adds
// exactly the goroutines of one single-session stream (the request's, and
// net/http's of its connection), while every session delivers.
func TestMuxNoGoroutinePerSession(t *testing.T) {
	e := newEnv(t, envOptions{})
	ids := make([]string, DefaultMaxStreamSessions)
	buses := make([]*EventBus, len(ids))
	for i := range ids {
		ids[i] = "s" + strconv.Itoa(i)
		buses[i] = e.bus(t, ids[i], Options{})
	}
	e.client.Transport.(*http.Transport).DisableKeepAlives = true // no idle connection left between the streams

	base := steadyGoroutines(t)
	c := e.stream(t, "/session/s0/events", nil)
	publishN(t, buses[0], 1)
	require.Equal(t, wantEvent(1), c.nextEvent())
	single := steadyGoroutines(t) - base
	c.close()
	require.LessOrEqual(t, waitGoroutines(base), base, "the single stream left goroutines behind")

	base = steadyGoroutines(t)
	m := e.stream(t, muxPath(ids), nil)
	for _, b := range buses {
		publishN(t, b, 1)
	}
	require.Len(t, readMux(m, len(ids)), len(ids))
	multiplexed := steadyGoroutines(t) - base
	require.Positive(t, single)
	t.Logf("goroutines: +%d for a single stream, +%d for a multiplexed stream of %d sessions", single, multiplexed, len(ids))
	require.Equal(t, single, multiplexed, "one stream over %d sessions: the goroutines of one stream", len(ids))
	m.close()
	require.LessOrEqual(t, waitGoroutines(base), base, "the multiplexed stream left goroutines behind")
}

// unreadMux opens the stream at path on e and reads nothing of it (over
// HTTP/1.1 the sockets' buffers take a few MiB, over h2c the flow-control
// window 4 MiB).
func unreadMux(t *testing.T, e *testEnv, path string) *http.Response {
	t.Helper()
	resp := e.do(t, http.MethodGet, path, nil)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return resp
}

// blockWriter publishes events of 256 KiB to b, one at a time, until the
// stream of a client that does not read holds one it cannot write: the
// writer is then blocked, and what the stream's other sessions get stays in
// their queues. Over h2c the bubble tells exactly; over HTTP/1.1 a frame
// not delivered a second after its publish is one the writer is blocked on
// (a write that can go on takes microseconds).
func blockWriter(t *testing.T, e *testEnv, b *EventBus) {
	t.Helper()
	payload := strings.Repeat("x", 256<<10)
	blocked := func() bool { st := b.Stats(); return st.FramesDelivered < st.Published }
	for range 1024 { // 256 MiB: far more than any socket buffer
		publishEvent(t, b, Event{Type: "big", Data: payload})
		if e.srv == nil {
			synctest.Wait()
		} else {
			for deadline := time.Now().Add(time.Second); blocked() && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
		}
		if blocked() {
			t.Logf("the writer blocked after %d events of 256 KiB", b.Stats().Published)
			return
		}
	}
	require.FailNow(t, "the stream's writer never blocked")
}

// muxEventIDs returns the ids of session's events among fs, in order.
func muxEventIDs(fs []muxFrame, session string) []uint64 {
	var ids []uint64
	for _, f := range fs {
		var env struct{ ID uint64 }
		if f.Session == session && json.Unmarshal([]byte(f.Data), &env) == nil && env.ID != 0 {
			ids = append(ids, env.ID)
		}
	}
	return ids
}

// A valid ?maxQueued= is every session's frame cap on the multiplexed
// stream, and an eviction ends the stream, over HTTP/1.1 and h2c: behind a
// writer blocked on a client that does not read, session a takes 16 events
// (?maxQueued=16, below the bus's 256) and is evicted by the 17th, while b
// stays subscribed; once the client reads, it gets every event of b and
// the stream ends with a's client_evicted.
func TestMuxMaxQueuedEvictionOverHTTP(t *testing.T) {
	muxEnvs(t, envOptions{}, func(t *testing.T, e *testEnv) {
		a, b := e.bus(t, "a", Options{}), e.bus(t, "b", Options{})
		resp := unreadMux(t, e, muxPath([]string{"a", "b"}, "maxQueued", "16"))
		blockWriter(t, e, b)
		publishN(t, a, 16)
		require.Equal(t, 1, a.SubscriberCount(), "16 events queued: within ?maxQueued=16")
		publishN(t, a, 1)
		require.Zero(t, a.SubscriberCount(), "the 17th overflows ?maxQueued=16: a is evicted")
		require.Equal(t, uint64(1), a.Stats().Evictions.QueueOverflow)
		require.Equal(t, 1, b.SubscriberCount(), "b is not, and its stream goes on")

		var fs []muxFrame
		for _, ev := range sseEvents(newSSEStream(t, resp).rest()) {
			fs = append(fs, splitMux(t, ev))
		}
		require.NotEmpty(t, fs)
		last := fs[len(fs)-1]
		require.Equal(t, "a:client_evicted", describeMux([]muxFrame{last})[0], "the stream ends with a's eviction")
		require.Contains(t, last.Data, `"reason":"queue_overflow"`)
		require.Equal(t, idsFrom(1, b.LastEventID()), muxEventIDs(fs, "b"), "every event of b, in order")
		require.Zero(t, b.SubscriberCount(), "the whole stream ended")
		require.Zero(t, b.Stats().Evictions.QueueOverflow)
	})
}

// Under OverflowCatchUp nothing is evicted, over HTTP/1.1 and h2c: a
// session that falls behind a blocked writer catches up from its ring once
// the client reads; the other goes on.
func TestMuxCatchUpOverHTTP(t *testing.T) {
	muxEnvs(t, envOptions{}, func(t *testing.T, e *testEnv) {
		a := e.bus(t, "a", Options{MaxQueued: 16, OverflowPolicy: OverflowCatchUp})
		b := e.bus(t, "b", Options{})
		resp := unreadMux(t, e, muxPath([]string{"a", "b"}))
		blockWriter(t, e, b)
		publishN(t, a, 100)
		require.Equal(t, 1, a.SubscriberCount(), "behind, not evicted")
		require.Equal(t, 1, a.Stats().CatchUp.Behind)

		c := newSSEStream(t, resp)
		var fs []muxFrame
		for len(muxEventIDs(fs, "a")) < 100 {
			fs = append(fs, nextMux(c))
		}
		c.close()
		require.Equal(t, idsFrom(1, 100), muxEventIDs(fs, "a"), "every event of a, once, in order")
		require.Contains(t, describeMux(fs), "a:slow_client_warning")
		require.Equal(t, idsFrom(1, b.LastEventID()), muxEventIDs(fs, "b"))
		require.Zero(t, a.Stats().Evictions.QueueOverflow)
		require.Positive(t, a.Stats().CatchUp.Served)
	})
}

// idsFrom is from, from+1, ..., to.
func idsFrom(from, to uint64) []uint64 {
	var ids []uint64
	for id := from; id <= to; id++ {
		ids = append(ids, id)
	}
	return ids
}
