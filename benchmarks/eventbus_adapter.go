package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"

	"github.com/ssebus/eventbus"
)

// (5) eventbus itself: bus.Publish and subscribers that drain with
// AppendReady, waiting on Ready only when nothing was ready.

func init() {
	libraries = append(libraries,
		library{name: "eventbus", new: func(c config) fanout { return &eventbusFanout{cfg: c} }},
		library{name: "eventbus resync", new: func(c config) fanout {
			return &eventbusFanout{cfg: c, policy: eventbus.OverflowResync}
		}},
		library{name: "eventbus catchup", new: func(c config) fanout {
			return &eventbusFanout{cfg: c, policy: eventbus.OverflowCatchUp}
		}},
	)
}

// benchData is boxed once so the harness does not add a slice-to-interface
// allocation per Publish.
var benchData any = json.RawMessage(benchPayload)

// busOptions: room for every subscriber of the largest run, per-subscription
// frame cap from -queue (eventbus allows up to 2048), the ring from -ring,
// everything else default,
// diagnostics discarded (evictions and warnings are counted from the frames).
func busOptions(cfg config, policy eventbus.OverflowPolicy) eventbus.Options {
	return eventbus.Options{
		MaxSubscribers: 1 << 16,
		MaxQueued:      cfg.queue,
		RingSize:       cfg.ring,
		OverflowPolicy: policy,
		Logger:         slog.New(slog.DiscardHandler),
	}
}

// eventbusFanout is eventbus with the overflow policy policy (0: the
// default, OverflowEvict).
type eventbusFanout struct {
	cfg    config
	policy eventbus.OverflowPolicy
	bus    *eventbus.EventBus
	subs   []*eventbus.Subscription
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (f *eventbusFanout) start(sinks []*sink) error {
	bus, err := eventbus.New(busOptions(f.cfg, f.policy))
	if err != nil {
		return err
	}
	f.bus = bus
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	var running sync.WaitGroup
	for _, s := range sinks {
		sub, err := bus.Subscribe(ctx, eventbus.SubscribeOptions{})
		if err != nil {
			running.Wait()
			return err
		}
		f.subs = append(f.subs, sub)
		runSink(&f.wg, &running, s, func() { drainEventbus(sub, s) })
	}
	running.Wait()
	return nil
}

// drainEventbus is the subscriber loop: take every ready frame, check ids,
// wait only when nothing was ready.
func drainEventbus(sub *eventbus.Subscription, s *sink) {
	buf := make([]eventbus.Frame, 0, 256)
	evicted := false
	for {
		var open bool
		buf, open = sub.AppendReady(buf[:0])
		for _, fr := range buf {
			if fr.Synthetic() {
				switch fr.Type() {
				case eventbus.TypeSlowClientWarning:
					s.warnings++
				case eventbus.TypeClientEvicted:
					evicted = true
				}
				continue
			}
			s.see(fr.ID())
		}
		if !open {
			break
		}
		if len(buf) == 0 {
			<-sub.Ready()
		}
	}
	switch {
	case evicted || errors.Is(sub.Err(), eventbus.ErrEvicted):
		s.end("evicted")
	default:
		s.end("closed")
	}
}

func (f *eventbusFanout) publish(uint64) error {
	_, err := f.bus.Publish(eventbus.Event{Type: "bench", Data: benchData})
	return err
}

func (f *eventbusFanout) stop() {
	_ = f.bus.Close() // drains: subscribers get what is queued, then the end
	f.wg.Wait()
	f.cancel()
}
