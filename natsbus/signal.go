package natsbus

import (
	"context"
	"encoding/json"
	"strings"
)

// signalMsg is the payload of a signal on "<Subject>.sig.<token>": the
// session is the subject's token, so any id survives.
type signalMsg struct {
	Type  string `json:"t"`
	About string `json:"a"`
}

// Signal sends a change signal (docs/SPEC.md section 3.8: a type and the
// resource it is about, no id, no data) to the subscribers of session on every
// replica, as a core NATS publish (not stored in the stream). Each replica
// that mirrors the session delivers it with eventbus.EventBus.Signal: never
// stored, never replayed, coalesced in subscriber queues as on a single bus.
// Replicas without a mirror of the session ignore it.
//
// Signals are best effort, as on a single bus: a replica whose connection
// is reconnecting misses them, a signal sent again after a cut of this
// replica's connection may arrive twice, and a signal may reach a replica
// before events published ahead of it (a client refetches the resource
// anyway).
// Signal returns within PublishTimeout, once the server has the signal (a
// flush): an error wrapping eventbus.ErrInvalidEvent or
// eventbus.ErrEventTooLarge for a signal the bus would refuse,
// ErrUnavailable when NATS cannot be reached, eventbus.ErrClosed after
// Close.
func (b *Backplane) Signal(ctx context.Context, session, typ, about string) error {
	if err := b.set.PrepareSignal(session, typ, about); err != nil {
		return err
	}
	payload, err := json.Marshal(signalMsg{typ, about})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, b.opts.PublishTimeout)
	defer cancel()
	// Sent again after a cut under it (link.read): a signal names what to
	// refetch, so one delivered twice costs a refetch at most.
	err = b.link.read(ctx, func(ctx context.Context) error {
		if err := b.nc.Publish(b.opts.Subject+".sig."+token(session), payload); err != nil {
			return err
		}
		return b.nc.FlushWithContext(ctx)
	})
	if err != nil {
		return unavailable("signal", session, err)
	}
	return nil
}

// receiveSignals delivers the backplane's signals to the local mirrors
// until Close.
func (b *Backplane) receiveSignals() {
	prefix := b.opts.Subject + ".sig."
	for {
		select {
		case <-b.set.Context().Done():
			return
		case m := <-b.signalMsgs:
			id, ok := untoken(strings.TrimPrefix(m.Subject, prefix))
			if !ok {
				continue
			}
			var sig signalMsg
			if json.Unmarshal(m.Data, &sig) != nil {
				continue
			}
			b.set.DeliverSignal(id, sig.Type, sig.About)
		}
	}
}
