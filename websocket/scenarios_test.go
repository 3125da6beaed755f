package websocket_test

// One scenario table (issue 34 point 5) run over the three transports of
// drivers_test.go: the single SSE stream, the multiplexed SSE stream and the
// WebSocket. Each scenario states what a client observes, per transport
// where they legitimately differ:
//
//   - the single stream's frames have no "session" member (its session is
//     the route's; the transcripts write it all the same), its cursor is
//     `<epoch>:N`; the multiplexed stream and the WebSocket carry the
//     composite cursor `m1…` (SPEC 6.8), in the id: line and in the cursor
//     line (SPEC 6.10);
//   - an SSE stream ends with the end of the response after its terminal
//     frame ("eof"); a WebSocket with a close frame whose code says why
//     (1000 closed, 1001 shutdown, 4401, 4403, 4429);
//   - a refused opening is the same HTTP status and JSON code on all three
//     (the WebSocket's before any upgrade);
//   - a stream of several sessions goes on when one of them is removed; the
//     single stream has only that one, and ends.
//
// Every scenario runs in a synctest bubble: time moves only when every
// goroutine waits (a lifetime, a shutdown's drain), and "everything the
// server wrote has been read" is synctest.Wait, never a sleep.

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
)

// scenario is a row of the table: its name, the Hub's options, the
// handlers' configuration, what differs by transport (documentation of
// the row) and the steps with their expected observations.
type scenario struct {
	name      string
	opts      eventbus.HubOptions
	configure func(e *scEnv)
	differs   string
	run       func(t *testing.T, e *scEnv, k kind)
}

// per picks the expectation of transport k: one value for the SSE
// transports (single and multiplexed) and one for the WebSocket.
func per[T any](k kind, sse, websocket T) T {
	if k == wsock {
		return websocket
	}
	return sse
}

// sessions is the stream's sessions on transport k: the single stream
// serves the first alone.
func sessions(k kind, ids ...string) []string {
	if k == single {
		return ids[:1]
	}
	return ids
}

func expect(t *testing.T, k kind, step string, got []frame, want ...string) {
	t.Helper()
	if g := strs(got); !slices.Equal(g, want) {
		t.Fatalf("%s, %s:\n got  %q\n want %q", k, step, g, want)
	}
}

func expectEnd(t *testing.T, k kind, s *stream, want string) {
	t.Helper()
	if got := s.waitEnd(); got != want {
		t.Fatalf("%s: the stream ended with %q, want %q", k, got, want)
	}
}

var (
	singleCursor    = regexp.MustCompile(`^[0-9a-f]{32}:[0-9]+$`)
	compositeCursor = regexp.MustCompile(`^m1([A-Za-z0-9_-]{24})+$`)
)

// cursorOf waits until every written frame is read and returns the
// stream's cursor, checking its form on k.
func cursorOf(t *testing.T, k kind, s *stream) string {
	t.Helper()
	synctest.Wait()
	c := s.lastCursor()
	re := compositeCursor
	if k == single {
		re = singleCursor
	}
	if !re.MatchString(c) {
		t.Fatalf("%s: cursor %q is not of the transport's form", k, c)
	}
	return c
}

// live opens a live stream on a, reads the events published and returns
// the cursor after event n of session a.
func liveUpTo(t *testing.T, e *scEnv, k kind, n int) string {
	t.Helper()
	s := e.open(k, []string{"a"}, openOpts{})
	synctest.Wait()
	e.publishN("a", n)
	got := s.take(n)
	c := cursorOf(t, k, s)
	if n > 0 && got[n-1].ID != uint64(n) {
		t.Fatalf("%s: read %v", k, strs(got))
	}
	s.close()
	return c
}

// contiguous reports whether fs are the events from..to of one session.
func contiguous(fs []frame, from, to uint64) bool {
	if uint64(len(fs)) != to-from+1 {
		return false
	}
	for i, f := range fs {
		if f.ID != from+uint64(i) {
			return false
		}
	}
	return true
}

func events(fs []frame) []frame {
	return slices.DeleteFunc(slices.Clone(fs), func(f frame) bool { return f.ID == 0 })
}

func dataOf[T any](t *testing.T, f frame) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(f.Data, &v); err != nil {
		t.Fatalf("%s: %v", f.raw, err)
	}
	return v
}

// subjectAuth grants the subject of the X-Subject header; "mallory" is
// refused 403 forbidden.
func subjectAuth(lifetime time.Duration) func(e *scEnv) {
	return func(e *scEnv) {
		e.streams.Authorize = func(r *http.Request, _ string, _ *eventbus.EventBus) (eventbus.Grant, error) {
			sub := r.Header.Get("X-Subject")
			if sub == "mallory" {
				return eventbus.Grant{}, eventbus.Forbidden("not you")
			}
			g := eventbus.Grant{Subject: sub}
			if lifetime > 0 {
				g.Expires = time.Now().Add(lifetime)
			}
			return g, nil
		}
	}
}

func as(subject string) http.Header { return http.Header{"X-Subject": {subject}} }

var scenarios = []scenario{
	{
		name:    "resume",
		differs: "cursor: single <epoch>:N, mux and websocket m1…; the frames are the same",
		run: func(t *testing.T, e *scEnv, k kind) {
			e.session("a")
			cursor := liveUpTo(t, e, k, 2)
			e.publish("a", 3, 4)
			s := e.open(k, []string{"a"}, openOpts{cursor: cursor})
			expect(t, k, "resumed", s.take(3), "a 3", "a 4", "a replay_complete 2")
			e.publish("a", 5)
			expect(t, k, "then live", s.take(1), "a 5")
		},
	},
	{
		name:    "from the start (cursor 0)",
		differs: "none: 0 is a cursor on every transport",
		run: func(t *testing.T, e *scEnv, k kind) {
			e.session("a")
			e.publish("a", 1, 2)
			s := e.open(k, []string{"a"}, openOpts{cursor: "0"})
			expect(t, k, "from 0", s.take(3), "a 1", "a 2", "a replay_complete 2")
		},
	},
	{
		name:    "epoch_reset after a restart",
		differs: "none: the cursor's epoch (<epoch>:N, or the composite entry's epoch tag) is not the new bus's: epoch_reset with detail epoch_mismatch on all three",
		run: func(t *testing.T, e *scEnv, k kind) {
			e.session("a")
			cursor := liveUpTo(t, e, k, 3)
			e.restart()
			e.session("a")
			e.publish("a", 1)
			s := e.open(k, []string{"a"}, openOpts{cursor: cursor})
			expect(t, k, "resumed in the new epoch", s.take(3), "a resync epoch_reset/epoch_mismatch 3->1", "a 1", "a replay_complete 1")
			e.publish("a", 2)
			expect(t, k, "then live", s.take(1), "a 2")
		},
	},
	{
		name:    "epoch_reset after DELETE and re-creation",
		differs: "as after a restart",
		run: func(t *testing.T, e *scEnv, k kind) {
			e.session("a")
			cursor := liveUpTo(t, e, k, 3)
			e.currentHub().Delete("a")
			e.session("a")
			e.publish("a", 1, 2)
			s := e.open(k, []string{"a"}, openOpts{cursor: cursor})
			expect(t, k, "resumed in the new bus", s.take(4), "a resync epoch_reset/epoch_mismatch 3->1", "a 1", "a 2", "a replay_complete 2")
		},
	},
	{
		name:    "ring eviction",
		opts:    eventbus.HubOptions{Bus: eventbus.Options{RingSize: 4}},
		differs: "none",
		run: func(t *testing.T, e *scEnv, k kind) {
			e.session("a")
			cursor := liveUpTo(t, e, k, 2)
			e.publishN("a", 8) // 3..10; the ring keeps 7..10
			s := e.open(k, []string{"a"}, openOpts{cursor: cursor})
			expect(t, k, "resumed past the ring", s.take(6),
				"a resync ring_evicted 2->7", "a 7", "a 8", "a 9", "a 10", "a replay_complete 4")
		},
	},
	{
		name:    "replay budget",
		differs: "none",
		configure: func(e *scEnv) {
			// Every event is the same size: the budget takes three.
			f := e.publishSized()
			e.opts.Bus.ReplayBudgetBytes = 3*f + f/2
			e.restart()
		},
		run: func(t *testing.T, e *scEnv, k kind) {
			e.session("a")
			for range 8 {
				e.publishSized()
			}
			s := e.open(k, []string{"a"}, openOpts{cursor: "0"})
			expect(t, k, "from 0", s.take(5),
				"a 1", "a 2", "a 3", "a resync replay_budget_exceeded 3->4", "a replay_complete 3")
			c := cursorOf(t, k, s)
			s.close()
			// The client resumes from the last replayed id for the rest.
			s = e.open(k, []string{"a"}, openOpts{cursor: c})
			expect(t, k, "again", s.take(5),
				"a 4", "a 5", "a 6", "a resync replay_budget_exceeded 6->7", "a replay_complete 3")
			c = cursorOf(t, k, s)
			s.close()
			s = e.open(k, []string{"a"}, openOpts{cursor: c})
			expect(t, k, "the rest", s.take(3), "a 7", "a 8", "a replay_complete 2")
		},
	},
	{
		name:    "eviction behind a client that does not read",
		differs: "end: SSE eof after client_evicted, websocket close 4429 evicted; how many events got through before the eviction depends on the transport's buffers",
		run: func(t *testing.T, e *scEnv, k kind) {
			e.session("a")
			s := e.open(k, []string{"a"}, openOpts{query: url.Values{"maxQueued": {"16"}}, deferred: true})
			for i := range 100 {
				e.publish("a", i)
				if i%10 == 0 {
					synctest.Wait()
				}
			}
			synctest.Wait()
			s.begin()
			got := s.until(func(f frame) bool { return f.Type == "client_evicted" })
			delivered := events(got)
			d := uint64(len(delivered))
			if d == 0 || d >= 100 || !contiguous(delivered, 1, d) || !oneWarning(got[:len(got)-1]) {
				t.Fatalf("%s: before the eviction %v, want 1..d, one slow_client_warning, client_evicted", k, strs(got))
			}
			ev := got[len(got)-1]
			if ev.String() != "a client_evicted queue_overflow" {
				t.Fatalf("%s: %s", k, ev.raw)
			}
			if dropped := dataOf[struct{ DroppedAfter uint64 }](t, ev).DroppedAfter; dropped <= d {
				t.Fatalf("%s: droppedAfter %d, delivered up to %d", k, dropped, d)
			}
			expectEnd(t, k, s, per(k, "eof", "close 4429 evicted"))
			// Resume: exactly the rest.
			r := e.open(k, []string{"a"}, openOpts{cursor: s.lastCursor()})
			rest := r.take(int(100-d) + 1)
			if !contiguous(events(rest), d+1, 100) || rest[len(rest)-1].String() != "a replay_complete "+itoa(100-d) {
				t.Fatalf("%s: resumed after %d: %v", k, d, strs(rest))
			}
		},
	},
	{
		name:    "catch-up behind a client that does not read",
		opts:    eventbus.HubOptions{Bus: eventbus.Options{OverflowPolicy: eventbus.OverflowCatchUp, MaxQueued: 16}},
		differs: "none: every event, in order, no synthetic frame, on every transport",
		run: func(t *testing.T, e *scEnv, k kind) {
			e.session("a")
			s := e.open(k, []string{"a"}, openOpts{deferred: true})
			for i := range 300 {
				e.publish("a", i)
				if i%10 == 0 {
					synctest.Wait()
				}
			}
			synctest.Wait()
			s.begin()
			var got []frame
			for len(events(got)) < 300 {
				got = append(got, s.next())
			}
			if !contiguous(events(got), 1, 300) || !oneWarning(got) {
				t.Fatalf("%s: caught up with %v", k, strs(got))
			}
			e.publish("a", 301)
			expect(t, k, "then live", s.take(1), "a 301")
		},
	},
	{
		name:    "catch-up past the ring",
		opts:    eventbus.HubOptions{Bus: eventbus.Options{OverflowPolicy: eventbus.OverflowCatchUp, MaxQueued: 16, RingSize: 32}},
		differs: "how many events got through before the client fell behind the ring depends on the transport's buffers; the resync's ids are exact on all three",
		run: func(t *testing.T, e *scEnv, k kind) {
			e.session("a")
			s := e.open(k, []string{"a"}, openOpts{deferred: true})
			for i := range 300 {
				e.publish("a", i)
				if i%10 == 0 {
					synctest.Wait()
				}
			}
			synctest.Wait()
			s.begin()
			got := s.until(func(f frame) bool { return f.Type == "state_resync_required" })
			before := got[:len(got)-1]
			d := uint64(len(events(before)))
			if !contiguous(events(before), 1, d) || !oneWarning(before) {
				t.Fatalf("%s: before the resync %v", k, strs(got))
			}
			// The ring holds 269..300: the gap is announced from exactly the
			// last event the client has.
			expect(t, k, "the resync", got[len(got)-1:], "a resync ring_evicted "+itoa(d)+"->269")
			rest := s.take(32)
			if !contiguous(rest, 269, 300) {
				t.Fatalf("%s: after the resync %v", k, strs(rest))
			}
		},
	},
	{
		name:    "a session removed mid-stream (Hub.Delete)",
		differs: "single: its one session; its stream ends (eof). mux and websocket: a's stream_error closed, b goes on; when b is removed too the stream ends: eof, websocket close 1000 closed",
		run: func(t *testing.T, e *scEnv, k kind) {
			e.session("a")
			e.session("b")
			s := e.open(k, sessions(k, "a", "b"), openOpts{})
			synctest.Wait()
			e.publish("a", 1)
			e.publish("b", 1)
			e.currentHub().Delete("a")
			if k == single {
				expect(t, k, "a removed", s.take(2), "a 1", "a stream_error closed")
				expectEnd(t, k, s, "eof")
				return
			}
			got := s.take(3)
			expect(t, k, "a removed", ofSession(got, "a"), "a 1", "a stream_error closed")
			expect(t, k, "b", ofSession(got, "b"), "b 1")
			e.publish("b", 2)
			expect(t, k, "b goes on", s.take(1), "b 2")
			e.currentHub().Delete("b")
			expect(t, k, "b removed", s.take(1), "b stream_error closed")
			expectEnd(t, k, s, per(k, "eof", "close 1000 closed"))
		},
	},
	{
		name:    "a session's bus closed by its owner mid-stream (EventBus.Close)",
		differs: "end: SSE eof after stream_error closed, websocket close 1000 closed",
		run: func(t *testing.T, e *scEnv, k kind) {
			b := e.session("a")
			s := e.open(k, []string{"a"}, openOpts{})
			synctest.Wait()
			e.publish("a", 1)
			_ = b.Close()
			expect(t, k, "closed", s.take(2), "a 1", "a stream_error closed")
			expectEnd(t, k, s, per(k, "eof", "close 1000 closed"))
		},
	},
	{
		name:    "a session's bus closed with an error mid-stream (backplane.CloseWithError)",
		differs: "end: SSE eof after stream_error unavailable, websocket close 1000 closed",
		run: func(t *testing.T, e *scEnv, k kind) {
			b := e.session("a")
			s := e.open(k, []string{"a"}, openOpts{})
			synctest.Wait()
			e.publish("a", 1)
			_ = backplane.CloseWithError(b, eventbus.ErrorKindUnavailable, "engine unreachable")
			expect(t, k, "unavailable", s.take(2), "a 1", "a stream_error unavailable")
			expectEnd(t, k, s, per(k, "eof", "close 1000 closed"))
		},
	},
	{
		name:      "auth refused",
		configure: subjectAuth(0),
		differs:   "none: 403 forbidden on all three (the websocket's before the upgrade); the multiplexed routes name the session",
		run: func(t *testing.T, e *scEnv, k kind) {
			e.session("a")
			s := e.open(k, []string{"a"}, openOpts{header: as("mallory")})
			if s.status != http.StatusForbidden || s.code != "forbidden" {
				t.Fatalf("%s: %d %s %s, want 403 forbidden", k, s.status, s.code, s.body)
			}
			if k != single && !strings.Contains(s.body, `"session":"a"`) {
				t.Fatalf("%s: %s does not name the session", k, s.body)
			}
		},
	},
	{
		name:      "revocation",
		configure: subjectAuth(0),
		differs:   "end: SSE eof after stream_error revoked, websocket close 4403 revoked",
		run: func(t *testing.T, e *scEnv, k kind) {
			e.session("a")
			alice := e.open(k, []string{"a"}, openOpts{header: as("alice")})
			bob := e.open(k, []string{"a"}, openOpts{header: as("bob")})
			synctest.Wait()
			e.publish("a", 1)
			expect(t, k, "alice", alice.take(1), "a 1")
			expect(t, k, "bob", bob.take(1), "a 1")
			if n := e.streams.Revoke("alice"); n != 1 {
				t.Fatalf("%s: Revoke ended %d streams, want 1", k, n)
			}
			expect(t, k, "alice revoked", alice.take(1), "a stream_error revoked")
			expectEnd(t, k, alice, per(k, "eof", "close 4403 revoked"))
			e.publish("a", 2)
			expect(t, k, "bob goes on", bob.take(1), "a 2")
		},
	},
	{
		name:      "lifetime",
		configure: subjectAuth(time.Hour),
		differs:   "end: SSE eof after stream_error reauthenticate, websocket close 4401 reauthenticate",
		run: func(t *testing.T, e *scEnv, k kind) {
			e.session("a")
			s := e.open(k, []string{"a"}, openOpts{header: as("alice")})
			synctest.Wait()
			e.publish("a", 1)
			expect(t, k, "before", s.take(1), "a 1")
			time.Sleep(time.Hour) // the bubble's clock
			expect(t, k, "at the expiry", s.take(1), "a stream_error reauthenticate")
			expectEnd(t, k, s, per(k, "eof", "close 4401 reauthenticate"))
			// The client reauthenticates and resumes: nothing lost.
			e.publish("a", 2)
			r := e.open(k, []string{"a"}, openOpts{header: as("alice"), cursor: s.lastCursor()})
			expect(t, k, "resumed", r.take(2), "a 2", "a replay_complete 1")
		},
	},
	{
		name:    "shutdown",
		opts:    eventbus.HubOptions{ShutdownRetryAfter: 3 * time.Second},
		differs: "end: SSE eof after stream_error shutdown, websocket close 1001 shutdown",
		run: func(t *testing.T, e *scEnv, k kind) {
			e.session("a")
			e.session("b")
			s := e.open(k, sessions(k, "a", "b"), openOpts{})
			synctest.Wait()
			e.publish("a", 1)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := e.currentHub().Shutdown(ctx); err != nil {
				t.Fatalf("%s: Shutdown: %v", k, err)
			}
			var got []frame
			if k == single {
				got = s.take(2)
			} else {
				got = s.take(3)
			}
			expect(t, k, "a", ofSession(got, "a"), "a 1", "a stream_error shutdown")
			if k != single {
				expect(t, k, "b", ofSession(got, "b"), "b stream_error shutdown")
			}
			for _, f := range got[1:] {
				if ra := dataOf[struct{ RetryAfter int }](t, f).RetryAfter; ra != 3000 {
					t.Fatalf("%s: %s, want retryAfter 3000", k, f.raw)
				}
			}
			expectEnd(t, k, s, per(k, "eof", "close 1001 shutdown"))
		},
	},
	{
		name:    "a forged cursor",
		differs: "none: cursor_invalid from 0 to the next id, then live, on every transport",
		run: func(t *testing.T, e *scEnv, k kind) {
			e.session("a")
			e.publish("a", 1, 2)
			for _, forged := range []string{"forged!", "m1AAAA", "ffffffffffffffffffffffffffffffff:-1"} {
				s := e.open(k, []string{"a"}, openOpts{cursor: forged})
				expect(t, k, "cursor "+forged, s.take(1), "a resync cursor_invalid 0->3")
				s.close()
			}
		},
	},
}

// oneWarning reports whether the synthetic frames of fs are one
// slow_client_warning (SPEC 3.2: one per overflow episode, under every
// policy), whatever the transport.
func oneWarning(fs []frame) bool {
	var syn []frame
	for _, f := range fs {
		if f.ID == 0 {
			syn = append(syn, f)
		}
	}
	return len(syn) == 1 && syn[0].Type == "slow_client_warning"
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

// publishSized publishes an event of a fixed size on session "sized" and
// returns that size (Frame.Size).
func (e *scEnv) publishSized() int {
	e.t.Helper()
	id := "a"
	if _, ok := e.currentHub().Lookup(id); !ok {
		id = "sized"
		e.session(id)
	}
	f, err := e.currentHub().Publish(id, eventbus.Event{Type: "n", Data: strings.Repeat("x", 200)})
	if err != nil {
		e.t.Fatal(err)
	}
	return f.Size()
}

func TestScenarios(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			for _, k := range kinds {
				t.Run(k.String(), func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) {
						e := newScEnv(t, sc.opts, sc.configure)
						sc.run(t, e, k)
					})
				})
			}
		})
	}
}
