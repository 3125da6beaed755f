package eventbus

import (
	"context"
	"errors"
)

// HubPublisher is a Hub with the write side of a backplane, methods that
// take a context: a Publisher (PublishHandler), a Deleter (DeleteHandler)
// and a Signaler (SignalHandler), so that a daemon's routes are the same
// on a Hub and on a backplane. Hub.Publisher returns one. The contexts are
// not used: a Hub never waits (docs/SPEC.md section 7). Its methods are
// safe for concurrent use and never block beyond the Hub's own locks.
type HubPublisher struct{ hub *Hub }

// Publisher returns h as a Publisher, Deleter and Signaler.
func (h *Hub) Publisher() *HubPublisher { return &HubPublisher{hub: h} }

// maxEventBytes is the hub's Bus.MaxEventBytes (with its default), for
// PublishHandler's default MaxBodyBytes.
func (p *HubPublisher) maxEventBytes() int { return p.hub.enc.maxEventBytes }

// Publish is Hub.Publish, returning the event's id and its bus's epoch.
func (p *HubPublisher) Publish(_ context.Context, session string, e Event) (id uint64, epoch string, err error) {
	f, b, err := p.hub.publish(session, e)
	if err != nil {
		return 0, "", err
	}
	return f.ID(), b.Epoch(), nil
}

// PublishIdempotent is Hub.PublishIdempotent.
func (p *HubPublisher) PublishIdempotent(_ context.Context, session, key string, e Event) (id uint64, epoch string, duplicate bool, err error) {
	return p.hub.PublishIdempotent(session, key, e)
}

// Delete is Hub.Delete: it closes the session's bus (its subscribers get
// what is queued, then their end) and forgets it. An unknown session is
// no error (a delete is idempotent); an id CheckSessionID refuses is its
// error.
func (p *HubPublisher) Delete(_ context.Context, session string) error {
	if err := CheckSessionID(session); err != nil {
		return err
	}
	p.hub.Delete(session)
	return nil
}

// Signal sends a change signal to the subscribers of the session's live
// bus (EventBus.Signal), without creating the session: a session that
// does not exist has no subscriber to tell, and the signal, valid, is no
// error. It returns CheckSessionID's error, an error wrapping
// ErrInvalidEvent or ErrEventTooLarge for a signal the bus would refuse
// (Encoder.CheckSignal), whether or not the session exists, and ErrClosed
// after the hub's Shutdown or Close.
func (p *HubPublisher) Signal(_ context.Context, session, typ, about string) error {
	if err := CheckSessionID(session); err != nil {
		return err
	}
	if p.hub.closed.Load() {
		return ErrClosed
	}
	if b, ok := p.hub.lookup(session); ok {
		if err := b.Signal(typ, about); !errors.Is(err, ErrClosed) {
			return err
		}
	}
	return p.hub.enc.CheckSignal(typ, about)
}
