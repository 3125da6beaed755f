package eventbus

import "github.com/ssebus/eventbus/internal/muxcursor"

// MaxCursorEntries is the most sessions a composite cursor (the id: line
// of a multiplexed stream, docs/SPEC.md section 6.8) holds, and so the most
// a MuxHandler serves on one stream (MaxStreamSessions above it means it).
// The cursor is an opaque token to a client; the Go client (sseclient) and
// the JavaScript client keep it, and the server's codec, which the Go
// client shares, is internal.
const MaxCursorEntries = muxcursor.MaxEntries
