package pgbus

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The tables and functions of one Options.Schema. Session ids and event
// types are bytea, so that any id or type the core accepts round-trips
// exactly, whatever the database's encoding.
//
//	sessions     one row per session: epoch, last_id (the last id assigned),
//	             first_id (the oldest id held, 0: none), bytes (envelope
//	             bytes held), touched_at (last publish or mirror creation)
//	events       (session, id) -> type, envelope (the JSON with "id")
//	idempotency  (session, key) -> fingerprint, id, expires_at
//
// Every write to a session runs in one function (publish, ensure_session,
// delete_session, expire_session) that first takes the transaction-scoped
// advisory lock of the session (lock_session): writes of one session are
// serialised across replicas, and since the lock is released only after
// the commit, commit order is id order: a reader never sees id
// n+1 committed before n. The notification a publish sends is delivered at
// commit, in commit order, to every replica's listener.
//
// The lock key is the first 64 bits of md5(<schema> ":" <session>) as a
// signed bigint, in the single-key space of pg_advisory_xact_lock; another
// program that writes these tables must take the same lock.
//
// Payloads on the events channel (<schema>_events):
//
//	<hex session> <epoch> <id>   a publish committed id
//	<hex session> <epoch> 0      the session of that epoch was deleted
//
// and on the signal channel (<schema>_signals) a JSON object
// {"s":<hex session>,"t":type,"a":about}.

// schemaVersion names the functions, so that replicas of two versions of
// this package can share a schema while a deployment rolls.
const schemaVersion = "v1"

// ddl returns the statements that create the schema's objects when they
// are missing. s is a validated schema name (see validSchema), which
// needs no quoting; it is quoted anyway.
func ddl(s string) string {
	q := pgx.Identifier{s}.Sanitize()
	r := strings.NewReplacer(
		"S.", q+".",
		"@schema", q,
		"@lockprefix", quoteLiteral(s+":"),
		"@events", quoteLiteral(s+"_events"),
		"@v", schemaVersion,
	)
	return r.Replace(`
CREATE SCHEMA IF NOT EXISTS @schema;

CREATE TABLE IF NOT EXISTS S.sessions (
	session    bytea PRIMARY KEY,
	epoch      text NOT NULL,
	last_id    bigint NOT NULL DEFAULT 0,
	first_id   bigint NOT NULL DEFAULT 0,
	bytes      bigint NOT NULL DEFAULT 0,
	touched_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50); -- room for HOT updates: every publish updates its row

CREATE TABLE IF NOT EXISTS S.events (
	session  bytea NOT NULL,
	id       bigint NOT NULL,
	type     bytea NOT NULL,
	envelope bytea NOT NULL,
	PRIMARY KEY (session, id)
);

CREATE TABLE IF NOT EXISTS S.idempotency (
	session     bytea NOT NULL,
	key         text NOT NULL,
	fingerprint text NOT NULL, -- backplane.Encoder.Fingerprint
	id          bigint NOT NULL,
	expires_at  timestamptz NOT NULL,
	PRIMARY KEY (session, key)
);
CREATE INDEX IF NOT EXISTS idempotency_expires_at ON S.idempotency (expires_at);

CREATE OR REPLACE FUNCTION S.lock_session_@v(p_session bytea) RETURNS void
LANGUAGE sql AS $$
	SELECT pg_advisory_xact_lock(('x' || substr(md5(convert_to(@lockprefix, 'UTF8') || p_session), 1, 16))::bit(64)::bigint)
$$;

-- publish assigns the next id, inserts the envelope and trims the session
-- to the ring's bounds (count, then bytes; the newest event always stays),
-- records the idempotency key, and notifies: atomically, under the lock.
-- A key already used in the window returns the first publish's id with
-- o_duplicate (nothing appended), or raises EB002 for another event.
-- An envelope above p_max_event once its id is known raises EB001 (no id
-- used). lock_timeout bounds the wait for the lock, so that a publish
-- whose client gave up does not commit much later.
CREATE OR REPLACE FUNCTION S.publish_@v(
	p_session bytea, p_new_epoch text, p_type bytea, p_tail bytea,
	p_max_len bigint, p_max_bytes bigint, p_max_event bigint,
	p_key text, p_fingerprint text, p_window_ms bigint, p_lock_timeout_ms bigint,
	OUT o_id bigint, OUT o_epoch text, OUT o_duplicate boolean)
LANGUAGE plpgsql AS $$
DECLARE
	s S.sessions%ROWTYPE;
	k S.idempotency%ROWTYPE;
	env bytea;
	nf bigint;
	r record;
BEGIN
	PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
	PERFORM S.lock_session_@v(p_session);
	SELECT * INTO s FROM S.sessions WHERE session = p_session;
	IF NOT FOUND THEN
		INSERT INTO S.sessions (session, epoch) VALUES (p_session, p_new_epoch) RETURNING * INTO s;
	END IF;
	o_epoch := s.epoch;
	o_duplicate := false;
	IF p_key IS NOT NULL THEN
		SELECT * INTO k FROM S.idempotency WHERE session = p_session AND key = p_key AND expires_at > now();
		IF FOUND THEN
			IF k.fingerprint <> p_fingerprint THEN
				RAISE EXCEPTION USING ERRCODE = 'EB002', MESSAGE = 'idempotency key reused for another event (first used for id ' || k.id || ')';
			END IF;
			o_id := k.id;
			o_duplicate := true;
			RETURN;
		END IF;
	END IF;
	o_id := s.last_id + 1;
	env := '\x7b226964223a'::bytea || convert_to(o_id::text, 'UTF8') || p_tail; -- {"id":
	IF octet_length(env) > p_max_event THEN
		RAISE EXCEPTION USING ERRCODE = 'EB001', MESSAGE = octet_length(env)::text;
	END IF;
	INSERT INTO S.events (session, id, type, envelope) VALUES (p_session, o_id, p_type, env);
	s.bytes := s.bytes + octet_length(env);
	IF s.first_id = 0 THEN
		s.first_id := o_id;
	END IF;
	nf := greatest(s.first_id, o_id - p_max_len + 1);
	IF nf > s.first_id THEN
		s.bytes := s.bytes - (SELECT coalesce(sum(octet_length(envelope)), 0) FROM S.events
			WHERE session = p_session AND id >= s.first_id AND id < nf);
	END IF;
	IF s.bytes > p_max_bytes THEN
		FOR r IN SELECT id, octet_length(envelope) AS n FROM S.events
			WHERE session = p_session AND id >= nf AND id < o_id ORDER BY id
		LOOP
			EXIT WHEN s.bytes <= p_max_bytes;
			s.bytes := s.bytes - r.n;
			nf := r.id + 1;
		END LOOP;
	END IF;
	IF nf > s.first_id THEN
		DELETE FROM S.events WHERE session = p_session AND id >= s.first_id AND id < nf;
		s.first_id := nf;
	END IF;
	UPDATE S.sessions SET last_id = o_id, first_id = s.first_id, bytes = s.bytes, touched_at = now()
		WHERE session = p_session;
	IF p_key IS NOT NULL THEN
		INSERT INTO S.idempotency (session, key, fingerprint, id, expires_at)
		VALUES (p_session, p_key, p_fingerprint, o_id, now() + p_window_ms * interval '1 millisecond')
		ON CONFLICT (session, key) DO UPDATE
		SET fingerprint = EXCLUDED.fingerprint, id = EXCLUDED.id, expires_at = EXCLUDED.expires_at;
	END IF;
	PERFORM pg_notify(@events, encode(p_session, 'hex') || ' ' || s.epoch || ' ' || o_id);
END
$$;

-- ensure_session returns a session's epoch and last id, creating the
-- session (a new epoch, ids from 1) when it has none. A replica calls it
-- before it builds a mirror, so the mirror's epoch is the one later
-- publishes use.
CREATE OR REPLACE FUNCTION S.ensure_session_@v(p_session bytea, p_new_epoch text,
	OUT o_epoch text, OUT o_last bigint)
LANGUAGE plpgsql AS $$
BEGIN
	UPDATE S.sessions SET touched_at = now() WHERE session = p_session RETURNING epoch, last_id INTO o_epoch, o_last;
	IF FOUND THEN
		RETURN;
	END IF;
	PERFORM S.lock_session_@v(p_session);
	SELECT epoch, last_id INTO o_epoch, o_last FROM S.sessions WHERE session = p_session;
	IF FOUND THEN
		RETURN;
	END IF;
	INSERT INTO S.sessions (session, epoch) VALUES (p_session, p_new_epoch);
	o_epoch := p_new_epoch;
	o_last := 0;
END
$$;

-- delete_session forgets a session (its epoch, events and keys) and tells
-- every replica; the next use starts a new epoch. With p_idle_ms > 0 it
-- does so only when the session was not touched for that long (the
-- SessionTTL janitor).
CREATE OR REPLACE FUNCTION S.delete_session_@v(p_session bytea, p_idle_ms bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
	e text;
BEGIN
	PERFORM S.lock_session_@v(p_session);
	DELETE FROM S.sessions WHERE session = p_session
		AND (p_idle_ms <= 0 OR touched_at < now() - p_idle_ms * interval '1 millisecond')
		RETURNING epoch INTO e;
	IF e IS NULL THEN
		RETURN false;
	END IF;
	DELETE FROM S.events WHERE session = p_session;
	DELETE FROM S.idempotency WHERE session = p_session;
	PERFORM pg_notify(@events, encode(p_session, 'hex') || ' ' || e || ' 0');
	RETURN true;
END
$$;
`)
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// maxSchemaBytes keeps the channel names (<schema>_signals) within
// PostgreSQL's 63-byte identifiers.
const maxSchemaBytes = 48

// validSchema reports whether s is a schema name New accepts: 1 to 48
// bytes of lowercase ASCII letters, digits and underscores, not starting
// with a digit. Such a name needs no quoting and is folded by nobody.
func validSchema(s string) bool {
	if s == "" || len(s) > maxSchemaBytes || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// queries holds the statements of one schema, built once by New.
type queries struct {
	publish, ensure, del string
	// catchUp reads, in one statement, the session's current epoch and the
	// events after an id: a reader learns in the same round trip that its
	// session was deleted or replaced.
	catchUp string
	history string // events in (after, upto] of an epoch
	first   string // the oldest id held in an epoch
	head    string // epoch, last_id
	info    string // epoch, last_id, first_id, bytes
	idle    string // sessions not touched for a while
	purge   string // a batch of expired idempotency keys
	events  string // notification channels
	signals string
}

func newQueries(s string) queries {
	q := pgx.Identifier{s}.Sanitize()
	v := schemaVersion
	return queries{
		publish: "SELECT o_id, o_epoch, o_duplicate FROM " + q + ".publish_" + v + "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
		ensure:  "SELECT o_epoch, o_last FROM " + q + ".ensure_session_" + v + "($1, $2)",
		del:     "SELECT " + q + ".delete_session_" + v + "($1, $2)",
		catchUp: "SELECT s.epoch, e.id, e.type, e.envelope FROM " + q + ".sessions s LEFT JOIN LATERAL (" +
			"SELECT id, type, envelope FROM " + q + ".events WHERE session = s.session AND id > $2 ORDER BY id LIMIT $3" +
			") e ON true WHERE s.session = $1",
		history: "SELECT e.id, e.type, e.envelope FROM " + q + ".events e JOIN " + q + ".sessions s ON s.session = e.session " +
			"WHERE e.session = $1 AND s.epoch = $2 AND e.id > $3 AND e.id <= $4 ORDER BY e.id LIMIT $5",
		first: "SELECT min(e.id) FROM " + q + ".events e JOIN " + q + ".sessions s ON s.session = e.session " +
			"WHERE e.session = $1 AND s.epoch = $2",
		head:    "SELECT epoch, last_id FROM " + q + ".sessions WHERE session = $1",
		info:    "SELECT epoch, last_id, first_id, bytes FROM " + q + ".sessions WHERE session = $1",
		idle:    "SELECT session FROM " + q + ".sessions WHERE touched_at < now() - $1 * interval '1 millisecond' LIMIT 100",
		purge:   "DELETE FROM " + q + ".idempotency WHERE ctid IN (SELECT ctid FROM " + q + ".idempotency WHERE expires_at <= now() LIMIT 5000)",
		events:  s + "_events",
		signals: s + "_signals",
	}
}

// migrate creates the schema's objects when they are missing, under a
// transaction-scoped advisory lock, so that replicas starting together do
// not race on CREATE (which PostgreSQL does not serialise by itself).
func migrate(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, schema string) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(('x' || substr(md5($1), 1, 16))::bit(64)::bigint)", "pgbus migrate "+schema); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, ddl(schema)); err != nil {
		return fmt.Errorf("create schema %q: %w", schema, err)
	}
	return tx.Commit(ctx)
}
