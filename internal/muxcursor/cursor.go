package muxcursor

import "errors"

// MaxEntries is the most entries a cursor holds (eventbus.MaxCursorEntries).
const MaxEntries = 256

// Cursor is a parsed composite cursor: every session's entry. The server
// (package eventbus) and the tests of this module read and build cursors
// with it; a client keeps its own (sseclient, the JS client's cursor.js).
// A plain slice: not safe for concurrent modification.
type Cursor []Entry

// NewEntry returns the entry of session at event id of epoch.
func NewEntry(session, epoch string, id uint64) Entry {
	return Entry{Session: SessionTag(session), Epoch: EpochTag(epoch), ID: id}
}

var errTooLong = errors.New("eventbus: a cursor holds at most 256 entries")

// ParseCursor parses a composite cursor: exactly what Append makes, Prefix
// and 1 to MaxEntries groups of canonical base64url whose ids are at most
// MaxID. Anything else is an error (starting "eventbus: "), a single
// stream's Last-Event-ID ("N", "<epoch>:<N>") included. Entries may repeat
// a session tag (Entry then reports none). It reads s once and allocates
// only the slice it returns, once, whatever the count.
func ParseCursor(s string) (Cursor, error) {
	if len(s) > Len(MaxEntries) {
		return nil, errTooLong
	}
	// The count comes from the length, so the result is allocated once at
	// its size and the groups are decoded straight into it.
	n, err := Count(s, MaxEntries)
	if err != nil {
		return nil, err
	}
	c := make(Cursor, n)
	for i := range c {
		if c[i], err = Group(s, i); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// String returns the cursor's text, or "" when it cannot have one (no
// entry, more than MaxEntries, an entry out of range).
func (c Cursor) String() string {
	if len(c) > MaxEntries {
		return ""
	}
	b, err := Append(nil, c)
	if err != nil {
		return ""
	}
	return string(b)
}

// Entry returns the entry of session, and false when the cursor has none
// or more than one entry with its tag.
func (c Cursor) Entry(session string) (Entry, bool) {
	tag := SessionTag(session)
	var found Entry
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
	e := NewEntry(session, epoch, id)
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
