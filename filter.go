package eventbus

import (
	"fmt"
	"strings"
)

// Limits of a subscription's type filters (docs/SPEC.md section 2.4).
const (
	// MaxTypeFilters is how many filters one subscription may list.
	MaxTypeFilters = 32
	// MaxTypeFilterBytes is the longest filter accepted.
	MaxTypeFilterBytes = 256
)

// typeFilter is a compiled list of type filters: exact types and
// trailing-wildcard prefixes. The nil filter matches everything.
type typeFilter struct {
	exact    []string
	prefixes []string // each ends with "."
}

// CheckTypeFilters validates type filters as Subscribe does
// (SubscribeOptions.Types), without subscribing: a transport checks a
// client's filters before it looks the session up, so a bad one is a 400
// however the rest of the request fares. It returns nil or an error
// wrapping ErrInvalidFilter that names the first invalid filter. It is safe
// for concurrent use.
func CheckTypeFilters(filters []string) error {
	_, err := compileFilters(filters)
	return err
}

// compileFilters validates filters. An empty list compiles to nil (match
// everything). An invalid filter is an error wrapping ErrInvalidFilter that
// names it.
func compileFilters(filters []string) (*typeFilter, error) {
	if len(filters) == 0 {
		return nil, nil
	}
	if len(filters) > MaxTypeFilters {
		return nil, fmt.Errorf("%w: %d filters, at most %d", ErrInvalidFilter, len(filters), MaxTypeFilters)
	}
	f := &typeFilter{}
	for _, s := range filters {
		if err := validFilter(s); err != nil {
			return nil, err
		}
		if p, ok := strings.CutSuffix(s, "*"); ok {
			f.prefixes = append(f.prefixes, p)
		} else {
			f.exact = append(f.exact, s)
		}
	}
	return f, nil
}

// validFilter checks one filter: an exact type (the bytes of a valid event
// type, without '*'; a reserved type is accepted, and matches no event),
// or a wildcard: one or more segments of [a-z0-9_]+ joined by dots, then
// ".*".
func validFilter(s string) error {
	bad := func(why string) error {
		return fmt.Errorf("%w: %q: %s", ErrInvalidFilter, truncate(s, 64), why)
	}
	if len(s) > MaxTypeFilterBytes {
		return bad(fmt.Sprintf("longer than %d bytes", MaxTypeFilterBytes))
	}
	if checkTypeBytes(s) != nil {
		return bad("empty or contains CR or LF")
	}
	prefix, wild := strings.CutSuffix(s, ".*")
	if !wild {
		if strings.Contains(s, "*") {
			return bad(`"*" is only allowed as the whole last segment, after a dot`)
		}
		return nil
	}
	for seg := range strings.SplitSeq(prefix, ".") {
		if seg == "" {
			return bad("empty segment")
		}
		for i := 0; i < len(seg); i++ {
			if c := seg[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
				return bad("wildcard segments are [a-z0-9_]+")
			}
		}
	}
	return nil
}

// match reports whether typ passes the filter. It is O(filters) and does
// not allocate.
func (f *typeFilter) match(typ string) bool {
	if f == nil {
		return true
	}
	for _, e := range f.exact {
		if typ == e {
			return true
		}
	}
	for _, p := range f.prefixes {
		// "a.b.*" matches "a.b.x" but not "a.b" (shorter than the prefix)
		// nor "a.b." (nothing after the dot).
		if len(typ) > len(p) && strings.HasPrefix(typ, p) {
			return true
		}
	}
	return false
}
