package eventbus

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// A session id names a session wherever one enters: the Hub, both stream
// routes (Handler through its Lookup, MuxHandler's session list), the demo
// daemons' routes and every backplane. They all apply one rule,
// CheckSessionID, so that an id one of them accepts is accepted by all,
// and two ids that differ are two sessions everywhere, on the wire too.
// The rule is docs/SPEC.md section 7.

// MaxSessionIDBytes bounds a session id (CheckSessionID): sessions are map
// keys, part of the engines' keys and subjects, and appear in logs.
const MaxSessionIDBytes = 256

// CheckSessionID checks a session id with the rule every entry point
// applies: 1 to MaxSessionIDBytes bytes of valid UTF-8. An id that is not
// valid UTF-8 is refused because JSON cannot carry it: encoding/json (and
// every other encoder) replaces each invalid byte with U+FFFD, so on a
// multiplexed stream "a\xff" and "a\xfe" would both be labelled
// "a\ufffd", and a client could not tell their frames apart. It returns
// nil or an error wrapping ErrInvalidSessionID whose message quotes at
// most 64 bytes of the id (escaped). It does not allocate for a valid id
// and is safe for concurrent use.
func CheckSessionID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty", ErrInvalidSessionID)
	case len(id) > MaxSessionIDBytes:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalidSessionID, len(id), MaxSessionIDBytes)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidSessionID, strconv.Quote(id[:min(len(id), 64)]))
	}
	return nil
}
