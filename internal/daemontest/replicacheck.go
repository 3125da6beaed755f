package daemontest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane/backplanetest"
)

// checkReplicaFlags: -h shows the daemon's usage and flags, an invalid
// flag value is refused before anything starts.
func checkReplicaFlags(c *replicaRun) {
	out, err := c.command("-h").CombinedOutput()
	if err != nil {
		c.Fatalf("-h: %v\n%s", err, out)
	}
	for _, want := range []string{c.h.Daemon, "-" + c.h.EngineFlag, "-outage-timeout", "-overflow policy", "-epoch-ids", "-auth-token"} {
		if !strings.Contains(string(out), want) {
			c.Errorf("-h does not mention %q:\n%s", want, out)
		}
	}
	out, err = c.command("-overflow", "drop").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "overflow") {
		c.Fatalf("-overflow drop was accepted: %v\n%s", err, out)
	}
}

// checkReplicaPublishAndStream: events published on either replica reach
// the streams of both, with contiguous ids, their type and data, and the
// session's epoch in the publish answers and the Event-Epoch header.
func checkReplicaPublishAndStream(c *replicaRun) {
	a, b := c.replica("A"), c.replica("B")
	sa, sb := c.open(a, "s", nil), c.open(b, "s", nil)
	var epoch string
	for i := 1; i <= 3; i++ {
		d := a
		if i == 3 {
			d = b
		}
		id, e := c.publish(d, "s", note(i))
		if id != uint64(i) || e == "" || (epoch != "" && e != epoch) {
			c.Fatalf("publish %d: id %d epoch %q (first epoch %q)", i, id, e, epoch)
		}
		epoch = e
	}
	for _, s := range []*backplanetest.Stream{sa, sb} {
		fs := s.Events(3, replicaWait)
		backplanetest.WantIDs(c, fs, 1, 3)
		for i, f := range fs {
			if f.Event != "note" || f.Num(c, "data", "n") != int64(i+1) {
				c.Fatalf("event %d: %+v", i+1, f)
			}
		}
		if s.Epoch != epoch {
			c.Fatalf("Event-Epoch %q, the publishes' %q", s.Epoch, epoch)
		}
	}
}

// checkReplicaResume: the README's two-daemon demo: publish on A, resume
// on B (which serves its streams under the catch-up overflow policy:
// nothing here depends on it) from Last-Event-ID and Event-Epoch, and on A
// from ?lastEventId=.
func checkReplicaResume(c *replicaRun) {
	a, b := c.replica("A"), c.replica("B", "-overflow", "catchup")
	var epoch string
	for i := 1; i <= 3; i++ {
		_, epoch = c.publish(a, "s1", note(i))
	}
	s := c.open(b, "s1", map[string]string{"Last-Event-ID": "1", "Event-Epoch": epoch})
	if s.Epoch != epoch {
		c.Fatalf("B's epoch %q, A's %q", s.Epoch, epoch)
	}
	backplanetest.WantIDs(c, s.Events(2, replicaWait), 2, 3)
	if f := s.Next(replicaWait); f.Event != "replay_complete" {
		c.Fatalf("want replay_complete, got %+v", f)
	}
	c.publish(b, "s1", `{"type":"note"}`)
	backplanetest.WantIDs(c, s.Events(1, replicaWait), 4, 4)
	sa := backplanetest.Open(c.T, c.client, a.Base+"/session/s1/events?lastEventId=2&epoch="+epoch, nil)
	backplanetest.WantIDs(c, sa.Events(2, replicaWait), 3, 4)
	if f := sa.Next(replicaWait); f.Event != "replay_complete" || f.Num(c, "data", "replayedCount") != 2 {
		c.Fatalf("want replay_complete of 2, got %+v", f)
	}
}

// checkReplicaIDsContiguous: publishes racing on two replicas get the ids
// 1..n, each once, and both replicas deliver them in that order.
func checkReplicaIDsContiguous(c *replicaRun) {
	a, b := c.replica("A"), c.replica("B")
	sa, sb := c.open(a, "s", nil), c.open(b, "s", nil)
	const per = 20
	var (
		mu   sync.Mutex
		ids  []uint64
		errs []error
		wg   sync.WaitGroup
	)
	for _, d := range []*Daemon{a, b} {
		wg.Go(func() {
			for i := range per {
				var res struct {
					ID uint64 `json:"id"`
				}
				resp, err := d.HTTP.Post(d.Base+"/session/s/events", "application/json", strings.NewReader(note(i)))
				if err == nil {
					if resp.StatusCode != http.StatusOK {
						err = fmt.Errorf("%s", resp.Status)
					} else {
						err = json.NewDecoder(resp.Body).Decode(&res)
					}
					resp.Body.Close()
				}
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					ids = append(ids, res.ID)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		c.Fatalf("publishes failed: %v", errs)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, IDs(1, 2*per)) {
		c.Fatalf("the publishes got ids %v, want 1..%d each once", ids, 2*per)
	}
	backplanetest.WantIDs(c, sa.Events(2*per, replicaWait), 1, 2*per)
	backplanetest.WantIDs(c, sb.Events(2*per, replicaWait), 1, 2*per)
}

// checkReplicaSignal: a signal sent on A reaches the session's streams on
// both replicas, without an id.
func checkReplicaSignal(c *replicaRun) {
	a, b := c.replica("A"), c.replica("B")
	c.publish(a, "s1", note(1))
	sa, sb := c.open(a, "s1", map[string]string{"Last-Event-ID": "1"}), c.open(b, "s1", map[string]string{"Last-Event-ID": "1"})
	if r := a.Do(http.MethodPost, "/session/s1/signal", `{"type":"doc.changed","about":"doc/1"}`, nil); r.Status != http.StatusNoContent {
		c.Fatalf("signal: %d %s", r.Status, r.Raw)
	}
	for _, s := range []*backplanetest.Stream{sa, sb} {
		f := s.Next(replicaWait)
		if f.Event == "replay_complete" {
			f = s.Next(replicaWait)
		}
		if f.Event != "doc.changed" || f.Str(c, "about") != "doc/1" || f.ID != 0 {
			c.Fatalf("want the signal, got %+v", f)
		}
	}
}

// checkReplicaStatus: GET /session/{id} is the session as the engine and
// the replica asked see it; an unknown session is a JSON 404.
func checkReplicaStatus(c *replicaRun) {
	a, b := c.replica("A"), c.replica("B")
	var epoch string
	for i := 1; i <= 4; i++ {
		_, epoch = c.publish([]*Daemon{a, b}[i%2], "s1", note(i))
	}
	c.open(b, "s1", nil)
	for _, w := range []struct {
		d       *Daemon
		replica string
		streams float64
	}{{a, "A", 0}, {b, "B", 1}} {
		r := w.d.Do(http.MethodGet, "/session/s1", "", nil)
		v := r.JSON
		if r.Status != http.StatusOK || v["id"] != "s1" || v["lastEventId"] != float64(4) || v["firstEventId"] != float64(1) ||
			v["epoch"] != epoch || v["replica"] != w.replica || v["streams"] != w.streams {
			c.Fatalf("status on %s: %d %s", w.replica, r.Status, r.Raw)
		}
	}
	r := a.Do(http.MethodGet, "/session/nothing", "", nil)
	if r.Status != http.StatusNotFound || r.Code() != "session_not_found" || r.Header.Get("Content-Type") != "application/json" {
		c.Fatalf("status of an unknown session: %d %v %s", r.Status, r.Header, r.Raw)
	}
}

// checkReplicaDelete: DELETE on A ends the session's streams on B, which
// learns of it from the engine: with stream_error closed where the engine
// says the session was deleted (a client does not reconnect to it), or
// stream_error unavailable where it cannot tell a deletion from a lost log
// (a client reconnects, and then finds the session gone: 404). The next
// publish starts a new epoch at id 1.
func checkReplicaDelete(c *replicaRun) {
	a, b := c.replica("A"), c.replica("B")
	_, epoch := c.publish(a, "s1", note(1))
	s := c.open(b, "s1", map[string]string{"Last-Event-ID": "1", "Event-Epoch": epoch})
	if f := s.Next(replicaWait); f.Event != "replay_complete" {
		c.Fatalf("want replay_complete, got %+v", f)
	}
	if r := a.Do(http.MethodDelete, "/session/s1", "", nil); r.Status != http.StatusNoContent {
		c.Fatalf("DELETE: %d %s", r.Status, r.Raw)
	}
	rest := s.Ended(replicaWait)
	if len(rest) != 1 || rest[0].Event != "stream_error" ||
		!strings.Contains(rest[0].Data, `"errorKind":"closed"`) && !strings.Contains(rest[0].Data, `"errorKind":"unavailable"`) {
		c.Fatalf("frames after DELETE: %+v, want one stream_error closed or unavailable", rest)
	}
	if r := b.Do(http.MethodGet, "/session/s1", "", nil); r.Status != http.StatusNotFound {
		c.Fatalf("the deleted session on B: %d %s, want 404", r.Status, r.Raw)
	}
	if id, e := c.publish(b, "s1", note(1)); id != 1 || e == epoch {
		c.Fatalf("publish after DELETE: id %d epoch %q (the deleted one %q)", id, e, epoch)
	}
}

// checkReplicaInvalidSessionIDs: every route that names a session
// refuses an id eventbus.CheckSessionID refuses with 400
// invalid_session_id, before the engine: "a%FF" and "a%FE" (both
// "a\ufffd" in JSON), a truncated rune, and one byte too many. Valid
// UTF-8 beyond ASCII is a session of its own.
func checkReplicaInvalidSessionIDs(c *replicaRun) {
	a := c.replica("A")
	for _, raw := range []string{"a%FF", "a%FE", "caf%C3", strings.Repeat("x", eventbus.MaxSessionIDBytes+1)} {
		for _, rt := range []struct{ method, path, body string }{
			{http.MethodGet, "/session/" + raw + "/events", ""},
			{http.MethodPost, "/session/" + raw + "/events", note(1)},
			{http.MethodPost, "/session/" + raw + "/signal", `{"type":"doc.changed","about":"d"}`},
			{http.MethodGet, "/session/" + raw, ""},
			{http.MethodDelete, "/session/" + raw, ""},
			{http.MethodPost, "/session/" + raw + "/disconnect", ""},
		} {
			r := a.Do(rt.method, rt.path, rt.body, nil)
			if r.Status != http.StatusBadRequest || r.Code() != "invalid_session_id" || r.Header.Get("Content-Type") != "application/json" {
				c.Fatalf("%s %s: %d %s, want 400 invalid_session_id", rt.method, rt.path, r.Status, r.Raw)
			}
		}
	}
	id, epoch := c.publish(a, "caf%C3%A9", note(1))
	if r := a.Do(http.MethodGet, "/session/caf%C3%A9", "", nil); r.Status != http.StatusOK || r.JSON["id"] != "caf\u00e9" ||
		r.JSON["epoch"] != epoch || id != 1 {
		c.Fatalf("the session caf\u00e9: publish id %d, status %d %s", id, r.Status, r.Raw)
	}
}

// checkReplicaIdempotencyKey: a retry with the key answers the first id
// and epoch with "duplicate":true on any replica (the body compared as
// JSON), another event under the key is 422, a malformed key 400.
func checkReplicaIdempotencyKey(c *replicaRun) {
	a, b := c.replica("A"), c.replica("B")
	r := keyed(a, "s", "order-17", `{"type":"order","data":{"n":17}}`)
	if r.Status != 200 || idOf(r) != 1 || r.JSON["duplicate"] != nil {
		c.Fatalf("first: %d %s", r.Status, r.Raw)
	}
	epoch := epochOf(r)
	for _, d := range []*Daemon{a, b} {
		if r = keyed(d, "s", "order-17", `{"type":"order","data":{ "n" : 17 }}`); r.Status != 200 || idOf(r) != 1 || r.JSON["duplicate"] != true || epochOf(r) != epoch {
			c.Fatalf("retry on %s: %d %s", d.Base, r.Status, r.Raw)
		}
	}
	if r = keyed(b, "s", "order-17", `{"type":"order","data":{"n":18}}`); r.Status != http.StatusUnprocessableEntity || r.Code() != "idempotency_key_reused" {
		c.Fatalf("key reused: %d %s", r.Status, r.Raw)
	}
	for _, k := range []string{"", "caf\u00e9", strings.Repeat("k", 256)} {
		if r = keyed(a, "s", k, `{"type":"order"}`); r.Status != http.StatusBadRequest || r.Code() != "invalid_idempotency_key" {
			c.Fatalf("key %q: %d %s", k, r.Status, r.Raw)
		}
	}
	if id, _ := c.publish(a, "s", `{"type":"order"}`); id != 2 {
		c.Fatalf("next publish: id %d, want 2", id)
	}
}

// checkReplicaEngineHung: with the engine hung, a publish answers 503
// publish_outcome_unknown with Retry-After within its -publish-timeout,
// saying the event may or may not be appended and how to retry, and a new
// session's stream 503 unavailable; once the engine answers again, the
// keyed retry (on the other replica) appends the event once.
func checkReplicaEngineHung(c *replicaRun) {
	e := c.engine()
	a, b := c.replica("A", "-publish-timeout", "300ms"), c.replica("B")
	sb := c.open(b, "s", nil)
	c.publish(a, "s", note(1))
	backplanetest.WantIDs(c, sb.Events(1, replicaWait), 1, 1)
	resume := c.outage(e.Pause, e.Resume)
	start := time.Now()
	r := keyed(a, "s", "k1", `{"type":"order","data":{"n":2}}`)
	took := time.Since(start)
	if r.Code() != "publish_outcome_unknown" {
		c.Fatalf("publish to a hung engine: %d %s, want 503 publish_outcome_unknown", r.Status, r.Raw)
	}
	unavailable(c, "publish to a hung engine", r, true)
	if took > 2*time.Second {
		c.Fatalf("publish to a hung engine took %v, -publish-timeout 300ms", took)
	}
	if r = a.Do(http.MethodGet, "/session/other/events", "", nil); r.Code() != "unavailable" {
		c.Fatalf("a new stream with the engine hung: %d %s, want 503 unavailable", r.Status, r.Raw)
	}
	unavailable(c, "a new stream with the engine hung", r, false)
	resume()
	backplanetest.WaitFor(c, replicaWait, "the keyed retry once the engine answers", func() bool {
		r = keyed(b, "s", "k1", `{"type":"order","data":{"n":2}}`)
		return r.Status == http.StatusOK
	})
	if idOf(r) != 2 {
		c.Fatalf("keyed retry: %s, want id 2", r.Raw)
	}
	c.Logf("the timed-out publish was applied meanwhile: %v", r.JSON["duplicate"] == true)
	if f := sb.Events(1, replicaWait)[0]; f.ID != 2 || f.Num(c, "data", "n") != 2 {
		c.Fatalf("the stream got %+v, want the order as id 2", f)
	}
	if id, _ := c.publish(a, "s", note(3)); id != 3 {
		c.Fatalf("next publish: id %d, want 3", id)
	}
	backplanetest.WantIDs(c, sb.Events(1, replicaWait), 3, 3)
}

// checkReplicaEngineDown: with the engine down, a publish answers 503
// unavailable with Retry-After (publish_outcome_unknown, saying so, only
// while a connection's fate is unclear), a new stream 503 unavailable, and
// the open streams end with stream_error unavailable within
// -outage-timeout; once it is up, the keyed publish goes through with the
// next id, and a client resumes on the other replica.
func checkReplicaEngineDown(c *replicaRun) {
	e := c.engine()
	a, b := c.replica("A", "-outage-timeout", "1s"), c.replica("B", "-outage-timeout", "1s")
	sa, sb := c.open(a, "s", nil), c.open(b, "s", nil)
	_, epoch := c.publish(a, "s", note(1))
	for _, s := range []*backplanetest.Stream{sa, sb} {
		backplanetest.WantIDs(c, s.Events(1, replicaWait), 1, 1)
	}
	up := c.outage(e.Down, e.Up)
	var r Answer
	backplanetest.WaitFor(c, replicaWait, "publish: 503 unavailable", func() bool {
		r = keyed(a, "s", "k-down", note(2))
		unavailable(c, "publish with the engine down", r, true)
		return r.Code() == "unavailable"
	})
	if msg, _ := r.JSON["error"].(string); !strings.Contains(msg, "not appended") {
		c.Fatalf("the unavailable answer does not say nothing was appended: %s", r.Raw)
	}
	if r = b.Do(http.MethodGet, "/session/other/events", "", nil); r.Code() != "unavailable" {
		c.Fatalf("a new stream with the engine down: %d %s, want 503 unavailable", r.Status, r.Raw)
	}
	unavailable(c, "a new stream with the engine down", r, false)
	sa.EndedUnavailable(time.Second + replicaWait)
	sb.EndedUnavailable(time.Second + replicaWait)

	up()
	backplanetest.WaitFor(c, replicaWait, "the keyed publish once the engine is up", func() bool {
		r = keyed(a, "s", "k-down", note(2))
		return r.Status == http.StatusOK
	})
	if idOf(r) != 2 || epochOf(r) != epoch {
		c.Fatalf("publish after the outage: %s, want id 2 of epoch %q", r.Raw, epoch)
	}
	// Each replica finds the engine again on its own (its client's
	// reconnect): until then it answers 503 with Retry-After, and a client
	// comes back.
	backplanetest.WaitFor(c, replicaWait, "B to reach the engine again", func() bool {
		r = b.Do(http.MethodGet, "/session/s", "", nil)
		if r.Status != http.StatusOK {
			unavailable(c, "B's status while it reconnects", r, false)
		}
		return r.Status == http.StatusOK
	})
	s := c.open(b, "s", map[string]string{"Last-Event-ID": "1", "Event-Epoch": epoch})
	backplanetest.WantIDs(c, s.Events(1, replicaWait), 2, 2)
	if f := s.Next(replicaWait); f.Event != "replay_complete" {
		c.Fatalf("want replay_complete, got %+v", f)
	}
	c.publish(a, "s", note(3))
	backplanetest.WantIDs(c, s.Events(1, replicaWait), 3, 3)
	c.publish(b, "other", note(1))
}

// checkReplicaEpochIDs: epoch ids (on by default) through the backplane:
// the mirrors of every replica carry the session's shared epoch, so an id
// a browser got from A resumes on B, and after a DELETE (a new epoch) the
// same id is an epoch_reset, never a join of two epochs.
func checkReplicaEpochIDs(c *replicaRun) {
	a, b := c.replica("A"), c.replica("B")
	var epoch string
	for i := 1; i <= 3; i++ {
		_, epoch = c.publish(a, "s1", note(i))
	}
	c.openRaw(a.Base+"/session/s1/events?lastEventId=0", nil).want([3]string{epoch + ":1", "note", `{"id":1,`})

	// What a browser's EventSource sends back by itself, to the other replica.
	s := c.openRaw(b.Base+"/session/s1/events", http.Header{"Last-Event-Id": {epoch + ":1"}})
	s.want([3]string{epoch + ":2", "note", `{"id":2,`}, [3]string{epoch + ":3", "note", `{"id":3,`},
		[3]string{"", "replay_complete", `{"v":1,"type":"replay_complete","data":{"replayedCount":2,"lastReplayedEventId":3,"lastEventId":3,"epoch":"` + epoch + `"}`})
	c.publish(a, "s1", `{"type":"note"}`)
	s.want([3]string{epoch + ":4", "note", `{"id":4,`})

	if r := a.Do(http.MethodDelete, "/session/s1", "", nil); r.Status != http.StatusNoContent {
		c.Fatalf("DELETE: %d %s", r.Status, r.Raw)
	}
	var next string
	for range 5 { // the new epoch is already past the old cursor
		_, next = c.publish(b, "s1", `{"type":"note"}`)
	}
	if next == epoch {
		c.Fatal("DELETE kept the epoch")
	}
	for _, d := range []*Daemon{a, b} {
		c.openRaw(d.Base+"/session/s1/events", http.Header{"Last-Event-Id": {epoch + ":4"}}).want(
			[3]string{"", "state_resync_required", `{"v":1,"type":"state_resync_required","data":{"reason":"epoch_reset","detail":"epoch_mismatch","lastDeliveredId":4,"earliestAvailableId":1,"epoch":"` + next + `"}`},
			[3]string{next + ":1", "note", `{"id":1,`})
	}
}

// checkReplicaDisconnect: /disconnect cuts this replica's streams of the
// session: ?mode=clean (the default) ends the responses, ?mode=abort
// resets the connections.
func checkReplicaDisconnect(c *replicaRun) {
	a := c.replica("A")
	c.publish(a, "s2", note(1))
	disconnect := func(query string, n float64, mode string) {
		c.Helper()
		r := a.Do(http.MethodPost, "/session/s2/disconnect"+query, "", nil)
		if r.Status != http.StatusOK || r.JSON["disconnected"] != n || r.JSON["mode"] != mode {
			c.Fatalf("disconnect%s: %d %s, want %v %s", query, r.Status, r.Raw, n, mode)
		}
	}
	disconnect("", 0, "clean")
	s := c.open(a, "s2", nil)
	disconnect("", 1, "clean")
	s.Ended(replicaWait)

	req, _ := http.NewRequest(http.MethodGet, a.Base+"/session/s2/events", nil)
	resp, err := c.client.Do(req)
	if err != nil {
		c.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		c.Fatalf("stream: %s", resp.Status)
	}
	disconnect("?mode=abort", 1, "abort")
	if _, err := io.ReadAll(resp.Body); !errors.Is(err, syscall.ECONNRESET) {
		c.Fatalf("after the abort: %v, want a connection reset", err)
	}
}

// checkReplicaJSONErrors: a wrong method, an unknown path and a bad
// parameter are JSON errors.
func checkReplicaJSONErrors(c *replicaRun) {
	a := c.replica("A")
	for _, w := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"PUT", "/session/s2/events", 405, "method_not_allowed"},
		{"GET", "/session/s2/signal", 405, "method_not_allowed"},
		{"GET", "/nope", 404, "not_found"},
		{"POST", "/session/s2/disconnect?mode=x", 400, "invalid_mode"},
		{"POST", "/session/s2/events", 400, ""}, // no body: the code is the decoder's
	} {
		r := a.Do(w.method, w.path, "", nil)
		if r.Status != w.status || (w.code != "" && r.Code() != w.code) || r.Code() == nil || r.Header.Get("Content-Type") != "application/json" {
			c.Errorf("%s %s: %d %v %s, want %d %s", w.method, w.path, r.Status, r.Header, r.Raw, w.status, w.code)
		}
	}
}

// checkReplicaAuthToken: -auth-token on two replicas: no credentials, no
// stream (and no session in the engine); the login cookie of one replica
// is accepted by the other (it is signed with the shared token, not
// stored); a logout on a replica ends its streams of the subject with
// stream_error revoked.
func checkReplicaAuthToken(c *replicaRun) {
	flags := []string{"-auth-token", "rtok", "-token-lifetime", "1m"}
	a, b := c.replica("A", flags...), c.replica("B", flags...)
	r := a.Do(http.MethodGet, "/session/auth/events", "", nil)
	if r.Status != http.StatusUnauthorized || r.Header.Get("WWW-Authenticate") != `Bearer realm="`+c.h.Daemon+`"` {
		c.Fatalf("anonymous stream: %d %v %s", r.Status, r.Header, r.Raw)
	}
	if r := a.Do(http.MethodGet, "/session/auth", "", http.Header{"Authorization": {"Bearer rtok"}}); r.Status != http.StatusNotFound {
		c.Fatalf("the anonymous stream made a session: %d %s", r.Status, r.Raw)
	}
	req, _ := http.NewRequest(http.MethodPost, a.Base+"/login", strings.NewReader(`{"token":"rtok","subject":"alice"}`))
	resp, err := a.HTTP.Do(req)
	if err != nil {
		c.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || len(resp.Cookies()) != 1 {
		c.Fatalf("login on A: %s %v", resp.Status, resp.Header)
	}
	cookie := resp.Cookies()[0].Name + "=" + resp.Cookies()[0].Value
	if r := b.Do(http.MethodPost, "/session/auth/events", `{"type":"a"}`, http.Header{"Cookie": {cookie}}); r.Status != 200 {
		c.Fatalf("publish on B with A's cookie: %d %s", r.Status, r.Raw)
	}
	s := c.open(b, "auth", map[string]string{"Cookie": cookie, "Last-Event-ID": "0"})
	if f := s.Next(replicaWait); f.Event != "a" || f.ID != 1 {
		c.Fatalf("want event a, got %+v", f)
	}
	if f := s.Next(replicaWait); f.Event != "replay_complete" {
		c.Fatalf("want replay_complete, got %+v", f)
	}
	if r := b.Do(http.MethodPost, "/logout", "", http.Header{"Cookie": {cookie}}); r.Status != 200 || r.JSON["revoked"] != float64(1) {
		c.Fatalf("logout on B: %d %s", r.Status, r.Raw)
	}
	rest := s.Ended(replicaWait)
	if len(rest) != 1 || rest[0].Event != "stream_error" || rest[0].Str(c, "data", "errorKind") != "revoked" {
		c.Fatalf("the stream ended with %+v, want stream_error revoked", rest)
	}
}

// checkReplicaShutdown: at SIGTERM a replica ends its streams with
// stream_error shutdown carrying -shutdown-retry-after and exits 0; the
// other replica goes on.
func checkReplicaShutdown(c *replicaRun) {
	a, b := c.replica("A", "-shutdown-retry-after", "1500ms"), c.replica("B")
	c.publish(a, "s", note(1))
	sa, sb := c.open(a, "s", map[string]string{"Last-Event-ID": "1"}), c.open(b, "s", map[string]string{"Last-Event-ID": "1"})
	for _, s := range []*backplanetest.Stream{sa, sb} {
		if f := s.Next(replicaWait); f.Event != "replay_complete" {
			c.Fatalf("want replay_complete, got %+v", f)
		}
	}
	a.Stop(15 * time.Second)
	sa.EndedShutdown(replicaWait, 1500*time.Millisecond)
	if !strings.Contains(a.LogText(), c.h.Daemon+" shutting down") {
		c.Fatalf("no shutdown line in A's log:\n%s", a.LogText())
	}
	c.publish(b, "s", note(2))
	backplanetest.WantIDs(c, sb.Events(1, replicaWait), 2, 2)
}
