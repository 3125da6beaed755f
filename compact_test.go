package eventbus

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// compactCorpus mixes valid and invalid JSON; compactJSON must agree with
// encoding/json on every one.
var compactCorpus = []string{
	`{}`, `[]`, `""`, `0`, `-0`, `1.5e+10`, `-12.75E-3`, `true`, `false`, `null`,
	` { "a" : [ 1 , 2 , { "b" : null } ] , "c" : "x y" } `,
	"{\n\t\"multi\":\r\n [1,\n2]\n}",
	`"esc \" \\ \/ \b \f \n \r \t \u00e9 \uD83D\uDE00"`,
	"\"raw utf8 é 😀 and invalid \xff bytes\"",
	`{"deep":[[[[[[[[[[1]]]]]]]]]]}`,
	// invalid
	``, ` `, `{`, `}`, `[1,]`, `{"a":1,}`, `{"a" 1}`, `{a:1}`, `01`, `1.`, `.5`, `1e`, `1e+`,
	`-`, `+1`, `tru`, `nul`, `truex`, `"unterminated`, `"bad \x escape"`, `"\u12g4"`,
	"\"raw\nnewline\"", "\"tab\tinside\"", `1 2`, `{} {}`, `[1 2]`, `{"a":1 "b":2}`, `NaN`, `Infinity`,
}

func TestCompactJSONMatchesEncodingJSON(t *testing.T) {
	for _, in := range compactCorpus {
		got, err := compactJSON([]byte("prefix:"), []byte(in))
		var want bytes.Buffer
		werr := json.Compact(&want, []byte(in))
		if werr != nil {
			assert.Error(t, err, "%q must be rejected like encoding/json does (%v)", in, werr)
			assert.Equal(t, "prefix:", string(got), "a rejected input leaves dst as it was")
			continue
		}
		require.NoError(t, err, "%q", in)
		assert.Equal(t, "prefix:"+want.String(), string(got), "%q", in)
	}
}

func TestCompactJSONDepthLimit(t *testing.T) {
	ok := strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth)
	_, err := compactJSON(nil, []byte(ok))
	assert.NoError(t, err)
	deep := "[" + ok + "]"
	_, err = compactJSON(nil, []byte(deep))
	assert.Error(t, err)
	assert.False(t, json.Valid([]byte(deep)), "encoding/json has the same limit")
}

func TestCompactJSONDoesNotAllocate(t *testing.T) {
	src := []byte(` {"session": "s1", "seq": 12345, "list": [1, 2.5, true, null]} `)
	dst := make([]byte, 0, 256)
	allocs := testing.AllocsPerRun(100, func() { _, _ = compactJSON(dst[:0], src) })
	assert.Zero(t, allocs)
}

func FuzzCompactJSON(f *testing.F) {
	for _, in := range compactCorpus {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		got, err := compactJSON(nil, in)
		var want bytes.Buffer
		werr := json.Compact(&want, in)
		if (err == nil) != (werr == nil) {
			t.Fatalf("%q: compactJSON err %v, encoding/json err %v", in, err, werr)
		}
		if err == nil && !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("%q: got %q, want %q", in, got, want.Bytes())
		}
		if err == nil && bytes.ContainsAny(got, "\r\n") {
			t.Fatalf("%q: compacted JSON holds a raw CR or LF", in)
		}
	})
}
