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
	start := c.i
	c.i++ // opening quote
	for c.i < len(c.src) {
		// Plain bytes, the common case, in a loop over locals: the
		// fields of c would be reloaded at every byte.
		src, i := c.src, c.i
		for i < len(src) && plainStringByte[src[i]] {
			i++
		}
		c.i = i
		if i == len(src) {
			break
		}
		b := src[i]
		switch {
		case b == '"':
			c.i++
			c.dst = append(c.dst, c.src[start:c.i]...)
			return nil
		case b == '\\':
			c.i++
			if c.i >= len(c.src) {
				return c.errorf("")
			}
			switch c.src[c.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				c.i++
			case 'u':
				c.i++
				for range 4 {
					if c.i >= len(c.src) || !isHex(c.src[c.i]) {
						return c.errorf("in \\u hexadecimal character escape")
					}
					c.i++
				}
			default:
				return c.errorf("in string escape code")
			}
		default: // a control character
			return c.errorf("in string literal")
		}
	}
	return c.errorf("")
}

func isHex(b byte) bool {
	return b >= '0' && b <= '9' || b >= 'a' && b <= 'f' || b >= 'A' && b <= 'F'
}

func (c *compactor) number() error {
	start := c.i
	if c.src[c.i] == '-' {
		c.i++
	}
	switch {
	case c.i < len(c.src) && c.src[c.i] == '0':
		c.i++
	case c.i < len(c.src) && c.src[c.i] >= '1' && c.src[c.i] <= '9':
		c.digits()
	default:
		return c.errorf("in numeric literal")
	}
	if c.i < len(c.src) && c.src[c.i] == '.' {
		c.i++
		if c.i >= len(c.src) || c.src[c.i] < '0' || c.src[c.i] > '9' {
			return c.errorf("after decimal point in numeric literal")
		}
		c.digits()
	}
	if c.i < len(c.src) && (c.src[c.i] == 'e' || c.src[c.i] == 'E') {
		c.i++
		if c.i < len(c.src) && (c.src[c.i] == '+' || c.src[c.i] == '-') {
			c.i++
		}
		if c.i >= len(c.src) || c.src[c.i] < '0' || c.src[c.i] > '9' {
			return c.errorf("in exponent of numeric literal")
		}
		c.digits()
	}
	c.dst = append(c.dst, c.src[start:c.i]...)
	return nil
}

func (c *compactor) digits() {
	for c.i < len(c.src) && c.src[c.i] >= '0' && c.src[c.i] <= '9' {
		c.i++
	}
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
		if i = scanString(src, i); i < 0 {
			return false
		}
	case c == '-' || '0' <= c && c <= '9':
		if i = scanNumber(src, i); i < 0 {
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
	if i = scanString(src, i); i < 0 || i >= n || src[i] != ':' {
		return false
	}
	i++
	goto value
}

// scanString returns the index after the JSON string that starts at
// src[i] (its opening quote), or -1 if it is not a valid one.
func scanString(src []byte, i int) int {
	n := len(src)
	for i++; i < n; {
		for i < n && plainStringByte[src[i]] {
			i++
		}
		if i >= n {
			break
		}
		b := src[i]
		switch {
		case b == '"':
			return i + 1
		case b == '\\':
			if i+1 >= n {
				return -1
			}
			switch src[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if n-i < 6 || !isHex(src[i+2]) || !isHex(src[i+3]) || !isHex(src[i+4]) || !isHex(src[i+5]) {
					return -1
				}
				i += 6
			default:
				return -1
			}
		case b < 0x20:
			return -1
		default:
			i++
		}
	}
	return -1
}

// scanNumber returns the index after the JSON number that starts at src[i],
// or -1 if it is not a valid one.
func scanNumber(src []byte, i int) int {
	n := len(src)
	if src[i] == '-' {
		i++
	}
	switch {
	case i < n && src[i] == '0':
		i++
	case i < n && '1' <= src[i] && src[i] <= '9':
		for i++; i < n && '0' <= src[i] && src[i] <= '9'; i++ {
		}
	default:
		return -1
	}
	if i < n && src[i] == '.' {
		i++
		if i >= n || src[i] < '0' || src[i] > '9' {
			return -1
		}
		for i++; i < n && '0' <= src[i] && src[i] <= '9'; i++ {
		}
	}
	if i < n && (src[i] == 'e' || src[i] == 'E') {
		i++
		if i < n && (src[i] == '+' || src[i] == '-') {
			i++
		}
		if i >= n || src[i] < '0' || src[i] > '9' {
			return -1
		}
		for i++; i < n && '0' <= src[i] && src[i] <= '9'; i++ {
		}
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
