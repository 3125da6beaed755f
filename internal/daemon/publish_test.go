package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ssebus/eventbus"
)

func TestIdempotencyKeyHeader(t *testing.T) {
	for _, c := range []struct {
		values []string
		key    string
		ok     bool
	}{
		{nil, "", false},
		{[]string{"k1"}, "k1", true},
		{[]string{""}, "", true},
		{[]string{"a", "b"}, "", true},
	} {
		r := httptest.NewRequest("POST", "/", nil)
		for _, v := range c.values {
			r.Header.Add("Idempotency-Key", v)
		}
		if key, ok := IdempotencyKey(r); key != c.key || ok != c.ok {
			t.Errorf("%q: %q %v, want %q %v", c.values, key, ok, c.key, c.ok)
		}
	}
}

func TestPublishErrorsWrite(t *testing.T) {
	var (
		errUnknown     = errors.New("unknown")
		errUnavailable = errors.New("unavailable")
		errReused      = errors.New("reused")
		errBadKey      = errors.New("bad key")
		errBadSession  = errors.New("bad session")
	)
	pe := PublishErrors{OutcomeUnknown: errUnknown, Unavailable: errUnavailable, KeyReused: errReused,
		InvalidKey: errBadKey, InvalidSession: errBadSession}
	for _, c := range []struct {
		err        error
		status     int
		code       string
		retryAfter bool
	}{
		// Outcome unknown wins over the unavailable it also wraps.
		{fmt.Errorf("%w (%w)", errUnknown, errUnavailable), 503, "publish_outcome_unknown", true},
		{fmt.Errorf("x: %w", errUnavailable), 503, "unavailable", true},
		{errReused, 422, "idempotency_key_reused", false},
		{errBadKey, 400, "invalid_idempotency_key", false},
		{errBadSession, 400, "invalid_session_id", false},
		{eventbus.CheckSessionID("a\xff"), 400, "invalid_session_id", false},
		{eventbus.ErrInvalidEvent, 400, "invalid_event", false},
		{eventbus.ErrEventTooLarge, 413, "event_too_large", false},
		{eventbus.ErrClosed, 503, "shutting_down", true},
	} {
		w := httptest.NewRecorder()
		if !pe.Write(w, c.err) {
			t.Fatalf("%v: not written", c.err)
		}
		var body map[string]string
		json.Unmarshal(w.Body.Bytes(), &body)
		if w.Code != c.status || body["code"] != c.code || (w.Header().Get("Retry-After") != "") != c.retryAfter {
			t.Fatalf("%v: %d %v Retry-After %q; want %d %s", c.err, w.Code, body, w.Header().Get("Retry-After"), c.status, c.code)
		}
		if c.code == "publish_outcome_unknown" && (!strings.Contains(body["error"], "may or may not") ||
			!strings.Contains(body["error"], "same Idempotency-Key") || !strings.Contains(body["error"], c.err.Error())) {
			t.Fatalf("outcome unknown body %q does not say what happened, why and how to retry", body["error"])
		}
	}
	w := httptest.NewRecorder()
	if pe.Write(w, errors.New("other")) || w.Body.Len() != 0 {
		t.Fatalf("an unknown error was written: %s", w.Body)
	}
	// Nil sentinels match nothing.
	if (PublishErrors{}).Write(httptest.NewRecorder(), errUnknown) {
		t.Fatal("an empty PublishErrors wrote an answer")
	}
}

func TestIdempotencyStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c Idempotency
		next := uint64(0)
		calls := 0
		publish := func() (uint64, error) { calls++; next++; return next, nil }
		pub := func(key, fp string) (uint64, bool, error) { return c.Publish(key, fp, publish) }

		if id, dup, err := pub("k", "f1"); id != 1 || dup || err != nil {
			t.Fatalf("first: %d %v %v", id, dup, err)
		}
		if id, dup, err := pub("k", "f1"); id != 1 || !dup || err != nil || calls != 1 {
			t.Fatalf("retry: %d %v %v, %d publishes", id, dup, err, calls)
		}
		if _, _, err := pub("k", "f2"); !errors.Is(err, eventbus.ErrIdempotencyKeyReused) || calls != 1 {
			t.Fatalf("other event: %v, %d publishes", err, calls)
		}
		time.Sleep(DefaultIdempotencyWindow - time.Second)
		if _, dup, _ := pub("k", "f1"); !dup {
			t.Fatal("forgotten within the window")
		}
		time.Sleep(time.Second) // the window, counted from the first publish
		if id, dup, _ := pub("k", "f1"); id != 2 || dup {
			t.Fatalf("after the window: %d %v, want a new publish", id, dup)
		}
		// A failed publish records nothing.
		boom := errors.New("boom")
		if _, _, err := c.Publish("x", "f", func() (uint64, error) { return 0, boom }); err != boom {
			t.Fatalf("failed publish: %v", err)
		}
		if id, dup, _ := pub("x", "f"); dup || id != 3 {
			t.Fatalf("after a failed publish: %d %v", id, dup)
		}
	})
}

// At most Max keys are held; the oldest is forgotten first.
func TestIdempotencyStoreBound(t *testing.T) {
	c := Idempotency{Max: 3}
	next := uint64(0)
	publish := func() (uint64, error) { next++; return next, nil }
	for _, k := range []string{"a", "b", "c", "d"} {
		c.Publish(k, "f", publish)
	}
	if len(c.byKey) != 3 || len(c.order) != 3 {
		t.Fatalf("%d keys, %d entries held, want 3", len(c.byKey), len(c.order))
	}
	if _, dup, _ := c.Publish("a", "f", publish); dup {
		t.Fatal("the oldest key was not forgotten")
	}
	if id, dup, _ := c.Publish("d", "f", publish); !dup || id != 4 {
		t.Fatalf("d: %d %v", id, dup)
	}
}

// Concurrent publishes with one key publish once.
func TestIdempotencyStoreConcurrent(t *testing.T) {
	var c Idempotency
	var mu sync.Mutex
	calls := 0
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			c.Publish("k", "f", func() (uint64, error) {
				mu.Lock()
				defer mu.Unlock()
				calls++
				return 1, nil
			})
		})
	}
	wg.Wait()
	if calls != 1 {
		t.Fatalf("%d publishes for one key", calls)
	}
}
