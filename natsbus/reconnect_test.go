package natsbus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane/backplanetest"
)

// ReconnectDelay: the first pass at once, then MinReconnectDelay doubling
// to MaxReconnectDelay, each wait in [d/2, d]; ConnectOptions sets it,
// with no reconnect buffer and no end to the reconnects.
func TestReconnectDelay(t *testing.T) {
	for _, attempts := range []int{-1, 0, 1} {
		if d := ReconnectDelay(attempts); d != 0 {
			t.Fatalf("ReconnectDelay(%d) = %v, want 0: the first attempt after a cut is at once", attempts, d)
		}
	}
	ceiling := MinReconnectDelay
	for attempts := 2; attempts <= 100; attempts++ {
		lo, hi := time.Duration(1<<62), time.Duration(0)
		for range 200 {
			d := ReconnectDelay(attempts)
			lo, hi = min(lo, d), max(hi, d)
		}
		if lo < ceiling/2 || hi > ceiling {
			t.Fatalf("ReconnectDelay(%d) drew from [%v, %v], want within [%v, %v]", attempts, lo, hi, ceiling/2, ceiling)
		}
		if attempts < 5 && lo == hi {
			t.Fatalf("ReconnectDelay(%d) drew %v 200 times: no jitter", attempts, lo)
		}
		ceiling = min(2*ceiling, MaxReconnectDelay)
	}
	if ceiling != MaxReconnectDelay {
		t.Fatalf("the waits stop growing at %v, want the cap %v", ceiling, MaxReconnectDelay)
	}

	var o nats.Options
	for _, opt := range ConnectOptions() {
		if err := opt(&o); err != nil {
			t.Fatal(err)
		}
	}
	if o.ReconnectBufSize != -1 || o.MaxReconnect != -1 || o.CustomReconnectDelayCB == nil || o.CustomReconnectDelayCB(1) != 0 {
		t.Fatalf("ConnectOptions: ReconnectBufSize %d, MaxReconnect %d, first reconnect delay set %v; want -1, -1 and ReconnectDelay",
			o.ReconnectBufSize, o.MaxReconnect, o.CustomReconnectDelayCB != nil)
	}
}

// A kick (the server cuts the replica's connection and stays up) with a
// slow first reconnect, as the daemon had: every call
// made while the connection reconnects (publishes, a resume, a stream of
// a new session, Info, Signal, Delete) waits for the reconnect and
// succeeds; the ids go on contiguous, and the streams open on both
// replicas get each event once.
func TestKickCallsWaitForTheReconnect(t *testing.T) {
	srv := startServer(t)
	// Longer than the daemon's old 250 ms and jitter, so that the calls
	// surely start inside it.
	const firstDelay = 500 * time.Millisecond
	js := connectWith(t, srv.URL(), append(ConnectOptions(),
		nats.CustomReconnectDelay(func(int) time.Duration { return firstDelay }))...)
	a := newReplicaOn(t, js, "A", testOptions())
	b := newReplica(t, srv.URL(), "B", testOptions())
	lb := b.open(t, "s", nil, "")
	for range 3 {
		a.publish(t, "s", "e", nil)
	}
	wantIDs(t, lb.Events(3, wait), 1, 3)
	la := a.open(t, "s", map[string]string{"Last-Event-ID": "3", "Event-Epoch": lb.Epoch}, "")
	if f := la.Next(wait); f.Event != eventbus.TypeReplayComplete {
		t.Fatalf("want replay_complete, got %+v", f)
	}

	st := watchStatus(t, a.bp.nc)
	kicked := kick(t, srv, a.bp.nc)
	st.Wait(nats.RECONNECTING)
	if a.bp.nc.IsConnected() {
		t.Fatalf("A reconnected before the calls, within %v; its first reconnect waits %v", time.Since(kicked), firstDelay)
	}
	ctx := context.Background()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		took []time.Duration
		ids  []uint64
	)
	call := func(what string, f func() error) {
		wg.Go(func() {
			start := time.Now()
			err := f()
			mu.Lock()
			defer mu.Unlock()
			took = append(took, time.Since(start))
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", what, err))
			}
		})
	}
	call("publish", func() error {
		for range 3 {
			id, _, err := a.bp.Publish(ctx, "s", eventbus.Event{Type: "e"})
			if err != nil {
				return err
			}
			mu.Lock()
			ids = append(ids, id)
			mu.Unlock()
		}
		return nil
	})
	call("resume", func() error { return resumeFrom(ctx, a.bp, "s", lb.Epoch, 1, 3) })
	call("a new session's stream", func() error {
		sub, err := a.bp.Subscribe(ctx, "new", eventbus.SubscribeOptions{})
		if err == nil {
			sub.Close()
		}
		return err
	})
	call("info", func() error {
		in, err := a.bp.Info(ctx, "s")
		if err == nil && (in.Epoch != lb.Epoch || in.LastEventID < 3) {
			err = fmt.Errorf("%+v", in)
		}
		return err
	})
	call("signal", func() error { return a.bp.Signal(ctx, "s", "changed", "doc") })
	call("delete", func() error { return a.bp.Delete(ctx, "gone") })
	wg.Wait()
	back := st.Wait(nats.CONNECTED)
	t.Logf("A back %v after the kick; the calls took %v", back.Sub(kicked), took)
	if len(errs) > 0 {
		t.Fatalf("calls while the connection reconnected failed: %v", errs)
	}
	if fmt.Sprint(ids) != "[4 5 6]" {
		t.Fatalf("the publishes got ids %v, want [4 5 6]", ids)
	}
	for _, s := range []*sse{la, lb} {
		// The signal comes among the events, in no set order.
		var events []backplanetest.Frame
		signals := 0
		for len(events) < 3 || signals < 1 {
			switch f := s.Next(wait); {
			case f.ID != 0:
				events = append(events, f)
			case f.Event == "changed":
				signals++
			default:
				t.Fatalf("unexpected frame %+v", f)
			}
		}
		wantIDs(t, events, 4, 6)
	}
	b.publish(t, "s", "e", nil)
	for _, s := range []*sse{la, lb} {
		wantIDs(t, s.Events(1, wait), 7, 7)
	}
}

// With ConnectOptions the replica is back a round trip after a kick: eight
// kicks, each followed at once by reads (Info, a resume) and, once the
// client has noticed the cut, a publish; none fails, and the streams open
// on both replicas get every id once, in order.
func TestKickReconnectsAtOnce(t *testing.T) {
	const rounds = 8
	srv := startServer(t)
	a := newReplicaOn(t, connectWith(t, srv.URL(), ConnectOptions()...), "A", testOptions())
	b := newReplica(t, srv.URL(), "B", testOptions())
	la, lb := a.open(t, "s", nil, ""), b.open(t, "s", nil, "")
	a.publish(t, "s", "e", nil)
	for _, s := range []*sse{la, lb} {
		wantIDs(t, s.Events(1, wait), 1, 1)
	}
	ctx := context.Background()
	var gaps []time.Duration
	for round := range rounds {
		st := watchStatus(t, a.bp.nc)
		kicked := kick(t, srv, a.bp.nc)
		testLogger.Debug("DEBUG kick", "round", round)
		// Reads are sent again when the cut catches them under way.
		if in, err := a.bp.Info(ctx, "s"); err != nil || in.LastEventID != uint64(round+1) {
			t.Fatalf("round %d: Info right after the kick: %+v, %v", round, in, err)
		}
		if err := resumeFrom(ctx, a.bp, "s", la.Epoch, 0, uint64(round+1)); err != nil {
			t.Fatalf("round %d: resume right after the kick: %v", round, err)
		}
		// A publish written before the client noticed the cut would be
		// lost with the connection (outcome unknown, never sent again):
		// publish once it has.
		st.Wait(nats.RECONNECTING)
		id, _, err := a.bp.Publish(ctx, "s", eventbus.Event{Type: "e"})
		if err != nil || id != uint64(round+2) {
			t.Fatalf("round %d: publish after the kick: id %d, %v; want %d", round, id, err, round+2)
		}
		gaps = append(gaps, st.Wait(nats.CONNECTED).Sub(kicked))
	}
	t.Logf("A back after each kick in %v", gaps)
	for _, g := range gaps {
		if g >= 250*time.Millisecond { // the daemon's old first reconnect waited 250 ms and more
			t.Errorf("A came back %v after a kick, want a round trip", g)
		}
	}
	for _, s := range []*sse{la, lb} {
		wantIDs(t, s.Events(rounds, wait), 2, rounds+1)
		s.Quiet(50 * time.Millisecond)
	}
}

// A read that a cut interrupts under way (held by a proxy, then the
// connection reset) is sent again on the next connection: it answers
// long before its timeout.
func TestReadCutUnderWayIsSentAgain(t *testing.T) {
	srv := startServer(t)
	p := startStall(t, srv.URL()[len("nats://"):])
	opts := testOptions()
	a := newReplicaOn(t, connectWith(t, p.Addr, ConnectOptions()...), "A", opts)
	a.publish(t, "s", "e", nil)
	a.publish(t, "s", "e", nil)

	p.Hold()
	parked := p.parked.Load()
	type answer struct {
		in   Info
		err  error
		took time.Duration
	}
	done := make(chan answer, 1)
	go func() {
		start := time.Now()
		in, err := a.bp.Info(context.Background(), "s")
		done <- answer{in, err, time.Since(start)}
	}()
	waitFor(t, wait, "the read to reach the proxy", func() bool { return p.parked.Load() > parked })
	p.Cut()
	r := <-done
	if r.err != nil || r.in.LastEventID != 2 || r.in.FirstEventID != 1 {
		t.Fatalf("Info cut under way: %+v, %v", r.in, r.err)
	}
	if r.took > opts.PublishTimeout/2 {
		t.Fatalf("Info cut under way took %v: waited for its timeout %v instead of being sent again", r.took, opts.PublishTimeout)
	}
	t.Logf("Info cut under way answered in %v", r.took)
}

// A publish that a cut interrupts under way is never sent again by the
// backplane: it ends as ErrOutcomeUnknown at PublishTimeout, and (the
// proxy dropped it) nothing was appended.
func TestPublishCutUnderWayIsNotSentAgain(t *testing.T) {
	srv := startServer(t)
	p := startStall(t, srv.URL()[len("nats://"):])
	opts := testOptions()
	opts.PublishTimeout = 500 * time.Millisecond
	a := newReplicaOn(t, connectWith(t, p.Addr, ConnectOptions()...), "A", opts)
	a.publish(t, "s", "e", nil)

	p.Hold()
	parked := p.parked.Load()
	done := make(chan error, 1)
	go func() {
		_, _, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
		done <- err
	}()
	waitFor(t, wait, "the publish to reach the proxy", func() bool { return p.parked.Load() > parked })
	p.Cut()
	if err := <-done; !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("a publish cut under way: %v, want ErrOutcomeUnknown", err)
	}
	var in Info
	waitFor(t, wait, "Info once reconnected", func() bool {
		var err error
		in, err = a.bp.Info(context.Background(), "s")
		return err == nil
	})
	if in.LastEventID != 1 {
		t.Fatalf("the log's last id is %d after the cut publish: it was sent again", in.LastEventID)
	}
	if id := a.publish(t, "s", "e", nil); id != 2 {
		t.Fatalf("the next publish got id %d, want 2", id)
	}
}

// A connection that does not come back: a call waits for it at most a
// second after the cut (reconnectGrace), not all of PublishTimeout, and
// fails with ErrUnavailable alone (nothing sent); calls after that fail
// at once.
func TestReconnectWaitIsBounded(t *testing.T) {
	srv := startServer(t)
	opts := testOptions() // PublishTimeout 5s
	js := connectWith(t, srv.URL(), append(ConnectOptions(),
		nats.CustomReconnectDelay(func(int) time.Duration { return time.Minute }))...)
	a := newReplicaOn(t, js, "A", opts)
	a.publish(t, "s", "e", nil)
	st := watchStatus(t, a.bp.nc)
	kicked := kick(t, srv, a.bp.nc)
	st.Wait(nats.RECONNECTING)
	_, _, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
	took := time.Since(kicked)
	if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("publish while the connection stays away: %v, want ErrUnavailable alone", err)
	}
	if took < reconnectGrace-50*time.Millisecond || took > reconnectGrace+time.Second {
		t.Fatalf("publish failed %v after the cut, want about %v (PublishTimeout %v)", took, reconnectGrace, opts.PublishTimeout)
	}
	start := time.Now()
	_, err = a.bp.Subscribe(context.Background(), "other", eventbus.SubscribeOptions{})
	if !errors.Is(err, ErrUnavailable) || time.Since(start) > 200*time.Millisecond {
		t.Fatalf("a new stream past the grace: %v after %v, want ErrUnavailable at once", err, time.Since(start))
	}
}

// kick cuts nc's connection at the server, which stays up, and returns
// when.
func kick(t *testing.T, srv *natsServer, nc *nats.Conn) time.Time {
	t.Helper()
	cid, err := nc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	if err := srv.Server().DisconnectClientByID(cid); err != nil {
		t.Fatal(err)
	}
	return at
}

// statusWatch records the status changes of a connection as they come.
type statusWatch struct {
	t  *testing.T
	ch chan stamped
}

type stamped struct {
	st nats.Status
	at time.Time
}

// watchStatus follows nc's status changes from now until the test ends.
func watchStatus(t *testing.T, nc *nats.Conn) *statusWatch {
	events := nc.StatusChanged(nats.CONNECTED, nats.RECONNECTING)
	w := &statusWatch{t: t, ch: make(chan stamped, 64)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for st := range events {
			select {
			case w.ch <- stamped{st, time.Now()}:
			default: // a test that has all it wants
			}
		}
	}()
	t.Cleanup(func() {
		nc.RemoveStatusListener(events)
		<-done
	})
	return w
}

// Wait returns when the connection next took status st, waiting for it
// (the changes before it are skipped).
func (w *statusWatch) Wait(st nats.Status) time.Time {
	w.t.Helper()
	deadline := time.After(wait)
	for {
		select {
		case e := <-w.ch:
			if e.st == st {
				return e.at
			}
		case <-deadline:
			w.t.Fatalf("the connection did not become %v within %v", st, wait)
		}
	}
}

// resumeFrom resumes session on bp from id after of epoch and reads the
// events up to id upto, which must follow one another.
func resumeFrom(ctx context.Context, bp *Backplane, session, epoch string, after, upto uint64) error {
	sub, err := bp.Subscribe(ctx, session, eventbus.SubscribeOptions{Resume: true, LastEventID: after, Epoch: epoch})
	if err != nil {
		return err
	}
	stop := time.AfterFunc(wait, sub.Close) // ends the loop should an event not come
	defer stop.Stop()
	want := after + 1
	for f := range sub.Events() {
		switch {
		case f.ID() == 0:
			if f.Terminal() {
				return fmt.Errorf("the resume ended: %s", f.JSON())
			}
		case f.ID() != want:
			return fmt.Errorf("the resume got id %d, want %d", f.ID(), want)
		default:
			want++
		}
		if want > upto {
			return nil
		}
	}
	return fmt.Errorf("the resume ended after id %d, want up to %d: %v", want-1, upto, sub.Err())
}
