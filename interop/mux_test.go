package interop

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/internal/daemontest"
	"github.com/ssebus/eventbus/internal/muxcursor"
)

// TestThirdPartyClientsOnTheMultiplexedStream: two plain SSE clients
// nobody here wrote, tmaxmax/go-sse and npm eventsource (a WHATWG
// EventSource), each read two sessions on one stream (GET
// /events?session=a&session=b) and know nothing of it: they keep the last
// SSE id, the composite cursor, and send it back as Last-Event-ID when they
// reconnect by themselves. Through a clean cut (each session resumes
// exactly, with its own replay_complete) and a daemon restart (each
// session's shutdown frame, then its own epoch_reset and its new epoch's
// events), each session's events arrive once, in order.
func TestThirdPartyClientsOnTheMultiplexedStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	clients := []driven{
		{&client{name: "tmaxmax/go-sse", session: "mgosse"}, startGoSSE, false},
		{&client{name: "npm eventsource", session: "mnpmes"}, startNode("eventsource-client.mjs"), true},
	}
	needNode(t, clients)
	sessionsOf := func(c *client) []string { return []string{c.session + "-a", c.session + "-b"} }
	bin := daemontest.Build(ctx, t, "..", raceEnabled)
	addr := daemontest.FreeAddr(t)
	args := append([]string{"-addr", addr}, daemonArgs...)
	d := daemontest.Start(ctx, t, bin, args...)

	stop, all := drive(t, ctx, clients, func(c *client) string {
		return d.Base + "/events?" + url.Values{"session": sessionsOf(c)}.Encode()
	})
	defer stop()
	subscribed := func(c *client) (bool, string) {
		n := 0
		for _, id := range sessionsOf(c) {
			if st, ok := d.StatusIfAny(id); ok {
				n += st.Subscribers
			}
		}
		return n == 2, fmt.Sprint(n, " subscribed")
	}
	published := map[string]int{}
	publish := func(n int) {
		for _, cl := range clients {
			for _, id := range sessionsOf(cl.c) {
				for range n {
					published[id]++
					d.Publish(id, published[id])
				}
			}
		}
	}
	seen := func(total int) func(*client) (bool, string) {
		return func(c *client) (bool, string) { return c.events() == total, fmt.Sprint(c.events(), " events") }
	}

	all("to subscribe", subscribed) // the stream makes its sessions (-create-on-stream)
	publish(3)
	all("6 live events", seen(6))

	time.Sleep(idleBeforeCut)
	for _, cl := range clients {
		var res struct {
			Disconnected int `json:"disconnected"`
		}
		d.Call(http.MethodPost, "/session/"+sessionsOf(cl.c)[1]+"/disconnect", "", http.StatusOK, &res)
		if res.Disconnected != 1 {
			t.Fatalf("%s: the cut of one session cut %d streams, want its one stream", cl.c.name, res.Disconnected)
		}
	}
	publish(2)
	all("10 events after the cut", seen(10))
	all("to be back", subscribed)

	time.Sleep(idleBeforeCut)
	first := map[string]string{}
	for _, cl := range clients {
		for _, id := range sessionsOf(cl.c) {
			first[id] = d.Status(id).Epoch
		}
	}
	d.Stop(20 * time.Second)
	d = daemontest.Start(ctx, t, bin, args...)
	all("to be back on the new daemon", subscribed)
	clear(published)
	publish(2)
	all("14 events", seen(14))
	second := map[string]string{}
	for _, cl := range clients {
		for _, id := range sessionsOf(cl.c) {
			second[id] = d.Status(id).Epoch
		}
	}
	time.Sleep(300 * time.Millisecond) // let anything extra arrive
	stop()

	for _, cl := range clients {
		t.Run(cl.c.name, func(t *testing.T) {
			for _, id := range sessionsOf(cl.c) {
				verifyMux(t, cl.c, id, first[id], second[id], []int{5, 2})
			}
		})
	}
}

// verifyMux checks the frames of session among c's records: counts[i]
// events in epoch i (ids 1..counts[i], once each, in order, each with an
// SSE id that is a composite cursor holding the session at that id of
// that epoch), a replay_complete for each resume (the cut, and the
// restart's after its epoch_reset), at most one stream_error shutdown
// before the restart and one epoch_reset after it, and nothing else.
func verifyMux(t *testing.T, c *client, session, epoch1, epoch2 string, counts []int) {
	t.Helper()
	epochs := []string{epoch1, epoch2}
	phase, next := 0, uint64(1)
	replays, resets, shutdowns := 0, 0, 0
	for i, r := range c.records() {
		if r.Kind != "event" {
			continue
		}
		var env struct {
			Session *string         `json:"session"`
			ID      *uint64         `json:"id"`
			Type    string          `json:"type"`
			Data    json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal([]byte(r.Data), &env); err != nil || env.Session == nil {
			t.Fatalf("record %d: not a multiplexed envelope: %+v", i, r)
		}
		if *env.Session != session {
			continue
		}
		var d struct {
			Reason, Detail, Epoch, ErrorKind string
			LastDeliveredID                  uint64 `json:"lastDeliveredId"`
		}
		json.Unmarshal(env.Data, &d)
		switch {
		case env.ID != nil:
			cur, err := muxcursor.ParseCursor(r.ID)
			e, ok := cur.Entry(session)
			if r.Type != "note" || *env.ID != next || err != nil || !ok || e != muxcursor.NewEntry(session, epochs[phase], next) {
				t.Fatalf("record %d: %+v (cursor %+v %v), want note %d of epoch %s", i, r, e, err, next, epochs[phase])
			}
			next++
		case env.Type == eventbus.TypeReplayComplete:
			replays++
		case env.Type == eventbus.TypeStreamError && d.ErrorKind == eventbus.ErrorKindShutdown && phase == 0 && shutdowns == 0:
			shutdowns++
		case env.Type == eventbus.TypeStateResyncRequired && d.Reason == "epoch_reset" && phase == 0 && next == uint64(counts[0])+1 &&
			d.Epoch == epoch2 && d.LastDeliveredID == uint64(counts[0]):
			resets++
			phase, next = 1, 1
		default:
			t.Fatalf("record %d: %s %+v after %d events of epoch %d", i, env.Type, d, next-1, phase+1)
		}
	}
	if phase != 1 || next != uint64(counts[1])+1 || resets != 1 || replays != 2 {
		t.Fatalf("%s: ended in epoch %d at id %d, %d epoch_reset, %d replay_complete; want epoch 2 at %d, 1, 2",
			session, phase+1, next-1, resets, replays, counts[1])
	}
	t.Logf("%s %s: %d events of epoch 1 and %d of epoch 2 exactly once, with their cursors, %d replay_complete, %d stream_error shutdown",
		c.name, session, counts[0], counts[1], replays, shutdowns)
}
