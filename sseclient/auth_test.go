package sseclient_test

// Access control against the real eventbus.Handler: its Authorize hook
// (Grant lifetimes, StatusError answers) and Revoke, in synctest bubbles
// over the in-memory pipes, so that lifetimes and waits are exact.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/sseclient"
)

// authLog records what the Authorize hook of a test saw: each request's
// Authorization and cursor.
type authLog struct {
	mu   sync.Mutex
	reqs []string
}

func (l *authLog) add(r *http.Request) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reqs = append(l.reqs, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")+"@"+r.URL.Query().Get("lastEventId"))
	return len(l.reqs)
}

func (l *authLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprint(l.reqs)
}

// tokens is a Credentials that hands out t1, t2, ... and records why.
type tokens struct {
	mu      sync.Mutex
	reasons []sseclient.CredentialsReason
}

func (tk *tokens) next(_ context.Context, reason sseclient.CredentialsReason) (sseclient.Credentials, error) {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	tk.reasons = append(tk.reasons, reason)
	return sseclient.Credentials{Token: fmt.Sprint("t", len(tk.reasons))}, nil
}

func (tk *tokens) String() string {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	return fmt.Sprint(tk.reasons)
}

func TestALifetimeEndsWithReauthenticateAndTheClientResumesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The first stream is granted 5 s, the second 500 ms (a server that
		// asks again at once), the third an hour.
		lifetimes := []time.Duration{5 * time.Second, 500 * time.Millisecond, time.Hour}
		var log authLog
		s := newServer(t, serverConfig{pipe: true, handler: func(h *eventbus.Handler) {
			h.Retry = 10 * time.Second // a backoff would take seconds: the reconnect must not wait for it
			h.Authorize = func(r *http.Request, _ string, _ *eventbus.EventBus) (eventbus.Grant, error) {
				n := log.add(r)
				return eventbus.Grant{Subject: "alice", Expires: time.Now().Add(lifetimes[min(n, len(lifetimes))-1])}, nil
			}
		}})
		c, rc := pipeClient(s, "a")
		var tk tokens
		c.Credentials = tk.next
		start(t, c)
		rc.wait(t, "open", time.Minute, func() bool { return len(rc.openedAt()) == 1 })
		s.publish("a", "note", nil)
		s.publish("a", "note", nil)
		rc.wait(t, "2 events", time.Minute, func() bool { return len(rc.events) == 2 })

		rc.wait(t, "the second stream", time.Minute, func() bool { return len(rc.openedAt()) == 2 })
		v := rc.snap()
		if got := v.openedAt()[1].Sub(v.openedAt()[0]); got != 5*time.Second {
			t.Fatalf("the second stream opened %v after the first, want its lifetime (5s): an immediate reconnect", got)
		}
		var se *sseclient.StreamError
		if !errors.As(v.errs[0], &se) || se.Kind != "reauthenticate" {
			t.Fatalf("errors %v", v.errs)
		}
		if d := v.delays(); len(d) != 1 || d[0] != 0 {
			t.Fatalf("delays %v, want one immediate reconnect", d)
		}
		s.publish("a", "note", nil)
		rc.wait(t, "event 3", time.Minute, func() bool { return len(rc.events) == 3 })

		// The second lifetime is short, right after an immediate reconnect:
		// the backoff, not a loop.
		rc.wait(t, "the third stream", time.Minute, func() bool { return len(rc.openedAt()) == 3 })
		v = rc.snap()
		if d := v.delays(); len(d) != 2 || d[1] == 0 || !v.openedAt()[2].Equal(v.openedAt()[1].Add(500*time.Millisecond+d[1])) {
			t.Fatalf("delays %v, opened %v: a quick second re-authentication must back off", d, v.openedAt())
		}
		s.publish("a", "note", nil)
		rc.wait(t, "event 4", time.Minute, func() bool { return len(rc.events) == 4 })
		v = rc.snap()
		wantIDs(t, v.ids(), seq(1, 4))
		if tk.String() != "[initial reauthenticate reauthenticate]" || log.String() != "[t1@ t2@2 t3@3]" {
			t.Fatalf("credentials asked for %v, requests %v", &tk, &log)
		}
		if len(v.resyncs) != 0 || len(v.caught) != 2 {
			t.Fatalf("resyncs %+v, caught up %+v: want two resumes and no loss", v.resyncs, v.caught)
		}
	})
}

func TestRevokeEndsExactlyTheSubjectAndItsReconnectIsRefusedForGood(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		valid := map[string]string{"ta": "alice", "tb": "bob"} // token -> subject
		s := newServer(t, serverConfig{pipe: true, handler: func(h *eventbus.Handler) {
			h.Authorize = func(r *http.Request, _ string, _ *eventbus.EventBus) (eventbus.Grant, error) {
				mu.Lock()
				defer mu.Unlock()
				subject, ok := valid[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
				if !ok {
					return eventbus.Grant{}, eventbus.Forbidden("access revoked")
				}
				return eventbus.Grant{Subject: subject}, nil
			}
		}})
		var reasons []sseclient.CredentialsReason
		alice, ra := pipeClient(s, "a")
		alice.Credentials = func(_ context.Context, reason sseclient.CredentialsReason) (sseclient.Credentials, error) {
			reasons = append(reasons, reason)
			return sseclient.Credentials{Token: "ta"}, nil // the application has no better one
		}
		done := make(chan error, 1)
		go func() { done <- alice.Run(context.Background()) }()
		bob, rb := pipeClient(s, "a")
		bob.Header = http.Header{"Authorization": {"Bearer tb"}}
		start(t, bob)
		ra.wait(t, "alice open", time.Minute, func() bool { return len(ra.openedAt()) == 1 })
		rb.wait(t, "bob open", time.Minute, func() bool { return len(rb.openedAt()) == 1 })
		s.publish("a", "note", nil)
		ra.wait(t, "alice's event", time.Minute, func() bool { return len(ra.events) == 1 })

		// The order Revoke asks for: the credentials first, then the streams.
		mu.Lock()
		delete(valid, "ta")
		mu.Unlock()
		if n := s.handler.Revoke("alice"); n != 1 {
			t.Fatalf("Revoke ended %d streams, want alice's one", n)
		}
		err := <-done
		var he *sseclient.HTTPError
		if !errors.As(err, &he) || he.StatusCode != 403 || he.Code != "forbidden" || he.Message != "access revoked" {
			t.Fatalf("Run returned %v", err)
		}
		var se *sseclient.StreamError
		if v := ra.snap(); len(v.errs) != 1 || !errors.As(v.errs[0], &se) || se.Kind != "revoked" || len(v.openedAt()) != 1 {
			t.Fatalf("alice: errors %v, %d streams", v.errs, len(v.openedAt()))
		}
		if fmt.Sprint(reasons) != "[initial revoked]" {
			t.Fatalf("reasons %v", reasons)
		}
		s.publish("a", "note", nil)
		rb.wait(t, "bob's events", time.Minute, func() bool { return len(rb.events) == 2 })
		if v := rb.snap(); len(v.errs) != 0 || len(v.openedAt()) != 1 {
			t.Fatalf("bob: errors %v, %d streams: another subject's stream must go on", v.errs, len(v.openedAt()))
		}
	})
}

func TestAuthorizeAnswers401And403(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const challenge = `Bearer realm="test", error="invalid_token"`
		s := newServer(t, serverConfig{pipe: true, handler: func(h *eventbus.Handler) {
			h.Authorize = func(r *http.Request, _ string, _ *eventbus.EventBus) (eventbus.Grant, error) {
				switch r.Header.Get("Authorization") {
				case "Bearer good":
					return eventbus.Grant{Subject: "alice"}, nil
				case "Bearer expired":
					return eventbus.Grant{Subject: "alice", Expires: time.Now()}, nil
				case "Bearer outsider":
					return eventbus.Grant{}, eventbus.Forbidden("not a member of this session")
				}
				return eventbus.Grant{}, eventbus.Unauthorized(challenge, "invalid token")
			}
		}})
		var reasons []sseclient.CredentialsReason
		creds := func(first, then string) func(context.Context, sseclient.CredentialsReason) (sseclient.Credentials, error) {
			reasons = nil
			return func(_ context.Context, reason sseclient.CredentialsReason) (sseclient.Credentials, error) {
				reasons = append(reasons, reason)
				if reason == sseclient.ReasonInitial {
					return sseclient.Credentials{Token: first}, nil
				}
				return sseclient.Credentials{Token: then}, nil
			}
		}
		var he *sseclient.HTTPError

		// No credentials at all: final at once.
		c, _ := pipeClient(s, "a")
		if err := c.Run(context.Background()); !errors.As(err, &he) || he.StatusCode != 401 || he.Code != "unauthorized" ||
			he.Message != "invalid token" || he.Challenge != challenge {
			t.Fatalf("without credentials: %v (challenge %q)", err, he.Challenge)
		}

		// A 401: asked once; the same bad token again is final.
		c, _ = pipeClient(s, "a")
		c.Credentials = creds("bad", "bad")
		if err := c.Run(context.Background()); !errors.As(err, &he) || he.StatusCode != 401 || he.Challenge != challenge {
			t.Fatalf("a bad token: %v", err)
		}
		if fmt.Sprint(reasons) != "[initial unauthorized]" {
			t.Fatalf("reasons %v", reasons)
		}

		// A 403, asked once, likewise.
		c, _ = pipeClient(s, "a")
		c.Credentials = creds("outsider", "outsider")
		if err := c.Run(context.Background()); !errors.As(err, &he) || he.StatusCode != 403 || he.Code != "forbidden" || he.Message != "not a member of this session" {
			t.Fatalf("a 403: %v", err)
		}
		if fmt.Sprint(reasons) != "[initial forbidden]" {
			t.Fatalf("reasons %v", reasons)
		}

		// A grant that has expired already is a 401 (credentials_expired),
		// never a stream that ends at once; fresh credentials open it.
		c, rc := pipeClient(s, "a")
		c.Credentials = creds("expired", "good")
		start(t, c)
		rc.wait(t, "open", time.Minute, func() bool { return len(rc.openedAt()) == 1 })
		if v := rc.snap(); len(v.errs) != 1 || !errors.As(v.errs[0], &he) || he.StatusCode != 401 || he.Code != "credentials_expired" ||
			fmt.Sprint(reasons) != "[initial unauthorized]" || v.delays()[0] != 0 {
			t.Fatalf("errors %v, reasons %v, delays %v", v.errs, reasons, v.delays())
		}

		// A failing Credentials is Run's final error.
		c, _ = pipeClient(s, "a")
		c.Credentials = func(context.Context, sseclient.CredentialsReason) (sseclient.Credentials, error) {
			return sseclient.Credentials{}, errors.New("logged out")
		}
		if err := c.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "logged out") {
			t.Fatalf("a failing Credentials: %v", err)
		}
	})
}
