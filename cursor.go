package eventbus

import (
	"errors"

	"github.com/ssebus/eventbus/internal/muxcursor"
)

// MaxCursorEntries is the most sessions a Cursor holds, and so the most a
// MuxHandler serves on one stream (MaxStreamSessions above it means it).
const MaxCursorEntries = 256

// Cursor is a client's position in a multiplexed stream (MuxHandler): for
// each session, a tag of its id, a tag of its bus's epoch and the id of
// the last event delivered. Its text, the composite cursor, is the id: line
// of every event frame of a multiplexed stream, so a plain EventSource
// keeps it and sends it back as Last-Event-ID by itself; a client may give
// it as ?lastEventId= instead. Given back with the same sessions in the
// URL, in any order, each session resumes as its own single stream would
// (docs/SPEC.md section 6.8).
//
// The text is one opaque token of ASCII letters, digits, '-' and '_' (no
// space, comma or quote): "m1" (the format, version 1), then one group of
// 24 characters per entry, in any order. A group is the unpadded base64url
// (RFC 4648 section 5) encoding of 18 bytes, big-endian: 5 bytes of
// Session, 6 bytes of Epoch, 7 bytes of ID. So a cursor of n sessions is
// 2+24n bytes long, and each group can be read or rewritten alone.
//
// A client that keeps its own cursor (to drop a session from its URL, or
// to resume with a cursor it saved) parses it with ParseCursor, finds a
// session's entry with Entry, sets one with Set, and writes it with String
// or AppendText; entries of sessions the URL does not name are ignored by
// the server, so a cursor need not be rewritten when a session is dropped.
// A Cursor is a plain slice: not safe for concurrent modification.
type Cursor []CursorEntry

// CursorEntry is one session's position in a Cursor.
type CursorEntry struct {
	// Session is SessionTag of the session id: 40 bits.
	Session uint64
	// Epoch is EpochTag of the bus's epoch: 48 bits.
	Epoch uint64
	// ID is the id of the last event of the session delivered (0: none
	// of this epoch), at most MaxEventID.
	ID uint64
}

// SessionTag returns the tag of a session id that identifies it in a
// Cursor: the top 40 bits of the 64-bit FNV-1a hash of its bytes (UTF-8,
// as in the URL after percent-decoding). Two sessions of one stream have
// the same tag with probability about 2^-40 per pair; a MuxHandler then
// cannot tell whose entry a cursor holds, and serves both live, each after
// state_resync_required cursor_invalid when the cursor has the tag (and
// logs it).
func SessionTag(id string) uint64 { return muxcursor.SessionTag(id) }

// EpochTag returns the tag of a bus epoch in a Cursor: its first 12 hex
// digits read as a 48-bit number (every epoch is 32 lowercase hex digits
// from crypto/rand, so a recreated session's new epoch has the old tag
// with probability 2^-48). A string that does not start with 12 lowercase
// hex digits gets the top 48 bits of its 64-bit FNV-1a hash instead.
func EpochTag(epoch string) uint64 { return muxcursor.EpochTag(epoch) }

// NewCursorEntry returns the entry of session at event id of epoch.
func NewCursorEntry(session, epoch string, id uint64) CursorEntry {
	return CursorEntry{Session: SessionTag(session), Epoch: EpochTag(epoch), ID: id}
}

// ParseCursor parses a composite cursor: exactly what AppendText makes,
// "m1" and 1 to MaxCursorEntries groups of canonical base64url whose ids
// are at most MaxEventID. Anything else is an error (starting
// "eventbus: "), a single stream's Last-Event-ID ("N", "<epoch>:<N>")
// included. Entries may repeat a session tag (Entry then reports none). It
// reads s once; it allocates only the slice it returns, once, whatever
// the count.
func ParseCursor(s string) (Cursor, error) {
	if len(s) > muxcursor.Len(MaxCursorEntries) {
		return nil, errCursorTooLong
	}
	// The count comes from the length, so the result is allocated once
	// at its size and the groups are decoded straight into it.
	n, err := muxcursor.Count(s, MaxCursorEntries)
	if err != nil {
		return nil, err
	}
	c := make(Cursor, n)
	for i := range c {
		e, err := muxcursor.Group(s, i)
		if err != nil {
			return nil, err
		}
		c[i] = CursorEntry(e)
	}
	return c, nil
}

// AppendText appends the cursor's text to b (encoding.TextAppender). It
// fails for an empty cursor, more than MaxCursorEntries entries, and an
// entry out of range (Session of more than 40 bits, Epoch of more than 48,
// ID above MaxEventID).
func (c Cursor) AppendText(b []byte) ([]byte, error) {
	if len(c) > MaxCursorEntries {
		return b, errCursorTooLong
	}
	entries := make([]muxcursor.Entry, len(c))
	for i, e := range c {
		entries[i] = muxcursor.Entry(e)
	}
	return muxcursor.Append(b, entries)
}

var errCursorTooLong = errors.New("eventbus: a cursor holds at most 256 entries")

// MarshalText returns the cursor's text, as AppendText.
func (c Cursor) MarshalText() ([]byte, error) { return c.AppendText(nil) }

// UnmarshalText parses text as ParseCursor and replaces *c with it.
func (c *Cursor) UnmarshalText(text []byte) error {
	v, err := ParseCursor(string(text))
	if err != nil {
		return err
	}
	*c = v
	return nil
}

// String returns the cursor's text, or "" when AppendText fails.
func (c Cursor) String() string {
	b, err := c.AppendText(nil)
	if err != nil {
		return ""
	}
	return string(b)
}

// Entry returns the entry of session, and false when the cursor has none
// or more than one entry with its tag.
func (c Cursor) Entry(session string) (CursorEntry, bool) {
	tag := SessionTag(session)
	var found CursorEntry
	n := 0
	for _, e := range c {
		if e.Session == tag {
			found = e
			n++
		}
	}
	return found, n == 1
}

// Set returns c with session's entry set to event id of epoch: its entry
// replaced in place (every entry with its tag, should there be several),
// or a new one appended.
func (c Cursor) Set(session, epoch string, id uint64) Cursor {
	e := NewCursorEntry(session, epoch, id)
	set := false
	for i := range c {
		if c[i].Session == e.Session {
			c[i], set = e, true
		}
	}
	if !set {
		c = append(c, e)
	}
	return c
}
