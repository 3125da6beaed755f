package sseclient

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/ssebus/eventbus/internal/muxcursor"
)

// maxMuxSessions is the most sessions a composite cursor holds
// (eventbus.MaxCursorEntries).
const maxMuxSessions = 256

// maxSessionIDBytes is the server's bound of a session id
// (eventbus.MaxSessionIDBytes; this package does not import eventbus).
const maxSessionIDBytes = 256

// SessionGone is what OnSessionGone receives: a session of a multiplexed
// stream that the server says no longer exists. The client has dropped it
// from the stream's URL; the others go on.
type SessionGone struct {
	Session string
	// Reason is "session_not_found" (a 404 naming it: it does not exist,
	// or the daemon restarted without it) or "closed" (a stream_error
	// "closed" for it: it was deleted while streaming).
	Reason string
	// Err is the *HTTPError or *StreamError that said so.
	Err error
	// LastEventID and Epoch are where the client stood in it.
	LastEventID uint64
	Epoch       string
}

// muxState is a multiplexed client's positions, one per session of
// Client.Sessions ever run, and the sessions of the current Run, guarded
// by Client.mu but for their per-connection fields (Run's).
type muxState struct {
	pos    map[string]*position
	order  []*position // the current Run's sessions still streamed, in URL order
	cursor []muxcursor.Entry
}

// epochTag is the tag of a bus epoch in a composite cursor.
func epochTag(epoch string) uint64 { return muxcursor.EpochTag(epoch) }

// validateMux checks the multiplexed fields.
func (c *Client) validateMux() error {
	if len(c.Sessions) == 0 {
		if c.ResumeCursor != "" {
			return errors.New("ResumeCursor without Sessions")
		}
		return nil
	}
	if len(c.Sessions) > maxMuxSessions {
		return errors.New("more than 256 Sessions")
	}
	for i, id := range c.Sessions {
		if id == "" {
			return errors.New("an empty session in Sessions")
		}
		// The server's session id rule (docs/SPEC.md section 7): a
		// session it would refuse with 400 is refused here, before any
		// request.
		if len(id) > maxSessionIDBytes || !utf8.ValidString(id) {
			return fmt.Errorf("session %q in Sessions is not 1 to %d bytes of valid UTF-8", id[:min(len(id), 64)], maxSessionIDBytes)
		}
		for _, other := range c.Sessions[:i] {
			if other == id {
				return errors.New("session " + id + " twice in Sessions")
			}
		}
	}
	if c.Resume || c.LastEventID != 0 || c.Epoch != "" {
		return errors.New("sessions with Resume, LastEventID or Epoch: a multiplexed stream resumes from ResumeCursor")
	}
	if c.ResumeCursor != "" {
		if _, err := muxcursor.Parse(c.ResumeCursor, maxMuxSessions, nil); err != nil {
			return errors.New("ResumeCursor: " + strings.TrimPrefix(err.Error(), "eventbus: "))
		}
	}
	return nil
}

// startMux sets up the positions of a Run of Sessions, from ResumeCursor on
// the first one (validated). The caller holds c.mu.
func (c *Client) startMux(first bool) *muxState {
	if c.mux == nil {
		c.mux = &muxState{pos: map[string]*position{}}
	}
	m := c.mux
	var from []muxcursor.Entry
	if first && c.ResumeCursor != "" {
		from, _ = muxcursor.Parse(c.ResumeCursor, maxMuxSessions, nil)
	}
	m.order = m.order[:0]
	for _, id := range c.Sessions {
		p := m.pos[id]
		if p == nil {
			p = &position{session: id, mux: true}
			m.pos[id] = p
			if e, ok := entryOf(from, muxcursor.SessionTag(id)); ok {
				p.hasCursor, p.cursor, p.tag = true, e.ID, e.Epoch
			}
		}
		m.order = append(m.order, p)
	}
	return m
}

// entryOf finds the entry of a session tag: the only one with it.
func entryOf(entries []muxcursor.Entry, tag uint64) (muxcursor.Entry, bool) {
	var found muxcursor.Entry
	n := 0
	for _, e := range entries {
		if e.Session == tag {
			found = e
			n++
		}
	}
	return found, n == 1
}

// url is base with one session parameter per session of the stream and the
// composite cursor of those with a position as lastEventId.
func (m *muxState) url(c *Client, base *url.URL) string {
	u := *base
	q := u.Query()
	c.mu.Lock()
	defer c.mu.Unlock()
	m.cursor = m.cursor[:0]
	for _, p := range m.order {
		q.Add("session", p.session)
		if p.hasCursor {
			m.cursor = append(m.cursor, muxcursor.Entry{Session: muxcursor.SessionTag(p.session), Epoch: p.tag, ID: p.cursor})
		}
	}
	if len(m.cursor) > 0 {
		if b, err := muxcursor.Append(nil, m.cursor); err == nil {
			q.Set("lastEventId", string(b))
		}
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// opened starts a connection, under the client's lock: header is its
// Event-Epochs, the epochs of the URL's sessions in order.
func (m *muxState) opened(header string) {
	epochs := strings.Split(header, ",")
	if len(epochs) != len(m.order) {
		epochs = nil // not this stream's: the frames will say
	}
	for i, p := range m.order {
		e := ""
		if epochs != nil {
			e = strings.TrimSpace(epochs[i])
		}
		p.opened(e)
	}
}

// of returns the position of session id on the current stream, nil when
// the stream has no such session.
func (m *muxState) of(id string) *position {
	for _, p := range m.order {
		if p.session == id {
			return p
		}
	}
	return nil
}

// active reports whether session id is one of the stream's.
func (m *muxState) active(id string) bool { return id != "" && m.of(id) != nil }

// replaying reports whether a session's replay is still under way.
func (m *muxState) replaying() bool {
	for _, p := range m.order {
		if p.replaying {
			return true
		}
	}
	return false
}

// budgetCut reports whether a session's replay was cut by the server's
// budget on this connection.
func (m *muxState) budgetCut() bool {
	for _, p := range m.order {
		if p.budgetCut {
			return true
		}
	}
	return false
}

// event takes in the composite cursor of event id of p (its id line):
// sessions without a position yet take theirs from it, the live position
// the server holds for them, so that a reconnect loses none of their
// events; p takes its epoch's tag from it while neither it nor the
// stream's headers know the epoch (a server without Event-Epochs), and a
// tag other than its cursor's is then an epoch change, returned to report.
// It returns the epoch the event shows: the stream's epoch of p
// (Event-Epochs), as a single stream with plain ids does.
func (m *muxState) event(c *Client, p *position, msg Message, id uint64) (shown string, changed *Resync) {
	if !msg.HasID {
		return p.streamEpoch, nil
	}
	entries, err := muxcursor.Parse(msg.ID, maxMuxSessions, m.cursor[:0])
	if err != nil {
		return p.streamEpoch, nil
	}
	m.cursor = entries
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, q := range m.order {
		if q == p || q.hasCursor || q.budgetCut {
			continue
		}
		if e, ok := entryOf(entries, muxcursor.SessionTag(q.session)); ok {
			q.hasCursor, q.cursor, q.tag = true, e.ID, e.Epoch
			if q.streamEpoch != "" && epochTag(q.streamEpoch) == e.Epoch {
				q.epoch = q.streamEpoch
			}
		}
	}
	own, ok := entryOf(entries, muxcursor.SessionTag(p.session))
	if p.epoch != "" || p.streamEpoch != "" || !ok || own.ID != id || (p.hasCursor && own.Epoch == p.tag) {
		return p.streamEpoch, nil
	}
	if p.hasCursor {
		changed = &Resync{Session: p.session, Reason: "epoch_reset", Detail: "epoch_changed", LastDeliveredID: p.cursor, EarliestAvailableID: id}
		if id > 1 {
			changed.Missing = IDRange{From: 1, To: id - 1}
		}
		p.cursor = 0
	}
	p.tag = own.Epoch
	return "", changed
}

// gone drops session id from the stream: the server says it is gone. It
// returns the connection's end: endGone (reconnect at once without it), or
// the final ErrNoSessions when none is left.
func (r *run) gone(id, reason string, err error) result {
	m := r.mux
	c := r.c
	c.mu.Lock()
	var g SessionGone
	for i, p := range m.order {
		if p.session == id {
			g = SessionGone{Session: id, Reason: reason, Err: err, LastEventID: p.cursor, Epoch: p.epoch}
			m.order = append(m.order[:i], m.order[i+1:]...)
			break
		}
	}
	left := len(m.order)
	c.mu.Unlock()
	if f := c.OnSessionGone; f != nil {
		f(g)
	}
	if left == 0 {
		return result{end: endFatal, err: ErrNoSessions}
	}
	return result{end: endGone, err: err}
}

// SessionCursor returns where the client stands in session of a
// multiplexed stream: the epoch of its last delivered event (empty while
// only its tag is known: a position from ResumeCursor before the server
// confirmed it) and its id, with ok false when it has none (it started
// live and nothing arrived on the stream yet). Safe to call from any
// goroutine, also while Run runs.
func (c *Client) SessionCursor(session string) (epoch string, lastEventID uint64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mux == nil || c.mux.pos[session] == nil {
		return "", 0, false
	}
	p := c.mux.pos[session]
	return p.epoch, p.cursor, p.hasCursor
}

// CompositeCursor returns the composite cursor of the sessions the
// current (or last) Run streams that the client has a position in, as the
// server's id lines write it: what the next connection resumes from, and
// what a later client's ResumeCursor, or a plain EventSource's
// Last-Event-ID, may resume from. "" when it has none. (Sessions gone or
// no longer in Sessions are left out: the server refuses a cursor of more
// entries than its sessions' bound.) Safe to call from any goroutine, also
// while Run runs.
func (c *Client) CompositeCursor() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mux == nil {
		return ""
	}
	var entries []muxcursor.Entry
	for _, p := range c.mux.order {
		if p.hasCursor {
			entries = append(entries, muxcursor.Entry{Session: muxcursor.SessionTag(p.session), Epoch: p.tag, ID: p.cursor})
		}
	}
	b, err := muxcursor.Append(nil, entries)
	if err != nil {
		return ""
	}
	return string(b)
}

// ActiveSessions returns the sessions of a multiplexed stream the current
// (or last) Run streams: Sessions without those gone. Safe to call from
// any goroutine, also while Run runs.
func (c *Client) ActiveSessions() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mux == nil {
		return nil
	}
	ids := make([]string, len(c.mux.order))
	for i, p := range c.mux.order {
		ids[i] = p.session
	}
	return ids
}
