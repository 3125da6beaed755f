package natsbus

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/ssebus/eventbus"
)

// publisher is this replica's publish state of one session: a lock, so
// that the replica has one publish of the session in flight at a time
// (JetStream accepts one per subject and expected sequence anyway: two
// would only conflict), and the subject's last message as the last
// publish left it, so that a replica publishing alone needs one round trip
// per event.
type publisher struct {
	sem  chan struct{} // held by the publishing call
	refs int           // guarded by Backplane.pubMu
	// Guarded by sem.
	known bool // h is the subject's head as far as this replica knows
	h     head
}

// maxIdlePublishers is how many publishers without a call in flight the
// backplane keeps (their known heads save a read on the next publish).
const maxIdlePublishers = 4096

// acquire returns session's publisher, locked, waiting at most until ctx
// ends.
func (b *Backplane) acquire(ctx context.Context, session string) (*publisher, error) {
	b.pubMu.Lock()
	p := b.pubs[session]
	if p == nil {
		p = &publisher{sem: make(chan struct{}, 1)}
		b.pubs[session] = p
	}
	p.refs++
	b.pubMu.Unlock()
	select {
	case p.sem <- struct{}{}:
		return p, nil
	case <-ctx.Done():
		b.release(session, p, false)
		return nil, ctx.Err()
	}
}

// release unlocks p (when locked) and forgets it when nobody uses it and
// too many are kept.
func (b *Backplane) release(session string, p *publisher, locked bool) {
	if locked {
		<-p.sem
	}
	b.pubMu.Lock()
	p.refs--
	if p.refs == 0 && len(b.pubs) > maxIdlePublishers {
		delete(b.pubs, session)
	}
	b.pubMu.Unlock()
}

// newMsg is a message of a session's subject (see stream.go); body is the
// event's "<type>\n<envelope>", nil for a marker.
func newMsg(subj, epoch string, id uint64, body []byte) *nats.Msg {
	m := &nats.Msg{Subject: subj, Header: nats.Header{}, Data: body}
	m.Header.Set(hdrEpoch, epoch)
	m.Header.Set(hdrID, strconv.FormatUint(id, 10))
	return m
}

// conflict reports whether ae is a refused expected last subject sequence:
// another publish got there first (or is in process, on a clustered
// stream), or a duplicate message id is in process.
func conflict(ae *jetstream.APIError) bool {
	switch ae.ErrorCode {
	case codeWrongLastSeq, codeWrongLastSeqBusy, codeDuplicateInProcess:
		return true
	}
	return false
}

// pause waits before a retry after the conflict ae: not at all when
// another publish got there first (read its result and go on), a moment
// when one is still in process (a clustered stream replicates it first).
func pause(ctx context.Context, ae *jetstream.APIError) error {
	if ae.ErrorCode == codeWrongLastSeq {
		return nil
	}
	t := time.NewTimer(time.Millisecond + rand.N(time.Millisecond))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Publish appends e to session's log and returns its id and the session's
// epoch. The event reaches the subscribers of every replica through their
// readers (this replica's too), in id order.
//
// Publish never panics and returns within PublishTimeout (see the package
// documentation for the connection setting this needs). Its errors:
// ErrOutcomeUnknown (which also matches ErrUnavailable) when the publish
// was sent but not answered: the event may or may not have been appended,
// and only PublishIdempotent can retry that safely; ErrUnavailable alone
// when JetStream could not be reached or refused the publish: nothing was
// appended; eventbus.ErrInvalidEvent or eventbus.ErrEventTooLarge for an
// event the bus would refuse (no id is used); ErrInvalidSession; and
// eventbus.ErrClosed after Close.
func (b *Backplane) Publish(ctx context.Context, session string, e eventbus.Event) (id uint64, epoch string, err error) {
	id, epoch, _, err = b.publish(ctx, session, "", e)
	return id, epoch, err
}

// PublishIdempotent is Publish with an idempotency key, so that a publish
// whose outcome is unknown can be retried safely: within IdempotencyWindow
// of the first publish with key in session (and in the same epoch), a
// publish with the same key and the same event (the same
// backplane.Encoder.Fingerprint: type, data, _meta but serverTimestamp,
// originatorClientId) appends nothing and returns the first publish's id
// with duplicate true; the same key with a different event is an error
// wrapping eventbus.ErrIdempotencyKeyReused. JetStream's deduplication
// does the check and the append in one step (the message id is the epoch
// and a hash of the session and the key): concurrent publishes with one
// key, on any replicas, append once. The window counts from the first
// publish on the server's clock; a duplicate does not extend it. Delete
// and a new epoch forget every key.
//
// The first publish's id is read from its message in the stream. When
// that message has been trimmed since (more than RingSize later events in
// the session within the window), the id cannot be told: the retry then
// fails with an error wrapping eventbus.ErrIdempotencyKeyReused that says
// so, and appends nothing (the event is in the log once already).
//
// A key is checked by eventbus.CheckIdempotencyKey (else an error wrapping
// eventbus.ErrInvalidIdempotencyKey; nothing is sent). The other errors
// are Publish's: after ErrOutcomeUnknown, retry with the same key.
func (b *Backplane) PublishIdempotent(ctx context.Context, session, key string, e eventbus.Event) (id uint64, epoch string, duplicate bool, err error) {
	if err := eventbus.CheckIdempotencyKey(key); err != nil {
		return 0, "", false, err
	}
	return b.publish(ctx, session, key, e)
}

// publish is Publish and PublishIdempotent; key "" is none.
func (b *Backplane) publish(ctx context.Context, session, key string, e eventbus.Event) (uint64, string, bool, error) {
	pub, err := b.set.Prepare(ctx, session, key, e)
	if err != nil {
		return 0, "", false, err
	}
	ev, fp := pub.Event, pub.Fingerprint
	var keyHash string
	if key != "" {
		sum := sha256.Sum256([]byte(session + "\x00" + key))
		keyHash = hex.EncodeToString(sum[:16])
	}
	ctx, cancel := context.WithTimeout(ctx, b.opts.PublishTimeout)
	defer cancel()
	p, err := b.acquire(ctx, session)
	if err != nil {
		return 0, "", false, unavailable("publish to", session, err) // nothing sent
	}
	defer b.release(session, p, true)
	subj := b.subject(session)
	for {
		if !p.known {
			h, err := b.head(ctx, subj)
			if err != nil {
				return 0, "", false, unavailable("publish to", session, err) // nothing sent
			}
			p.h, p.known = h, true
		}
		epoch, id := p.h.epoch, p.h.id+1
		if epoch == "" {
			epoch, id = eventbus.NewEpoch(), 1 // the session's first event, or the first after a Delete
		}
		env := ev.Envelope(id)
		if len(env) > b.bus.MaxEvent {
			return 0, "", false, fmt.Errorf("%w: %d bytes encoded with id %d, MaxEventBytes is %d",
				eventbus.ErrEventTooLarge, len(env), id, b.bus.MaxEvent)
		}
		body := make([]byte, 0, len(ev.Type)+1+len(env))
		body = append(append(append(body, ev.Type...), '\n'), env...)
		msg := newMsg(subj, epoch, id, body)
		opts := []jetstream.PublishOpt{jetstream.WithExpectLastSequencePerSubject(p.h.seq)}
		if key != "" {
			msg.Header.Set(hdrFp, fp)
			opts = append(opts, jetstream.WithMsgID(epoch+":"+keyHash))
		}
		// Sent at most once: again only when nats.go refused to send it
		// for a reconnect (link.send), never after a cut under it.
		var ack *jetstream.PubAck
		err := b.link.send(ctx, func() (err error) {
			ack, err = b.js.PublishMsg(ctx, msg, opts...)
			return err
		})
		if err == nil && !ack.Duplicate {
			p.h = head{seq: ack.Sequence, epoch: epoch, id: id}
			pub.Appended(epoch)
			return id, epoch, false, nil
		}
		p.known = false // a duplicate, or an error: the head is not ours
		if err == nil {
			id, err := b.duplicate(ctx, session, ack.Sequence, epoch, fp)
			return id, epoch, err == nil, err
		}
		if ae := apiError(err); ae != nil && conflict(ae) {
			if err := pause(ctx, ae); err != nil {
				return 0, "", false, unavailable("publish to", session, err) // every attempt was refused
			}
			continue
		}
		return 0, "", false, b.publishError(session, err)
	}
}

// duplicate answers a keyed publish JetStream found a duplicate of: the id
// of the first publish (stream sequence seq), or ErrIdempotencyKeyReused
// when that was another event (or can no longer be read).
func (b *Backplane) duplicate(ctx context.Context, session string, seq uint64, epoch, fp string) (uint64, error) {
	m, err := b.getMsg(ctx, msgGetRequest{Seq: seq}, false)
	switch {
	case errors.Is(err, errNotFound):
		return 0, fmt.Errorf("%w: session %q: the key's first publish (stream sequence %d) is in the log once, but has been trimmed since: its id can no longer be told",
			eventbus.ErrIdempotencyKeyReused, session, seq)
	case err != nil:
		// The publish was answered (a duplicate): nothing was appended.
		return 0, unavailable("read the first publish of a key in", session, err)
	case m.subject != b.subject(session) || m.epoch != epoch || m.id == 0:
		return 0, fmt.Errorf("natsbus: session %q: the duplicate's first publish %d is not an event of this session", session, seq)
	case m.fp != fp:
		return 0, fmt.Errorf("%w: session %q, the key's first publish has id %d", eventbus.ErrIdempotencyKeyReused, session, m.id)
	}
	return m.id, nil
}

// publishError classifies a publish's failure. An answer from JetStream is
// definite (an API error: nothing was stored), and so is a failure before
// the message left (no responders means no stream took it; a closed
// connection, or one that reconnects without buffering; no connection
// came back in time). Everything else (a timeout, a connection lost after
// the write) may have been applied: the outcome is unknown.
func (b *Backplane) publishError(session string, err error) error {
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		return fmt.Errorf("%w: %v", eventbus.ErrEventTooLarge, err)
	case apiError(err) != nil, notSent(err):
		return unavailable("publish to", session, fmt.Errorf("%v (not appended)", err))
	}
	return fmt.Errorf("%w (%w): publish to session %q: %v: the event may or may not have been appended",
		ErrOutcomeUnknown, ErrUnavailable, session, err)
}

// notSent reports whether err says the message never reached a server that
// could store it.
func notSent(err error) bool {
	return errors.Is(err, errNoConnection) || errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrReconnectBufExceeded) ||
		errors.Is(err, nats.ErrInvalidConnection) || errors.Is(err, nats.ErrConnectionDraining)
}
