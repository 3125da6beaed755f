package eventbus

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ---------------------------------------------------------------------------
// Access control: StatusError answers of Lookup and Authorize, the order of
// the checks, stream lifetimes and revocation.

// authHandler is busHandler with an Authorize.
func authHandler(b *EventBus, logs *logCapture, authorize func(*http.Request, string, *EventBus) (Grant, error)) *Handler {
	h := busHandler(b, logs)
	h.Authorize = authorize
	return h
}

// serveOne runs h on one in-memory request and returns what it answered.
func serveOne(h http.Handler, method, target string, header http.Header) memState {
	w := newMemWriter()
	req := httptest.NewRequest(method, target, nil)
	for k, vs := range header {
		req.Header[k] = vs
	}
	h.ServeHTTP(w, req)
	return w.state()
}

func requireMemError(t *testing.T, st memState, status int, code string) map[string]any {
	t.Helper()
	return requireJSONError(t, st.status, st.header, []byte(st.body), status, code)
}

func TestStatusErrorAnswers(t *testing.T) {
	cause := errors.New("redis: connection refused")
	for _, tc := range []struct {
		name       string
		err        error
		status     int
		code, msg  string
		retryAfter string
		challenge  string
		logLevel   string // "" when not logged at Warn
	}{
		{"Unauthorized", Unauthorized(`Bearer realm="test", error="invalid_token"`, "token expired"), 401, "unauthorized", "token expired", "", `Bearer realm="test", error="invalid_token"`, ""},
		{"Forbidden", Forbidden("not a member of this session"), 403, "forbidden", "not a member of this session", "", "", ""},
		{"Unavailable rounds Retry-After up", Unavailable(2500*time.Millisecond, "session store unreachable"), 503, "unavailable", "session store unreachable", "3", "", "warn"},
		{"Unavailable sends at least a second", Unavailable(0, "later"), 503, "unavailable", "later", "1", "", "warn"},
		{"wrapped, with a cause that is not sent", fmt.Errorf("lookup: %w", &StatusError{Status: 503, Code: "backplane_down", Message: "try again", RetryAfter: time.Second, Err: cause}), 503, "backplane_down", "try again", "1", "", "warn"},
		{"code and message from the status", &StatusError{Status: http.StatusTooManyRequests, RetryAfter: 5 * time.Second}, 429, "too_many_requests", "Too Many Requests", "5", "", ""},
		{"a 404 of the embedder's", &StatusError{Status: 404, Code: "session_not_found", Message: "no such session"}, 404, "session_not_found", "no such session", "", "", ""},
	} {
		for _, hook := range []string{"Lookup", "Authorize"} {
			t.Run(tc.name+"/"+hook, func(t *testing.T) {
				logs := &logCapture{}
				b := newBus(t, logs.capture(Options{}))
				h := busHandler(b, logs)
				authorized := false
				if hook == "Lookup" {
					h.Lookup = func(*http.Request, string) (*EventBus, error) { return nil, tc.err }
					h.Authorize = func(*http.Request, string, *EventBus) (Grant, error) { authorized = true; return Grant{}, nil }
				} else {
					h.Authorize = func(*http.Request, string, *EventBus) (Grant, error) { return Grant{Subject: "x"}, tc.err }
				}
				st := serveOne(h, http.MethodGet, "/session/s/events", nil)
				m := requireMemError(t, st, tc.status, tc.code)
				require.Equal(t, tc.msg, m["error"])
				require.Len(t, m, 2, "error and code only: %v", m)
				require.NotContains(t, st.body, "redis", "the cause is logged, never sent")
				require.Equal(t, tc.retryAfter, st.header.Get("Retry-After"))
				require.Equal(t, tc.challenge, st.header.Get("WWW-Authenticate"))
				var exposed []string
				if tc.retryAfter != "" {
					exposed = append(exposed, "Retry-After")
				}
				if tc.challenge != "" {
					exposed = append(exposed, "WWW-Authenticate")
				}
				if exposed != nil {
					require.Equal(t, exposed[0], st.header.Get("Access-Control-Expose-Headers")[:len(exposed[0])],
						"a page of another origin reads Retry-After and WWW-Authenticate only when exposed")
				}
				require.False(t, authorized, "a refused lookup is not authorized")
				require.Zero(t, b.Stats().PeakSubscribers, "refused before subscribing")
				refused := append(logs.find("lookup refused"), logs.find("authorization refused")...)
				require.Len(t, refused, 1)
				require.Equal(t, strconv.Itoa(tc.status), refused[0].Attrs["status"])
				if tc.logLevel != "" {
					require.Contains(t, refused[0].Attrs["error"], tc.msg)
				}
			})
		}
	}

	t.Run("Error and Unwrap", func(t *testing.T) {
		se := &StatusError{Status: 503, Code: "unavailable", Message: "store down", Err: cause}
		require.Equal(t, "eventbus: 503 unavailable: store down: redis: connection refused", se.Error())
		require.ErrorIs(t, fmt.Errorf("x: %w", se), cause)
		require.Equal(t, "eventbus: 401 unauthorized: Unauthorized", (&StatusError{Status: 401}).Error())
	})
	t.Run("a status outside 400..599 is a 500", func(t *testing.T) {
		logs := &logCapture{}
		b := newBus(t, logs.capture(Options{}))
		h := authHandler(b, logs, func(*http.Request, string, *EventBus) (Grant, error) {
			return Grant{}, &StatusError{Status: http.StatusOK, Message: "fine?"}
		})
		st := serveOne(h, http.MethodGet, "/session/s/events", nil)
		requireMemError(t, st, http.StatusInternalServerError, "internal")
		require.Len(t, logs.find("authorization refused"), 1)
		require.Zero(t, b.Stats().PeakSubscribers)
	})
	t.Run("another Authorize error is a 500 whose cause is logged", func(t *testing.T) {
		logs := &logCapture{}
		b := newBus(t, logs.capture(Options{}))
		h := authHandler(b, logs, func(*http.Request, string, *EventBus) (Grant, error) { return Grant{}, cause })
		st := serveOne(h, http.MethodGet, "/session/s/events", nil)
		m := requireMemError(t, st, http.StatusInternalServerError, "internal")
		require.Equal(t, "authorization failed", m["error"])
		require.NotContains(t, st.body, "redis")
		require.Len(t, logs.find("authorization failed"), 1)
		require.Zero(t, b.Stats().PeakSubscribers)
	})
	t.Run("ServeHTTP answers as the Handler does", func(t *testing.T) {
		w := httptest.NewRecorder()
		Unauthorized(`Bearer realm="x"`, "log in").ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/login", nil))
		requireJSONError(t, w.Code, w.Header(), w.Body.Bytes(), http.StatusUnauthorized, "unauthorized")
		require.Equal(t, `Bearer realm="x"`, w.Header().Get("WWW-Authenticate"))
		require.Equal(t, "WWW-Authenticate", w.Header().Get("Access-Control-Expose-Headers"))
	})
	t.Run("a grant that already expired is a 401", func(t *testing.T) {
		logs := &logCapture{}
		b := newBus(t, logs.capture(Options{}))
		h := authHandler(b, logs, func(*http.Request, string, *EventBus) (Grant, error) {
			return Grant{Subject: "a", Expires: time.Now().Add(-time.Second)}, nil
		})
		st := serveOne(h, http.MethodGet, "/session/s/events", nil)
		requireMemError(t, st, http.StatusUnauthorized, "credentials_expired")
		require.Equal(t, `Bearer error="invalid_token", error_description="credentials expired"`, st.header.Get("WWW-Authenticate"),
			"every 401 carries a challenge")
		st = serveOne(h, http.MethodGet, "/session/s/events", http.Header{"Authorization": {"Token abc"}})
		require.Equal(t, `Token error="invalid_token", error_description="credentials expired"`, st.header.Get("WWW-Authenticate"),
			"in the scheme the client used")
		require.Zero(t, b.Stats().PeakSubscribers, "no stream that would end at once")
		requireRegistryEmpty(t, h)
	})
}

// requireRegistryEmpty checks that h keeps no stream after they all ended.
func requireRegistryEmpty(t *testing.T, h *Handler) {
	t.Helper()
	h.reg.mu.Lock()
	defer h.reg.mu.Unlock()
	require.Empty(t, h.reg.pending, "pending streams")
	require.Empty(t, h.reg.bySubject, "streams by subject")
}

func TestAuthorizeOrder(t *testing.T) {
	logs := &logCapture{}
	full := newBus(t, logs.capture(Options{MaxSubscribers: 1}))
	_, err := full.Subscribe(t.Context(), SubscribeOptions{})
	require.NoError(t, err)
	open := newBus(t, logs.capture(Options{}))
	var mu sync.Mutex
	var calls []string
	h := &Handler{
		Lookup: func(r *http.Request, _ string) (*EventBus, error) {
			switch r.PathValue("id") {
			case "full":
				return full, nil
			case "open":
				return open, nil
			}
			return nil, ErrSessionNotFound
		},
		Authorize: func(r *http.Request, _ string, bus *EventBus) (Grant, error) {
			mu.Lock()
			calls = append(calls, r.Method+" "+r.URL.Path)
			mu.Unlock()
			require.True(t, bus == full || bus == open, "Authorize gets Lookup's bus")
			if r.Header.Get("Authorization") != "Bearer good" {
				return Grant{}, Unauthorized(`Bearer realm="t"`, "credentials required")
			}
			return Grant{Subject: "u"}, nil
		},
		Logger:      logs.logger(),
		RetryJitter: -1,
		CORS:        &CORS{Origins: []string{"https://app.example"}, AllowHeaders: []string{"Authorization"}},
	}
	mux := http.NewServeMux()
	mux.Handle("/session/{id}/events", h)
	good := hdr("Authorization", "Bearer good")
	for _, tc := range []struct {
		name       string
		method     string
		target     string
		header     http.Header
		status     int
		code       string // "" for a 2xx
		authorizes bool
	}{
		{"a request check before Authorize", http.MethodGet, "/session/open/events?maxQueued=1", nil, 400, "invalid_max_queued", false},
		{"a bad filter before Authorize", http.MethodGet, "/session/open/events?types=Bad.*", nil, 400, "invalid_filter", false},
		{"not found before Authorize", http.MethodGet, "/session/nope/events", nil, 404, "session_not_found", false},
		{"a method before everything", http.MethodPost, "/session/open/events", nil, 405, "method_not_allowed", false},
		{"Authorize before the subscriber limit", http.MethodGet, "/session/full/events", nil, 401, "unauthorized", true},
		{"authorized, then the limit", http.MethodGet, "/session/full/events", good, 429, "subscriber_limit_exceeded", true},
		{"a HEAD is authorized too", http.MethodHead, "/session/open/events", nil, 401, "unauthorized", true},
		{"an authorized HEAD gets the headers", http.MethodHead, "/session/open/events", good, 200, "", true},
		{"a preflight needs no credentials", http.MethodOptions, "/session/open/events",
			hdr("Origin", "https://app.example", "Access-Control-Request-Method", "GET", "Access-Control-Request-Headers", "authorization, last-event-id"), 204, "", false},
		{"an OPTIONS that is no preflight", http.MethodOptions, "/session/open/events", nil, 204, "", false},
		{"a refused origin before Authorize", http.MethodGet, "/session/open/events", hdr("Origin", "https://evil.example"), 403, "origin_not_allowed", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			calls = nil
			mu.Unlock()
			st := serveOne(mux, tc.method, tc.target, tc.header)
			if tc.code != "" && tc.method != http.MethodHead {
				requireMemError(t, st, tc.status, tc.code)
			} else {
				require.Equal(t, tc.status, st.status, st.body)
			}
			mu.Lock()
			require.Equal(t, tc.authorizes, len(calls) == 1, "Authorize calls: %v", calls)
			mu.Unlock()
			require.Zero(t, open.Stats().PeakSubscribers, "nothing here subscribes")
			require.Equal(t, 1, full.SubscriberCount())
		})
	}
	t.Run("the preflight allows Authorization", func(t *testing.T) {
		st := serveOne(mux, http.MethodOptions, "/session/open/events",
			hdr("Origin", "https://app.example", "Access-Control-Request-Method", "GET", "Access-Control-Request-Headers", "Authorization"))
		require.Equal(t, http.StatusNoContent, st.status)
		require.Contains(t, st.header.Get("Access-Control-Allow-Headers"), "Authorization")
	})
	t.Run("a cross-origin 401 can be read by the page", func(t *testing.T) {
		st := serveOne(mux, http.MethodGet, "/session/open/events", hdr("Origin", "https://app.example"))
		requireMemError(t, st, http.StatusUnauthorized, "unauthorized")
		require.Equal(t, "https://app.example", st.header.Get("Access-Control-Allow-Origin"))
		require.Equal(t, "WWW-Authenticate", st.header.Get("Access-Control-Expose-Headers"))
		require.Equal(t, `Bearer realm="t"`, st.header.Get("WWW-Authenticate"))
	})
	t.Run("an authorized HEAD has the stream's headers and no subscription", func(t *testing.T) {
		st := serveOne(mux, http.MethodHead, "/session/open/events", good)
		require.Equal(t, "text/event-stream", st.header.Get("Content-Type"))
		require.Equal(t, open.Epoch(), st.header.Get("Event-Epoch"))
		require.Empty(t, st.body)
		requireRegistryEmpty(t, h)
	})
}

// gateFlush makes the handler's flush number n wait until release is
// called; reached is closed when it waits there.
func gateFlush(w *memWriter, n int) (reached <-chan struct{}, release func()) {
	r, g := make(chan struct{}), make(chan struct{})
	w.beforeFlush = func(i int) {
		if i == n {
			close(r)
			<-g
		}
	}
	var once sync.Once
	return r, func() { once.Do(func() { close(g) }) }
}

// eventRecords turns want-events into the records parseBody returns.
func eventRecords(evs ...sseEvent) []sseRecord {
	out := make([]sseRecord, len(evs))
	for i, e := range evs {
		out[i] = sseRecord{Kind: sseEventRecord, Event: e}
	}
	return out
}

func TestStreamLifetime(t *testing.T) {
	t.Run("ends after what was queued, and the resume loses nothing", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			logs := &logCapture{}
			b := newBus(t, logs.capture(Options{}))
			const lifetime = 10 * time.Second
			h := authHandler(b, logs, func(*http.Request, string, *EventBus) (Grant, error) {
				return Grant{Subject: "alice", Expires: time.Now().Add(lifetime)}, nil
			})
			h.Heartbeat = 3 * time.Second // beats while it lives, do not disturb the end
			w := newMemWriter()
			reached, release := gateFlush(w, 3) // the flush of event 2
			_, done := serveMem(h, w, "/session/s/events", nil)
			synctest.Wait()
			publishN(t, b, 1)
			synctest.Wait()
			publishN(t, b, 1)
			<-reached
			// While the writer is busy with event 2, events 3..5 queue up
			// and the lifetime ends.
			publishN(t, b, 3)
			time.Sleep(lifetime)
			synctest.Wait()
			require.Equal(t, 1, b.SubscriberCount(), "the stream cannot end while its writer is busy")
			release()
			<-done

			recs := parseBody(t, w.state().body)
			var got []sseRecord
			for _, r := range recs {
				if r.Kind == sseEventRecord {
					got = append(got, r)
				}
			}
			require.Equal(t, eventRecords(wantEvent(1), wantEvent(2), wantEvent(3), wantEvent(4), wantEvent(5),
				wantSynth(TypeStreamError, `{"error":"the stream's lifetime ended: reauthenticate and resume","errorKind":"reauthenticate"}`, "5")),
				got, "every queued event, then the terminal frame (without an id of its own)")
			require.Zero(t, b.SubscriberCount())
			requireRegistryEmpty(t, h)
			st := b.Stats()
			require.EqualValues(t, 5, st.FramesDelivered)

			// The client reconnects at once with its cursor and gets what
			// was published meanwhile, nothing twice.
			publishN(t, b, 2)
			w2 := newMemWriter()
			cancel, done2 := serveMem(h, w2, "/session/s/events", hdr("Last-Event-ID", "5"))
			synctest.Wait()
			cancel()
			<-done2
			require.Equal(t, append(eventRecords(wantEvent(6), wantEvent(7)), sseRecord{Kind: sseEventRecord, Event: wantReplayComplete(b, 2, 7, "7")}),
				parseBody(t, w2.state().body)[1:])
		})
	})

	t.Run("repeated lifetimes under a steady publisher: every id once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			logs := &logCapture{}
			b := newBus(t, logs.capture(Options{}))
			h := authHandler(b, logs, func(*http.Request, string, *EventBus) (Grant, error) {
				return Grant{Subject: "alice", Expires: time.Now().Add(time.Second)}, nil
			})
			ctx, stop := context.WithCancel(context.Background())
			published := make(chan int)
			go func() {
				n := 0
				defer func() { published <- n }()
				for ctx.Err() == nil {
					time.Sleep(7 * time.Millisecond)
					_, err := b.Publish(Event{Type: "e", Data: b.LastEventID() + 1})
					require.NoError(t, err)
					n++
				}
			}()
			var ids []uint64
			ends := 0
			cursor := ""
			for range 8 {
				w := newMemWriter()
				var header http.Header
				if cursor != "" {
					header = hdr("Last-Event-ID", cursor)
				}
				_, done := serveMem(h, w, "/session/s/events", header)
				<-done
				recs := parseBody(t, w.state().body)
				for _, r := range recs {
					if r.Kind != sseEventRecord {
						continue
					}
					switch r.Event.Type {
					case "e":
						id, err := strconv.ParseUint(r.Event.ID, 10, 64)
						require.NoError(t, err)
						ids = append(ids, id)
						cursor = r.Event.ID
					case TypeStreamError:
						require.Contains(t, r.Event.Data, `"errorKind":"reauthenticate"`)
						ends++
					}
				}
				require.Equal(t, TypeStreamError, recs[len(recs)-1].Event.Type, "each stream ends by its lifetime")
			}
			stop()
			n := <-published
			// The last stream's tail: resume once more, live only after it.
			w := newMemWriter()
			cancel, done := serveMem(h, w, "/session/s/events", hdr("Last-Event-ID", cursor))
			synctest.Wait()
			cancel()
			<-done
			for _, r := range parseBody(t, w.state().body) {
				if r.Kind == sseEventRecord && r.Event.Type == "e" {
					id, _ := strconv.ParseUint(r.Event.ID, 10, 64)
					ids = append(ids, id)
				}
			}
			require.Equal(t, 8, ends)
			require.Len(t, ids, n, "every published id, once")
			for i, id := range ids {
				require.Equal(t, uint64(i+1), id, "in order, no gap, no duplicate")
			}
			require.Greater(t, n, 8*100, "about 140 events a second for 8 seconds")
			requireRegistryEmpty(t, h)
		})
	})

	t.Run("no Expires: no bound", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			logs := &logCapture{}
			b := newBus(t, logs.capture(Options{}))
			h := authHandler(b, logs, func(*http.Request, string, *EventBus) (Grant, error) { return Grant{Subject: "alice"}, nil })
			w := newMemWriter()
			cancel, done := serveMem(h, w, "/session/s/events", nil)
			time.Sleep(24 * time.Hour)
			synctest.Wait()
			require.Equal(t, 1, b.SubscriberCount())
			cancel()
			<-done
			require.NotContains(t, w.state().body, TypeStreamError)
		})
	})

	t.Run("a lifetime that ends while the stream is busy", func(t *testing.T) {
		// A stream that always has a batch ready never waits in its select:
		// the end must be seen between batches too.
		synctest.Test(t, func(t *testing.T) {
			logs := &logCapture{}
			b := newBus(t, logs.capture(Options{MaxQueued: 2048}))
			h := authHandler(b, logs, func(*http.Request, string, *EventBus) (Grant, error) {
				return Grant{Expires: time.Now().Add(time.Second)}, nil
			})
			w := newMemWriter()
			var flushes atomic.Int32
			w.beforeFlush = func(n int) {
				flushes.Add(1)
				if n > 1 {
					// Each batch takes 100 ms to write, and more is
					// published meanwhile.
					publishN(t, b, 3)
					time.Sleep(100 * time.Millisecond)
				}
			}
			_, done := serveMem(h, w, "/session/s/events", nil)
			synctest.Wait()
			publishN(t, b, 1)
			<-done
			recs := parseBody(t, w.state().body)
			last := recs[len(recs)-1].Event
			require.Equal(t, TypeStreamError, last.Type)
			require.Contains(t, last.Data, `"errorKind":"reauthenticate"`)
			require.InDelta(t, 11, flushes.Load(), 1, "it ended at its lifetime, not later")
		})
	})
}

func TestRevoke(t *testing.T) {
	type conn struct {
		subject string
		c       *sseStream
	}
	e := newEnv(t, envOptions{handler: &Handler{Authorize: func(r *http.Request, _ string, _ *EventBus) (Grant, error) {
		return Grant{Subject: r.URL.Query().Get("as")}, nil
	}}})
	b := e.bus(t, "s", Options{})
	var conns []conn
	for _, subject := range []string{"alice", "bob", "alice", "", "alice-2"} {
		conns = append(conns, conn{subject, e.stream(t, "/session/s/events?as="+subject, nil)})
	}
	publishN(t, b, 1)
	for _, c := range conns {
		c.c.expect(wantEvent(1))
	}

	require.Equal(t, 2, e.h.Revoke("alice"), "alice's two streams")
	revoked := wantSynth(TypeStreamError, `{"error":"access revoked","errorKind":"revoked"}`, "1")
	for _, c := range conns {
		if c.subject == "alice" {
			require.Equal(t, eventRecords(revoked), c.c.rest(), "the terminal frame, then the end")
		}
	}
	require.Eventually(t, func() bool { return b.SubscriberCount() == 3 }, 5*time.Second, time.Millisecond)
	publishN(t, b, 1)
	for _, c := range conns {
		if c.subject != "alice" {
			c.c.expect(wantEvent(2))
		}
	}
	require.Zero(t, e.h.Revoke("alice"), "nothing left to revoke")
	require.Zero(t, e.h.Revoke("nobody"))
	require.Zero(t, e.h.Revoke(""), "a stream without a subject is not revocable by subject")
	require.Zero(t, (&Handler{}).Revoke("alice"), "a zero Handler")

	// A new stream of alice after the revocation is not affected.
	again := e.stream(t, "/session/s/events?as=alice", nil)
	publishN(t, b, 1)
	again.expect(wantEvent(3))
	require.Equal(t, 1, e.h.Revoke("alice"))
	require.Equal(t, eventRecords(wantSynth(TypeStreamError, `{"error":"access revoked","errorKind":"revoked"}`, "3")), again.rest())
	for _, c := range conns {
		if c.subject != "alice" {
			require.NoError(t, c.c.resp.Body.Close())
		}
	}
	require.Eventually(t, func() bool { return b.SubscriberCount() == 0 }, 5*time.Second, time.Millisecond)
	requireRegistryEmpty(t, e.h)
}

func TestRevokeDropsWhatWasQueued(t *testing.T) {
	logs := &logCapture{}
	b := newBus(t, logs.capture(Options{}))
	h := authHandler(b, logs, func(*http.Request, string, *EventBus) (Grant, error) { return Grant{Subject: "alice"}, nil })
	w := newMemWriter()
	reached, release := gateFlush(w, 2) // the flush of event 1
	defer release()
	_, done := serveMem(h, w, "/session/s/events", nil)
	require.Eventually(t, func() bool { return b.SubscriberCount() == 1 }, 5*time.Second, time.Millisecond)
	publishN(t, b, 1)
	waitClosed(t, reached, "the writer did not reach the flush of event 1")
	publishN(t, b, 4) // queued while access is revoked
	require.Equal(t, 1, h.Revoke("alice"))
	release()
	waitClosed(t, done, "a revoked stream ends")
	require.Equal(t, []sseRecord{
		{Kind: sseRetryRecord, Retry: 3000},
		{Kind: sseEventRecord, Event: wantEvent(1)},
		{Kind: sseEventRecord, Event: wantSynth(TypeStreamError, `{"error":"access revoked","errorKind":"revoked"}`, "1")},
	}, parseBody(t, w.state().body), "no event taken after Revoke is written")
	st := b.Stats()
	require.EqualValues(t, 1, st.FramesDelivered)
	require.EqualValues(t, 4, st.Dropped.Cancelled, "the queued events are counted as dropped")
	requireRegistryEmpty(t, h)
}

func TestRevokeWhileAuthorizing(t *testing.T) {
	// Authorize blocks until the test lets it return; Revoke calls made
	// meanwhile decide whether the stream starts revoked.
	for _, tc := range []struct {
		name    string
		revoke  []string
		revoked bool
	}{
		{"its subject", []string{"alice"}, true},
		{"another subject", []string{"bob"}, false},
		{"its subject among others", []string{"bob", "alice", "carol"}, true},
		{"more revocations than it remembers: revoked whatever its subject", manySubjects(maxRevokedDuring + 1), true},
		{"exactly as many as it remembers", manySubjects(maxRevokedDuring), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &logCapture{}
			b := newBus(t, logs.capture(Options{}))
			entered, proceed := make(chan struct{}), make(chan struct{})
			h := authHandler(b, logs, func(*http.Request, string, *EventBus) (Grant, error) {
				close(entered)
				<-proceed
				return Grant{Subject: "alice"}, nil
			})
			w := newMemWriter()
			cancel, done := serveMem(h, w, "/session/s/events", nil)
			defer cancel()
			waitClosed(t, entered, "Authorize was not called")
			for _, s := range tc.revoke {
				require.Zero(t, h.Revoke(s), "a stream being authorized is not counted")
			}
			close(proceed)
			if tc.revoked {
				waitClosed(t, done, "a stream revoked while it was authorized ends at once")
				require.Equal(t, []sseRecord{
					{Kind: sseRetryRecord, Retry: 3000},
					{Kind: sseEventRecord, Event: wantSynth(TypeStreamError, `{"error":"access revoked","errorKind":"revoked"}`, "")},
				}, parseBody(t, w.state().body))
			} else {
				require.Eventually(t, func() bool { return b.SubscriberCount() == 1 }, 5*time.Second, time.Millisecond)
				publishN(t, b, 1)
				require.Eventually(t, func() bool { return w.state().flushes == 2 }, 5*time.Second, time.Millisecond)
				require.Equal(t, 1, h.Revoke("alice"), "filed under its subject")
				waitClosed(t, done, "revoked")
			}
			requireRegistryEmpty(t, h)
		})
	}
}

func manySubjects(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "s" + strconv.Itoa(i)
	}
	return out
}

// TestRevokeRace checks the ordering rule under contention: once the
// credentials are invalid and Revoke has returned, every stream of the
// subject is ended or was refused, whatever the interleaving.
func TestRevokeRace(t *testing.T) {
	for round := range 20 {
		logs := &logCapture{}
		b := newBus(t, logs.capture(Options{MaxSubscribers: 1000}))
		var valid atomic.Bool
		valid.Store(true)
		h := authHandler(b, logs, func(r *http.Request, _ string, _ *EventBus) (Grant, error) {
			subject := r.URL.Query().Get("as")
			ok := subject != "alice" || valid.Load()
			// A credential store's answer takes a while: a Revoke may come
			// between the check and the grant.
			d, _ := strconv.Atoi(r.URL.Query().Get("d"))
			time.Sleep(time.Duration(d) * 50 * time.Microsecond)
			if !ok {
				return Grant{}, Unauthorized(`Bearer realm="t"`, "logged out")
			}
			return Grant{Subject: subject}, nil
		})
		const streams = 24
		type result struct {
			subject string
			w       *memWriter
			cancel  func()
			done    <-chan struct{}
		}
		results := make([]result, streams)
		var wg sync.WaitGroup
		for i := range streams {
			subject := "alice"
			if i%3 == 0 {
				subject = "bob"
			}
			wg.Go(func() {
				w := newMemWriter()
				cancel, done := serveMem(h, w, "/session/s/events?as="+subject+"&d="+strconv.Itoa(i%7), nil)
				results[i] = result{subject, w, cancel, done}
			})
		}
		// Log alice out somewhere in the middle of the openings.
		time.Sleep(time.Duration(round%5) * 100 * time.Microsecond)
		valid.Store(false)
		h.Revoke("alice")
		wg.Wait()
		for _, r := range results {
			if r.subject == "alice" {
				waitClosed(t, r.done, "every stream of alice ends: revoked or refused")
				st := r.w.state()
				if st.status == http.StatusUnauthorized {
					continue
				}
				recs := parseBody(t, st.body)
				require.Equal(t, TypeStreamError, recs[len(recs)-1].Event.Type, "round %d: %q", round, st.body)
				require.Contains(t, recs[len(recs)-1].Event.Data, `"errorKind":"revoked"`)
			}
		}
		require.Eventually(t, func() bool { return b.SubscriberCount() == streams/3 }, 5*time.Second, time.Millisecond, "bob's streams stay")
		for _, r := range results {
			r.cancel()
			waitClosed(t, r.done, "cancelled")
			if r.subject == "bob" {
				require.NotContains(t, r.w.state().body, TypeStreamError)
			}
		}
		requireRegistryEmpty(t, h)
	}
}

// One Authorize for both routes, told the session it decides on (issue
// 33): a deny-list written against the session refuses the denied one on
// the single route and on a multiplexed stream alike, and allows the
// others on both. (Before, a MuxHandler sharing the Handler called its
// Authorize with the request alone, whose r.PathValue("id") is empty on
// the multiplexed route: a check written that way refused every
// multiplexed request, or, as a deny-list, let every one through.)
func TestAuthorizeIsToldTheSessionOnBothRoutes(t *testing.T) {
	var mu sync.Mutex
	var asked []string
	e := newEnv(t, envOptions{handler: &Handler{Authorize: func(_ *http.Request, session string, bus *EventBus) (Grant, error) {
		mu.Lock()
		asked = append(asked, session)
		mu.Unlock()
		if bus == nil {
			return Grant{}, errors.New("no bus")
		}
		if session == "secret" {
			return Grant{}, Forbidden("not yours")
		}
		return Grant{Subject: "u"}, nil
	}}})
	for _, id := range []string{"a", "b", "secret"} {
		e.bus(t, id, Options{})
	}
	take := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := asked
		asked = nil
		return out
	}

	status := func(path string) int {
		resp := e.do(t, http.MethodGet, path, nil)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, status("/session/a/events"))
	assert.Equal(t, []string{"a"}, take())
	require.Equal(t, http.StatusForbidden, status("/session/secret/events"))
	assert.Equal(t, []string{"secret"}, take())

	require.Equal(t, http.StatusOK, status("/events?session=a&session=b"))
	assert.Equal(t, []string{"a", "b"}, take(), "once per session, in order")
	require.Equal(t, http.StatusForbidden, status("/events?session=a&session=secret"), "the denied session refuses the multiplexed stream too")
	assert.Equal(t, []string{"a", "secret"}, take())
}
