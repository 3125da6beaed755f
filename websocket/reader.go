package websocket

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	ws "github.com/coder/websocket"
	"github.com/ssebus/eventbus"
)

// clientMessage is a message of the client (docs/SPEC.md 6.10). Pointers:
// a member that is absent (or null) is told from an empty string.
type clientMessage struct {
	Op          *string `json:"op"`
	Session     *string `json:"session"`
	LastEventID *string `json:"lastEventId"`
}

// reply is a control line the reader writes: added, removed, or error.
type reply struct {
	Op      string  `json:"op"`
	Session *string `json:"session,omitempty"`
	Status  int     `json:"status,omitempty"`
	Code    string  `json:"code,omitempty"`
	Error   string  `json:"error,omitempty"`
}

// read is the connection's reader: it reads the client's messages (which
// also makes coder answer pings and take pongs and the close frame) and
// acts on them, until reading fails or a message breaks the rules; then it
// cancels Serve's context, so that the stream ends.
func (c *conn) read() {
	defer c.wg.Done()
	defer c.cancel()
	defer func() {
		// Add runs the embedder's Lookup and Authorize here, outside
		// net/http's recovery: a panic there must end this connection only,
		// as it would end the request that called them on the SSE route.
		if p := recover(); p != nil {
			c.log.LogAttrs(c.ctx, slog.LevelError, "websocket: panic serving a client message", slog.Any("panic", p))
			c.refuse(ws.StatusInternalError, "internal")
		}
	}()
	for {
		// Without a Done channel: serve closes the connection before it
		// waits for the reader (see conn.ctx).
		typ, r, err := c.c.Reader(background)
		if err != nil {
			return // the client left or closed, or serve is done
		}
		if typ != ws.MessageText {
			c.refuse(ws.StatusUnsupportedData, "unsupported_data")
			return
		}
		if c.rbuf == nil {
			c.rbuf = make([]byte, MaxMessageBytes+1)
		}
		n, err := readMessage(r, c.rbuf)
		switch {
		case err != nil:
			return
		case n > MaxMessageBytes:
			c.refuse(ws.StatusMessageTooBig, "message_too_big")
			return
		case !c.allow():
			c.refuse(ws.StatusPolicyViolation, "rate_limited")
			return
		case !c.handle(c.rbuf[:n]):
			c.refuse(ws.StatusPolicyViolation, "invalid_message")
			return
		}
	}
}

// readMessage reads a message into buf, and returns its length, or
// len(buf) when it is longer than len(buf)-1: the caller's limit is one
// byte less than buf, so reading stops before coder's own limit (which
// would close with a reason of its own) is reached.
func readMessage(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// allow takes a token from the connection's bucket: MessageBurst at most,
// refilled at MessageRate a second.
func (c *conn) allow() bool {
	now := time.Since(c.base)
	c.tokens = min(MessageBurst, c.tokens+(now-c.last).Seconds()*MessageRate)
	c.last = now
	if c.tokens < 1 {
		return false
	}
	c.tokens--
	return true
}

// refuse closes the socket for a message that broke the rules, with code
// and reason, after ending the stream. The close handshake is bounded by
// the write timeout.
func (c *conn) refuse(code ws.StatusCode, reason string) {
	c.refused.Store(true)
	c.cancel()
	c.log.LogAttrs(c.ctx, slog.LevelDebug, "websocket: closing for a client message", slog.Int("code", int(code)), slog.String("reason", reason))
	t := time.AfterFunc(c.timeout, c.kill)
	_ = c.c.Close(code, reason)
	t.Stop()
}

// handle acts on message p and reports whether it was a valid one.
func (c *conn) handle(p []byte) bool {
	var m clientMessage
	if err := json.Unmarshal(p, &m); err != nil || m.Op == nil {
		return false
	}
	session := ""
	if m.Session != nil {
		session = *m.Session
	}
	switch *m.Op {
	case "add":
		cursor := ""
		if m.LastEventID != nil {
			cursor = *m.LastEventID
		}
		if err := c.st.Add(session, cursor); err != nil {
			c.replyError(m.Session, err)
			return true
		}
		// The reply follows the cursor line that names the session first,
		// so the next cursor line the client reads names it.
		if c.await(func(names []string) bool { return slices.Contains(names, session) }) {
			c.send(reply{Op: "added", Session: &session})
		}
	case "remove":
		if err := c.st.Remove(session); err != nil {
			c.replyError(m.Session, err)
			return true
		}
		if c.await(func(names []string) bool { return !slices.Contains(names, session) }) {
			c.send(reply{Op: "removed", Session: &session})
		}
	default:
		return false
	}
	return true
}

// replyError tells the client a change was refused, with the status and
// code the route would answer, after the greeting.
func (c *conn) replyError(session *string, err error) {
	var se *eventbus.StatusError
	if !errors.As(err, &se) {
		se = &eventbus.StatusError{Status: http.StatusInternalServerError, Code: "internal", Message: "internal error", Err: err}
		c.log.LogAttrs(c.ctx, slog.LevelError, "websocket: a change of the stream's sessions failed", slog.Any("error", err))
	}
	r := reply{Op: "error", Session: session, Status: se.Status, Code: se.Code, Error: se.Message}
	if r.Status < 400 || r.Status > 599 {
		// As the routes answer a StatusError outside the error statuses
		// (StatusError.ServeHTTP).
		r.Status, r.Code, r.Error = http.StatusInternalServerError, "internal", "internal error"
	}
	if r.Code == "" {
		r.Code = strings.ReplaceAll(strings.ToLower(http.StatusText(r.Status)), " ", "_")
	}
	if r.Error == "" {
		r.Error = http.StatusText(r.Status)
	}
	if c.await(func([]string) bool { return true }) {
		c.send(r)
	}
}

// send writes a reply as a message of its own, under the write timeout
// (coder closes the connection when it passes).
func (c *conn) send(r reply) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // as the frames' strings
	_ = enc.Encode(r)        // cannot fail: strings and an int
	ctx, cancel := context.WithTimeout(c.ctx, c.timeout)
	err := c.c.Write(ctx, ws.MessageText, bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
	cancel()
	if err != nil {
		c.log.LogAttrs(c.ctx, slog.LevelDebug, "websocket: a reply could not be written", slog.Any("error", err))
	}
}
