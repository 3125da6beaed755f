package pgbus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// When a query may run again on a fresh connection after its connection
// turned out dead (deadConn).
type retry int

const (
	// retryAlways: a read, or a write that applies once however often it
	// runs (creating a session, deleting one, a publish with an
	// idempotency key, a signal, which clients coalesce).
	retryAlways retry = iota
	// retryUnsent: a publish without a key runs again only when pgconn
	// says nothing was sent; a second run could append it twice.
	retryUnsent
)

// withConn runs f on a pooled connection that is not known to be dead
// (acquire) and releases it. When f fails because its connection was dead
// (deadConn: the server terminated it, or it was cut), the pool is reset
// (its other connections are most likely dead too: a failover, a pooler
// bounce, pg_terminate_backend of them all) and f runs once more on a
// fresh connection, as r allows. When f fails because the schema is
// missing (a database restarted empty), the schema is created again and
// f runs once more. Each retry is made once at most (a new cluster at the
// same URL costs both), within ctx.
func (b *Backplane) withConn(ctx context.Context, r retry, f func(*pgxpool.Conn) error) error {
	gen := b.schemaGen.Load()
	dead, missing := false, false // retried for that already
	for {
		conn, err := b.acquire(ctx)
		if err != nil {
			return err // nothing was sent
		}
		err = f(conn)
		conn.Release()
		if err == nil || ctx.Err() != nil {
			return err
		}
		switch {
		case deadConn(err) && !dead:
			dead = true
			b.resetPool(err)
			if r == retryUnsent && !pgconn.SafeToRetry(err) {
				return err
			}
		case missingSchema(err) && !missing:
			missing = true
			if rerr := b.recreateSchema(ctx, gen); rerr != nil {
				return fmt.Errorf("%w (creating the schema again failed: %v)", err, rerr)
			}
		default:
			return err
		}
	}
}

// acquire takes a connection out of the pool, passing over idle ones that
// the server has closed: when something unasked waits in the socket (the
// FATAL of a terminated backend, the end of the stream) the connection is
// pinged, and destroyed when the ping fails. A request sent on such a
// connection would fail without telling whether it was applied. The pool
// is reset when one is found (see withConn).
func (b *Backplane) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	for range b.maxConns + 1 {
		c, err := b.pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		pc := c.Conn().PgConn()
		if pc.Frontend().ReadBufferLen() == 0 && !inputPending(pc.Conn()) {
			return c, nil
		}
		err = c.Ping(ctx)
		if err == nil {
			return c, nil // a notice or a notification of the pool's owner
		}
		if ctx.Err() != nil {
			c.Release()
			return nil, err
		}
		// A failed ping closes the connection; Release destroys it.
		c.Release()
		b.resetPool(err)
	}
	return nil, errors.New("pgbus: every pooled connection was dead")
}

// deadConn reports whether err shows that the connection it came from is
// dead: the server terminated it (SQLSTATE 57P01 admin_shutdown, 57P02
// crash_shutdown, 57P03 cannot_connect_now), a connection exception
// (class 08), or the connection was closed or cut under pgx (its "conn
// closed", an unexpected EOF, a reset or broken pipe).
func deadConn(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch pe.Code {
		case "57P01", "57P02", "57P03":
			return true
		}
		return strings.HasPrefix(pe.Code, "08")
	}
	return errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNABORTED)
}

// deadReason names what a dead connection's error says, for the errors
// the backplane returns.
func deadReason(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		name := map[string]string{"57P01": "admin_shutdown", "57P02": "crash_shutdown", "57P03": "cannot_connect_now"}[pe.Code]
		if name == "" {
			name = "connection_exception"
		}
		return fmt.Sprintf("PostgreSQL terminated the connection (%s %s %s: %s)", pe.Severity, pe.Code, name, pe.Message)
	}
	return fmt.Sprintf("the connection to PostgreSQL was cut (%v)", err)
}

// missingSchema reports whether err says that the backplane's schema,
// tables or functions are missing (3F000 invalid_schema_name, 42P01
// undefined_table, 42883 undefined_function): the database was restarted
// empty, or someone dropped them.
func missingSchema(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code {
	case "3F000", "42P01", "42883":
		return true
	}
	return false
}

// resetPool closes the pool's connections (those in use when they are
// released): one connection found dead says the others most likely are.
// At most once a second, so that the fresh connections of a burst of
// failures are kept.
func (b *Backplane) resetPool(err error) {
	now := time.Now().UnixNano()
	last := b.resetAt.Load()
	if now-last < int64(time.Second) || !b.resetAt.CompareAndSwap(last, now) {
		return
	}
	b.log.Warn("pgbus: a pooled connection was dead; resetting the pool", "reason", deadReason(err))
	b.pool.Reset()
}

// recreateSchema creates the schema's objects again after a query found
// them missing, unless another query did since gen.
func (b *Backplane) recreateSchema(ctx context.Context, gen uint64) error {
	b.schemaMu.Lock()
	defer b.schemaMu.Unlock()
	if b.schemaGen.Load() != gen {
		return nil
	}
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		var c *pgxpool.Conn
		if c, err = b.acquire(ctx); err != nil {
			break
		}
		err = migrate(ctx, c, b.opts.Schema)
		c.Release()
		if err == nil || !deadConn(err) {
			break
		}
		b.resetPool(err)
	}
	if err != nil {
		b.log.Error("pgbus: the schema is missing and cannot be created again", "schema", b.opts.Schema, "error", err)
		return err
	}
	b.schemaGen.Add(1)
	b.log.Warn("pgbus: the schema was missing (a database restarted empty, or dropped); created it again: "+
		"every session starts a new epoch (resuming clients get epoch_reset)", "schema", b.opts.Schema)
	return nil
}
