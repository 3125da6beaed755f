package eventbus

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCORSStream(t *testing.T) {
	const page = "https://app.example"
	cors := &CORS{
		Origins:     []string{page, "null"},
		AllowOrigin: func(o string) bool { return o == "http://dev.example:5173" },
	}
	e := newEnv(t, envOptions{anyMethod: true, handler: &Handler{CORS: cors}})
	b := e.bus(t, "s", Options{})

	t.Run("allowed origins", func(t *testing.T) {
		for _, origin := range []string{page, "null", "http://dev.example:5173"} {
			c := e.stream(t, "/session/s/events", hdr("Origin", origin))
			h := c.resp.Header
			require.Equal(t, []string{origin}, h.Values("Access-Control-Allow-Origin"), origin)
			require.Empty(t, h.Values("Access-Control-Allow-Credentials"))
			require.Equal(t, []string{"Origin"}, h.Values("Vary"))
			require.Equal(t, []string{"Event-Epoch"}, h.Values("Access-Control-Expose-Headers"))
			publishN(t, b, 1)
			c.nextEvent()
			require.NoError(t, c.resp.Body.Close())
		}
	})
	t.Run("refused origins: 403 before the bus is looked up", func(t *testing.T) {
		peak := b.Stats().PeakSubscribers
		for _, origin := range []string{"https://evil.example", "https://app.example.evil", "https://APP.example", page + "/", "http://app.example"} {
			resp := e.do(t, http.MethodGet, "/session/s/events", hdr("Origin", origin))
			requireHTTPError(t, resp, http.StatusForbidden, "origin_not_allowed")
			require.Empty(t, resp.Header.Values("Access-Control-Allow-Origin"), origin)
			require.Equal(t, []string{"Origin"}, resp.Header.Values("Vary"))
		}
		resp := e.do(t, http.MethodGet, "/session/unknown/events", hdr("Origin", "https://evil.example"))
		requireHTTPError(t, resp, http.StatusForbidden, "origin_not_allowed") // not 404: it learns nothing
		require.Equal(t, peak, b.Stats().PeakSubscribers, "nothing subscribed")
	})
	t.Run("error answers to an allowed origin are readable", func(t *testing.T) {
		resp := e.do(t, http.MethodGet, "/session/unknown/events", hdr("Origin", page))
		requireHTTPError(t, resp, http.StatusNotFound, "session_not_found")
		require.Equal(t, page, resp.Header.Get("Access-Control-Allow-Origin"))
	})
	t.Run("no Origin, or the request's own host: served as without CORS", func(t *testing.T) {
		c := e.stream(t, "/session/s/events", nil)
		require.Empty(t, c.resp.Header.Values("Access-Control-Allow-Origin"))
		require.Equal(t, []string{"Origin"}, c.resp.Header.Values("Vary"), "the answer still depends on Origin")
		require.NoError(t, c.resp.Body.Close())
		c = e.stream(t, "/session/s/events", hdr("Origin", e.srv.URL))
		require.Empty(t, c.resp.Header.Values("Access-Control-Allow-Origin"))
	})
	t.Run("methods", func(t *testing.T) {
		resp := e.do(t, http.MethodOptions, "/session/s/events", nil)
		require.Equal(t, http.StatusNoContent, resp.StatusCode, "an OPTIONS that is no preflight")
		require.Equal(t, "GET, HEAD, OPTIONS", resp.Header.Get("Allow"))
	})
}

func TestCORSCredentials(t *testing.T) {
	const page, other = "https://app.example", "https://other.example"
	e := newEnv(t, envOptions{anyMethod: true, handler: &Handler{CORS: &CORS{
		Origins:     []string{page},
		AllowOrigin: func(o string) bool { return o == other },
		Credentials: true,
	}}})
	e.bus(t, "s", Options{})
	for _, origin := range []string{page, other} {
		c := e.stream(t, "/session/s/events", hdr("Origin", origin, "Cookie", "session=1"))
		require.Equal(t, []string{origin}, c.resp.Header.Values("Access-Control-Allow-Origin"), "never * with credentials")
		require.Equal(t, []string{"true"}, c.resp.Header.Values("Access-Control-Allow-Credentials"))
		require.NoError(t, c.resp.Body.Close())
	}
	resp := e.do(t, http.MethodOptions, "/session/s/events", hdr("Origin", page, "Access-Control-Request-Method", "GET"))
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	require.Equal(t, page, resp.Header.Get("Access-Control-Allow-Origin"))
	require.Equal(t, "true", resp.Header.Get("Access-Control-Allow-Credentials"))
	resp = e.do(t, http.MethodGet, "/session/s/events", hdr("Origin", "https://evil.example", "Cookie", "session=1"))
	requireHTTPError(t, resp, http.StatusForbidden, "origin_not_allowed")
	require.Empty(t, resp.Header.Values("Access-Control-Allow-Credentials"))
}

// "*" with Credentials would answer every site with its own origin and
// Allow-Credentials: true, so that any page a visitor opens reads the
// stream with the visitor's cookies (issue 22). Validate refuses it, and a
// Handler so configured serves nothing: every request, a preflight or one
// without Origin too, is 500 invalid_cors, logged once.
func TestCORSStarWithCredentialsRefused(t *testing.T) {
	for _, c := range []*CORS{nil, {}, {Origins: []string{"*"}}, {Origins: []string{"https://app.example"}, Credentials: true},
		{AllowOrigin: func(string) bool { return true }, Credentials: true}} {
		require.NoError(t, c.Validate(), "%+v", c)
	}
	bad := &CORS{Origins: []string{"https://app.example", "*"}, Credentials: true}
	err := bad.Validate()
	require.ErrorIs(t, err, ErrInvalidOption)
	require.ErrorContains(t, err, `eventbus: invalid option: CORS Origins "*" with Credentials`)

	e := newEnv(t, envOptions{anyMethod: true, handler: &Handler{CORS: bad}})
	b := e.bus(t, "s", Options{})
	for _, h := range []http.Header{
		hdr("Origin", "https://evil.example", "Cookie", "session=1"),
		hdr("Origin", "https://app.example"),
		nil,
		hdr("Origin", "https://evil.example", "Access-Control-Request-Method", "GET"),
	} {
		method := http.MethodGet
		if h.Get("Access-Control-Request-Method") != "" {
			method = http.MethodOptions
		}
		resp := e.do(t, method, "/session/s/events", h)
		requireHTTPError(t, resp, http.StatusInternalServerError, "invalid_cors")
		require.Empty(t, resp.Header.Values("Access-Control-Allow-Origin"), "%v", h)
		require.Empty(t, resp.Header.Values("Access-Control-Allow-Credentials"), "%v", h)
	}
	require.Zero(t, b.Stats().PeakSubscribers, "nothing subscribed")
	logged := e.logs.find("invalid Handler.CORS")
	require.Len(t, logged, 1, "logged once")
	require.Contains(t, logged[0].Attrs["error"], `Origins "*" with Credentials`)
}

func TestCORSPreflight(t *testing.T) {
	const page = "https://app.example"
	cors := &CORS{Origins: []string{page}, AllowHeaders: []string{"Authorization"}}
	e := newEnv(t, envOptions{anyMethod: true, handler: &Handler{CORS: cors}})
	b := e.bus(t, "s", Options{})
	preflight := func(origin, method, headers string) *http.Response {
		h := hdr("Origin", origin, "Access-Control-Request-Method", method)
		if headers != "" {
			h.Set("Access-Control-Request-Headers", headers)
		}
		return e.do(t, http.MethodOptions, "/session/s/events", h)
	}
	for _, tc := range []struct{ method, headers string }{
		{"GET", "last-event-id"},
		{"GET", "Last-Event-ID, Event-Epoch"},
		{"GET", "event-epoch,last-event-id,cache-control,accept"},
		{"GET", "authorization"},
		{"HEAD", ""},
	} {
		resp := preflight(page, tc.method, tc.headers)
		require.Equal(t, http.StatusNoContent, resp.StatusCode, "%+v", tc)
		h := resp.Header
		require.Equal(t, page, h.Get("Access-Control-Allow-Origin"))
		require.Equal(t, "GET, HEAD", h.Get("Access-Control-Allow-Methods"))
		require.Equal(t, "Last-Event-ID, Event-Epoch, Cache-Control, Accept, Authorization", h.Get("Access-Control-Allow-Headers"))
		require.Equal(t, "600", h.Get("Access-Control-Max-Age"))
		require.Empty(t, h.Get("Access-Control-Allow-Credentials"))
		require.Equal(t, []string{"Origin, Access-Control-Request-Method, Access-Control-Request-Headers"}, h.Values("Vary"))
	}
	for _, tc := range []struct{ origin, method, headers, code string }{
		{"https://evil.example", "GET", "last-event-id", "origin_not_allowed"},
		{page, "POST", "", "preflight_refused"},
		{page, "DELETE", "", "preflight_refused"},
		{page, "GET", "last-event-id, x-evil", "preflight_refused"},
		{page, "GET", "cookie", "preflight_refused"},
	} {
		resp := preflight(tc.origin, tc.method, tc.headers)
		requireHTTPError(t, resp, http.StatusForbidden, tc.code)
		require.Empty(t, resp.Header.Get("Access-Control-Allow-Methods"), "%+v", tc)
	}
	require.Zero(t, b.Stats().PeakSubscribers, "a preflight never subscribes")

	t.Run("MaxAge", func(t *testing.T) {
		for _, tc := range []struct {
			maxAge time.Duration
			want   string
		}{{30 * time.Second, "30"}, {-1, ""}} {
			e := newEnv(t, envOptions{anyMethod: true, handler: &Handler{CORS: &CORS{Origins: []string{page}, MaxAge: tc.maxAge}}})
			e.bus(t, "s", Options{})
			resp := e.do(t, http.MethodOptions, "/session/s/events", hdr("Origin", page, "Access-Control-Request-Method", "GET"))
			require.Equal(t, http.StatusNoContent, resp.StatusCode)
			require.Equal(t, tc.want, resp.Header.Get("Access-Control-Max-Age"))
		}
	})
}

// Without CORS nothing changes: no Allow-Origin, OPTIONS is 405, any Origin
// is served (the browser is the one that refuses the page).
func TestCORSUnset(t *testing.T) {
	e := newEnv(t, envOptions{anyMethod: true})
	e.bus(t, "s", Options{})
	c := e.stream(t, "/session/s/events", hdr("Origin", "https://app.example"))
	require.Empty(t, c.resp.Header.Values("Access-Control-Allow-Origin"))
	require.Empty(t, c.resp.Header.Values("Vary"))
	require.Equal(t, []string{"Event-Epoch"}, c.resp.Header.Values("Access-Control-Expose-Headers"))
	resp := e.do(t, http.MethodOptions, "/session/s/events", hdr("Origin", "https://app.example", "Access-Control-Request-Method", "GET"))
	requireHTTPError(t, resp, http.StatusMethodNotAllowed, "method_not_allowed")
	require.Equal(t, "GET, HEAD", resp.Header.Get("Allow"))
	require.Empty(t, resp.Header.Values("Access-Control-Allow-Origin"))
}

// AllowsOrigin, the check of a transport with no CORS of its own (a
// WebSocket): no Origin and the request's own host pass; another origin
// only when CORS allows it, never with a CORS that does not validate.
func TestCORSAllowsOrigin(t *testing.T) {
	req := func(origin string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "http://daemon.example:8080/ws", nil)
		if origin != "" {
			r.Header.Set("Origin", origin)
		}
		return r
	}
	var none *CORS
	require.True(t, none.AllowsOrigin(req("")))
	require.True(t, none.AllowsOrigin(req("http://daemon.example:8080")))
	require.True(t, none.AllowsOrigin(req("https://DAEMON.example:8080")), "the scheme is not compared, the host case-insensitively")
	require.False(t, none.AllowsOrigin(req("http://evil.example")))
	require.False(t, none.AllowsOrigin(req("http://daemon.example:8081")), "another port is another origin")
	require.False(t, none.AllowsOrigin(req("null")))

	c := &CORS{Origins: []string{"https://app.example"}, AllowOrigin: func(o string) bool { return o == "https://other.example" }}
	require.True(t, c.AllowsOrigin(req("https://app.example")))
	require.True(t, c.AllowsOrigin(req("https://other.example")))
	require.False(t, c.AllowsOrigin(req("https://app.example.evil")))
	require.True(t, (&CORS{Origins: []string{"*"}}).AllowsOrigin(req("null")))
	require.False(t, (&CORS{Origins: []string{"*"}, Credentials: true}).AllowsOrigin(req("https://app.example")), "an invalid CORS allows nothing")
}
