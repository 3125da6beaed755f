//go:build !unix

package pgbus

import "net"

// inputPending cannot peek at a socket here: a dead idle connection is
// found by the request sent on it (see withConn).
func inputPending(net.Conn) bool { return false }
