package redisbus

import (
	"context"
	"encoding/json"
	"errors"
	"net"

	"github.com/redis/go-redis/v9"
	"github.com/ssebus/eventbus/backplane"
)

// signalMsg is a signal on the backplane's Redis Pub/Sub channel.
type signalMsg struct {
	Session string `json:"s"`
	Type    string `json:"t"`
	About   string `json:"a"`
}

func (b *Backplane) signalChannel() string { return b.opts.KeyPrefix + "signals" }

// Signal sends a change signal (docs/SPEC.md section 3.8: a type and the
// resource it is about, no id, no data) to the subscribers of session on every
// replica, through Redis Pub/Sub. Each replica that mirrors the session
// delivers it with eventbus.EventBus.Signal: never stored, never replayed,
// coalesced in subscriber queues as on a single bus. Replicas without local
// subscribers of the session ignore it.
//
// Signals are best effort, as on a single bus: a replica whose connection
// to Redis is being re-established misses them, and a signal may reach a
// replica before events published ahead of it (a client refetches the
// resource anyway). Signal returns within PublishTimeout: an error wrapping
// eventbus.ErrInvalidEvent or eventbus.ErrEventTooLarge for a signal the bus
// would refuse, ErrUnavailable when Redis fails, eventbus.ErrClosed after
// Close.
func (b *Backplane) Signal(ctx context.Context, session, typ, about string) error {
	if err := b.set.PrepareSignal(session, typ, about); err != nil {
		return err
	}
	payload, err := json.Marshal(signalMsg{session, typ, about})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, b.opts.PublishTimeout)
	defer cancel()
	if err := b.client.Publish(ctx, b.signalChannel(), payload).Err(); err != nil {
		return unavailable("signal", session, err)
	}
	return nil
}

// receiveSignals delivers the backplane's signals to the local mirrors
// until Close (which closes the subscription, ending a blocked receive).
func (b *Backplane) receiveSignals() {
	var backoff backplane.Backoff
	for b.set.Context().Err() == nil {
		msg, err := b.signals.ReceiveTimeout(b.set.Context(), b.opts.ReadBlock)
		if err != nil {
			var ne net.Error
			if b.set.Context().Err() != nil || errors.As(err, &ne) && ne.Timeout() {
				continue // closing, or quiet
			}
			// go-redis reconnects and subscribes again on the next receive.
			backoff.Sleep(b.set.Context(), 0)
			continue
		}
		backoff.Reset()
		m, ok := msg.(*redis.Message)
		if !ok {
			continue // subscription confirmations, pongs
		}
		var sig signalMsg
		if json.Unmarshal([]byte(m.Payload), &sig) != nil {
			continue
		}
		b.set.DeliverSignal(sig.Session, sig.Type, sig.About)
	}
}
