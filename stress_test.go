package eventbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestStressPublishSubscribeResumeCancelEvict runs several publishers while
// subscribers join, resume with their last id, cancel (context, Close,
// breaking out of the loop) and get evicted (small MaxQueued, slow readers)
// at random, and checks every subscription's frame sequence:
//
//   - event ids strictly increase and are contiguous, except right after a
//     state_resync_required frame;
//   - a resumed subscription gets exactly the ids after its cursor (or a
//     ring_evicted resync naming where they start again), then
//     replay_complete whose data matches what was replayed;
//   - a live-only subscription starts at an id published after it began
//     subscribing and no later than the first one after Subscribe returned;
//   - a warning names the event right before it;
//   - an evicted subscription is a contiguous run, then client_evicted
//     naming the next id, then the end.
//
// It runs for about 2 s (0.3 s with -short). The sleeps only pace the
// publishers and make slow readers slow; no check depends on timing.
func TestStressPublishSubscribeResumeCancelEvict(t *testing.T) {
	dur := 2 * time.Second
	if testing.Short() {
		dur = 300 * time.Millisecond
	}
	b := newBus(t, Options{
		RingSize:          512,
		MaxQueuedBytes:    24 << 10,
		MaxSubscribers:    10,
		ReplayBudgetBytes: 48 << 10,
	})

	stop := make(chan struct{})
	var pubs sync.WaitGroup
	for p := range 4 {
		pubs.Go(func() {
			r := rand.New(rand.NewPCG(uint64(p), 42))
			for {
				select {
				case <-stop:
					return
				default:
				}
				size := r.IntN(300)
				if r.IntN(100) == 0 {
					size = 6000 // now and then a big one, for the byte caps
				}
				if _, err := b.Publish(Event{Type: "t", Data: strings.Repeat("x", size)}); err != nil {
					t.Errorf("publish: %v", err)
					return
				}
				if r.IntN(3) == 0 {
					time.Sleep(time.Duration(r.IntN(200)) * time.Microsecond)
				}
			}
		})
	}

	var st stressStats
	deadline := time.Now().Add(dur)
	var workers sync.WaitGroup
	for w := range 12 {
		workers.Go(func() { stressWorker(t, b, uint64(w), deadline, &st) })
	}
	workers.Wait()
	close(stop)
	pubs.Wait()

	t.Logf("published %d; sessions %d (resumed %d), frames %d; evicted %d, cancelled %d, limit hits %d; resyncs: ring_evicted %d, budget %d; warnings %d",
		b.LastEventID(), st.sessions.Load(), st.resumed.Load(), st.frames.Load(), st.evicted.Load(), st.cancelled.Load(),
		st.limited.Load(), st.ringEvicted.Load(), st.budget.Load(), st.warnings.Load())
	if b.SubscriberCount() != 0 {
		t.Errorf("%d subscribers left after every session ended", b.SubscriberCount())
	}
	if !testing.Short() && !t.Failed() {
		// The mix must have happened, or the test checks nothing.
		for name, n := range map[string]int64{
			"evictions": st.evicted.Load(), "cancellations": st.cancelled.Load(), "resumes": st.resumed.Load(),
		} {
			if n == 0 {
				t.Errorf("no %s in %v", name, dur)
			}
		}
	}
}

type stressStats struct {
	sessions, resumed, frames, evicted, cancelled, limited atomic.Int64
	ringEvicted, budget, warnings                          atomic.Int64
}

// stressWorker is one client: it subscribes again and again until the
// deadline, resuming from the last id it received most of the time.
func stressWorker(t *testing.T, b *EventBus, seed uint64, deadline time.Time, st *stressStats) {
	r := rand.New(rand.NewPCG(seed, 7))
	var cursor uint64
	haveCursor := false
	for time.Now().Before(deadline) {
		opts := SubscribeOptions{MaxQueued: 16 + r.IntN(64)}
		if haveCursor && r.IntN(4) != 0 {
			opts.Resume, opts.LastEventID, opts.Epoch = true, cursor, b.Epoch()
		}
		ctx, cancel := context.WithCancel(context.Background())
		lo := b.LastEventID()
		s, err := b.Subscribe(ctx, opts)
		hi := b.LastEventID()
		if errors.Is(err, ErrSubscriberLimitExceeded) {
			cancel()
			st.limited.Add(1)
			time.Sleep(100 * time.Microsecond)
			continue
		}
		if err != nil {
			cancel()
			t.Errorf("subscribe: %v", err)
			return
		}
		st.sessions.Add(1)
		if opts.Resume {
			st.resumed.Add(1)
		}

		c := &stressCheck{opts: opts, lo: lo, hi: hi}
		if opts.Resume {
			c.expect = opts.LastEventID + 1
		}
		slow := r.IntN(3) == 0
		limit := 1 + r.IntN(400) // frames to read before cancelling
		how := r.IntN(4)
		cancelled := false
		cancelNow := func() {
			cancelled = true
			switch how {
			case 0:
				cancel() // the context: ends asynchronously, frames may still come
			case 1:
				s.Close()
			case 2:
				go s.Close() // from another goroutine
			}
		}

		if r.IntN(2) == 0 {
			n := 0
			for f := range s.Events() {
				if err := c.frame(f); err != nil {
					t.Errorf("session %+v: %v\n%s", opts, err, c.history())
					cancel()
					return
				}
				n++
				if slow {
					time.Sleep(time.Duration(100+r.IntN(400)) * time.Microsecond)
				}
				if (n >= limit || time.Now().After(deadline)) && !cancelled {
					if how == 3 {
						cancelled = true
						break // breaking out closes the subscription
					}
					cancelNow()
				}
			}
		} else {
			var buf []Frame
			for open := true; open; {
				<-s.Ready()
				buf, open = s.AppendReady(buf[:0])
				for _, f := range buf {
					if err := c.frame(f); err != nil {
						t.Errorf("session %+v: %v\n%s", opts, err, c.history())
						cancel()
						return
					}
				}
				if slow {
					time.Sleep(time.Duration(200+r.IntN(800)) * time.Microsecond)
				}
				if (c.n >= limit || time.Now().After(deadline)) && !cancelled && open {
					if how == 3 {
						how = 1
					}
					cancelNow()
				}
			}
		}
		cancel()

		evicted := errors.Is(s.Err(), ErrEvicted)
		switch {
		case c.terminal && !evicted:
			t.Errorf("session %+v: client_evicted frame but Err() = %v", opts, s.Err())
		case !cancelled && !c.terminal:
			t.Errorf("session %+v ended without cancellation or client_evicted, Err() = %v\n%s", opts, s.Err(), c.history())
		case !cancelled && !evicted:
			t.Errorf("session %+v: Err() = %v, want ErrEvicted", opts, s.Err())
		case cancelled && !evicted && !errors.Is(s.Err(), context.Canceled):
			t.Errorf("session %+v: cancelled, Err() = %v", opts, s.Err())
		}
		if evicted {
			st.evicted.Add(1)
		} else {
			st.cancelled.Add(1)
		}
		st.frames.Add(int64(c.n))
		st.ringEvicted.Add(int64(c.ringEvicted))
		st.budget.Add(int64(c.budget))
		st.warnings.Add(int64(c.warnings))
		if c.last > 0 {
			cursor, haveCursor = c.last, true
		}
		if t.Failed() {
			return
		}
	}
}

// stressCheck validates one subscription's frames as they arrive.
type stressCheck struct {
	opts   SubscribeOptions
	lo, hi uint64 // LastEventID before and after Subscribe

	n, events   int
	last        uint64 // last event id received
	expect      uint64 // the next event id, 0 when any larger one is fine
	replayed    int
	replayDone  bool
	terminal    bool
	ringEvicted int
	budget      int
	warnings    int
	recent      []string
}

func (c *stressCheck) history() string { return strings.Join(c.recent, "\n") }

func (c *stressCheck) frame(f Frame) error {
	c.n++
	c.recent = append(c.recent, string(f.JSON()))
	if len(c.recent) > 8 {
		c.recent = c.recent[1:]
	}
	if c.terminal {
		return fmt.Errorf("frame %q after the terminal frame", f.Type())
	}
	if !f.Synthetic() {
		return c.event(f)
	}
	var d struct {
		Reason              string  `json:"reason"`
		LastDeliveredID     uint64  `json:"lastDeliveredId"`
		EarliestAvailableID uint64  `json:"earliestAvailableId"`
		ReplayedCount       *int    `json:"replayedCount"`
		LastEventID         uint64  `json:"lastEventId"`
		DroppedAfter        uint64  `json:"droppedAfter"`
		Epoch               *string `json:"epoch"`
	}
	var env struct {
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(f.JSON(), &env); err != nil {
		return err
	}
	if err := json.Unmarshal(env.Data, &d); err != nil {
		return err
	}
	switch f.Type() {
	case TypeStateResyncRequired:
		if !c.opts.Resume || c.replayDone {
			return errors.New("state_resync_required outside a resume's replay")
		}
		switch d.Reason {
		case ReasonRingEvicted:
			if c.n != 1 || d.LastDeliveredID != c.opts.LastEventID || d.EarliestAvailableID <= c.opts.LastEventID+1 {
				return fmt.Errorf("bad ring_evicted resync (frame %d): %s", c.n, env.Data)
			}
			c.expect = d.EarliestAvailableID
			c.ringEvicted++
		case ReasonReplayBudgetExceeded:
			if c.replayed == 0 || d.LastDeliveredID != c.last || d.EarliestAvailableID != c.last+1 {
				return fmt.Errorf("bad replay_budget_exceeded resync after %d: %s", c.last, env.Data)
			}
			c.expect = 0 // the live stream resumes later
			c.budget++
		default:
			return fmt.Errorf("unexpected resync: %s", env.Data)
		}
	case TypeReplayComplete:
		if !c.opts.Resume || c.replayDone {
			return errors.New("unexpected replay_complete")
		}
		c.replayDone = true
		if d.ReplayedCount == nil || *d.ReplayedCount != c.replayed {
			return fmt.Errorf("replay_complete %s after %d replayed frames", env.Data, c.replayed)
		}
		if c.replayed > 0 && d.LastEventID != c.last {
			return fmt.Errorf("replay_complete %s, last replayed %d", env.Data, c.last)
		}
	case TypeSlowClientWarning:
		if c.events == 0 || d.LastEventID != c.last {
			return fmt.Errorf("warning %s right after event %d", env.Data, c.last)
		}
		c.warnings++
	case TypeClientEvicted:
		if c.last == 0 || d.DroppedAfter != c.last+1 {
			return fmt.Errorf("client_evicted %s after event %d", env.Data, c.last)
		}
		c.terminal = true
	default:
		return fmt.Errorf("unexpected synthetic frame %q", f.Type())
	}
	return nil
}

func (c *stressCheck) event(f Frame) error {
	id := f.ID()
	if want := `{"id":` + strconv.FormatUint(id, 10) + `,`; !strings.HasPrefix(string(f.JSON()), want) {
		return fmt.Errorf("frame id %d, envelope %.40s", id, f.JSON())
	}
	if id <= c.last {
		return fmt.Errorf("id %d after %d", id, c.last)
	}
	if c.expect != 0 && id != c.expect {
		return fmt.Errorf("id %d, want %d", id, c.expect)
	}
	if c.events == 0 && !c.opts.Resume && (id <= c.lo || id > c.hi+1) {
		return fmt.Errorf("live-only subscription began at %d, LastEventID was %d before Subscribe and %d after", id, c.lo, c.hi)
	}
	if c.opts.Resume && !c.replayDone {
		c.replayed++
	}
	c.events++
	c.last = id
	c.expect = id + 1
	return nil
}

// TestStressCheckRejectsBadSequences makes sure the stress checker is not
// vacuous: it catches a gap, a duplicate, a wrong replay start and a frame
// after the terminal one.
func TestStressCheckRejectsBadSequences(t *testing.T) {
	ev := func(id uint64) Frame { return coreQueueFrameJSON(id) }
	c := queueCounts{maxQueued: 16}
	for name, tc := range map[string]struct {
		c      *stressCheck
		frames []Frame
	}{
		"gap":            {&stressCheck{lo: 0, hi: 0}, []Frame{ev(1), ev(3)}},
		"duplicate":      {&stressCheck{lo: 0, hi: 0}, []Frame{ev(1), ev(1)}},
		"late live":      {&stressCheck{lo: 0, hi: 3}, []Frame{ev(5)}},
		"replay start":   {&stressCheck{opts: SubscribeOptions{Resume: true, LastEventID: 3}, expect: 4}, []Frame{ev(5)}},
		"replay count":   {&stressCheck{opts: SubscribeOptions{Resume: true, LastEventID: 3}, expect: 4}, []Frame{ev(4), replayCompleteFrame(2, 4, "E", 1)}},
		"after terminal": {&stressCheck{}, []Frame{ev(1), evictedFrame(ReasonQueueOverflow, 2, c, -1, 1), ev(2)}},
		"wrong dropped":  {&stressCheck{}, []Frame{ev(1), evictedFrame(ReasonQueueOverflow, 5, c, -1, 1)}},
		"warning":        {&stressCheck{}, []Frame{ev(1), ev(2), warningFrame(c, 1, "frames", 1)}},
	} {
		var err error
		for _, f := range tc.frames {
			if err = tc.c.frame(f); err != nil {
				break
			}
		}
		if err == nil {
			t.Errorf("%s: not detected", name)
		}
	}
}

// coreQueueFrameJSON is an event frame with a real envelope prefix.
func coreQueueFrameJSON(id uint64) Frame {
	j := `{"id":` + strconv.FormatUint(id, 10) + `,"v":1,"type":"t"}`
	wire := "data: " + j + "\n\n"
	return Frame{&frame{wire: []byte(wire), json: 6, kind: kindEvent, id: id, typ: "t"}}
}
