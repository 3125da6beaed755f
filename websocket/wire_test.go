package websocket_test

import (
	"net/url"
	"slices"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/ssebus/eventbus"
)

// frameLines returns the frame lines of lines (not the control lines).
func frameLines(lines []line) []line {
	return slices.DeleteFunc(slices.Clone(lines), func(l line) bool { return l.Op != "" })
}

// TestEnvelopesMatchSSE: every frame line over the WebSocket is the SSE
// multiplexed route's data: line, byte for byte, for events (a small one
// and one of more than 64 KiB, written from its shared bytes), signals and
// synthetic frames (the replay's replay_complete), the stream served
// beside the WebSocket with the same cursor.
func TestEnvelopesMatchSSE(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		e.session("a")
		e.session("b")
		e.publish("a", "note", 1)
		e.publish("b", "note", 2)
		big := strings.Repeat("x", 100<<10)
		if _, err := e.hub.Publish("a", eventbus.Event{Type: "big", Data: big}); err != nil {
			t.Fatal(err)
		}
		e.publish("a", "note", 3)

		r := newReader(t, e.mustDial("session=a&session=b&lastEventId=0", nil))
		sse := e.openSSE("session=a&session=b", "0")
		var got []line
		for completes := 0; completes < 2; {
			l := r.next()
			if l.Type == "replay_complete" {
				completes++
			}
			if l.Op == "" {
				got = append(got, l)
			}
		}
		if err := e.session("a").Signal("changed", "doc/1"); err != nil {
			t.Fatal(err)
		}
		got = append(got, frameLines(r.until(func(l line) bool { return l.Type == "changed" }))...)

		// Across sessions the order is the stream's: compare per session.
		want := map[string][]string{}
		for range got {
			ev := sse.next()
			s := decodeData(t, ev.data)
			want[s] = append(want[s], ev.data)
		}
		have := map[string][]string{}
		for _, l := range got {
			have[l.Session] = append(have[l.Session], l.raw)
		}
		for _, s := range []string{"a", "b"} {
			if !slices.Equal(have[s], want[s]) {
				t.Errorf("session %s: WebSocket lines\n%q\nSSE data lines\n%q", s, trim(have[s]), trim(want[s]))
			}
		}
		// a: 3 events (one big), replay_complete, the signal; b: 1 event,
		// replay_complete.
		if len(have["a"]) != 5 || len(have["b"]) != 2 {
			t.Errorf("%d and %d lines, want 5 and 2", len(have["a"]), len(have["b"]))
		}
	})
}

func decodeData(t *testing.T, data string) string { return decode(t, data).Session }

// trim shortens long lines for a failure's message.
func trim(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = l[:min(len(l), 200)]
	}
	return out
}

// TestSeveralEnvelopesInOneMessage: a batch is one message: the replay of
// several events, its replay_complete, then the cursor as the last line.
func TestSeveralEnvelopesInOneMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		e.session("a")
		for i := range 5 {
			e.publish("a", "note", i)
		}
		c := e.mustDial("session=a&lastEventId=0", nil)
		readMsg(t, c) // the greeting
		lines := readMsg(t, c)
		if len(lines) != 7 {
			t.Fatalf("message of %d lines, want 5 events, replay_complete and the cursor: %q", len(lines), lines)
		}
		for i, raw := range lines[:5] {
			if l := decode(t, raw); l.Session != "a" || l.ID != uint64(i+1) || l.Type != "note" {
				t.Errorf("line %d: %s", i, raw)
			}
		}
		if l := decode(t, lines[5]); l.Type != "replay_complete" {
			t.Errorf("line 5: %s", lines[5])
		}
		if l := decode(t, lines[6]); l.Op != "cursor" {
			t.Errorf("last line: %s", lines[6])
		}
	})
}

// ids returns the event ids of lines per session.
func ids(lines []line) map[string][]uint64 {
	out := map[string][]uint64{}
	for _, l := range lines {
		if l.ID != 0 {
			out[l.Session] = append(out[l.Session], l.ID)
		}
	}
	return out
}

// TestOneCursorBothWays: a WebSocket client's cursor resumes the SSE
// multiplexed route exactly (no loss, no duplicate), and the SSE route's
// id: line resumes the WebSocket exactly.
func TestOneCursorBothWays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		e.session("a")
		e.session("b")

		// WebSocket, then SSE.
		c := e.mustDial("session=a&session=b", nil)
		r := newReader(t, c)
		r.next() // the greeting
		e.publish("a", "n", 1)
		e.publish("b", "n", 1)
		e.publish("a", "n", 2)
		var seen []line
		cursor := ""
		for len(ids(seen)["a"]) < 2 || len(ids(seen)["b"]) < 1 {
			msg := r.until(isCursor)
			seen = append(seen, msg...)
			cursor = msg[len(msg)-1].Cursor
		}
		_ = c.CloseNow()
		e.publish("b", "n", 2)
		e.publish("a", "n", 3)
		e.publish("b", "n", 3)
		sse := e.openSSE("session=a&session=b", cursor)
		got := map[string][]uint64{}
		completes := 0
		lastID := ""
		for completes < 2 || len(got["a"]) < 1 || len(got["b"]) < 2 {
			ev := sse.next()
			l := decode(t, ev.data)
			switch {
			case l.Type == "replay_complete":
				completes++
			case l.ID != 0:
				got[l.Session] = append(got[l.Session], l.ID)
				lastID = ev.id
			default:
				t.Fatalf("SSE frame %s", ev.data)
			}
		}
		if !slices.Equal(got["a"], []uint64{3}) || !slices.Equal(got["b"], []uint64{2, 3}) {
			t.Fatalf("SSE resumed with the WebSocket's cursor got %v, want a:[3] b:[2 3]", got)
		}
		sse.close()

		// SSE, then WebSocket.
		e.publish("a", "n", 4)
		e.publish("b", "n", 4)
		r2 := newReader(t, e.mustDial("session=b&session=a&lastEventId="+url.QueryEscape(lastID), nil))
		r2.next() // the greeting
		var resumed []line
		for {
			resumed = append(resumed, r2.until(isCursor)...)
			n := 0
			for _, l := range resumed {
				if l.Type == "replay_complete" {
					n++
				}
			}
			if n == 2 {
				break
			}
		}
		if got := ids(resumed); !slices.Equal(got["a"], []uint64{4}) || !slices.Equal(got["b"], []uint64{4}) {
			t.Fatalf("the WebSocket resumed with the SSE id got %v, want a:[4] b:[4]", got)
		}
	})
}

// TestEpochReset: a cursor entry of another bus of the session (deleted
// and created again) is epoch_reset for that session, then the new bus's
// ring from its start (SPEC 4.1), then live.
func TestEpochReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, nil)
		e.session("a")
		e.publish("a", "n", 1)
		c := e.mustDial("session=a", nil)
		cursor := decode(t, readMsg(t, c)[0]).Cursor
		_ = c.CloseNow()
		e.hub.Delete("a")
		e.session("a")
		e.publish("a", "n", 1)

		r := newReader(t, e.mustDial("session=a&lastEventId="+cursor, nil))
		r.next() // the greeting
		l := r.next()
		if l.Type != "state_resync_required" || !strings.Contains(string(l.Data), `"reason":"epoch_reset"`) {
			t.Fatalf("first frame %s, want state_resync_required epoch_reset", l.raw)
		}
		replay := frameLines(r.until(func(l line) bool { return l.Type == "replay_complete" }))
		if len(replay) != 2 || replay[0].ID != 1 {
			t.Fatalf("then %v, want the new bus's event 1 and replay_complete", replay)
		}
		e.publish("a", "n", 2)
		if l := r.until(func(l line) bool { return l.ID != 0 }); l[len(l)-1].ID != 2 {
			t.Fatalf("then %s, want the live event 2", l[len(l)-1].raw)
		}
	})
}
