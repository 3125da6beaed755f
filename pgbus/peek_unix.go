//go:build unix

package pgbus

import (
	"crypto/tls"
	"errors"
	"net"
	"syscall"
)

// inputPending reports whether the socket under nc has bytes to read or is
// at its end (or failed), without reading: on an idle PostgreSQL
// connection, whatever the server sent unasked (a FATAL before it closed
// the connection) or its close. It reports false when it cannot tell.
func inputPending(nc net.Conn) bool {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	pending := false
	var buf [1]byte
	// Control, not Read: it takes no read lock, which a read of pgx's
	// background reader may hold on an idle connection until the server
	// sends something. The runtime keeps the socket non-blocking: EAGAIN
	// means nothing to read; n == 0 without an error is the end.
	err = rc.Control(func(fd uintptr) {
		_, _, rerr := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK)
		pending = !errors.Is(rerr, syscall.EAGAIN) && !errors.Is(rerr, syscall.EWOULDBLOCK) && !errors.Is(rerr, syscall.EINTR)
	})
	return pending || err != nil
}
