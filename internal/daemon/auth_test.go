package daemon

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
)

// testClock is an AuthOptions.Now the test moves by hand.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func newTestAuth(t *testing.T, lifetime time.Duration) (*Auth, *testClock) {
	t.Helper()
	// The real time, then moved by hand: the eventbus Handler compares a
	// grant's expiry with its own clock.
	clock := &testClock{now: time.Now().UTC().Truncate(time.Second)}
	a, err := NewAuth(AuthOptions{Token: "s3cret-Token_1~+/==", Lifetime: lifetime, Realm: "testd", Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return a, clock
}

func request(method, target string, header ...string) *http.Request {
	r := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	return r
}

// wantUnauthorized checks a 401 StatusError and its challenge.
func wantUnauthorized(t *testing.T, err error, challenge string) {
	t.Helper()
	var se *eventbus.StatusError
	if !errors.As(err, &se) || se.Status != http.StatusUnauthorized || se.Code != "unauthorized" || se.Challenge != challenge {
		t.Fatalf("got %#v, want a 401 with WWW-Authenticate %q", err, challenge)
	}
}

func TestNewAuthAndFlags(t *testing.T) {
	for _, tok := range []string{"", " spaced", "a b", "tok\n", "=", "abc=d", "é", strings.Repeat("a", 4097)} {
		if _, err := NewAuth(AuthOptions{Token: tok}); err == nil {
			t.Errorf("token %q accepted", tok)
		}
	}
	for _, tok := range []string{"a", "A-b.c_d~e+f/g==", strings.Repeat("z", 4096)} {
		if _, err := NewAuth(AuthOptions{Token: tok}); err != nil {
			t.Errorf("token %q: %v", tok, err)
		}
	}
	if _, err := NewAuth(AuthOptions{Token: "t", Lifetime: -time.Second}); err == nil {
		t.Error("a negative lifetime accepted")
	}
	if a, err := (&Flags{}).Auth("d", false); a != nil || err != nil {
		t.Fatalf("no flags: %v %v", a, err)
	}
	if _, err := (&Flags{TokenLifetime: time.Minute}).Auth("d", false); err == nil || !strings.Contains(err.Error(), "needs -auth-token") {
		t.Fatalf("-token-lifetime alone: %v", err)
	}
	fs, f := NewFlags("testd", "", nil, FlagDocs{})
	if err := Parse(fs, []string{"-auth-token", "tok", "-token-lifetime", "90s"}); err != nil {
		t.Fatal(err)
	}
	a, err := f.Auth("testd", true)
	if err != nil || a.opts.Token != "tok" || a.opts.Lifetime != 90*time.Second || !a.opts.Secure || a.opts.Realm != "testd" {
		t.Fatalf("Auth of the flags: %+v %v", a, err)
	}

	// A nil Auth is access control off.
	var none *Auth
	h := &eventbus.Handler{}
	none.Install(h)
	if h.Authorize != nil || h.Lookup != nil {
		t.Fatal("a nil Auth installed something")
	}
	mux := http.NewServeMux()
	rec := httptest.NewRecorder()
	none.Protect(mux).ServeHTTP(rec, request(http.MethodPost, "/login"))
	if rec.Code != http.StatusNotFound {
		t.Fatalf("POST /login without -auth-token: %d, want the JSON 404 of an unknown route", rec.Code)
	}
}

func TestAuthCheck(t *testing.T) {
	a, clock := newTestAuth(t, time.Minute)
	const challenge = `Bearer realm="testd"`
	const invalid = `Bearer realm="testd", error="invalid_token"`

	g, err := a.Check(request(http.MethodGet, "/", "Authorization", "Bearer s3cret-Token_1~+/=="))
	if err != nil || g.Subject != BearerSubject || !g.Expires.Equal(clock.Now().Add(time.Minute)) {
		t.Fatalf("the token: %+v %v", g, err)
	}
	if _, err := a.Check(request(http.MethodGet, "/", "Authorization", "bearer  s3cret-Token_1~+/==")); err != nil {
		t.Fatalf("the scheme is case-insensitive: %v", err)
	}
	_, err = a.Check(request(http.MethodGet, "/"))
	wantUnauthorized(t, err, challenge)
	for _, v := range []string{"Bearer wrong", "Basic czNjcmV0", "Bearer", "s3cret-Token_1~+/=="} {
		_, err = a.Check(request(http.MethodGet, "/", "Authorization", v))
		wantUnauthorized(t, err, invalid)
	}

	// A login cookie: its subject, the login's expiry.
	cookie := a.makeCookie("alice", clock.Now().Add(time.Minute), clock.Now())
	withCookie := func(v string) *http.Request {
		r := request(http.MethodGet, "/")
		r.AddCookie(&http.Cookie{Name: AuthCookie, Value: v})
		return r
	}
	g, err = a.Check(withCookie(cookie))
	if err != nil || g.Subject != "alice" || !g.Expires.Equal(clock.Now().Add(time.Minute).Truncate(time.Millisecond)) {
		t.Fatalf("a cookie: %+v %v", g, err)
	}
	other, _ := NewAuth(AuthOptions{Token: "another", Now: clock.Now})
	for name, v := range map[string]string{
		"tampered subject":   strings.Replace(cookie, "alice", "admin", 1),
		"tampered signature": cookie[:len(cookie)-1] + map[bool]string{true: "1", false: "0"}[strings.HasSuffix(cookie, "0")],
		"another token's":    other.makeCookie("alice", time.Time{}, clock.Now()),
		"no signature":       "alice.0.1",
		"garbage":            "x",
	} {
		_, err = a.Check(withCookie(v))
		if err == nil {
			t.Fatalf("a %s cookie was accepted", name)
		}
		wantUnauthorized(t, err, invalid)
	}
	// An Authorization header decides alone.
	r := withCookie(cookie)
	r.Header.Set("Authorization", "Bearer wrong")
	_, err = a.Check(r)
	wantUnauthorized(t, err, invalid)

	clock.advance(time.Minute)
	_, err = a.Check(withCookie(cookie))
	wantUnauthorized(t, err, invalid)
}

// authServer serves Protect's routes with an eventbus Handler on the stream
// route, over one bus, the way the daemons do.
type authServer struct {
	a       *Auth
	clock   *testClock
	bus     *eventbus.EventBus
	h       *eventbus.Handler
	srv     http.Handler
	lookups int // calls of the daemon's own lookup
}

func newAuthServer(t *testing.T, lifetime time.Duration) *authServer {
	t.Helper()
	a, clock := newTestAuth(t, lifetime)
	bus, err := eventbus.New(eventbus.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bus.Close() })
	s := &authServer{a: a, clock: clock, bus: bus}
	s.h = &eventbus.Handler{
		Lookup: func(*http.Request, string) (*eventbus.EventBus, error) { s.lookups++; return bus, nil },
		CORS:   &eventbus.CORS{Origins: []string{"https://app.example"}},
	}
	a.Install(s.h)
	mux := http.NewServeMux()
	mux.HandleFunc(indexPattern, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("index")) })
	mux.Handle(streamPattern, s.h)
	mux.Handle(preflightPattern, s.h)
	mux.HandleFunc("POST /session/{id}/events", func(w http.ResponseWriter, r *http.Request) { WriteJSON(w, http.StatusOK, map[string]any{"id": 1}) })
	s.srv = a.Protect(mux)
	return s
}

func (s *authServer) serve(r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	s.srv.ServeHTTP(w, r)
	return w
}

func jsonBody(t *testing.T, w *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
		t.Fatalf("body %q: %v", w.Body, err)
	}
	return m
}

// login posts body to /login and returns the answer and its cookie.
func (s *authServer) login(t *testing.T, body string, header ...string) (*httptest.ResponseRecorder, *http.Cookie) {
	t.Helper()
	r := request(http.MethodPost, "/login", header...)
	r.Body = http.NoBody
	if body != "" {
		r = httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(body))
		for i := 0; i+1 < len(header); i += 2 {
			r.Header.Add(header[i], header[i+1])
		}
	}
	w := s.serve(r)
	for _, c := range w.Result().Cookies() {
		if c.Name == AuthCookie {
			return w, c
		}
	}
	return w, nil
}

func TestAuthRoutes(t *testing.T) {
	s := newAuthServer(t, time.Minute)

	// Open: the index and the login; refused without credentials: the
	// other routes, and the stream (by the Handler's Authorize, in its
	// Lookup, before the daemon's lookup runs).
	if w := s.serve(request(http.MethodGet, "/")); w.Code != http.StatusOK {
		t.Fatalf("GET /: %d", w.Code)
	}
	for _, r := range []*http.Request{
		request(http.MethodPost, "/session/x/events"),
		request(http.MethodGet, "/session/x/events"),
		request(http.MethodHead, "/session/x/events"),
		request(http.MethodPost, "/logout"),
		request(http.MethodPost, "/revoke"),
	} {
		w := s.serve(r)
		if w.Code != http.StatusUnauthorized || w.Header().Get("WWW-Authenticate") != `Bearer realm="testd"` {
			t.Fatalf("%s %s: %d %v %s", r.Method, r.URL, w.Code, w.Header(), w.Body)
		}
		if r.Method != http.MethodHead && jsonBody(t, w)["code"] != "unauthorized" {
			t.Fatalf("%s %s: %s", r.Method, r.URL, w.Body)
		}
	}
	if s.lookups != 0 {
		t.Fatalf("the daemon's lookup ran %d times for anonymous requests", s.lookups)
	}
	// A CORS preflight needs no credentials, and may name Authorization.
	w := s.serve(request(http.MethodOptions, "/session/x/events", "Origin", "https://app.example",
		"Access-Control-Request-Method", "GET", "Access-Control-Request-Headers", "authorization"))
	if w.Code != http.StatusNoContent || !strings.Contains(w.Header().Get("Access-Control-Allow-Headers"), "Authorization") {
		t.Fatalf("preflight: %d %v", w.Code, w.Header())
	}
	if w := s.serve(request(http.MethodGet, "/nope")); w.Code != http.StatusNotFound {
		t.Fatalf("an unknown route: %d", w.Code)
	}
	// The token opens every route.
	if w := s.serve(request(http.MethodPost, "/session/x/events", "Authorization", "Bearer s3cret-Token_1~+/==")); w.Code != http.StatusOK {
		t.Fatalf("POST with the token: %d %s", w.Code, w.Body)
	}
	if w := s.serve(request(http.MethodHead, "/session/x/events", "Authorization", "Bearer s3cret-Token_1~+/==")); w.Code != http.StatusOK || s.lookups != 1 {
		t.Fatalf("HEAD with the token: %d, lookups %d", w.Code, s.lookups)
	}

	// Logins.
	for _, c := range []struct {
		name, body string
		header     []string
		status     int
		code       string
	}{
		{"a wrong token", `{"token":"nope"}`, nil, 401, "unauthorized"},
		{"no token", `{}`, nil, 401, "unauthorized"},
		{"a wrong bearer", `{"token":"s3cret-Token_1~+/=="}`, []string{"Authorization", "Bearer nope"}, 401, "unauthorized"},
		{"a bad subject", `{"token":"s3cret-Token_1~+/==","subject":"a.b"}`, nil, 400, "invalid_subject"},
		{"an unknown field", `{"token":"s3cret-Token_1~+/==","user":"a"}`, nil, 400, "invalid_body"},
	} {
		w, cookie := s.login(t, c.body, c.header...)
		if w.Code != c.status || jsonBody(t, w)["code"] != c.code || cookie != nil {
			t.Fatalf("%s: %d %s, cookie %v", c.name, w.Code, w.Body, cookie)
		}
	}
	w, cookie := s.login(t, `{"token":"s3cret-Token_1~+/==","subject":"alice"}`)
	if w.Code != http.StatusOK || cookie == nil {
		t.Fatalf("login: %d %s", w.Code, w.Body)
	}
	if m := jsonBody(t, w); m["subject"] != "alice" || m["expiresAt"] != s.clock.Now().Add(time.Minute).Format(time.RFC3339) {
		t.Fatalf("login answer: %v", m)
	}
	if !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || cookie.Path != "/" || cookie.MaxAge != 60 || cookie.Secure {
		t.Fatalf("cookie attributes: %+v", cookie)
	}
	if _, c2 := s.login(t, "", "Authorization", "Bearer s3cret-Token_1~+/=="); c2 == nil {
		t.Fatal("a login with the bearer header and no body")
	} else if g, err := s.a.Check(withCookieValue(c2.Value)); err != nil || g.Subject != DefaultLoginSubject {
		t.Fatalf("its cookie: %+v %v", g, err)
	}

	// The cookie opens the routes, as alice, until the login expires.
	if w := s.serve(withCookieValue(cookie.Value, http.MethodPost, "/session/x/events")); w.Code != http.StatusOK {
		t.Fatalf("POST with the cookie: %d %s", w.Code, w.Body)
	}
	s.clock.advance(time.Minute)
	if w := s.serve(withCookieValue(cookie.Value, http.MethodPost, "/session/x/events")); w.Code != http.StatusUnauthorized ||
		!strings.Contains(jsonBody(t, w)["error"].(string), "login expired or revoked") {
		t.Fatalf("POST with an expired cookie: %d %s", w.Code, w.Body)
	}
}

func withCookieValue(v string, methodTarget ...string) *http.Request {
	r := request(http.MethodGet, "/session/x/events")
	if len(methodTarget) == 2 {
		r = request(methodTarget[0], methodTarget[1])
	}
	r.AddCookie(&http.Cookie{Name: AuthCookie, Value: v})
	return r
}

func TestAuthLogoutAndRevoke(t *testing.T) {
	s := newAuthServer(t, 0) // no lifetime: logins last until revoked
	_, alice := s.login(t, `{"token":"s3cret-Token_1~+/==","subject":"alice"}`)
	_, bob := s.login(t, `{"token":"s3cret-Token_1~+/==","subject":"bob"}`)
	if alice.MaxAge != 0 {
		t.Fatalf("a login without lifetime is a session cookie: %+v", alice)
	}
	if g, err := s.a.Check(withCookieValue(alice.Value)); err != nil || !g.Expires.IsZero() {
		t.Fatalf("no lifetime, no expiry: %+v %v", g, err)
	}

	w := s.serve(withCookieValue(alice.Value, http.MethodPost, "/logout"))
	if w.Code != http.StatusOK {
		t.Fatalf("logout: %d %s", w.Code, w.Body)
	}
	if m := jsonBody(t, w); m["subject"] != "alice" || m["revoked"] != float64(0) {
		t.Fatalf("logout answer: %v", m)
	}
	var cleared bool
	for _, c := range w.Result().Cookies() {
		cleared = cleared || (c.Name == AuthCookie && c.MaxAge < 0)
	}
	if !cleared {
		t.Fatalf("logout keeps the cookie: %v", w.Result().Cookies())
	}
	if _, err := s.a.Check(withCookieValue(alice.Value)); err == nil {
		t.Fatal("alice's login is still valid after her logout")
	}
	if _, err := s.a.Check(withCookieValue(bob.Value)); err != nil {
		t.Fatalf("bob's login: %v", err)
	}
	// A login after the logout is valid again.
	s.clock.advance(time.Nanosecond)
	_, again := s.login(t, `{"token":"s3cret-Token_1~+/==","subject":"alice"}`)
	if _, err := s.a.Check(withCookieValue(again.Value)); err != nil {
		t.Fatalf("alice's new login: %v", err)
	}

	// /revoke: any subject, with credentials.
	w = s.serve(httptest.NewRequest(http.MethodPost, "/revoke", strings.NewReader(`{"subject":"bob"}`)))
	if w.Code != http.StatusUnauthorized {
		t.Fatalf("revoke without credentials: %d", w.Code)
	}
	r := httptest.NewRequest(http.MethodPost, "/revoke", strings.NewReader(`{"subject":"bob"}`))
	r.AddCookie(&http.Cookie{Name: AuthCookie, Value: again.Value})
	if w = s.serve(r); w.Code != http.StatusOK || jsonBody(t, w)["subject"] != "bob" {
		t.Fatalf("revoke: %d %s", w.Code, w.Body)
	}
	if _, err := s.a.Check(withCookieValue(bob.Value)); err == nil {
		t.Fatal("bob's login is valid after /revoke")
	}
	r = httptest.NewRequest(http.MethodPost, "/revoke", strings.NewReader(`{"subject":""}`))
	r.Header.Set("Authorization", "Bearer s3cret-Token_1~+/==")
	if w = s.serve(r); w.Code != http.StatusBadRequest || jsonBody(t, w)["code"] != "invalid_subject" {
		t.Fatalf("revoke of no subject: %d %s", w.Code, w.Body)
	}

	// The list of revoked subjects is bounded.
	s.a.mu.Lock()
	for i := 0; len(s.a.revoked) < MaxRevokedSubjects; i++ {
		s.a.revoked["filler"+strconv.Itoa(i)] = s.clock.Now()
	}
	s.a.mu.Unlock()
	r = httptest.NewRequest(http.MethodPost, "/revoke", strings.NewReader(`{"subject":"carol"}`))
	r.Header.Set("Authorization", "Bearer s3cret-Token_1~+/==")
	if w = s.serve(r); w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Fatalf("revoke with the list full: %d %s", w.Code, w.Body)
	}
	r = httptest.NewRequest(http.MethodPost, "/revoke", strings.NewReader(`{"subject":"bob"}`))
	r.Header.Set("Authorization", "Bearer s3cret-Token_1~+/==")
	if w = s.serve(r); w.Code != http.StatusOK {
		t.Fatalf("revoke of a subject already listed: %d %s", w.Code, w.Body)
	}
}

func TestAuthRevokedListExpires(t *testing.T) {
	s := newAuthServer(t, time.Minute)
	s.a.mu.Lock()
	for i := range MaxRevokedSubjects {
		s.a.revoked["old"+strconv.Itoa(i)] = s.clock.Now()
	}
	s.a.mu.Unlock()
	s.clock.advance(time.Minute + time.Second)
	r := httptest.NewRequest(http.MethodPost, "/revoke", strings.NewReader(`{"subject":"carol"}`))
	r.Header.Set("Authorization", "Bearer s3cret-Token_1~+/==")
	if w := s.serve(r); w.Code != http.StatusOK {
		t.Fatalf("revoke once every listed login has expired: %d %s", w.Code, w.Body)
	}
	s.a.mu.Lock()
	n := len(s.a.revoked)
	s.a.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d revoked subjects kept, want carol only", n)
	}
}
