package eventbus

import "github.com/ssebus/eventbus/internal/muxcursor"

// The composite cursor's codec is internal/muxcursor's (the server and the
// Go client share it); the tests of this package read and build cursors
// with it under the names it had when it was exported here.
type (
	Cursor      = muxcursor.Cursor
	CursorEntry = muxcursor.Entry
)

var (
	ParseCursor    = muxcursor.ParseCursor
	NewCursorEntry = muxcursor.NewEntry
	SessionTag     = muxcursor.SessionTag
	EpochTag       = muxcursor.EpochTag
)
