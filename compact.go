package eventbus

import (
	"errors"
	"strconv"
)

// maxJSONDepth is encoding/json's nesting limit; deeper input is rejected
// the same way.
const maxJSONDepth = 10000

var errJSONDepth = errors.New("exceeded max depth")

// compactJSON appends src to dst with insignificant whitespace removed,
// after checking that src is exactly one valid JSON value. It accepts and
// produces what encoding/json's Valid and Compact do (strings are copied
// byte for byte: no re-escaping, no UTF-8 validation), in one pass and
// without allocating beyond dst's growth. Publish uses it for the
// json.RawMessage a daemon hands in, on its hot path.
func compactJSON(dst, src []byte) ([]byte, error) {
	if compactValid(src) {
		return append(dst, src...), nil
	}
	c := compactor{src: src, dst: dst}
	c.space()
	if err := c.value(0); err != nil {
		return dst, err
	}
	c.space()
	if c.i != len(src) {
		return dst, c.errorf("after top-level value")
	}
	return c.dst, nil
}

type compactor struct {
	src []byte
	dst []byte
	i   int
}

func (c *compactor) errorf(where string) error {
	if c.i >= len(c.src) {
		return errors.New("unexpected end of JSON input")
	}
	return errors.New("invalid character " + strconv.QuoteRune(rune(c.src[c.i])) + " " + where)
}

func (c *compactor) space() {
	for c.i < len(c.src) {
		switch c.src[c.i] {
		case ' ', '\t', '\n', '\r':
			c.i++
		default:
			return
		}
	}
}

func (c *compactor) value(depth int) error {
	if c.i >= len(c.src) {
		return c.errorf("")
	}
	switch b := c.src[c.i]; {
	case b == '{':
		return c.object(depth + 1)
	case b == '[':
		return c.array(depth + 1)
	case b == '"':
		return c.string()
	case b == '-' || b >= '0' && b <= '9':
		return c.number()
	case b == 't':
		return c.literal("true")
	case b == 'f':
		return c.literal("false")
	case b == 'n':
		return c.literal("null")
	}
	return c.errorf("looking for beginning of value")
}

func (c *compactor) literal(lit string) error {
	if len(c.src)-c.i < len(lit) || string(c.src[c.i:c.i+len(lit)]) != lit {
		for k := 0; k < len(lit) && c.i < len(c.src) && c.src[c.i] == lit[k]; k++ {
			c.i++
		}
		return c.errorf("in literal " + lit)
	}
	c.dst = append(c.dst, lit...)
	c.i += len(lit)
	return nil
}

func (c *compactor) object(depth int) error {
	if empty, err := c.open(depth, '{', '}'); empty || err != nil {
		return err
	}
	for {
		if c.i >= len(c.src) || c.src[c.i] != '"' {
			return c.errorf("looking for beginning of object key string")
		}
		if err := c.string(); err != nil {
			return err
		}
		c.space()
		if c.i >= len(c.src) || c.src[c.i] != ':' {
			return c.errorf("after object key")
		}
		c.dst = append(c.dst, ':')
		c.i++
		c.space()
		if err := c.value(depth); err != nil {
			return err
		}
		if done, err := c.next('}', "after object key:value pair"); done || err != nil {
			return err
		}
	}
}

func (c *compactor) array(depth int) error {
	if empty, err := c.open(depth, '[', ']'); empty || err != nil {
		return err
	}
	for {
		if err := c.value(depth); err != nil {
			return err
		}
		if done, err := c.next(']', "after array element"); done || err != nil {
			return err
		}
	}
}

// open copies the opening byte of an object or array and reports whether
// the container is empty (its closing byte follows, and is copied too).
func (c *compactor) open(depth int, opener, closer byte) (empty bool, err error) {
	if depth > maxJSONDepth {
		return false, errJSONDepth
	}
	c.dst = append(c.dst, opener)
	c.i++
	c.space()
	if c.i < len(c.src) && c.src[c.i] == closer {
		c.dst = append(c.dst, closer)
		c.i++
		return true, nil
	}
	return false, nil
}

// next reads what follows a member or element: a comma (more follow) or the
// closing byte (done).
func (c *compactor) next(closer byte, where string) (done bool, err error) {
	c.space()
	if c.i >= len(c.src) {
		return false, c.errorf("")
	}
	switch c.src[c.i] {
	case ',':
		c.dst = append(c.dst, ',')
		c.i++
		c.space()
		return false, nil
	case closer:
		c.dst = append(c.dst, closer)
		c.i++
		return true, nil
	}
	return false, c.errorf(where)
}

// string copies a JSON string, checking escapes and rejecting control
// characters (a raw CR or LF can therefore never reach the wire).
func (c *compactor) string() error {
	end, where := scanString(c.src, c.i)
	return c.copyTo(end, where)
}

// copyTo copies the token that ends at end, or, when where is not empty
// (the scanner's failure at end), reports the error there.
func (c *compactor) copyTo(end int, where string) error {
	if where != "" {
		c.i = end
		return c.errorf(where)
	}
	c.dst = append(c.dst, c.src[c.i:end]...)
	c.i = end
	return nil
}

func isHex(b byte) bool {
	return b >= '0' && b <= '9' || b >= 'a' && b <= 'f' || b >= 'A' && b <= 'F'
}

func (c *compactor) number() error {
	end, where := scanNumber(c.src, c.i)
	return c.copyTo(end, where)
}

// compactValid reports whether src is one valid JSON value with no
// insignificant whitespace, nested at most 64 deep: then compactJSON's
// result is src itself. Daemons mostly hand in JSON that some encoder
// wrote, which is already compact, so this is the common case; checking it
// without writing anything, in one loop over locals, is about twice as
// fast as the compactor's token-by-token copy (BenchmarkCompactJSON). A
// false only means "take the compactor", which also reports the error.
func compactValid(src []byte) bool {
	var (
		stack uint64 // one bit per open container: 1 object, 0 array
		depth int
		i     int
		n     = len(src)
	)
value:
	if i >= n {
		return false
	}
	switch c := src[i]; {
	case c == '{' || c == '[':
		if depth == 64 {
			return false
		}
		object, closer := uint64(0), byte(']')
		if c == '{' {
			object, closer = 1, '}'
		}
		stack, depth = stack<<1|object, depth+1
		i++
		if i < n && src[i] == closer {
			i++
			stack, depth = stack>>1, depth-1
			goto after
		}
		if object == 1 {
			goto key
		}
		goto value
	case c == '"':
		var where string
		if i, where = scanString(src, i); where != "" {
			return false
		}
	case c == '-' || '0' <= c && c <= '9':
		var where string
		if i, where = scanNumber(src, i); where != "" {
			return false
		}
	case c == 't':
		if n-i < 4 || string(src[i:i+4]) != "true" {
			return false
		}
		i += 4
	case c == 'f':
		if n-i < 5 || string(src[i:i+5]) != "false" {
			return false
		}
		i += 5
	case c == 'n':
		if n-i < 4 || string(src[i:i+4]) != "null" {
			return false
		}
		i += 4
	default:
		return false
	}
after:
	if depth == 0 {
		return i == n
	}
	if i >= n {
		return false
	}
	switch c := src[i]; {
	case c == ',':
		i++
		if stack&1 == 1 {
			goto key
		}
		goto value
	case c == '}' && stack&1 == 1, c == ']' && stack&1 == 0:
		i++
		stack, depth = stack>>1, depth-1
		goto after
	}
	return false
key:
	if i >= n || src[i] != '"' {
		return false
	}
	i, where := scanString(src, i)
	if where != "" || i >= n || src[i] != ':' {
		return false
	}
	i++
	goto value
}

// scanString scans the JSON string that starts at src[i] (its opening
// quote) and returns the index after it, and an empty where. If it is not
// a valid string, end is where it goes wrong and where says how, in
// encoding/json's words ("in string literal"); an end at len(src) means
// the input ended first.
func scanString(src []byte, i int) (end int, where string) {
	n := len(src)
	for i++; i < n; {
		for i < n && plainStringByte[src[i]] {
			i++
		}
		if i >= n {
			break
		}
		switch b := src[i]; {
		case b == '"':
			return i + 1, ""
		case b == '\\':
			i++
			if i >= n {
				return n, "in string escape code"
			}
			switch src[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				i++
				for range 4 {
					if i >= n || !isHex(src[i]) {
						return i, `in \u hexadecimal character escape`
					}
					i++
				}
			default:
				return i, "in string escape code"
			}
		default: // a control character
			return i, "in string literal"
		}
	}
	return n, "in string literal"
}

// scanNumber scans the JSON number that starts at src[i] and returns the
// index after it, and an empty where; or, if it is not a valid number,
// where it goes wrong and how (see scanString).
func scanNumber(src []byte, i int) (end int, where string) {
	n := len(src)
	if src[i] == '-' {
		i++
	}
	switch {
	case i < n && src[i] == '0':
		i++
	case i < n && '1' <= src[i] && src[i] <= '9':
		i = scanDigits(src, i+1)
	default:
		return i, "in numeric literal"
	}
	if i < n && src[i] == '.' {
		i++
		if i >= n || src[i] < '0' || src[i] > '9' {
			return i, "after decimal point in numeric literal"
		}
		i = scanDigits(src, i+1)
	}
	if i < n && (src[i] == 'e' || src[i] == 'E') {
		i++
		if i < n && (src[i] == '+' || src[i] == '-') {
			i++
		}
		if i >= n || src[i] < '0' || src[i] > '9' {
			return i, "in exponent of numeric literal"
		}
		i = scanDigits(src, i+1)
	}
	return i, ""
}

// scanDigits returns the index of the first non-digit at or after i.
func scanDigits(src []byte, i int) int {
	for i < len(src) && '0' <= src[i] && src[i] <= '9' {
		i++
	}
	return i
}

// plainStringByte is true for the bytes a JSON string holds as they are:
// not the quote, not the backslash, not a control character.
var plainStringByte = func() (t [256]bool) {
	for b := 0x20; b < 256; b++ {
		t[b] = b != '"' && b != '\\'
	}
	return t
}()
