package sseclient

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
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

// muxState is a multiplexed client's sessions and positions: one position
// per session ever streamed, the list to stream (want), and the current
// connection's sessions (order). Guarded by Client.mu, but for order and
// the positions' per-connection fields, which Run's goroutine alone reads
// (and writes under the lock).
type muxState struct {
	pos map[string]*position
	// want is the sessions to stream: Sessions, then as AddSession,
	// RemoveSession and gone sessions change it.
	want []string
	// from is ResumeFrom's entries, for a session added later.
	from []muxcursor.Entry
	// fromStart: ResumeFrom was "0"; while no session has a position the
	// client asks for "0" again.
	fromStart bool
	// sentFromStart: the current connection asked for "0".
	sentFromStart bool
	order         []*position // the current connection's sessions still streamed, in URL order
	cursor        []muxcursor.Entry
	// On an open WebSocket: the sessions asked for and not yet confirmed
	// (or refused), and changes, which AddSession and RemoveSession signal
	// instead of reconnecting (nil otherwise).
	adding, removing map[string]bool
	changes          chan struct{}
}

// epochTag is the tag of a bus epoch in a composite cursor.
func epochTag(epoch string) uint64 { return muxcursor.EpochTag(epoch) }

// isFromStart reports whether s is the cursor "0" (any run of zeros, as a
// single stream reads N).
func isFromStart(s string) bool { return s != "" && strings.Trim(s, "0") == "" }

// validateMux checks the multiplexed fields.
func (c *Client) validateMux() error {
	if len(c.Sessions) == 0 {
		return nil
	}
	if len(c.Sessions) > maxMuxSessions {
		return errors.New("more than 256 Sessions")
	}
	for i, id := range c.Sessions {
		if err := checkSessionID(id); err != nil {
			return err
		}
		for _, other := range c.Sessions[:i] {
			if other == id {
				return errors.New("session " + id + " twice in Sessions")
			}
		}
	}
	if c.ResumeEpoch != "" {
		return errors.New("ResumeEpoch with Sessions: a multiplexed stream resumes from ResumeFrom, its composite cursor")
	}
	if c.ResumeFrom != "" && !isFromStart(c.ResumeFrom) {
		if _, err := muxcursor.Parse(c.ResumeFrom, maxMuxSessions, nil); err != nil {
			return errors.New("ResumeFrom with Sessions is 0 or a composite cursor: " + strings.TrimPrefix(err.Error(), "eventbus: "))
		}
	}
	return nil
}

// checkSessionID applies the server's session id rule (docs/SPEC.md
// section 7): a session it would refuse with 400 is refused here, before
// any request.
func checkSessionID(id string) error {
	if id == "" {
		return errors.New("an empty session")
	}
	if len(id) > maxSessionIDBytes || !utf8.ValidString(id) {
		return fmt.Errorf("session %q is not 1 to %d bytes of valid UTF-8", head(id), maxSessionIDBytes)
	}
	return nil
}

// muxState returns the client's multiplexed state, made from Sessions and
// ResumeFrom the first time. The caller holds c.mu.
func (c *Client) muxState() *muxState {
	if c.mux != nil {
		return c.mux
	}
	m := &muxState{pos: map[string]*position{}}
	if isFromStart(c.ResumeFrom) {
		m.fromStart = true
	} else if c.ResumeFrom != "" {
		m.from, _ = muxcursor.Parse(c.ResumeFrom, maxMuxSessions, nil) // validated by Run (else nil)
	}
	for _, id := range c.Sessions {
		if !slices.Contains(m.want, id) {
			m.want = append(m.want, id)
			m.position(id)
		}
	}
	c.mux = m
	return m
}

// position returns the position of session id, made (from ResumeFrom's
// entry for it, if any) when the client has none.
func (m *muxState) position(id string) *position {
	p := m.pos[id]
	if p == nil {
		p = &position{session: id, mux: true}
		if e, ok := muxcursor.Cursor(m.from).Entry(id); ok {
			p.hasCursor, p.cursor, p.tag = true, e.ID, e.Epoch
		}
		m.pos[id] = p
	}
	return p
}

// url is base with one session parameter per session of the stream and
// the composite cursor of those with a position as lastEventId ("0" while
// a start from the beginning has given none a position). It starts a
// connection: the sessions are want's from now on.
func (m *muxState) url(c *Client, base *url.URL) string {
	u := *base
	q := u.Query()
	c.mu.Lock()
	defer c.mu.Unlock()
	m.order = m.order[:0]
	for _, id := range m.want {
		m.order = append(m.order, m.position(id))
	}
	m.cursor = m.cursor[:0]
	for _, p := range m.order {
		q.Add("session", p.session)
		if p.hasCursor {
			m.cursor = append(m.cursor, muxcursor.Entry{Session: muxcursor.SessionTag(p.session), Epoch: p.tag, ID: p.cursor})
		}
	}
	m.sentFromStart = m.fromStart && len(m.cursor) == 0
	switch {
	case m.sentFromStart:
		q.Set("lastEventId", "0")
	case len(m.cursor) > 0:
		if b, err := muxcursor.Append(nil, m.cursor); err == nil {
			q.Set("lastEventId", string(b))
		}
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// lastEventID is Client.LastEventID of a multiplexed client, under its
// lock.
func (m *muxState) lastEventID() string {
	var entries []muxcursor.Entry
	for _, id := range m.want {
		if p := m.pos[id]; p != nil && p.hasCursor {
			entries = append(entries, muxcursor.Entry{Session: muxcursor.SessionTag(id), Epoch: p.tag, ID: p.cursor})
		}
	}
	if len(entries) == 0 {
		if m.fromStart {
			return "0"
		}
		return ""
	}
	b, err := muxcursor.Append(nil, entries)
	if err != nil {
		return ""
	}
	return string(b)
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
		if m.sentFromStart {
			// Every session replays from the start of its ring; one whose
			// epoch the header gave stands at 0 of it from now on.
			p.replaying = true
			m.startAt0(p)
		}
	}
}

// startAt0 gives p, of a stream that asked for "0", the position 0 of its
// epoch once that is known and it has none: a reconnect then asks for its
// whole ring again. The caller holds the client's lock.
func (m *muxState) startAt0(p *position) {
	if m.sentFromStart && !p.hasCursor && p.epoch != "" {
		p.hasCursor, p.cursor = true, 0
	}
}

// caughtUp takes in p's replay_complete (its epoch observed already).
func (m *muxState) caughtUp(c *Client, p *position) {
	c.mu.Lock()
	m.startAt0(p)
	c.mu.Unlock()
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
		if e, ok := muxcursor.Cursor(entries).Entry(q.session); ok {
			q.hasCursor, q.cursor, q.tag = true, e.ID, e.Epoch
			if q.streamEpoch != "" && epochTag(q.streamEpoch) == e.Epoch {
				q.epoch = q.streamEpoch
			}
		}
	}
	own, ok := muxcursor.Cursor(entries).Entry(p.session)
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
	if i := slices.Index(m.want, id); i >= 0 {
		m.want = slices.Delete(m.want, i, i+1)
	}
	// want, not order: a session AddSession added meanwhile is streamed
	// next.
	left := len(m.want)
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
// only its tag is known: a position from ResumeFrom before the server
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

// ActiveSessions returns the sessions of a multiplexed stream the client
// streams: Sessions, then as AddSession, RemoveSession and the sessions
// gone change it (what the next connection asks for). Safe to call from
// any goroutine, also while Run runs.
func (c *Client) ActiveSessions() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mux == nil {
		if len(c.Sessions) == 0 {
			return nil
		}
		c.muxState()
	}
	return slices.Clone(c.mux.want)
}

// AddSession adds session id to a multiplexed client's stream: the
// current connection, if one is open or opening, ends, and the next starts
// at once with the new list and the cursor; id starts from its position
// when the client has one (streamed before, or named by ResumeFrom), else
// live. A session streamed already is left as it is. The list carries
// over to later Runs. Safe for concurrent use, from callbacks too, and
// before Run. It returns ErrNotMultiplexed without Sessions, and an error
// wrapping ErrInvalidOption for an id the server's rule refuses or a
// 257th session.
func (c *Client) AddSession(id string) error {
	if err := checkSessionID(id); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidOption, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mux == nil && len(c.Sessions) == 0 {
		return ErrNotMultiplexed
	}
	m := c.muxState()
	if slices.Contains(m.want, id) {
		return nil
	}
	if len(m.want) >= maxMuxSessions {
		return fmt.Errorf("%w: more than 256 sessions", ErrInvalidOption)
	}
	m.want = append(m.want, id)
	m.position(id)
	c.restartLocked()
	return nil
}

// RemoveSession stops streaming session id on a multiplexed client: the
// current connection, if one is open or opening, ends, and the next starts
// at once without it. The client keeps its position, should it be added
// again. A session not streamed is no error; the last one cannot be
// removed (cancel Run instead). Safe for concurrent use, from callbacks
// too, and before Run. It returns ErrNotMultiplexed without Sessions.
func (c *Client) RemoveSession(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mux == nil && len(c.Sessions) == 0 {
		return ErrNotMultiplexed
	}
	m := c.muxState()
	i := slices.Index(m.want, id)
	switch {
	case i < 0:
		return nil
	case len(m.want) == 1:
		return fmt.Errorf("%w: %q is the last session of the stream: cancel Run instead", ErrInvalidOption, head(id))
	}
	m.want = slices.Delete(m.want, i, i+1)
	c.restartLocked()
	return nil
}

// restartLocked ends the current connection, if any, for the next to
// start with the new sessions; an open WebSocket is told the change
// instead. The caller holds c.mu.
func (c *Client) restartLocked() {
	if c.mux != nil && c.mux.changes != nil {
		select {
		case c.mux.changes <- struct{}{}:
		default:
		}
		return
	}
	if c.restart != nil {
		c.restart(errSessionsChanged)
	}
}
