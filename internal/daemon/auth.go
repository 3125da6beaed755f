package daemon

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ssebus/eventbus"
)

// The login cookie and the subjects of the demo daemons' access control.
const (
	// AuthCookie is the name of the login cookie POST /login sets.
	AuthCookie = "sessiond_auth"
	// BearerSubject is the subject of a stream opened with the bearer
	// token itself (every holder of the token is the same principal).
	BearerSubject = "bearer"
	// DefaultLoginSubject is the subject of a login that names none.
	DefaultLoginSubject = "viewer"
	// MaxRevokedSubjects bounds the subjects whose logins a daemon
	// remembers as revoked; a revocation beyond it is refused (503).
	MaxRevokedSubjects = 10000
)

// The routes that never need credentials, or check them themselves, or
// are the stream (whose Handler.Authorize decides).
const (
	streamPattern    = "GET /session/{id}/events"
	preflightPattern = "OPTIONS /session/{id}/events"
	muxPreflight     = "OPTIONS /events"
	indexPattern     = "GET /{$}"
	loginPattern     = "POST /login"
	logoutPattern    = "POST /logout"
	revokePattern    = "POST /revoke"
)

// ClientPattern is the route of the JavaScript client's modules that the
// viewer page loads (GET /static/eventbus-client/index.js ...): public, as
// the page itself is, since the page loads them before any login.
const ClientPattern = "GET " + ClientPrefix + "/"

// ClientPrefix is the path under which a daemon serves the JavaScript
// client's modules (package github.com/ssebus/eventbus/clients/js).
const ClientPrefix = "/static/eventbus-client"

// AuthUsage is the part of the daemons' usage text about -auth-token.
const AuthUsage = `With -auth-token T every /session route needs "Authorization: Bearer T" or the
login cookie (a browser's EventSource cannot send headers); the stream answers 401
with WWW-Authenticate without them. -token-lifetime D ends each stream D after it
opened (with the token) or when its login expires (with the cookie), with the frame
stream_error {"errorKind":"reauthenticate"}: the client gets fresh credentials and
resumes from its last id, losing nothing.
  POST   /login                     {"token":"T","subject":"alice"} (or Authorization:
                                    Bearer T) -> {"subject":...,"expiresAt":...} and an
                                    HttpOnly SameSite=Strict cookie valid for -token-lifetime
  POST   /logout                    revoke the credentials' subject: its logins become invalid
                                    and its streams end with stream_error revoked
                                    -> {"subject":...,"revoked":N}
  POST   /revoke                    {"subject":"alice"}: the same for any subject
                                    (needs credentials) -> {"subject":...,"revoked":N}
`

// AuthOptions configure NewAuth.
type AuthOptions struct {
	// Token is the static bearer token (-auth-token): 1 to 4096 bytes of
	// the token68 alphabet (letters, digits, "-._~+/", then "=" padding).
	Token string
	// Lifetime (-token-lifetime) bounds every stream: one opened with the
	// token ends Lifetime after it opened, one opened with a login cookie
	// when the login expires, Lifetime after POST /login. 0: no bound.
	Lifetime time.Duration
	// Realm is the realm of WWW-Authenticate, such as the daemon's name.
	Realm string
	// Secure marks the login cookie Secure (the daemon serves HTTPS).
	Secure bool
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Auth is the demo daemons' access control, on with -auth-token: every
// /session route needs `Authorization: Bearer <token>` or the login cookie
// that POST /login sets for the token (a browser's EventSource cannot send
// headers, but it sends cookies). The stream is checked by the eventbus
// Handler's Authorize (Install), the other routes by Protect.
//
// A login cookie is stateless: its subject, expiry and issue time, signed
// with a key derived from the token, so every replica with the same token
// accepts it, also after a restart. POST /logout (the cookie's subject) and
// POST /revoke (any subject) make the subject's logins issued until then
// invalid, in this process, then end its streams with Handler.Revoke. A
// real daemon keeps that list in its store; this one forgets it on restart
// and revokes on the replica it was asked on only.
//
// Its methods are safe for concurrent use. A nil *Auth is access control
// off: Protect serves the routes as they are and Install does nothing.
type Auth struct {
	opts    AuthOptions
	key     []byte
	handler *eventbus.Handler // set by Install

	mu      sync.Mutex
	revoked map[string]time.Time // subject -> logins issued up to then are invalid
}

// NewAuth returns the access control of opts, or an error for a token or
// lifetime that is not valid.
func NewAuth(opts AuthOptions) (*Auth, error) {
	if err := checkToken(opts.Token); err != nil {
		return nil, err
	}
	if opts.Lifetime < 0 {
		return nil, errors.New("-token-lifetime must not be negative")
	}
	if opts.Realm == "" {
		opts.Realm = "sessiond"
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	mac := hmac.New(sha256.New, []byte(opts.Token))
	mac.Write([]byte("sessiond login cookie v1"))
	return &Auth{opts: opts, key: mac.Sum(nil), revoked: make(map[string]time.Time)}, nil
}

// checkToken applies RFC 6750's b64token syntax: what may follow "Bearer ".
func checkToken(t string) error {
	if t == "" || len(t) > 4096 {
		return errors.New("-auth-token must be 1 to 4096 bytes")
	}
	body := strings.TrimRight(t, "=")
	if body == "" {
		return errors.New("-auth-token must not be padding only")
	}
	for i := 0; i < len(body); i++ {
		c := body[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-._~+/", c) >= 0) {
			return fmt.Errorf("-auth-token: byte %q is not allowed in a bearer token (letters, digits, -._~+/ and = padding)", c)
		}
	}
	return nil
}

// Install makes h check credentials: its Authorize grants a stream as
// Check says, and its Lookup checks them before the daemon's own lookup
// runs (which creates a session, or reads Redis: work an anonymous client
// must not cause). With CORS set, Authorization becomes a header a
// preflight may name. Revoke then ends h's streams, and those of a
// MuxHandler that shares h, whose sessions go through the same Lookup and
// Authorize. Call it once, after h's Lookup and CORS are set and before h
// serves.
func (a *Auth) Install(h *eventbus.Handler) {
	if a == nil {
		return
	}
	a.handler = h
	lookup := h.Lookup
	h.Lookup = func(r *http.Request, session string) (*eventbus.EventBus, error) {
		if _, err := a.Check(r); err != nil {
			return nil, err
		}
		return lookup(r, session)
	}
	// Checked again: the lookup may have taken a while, and a logout
	// meanwhile must refuse the stream.
	h.Authorize = func(r *http.Request, _ string, _ *eventbus.EventBus) (eventbus.Grant, error) { return a.Check(r) }
	if h.CORS != nil {
		h.CORS.AllowHeaders = append(h.CORS.AllowHeaders, "Authorization")
	}
}

// Check returns the grant of r's credentials: the bearer token (subject
// BearerSubject, a lifetime from now) or a valid login cookie (its
// subject, the login's expiry). Without valid credentials it returns a 401
// *eventbus.StatusError with a Bearer challenge. An Authorization header
// that is present decides alone, even when a cookie is present too.
func (a *Auth) Check(r *http.Request) (eventbus.Grant, error) {
	now := a.opts.Now()
	if v := r.Header.Get("Authorization"); v != "" {
		if a.validBearer(v) {
			g := eventbus.Grant{Subject: BearerSubject}
			if a.opts.Lifetime > 0 {
				g.Expires = now.Add(a.opts.Lifetime)
			}
			return g, nil
		}
		return eventbus.Grant{}, a.unauthorized(`, error="invalid_token"`, "invalid bearer token")
	}
	c, err := r.Cookie(AuthCookie)
	if err != nil {
		return eventbus.Grant{}, a.unauthorized("", "credentials required: Authorization: Bearer <token>, or the cookie of POST /login")
	}
	g, ok := a.parseCookie(c.Value, now)
	if !ok {
		return eventbus.Grant{}, a.unauthorized(`, error="invalid_token"`, "login expired or revoked: POST /login again")
	}
	return g, nil
}

func (a *Auth) validBearer(v string) bool {
	scheme, tok, ok := strings.Cut(v, " ")
	return ok && strings.EqualFold(scheme, "Bearer") &&
		subtle.ConstantTimeCompare([]byte(strings.TrimLeft(tok, " ")), []byte(a.opts.Token)) == 1
}

func (a *Auth) unauthorized(challengeExtra, msg string) *eventbus.StatusError {
	return eventbus.Unauthorized(`Bearer realm="`+a.opts.Realm+`"`+challengeExtra, msg)
}

// A login cookie is "<subject>.<expires ms, 0: none>.<issued ns>.<hmac>".

func (a *Auth) sign(payload string) string {
	mac := hmac.New(sha256.New, a.key)
	mac.Write([]byte(payload))
	return hex.EncodeToString(mac.Sum(nil))
}

func (a *Auth) makeCookie(subject string, expires, issued time.Time) string {
	exp := int64(0)
	if !expires.IsZero() {
		exp = expires.UnixMilli()
	}
	payload := subject + "." + strconv.FormatInt(exp, 10) + "." + strconv.FormatInt(issued.UnixNano(), 10)
	return payload + "." + a.sign(payload)
}

func (a *Auth) parseCookie(v string, now time.Time) (eventbus.Grant, bool) {
	payload, sig, ok := cutLast(v, ".")
	if !ok || !hmac.Equal([]byte(sig), []byte(a.sign(payload))) {
		return eventbus.Grant{}, false
	}
	parts := strings.Split(payload, ".")
	if len(parts) != 3 {
		return eventbus.Grant{}, false
	}
	exp, err1 := strconv.ParseInt(parts[1], 10, 64)
	issued, err2 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil {
		return eventbus.Grant{}, false
	}
	g := eventbus.Grant{Subject: parts[0]}
	if exp != 0 {
		g.Expires = time.UnixMilli(exp)
		if !now.Before(g.Expires) {
			return eventbus.Grant{}, false
		}
	}
	a.mu.Lock()
	until, isRevoked := a.revoked[g.Subject]
	a.mu.Unlock()
	if isRevoked && issued <= until.UnixNano() {
		return eventbus.Grant{}, false
	}
	return g, true
}

func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// validSubject: 1 to 64 letters, digits, '-' or '_' (a cookie field, a
// log attribute).
func validSubject(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// Protect registers POST /login, POST /logout and POST /revoke on mux and
// returns mux behind JSONErrors, with every route but the index page and
// the client's modules (ClientPattern), the login and the streams, single
// and multiplexed (which Install's and InstallMux's checks cover, a CORS
// preflight included, which needs none)
// refusing a request without valid credentials
// with 401. A nil a returns JSONErrors(mux) and registers nothing.
func (a *Auth) Protect(mux *http.ServeMux) http.Handler {
	next := JSONErrors(mux)
	if a == nil {
		return next
	}
	mux.HandleFunc(loginPattern, a.ServeLogin)
	mux.HandleFunc(logoutPattern, a.ServeLogout)
	mux.HandleFunc(revokePattern, a.ServeRevoke)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch _, pattern := mux.Handler(r); pattern {
		case "", indexPattern, ClientPattern, loginPattern, logoutPattern, revokePattern, streamPattern, preflightPattern, MuxPattern, muxPreflight:
		default:
			if _, err := a.Check(r); err != nil {
				writeStatusError(w, r, err)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

func writeStatusError(w http.ResponseWriter, r *http.Request, err error) {
	var se *eventbus.StatusError
	if errors.As(err, &se) {
		se.ServeHTTP(w, r)
		return
	}
	WriteError(w, http.StatusInternalServerError, "internal", "internal error")
}

// loginRequest is the body of POST /login: the token (unless the request
// has an Authorization header) and the subject to log in as.
type loginRequest struct {
	Token   string `json:"token"`
	Subject string `json:"subject"`
}

// ServeLogin is POST /login: with the token (a JSON body
// {"token":"...","subject":"..."}, or Authorization: Bearer and an
// optional body {"subject":"..."}) it sets the login cookie, HttpOnly and
// SameSite=Strict, valid for Lifetime (none: until logout), and answers
// {"subject":"...","expiresAt":"<RFC 3339>"} (no expiresAt without a
// lifetime). A wrong token is 401, a malformed body or subject 400.
func (a *Auth) ServeLogin(w http.ResponseWriter, r *http.Request) {
	var req loginRequest
	dec := NewBodyDecoder(w, r, 4<<10)
	if err := dec.Decode(&req); err != nil && err != io.EOF {
		WriteBodyError(w, r, err)
		return
	}
	bearer := r.Header.Get("Authorization")
	switch {
	case bearer != "" && !a.validBearer(bearer),
		bearer == "" && subtle.ConstantTimeCompare([]byte(req.Token), []byte(a.opts.Token)) != 1:
		a.unauthorized(`, error="invalid_token"`, "wrong token").ServeHTTP(w, r)
		return
	}
	if req.Subject == "" {
		req.Subject = DefaultLoginSubject
	}
	if !validSubject(req.Subject) {
		WriteError(w, http.StatusBadRequest, "invalid_subject", "subject must be 1 to 64 letters, digits, - or _")
		return
	}
	now := a.opts.Now()
	cookie := &http.Cookie{
		Name: AuthCookie, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: a.opts.Secure,
	}
	body := map[string]any{"subject": req.Subject}
	var expires time.Time
	if a.opts.Lifetime > 0 {
		expires = now.Add(a.opts.Lifetime)
		cookie.MaxAge = int((a.opts.Lifetime + time.Second - 1) / time.Second)
		body["expiresAt"] = expires.UTC().Format(time.RFC3339Nano)
	}
	cookie.Value = a.makeCookie(req.Subject, expires, now)
	http.SetCookie(w, cookie)
	WriteJSON(w, http.StatusOK, body)
}

// ServeLogout is POST /logout: with valid credentials it revokes their
// subject (every login of it issued until now becomes invalid, then its
// streams end with stream_error revoked), clears the cookie and answers
// {"subject":"...","revoked":<streams ended>}.
func (a *Auth) ServeLogout(w http.ResponseWriter, r *http.Request) {
	g, err := a.Check(r)
	if err != nil {
		writeStatusError(w, r, err)
		return
	}
	n, ok := a.revoke(w, g.Subject)
	if !ok {
		return
	}
	http.SetCookie(w, &http.Cookie{Name: AuthCookie, Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: a.opts.Secure})
	WriteJSON(w, http.StatusOK, map[string]any{"subject": g.Subject, "revoked": n})
}

// ServeRevoke is POST /revoke {"subject":"..."}: with valid credentials
// (anyone with the token may) it revokes that subject as ServeLogout does
// and answers {"subject":"...","revoked":<streams ended>}.
func (a *Auth) ServeRevoke(w http.ResponseWriter, r *http.Request) {
	if _, err := a.Check(r); err != nil {
		writeStatusError(w, r, err)
		return
	}
	var req struct {
		Subject string `json:"subject"`
	}
	if err := NewBodyDecoder(w, r, 4<<10).Decode(&req); err != nil {
		WriteBodyError(w, r, err)
		return
	}
	if !validSubject(req.Subject) {
		WriteError(w, http.StatusBadRequest, "invalid_subject", "subject must be 1 to 64 letters, digits, - or _")
		return
	}
	n, ok := a.revoke(w, req.Subject)
	if ok {
		WriteJSON(w, http.StatusOK, map[string]any{"subject": req.Subject, "revoked": n})
	}
}

// revoke invalidates subject's logins issued until now, then ends its
// streams: in that order, so that no stream survives (Handler.Revoke's
// ordering rule). It answers 503 itself, and reports false, when the list
// of revoked subjects is full.
func (a *Auth) revoke(w http.ResponseWriter, subject string) (int, bool) {
	now := a.opts.Now()
	a.mu.Lock()
	if _, ok := a.revoked[subject]; !ok && len(a.revoked) >= MaxRevokedSubjects && a.opts.Lifetime > 0 {
		// Every login issued before now-Lifetime has expired anyway.
		for s, at := range a.revoked {
			if now.Sub(at) > a.opts.Lifetime {
				delete(a.revoked, s)
			}
		}
	}
	_, known := a.revoked[subject]
	full := !known && len(a.revoked) >= MaxRevokedSubjects
	if !full {
		a.revoked[subject] = now
	}
	a.mu.Unlock()
	if full {
		WriteUnavailable(w, "too_many_revocations", "too many revoked subjects; retry later")
		return 0, false
	}
	n := 0
	if a.handler != nil {
		n = a.handler.Revoke(subject)
	}
	return n, true
}
