package pgbus

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ssebus/eventbus"
)

// signalMsg is a signal on the backplane's signal channel. The session is
// hex, as in the events channel, so that any id survives JSON.
type signalMsg struct {
	Session string `json:"s"`
	Type    string `json:"t"`
	About   string `json:"a"`
}

// maxNotifyPayload is PostgreSQL's limit on a NOTIFY payload (8000 bytes,
// less the terminating byte).
const maxNotifyPayload = 7999

// Signal sends a change signal (docs/SPEC.md section 3.8: a type and the
// resource it is about, no id, no data) to the subscribers of session on every
// replica, with a NOTIFY on the backplane's signal channel. Each replica that
// mirrors the session delivers it with eventbus.EventBus.Signal: never stored,
// never replayed, coalesced in subscriber queues as on a single bus. Replicas
// without a mirror of the session ignore it.
//
// Signals are best effort, as on a single bus: a replica whose listener
// is reconnecting misses them, and a signal may reach a replica before
// events published ahead of it (a client refetches the resource anyway).
// Signal returns within PublishTimeout: an error wrapping
// eventbus.ErrInvalidEvent for a signal the bus would refuse,
// eventbus.ErrEventTooLarge for one the bus would refuse or whose
// notification is above PostgreSQL's 8000-byte payload limit (hex session,
// type and about, JSON-escaped, about 7900 bytes together),
// ErrUnavailable when PostgreSQL fails, eventbus.ErrClosed after Close.
func (b *Backplane) Signal(ctx context.Context, session, typ, about string) error {
	if err := b.set.PrepareSignal(session, typ, about); err != nil {
		return err
	}
	payload, err := json.Marshal(signalMsg{hex.EncodeToString([]byte(session)), typ, about})
	if err != nil {
		return err
	}
	if len(payload) > maxNotifyPayload {
		return fmt.Errorf("%w: signal notification of %d bytes, PostgreSQL's limit is %d",
			eventbus.ErrEventTooLarge, len(payload), maxNotifyPayload)
	}
	ctx, cancel := context.WithTimeout(ctx, b.opts.PublishTimeout)
	defer cancel()
	err = b.withConn(ctx, retryAlways, func(c *pgxpool.Conn) error {
		_, err := c.Exec(ctx, "SELECT pg_notify($1, $2)", b.q.signals, string(payload))
		return err
	})
	if err != nil {
		return unavailable("signal", session, err)
	}
	return nil
}
