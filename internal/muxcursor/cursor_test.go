package muxcursor

import (
	"encoding/base64"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The tags are fixed functions: these vectors are what another
// implementation of the cursor (the JavaScript client) checks itself
// against.
func TestCursorTagVectors(t *testing.T) {
	for _, tc := range []struct {
		id  string
		tag uint64
	}{
		{"", 0xcbf29ce484},       // FNV-1a 64's offset basis, top 40 bits
		{"a", 0xaf63dc4c86},      // FNV-1a 64("a") = 0xaf63dc4c8601ec8c
		{"c", 0xaf63de4c86},      // 0xaf63de4c8601eff2
		{"foobar", 0x85944171f7}, // 0x85944171f73967e8
		{"\u00e9", 0x0ac21707b7}, // "é": its UTF-8 bytes c3 a9
	} {
		require.Equal(t, tc.tag, SessionTag(tc.id), "SessionTag(%q)", tc.id)
		require.Equal(t, fnv1a64([]byte(tc.id))>>24, tc.tag)
	}
	require.Equal(t, uint64(0x0123456789ab), EpochTag("0123456789abcdef0123456789abcdef"))
	require.Equal(t, fnv1a64([]byte("NOT-HEX-EPOCH"))>>16, EpochTag("NOT-HEX-EPOCH"))
	require.Equal(t, fnv1a64([]byte("0123456789AB"))>>16, EpochTag("0123456789AB"), "upper-case hex is no epoch")

	// One whole cursor, byte for byte.
	c := Cursor{{Session: 0xaf63dc4c86, Epoch: 0x0123456789ab, ID: 42}}
	require.Equal(t, "m1r2PcTIYBI0VniasAAAAAAAAq", c.String())
}

// fnv1a64 is FNV-1a, written out again from its definition for the
// vectors.
func fnv1a64(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return h
}

func TestCursorRoundTrip(t *testing.T) {
	epoch := testEpoch()
	c := Cursor{}
	for i, id := range []string{"a", "b", strings.Repeat("long", 100)} {
		c = c.Set(id, epoch, uint64(i)*1000)
	}
	c = c.Set("a", epoch, MaxID)
	require.Len(t, c, 3, "Set replaces an entry in place")
	text, err := Append(nil, c)
	require.NoError(t, err)
	require.Len(t, text, 2+24*3)
	require.Regexp(t, `^m1[A-Za-z0-9_-]+$`, string(text))
	got, err := ParseCursor(string(text))
	require.NoError(t, err)
	require.Equal(t, c, got)
	e, ok := got.Entry("a")
	require.True(t, ok)
	require.Equal(t, NewEntry("a", epoch, MaxID), e)
	_, ok = got.Entry("absent")
	require.False(t, ok)

	// Every group stands alone: a cursor's groups in another order parse
	// to the same entries, in that order.
	swapped := "m1" + string(text[2+24:2+48]) + string(text[2:2+24]) + string(text[2+48:])
	got, err = ParseCursor(swapped)
	require.NoError(t, err)
	require.Equal(t, Cursor{c[1], c[0], c[2]}, got)

	// An ambiguous cursor names neither session.
	dup := Cursor{c[0], c[0]}
	got, err = ParseCursor(dup.String())
	require.NoError(t, err)
	_, ok = got.Entry("a")
	require.False(t, ok)
}

func TestCursorInvalid(t *testing.T) {
	good := Cursor{NewEntry("a", testEpoch(), 7)}.String()
	// An id of 2^53, one past MaxID.
	over := "m1" + base64.RawURLEncoding.EncodeToString([]byte{10: 0, 11: 0x20, 17: 0})
	for _, s := range []string{
		"", "m1", "m2" + good[2:], "M1" + good[2:], good[:len(good)-1], good + "A",
		good[:10] + "=" + good[11:], good[:10] + "+" + good[11:], good[:10] + " " + good[11:],
		"7", "0123456789abcdef0123456789abcdef:7", over,
		"m1" + strings.Repeat("A", 24*(MaxEntries+1)),
	} {
		_, err := ParseCursor(s)
		require.Error(t, err, "%q", s)
		require.True(t, strings.HasPrefix(err.Error(), "eventbus: "), err.Error())
	}
	for _, c := range []Cursor{
		nil,
		{{Session: 1 << 40}},
		{{Epoch: 1 << 48}},
		{{ID: MaxID + 1}},
		make(Cursor, MaxEntries+1),
	} {
		if len(c) <= MaxEntries {
			_, err := Append(nil, c)
			require.Error(t, err, "%v", c)
		}
		require.Empty(t, c.String())
	}
	require.NotEmpty(t, make(Cursor, MaxEntries).String(), "MaxEntries entries fit")
}

// ParseCursor accepts exactly what Append makes: whatever it parses,
// written again, is the same text.
func FuzzParseCursor(f *testing.F) {
	f.Add(Cursor{NewEntry("a", testEpoch(), 7)}.String())
	f.Add("m1" + strings.Repeat("_", 48))
	f.Add("m1AAAAAAAAAAAAAAAAAAAAAAAB")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseCursor(s)
		if err != nil {
			return
		}
		require.Equal(t, s, c.String())
	})
}

// ParseCursor allocates the Cursor it returns and nothing else, once,
// whatever the count (issue 32: it grew a buffer through 6 allocations,
// 18,048 bytes, at 256 entries).
func TestParseCursorAllocatesOnce(t *testing.T) {
	epoch := testEpoch()
	for _, n := range []int{1, 8, MaxEntries} {
		var c Cursor
		for i := range n {
			c = c.Set("session-"+strconv.Itoa(i), epoch, uint64(i)*7)
		}
		s := c.String()
		var got Cursor
		allocs := testing.AllocsPerRun(100, func() {
			var err error
			if got, err = ParseCursor(s); err != nil {
				t.Fatal(err)
			}
		})
		require.Equal(t, c, got)
		require.Equal(t, 1.0, allocs, "%d entries", n)
	}
}

// testEpoch is an epoch as a bus has one: 32 lowercase hex digits.
func testEpoch() string { return "0123456789abcdef0123456789abcdef" }
