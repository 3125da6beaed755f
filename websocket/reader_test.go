package websocket_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	ws "github.com/coder/websocket"
	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/websocket"
)

// send writes text message msg.
func send(t *testing.T, c *ws.Conn, msg string) {
	t.Helper()
	if err := c.Write(context.Background(), ws.MessageText, []byte(msg)); err != nil {
		t.Fatalf("write %q: %v", msg[:min(len(msg), 80)], err)
	}
}

// jsonString is s as a JSON string.
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// sessionsOf returns the number of sessions a cursor names.
func sessionsOf(cursor string) int { return (len(cursor) - 2) / 24 }

// TestAddRemove: sessions added to an open socket resume from their entry
// in the given cursor, from the start of their ring ("0"), or live; each
// success is answered after the cursor line that names the change; each
// refusal with the route's status and code, and the stream goes on; a
// removed session's frames stop and the cursor drops it.
func TestAddRemove(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(e *env) { e.mux.MaxStreamSessions = 4 })
		for _, s := range []string{"a", "b", "c", "d", "e"} {
			e.session(s)
		}
		// A cursor naming b after its event 1.
		e.publish("b", "n", 1)
		cb := e.mustDial("session=b", nil)
		cursorB := decode(t, readMsg(t, cb)[0]).Cursor
		_ = cb.CloseNow()
		e.publish("b", "n", 2)
		e.publish("b", "n", 3)
		e.publish("c", "n", 1)
		e.publish("c", "n", 2)

		c := e.mustDial("session=a", nil)
		r := newReader(t, c)
		r.next() // the greeting

		// From its cursor entry: b's events 2 and 3, its replay_complete.
		send(t, c, `{"op":"add","session":"b","lastEventId":"`+cursorB+`","extra":[1,2]}`)
		got := r.until(func(l line) bool { return l.Op == "added" })
		last := got[len(got)-1]
		if last.Session != "b" || len(got) < 2 || !isCursor(got[len(got)-2]) || sessionsOf(got[len(got)-2].Cursor) != 2 {
			t.Fatalf("add b: %v", raws(got))
		}
		if ids := ids(got); len(ids["b"]) != 2 || ids["b"][0] != 2 || ids["b"][1] != 3 {
			t.Fatalf("add b from its cursor: %v, want 2 and 3", ids)
		}

		// "0": c's whole ring.
		send(t, c, `{"op":"add","session":"c","lastEventId":"0"}`)
		got = r.until(func(l line) bool { return l.Op == "added" })
		if ids := ids(got); len(ids["c"]) != 2 || ids["c"][0] != 1 {
			t.Fatalf("add c from 0: %v", raws(got))
		}

		// Refusals: the stream goes on.
		for _, tc := range []struct{ msg, session, code string }{
			{`{"op":"add","session":"b"}`, "b", "invalid_sessions"},        // in the stream already
			{`{"op":"add","session":"nope"}`, "nope", "session_not_found"}, // unknown
			{`{"op":"add","session":""}`, "", "invalid_session_id"},
			{`{"op":"add","session":` + jsonString(strings.Repeat("x", 300)) + `}`, strings.Repeat("x", 300), "invalid_session_id"},
			{`{"op":"remove","session":"nope"}`, "nope", "session_not_in_stream"},
		} {
			send(t, c, tc.msg)
			l := r.next()
			if l.Op != "error" || l.Session != tc.session || l.Code != tc.code || l.Status == 0 || l.Error == "" {
				t.Errorf("%s: %s, want error %s", tc.msg[:min(60, len(tc.msg))], l.raw[:min(200, len(l.raw))], tc.code)
			}
		}
		send(t, c, `{"op":"add"}`) // no session: the error names none
		if l := r.next(); l.Op != "error" || strings.Contains(l.raw, `"session"`) || l.Code != "invalid_session_id" {
			t.Errorf("add without a session: %s", l.raw)
		}

		// Live: d has nothing yet; its event after the answer comes.
		send(t, c, `{"op":"add","session":"d"}`)
		got = r.until(func(l line) bool { return l.Op == "added" })
		if len(ids(got)["d"]) != 0 || sessionsOf(got[len(got)-2].Cursor) != 4 {
			t.Fatalf("add d live: %v", raws(got))
		}
		send(t, c, `{"op":"add","session":"e"}`) // a fifth one
		if l := r.next(); l.Op != "error" || l.Session != "e" || l.Code != "invalid_sessions" || l.Status != 400 {
			t.Errorf("a fifth session: %s", l.raw)
		}
		e.publish("d", "n", 1)
		if got := r.until(isCursor); ids(got)["d"][0] != 1 {
			t.Fatalf("d's live event: %v", raws(got))
		}

		// Remove c: answered after a cursor line without it; its events stop.
		send(t, c, `{"op":"remove","session":"c"}`)
		got = r.until(func(l line) bool { return l.Op == "removed" })
		if got[len(got)-1].Session != "c" || sessionsOf(got[len(got)-2].Cursor) != 3 {
			t.Fatalf("remove c: %v", raws(got))
		}
		e.publish("c", "n", 3)
		e.publish("a", "n", 1)
		got = r.until(func(l line) bool { return l.Session == "a" && l.ID == 1 })
		got = append(got, r.until(isCursor)...)
		for _, l := range got {
			if l.Session == "c" {
				t.Fatalf("a frame of the removed session: %s", l.raw)
			}
			if isCursor(l) && sessionsOf(l.Cursor) != 3 {
				t.Fatalf("cursor of %d sessions after the remove", sessionsOf(l.Cursor))
			}
		}
		send(t, c, `{"op":"remove","session":"c"}`)
		if l := r.next(); l.Op != "error" || l.Code != "session_not_in_stream" || l.Status != 404 {
			t.Errorf("remove c again: %s", l.raw)
		}
		// Removing every session leaves the stream open.
		for _, s := range []string{"a", "b", "d"} {
			send(t, c, `{"op":"remove","session":"`+s+`"}`)
			r.until(func(l line) bool { return l.Op == "removed" })
		}
		send(t, c, `{"op":"add","session":"e"}`)
		got = r.until(func(l line) bool { return l.Op == "added" })
		if sessionsOf(got[len(got)-2].Cursor) != 1 {
			t.Fatalf("add to an empty stream: %v", raws(got))
		}
		_ = c.Close(ws.StatusNormalClosure, "")
		synctest.Wait()
		if n := e.session("c").SubscriberCount(); n != 0 {
			t.Errorf("the removed session keeps %d subscribers", n)
		}
	})
}

func raws(lines []line) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l.raw[:min(len(l.raw), 160)]
	}
	return out
}

// TestAddUnusableCursor: a forged, garbage or huge lastEventId in an add is
// never an error: the session starts live after state_resync_required
// cursor_invalid.
func TestAddUnusableCursor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(e *env) { e.mux.MaxStreamSessions = 8 })
		e.session("a")
		c := e.mustDial("session=a", nil)
		r := newReader(t, c)
		r.next()
		cursors := map[string]string{
			"s1": "garbage",
			"s2": "m1!!!!!!!!!!!!!!!!!!!!!!!!",                     // not base64url
			"s3": "m1" + strings.Repeat("A", 25),                   // not a whole entry
			"s4": "m1" + strings.Repeat("A", 24*257),               // more than MaxCursorEntries
			"s5": "-1",                                             // not an id
			"s6": "1:2",                                            // a single stream's id of another form
			"s7": strings.Repeat("9", websocket.MaxMessageBytes/2), // huge
		}
		for s, cur := range cursors {
			e.session(s)
			e.publish(s, "n", 1)
			send(t, c, `{"op":"add","session":"`+s+`","lastEventId":`+jsonString(cur)+`}`)
			got := r.until(func(l line) bool { return l.Op == "added" || l.Op == "error" })
			if got[len(got)-1].Op != "added" {
				t.Fatalf("%s: %v", s, raws(got))
			}
			var first *line
			for i := range got {
				if got[i].Session == s && got[i].Op == "" {
					first = &got[i]
					break
				}
			}
			if first == nil || first.Type != "state_resync_required" || !strings.Contains(string(first.Data), `"reason":"cursor_invalid"`) {
				t.Fatalf("%s with lastEventId %.40q: %v, want state_resync_required cursor_invalid", s, cur, raws(got))
			}
			if len(ids(got)[s]) != 0 {
				t.Fatalf("%s replayed with an unusable cursor: %v", s, raws(got))
			}
		}
	})
}

// TestHostileMessages: every message outside SPEC 6.10's rules closes the
// socket with its code and reason, and ends the stream.
func TestHostileMessages(t *testing.T) {
	cases := []struct {
		name   string
		typ    ws.MessageType
		msg    string
		code   ws.StatusCode
		reason string
	}{
		{"oversized", ws.MessageText, `{"op":"add","session":"a","lastEventId":"` + strings.Repeat("1", websocket.MaxMessageBytes) + `"}`, ws.StatusMessageTooBig, "message_too_big"},
		{"binary", ws.MessageBinary, `{"op":"remove","session":"a"}`, ws.StatusUnsupportedData, "unsupported_data"},
		{"malformed", ws.MessageText, `{"op":"add",`, ws.StatusPolicyViolation, "invalid_message"},
		{"not an object", ws.MessageText, `["add","a"]`, ws.StatusPolicyViolation, "invalid_message"},
		{"null", ws.MessageText, `null`, ws.StatusPolicyViolation, "invalid_message"},
		{"two objects", ws.MessageText, `{"op":"remove","session":"x"}{"op":"remove","session":"y"}`, ws.StatusPolicyViolation, "invalid_message"},
		{"session of the wrong type", ws.MessageText, `{"op":"add","session":5}`, ws.StatusPolicyViolation, "invalid_message"},
		{"cursor of the wrong type", ws.MessageText, `{"op":"add","session":"b","lastEventId":7}`, ws.StatusPolicyViolation, "invalid_message"},
		{"op of the wrong type", ws.MessageText, `{"op":["add"],"session":"b"}`, ws.StatusPolicyViolation, "invalid_message"},
		{"no op", ws.MessageText, `{"session":"b"}`, ws.StatusPolicyViolation, "invalid_message"},
		{"unknown op", ws.MessageText, `{"op":"subscribe","session":"b"}`, ws.StatusPolicyViolation, "invalid_message"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, nil)
				e.session("a")
				c := e.mustDial("session=a", nil)
				r := newReader(t, c)
				r.next()
				if err := c.Write(context.Background(), tc.typ, []byte(tc.msg)); err != nil {
					t.Fatal(err)
				}
				if code := r.end(); code != tc.code {
					t.Fatalf("closed with %d (%v), want %d", code, r.err, tc.code)
				}
				var ce ws.CloseError
				if !errors.As(r.err, &ce) || ce.Reason != tc.reason {
					t.Errorf("reason %q, want %q", ce.Reason, tc.reason)
				}
				synctest.Wait()
				if n := e.session("a").SubscriberCount(); n != 0 {
					t.Errorf("%d subscribers after the close", n)
				}
			})
		})
	}
}

// TestMessageAtTheLimit: a message of exactly MaxMessageBytes is read.
func TestMessageAtTheLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		e.session("a")
		c := e.mustDial("session=a", nil)
		r := newReader(t, c)
		r.next()
		msg := `{"op":"remove","session":"x"}`
		msg += strings.Repeat(" ", websocket.MaxMessageBytes-len(msg))
		send(t, c, msg)
		if l := r.next(); l.Op != "error" || l.Code != "session_not_in_stream" {
			t.Fatalf("%s", l.raw)
		}
	})
}

// TestRateLimit: a burst of MessageBurst messages is served; one more at
// once is 1008 rate_limited; after a pause the bucket has refilled.
func TestRateLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		e.session("a")
		c := e.mustDial("session=a", nil)
		r := newReader(t, c)
		r.next()
		for range websocket.MessageBurst {
			send(t, c, `{"op":"remove","session":"x"}`)
		}
		for range websocket.MessageBurst {
			if l := r.next(); l.Code != "session_not_in_stream" {
				t.Fatalf("%s", l.raw)
			}
		}
		// Two seconds refill 40 tokens: another burst passes.
		time.Sleep(2 * time.Second)
		for range websocket.MessageBurst {
			send(t, c, `{"op":"remove","session":"x"}`)
		}
		for range websocket.MessageBurst {
			r.next()
		}
		send(t, c, `{"op":"remove","session":"x"}`)
		if code := r.end(); code != ws.StatusPolicyViolation {
			t.Fatalf("closed with %d (%v), want 1008", code, r.err)
		}
		var ce ws.CloseError
		if !errors.As(r.err, &ce) || ce.Reason != "rate_limited" {
			t.Errorf("reason %q", ce.Reason)
		}
	})
}

// The greeting's cursor line, and the one after each change of the
// stream's sessions, say every session's epoch (what Event-Epochs says on
// SSE); a cursor line after events alone does not repeat them.
func TestCursorLineEpochs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		a, b := e.session("a"), e.session(`b"\`)
		c := e.mustDial("session=a", nil)
		r := newReader(t, c)
		greeting := r.next()
		if !isCursor(greeting) || len(greeting.Epochs) != 1 || greeting.Epochs["a"] != a.Epoch() {
			t.Fatalf("greeting %s, want a's epoch", greeting.raw)
		}
		e.publish("a", "n", 1)
		got := r.until(isCursor)
		if l := got[len(got)-1]; l.Epochs != nil {
			t.Fatalf("a cursor line after an event: %s, want no epochs", l.raw)
		}
		send(t, c, `{"op":"add","session":`+jsonString(`b"\`)+`}`)
		got = r.until(func(l line) bool { return l.Op == "added" })
		if l := got[len(got)-2]; !isCursor(l) || len(l.Epochs) != 2 || l.Epochs["a"] != a.Epoch() || l.Epochs[`b"\`] != b.Epoch() {
			t.Fatalf("the cursor line after add: %s, want both epochs", l.raw)
		}
		send(t, c, `{"op":"remove","session":"a"}`)
		got = r.until(func(l line) bool { return l.Op == "removed" })
		if l := got[len(got)-2]; !isCursor(l) || len(l.Epochs) != 1 || l.Epochs[`b"\`] != b.Epoch() {
			t.Fatalf("the cursor line after remove: %s, want b's epoch alone", l.raw)
		}
	})
}

// An embedder's refusal with a status outside the error statuses (a
// StatusError of Authorize's with none) is answered as the routes answer
// it: 500 internal, never an error line without a status or a code.
func TestAddRefusalOutsideTheErrorStatuses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(e *env) {
			e.streams.Authorize = func(_ *http.Request, session string, _ *eventbus.EventBus) (eventbus.Grant, error) {
				if session == "odd" {
					return eventbus.Grant{}, &eventbus.StatusError{Message: "no status"}
				}
				return eventbus.Grant{}, nil
			}
		})
		e.session("a")
		e.session("odd")
		c := e.mustDial("session=a", nil)
		r := newReader(t, c)
		r.next() // the greeting
		send(t, c, `{"op":"add","session":"odd"}`)
		got := r.until(func(l line) bool { return l.Op == "error" })
		if l := got[len(got)-1]; l.Session != "odd" || l.Status != 500 || l.Code != "internal" {
			t.Fatalf("%s, want 500 internal for odd", l.raw)
		}
	})
}
