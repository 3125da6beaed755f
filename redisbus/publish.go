package redisbus

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
)

var (
	// ErrOutcomeUnknown is wrapped (together with ErrUnavailable) by the
	// error of a publish that was sent to Redis but not answered within
	// PublishTimeout, or whose connection broke before the answer: the
	// event may or may not have been appended. PublishIdempotent again with
	// the same key applies it at most once; a retry of Publish may append
	// it twice.
	ErrOutcomeUnknown = backplane.OutcomeUnknownError("redisbus: publish outcome unknown")
)

// Publish appends e to session's log and returns its id and the session's
// epoch. The event reaches the subscribers of every replica through their
// readers (this replica's too), in id order.
//
// Publish never panics and returns within PublishTimeout (see the package
// documentation for the client setting this needs). Its errors:
// ErrOutcomeUnknown (which also matches ErrUnavailable) when the script
// was sent but not answered: the event may or may not have been appended,
// and only PublishIdempotent can retry that safely; ErrUnavailable alone
// when Redis could not be reached or refused the script: nothing was
// appended; eventbus.ErrInvalidEvent or eventbus.ErrEventTooLarge for an
// event the bus would refuse (no id is used); ErrInvalidSession; and
// eventbus.ErrClosed after Close.
func (b *Backplane) Publish(ctx context.Context, session string, e eventbus.Event) (id uint64, epoch string, err error) {
	id, epoch, _, err = b.publish(ctx, session, "", e)
	return id, epoch, err
}

// PublishIdempotent is Publish with an idempotency key, so that a publish
// whose outcome is unknown can be retried safely. Within IdempotencyWindow
// of the first publish with key in session (and in the same epoch), a
// publish with the same key and the same event appends nothing and
// returns the first publish's id with duplicate true; one with the same
// key and a different event returns an error wrapping
// eventbus.ErrIdempotencyKeyReused. The event's identity is its type, data, _meta
// (but serverTimestamp) and originatorClientId as encoded: the time the
// retry is stamped with does not make it a different event. The check and
// the append are one Lua script: two concurrent publishes with one key
// append once.
//
// The window counts from the first publish on Redis's clock; a duplicate
// does not extend it. A new epoch (Delete, a lost stream) forgets every
// key: the log the key's event went to is gone.
//
// A key is 1 to eventbus.MaxIdempotencyKeyBytes bytes of printable ASCII (else an
// error wrapping eventbus.ErrInvalidIdempotencyKey). The other errors are
// Publish's.
func (b *Backplane) PublishIdempotent(ctx context.Context, session, key string, e eventbus.Event) (id uint64, epoch string, duplicate bool, err error) {
	if err := eventbus.CheckIdempotencyKey(key); err != nil {
		return 0, "", false, err
	}
	return b.publish(ctx, session, key, e)
}

// publish is Publish and PublishIdempotent; key "" is none.
func (b *Backplane) publish(ctx context.Context, session, key string, e eventbus.Event) (id uint64, epoch string, duplicate bool, err error) {
	p, err := b.set.Prepare(ctx, session, key, e)
	if err != nil {
		return 0, "", false, err
	}
	ctx, cancel := context.WithTimeout(ctx, b.opts.PublishTimeout)
	defer cancel()
	res, err := runOnce(ctx, b.client, publishScript, publishSrc, b.keys(session),
		eventbus.NewEpoch(), p.Event.Type, p.Event.Tail, b.bus.MaxLen, b.bus.MaxBytes, b.bus.MaxEvent, b.opts.KeyTTL.Milliseconds(),
		key, p.Fingerprint, b.opts.IdempotencyWindow.Milliseconds()).StringSlice()
	if err != nil {
		return 0, "", false, b.publishError(session, err)
	}
	if len(res) != 3 {
		return 0, "", false, unknownOutcome(session, fmt.Errorf("unexpected reply %q", res))
	}
	id, err = strconv.ParseUint(res[0], 10, 64)
	if err != nil {
		return 0, "", false, unknownOutcome(session, fmt.Errorf("unexpected id %q", res[0]))
	}
	epoch, duplicate = res[1], res[2] == "1"
	p.Appended(epoch)
	return id, epoch, duplicate, nil
}

// publishError classifies the error of the publish script. A reply from
// Redis is definite: the script's own refusals, or a Redis error (BUSY,
// OOM, LOADING ...) before it ran. A failure before the script was written
// (no connection) is definite too. Everything else happened after the
// write, or cannot be told apart from that: the outcome is unknown.
func (b *Backplane) publishError(session string, err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		switch {
		case strings.HasPrefix(msg, "TOOLARGE "):
			return fmt.Errorf("%w: %s bytes encoded, MaxEventBytes is %d",
				eventbus.ErrEventTooLarge, strings.TrimPrefix(msg, "TOOLARGE "), b.bus.MaxEvent)
		case strings.HasPrefix(msg, "KEYREUSED "):
			return fmt.Errorf("%w: session %q, the key's first publish has id %s",
				eventbus.ErrIdempotencyKeyReused, session, strings.TrimPrefix(msg, "KEYREUSED "))
		}
		return unavailable("publish to", session, fmt.Errorf("%v (not appended)", err))
	}
	if notSent(err) {
		return unavailable("publish to", session, fmt.Errorf("%v (not appended)", err))
	}
	return unknownOutcome(session, err)
}

// notSent reports whether err says the command never reached Redis: no
// connection could be made or taken from the pool, or the client is
// closed.
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" ||
		errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) || errors.Is(err, redis.ErrClosed)
}

func unknownOutcome(session string, err error) error {
	return fmt.Errorf("%w (%w): publish to session %q: %v: the event may or may not have been appended",
		ErrOutcomeUnknown, ErrUnavailable, session, err)
}

// noRetry runs a command at most once: go-redis sends a command again
// after some errors that follow its write (a connection reset, EOF), and a
// publish script that had run would then append its event twice.
type noRetry struct{ *redis.Cmd }

func (noRetry) NoRetry() bool { return true }

// runOnce runs script (whose source is src) with EVALSHA, or with EVAL when
// Redis does not have it cached (a NOSCRIPT answer means it did not run),
// each sent at most once.
func runOnce(ctx context.Context, c redis.UniversalClient, script *redis.Script, src string, keys []string, args ...any) *redis.Cmd {
	cmd := evalCmd(ctx, "evalsha", script.Hash(), keys, args)
	_ = c.Process(ctx, noRetry{cmd})
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd = evalCmd(ctx, "eval", src, keys, args)
		_ = c.Process(ctx, noRetry{cmd})
	}
	return cmd
}

func evalCmd(ctx context.Context, name, payload string, keys []string, args []any) *redis.Cmd {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, name, payload, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	cmd := redis.NewCmd(ctx, append(a, args...)...)
	cmd.SetFirstKeyPos(3)
	return cmd
}
