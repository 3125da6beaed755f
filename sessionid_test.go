package eventbus

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The session id rule (sessionid.go), and every entry point of the root
// package that applies it: the Hub's methods and both stream routes.

// invalidSessionIDs are ids CheckSessionID refuses, by name: two that
// differ only in invalid UTF-8 (which JSON would both turn into
// "a\ufffd"), a lone continuation byte, a truncated rune, an encoded
// surrogate, an overlong encoding, the empty id and one byte too many.
var invalidSessionIDs = map[string]string{
	"a%FF":              "a\xff",
	"a%FE":              "a\xfe",
	"continuation":      "\x80",
	"truncated rune":    "caf\xc3",
	"surrogate":         "\xed\xa0\x80",
	"overlong":          "\xc0\xaf",
	"empty":             "",
	"one byte too many": strings.Repeat("x", MaxSessionIDBytes+1),
}

func TestCheckSessionID(t *testing.T) {
	for _, id := range []string{"a", "caf\u00e9", "\u65e5\u672c", "emoji \U0001F600", "a b/c?d", strings.Repeat("x", MaxSessionIDBytes),
		strings.Repeat("\u00e9", MaxSessionIDBytes/2)} {
		assert.NoError(t, CheckSessionID(id), "%q", id)
	}
	for name, id := range invalidSessionIDs {
		err := CheckSessionID(id)
		require.ErrorIs(t, err, ErrInvalidSessionID, name)
		assert.True(t, strings.HasPrefix(err.Error(), "eventbus: "), "%s: %v", name, err)
	}
	err := CheckSessionID("a\xff")
	assert.Contains(t, err.Error(), `"a\xff"`, "the id quoted, escaped")
	long := strings.Repeat("\xff", 1000)
	assert.Contains(t, CheckSessionID(long).Error(), "more than 256", "the length first")
	err = CheckSessionID(strings.Repeat("\xfe", 200))
	assert.Less(t, len(err.Error()), 64*4+80, "at most 64 bytes of the id quoted: %v", err)
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = CheckSessionID("a-valid-session-id") }))
}

// Every Hub method that takes a session id refuses one CheckSessionID
// refuses, and none becomes a session.
func TestHubRefusesInvalidSessionIDs(t *testing.T) {
	h := newTestHub(t, HubOptions{})
	for name, id := range invalidSessionIDs {
		t.Run(name, func(t *testing.T) {
			_, err := h.GetOrCreate(id)
			assert.ErrorIs(t, err, ErrInvalidSessionID, "GetOrCreate")
			_, err = h.Publish(id, Event{Type: "e"})
			assert.ErrorIs(t, err, ErrInvalidSessionID, "Publish")
			_, ok := h.Lookup(id)
			assert.False(t, ok, "Lookup")
			_, err = h.LookupSession(nil, id)
			assert.ErrorIs(t, err, ErrInvalidSessionID, "LookupSession")
			assert.False(t, errors.Is(err, ErrSessionNotFound), "LookupSession: invalid, not unknown")
			assert.False(t, h.Delete(id), "Delete")
		})
	}
	assert.Zero(t, h.Len(), "no invalid id became a session")
	assert.Zero(t, h.Stats().Created)
	_, err := h.GetOrCreate("caf\u00e9")
	require.NoError(t, err, "valid UTF-8 beyond ASCII is a session")
	_, err = h.Publish(strings.Repeat("x", MaxSessionIDBytes), Event{Type: "e"})
	require.NoError(t, err, "the longest id")
	assert.Equal(t, 2, h.Len())
}

// Both stream routes over HTTP, served from a Hub: "a%FF" and "a%FE" (and
// the other invalid ids) are 400 with a code, and create nothing; the
// single route's Lookup answers invalid_session_id, the multiplexed
// route's session list invalid_sessions naming the bad one by position,
// escaped.
func TestStreamRoutesRefuseInvalidSessionIDs(t *testing.T) {
	hub := newTestHub(t, HubOptions{})
	mux := http.NewServeMux()
	mux.Handle("GET /session/{id}/events", &Handler{Lookup: hub.LookupSession, Logger: (&logCapture{}).logger()})
	mux.Handle("GET /events", &MuxHandler{Handler: &Handler{Logger: (&logCapture{}).logger(), Lookup: hub.LookupSession}})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	_, err := hub.GetOrCreate("a")
	require.NoError(t, err)
	get := func(t *testing.T, method, path string) *http.Response {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, nil)
		require.NoError(t, err)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}
	for _, raw := range []string{"a%FF", "a%FE", "%80", "caf%C3", "%ED%A0%80", "%C0%AF"} {
		t.Run(raw, func(t *testing.T) {
			m := requireHTTPError(t, get(t, http.MethodGet, "/session/"+raw+"/events"), http.StatusBadRequest, "invalid_session_id")
			assert.Contains(t, m["error"], `is not valid UTF-8`)
			resp := get(t, http.MethodHead, "/session/"+raw+"/events")
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "HEAD")

			m = requireHTTPError(t, get(t, http.MethodGet, "/events?session=a&session="+raw), http.StatusBadRequest, "invalid_sessions")
			assert.Contains(t, m["error"], "session 2: eventbus: invalid session id: ")
			assert.Contains(t, m["error"], `is not valid UTF-8`)
			assert.NotContains(t, m, "session", "JSON cannot name it as it is")
			resp = get(t, http.MethodHead, "/events?session="+raw)
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "HEAD")
		})
	}
	m := requireHTTPError(t, get(t, http.MethodGet, "/events?session=a%FF"), http.StatusBadRequest, "invalid_sessions")
	assert.Contains(t, m["error"], `"a\xff"`, "named escaped, not as a\\ufffd")
	long := strings.Repeat("x", MaxSessionIDBytes+1)
	requireHTTPError(t, get(t, http.MethodGet, "/session/"+long+"/events"), http.StatusBadRequest, "invalid_session_id")
	requireHTTPError(t, get(t, http.MethodGet, "/events?session="+long), http.StatusBadRequest, "invalid_sessions")
	assert.Equal(t, 1, hub.Len(), "no stream created a session")
	// The valid neighbours of the refused ids are served.
	requireHTTPError(t, get(t, http.MethodGet, "/session/caf%C3%A9/events"), http.StatusNotFound, "session_not_found")
	assert.Equal(t, http.StatusOK, get(t, http.MethodHead, "/events?session=a").StatusCode)
}
