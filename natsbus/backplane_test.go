package natsbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane/backplanetest"
)

// TestBackplane runs the conformance suite (package backplanetest): ids,
// order, epochs, resumes, trims, the replay budget, evictions, signals,
// DELETE, idempotency, outages, a lost stream, idle release, Close.
func TestBackplane(t *testing.T) { backplanetest.Run(t, harness) }

// A resume from the stream finds the first event wanted among other
// sessions' messages (the stream's sequence interleaves them), from any
// cursor, whatever the interleaving.
func TestResumeLocatesAmongOtherSessions(t *testing.T) {
	srv := startServer(t)
	a, _, c := threeReplicas(t, srv.URL(), testOptions())
	var epoch string
	for i := range 300 {
		// "s" gets every event at first, then one in seven, then bursts.
		if i < 50 || i < 200 && i%7 == 0 || i >= 200 && i%40 < 10 {
			_, epoch, _ = a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e", Data: i})
		}
		a.publish(t, fmt.Sprintf("other%d", i%3), "e", nil)
	}
	in, _ := a.bp.Info(context.Background(), "s")
	last := in.LastEventID
	for _, from := range []uint64{0, 1, 17, 49, 50, 51, 60, last - 11, last - 1} {
		sc := c.open(t, "s", map[string]string{"Last-Event-ID": fmt.Sprint(from), "Event-Epoch": epoch}, "")
		wantIDs(t, sc.Events(int(last-from), wait), from+1, last)
		if rc := sc.Next(wait); rc.Event != eventbus.TypeReplayComplete {
			t.Fatalf("from %d: want replay_complete, got %+v", from, rc)
		}
		sc.Close()
	}
}

// Session ids with every character NATS gives a meaning to (or forbids in
// a subject) are sessions of their own, each on its own subject.
func TestHostileSessionIDs(t *testing.T) {
	srv := startServer(t)
	a, _, c := threeReplicas(t, srv.URL(), testOptions())
	ids := []string{"a.b", "a", "b", "*", ">", "a.*", "a.>", "a b", "tab\there", "new\nline", "%41", "A", "%",
		"..", ".", "caf\u00e9", "\x00", strings.Repeat(".", MaxSessionIDBytes), "$JS.API.STREAM.LIST", "t.s.x"}
	ctx := context.Background()
	subs := map[string]*eventbus.Subscription{}
	for _, id := range ids {
		if _, ok := untoken(token(id)); !ok || strings.ContainsAny(token(id), ". \t\r\n*>") {
			t.Fatalf("token(%q) = %q", id, token(id))
		}
		sub, err := c.bp.Subscribe(ctx, id, eventbus.SubscribeOptions{})
		if err != nil {
			t.Fatalf("subscribe %q: %v", id, err)
		}
		defer sub.Close()
		subs[id] = sub
	}
	for i, id := range ids {
		for k := range 2 {
			got, _, err := a.bp.Publish(ctx, id, eventbus.Event{Type: "e", Data: i})
			if err != nil || got != uint64(k+1) {
				t.Fatalf("publish %d to %q: id %d, %v", k, id, got, err)
			}
		}
		if err := a.bp.Signal(ctx, id, "sig", id); err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range ids {
		sub := subs[id]
		var frames []eventbus.Frame
		deadline := time.After(wait)
		for len(frames) < 3 {
			if more, _ := sub.AppendReady(frames); len(more) > len(frames) {
				frames = more
				continue
			}
			select {
			case <-sub.Ready():
			case <-deadline:
				t.Fatalf("%q got %d frames: %v", id, len(frames), frames)
			}
		}
		var sig int
		for _, f := range frames {
			if f.ID() == 0 {
				sig++
				continue
			}
			var env struct{ Data int }
			json.Unmarshal(f.JSON(), &env)
			if env.Data != i {
				t.Fatalf("%q got an event of %q", id, ids[env.Data])
			}
		}
		if len(frames) != 3 || sig != 1 {
			t.Fatalf("%q got %d frames, %d signals: %v", id, len(frames), sig, frames)
		}
	}
	// Delete is per id too.
	if err := a.bp.Delete(ctx, "a.b"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b", "a.*", "a.>", "*", ">"} {
		if in, err := a.bp.Info(ctx, id); err != nil || in.LastEventID != 2 {
			t.Fatalf("%q after deleting \"a.b\": %+v %v", id, in, err)
		}
	}
	if in, _ := a.bp.Info(ctx, "a.b"); in.Exists {
		t.Fatalf("\"a.b\" after Delete: %+v", in)
	}
	// Ids that are not UTF-8 are refused as everywhere else: JSON cannot
	// carry them (eventbus.CheckSessionID).
	for _, bad := range []string{"", strings.Repeat("x", MaxSessionIDBytes+1), "\xff\xfe", "a\xff"} {
		if _, _, err := a.bp.Publish(ctx, bad, eventbus.Event{Type: "e"}); !errors.Is(err, ErrInvalidSession) || !errors.Is(err, eventbus.ErrInvalidSessionID) {
			t.Fatalf("session %q: %v", bad, err)
		}
	}
}

// token is reversible and distinct ids never share a token.
func TestTokenRoundTrip(t *testing.T) {
	seen := map[string]string{}
	for _, id := range []string{"a", "A", "%41", "%", "a.b", "a%2Eb", "-_", "\x00", "\xff", " "} {
		tok := token(id)
		if back, ok := untoken(tok); !ok || back != id {
			t.Fatalf("untoken(token(%q)) = %q, %v", id, back, ok)
		}
		if other, dup := seen[tok]; dup {
			t.Fatalf("%q and %q share the token %q", id, other, tok)
		}
		seen[tok] = id
	}
	for _, bad := range []string{"%", "%4", "%zz", "%4g"} {
		if _, ok := untoken(bad); ok {
			t.Fatalf("untoken(%q) accepted", bad)
		}
	}
}

// A resume whose history cannot be read (a message with the backplane's
// headers but a body that is not an event, as another writer could leave
// on the subject): the client is told what it missed cannot be read, then
// gets the live events.
func TestResumeHistoryUnavailable(t *testing.T) {
	srv := startServer(t)
	a, _, c := threeReplicas(t, srv.URL(), testOptions())
	for range 10 {
		a.publish(t, "s", "e", nil)
	}
	in, _ := a.bp.Info(context.Background(), "s")
	if _, err := a.bp.js.PublishMsg(context.Background(), newMsg(a.bp.subject("s"), in.Epoch, 11, []byte("no type line"))); err != nil {
		t.Fatal(err)
	}
	live := c.open(t, "s", nil, "") // C's mirror starts after id 11
	for range 9 {
		a.publish(t, "s", "e", nil)
	}
	wantIDs(t, live.Events(9, wait), 12, 20)
	sc := c.open(t, "s", map[string]string{"Last-Event-ID": "5", "Event-Epoch": in.Epoch}, "")
	rs := sc.Next(wait)
	if rs.Event != eventbus.TypeStateResyncRequired || rs.Str(t, "data", "reason") != "ring_evicted" ||
		rs.Str(t, "data", "detail") != "history_unavailable" || rs.Num(t, "data", "lastDeliveredId") != 5 ||
		rs.Num(t, "data", "earliestAvailableId") != 21 {
		t.Fatalf("want ring_evicted (history_unavailable) 5 -> 21, got %+v", rs)
	}
	if rc := sc.Next(wait); rc.Event != eventbus.TypeReplayComplete || rc.Num(t, "data", "replayedCount") != 0 {
		t.Fatalf("want an empty replay_complete, got %+v", rc)
	}
	a.publish(t, "s", "e", nil)
	wantIDs(t, sc.Events(1, wait), 21, 21)
}

// The server stopped, then started again (its store kept): Publish fails
// within its timeout with ErrUnavailable (nothing sent: the connection has
// no reconnect buffer), a new stream is 503; afterwards the ids go on in
// the same epoch and the open stream resumes without a loss.
func TestServerRestart(t *testing.T) {
	srv := startServer(t)
	opts := testOptions()
	opts.PublishTimeout = 300 * time.Millisecond
	a, sa := liveReplica(t, srv.URL(), opts)
	srv.Stop()
	// A publish written before the client noticed is outcome unknown.
	waitFor(t, wait, "the client to notice", func() bool { return !a.bp.nc.IsConnected() })
	for range 3 {
		start := time.Now()
		_, _, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOutcomeUnknown) {
			t.Fatalf("publish with the server down: %v, want ErrUnavailable alone", err)
		}
		if took := time.Since(start); took > opts.PublishTimeout+200*time.Millisecond {
			t.Fatalf("publish took %v, timeout %v", took, opts.PublishTimeout)
		}
	}
	resp, err := a.shared.Server.Client().Get(a.shared.URL("other", ""))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" || !strings.Contains(string(body), `"code":"unavailable"`) {
		t.Fatalf("GET with the server down: %s %v %s", resp.Status, resp.Header, body)
	}
	srv.Start()
	var id uint64
	var epoch string
	waitFor(t, wait, "publish after the restart", func() bool {
		id, epoch, err = a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		return err == nil
	})
	if id != 2 || epoch != sa.Epoch {
		t.Fatalf("after the restart: id %d epoch %s, want 2 of %s", id, epoch, sa.Epoch)
	}
	wantIDs(t, sa.Events(1, wait), 2, 2)
	sa.Quiet(50 * time.Millisecond)
}

func TestNewRejectsInvalidOptions(t *testing.T) {
	srv := startServer(t)
	js := connect(t, srv.URL())
	for name, o := range map[string]Options{
		"negative window":      {IdempotencyWindow: -1},
		"window below 100ms":   {IdempotencyWindow: time.Millisecond},
		"negative outage":      {OutageTimeout: -1},
		"outage below check":   {OutageTimeout: time.Second, CheckInterval: 2 * time.Second},
		"negative read count":  {ReadCount: -1},
		"stream name with dot": {Stream: "a.b"},
		"subject wildcard":     {Subject: "a.*"},
		"subject empty token":  {Subject: "a..b"},
		"bad bus options":      {Bus: eventbus.Options{RingSize: -1}},
	} {
		if bp, err := New(context.Background(), js, o); !errors.Is(err, eventbus.ErrInvalidOption) {
			if bp != nil {
				bp.Close()
			}
			t.Fatalf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
	if _, err := New(context.Background(), nil, Options{}); !errors.Is(err, eventbus.ErrInvalidOption) {
		t.Fatalf("nil JetStream: %v", err)
	}
}

// New sets the limits it relies on on an existing stream and keeps the
// rest of its operator's config.
func TestNewUpdatesTheStream(t *testing.T) {
	srv := startServer(t)
	js := connect(t, srv.URL())
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"other.>"}, MaxBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	opts := testOptions()
	opts.RingSize = 77
	bp, err := New(ctx, js, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer bp.Close()
	st, err := js.Stream(ctx, "T")
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if cfg.MaxMsgsPerSubject != 77 || cfg.Duplicates != DefaultIdempotencyWindow || !cfg.AllowRollup || !cfg.AllowMsgTTL ||
		cfg.MaxBytes != 1<<30 || len(cfg.Subjects) != 2 || cfg.Subjects[0] != "other.>" || cfg.Subjects[1] != "t.s.>" {
		t.Fatalf("stream config %+v", cfg)
	}
}

// A create of the lost stream that the server fails with its generic error
// (10049, "error creating store for stream", seen once in CI right after a
// stream was deleted) is tried again; one that keeps failing returns the
// server's error after createAttempts creates.
func TestEnsureStreamRetriesAFailedCreate(t *testing.T) {
	srv := startServer(t)
	opts := testOptions()
	js := &flakyCreate{JetStream: connect(t, srv.URL())}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	b, err := New(ctx, js, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	lose := func(fail int32) {
		t.Helper()
		if err := js.DeleteStream(ctx, opts.Stream); err != nil {
			t.Fatal(err)
		}
		js.fail.Store(fail)
		js.calls.Store(0)
	}

	lose(1)
	if err := b.ensureStream(ctx); err != nil {
		t.Fatalf("ensureStream after one failed create: %v", err)
	}
	if n := js.calls.Load(); n != 2 {
		t.Errorf("%d creates, want 2", n)
	}
	if _, err := js.Stream(ctx, opts.Stream); err != nil {
		t.Fatalf("the stream after ensureStream: %v", err)
	}

	lose(100)
	err = b.ensureStream(ctx)
	if ae := apiError(err); ae == nil || ae.ErrorCode != codeStreamCreate {
		t.Fatalf("ensureStream while creates fail: %v, want the server's error %d", err, codeStreamCreate)
	}
	if n := js.calls.Load(); n != createAttempts {
		t.Errorf("%d creates, want %d", n, createAttempts)
	}
}

// flakyCreate is a JetStream whose next fail stream creates fail as the
// server fails them while a deleted stream's store is still in the way.
type flakyCreate struct {
	jetstream.JetStream
	fail, calls atomic.Int32
}

func (f *flakyCreate) CreateStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	f.calls.Add(1)
	if f.fail.Add(-1) >= 0 {
		return nil, &jetstream.APIError{Code: 500, ErrorCode: codeStreamCreate, Description: "error creating store for stream"}
	}
	return f.JetStream.CreateStream(ctx, cfg)
}
