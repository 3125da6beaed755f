package natsbus

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
)

// session is this replica's mirror of one session: a mirror bus fed by a
// consumer of the session's subject. The mirror set (b.set) opens
// it with engine.Open on the first lookup.
type session struct {
	backplane.Session
	b    *Backplane
	subj string
	// heard is when the reader last heard from JetStream (Unix
	// nanoseconds): a message, or an answer to its epoch check.
	heard atomic.Int64
}

// engine is the JetStream half of the mirror set (backplane.Engine).
type engine struct{ b *Backplane }

func (g engine) New(id string) *session { return &session{b: g.b, subj: g.b.subject(id)} }

// Open reads the session's epoch and last id from the subject's last
// message; a session without one (new, or deleted) gets a marker with a
// new epoch, appended only if the subject is still as read (one replica
// wins; the others read its marker).
//
// The Start's Cursor is the stream sequence of that message: the reader
// starts after it.
func (g engine) Open(ctx context.Context, s *session) (backplane.Start, error) {
	b := g.b
	for {
		h, err := b.head(ctx, s.subj)
		if err != nil {
			return backplane.Start{}, err
		}
		if h.epoch != "" {
			return backplane.Start{Epoch: h.epoch, Last: h.id, Cursor: h.seq}, nil
		}
		epoch := eventbus.NewEpoch()
		// The marker is sent again after a cut under it (link.read): its
		// condition lets at most one of the sends append, and a send that
		// finds the first one appended conflicts and reads it as the head.
		var ack *jetstream.PubAck
		err = b.link.read(ctx, func(ctx context.Context) (err error) {
			ack, err = b.js.PublishMsg(ctx, newMsg(s.subj, epoch, 0, nil), jetstream.WithExpectLastSequencePerSubject(h.seq))
			return err
		})
		if err == nil {
			return backplane.Start{Epoch: epoch, Cursor: ack.Sequence}, nil
		}
		ae := apiError(err)
		if ae == nil || !conflict(ae) {
			return backplane.Start{}, err
		}
		if err := pause(ctx, ae); err != nil {
			return backplane.Start{}, err
		}
	}
}

func (g engine) Run(ctx context.Context, s *session, from backplane.Start) { s.run(ctx, from) }

func (g engine) Epoch(ctx context.Context, s *session) (string, error) {
	h, err := g.b.head(ctx, s.subj)
	return h.epoch, err
}

// The pulls of a reader.
const (
	// pullHeartbeat is the idle heartbeat of a reader's pulls: a reader
	// whose consumer is gone (its server died) notices within two.
	pullHeartbeat = time.Second
	pullExpiry    = 5 * time.Second
	// consumerInactive is how long the server keeps a reader's consumer
	// once nobody pulls from it (a replica that died, a released mirror).
	consumerInactive = 10 * time.Second
)

// run is the session's reader: a consumer from the stream sequence after
// Open's (the pump, its own goroutine) feeds the mirror, while this
// goroutine checks the session's epoch whenever the pump has been quiet
// for CheckInterval: a different epoch (a tombstone the pump
// missed, a lost stream) releases the mirror, and no answer from JetStream
// for OutageTimeout (pump and checks alike) ends it with a terminal
// stream_error (outage). run returns when ctx ends, after the pump.
func (s *session) run(ctx context.Context, from backplane.Start) {
	b := s.b
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.pump(pctx, from.Cursor, from.Last)
	}()
	defer func() {
		cancel()
		<-done
	}()
	s.heard.Store(time.Now().UnixNano())
	failing := false
	var lastErr error
	t := time.NewTimer(b.opts.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			return // the pump released the session
		case <-t.C:
		}
		s.hook(ctx)
		heard := time.Unix(0, s.heard.Load())
		if quiet := time.Since(heard); quiet < b.opts.CheckInterval {
			t.Reset(b.opts.CheckInterval - quiet) // the pump hears from JetStream
			continue
		}
		left := time.Until(heard.Add(b.opts.OutageTimeout))
		if left <= 0 {
			b.set.Outage(s, heard, lastErr)
			return
		}
		cctx, ccancel := context.WithTimeout(ctx, min(b.opts.PublishTimeout, left))
		h, err := b.head(cctx, s.subj)
		ccancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			lastErr = err
			if !failing {
				failing = true
				b.log.Warn("natsbus: reader cannot reach jetstream; retrying", "session", s.ID, "error", err)
			}
			t.Reset(min(b.opts.CheckInterval, max(time.Until(heard.Add(b.opts.OutageTimeout)), 0)))
			continue
		case h.epoch != s.Epoch:
			b.set.Expire(s, "epoch changed: the session was deleted or the stream lost")
			return
		}
		if failing {
			failing = false
			b.log.Info("natsbus: reader reaches jetstream again", "session", s.ID)
		}
		s.heard.Store(time.Now().UnixNano())
		t.Reset(b.opts.CheckInterval)
	}
}

// pump feeds the mirror from an ephemeral consumer of the session's
// subject (in memory, one replica, no acks), from the stream sequence
// after Open's, until ctx ends or the session is released (a tombstone,
// or a message of another epoch). It makes a new consumer from the
// sequence after the last message it fed whenever the one it reads may
// have lost a message: at once after a gap in the consumer's delivery
// sequence and after a cut of the connection (what was on its way on the
// old connection is lost, and without a later message no gap would show
// it), with backoff after a lost heartbeat (the consumer's server is
// gone) or a failure. A consumer it leaves goes after consumerInactive.
// seq is the stream sequence of the last message the mirror has (or Open
// read), last its id.
func (s *session) pump(ctx context.Context, seq, last uint64) {
	b := s.b
	var backoff backplane.Backoff
	failing := false
	fail := func(err error) bool {
		if ctx.Err() != nil {
			return false
		}
		if !failing {
			failing = true
			b.log.Warn("natsbus: reader lost its consumer; retrying with backoff", "session", s.ID, "error", err)
		}
		return backoff.Sleep(ctx, 0)
	}
	for ctx.Err() == nil {
		it, cut, err := s.consume(ctx, seq+1)
		if err == nil {
			err = s.feed(ctx, it, cut, &seq, &last, func() {
				backoff.Reset()
				if failing {
					failing = false
					b.log.Info("natsbus: reader reconnected", "session", s.ID, "lastEventId", last)
				}
			})
			it.Stop()
		}
		switch {
		case errors.Is(err, errReleased):
			return
		case err == nil || errors.Is(err, errGap):
			// A new consumer at once: after a cut, consume waits for the
			// reconnect.
			after := "a cut"
			if err != nil {
				after = "a gap"
			}
			b.log.Debug("natsbus: reader makes a new consumer", "session", s.ID, "lastEventId", last, "after", after)
		case !fail(err):
			return
		}
	}
}

var (
	// errReleased ends a reader: ctx ended, or the session was released.
	errReleased = errors.New("natsbus: the reader's session was released")
	// errGap: the consumer skipped a delivery (lost on its way).
	errGap = errors.New("natsbus: a gap in the consumer's deliveries")
)

// consume makes a consumer of the session's subject from stream sequence
// from and starts pulling from it; cut is done once the connection it
// pulls on is lost. It waits for a reconnect (link) within PublishTimeout.
func (s *session) consume(ctx context.Context, from uint64) (it jetstream.MessagesContext, cut context.Context, err error) {
	b := s.b
	ctx, cancel := context.WithTimeout(ctx, b.opts.PublishTimeout)
	defer cancel()
	var cons jetstream.Consumer
	// Made again after a cut under way: the first, if it was made,
	// goes unused after consumerInactive.
	err = b.link.read(ctx, func(ctx context.Context) (err error) {
		cons, err = b.js.CreateConsumer(ctx, b.opts.Stream, jetstream.ConsumerConfig{
			FilterSubject:     s.subj,
			DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
			OptStartSeq:       from,
			AckPolicy:         jetstream.AckNonePolicy,
			InactiveThreshold: consumerInactive,
			Replicas:          1,
			MemoryStorage:     true,
		})
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	// The connection the pulls go out on: a cut before them reads as
	// one under them, which costs a new consumer and loses nothing.
	if cut, err = b.link.conn(ctx); err != nil {
		return nil, nil, err
	}
	it, err = cons.Messages(jetstream.PullMaxMessages(b.opts.ReadCount), jetstream.PullExpiry(pullExpiry),
		jetstream.PullHeartbeat(pullHeartbeat), jetstream.WithMessagesErrOnMissingHeartbeat(true))
	return it, cut, err
}

// feed appends what it reads from it to the mirror, advancing seq and
// last, and calls onMessage at each message. It returns nil when cut is
// done (the connection was lost: a new consumer is needed), errGap at a
// gap in the deliveries, errReleased when ctx ends or the session is
// released, and Next's error otherwise.
func (s *session) feed(ctx context.Context, it jetstream.MessagesContext, cut context.Context, seq, last *uint64, onMessage func()) error {
	b := s.b
	// Next ends with ctx or the connection; the caller stops it (Next's
	// goroutine, so no pull outlives the Stop).
	nctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(cut, cancel)()
	var delivered uint64 // the consumer's delivery sequence of the last message
	for {
		msg, err := it.Next(jetstream.NextContext(nctx))
		switch {
		case ctx.Err() != nil:
			return errReleased
		case cut.Err() != nil:
			return nil
		case err != nil:
			return err
		}
		// The test hook holds the reader with what it got, before it
		// feeds anything of it.
		s.hook(ctx)
		if ctx.Err() != nil {
			return errReleased
		}
		md, err := msg.Metadata()
		if err != nil {
			continue
		}
		if md.Sequence.Consumer != delivered+1 {
			return errGap
		}
		delivered = md.Sequence.Consumer
		s.heard.Store(time.Now().UnixNano())
		onMessage()
		m, err := parseMsg(md.Sequence.Stream, msg.Subject(), msg.Headers(), msg.Data(), true)
		if err != nil {
			// Skipped: the next event is a gap, which resyncs.
			b.log.Error("natsbus: malformed message", "session", s.ID, "seq", md.Sequence.Stream, "error", err)
			*seq = md.Sequence.Stream
			continue
		}
		if m.deleted || m.epoch != s.Epoch {
			b.set.Expire(s, "the session was deleted or has a new epoch")
			return errReleased
		}
		*seq = m.seq
		if m.id == 0 {
			continue // the epoch's marker
		}
		if err := backplane.Append(s.Bus, backplane.LogEntry{ID: m.id, Type: m.typ, JSON: m.env}); err != nil {
			if errors.Is(err, eventbus.ErrClosed) {
				return errReleased
			}
			b.log.Error("natsbus: message refused by the mirror", "session", s.ID, "id", m.id, "error", err)
		}
		*last = m.id
	}
}

// hook runs the test hook, if any.
func (s *session) hook(ctx context.Context) {
	if h := s.b.readHook.Load(); h != nil {
		(*h)(ctx, s.ID)
	}
}

// Head implements backplane.Log: the session's epoch and last id, from the
// subject's last message ("" and 0 when it has none).
func (s *session) Head(ctx context.Context) (epoch string, last uint64, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.b.opts.PublishTimeout)
	defer cancel()
	h, err := s.b.head(ctx, s.subj)
	return h.epoch, h.id, err
}

// historyBatch is the most messages one direct get of a resume reads.
const historyBatch = 1000

// ReadHistory implements backplane.Log: the mirror's epoch's events in
// req's range, and the first id the subject holds. It finds the stream
// sequence of the first event wanted (locate), then reads forward with
// batched direct gets; a batch that a lagging replica of the stream
// answers short is completed from the stream's leader. With req.MaxBytes
// it stops after the first entry past it (the replay stops there anyway),
// so a resume from far back does not read the whole ring.
func (s *session) ReadHistory(ctx context.Context, req backplane.HistoryRequest) ([]backplane.LogEntry, uint64, error) {
	if req.Upto <= req.After {
		return nil, 0, nil
	}
	b := s.b
	ctx, cancel := context.WithTimeout(ctx, b.opts.PublishTimeout)
	defer cancel()
	start, first, err := s.locate(ctx, req.After+1)
	switch {
	case err != nil:
		return nil, 0, err
	case first == 0:
		return nil, 0, fmt.Errorf("natsbus: session %q holds no events of epoch %s: deleted or replaced", s.ID, s.Epoch)
	case start.id == 0 || start.id > req.Upto:
		return nil, first, nil // trimmed past the range, or nothing after it
	}
	var out []backplane.LogEntry
	spent := 0
	want := start.id // the next id to take
	// take adds m; it reports whether the read is complete.
	take := func(m logMsg) (bool, error) {
		switch {
		case m.deleted || m.id > 0 && m.epoch != s.Epoch:
			return false, errEpochGone
		case m.id == 0 || m.id < want:
			return false, nil
		case m.id > want:
			return false, fmt.Errorf("natsbus: session %q: id %d follows %d in the stream", s.ID, m.id, want-1)
		}
		out = append(out, backplane.LogEntry{ID: m.id, Type: m.typ, JSON: m.env})
		spent += len(m.env)
		want++
		return want > req.Upto || req.MaxBytes > 0 && len(out) > 1 && spent > req.MaxBytes, nil
	}
	if done, err := take(start); err != nil || done {
		return out, first, err
	}
	seq := start.seq + 1
	for {
		msgs, _, err := b.directBatch(ctx, s.subj, seq, int(min(req.Upto-want+1, historyBatch)))
		if err != nil && ctx.Err() != nil {
			return nil, 0, err
		}
		if err != nil || len(msgs) == 0 {
			// No answer, or a replica that lags: the leader has it.
			m, ok, lerr := b.nextEvent(ctx, s.subj, s.Epoch, seq)
			if lerr != nil {
				return nil, 0, lerr
			}
			if !ok {
				return nil, 0, fmt.Errorf("natsbus: session %q: the stream ends at id %d, want %d", s.ID, want-1, req.Upto)
			}
			msgs = []logMsg{m}
		}
		for _, m := range msgs {
			done, err := take(m)
			if err != nil {
				return nil, 0, err
			}
			if done {
				return out, first, nil
			}
			seq = m.seq + 1
		}
	}
}

// locate returns the first event of the mirror's epoch with an id of at
// least target (start; zero when there is none), and the first id the
// subject holds (0: none). Ids grow by one along the subject, but other
// subjects' messages lie between them in the stream's sequence, so it
// searches: interpolation between two known events, alternating with
// bisection to bound the worst case, each probe one read of the first
// event at or after a sequence (from the stream's leader).
func (s *session) locate(ctx context.Context, target uint64) (start logMsg, first uint64, err error) {
	b := s.b
	f, ok, err := b.firstEvent(ctx, s.subj, s.Epoch)
	if err != nil || !ok {
		return logMsg{}, 0, err
	}
	if f.id >= target {
		return f, f.id, nil
	}
	h, err := b.head(ctx, s.subj)
	switch {
	case err != nil:
		return logMsg{}, 0, err
	case h.epoch != s.Epoch:
		return logMsg{}, 0, errEpochGone
	case h.id < target:
		return logMsg{}, f.id, nil
	}
	// The target's sequence is in (loSeq, hiSeq]; loID < target <= hiID.
	loSeq, loID := f.seq, f.id
	hiSeq, hiID := h.seq, h.id
	for i := 0; ; i++ {
		span := hiSeq - loSeq
		step := span/2 + 1
		if i%2 == 0 {
			step = uint64(float64(span) * float64(target-loID) / float64(hiID-loID))
		}
		g := loSeq + min(max(step, 1), span)
		m, ok, err := b.nextEvent(ctx, s.subj, s.Epoch, g)
		switch {
		case err != nil:
			return logMsg{}, 0, err
		case !ok:
			return logMsg{}, 0, fmt.Errorf("natsbus: session %q: no event at or after sequence %d", s.ID, g)
		case m.id == target:
			return m, f.id, nil
		case m.id < target:
			loSeq, loID = m.seq, m.id
		default:
			hiSeq, hiID = g-1, m.id-1
		}
		if hiSeq <= loSeq {
			return logMsg{}, 0, fmt.Errorf("natsbus: session %q: id %d not found between its neighbours", s.ID, target)
		}
	}
}
