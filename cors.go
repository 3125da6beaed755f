package eventbus

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultCORSMaxAge is how long a browser may cache the answer to a
// preflight when CORS.MaxAge is 0.
const DefaultCORSMaxAge = 10 * time.Minute

// corsHeaders are the request headers a preflight may always name: the
// resume cursor, the epoch, and what fetch-based SSE clients add.
var corsHeaders = []string{"Last-Event-ID", "Event-Epoch", "Cache-Control", "Accept"}

// CORS lets pages of other origins read a Handler's stream (the CORS
// protocol of the Fetch standard). Set it as Handler.CORS; it must not
// change while the handler serves, and it is read concurrently.
//
// A request without an Origin header, or whose Origin names the request's
// own host, is served as without CORS. An allowed origin gets
// Access-Control-Allow-Origin with that origin (never "*") on the stream
// and on every error answer; another origin is refused with 403 before the
// bus is looked up, so a refused page takes no subscriber slot and learns
// nothing about the session. A preflight is answered without Lookup or
// Authorize. The headers, the preflight's rules and the answers are in
// docs/SPEC.md section 6.4.
//
// The zero CORS allows no other origin (only same-host pages and clients
// without an Origin). Origins "*" together with Credentials is refused (see
// Validate): a Handler so configured serves nothing.
type CORS struct {
	// Origins are the allowed origins, each compared exactly with the
	// request's Origin header: scheme, host and port as a browser sends
	// them, such as "https://app.example.com" or "http://localhost:5173"
	// (no path, no trailing slash). "*" allows every origin, "null"
	// included (sandboxed frames, file: pages), and cannot go with
	// Credentials.
	Origins []string
	// AllowOrigin, when set, decides about an origin that Origins does not
	// list. It is called on the request's goroutine, must be safe for
	// concurrent use, and should not block.
	AllowOrigin func(origin string) bool
	// Credentials allows credentialed requests (cookies, HTTP auth, an
	// EventSource opened withCredentials: true): allowed origins also get
	// Access-Control-Allow-Credentials: true. It needs origins named in
	// Origins or chosen by AllowOrigin, never "*" (see Validate).
	Credentials bool
	// AllowHeaders are request headers a preflight may name besides
	// Last-Event-ID, Event-Epoch, Cache-Control and Accept, such as
	// "Authorization". Compared case-insensitively.
	AllowHeaders []string
	// MaxAge is how long a browser may cache a preflight's answer; 0 means
	// DefaultCORSMaxAge, a negative value sends none (the browser's default,
	// 5 seconds in Chromium).
	MaxAge time.Duration
}

// Validate reports whether c may be served: it returns an error wrapping
// ErrInvalidOption when Origins holds "*" and Credentials is set. The
// handler answers an allowed origin with that origin, never "*", so the
// pair would let every site a visitor opens read the stream with the
// visitor's cookies; the Fetch standard refuses "*" with credentials for
// that reason. Name the origins instead, or decide with AllowOrigin.
//
// A Handler calls Validate on every request: with a CORS that does not
// validate it answers every request, preflights included, 500
// {"code":"invalid_cors"} and logs the error once (at Error). Call it when
// setting up, to fail at start instead. A nil CORS is valid. Validate only
// reads c.
func (c *CORS) Validate() error {
	if c != nil && c.Credentials && slices.Contains(c.Origins, "*") {
		return fmt.Errorf(`%w: CORS Origins "*" with Credentials would let every site read the stream with its visitors' cookies; list the allowed origins, or choose them with AllowOrigin`, ErrInvalidOption)
	}
	return nil
}

// AllowsOrigin reports whether request r may open a stream as far as its
// Origin header goes: true for a request without one (not a browser's), for
// an Origin naming the host r was sent to (the scheme is not compared: a
// TLS-terminating proxy hides it), and for an origin c allows (Origins,
// AllowOrigin); a nil c allows only the first two. A transport with no
// CORS of its own checks it before its handshake: browsers send a
// WebSocket handshake with the visitor's cookies from any site, and read
// its messages whatever CORS says (github.com/ssebus/eventbus/websocket
// refuses 403 origin_not_allowed). It only reads c and r, and calls
// AllowOrigin.
func (c *CORS) AllowsOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" || sameHost(origin, r) {
		return true
	}
	return c != nil && c.Validate() == nil && c.allowed(origin)
}

func (c *CORS) allowed(origin string) bool {
	if slices.Contains(c.Origins, origin) || slices.Contains(c.Origins, "*") {
		return true
	}
	return c.AllowOrigin != nil && c.AllowOrigin(origin)
}

// sameHost reports whether origin names the host the request was sent to:
// a browser sends Origin on some same-origin requests too, and those must
// never need a CORS entry. The scheme is not compared: behind a proxy that
// terminates TLS the handler cannot know its own.
func sameHost(origin string, r *http.Request) bool {
	u, err := url.Parse(origin)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host)
}

// handle applies CORS to a request. It reports whether the handler goes on;
// false means it has answered (a preflight, a plain OPTIONS, or a refused
// origin).
func (c *CORS) handle(w http.ResponseWriter, r *http.Request) bool {
	hd := w.Header()
	origin := r.Header.Get("Origin")
	preflight := r.Method == http.MethodOptions && origin != "" && r.Header.Get("Access-Control-Request-Method") != ""
	if preflight {
		hd.Add("Vary", "Origin, Access-Control-Request-Method, Access-Control-Request-Headers")
	} else {
		hd.Add("Vary", "Origin")
	}
	if r.Method == http.MethodOptions && !preflight {
		hd.Set("Allow", "GET, HEAD, OPTIONS")
		w.WriteHeader(http.StatusNoContent)
		return false
	}
	if origin == "" || (!preflight && sameHost(origin, r)) {
		return true
	}
	if !c.allowed(origin) {
		writeJSONError(w, http.StatusForbidden, "origin "+quoteHead(origin, 256)+" is not allowed", "origin_not_allowed", 0)
		return false
	}
	hd.Set("Access-Control-Allow-Origin", origin)
	if c.Credentials {
		hd.Set("Access-Control-Allow-Credentials", "true")
	}
	if !preflight {
		return true
	}
	if m := r.Header.Get("Access-Control-Request-Method"); m != http.MethodGet && m != http.MethodHead {
		writeJSONError(w, http.StatusForbidden, "method "+quoteHead(m, 64)+" is not allowed", "preflight_refused", 0)
		return false
	}
	for _, list := range r.Header.Values("Access-Control-Request-Headers") {
		for name := range strings.SplitSeq(list, ",") {
			name = strings.TrimSpace(name)
			if name != "" && !c.allowedHeader(name) {
				writeJSONError(w, http.StatusForbidden, "request header "+quoteHead(name, 64)+" is not allowed", "preflight_refused", 0)
				return false
			}
		}
	}
	hd.Set("Access-Control-Allow-Methods", "GET, HEAD")
	hd.Set("Access-Control-Allow-Headers", strings.Join(append(slices.Clip(corsHeaders), c.AllowHeaders...), ", "))
	maxAge := c.MaxAge
	if maxAge == 0 {
		maxAge = DefaultCORSMaxAge
	}
	if maxAge > 0 {
		hd.Set("Access-Control-Max-Age", strconv.FormatInt(int64(maxAge/time.Second), 10))
	}
	w.WriteHeader(http.StatusNoContent)
	return false
}

func (c *CORS) allowedHeader(name string) bool {
	eq := func(h string) bool { return strings.EqualFold(h, name) }
	return slices.ContainsFunc(corsHeaders, eq) || slices.ContainsFunc(c.AllowHeaders, eq)
}
