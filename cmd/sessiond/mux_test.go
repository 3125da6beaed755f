package main

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/internal/daemon"
	"github.com/ssebus/eventbus/internal/daemontest"
	"github.com/ssebus/eventbus/internal/muxcursor"
)

// The multiplexed stream, GET /events?session=<id>&session=<id>..., through
// the daemon's routes: the request rules of issue 25 point 2, the cursor's
// resumes (a DELETE and re-creation, a ring eviction, a garbage cursor, 32
// sessions), over HTTP/1.1 and h2c, with -epoch-ids on and off, and across
// a kill -9 of the daemon as a process.

// muxServer is a daemon served over httptest with a client of one protocol.
type muxServer struct {
	srv    *server
	ts     *httptest.Server
	client *http.Client
}

// newMuxServer serves a daemon with cfg (its Stream set to -epoch-ids as
// epochIDs says), over HTTP/1.1 and h2c, and a client of proto ("http1" or
// "h2c").
func newMuxServer(t *testing.T, proto string, epochIDs bool, cfg config) *muxServer {
	t.Helper()
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Stream = func(h *eventbus.Handler) error {
		h.BareIDs = !epochIDs
		return nil
	}
	s, err := newServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(s.routes())
	ts.Config.ConnContext = daemon.ConnContext
	var sp http.Protocols
	sp.SetHTTP1(true)
	sp.SetUnencryptedHTTP2(true)
	ts.Config.Protocols = &sp
	ts.Start()
	client := protoClient(t, proto)
	t.Cleanup(func() {
		s.closeAll()
		ts.Close()
	})
	return &muxServer{srv: s, ts: ts, client: client}
}

// protoClient is a client that speaks only proto: "http1" or "h2c" (HTTP/2
// with prior knowledge). Cleanup closes its idle connections.
func protoClient(t *testing.T, proto string) *http.Client {
	var p http.Protocols
	if proto == "h2c" {
		p.SetUnencryptedHTTP2(true)
	} else {
		p.SetHTTP1(true)
	}
	tr := &http.Transport{Protocols: &p}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// muxRuns runs f over HTTP/1.1 and h2c, with -epoch-ids on and off.
func muxRuns(t *testing.T, cfg config, f func(t *testing.T, m *muxServer)) {
	for _, proto := range []string{"http1", "h2c"} {
		for _, ids := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/epoch-ids=%v", proto, ids), func(t *testing.T) { f(t, newMuxServer(t, proto, ids, cfg)) })
		}
	}
}

// muxURL is the multiplexed stream of ids, with extra query pairs.
func muxURL(base string, ids []string, extra ...string) string {
	v := url.Values{"session": ids}
	for i := 0; i+1 < len(extra); i += 2 {
		v.Add(extra[i], extra[i+1])
	}
	return base + "/events?" + v.Encode()
}

// get answers a request of m's client.
func (m *muxServer) get(t *testing.T, method, target string, header http.Header) response {
	t.Helper()
	return callWith(t, m.client, method, target, header, "")
}

// open opens the multiplexed stream of ids, resuming from cursor when set.
func (m *muxServer) open(t *testing.T, ids []string, cursor string) *sseStream {
	t.Helper()
	var h http.Header
	if cursor != "" {
		h = http.Header{"Last-Event-Id": {cursor}}
	}
	return openStreamWith(t, m.client, muxURL(m.ts.URL, ids), h)
}

// muxFrame is one frame of a multiplexed stream: its session, the SSE
// id (the composite cursor, events only) and type, and its envelope.
type muxFrame struct {
	session, cursor, event string
	env                    map[string]any
}

// nextMux reads the next frame, requiring "session" first in its envelope.
func nextMux(t *testing.T, s *sseStream) muxFrame {
	t.Helper()
	f, env := s.mustNext(t)
	id, _ := env["session"].(string)
	if !strings.HasPrefix(f.data, `{"session":`+strconv.Quote(id)+`,`) {
		t.Fatalf("a frame whose envelope does not start with its session: %s", f.data)
	}
	return muxFrame{id, f.id, f.event, env}
}

// String is "<session>#<id>" for an event, "<session>:<type>" else.
func (f muxFrame) String() string {
	if id, ok := f.env["id"].(float64); ok {
		return f.session + "#" + strconv.Itoa(int(id))
	}
	return f.session + ":" + f.event
}

// data is the frame's data object.
func (f muxFrame) data() map[string]any {
	d, _ := f.env["data"].(map[string]any)
	return d
}

// readBySession reads n frames and returns them by session, in order.
func readBySession(t *testing.T, s *sseStream, n int) (map[string][]string, []muxFrame) {
	t.Helper()
	by := map[string][]string{}
	var fs []muxFrame
	for range n {
		f := nextMux(t, s)
		by[f.session] = append(by[f.session], f.String())
		fs = append(fs, f)
	}
	return by, fs
}

// lastCursor is the cursor of the last event among fs.
func lastCursor(t *testing.T, fs []muxFrame) string {
	t.Helper()
	for i := len(fs) - 1; i >= 0; i-- {
		if fs[i].cursor != "" {
			return fs[i].cursor
		}
	}
	t.Fatal("no event among the frames")
	return ""
}

// requireEntries requires cursor to hold, for each session, its epoch's
// tag and that last id.
func requireEntries(t *testing.T, cursor string, want map[string]struct {
	epoch string
	id    uint64
}) {
	t.Helper()
	c, err := muxcursor.ParseCursor(cursor)
	if err != nil {
		t.Fatalf("cursor %q: %v", cursor, err)
	}
	if len(c) != len(want) {
		t.Fatalf("cursor %q has %d entries, want %d", cursor, len(c), len(want))
	}
	for id, w := range want {
		if e, ok := c.Entry(id); !ok || e != muxcursor.NewEntry(id, w.epoch, w.id) {
			t.Fatalf("cursor's entry of %s: %+v (found %v), want epoch %s id %d", id, e, ok, w.epoch, w.id)
		}
	}
}

type entry = struct {
	epoch string
	id    uint64
}

// post publishes an event of type "a" to session id and returns its epoch.
func (m *muxServer) post(t *testing.T, id string, n int) string {
	t.Helper()
	r := publish(t, m.ts, id, `{"type":"a","data":`+strconv.Itoa(n)+`}`)
	if r.status != http.StatusOK {
		t.Fatalf("POST %s: %d %s", id, r.status, r.body)
	}
	return r.json(t)["epoch"].(string)
}

// requireError requires r to be the JSON error status/code, naming
// session in "session" ("" when it must name none).
func requireError(t *testing.T, r response, status int, code, session string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("%d %s, want %d %s", r.status, r.body, status, code)
	}
	m := r.json(t)
	got, named := m["session"]
	if m["code"] != code || (session == "" && named) || (session != "" && got != session) {
		t.Fatalf("body %s, want code %s and session %q", r.body, code, session)
	}
}

// Point 2's rules, through the daemon.
func TestMuxRouteRules(t *testing.T) {
	muxRuns(t, config{Hub: eventbus.HubOptions{Bus: eventbus.Options{MaxSubscribers: 1}}, MaxStreamSessions: 4}, func(t *testing.T, m *muxServer) {
		base := m.ts.URL
		for _, id := range []string{"a", "b", "full"} {
			m.post(t, id, 1)
		}
		full := openStream(t, base+"/session/full/events", nil) // its one subscriber
		waitFor(t, "full's subscriber", func() bool { return m.srv.subscribers("full") == 1 })

		for name, target := range map[string]string{
			"none":      base + "/events",
			"no id":     base + "/events?types=a",
			"too many":  muxURL(base, []string{"a", "b", "c", "d", "e"}),
			"empty id":  muxURL(base, []string{"a", ""}),
			"repeated":  muxURL(base, []string{"a", "b", "a"}),
			"undecoded": base + "/events?session=a&session=%zz",
		} {
			t.Run(name, func(t *testing.T) {
				requireError(t, m.get(t, http.MethodGet, target, nil), http.StatusBadRequest, "invalid_sessions", "")
			})
		}
		requireError(t, m.get(t, http.MethodGet, muxURL(base, []string{"a", "x", "y"}), nil), http.StatusNotFound, "session_not_found", "x")
		if r := m.get(t, http.MethodHead, muxURL(base, []string{"a", "x"}), nil); r.status != http.StatusNotFound {
			t.Fatalf("HEAD with an unknown session: %d, want 404", r.status)
		}
		if n := m.srv.hub.Len(); n != 3 {
			t.Fatalf("the stream of unknown sessions left %d sessions, want 3: it must create none", n)
		}
		// An id the session id rule refuses is refused with the list.
		for _, bad := range []string{strings.Repeat("x", eventbus.MaxSessionIDBytes+1), "a\xff", "a\xfe"} {
			requireError(t, m.get(t, http.MethodGet, muxURL(base, []string{"a", bad}), nil), http.StatusBadRequest, "invalid_sessions", "")
		}
		r := m.get(t, http.MethodGet, muxURL(base, []string{"a", "full"}), nil)
		requireError(t, r, http.StatusTooManyRequests, "subscriber_limit_exceeded", "full")
		if r.header.Get("Retry-After") == "" || m.srv.subscribers("a") != 0 {
			t.Fatalf("429: Retry-After %q, a's subscribers %d: want one, and none left", r.header.Get("Retry-After"), m.srv.subscribers("a"))
		}
		requireError(t, m.get(t, http.MethodGet, muxURL(base, []string{"a"}, "types", "Bad*"), nil), http.StatusBadRequest, "invalid_filter", "")
		requireError(t, m.get(t, http.MethodGet, muxURL(base, []string{"a"}, "maxQueued", "3"), nil), http.StatusBadRequest, "invalid_max_queued", "")

		// HEAD: the stream's headers, the epochs in the URL's order, and no
		// subscription.
		r = m.get(t, http.MethodHead, muxURL(base, []string{"full", "a"}), nil)
		epochs := status(t, m.ts, "full")["epoch"].(string) + "," + status(t, m.ts, "a")["epoch"].(string)
		if r.status != http.StatusOK || r.header.Get("Content-Type") != "text/event-stream" || r.header.Get("Event-Epochs") != epochs {
			t.Fatalf("HEAD: %d %v, want 200 with Event-Epochs %s", r.status, r.header, epochs)
		}
		full.close()
		waitFor(t, "full's subscriber gone", func() bool { return m.srv.subscribers("full") == 0 })

		// ?types= and ?lastEventId= as on a single stream, for every session.
		publish(t, m.ts, "a", `{"type":"b"}`)
		publish(t, m.ts, "b", `{"type":"b"}`)
		cur := muxcursor.Cursor{}.Set("a", status(t, m.ts, "a")["epoch"].(string), 0).Set("b", status(t, m.ts, "b")["epoch"].(string), 1)
		s := openStreamWith(t, m.client, muxURL(base, []string{"b", "a"}, "types", "b", "lastEventId", cur.String()), nil)
		by, _ := readBySession(t, s, 4)
		if want := (map[string][]string{"a": {"a#2", "a:replay_complete"}, "b": {"b#2", "b:replay_complete"}}); !mapsEqual(by, want) {
			t.Fatalf("types=b from the cursor: %v, want %v", by, want)
		}
		if st := status(t, m.ts, "a"); st["streams"] != float64(1) || st["lastResumeFrom"] != fmt.Sprintf("%012x:0", muxcursor.EpochTag(st["epoch"].(string))) {
			t.Fatalf("a's status while the stream is open: %v", st)
		}
		s.close()
	})
}

func mapsEqual(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// A resume with the cursor after a ring eviction in one session and a
// DELETE and re-creation of another: each session is answered as its
// single stream would be, the third resumes exactly; -epoch-ids changes
// the single stream's ids only.
func TestMuxResumeThroughTheDaemon(t *testing.T) {
	muxRuns(t, config{Hub: eventbus.HubOptions{Bus: eventbus.Options{RingSize: 4}}}, func(t *testing.T, m *muxServer) {
		ids := []string{"ring", "calm", "gone"}
		epochs := map[string]string{}
		for _, id := range ids {
			epochs[id] = m.post(t, id, 1)
		}
		s := m.open(t, ids, "")
		if s.resp.Header.Get("Event-Epochs") != epochs["ring"]+","+epochs["calm"]+","+epochs["gone"] {
			t.Fatalf("Event-Epochs %q", s.resp.Header.Get("Event-Epochs"))
		}
		for _, id := range ids {
			m.post(t, id, 2)
		}
		by, fs := readBySession(t, s, 3)
		if !mapsEqual(by, map[string][]string{"ring": {"ring#2"}, "calm": {"calm#2"}, "gone": {"gone#2"}}) {
			t.Fatalf("live: %v (no replay, no replay_complete)", by)
		}
		cursor := lastCursor(t, fs)
		if len(cursor) != 2+24*len(ids) {
			t.Fatalf("cursor %q: %d bytes, want 2+24×%d", cursor, len(cursor), len(ids))
		}
		requireEntries(t, cursor, map[string]entry{"ring": {epochs["ring"], 2}, "calm": {epochs["calm"], 2}, "gone": {epochs["gone"], 2}})
		s.close()

		for n := 3; n <= 8; n++ {
			m.post(t, "ring", n) // the ring keeps 5..8
		}
		m.post(t, "calm", 3)
		if r := do(t, http.MethodDelete, m.ts.URL+"/session/gone", ""); r.status != http.StatusNoContent {
			t.Fatalf("DELETE: %d", r.status)
		}
		fresh := m.post(t, "gone", 1)

		s = m.open(t, []string{"gone", "calm", "ring"}, cursor)
		by, fs = readBySession(t, s, 11)
		want := map[string][]string{
			"ring": {"ring:state_resync_required", "ring#5", "ring#6", "ring#7", "ring#8", "ring:replay_complete"},
			"calm": {"calm#3", "calm:replay_complete"},
			"gone": {"gone:state_resync_required", "gone#1", "gone:replay_complete"},
		}
		if !mapsEqual(by, want) {
			t.Fatalf("resume: %v, want %v", by, want)
		}
		for _, f := range fs {
			switch d := f.data(); f.String() {
			case "ring:state_resync_required":
				if d["reason"] != "ring_evicted" || d["lastDeliveredId"] != float64(2) || d["earliestAvailableId"] != float64(5) {
					t.Fatalf("ring's resync: %v", d)
				}
			case "gone:state_resync_required":
				if d["reason"] != "epoch_reset" || d["epoch"] != fresh || d["lastDeliveredId"] != float64(2) {
					t.Fatalf("gone's resync: %v, want epoch_reset to %s", d, fresh)
				}
			}
		}
		requireEntries(t, lastCursor(t, fs), map[string]entry{"ring": {epochs["ring"], 8}, "calm": {epochs["calm"], 3}, "gone": {fresh, 1}})
		s.close()

		// The single stream's id follows -epoch-ids; the cursor does not.
		single := openStreamWith(t, m.client, m.ts.URL+"/session/calm/events", http.Header{"Last-Event-Id": {"2"}})
		f, _ := single.mustNext(t)
		want1 := "3"
		if strings.Contains(t.Name(), "epoch-ids=true") {
			want1 = epochs["calm"] + ":3"
		}
		if f.id != want1 {
			t.Fatalf("single stream id %q, want %q", f.id, want1)
		}
		single.close()
	})
}

// A session deleted while the stream is open leaves it with stream_error
// "closed"; the others go on; a disconnect of one session cuts the whole
// stream.
func TestMuxDeleteAndDisconnectWhileStreaming(t *testing.T) {
	muxRuns(t, config{}, func(t *testing.T, m *muxServer) {
		for _, id := range []string{"a", "b"} {
			m.post(t, id, 1)
		}
		s := m.open(t, []string{"a", "b"}, "")
		waitFor(t, "both subscribed", func() bool { return m.srv.subscribers("a") == 1 && m.srv.subscribers("b") == 1 })
		if st := status(t, m.ts, "b"); st["streams"] != float64(1) || st["streamsOpened"] != float64(1) {
			t.Fatalf("b's status: %v", st)
		}
		do(t, http.MethodDelete, m.ts.URL+"/session/b", "")
		f := nextMux(t, s)
		if f.String() != "b:stream_error" || f.data()["errorKind"] != eventbus.ErrorKindClosed {
			t.Fatalf("after b's DELETE: %s %v", f, f.data())
		}
		m.post(t, "a", 2)
		if f := nextMux(t, s); f.String() != "a#2" {
			t.Fatalf("a after b left: %s", f)
		}
		r := do(t, http.MethodPost, m.ts.URL+"/session/a/disconnect", "")
		if r.json(t)["disconnected"] != float64(1) {
			t.Fatalf("disconnect: %s", r.body)
		}
		s.mustEnd(t)
		waitFor(t, "a's stream gone", func() bool { return m.srv.subscribers("a") == 0 })
	})
}

// A cursor that cannot be parsed is served live, never an error, and
// every session says so first: state_resync_required cursor_invalid, with
// the first id it will deliver; a single stream's id is none, nor is a
// cursor of more than 256 entries. The session's status does not count a
// resume (issue 32 point 3).
func TestMuxGarbageCursorIsLive(t *testing.T) {
	// 257 entries: one more than any cursor holds.
	group := muxcursor.Cursor{muxcursor.NewEntry("s", eventbus.NewEpoch(), 1)}.String()[2:]
	tooMany := "m1" + strings.Repeat(group, eventbus.MaxCursorEntries+1)
	muxRuns(t, config{}, func(t *testing.T, m *muxServer) {
		epochs := map[string]string{"a": m.post(t, "a", 1), "b": m.post(t, "b", 1)}
		for i, garbage := range []string{"1", epochs["a"] + ":1", "m1", "m1" + strings.Repeat("!", 24), "m2" + strings.Repeat("A", 24),
			"not a cursor, \"at all\"", tooMany} {
			s := m.open(t, []string{"a", "b"}, garbage)
			m.post(t, "a", i+2)
			m.post(t, "b", i+2)
			by, fs := readBySession(t, s, 4)
			if want := (map[string][]string{"a": {"a:state_resync_required", "a#" + strconv.Itoa(i+2)}, "b": {"b:state_resync_required", "b#" + strconv.Itoa(i+2)}}); !mapsEqual(by, want) {
				t.Fatalf("garbage %.40q: %v, want %v (the notice, then live; no replay_complete)", garbage, by, want)
			}
			for _, f := range fs {
				if d := f.data(); f.event == eventbus.TypeStateResyncRequired && (d["reason"] != "cursor_invalid" || d["lastDeliveredId"] != float64(0) ||
					d["earliestAvailableId"] != float64(i+2) || d["epoch"] != epochs[f.session]) {
					t.Fatalf("garbage %.40q: %s's notice %v, want cursor_invalid from %d", garbage, f.session, d, i+2)
				}
			}
			s.close()
		}
		if st := status(t, m.ts, "a"); st["streamsResumed"] != float64(0) || st["lastResumeFrom"] != "" {
			t.Fatalf("a's status claims a resume that did not happen: %v", st)
		}
	})
}

// Issue 32 point 3, through the daemon: the cursor as served plus 30
// entries of other sessions (794 bytes, more than the default 32 sessions'
// 770) resumes: the 2 events missed meanwhile arrive, then
// replay_complete; the status says the stream resumed, from where.
func TestMuxServedCursorPlus30EntriesResumes(t *testing.T) {
	muxRuns(t, config{}, func(t *testing.T, m *muxServer) {
		ids := []string{"ca", "cb", "cc"}
		epochs := map[string]string{}
		for _, id := range ids {
			epochs[id] = m.post(t, id, 1)
		}
		s := m.open(t, ids, "")
		for _, id := range ids {
			m.post(t, id, 2)
		}
		_, fs := readBySession(t, s, 3)
		s.close()
		c, err := muxcursor.ParseCursor(lastCursor(t, fs))
		if err != nil {
			t.Fatal(err)
		}
		for i := range 30 {
			c = c.Set("elsewhere-"+strconv.Itoa(i), eventbus.NewEpoch(), uint64(i+1))
		}
		cursor := c.String()
		if len(cursor) != 794 {
			t.Fatalf("cursor of %d bytes, want 794", len(cursor))
		}
		m.post(t, "ca", 3) // missed while disconnected
		m.post(t, "ca", 4)
		s = m.open(t, ids, cursor)
		by, _ := readBySession(t, s, 5)
		want := map[string][]string{"ca": {"ca#3", "ca#4", "ca:replay_complete"}, "cb": {"cb:replay_complete"}, "cc": {"cc:replay_complete"}}
		if !mapsEqual(by, want) {
			t.Fatalf("resume with 30 more entries: %v, want %v", by, want)
		}
		st := status(t, m.ts, "ca")
		if st["streamsResumed"] != float64(1) || st["lastResumeFrom"] != fmt.Sprintf("%012x:2", muxcursor.EpochTag(epochs["ca"])) {
			t.Fatalf("ca's status: %v, want one resume from 2", st)
		}
		s.close()
	})
}

// The most sessions by default, 32: the cursor is 2+24×32 bytes, and
// resumes every one; a 33rd is 400.
func TestMuxCursorOf32Sessions(t *testing.T) {
	muxRuns(t, config{}, testMuxCursorOf32Sessions)
}

func testMuxCursorOf32Sessions(t *testing.T, m *muxServer) {
	ids := make([]string, eventbus.DefaultMaxStreamSessions)
	for i := range ids {
		ids[i] = "session-" + strings.Repeat("x", 100) + strconv.Itoa(i)
		m.post(t, ids[i], 1)
	}
	s := m.open(t, ids, "")
	for _, id := range ids {
		m.post(t, id, 2)
	}
	_, fs := readBySession(t, s, len(ids))
	cursor := lastCursor(t, fs)
	if len(cursor) != 2+24*32 || strings.ContainsAny(cursor, " ,\"") {
		t.Fatalf("cursor of 32 sessions: %d bytes %q", len(cursor), cursor)
	}
	s.close()
	for _, id := range ids {
		m.post(t, id, 3)
	}
	s = m.open(t, ids, cursor)
	by, _ := readBySession(t, s, 2*len(ids))
	for _, id := range ids {
		if want := []string{id + "#3", id + ":replay_complete"}; !slices.Equal(by[id], want) {
			t.Fatalf("%s resumed: %v, want %v", id, by[id], want)
		}
	}
	s.close()
	requireError(t, m.get(t, http.MethodGet, muxURL(m.ts.URL, append(ids, "one-more")), nil), http.StatusBadRequest, "invalid_sessions", "")
}

// With -auth-token the stream needs credentials, checked for each session
// (a refusal names the first), and a revocation of its subject ends it.
func TestMuxAuth(t *testing.T) {
	s, ts := newAuthServer(t, 0)
	s.create(t, "a")
	s.create(t, "b")
	target := muxURL(ts.URL, []string{"a", "b"})
	r := call(t, http.MethodGet, target, nil, "")
	requireError(t, r, http.StatusUnauthorized, "unauthorized", "a")
	if r.header.Get("WWW-Authenticate") == "" {
		t.Fatal("401 without a challenge")
	}
	st := openStream(t, target, bearer())
	waitFor(t, "the stream", func() bool { return s.subscribers("a") == 1 && s.subscribers("b") == 1 })
	r = call(t, http.MethodPost, ts.URL+"/revoke", bearer(), `{"subject":"bearer"}`)
	if r.status != http.StatusOK || r.json(t)["revoked"] != float64(1) {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	if f := nextMux(t, st); f.event != eventbus.TypeStreamError || f.data()["errorKind"] != eventbus.ErrorKindRevoked {
		t.Fatalf("after the revocation: %s %v", f, f.data())
	}
	st.mustEnd(t)
}

// A kill -9 of the daemon as a process: after the restart (the same
// address, a new epoch for every session, which the restarted daemon's
// -create-on-stream makes on the GET) every session of the cursor gets
// epoch_reset and the replay of its new epoch; over HTTP/1.1 and h2c, with
// -epoch-ids on and off.
func TestMuxAcrossAKill9(t *testing.T) {
	bin := buildDaemon(t)
	for _, run := range []struct{ proto, ids string }{{"http1", "true"}, {"http1", "false"}, {"h2c", "true"}, {"h2c", "false"}} {
		t.Run(run.proto+"/epoch-ids="+run.ids, func(t *testing.T) {
			ids := run.ids
			client := protoClient(t, run.proto)
			openStream := func(t *testing.T, url string, header http.Header) *sseStream {
				t.Helper()
				s := openStreamWith(t, client, url, header)
				if want := map[string]int{"http1": 1, "h2c": 2}[run.proto]; s.resp.ProtoMajor != want {
					t.Fatalf("the stream is HTTP/%d, want %s", s.resp.ProtoMajor, run.proto)
				}
				return s
			}
			addr := daemontest.FreeAddr(t)
			d, _ := startDaemon(t, bin, "-addr", addr, "-epoch-ids="+ids)
			sessions := []string{"k1", "k2", "k3"}
			for _, id := range sessions {
				d.Publish(id, 1)
			}
			s := openStream(t, muxURL(d.Base, sessions), nil)
			for _, id := range sessions {
				d.Publish(id, 2)
			}
			_, fs := readBySession(t, s, 3)
			cursor := lastCursor(t, fs)
			d.Kill()
			if _, err := s.next(); err == nil {
				t.Fatal("the stream outlived the daemon")
			}
			s.close()

			d, _ = startDaemon(t, bin, "-addr", addr, "-epoch-ids="+ids)
			d.Publish("k2", 1)
			s = openStream(t, muxURL(d.Base, sessions), http.Header{"Last-Event-Id": {cursor}})
			by, fs := readBySession(t, s, 7)
			want := map[string][]string{
				"k1": {"k1:state_resync_required", "k1:replay_complete"},
				"k2": {"k2:state_resync_required", "k2#1", "k2:replay_complete"},
				"k3": {"k3:state_resync_required", "k3:replay_complete"},
			}
			if !mapsEqual(by, want) {
				t.Fatalf("after the restart: %v, want %v", by, want)
			}
			for _, f := range fs {
				if f.event == eventbus.TypeStateResyncRequired {
					if d := f.data(); d["reason"] != "epoch_reset" || d["lastDeliveredId"] != float64(2) {
						t.Fatalf("%s: %v, want epoch_reset after 2", f, d)
					}
				}
			}
			// Resumed again from the new cursor: exact, with nothing lost.
			next := lastCursor(t, fs)
			s.close()
			d.Publish("k1", 1)
			s = openStream(t, muxURL(d.Base, sessions), http.Header{"Last-Event-Id": {next}})
			by, _ = readBySession(t, s, 4)
			if !slices.Equal(by["k1"], []string{"k1#1", "k1:replay_complete"}) || len(by["k2"]) != 1 || len(by["k3"]) != 1 {
				t.Fatalf("the next resume: %v", by)
			}
			s.close()
			d.Stop(10 * time.Second)
		})
	}
}

// With -auth-token and -cors-origin a CORS preflight of the multiplexed
// stream needs no credentials (the stream itself does), as on the single
// stream.
func TestMuxPreflightWithAuth(t *testing.T) {
	s, ts := newAuthServerWith(t, 0, config{Stream: func(h *eventbus.Handler) error {
		h.CORS = &eventbus.CORS{Origins: []string{"https://app.example"}}
		return nil
	}})
	s.create(t, "a")
	target := muxURL(ts.URL, []string{"a"})
	r := call(t, http.MethodOptions, target, http.Header{"Origin": {"https://app.example"}, "Access-Control-Request-Method": {"GET"},
		"Access-Control-Request-Headers": {"authorization, last-event-id"}}, "")
	if r.status != http.StatusNoContent || r.header.Get("Access-Control-Allow-Origin") != "https://app.example" ||
		!strings.Contains(strings.ToLower(r.header.Get("Access-Control-Allow-Headers")), "authorization") {
		t.Fatalf("preflight: %d %v", r.status, r.header)
	}
	r = call(t, http.MethodGet, target, http.Header{"Origin": {"https://app.example"}}, "")
	requireError(t, r, http.StatusUnauthorized, "unauthorized", "a")
}
