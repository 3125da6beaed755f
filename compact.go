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
		for i < len(src) && src[i] >= 0x20 && src[i] != '"' && src[i] != '\\' {
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
