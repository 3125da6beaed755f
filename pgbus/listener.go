package pgbus

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ssebus/eventbus/backplane"
)

// listenPing is the most the listener waits for a notification before it
// pings its connection (Backplane.ping: a quarter of OutageTimeout, at
// most this): a PostgreSQL that hangs (rather than closing the
// connection) is noticed within two pings.
const listenPing = time.Second

// minOutageTimeout is the smallest Options.OutageTimeout: the listener
// pings every quarter of it.
const minOutageTimeout = 100 * time.Millisecond

// listenerOK returns when the listener last heard from PostgreSQL (the
// zero time if never).
func (b *Backplane) listenerOK() time.Time {
	if n := b.listenedAt.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// listen keeps one connection LISTENing on the backplane's two channels
// until Close, reconnecting with backoff. After every (re)connection it
// wakes every reader, which reads what the notifications it missed would
// have announced; while it is down, readers poll the table.
func (b *Backplane) listen() {
	var backoff backplane.Backoff
	failing := false
	for b.set.Context().Err() == nil {
		conn, err := b.connectListener()
		if err != nil {
			if b.set.Context().Err() != nil {
				return
			}
			if !failing {
				failing = true
				b.log.Warn("pgbus: listener cannot reach postgresql; readers poll the table meanwhile", "error", err)
			}
			backoff.Sleep(b.set.Context(), 0)
			continue
		}
		if failing {
			failing = false
			b.log.Info("pgbus: listener reconnected")
		}
		backoff.Reset()
		b.touchListener()
		b.listening.Store(true)
		b.wakeAll() // catch up on what was missed while not listening
		err = b.receive(conn)
		b.listening.Store(false)
		b.wakeAll() // poll from now on
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn.Close(ctx)
		cancel()
		if b.set.Context().Err() == nil {
			failing = true
			b.log.Warn("pgbus: listener lost postgresql; readers poll the table meanwhile", "error", err)
		}
	}
}

func (b *Backplane) touchListener() { b.listenedAt.Store(time.Now().UnixNano()) }

// connectListener takes a connection out of the pool (so the pool's
// configuration and hooks apply) and LISTENs on it.
func (b *Backplane) connectListener() (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(b.set.Context(), b.opts.PublishTimeout)
	defer cancel()
	pc, err := b.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	conn := pc.Hijack()
	sql := "LISTEN " + pgx.Identifier{b.q.events}.Sanitize() + "; LISTEN " + pgx.Identifier{b.q.signals}.Sanitize()
	if _, err := conn.Exec(ctx, sql); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}

// receive dispatches notifications until the connection fails, a ping
// fails or times out, or Close. It waits b.ping for a notification, then
// pings, and gives the ping a quarter of OutageTimeout (at most
// PublishTimeout): a hung PostgreSQL is noticed within half of
// OutageTimeout of the last word, so the readers it then wakes read, and
// fail, within the bound.
func (b *Backplane) receive(conn *pgx.Conn) error {
	for {
		ctx, cancel := context.WithTimeout(b.set.Context(), b.ping)
		n, err := conn.WaitForNotification(ctx)
		cancel()
		if n != nil {
			b.touchListener()
			b.dispatch(n)
		}
		if err == nil {
			continue
		}
		if b.set.Context().Err() != nil {
			return b.set.Context().Err()
		}
		if !pgconn.Timeout(err) && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		// Quiet for a ping: is PostgreSQL still there?
		ctx, cancel = context.WithTimeout(b.set.Context(), min(b.opts.OutageTimeout/4, b.opts.PublishTimeout))
		err = conn.Ping(ctx)
		cancel()
		if err != nil {
			return err
		}
		b.touchListener()
	}
}

// wakeAll wakes every reader.
func (b *Backplane) wakeAll() {
	b.set.Each((*session).poke)
}

// dispatch handles one notification.
func (b *Backplane) dispatch(n *pgconn.Notification) {
	switch n.Channel {
	case b.q.events:
		// "<hex session> <epoch> <id>": wake the reader when the id is one
		// it has not fed, or when the epoch is not the mirror's (it reads
		// the session's current epoch and releases the mirror if it
		// changed: a late notification of an older epoch must not release
		// a newer mirror, so the reader decides, from the table).
		p := []byte(n.Payload)
		hs, rest, ok1 := bytes.Cut(p, []byte{' '})
		epoch, ids, ok2 := bytes.Cut(rest, []byte{' '})
		id, err := strconv.ParseUint(string(ids), 10, 64)
		session, herr := hex.DecodeString(string(hs))
		if !ok1 || !ok2 || err != nil || herr != nil {
			b.log.Warn("pgbus: malformed notification", "channel", n.Channel, "payload", n.Payload)
			return
		}
		// Not only ready sessions: a mirror being opened has its reader
		// started (and perhaps its first read done) just before it is
		// ready, and must not miss this wake.
		s, bus, mine, ok := b.set.Peek(string(session))
		if ok && (bus == nil || string(epoch) != mine || id == 0 || id > bus.LastEventID()) {
			s.poke()
		}
	case b.q.signals:
		var sig signalMsg
		if json.Unmarshal([]byte(n.Payload), &sig) != nil {
			b.log.Warn("pgbus: malformed signal", "payload", n.Payload)
			return
		}
		session, err := hex.DecodeString(sig.Session)
		if err != nil {
			return
		}
		b.set.DeliverSignal(string(session), sig.Type, sig.About)
	}
}
