package pgbus

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane/backplanetest"
)

// With SessionTTL, a session untouched for that long is deleted on every
// replica (its streams end); the next use starts a new epoch.
func TestSessionTTL(t *testing.T) {
	url, schema := testSchema(t)
	opts := testOptions(schema)
	opts.SessionTTL = 300 * time.Millisecond
	a, b, _ := threeReplicas(t, url, opts)
	sb := b.open(t, "s", nil, "")
	_, epoch, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
	if err != nil {
		t.Fatal(err)
	}
	wantIDs(t, sb.Events(1, wait), 1, 1)
	sb.Ended(wait)
	in, err := a.bp.Info(context.Background(), "s")
	if err != nil || in.Exists {
		t.Fatalf("info after the TTL: %+v, %v", in, err)
	}
	_, e2, err := a.bp.Publish(context.Background(), "s", eventbus.Event{Type: "e"})
	if err != nil || e2 == epoch {
		t.Fatalf("publish after the TTL: epoch %q (old %q), %v", e2, epoch, err)
	}
}

// New refuses invalid options.
func TestOptionsValidation(t *testing.T) {
	url, _ := testSchema(t)
	pool := newPool(t, url)
	for _, o := range []Options{
		{Schema: "Has-Upper"}, {Schema: "1x"}, {Schema: strings.Repeat("s", 49)},
		{PublishTimeout: -1}, {OutageTimeout: time.Microsecond}, {OutageTimeout: minOutageTimeout - time.Millisecond},
		{ReadCount: -1}, {SessionTTL: -1},
		{Bus: eventbus.Options{RingSize: -1}},
	} {
		if _, err := New(context.Background(), pool, o); !errors.Is(err, eventbus.ErrInvalidOption) {
			t.Errorf("New(%+v): %v", o, err)
		}
	}
	if _, err := New(context.Background(), nil, Options{}); !errors.Is(err, eventbus.ErrInvalidOption) {
		t.Errorf("New(nil pool): %v", err)
	}
}

// TestBackplane runs the conformance suite (package backplanetest): ids,
// order, epochs, resumes, trims, the replay budget, evictions, signals,
// DELETE, idempotency, outages (with .ci/pg.sh's control helper), a
// database back empty, idle release, Close.
func TestBackplane(t *testing.T) { backplanetest.Run(t, harness) }

// A signal's about must fit PostgreSQL's NOTIFY payload.
func TestSignalAboveTheNotifyPayloadLimit(t *testing.T) {
	url, schema := testSchema(t)
	a := newReplica(t, url, "A", testOptions(schema))
	if err := a.bp.Signal(context.Background(), "s", "t", strings.Repeat("a", 8000)); !errors.Is(err, eventbus.ErrEventTooLarge) {
		t.Fatalf("signal above the NOTIFY payload limit: %v", err)
	}
}
