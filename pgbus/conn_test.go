package pgbus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// unsentErr is an error pgconn.SafeToRetry reports as never sent.
type unsentErr struct{}

func (unsentErr) Error() string     { return "write failed before a byte was sent" }
func (unsentErr) SafeToRetry() bool { return true }

func pgErr(severity, code string) error {
	return fmt.Errorf("query: %w", &pgconn.PgError{Severity: severity, Code: code, Message: "m"})
}

// The errors of a dead connection, of a missing schema, and of a publish
// that may have been applied are told apart.
func TestConnErrorClasses(t *testing.T) {
	for _, c := range []struct {
		err                  error
		dead, missing, maybe bool
	}{
		{pgErr("FATAL", "57P01"), true, false, true},
		{pgErr("FATAL", "57P02"), true, false, true},
		{pgErr("FATAL", "57P03"), true, false, true},
		{pgErr("FATAL", "08006"), true, false, true},
		{pgErr("ERROR", "08P01"), true, false, false},
		{pgErr("ERROR", "42P01"), false, true, false},
		{pgErr("ERROR", "3F000"), false, true, false},
		{pgErr("ERROR", "42883"), false, true, false},
		{pgErr("ERROR", "55P03"), false, false, false}, // lock_not_available
		{fmt.Errorf("receive: %w", io.ErrUnexpectedEOF), true, false, true},
		{fmt.Errorf("receive: %w", io.EOF), true, false, true},
		{fmt.Errorf("x: %w", pgconn.ErrConnClosed), true, false, true},
		{&net.OpError{Op: "read", Err: syscall.ECONNRESET}, true, false, true},
		{&net.OpError{Op: "write", Err: syscall.EPIPE}, true, false, true},
		{fmt.Errorf("x: %w", net.ErrClosed), true, false, true},
		{context.DeadlineExceeded, false, false, true},
		{unsentErr{}, false, false, false},
		{errors.New("other"), false, false, true},
	} {
		if got := deadConn(c.err); got != c.dead {
			t.Errorf("deadConn(%v) = %v", c.err, got)
		}
		if got := missingSchema(c.err); got != c.missing {
			t.Errorf("missingSchema(%v) = %v", c.err, got)
		}
		if got := mayHaveApplied(c.err); got != c.maybe {
			t.Errorf("mayHaveApplied(%v) = %v", c.err, got)
		}
	}
	if r := deadReason(pgErr("FATAL", "57P01")); r != "PostgreSQL terminated the connection (FATAL 57P01 admin_shutdown: m)" {
		t.Errorf("deadReason: %q", r)
	}
}

// inputPending sees what the server sent unasked, and its close, without
// reading it and without waiting for a read in progress (pgx's background
// reader may hold one on an idle connection).
func TestInputPending(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	if inputPending(client) {
		t.Fatal("pending input on a quiet connection")
	}
	if _, err := server.Write([]byte("E")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, wait, "the byte to arrive", func() bool { return inputPending(client) })
	var b [1]byte
	if n, err := client.Read(b[:]); n != 1 || err != nil || b[0] != 'E' {
		t.Fatalf("the peeked byte was consumed: %d %v %q", n, err, b[:n])
	}
	// A read in progress (as pgx's background reader's) does not block
	// the peek.
	read := make(chan error, 1)
	go func() {
		_, err := client.Read(b[:])
		read <- err
	}()
	time.Sleep(10 * time.Millisecond) // let the read park; the check below holds either way
	if inputPending(client) {
		t.Fatal("pending input on a quiet connection with a read in progress")
	}
	server.Close()
	if err := <-read; !errors.Is(err, io.EOF) {
		t.Fatalf("read after the close: %v", err)
	}
	if !inputPending(client) {
		t.Fatal("the close is not seen")
	}
}
