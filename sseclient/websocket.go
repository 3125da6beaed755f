package sseclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/ssebus/eventbus/internal/muxcursor"
)

// A WebSocketDialer opens the WebSocket of a Client (Client.WebSocket),
// so that the client speaks docs/SPEC.md 6.10 without this package
// depending on a WebSocket library: github.com/ssebus/eventbus/websocket's
// Dialer is one, on github.com/coder/websocket.
type WebSocketDialer interface {
	// DialWebSocket opens a WebSocket to url (ws or wss) with header on
	// the handshake, offering the subprotocol "eventbus.v1". When the
	// server answers the handshake with something other than 101, the
	// error comes with that answer: resp is non-nil, its body (the
	// server's JSON error, or a proxy's page) readable, and the caller
	// closes it. Otherwise resp may be nil. It must honour ctx.
	DialWebSocket(ctx context.Context, url string, header http.Header) (conn WebSocketConn, resp *http.Response, err error)
}

// A WebSocketConn is one open WebSocket, for the Client. ReadMessage is
// called from one goroutine, WriteMessage and Ping from another,
// concurrently with it; Close from either, and it makes the others
// return.
type WebSocketConn interface {
	// ReadMessage returns the next message's bytes, which the caller then
	// owns; a binary message is an error. It blocks until one comes, ctx
	// ends, or the connection fails or closes (an error).
	ReadMessage(ctx context.Context) ([]byte, error)
	// WriteMessage sends p as one text message.
	WriteMessage(ctx context.Context, p []byte) error
	// Ping sends a ping and waits for its pong (or ctx).
	Ping(ctx context.Context) error
	// Close closes the connection (a normal closure when it can) and
	// releases it.
	Close() error
}

// wsControl is a control line of the WebSocket wire (SPEC 6.10).
type wsControl struct {
	Op      string            `json:"op"`
	Cursor  string            `json:"cursor"`
	Epochs  map[string]string `json:"epochs"`
	Session string            `json:"session"`
	Status  int               `json:"status"`
	Code    string            `json:"code"`
	Error   string            `json:"error"`
}

// wsFramePrefix starts a frame line: the multiplexed envelope's first
// member. Any other line is a control line.
var wsFramePrefix = []byte(`{"session":`)

// fallback makes the next connections SSE, for WebSocketRetry.
func (r *run) fallback() {
	r.sseUntil = time.Now().Add(orDefault(r.c.WebSocketRetry, DefaultWebSocketRetry))
}

// attemptWS is connect's attempt over the WebSocket, under ctx: the
// multiplexed stream's sessions and cursor at WebSocketURL, read message
// by message, each line a frame (handled as an SSE frame is) or a control
// line.
func (r *run) attemptWS(ctx context.Context, cancel context.CancelCauseFunc) (res result) {
	header := http.Header{}
	for k, v := range r.c.Header {
		header[k] = v
	}
	for k, v := range r.creds.Header {
		header[k] = v
	}
	if r.creds.Token != "" {
		header.Set("Authorization", "Bearer "+r.creds.Token)
	}
	ws, resp, err := r.c.WebSocket.DialWebSocket(ctx, r.mux.url(r.c, r.wsBase), header)
	if err != nil {
		if r.ctx.Err() != nil || context.Cause(ctx) == errSessionsChanged {
			return result{end: endCancelled}
		}
		if resp != nil {
			he := httpError(resp)
			resp.Body.Close()
			if he.Code != "" && !webSocketUnavailable(he) {
				// The server's own answer about the stream, with its JSON
				// error: it counts as it would over SSE.
				return r.refused(he)
			}
		}
		r.fallback()
		return result{end: endFallback, err: fmt.Errorf("sseclient: websocket (falling back to SSE): %w", redactURL(err))}
	}
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	defer ws.Close()

	r.authFinal = false
	r.notFoundSince = time.Time{}
	res = result{opened: true, openedAt: time.Now()}
	cn := &conn{res: &res}
	m := r.mux
	r.c.mu.Lock()
	m.opened("") // the greeting's epochs follow
	m.adding, m.removing = map[string]bool{}, map[string]bool{}
	m.changes = make(chan struct{}, 1)
	pending := !slices.Equal(m.want, m.sessionIDs())
	r.c.mu.Unlock()
	defer func() {
		r.c.mu.Lock()
		m.adding, m.removing, m.changes = nil, nil, nil
		r.c.mu.Unlock()
	}()
	r.stateOpen(TransportWebSocket)

	// The connection's other goroutine: pings (the server's pings keep it
	// alive on the server's side; a server that is gone sends nothing,
	// and only a ping finds that out), and the changes of AddSession and
	// RemoveSession. It ends before this returns.
	var wg sync.WaitGroup
	done := make(chan struct{})
	defer wg.Wait()
	defer close(done)
	changes := m.changes
	if pending {
		changes <- struct{}{} // AddSession or RemoveSession while it opened
	}
	wg.Go(func() { r.wsHelper(ctx, cancel, ws, changes, done) })

	greeted := false
	for {
		msg, err := ws.ReadMessage(ctx)
		if err != nil {
			switch {
			case r.ctx.Err() != nil:
				res.end = endCancelled
			case context.Cause(ctx) == ErrIdleTimeout:
				res.end, res.err = endIdle, ErrIdleTimeout
			case !greeted && context.Cause(ctx) == nil:
				// Opened, then cut before the server said anything: a
				// proxy that lets the handshake through and not the
				// socket. SSE, at once.
				r.fallback()
				res.end, res.err = endFallback, fmt.Errorf("sseclient: websocket cut before its first message (falling back to SSE): %w", err)
			default:
				res.end, res.err = endCut, fmt.Errorf("%w: %w", ErrStreamCut, err)
			}
			return res
		}
		greeted = true
		for line := range bytes.SplitSeq(msg, []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			if bytes.HasPrefix(line, wsFramePrefix) {
				r.frame(Message{Kind: KindEvent, Data: line}, cn)
			} else {
				r.wsControl(line, cn, cancel)
			}
			if cn.stop != 0 {
				res.end = cn.stop
				return res
			}
		}
	}
}

// wsHelper pings the server every IdleTimeout/3 (a missing pong within
// that ends the connection with ErrIdleTimeout) and sends the changes of
// AddSession and RemoveSession, until done.
func (r *run) wsHelper(ctx context.Context, cancel context.CancelCauseFunc, conn WebSocketConn, changes <-chan struct{}, done <-chan struct{}) {
	every := r.idle / 3
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			pctx, stop := context.WithTimeout(ctx, every)
			err := conn.Ping(pctx)
			stop()
			if err != nil && ctx.Err() == nil {
				cancel(ErrIdleTimeout)
				conn.Close()
				return
			}
		case <-changes:
			for _, msg := range r.wsChanges() {
				if err := conn.WriteMessage(ctx, msg); err != nil {
					cancel(fmt.Errorf("%w: %w", ErrStreamCut, err))
					conn.Close()
					return
				}
			}
		}
	}
}

// wsChanges returns the messages that bring the connection's sessions to
// the client's (want): an add for each one it lacks (resumed from the
// client's position in it, if any), a remove for each it has too many,
// and records them as asked for.
func (r *run) wsChanges() [][]byte {
	c, m := r.c, r.mux
	c.mu.Lock()
	defer c.mu.Unlock()
	if m.changes == nil {
		return nil
	}
	have := m.sessionIDs()
	var out [][]byte
	for _, id := range m.want {
		if (slices.Contains(have, id) && !m.removing[id]) || m.adding[id] {
			continue
		}
		from := ""
		if p := m.pos[id]; p != nil && p.hasCursor {
			if b, err := muxcursor.Append(nil, []muxcursor.Entry{{Session: muxcursor.SessionTag(id), Epoch: p.tag, ID: p.cursor}}); err == nil {
				from = string(b)
			}
		}
		b, _ := json.Marshal(struct {
			Op          string `json:"op"`
			Session     string `json:"session"`
			LastEventID string `json:"lastEventId,omitempty"`
		}{"add", id, from})
		m.adding[id] = true
		delete(m.removing, id)
		out = append(out, b)
	}
	for _, id := range have {
		if slices.Contains(m.want, id) || m.removing[id] {
			continue
		}
		b, _ := json.Marshal(struct {
			Op      string `json:"op"`
			Session string `json:"session"`
		}{"remove", id})
		m.removing[id] = true
		out = append(out, b)
	}
	return out
}

// sessionIDs returns the ids of the connection's sessions, in order.
func (m *muxState) sessionIDs() []string {
	ids := make([]string, len(m.order))
	for i, p := range m.order {
		ids[i] = p.session
	}
	return ids
}

// adopt returns the position of session id when the open WebSocket asked
// for it and the server's frames for it come (before its added, as they
// may), having made it one of the connection's sessions; nil otherwise.
func (r *run) adopt(id string) *position {
	m := r.mux
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	if !m.adding[id] {
		return nil
	}
	delete(m.adding, id)
	p := m.position(id)
	p.replaying, p.budgetCut, p.streamEpoch = p.hasCursor, false, ""
	m.order = append(m.order, p)
	return p
}

// wsControl handles a control line of the WebSocket.
func (r *run) wsControl(line []byte, cn *conn, cancel context.CancelCauseFunc) {
	var ctl wsControl
	if err := json.Unmarshal(line, &ctl); err != nil {
		r.protocol("a control line that is not JSON: %.64q", line)
		return
	}
	m, c := r.mux, r.c
	switch ctl.Op {
	case "cursor":
		entries, err := muxcursor.Parse(ctl.Cursor, maxMuxSessions, nil)
		if err != nil {
			r.protocol("a cursor line whose cursor does not parse: %.64q", ctl.Cursor)
			return
		}
		c.mu.Lock()
		m.cursorLine(entries, ctl.Epochs)
		c.mu.Unlock()
	case "added":
		if m.of(ctl.Session) == nil {
			r.adopt(ctl.Session)
		}
	case "removed":
		c.mu.Lock()
		delete(m.removing, ctl.Session)
		m.order = slices.DeleteFunc(m.order, func(p *position) bool { return p.session == ctl.Session })
		c.mu.Unlock()
	case "error":
		he := &HTTPError{StatusCode: ctl.Status, Code: ctl.Code, Message: ctl.Error, Session: ctl.Session}
		r.report(he)
		c.mu.Lock()
		asked := m.adding[ctl.Session]
		delete(m.adding, ctl.Session)
		delete(m.removing, ctl.Session)
		c.mu.Unlock()
		if asked {
			// A session it could not add: the next connection asks for
			// the whole list, and the server's answer to that (a 404 for
			// a session that does not exist, with RetryNotFound; a 403)
			// counts as on any connection.
			cancel(errSessionsChanged)
			cn.stop = endRestart
		}
	}
	// Any other op: a control line of a newer server, skipped.
}

// cursorLine takes in a cursor line of the WebSocket (the greeting's, or
// one after a message's frames), under the client's lock: the sessions'
// epochs, where it has them (as Event-Epochs is taken in on SSE), then for
// each session without a position the one the server holds for it, so
// that a reconnect loses none of its events (as an SSE id line gives it).
func (m *muxState) cursorLine(entries []muxcursor.Entry, epochs map[string]string) {
	for _, p := range m.order {
		if e := epochs[p.session]; validEpoch(e) {
			p.streamEpoch = e
			if !p.hasCursor {
				p.setEpoch(e)
			}
			m.startAt0(p)
		}
		if p.hasCursor || p.budgetCut {
			continue
		}
		if e, ok := muxcursor.Cursor(entries).Entry(p.session); ok {
			p.hasCursor, p.cursor, p.tag = true, e.ID, e.Epoch
			if p.streamEpoch != "" && epochTag(p.streamEpoch) == e.Epoch {
				p.epoch = p.streamEpoch
			}
		}
	}
}

// webSocketUnavailable reports whether a server's JSON refusal of the
// handshake says that no WebSocket is served there, rather than anything
// about the stream: a route it does not have (404 other than
// session_not_found, 405), a handshake that reached it without its Upgrade
// headers (426 upgrade_required: a proxy that does not forward them), a
// connection it cannot take over (500 streaming_unsupported). The SSE
// route may serve the stream all the same: the client falls back to it.
func webSocketUnavailable(he *HTTPError) bool {
	switch he.StatusCode {
	case http.StatusNotFound:
		return he.Code != "session_not_found"
	case http.StatusMethodNotAllowed, http.StatusUpgradeRequired:
		return true
	case http.StatusInternalServerError:
		return he.Code == "streaming_unsupported"
	}
	return false
}
