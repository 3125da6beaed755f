// Package muxcursor is the codec of the composite cursor of a multiplexed
// stream (package eventbus's Cursor): one ASCII token that holds, for each
// session of the stream, a tag of its id, a tag of its bus epoch and the
// id of the last event delivered. It is internal to this module so that
// package eventbus (the server) and its Go client share one
// implementation; both export their own types over it.
//
// The token is Prefix followed by one EntryLen-character group per
// session. A group is the unpadded base64url (RFC 4648 section 5) encoding
// of 18 bytes, big-endian: 5 bytes of SessionTag, 6 bytes of EpochTag, 7
// bytes of the event id (at most MaxID). Every group is independent of the
// others, so a writer that keeps the token rewrites one group per event.
package muxcursor

import (
	"encoding/base64"
	"errors"
	"slices"
	"strconv"
)

const (
	// Prefix starts every token: the format and its version.
	Prefix = "m1"
	// EntryLen is the length of one session's group in a token.
	EntryLen = 24
	// entryBytes is a group before base64url.
	entryBytes = 18
	// MaxID is the largest event id a group holds (2^53-1).
	MaxID = 1<<53 - 1
	// SessionBits and EpochBits are the widths of the two tags.
	SessionBits = 40
	EpochBits   = 48
)

// Entry is one session's group.
type Entry struct {
	Session uint64 // SessionTag of the session id: SessionBits bits
	Epoch   uint64 // EpochTag of the bus epoch: EpochBits bits
	ID      uint64 // the last event id delivered, at most MaxID
}

// Len returns the length of a token of n entries.
func Len(n int) int { return len(Prefix) + n*EntryLen }

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// fnv64a is FNV-1a, 64 bits, over the bytes of s.
func fnv64a(s string) uint64 {
	h := uint64(fnvOffset)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	return h
}

// SessionTag returns the tag of a session id: the top SessionBits bits of
// the 64-bit FNV-1a hash of its bytes (UTF-8, as in the URL after
// percent-decoding).
func SessionTag(id string) uint64 { return fnv64a(id) >> (64 - SessionBits) }

// EpochTag returns the tag of a bus epoch: its first 12 hex digits as a
// number when it starts with 12 lowercase hex digits (every epoch a bus
// has: 32 of them, from crypto/rand), else the top EpochBits bits of the
// 64-bit FNV-1a hash of its bytes.
func EpochTag(epoch string) uint64 {
	const digits = EpochBits / 4
	if len(epoch) >= digits {
		var v uint64
		ok := true
		for i := 0; i < digits && ok; i++ {
			c := epoch[i]
			switch {
			case '0' <= c && c <= '9':
				v = v<<4 | uint64(c-'0')
			case 'a' <= c && c <= 'f':
				v = v<<4 | uint64(c-'a'+10)
			default:
				ok = false
			}
		}
		if ok {
			return v
		}
	}
	return fnv64a(epoch) >> (64 - EpochBits)
}

// Valid reports whether e fits its group.
func (e Entry) Valid() bool {
	return e.Session < 1<<SessionBits && e.Epoch < 1<<EpochBits && e.ID <= MaxID
}

// Put writes e's group into dst[:EntryLen]. e must be Valid.
func Put(dst []byte, e Entry) {
	var b [entryBytes]byte
	putUint(b[0:5], e.Session)
	putUint(b[5:11], e.Epoch)
	putUint(b[11:18], e.ID)
	base64.RawURLEncoding.Encode(dst[:EntryLen], b[:])
}

// Append appends the token of entries to dst. It returns an error when an
// entry is not Valid, or when there is none.
func Append(dst []byte, entries []Entry) ([]byte, error) {
	if len(entries) == 0 {
		return dst, errors.New("eventbus: a cursor needs at least one entry")
	}
	n := len(dst)
	dst = append(dst, Prefix...)
	for i, e := range entries {
		if !e.Valid() {
			return dst[:n], errors.New("eventbus: cursor entry " + strconv.Itoa(i) + " out of range")
		}
		at := len(dst)
		dst = append(dst, make([]byte, EntryLen)...)
		Put(dst[at:], e)
	}
	return dst, nil
}

// Parse appends the entries of token s to dst. It accepts exactly what
// Append makes: Prefix, then 1 to maxEntries groups of canonical base64url
// whose ids are at most MaxID. It reads s once; it grows dst at most once,
// to hold every entry (Count), and allocates nothing else. On an error it
// returns dst with the entries before the bad group.
func Parse(s string, maxEntries int, dst []Entry) ([]Entry, error) {
	n, err := Count(s, maxEntries)
	if err != nil {
		return dst, err
	}
	dst = slices.Grow(dst, n)
	for i := range n {
		e, err := Group(s, i)
		if err != nil {
			return dst, err
		}
		dst = append(dst, e)
	}
	return dst, nil
}

// Count returns how many groups token s holds after checking its prefix
// and length (1 to maxEntries groups), without decoding them: a caller
// sizes the entries it will decode with Group. It does not allocate on
// success.
func Count(s string, maxEntries int) (int, error) {
	if len(s) < len(Prefix) || s[:len(Prefix)] != Prefix {
		return 0, errors.New("eventbus: cursor does not start with " + strconv.Quote(Prefix))
	}
	body := s[len(Prefix):]
	n := len(body) / EntryLen
	switch {
	case len(body)%EntryLen != 0:
		return 0, errors.New("eventbus: cursor length is not " + strconv.Itoa(len(Prefix)) + " + " + strconv.Itoa(EntryLen) + "×n")
	case n == 0:
		return 0, errors.New("eventbus: cursor has no entry")
	case n > maxEntries:
		return 0, errors.New("eventbus: cursor has " + strconv.Itoa(n) + " entries, more than " + strconv.Itoa(maxEntries))
	}
	return n, nil
}

// strict is the group encoding: base64url without padding, whose unused
// low bits must be zero, so that one entry has one text. One value for
// every call: Strict returns a copy of the Encoding (over 300 bytes).
var strict = base64.RawURLEncoding.Strict()

// Group decodes the i-th group of token s, which Count accepted with more
// than i groups. It fails for a group that is not canonical base64url or
// whose id is above MaxID. It does not allocate on success.
func Group(s string, i int) (Entry, error) {
	var b [entryBytes]byte
	at := len(Prefix) + i*EntryLen
	if k, err := strict.Decode(b[:], []byte(s[at:at+EntryLen])); err != nil || k != entryBytes {
		return Entry{}, errors.New("eventbus: cursor entry " + strconv.Itoa(i) + " is not base64url")
	}
	e := Entry{Session: getUint(b[0:5]), Epoch: getUint(b[5:11]), ID: getUint(b[11:18])}
	if e.ID > MaxID {
		return Entry{}, errors.New("eventbus: cursor entry " + strconv.Itoa(i) + " has an id above 2^53-1")
	}
	return e, nil
}

func putUint(b []byte, v uint64) {
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = byte(v)
		v >>= 8
	}
}

func getUint(b []byte) uint64 {
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}
