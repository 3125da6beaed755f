package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/ssebus/eventbus"
)

// The peers publish the same envelope bytes eventbus encodes (same fields,
// same order, same size up to the id and timestamp digits).
func TestEnvelopeMatchesEventbus(t *testing.T) {
	bus, err := eventbus.New(eventbus.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer bus.Close()
	sub, err := bus.Subscribe(context.Background(), eventbus.SubscribeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f, err := bus.Publish(eventbus.Event{Type: "bench", Data: benchData})
	if err != nil {
		t.Fatal(err)
	}
	sub.Close()
	ours := newEnvelope(f.ID())
	if len(ours) != len(f.JSON()) {
		t.Fatalf("size differs:\n ours %s\n bus  %s", ours, f.JSON())
	}
	var a, b map[string]any
	if err := json.Unmarshal(ours, &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(f.JSON(), &b); err != nil {
		t.Fatal(err)
	}
	delete(a["_meta"].(map[string]any), "serverTimestamp")
	delete(b["_meta"].(map[string]any), "serverTimestamp")
	aj, _ := json.Marshal(a)
	bj, _ := json.Marshal(b)
	if string(aj) != string(bj) {
		t.Fatalf("envelopes differ:\n ours %s\n bus  %s", ours, f.JSON())
	}
}
