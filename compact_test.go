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
		// The fast path accepts exactly the valid, already compact values
		// up to its depth: never an invalid one, and never falls back
		// needlessly.
		fast := werr == nil && bytes.Equal(want.Bytes(), in) && jsonDepth(in) <= 64
		if compactValid(in) != fast {
			t.Fatalf("%q: compactValid %v, want %v (valid %v, depth %d)", in, !fast, fast, werr == nil, jsonDepth(in))
		}
	})
}

// jsonDepth is the deepest nesting of objects and arrays in valid JSON.
func jsonDepth(in []byte) int {
	depth, deepest, inString := 0, 0, false
	for i := 0; i < len(in); i++ {
		switch c := in[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			depth++
			deepest = max(deepest, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return deepest
}

func TestCompactValidFastPath(t *testing.T) {
	for _, in := range []string{string(benchData), `{}`, `[]`, `[[],{}]`, `{"a":{"b":[1,-2.5e+3,true,false,null,"x\u00e9\n"]}}`,
		strings.Repeat("[", 64) + strings.Repeat("]", 64)} {
		assert.True(t, compactValid([]byte(in)), "%s", in)
	}
	for _, in := range []string{` {}`, `{} `, `{"a": 1}`, `[1, 2]`, `{"a":1,}`, `[1,]`, `{"a"}`, `{1:2}`, `[}`, `{]`,
		strings.Repeat("[", 65) + strings.Repeat("]", 65)} {
		assert.False(t, compactValid([]byte(in)), "%s", in)
	}
	// Deeper than the fast path goes, compactJSON still accepts it.
	deep := strings.Repeat("[", 65) + strings.Repeat("]", 65)
	got, err := compactJSON(nil, []byte(deep))
	require.NoError(t, err)
	assert.Equal(t, deep, string(got))
}

// BenchmarkCompactJSON is the validation and compaction of a
// json.RawMessage payload: already compact (the fast path), and with
// whitespace (the compactor).
func BenchmarkCompactJSON(b *testing.B) {
	spaced := []byte(`{ "session": "s1", "seq": 12345, "text": "hello, world" }`)
	for _, c := range []struct {
		name string
		src  []byte
	}{{"compact", benchData}, {"spaced", spaced}} {
		b.Run(c.name, func(b *testing.B) {
			dst := make([]byte, 0, 256)
			b.ReportAllocs()
			b.SetBytes(int64(len(c.src)))
			for b.Loop() {
				dst, _ = compactJSON(dst[:0], c.src)
			}
		})
	}
}
