package backplane

import (
	"context"
	"fmt"
	"time"

	"github.com/ssebus/eventbus"
)

// Publish is a publish the Set has checked and encoded (Prepare), for the
// engine to append to the session's log.
type Publish[S Member] struct {
	// Session is the session's id, checked by Config.Valid and
	// eventbus.CheckSessionID.
	Session string
	// Key is the idempotency key ("" for none: a plain Publish).
	Key string
	// Event is the event as the log stores it: Event.Envelope(id) is its
	// JSON with the id the log assigns, Event.Type its type.
	Event EncodedEvent
	// Fingerprint is the event's identity under Key
	// (Encoder.Fingerprint: type, data, _meta but serverTimestamp,
	// originatorClientId), "" without a key: a keyed
	// publish whose key the log already holds with another fingerprint
	// fails with eventbus.ErrIdempotencyKeyReused.
	Fingerprint string

	set   *Set[S]
	local S // this replica's ready mirror of Session before the append
}

// Prepare is what every backplane's Publish and PublishIdempotent do
// before they ask the engine: it checks the session (Config.Valid, then
// eventbus.CheckSessionID) and that the Set is open (else eventbus.ErrClosed), encodes e (an error
// wrapping eventbus.ErrInvalidEvent or eventbus.ErrEventTooLarge uses no
// id), fingerprints it when key is not "" (check the key first with
// eventbus.CheckIdempotencyKey: Prepare takes "" for no key), and fails
// with Config.Unavailable when ctx is already done (nothing was sent). It
// notes this replica's mirror of the session as it is before the append,
// for Appended.
func (t *Set[S]) Prepare(ctx context.Context, session, key string, e eventbus.Event) (Publish[S], error) {
	if err := t.valid(session); err != nil {
		return Publish[S]{}, err
	}
	if t.Closed() {
		return Publish[S]{}, eventbus.ErrClosed
	}
	ev, err := t.cfg.Bus.Encoder.Encode(e)
	if err != nil {
		return Publish[S]{}, err
	}
	p := Publish[S]{Session: session, Key: key, Event: ev, set: t}
	if key != "" {
		if p.Fingerprint, err = t.cfg.Bus.Encoder.Fingerprint(e); err != nil {
			return Publish[S]{}, err
		}
	}
	if err := ctx.Err(); err != nil {
		return Publish[S]{}, t.cfg.Unavailable("publish to", session, err)
	}
	// Its epoch was read from the engine earlier: if the append reports
	// another one, the mirror's is the stale one (Appended).
	p.local = t.Ready(session)
	return p, nil
}

// Appended tells the Set that the engine appended the publish (or found
// its key) in epoch: a mirror this replica held of another epoch (the log
// was deleted or lost, and its reader has not noticed yet) is released at
// once, so that no stream stays on it.
func (p Publish[S]) Appended(epoch string) {
	var zero S
	if p.local != zero && p.local.Mirror().Epoch != epoch {
		p.set.Expire(p.local, "publish found a new epoch")
	}
}

// PrepareSignal is what every backplane's Signal does before it sends the
// signal to the other replicas: it checks the session (Config.Valid, then
// eventbus.CheckSessionID),
// that the Set is open (else eventbus.ErrClosed), and the signal as the
// bus would (Encoder.CheckSignal: an error wrapping
// eventbus.ErrInvalidEvent or eventbus.ErrEventTooLarge).
func (t *Set[S]) PrepareSignal(session, typ, about string) error {
	if err := t.valid(session); err != nil {
		return err
	}
	if t.Closed() {
		return eventbus.ErrClosed
	}
	return t.cfg.Bus.Encoder.CheckSignal(typ, about)
}

// DeliverSignal delivers a signal that reached this replica to the
// subscribers of its mirror of session (eventbus.EventBus.Signal: never
// stored, coalesced in their queues); without a ready mirror it does
// nothing. It does not block.
func (t *Set[S]) DeliverSignal(session, typ, about string) {
	var zero S
	if s := t.Ready(session); s != zero {
		_ = s.Mirror().Bus.Signal(typ, about) // the bus logs what it refuses
	}
}

// Deleted releases this replica's mirror of session after the engine
// forgot it (a backplane's Delete): its streams end, and the next lookup
// opens the session's new epoch. The other replicas release theirs when
// their readers notice, or when a new stream's epoch check does.
func (t *Set[S]) Deleted(session string) {
	var zero S
	if s := t.Get(session); s != zero {
		// Known deleted: its streams end with stream_error closed (a plain
		// Close), and clients drop the session.
		t.release(s, "deleted", "", "")
	}
}

// Outage ends s because its reader has not reached the engine since
// since, past Config.OutageTimeout (err is the last failure): s leaves
// the set first (a new stream then asks the engine again, and is refused
// while it is unreachable), then every stream of the mirror gets what it
// had queued and a terminal stream_error of errorKind "unavailable", so
// that its client reconnects with backoff and resumes from its cursor.
// Run returns after it.
func (t *Set[S]) Outage(s S, since time.Time, err error) {
	t.Remove(s)
	m := s.Mirror()
	down := time.Since(since).Round(time.Millisecond)
	t.cfg.Bus.Log.Warn(t.cfg.Name+": "+t.cfg.Engine+" unreachable past OutageTimeout; the session's streams end",
		"session", m.ID, "epoch", m.Epoch, "down", down, "outageTimeout", t.cfg.OutageTimeout, "error", err)
	t.Stop(s, eventbus.ErrorKindUnavailable, fmt.Sprintf(
		"%s: %s unreachable for %v; reconnect with backoff and resume from the last event id", t.cfg.Name, t.cfg.Engine, down))
}
