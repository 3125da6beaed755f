package backplane_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
)

// The Encoder is package eventbus's own: an event encodes as Publish
// encodes it, and is refused as Publish refuses it.
func TestEncoderEncodesAsPublish(t *testing.T) {
	now := func() time.Time { return time.UnixMilli(1700000000000) }
	enc, err := backplane.NewEncoder(eventbus.Options{Now: now})
	require.NoError(t, err)
	b, err := eventbus.New(eventbus.Options{Now: now})
	require.NoError(t, err)
	defer b.Close()
	e := eventbus.Event{Type: "note", Data: map[string]int{"a": 1}, Meta: map[string]any{"k": "v"}, OriginatorClientID: "c1"}
	f, err := b.Publish(e)
	require.NoError(t, err)
	ev, err := enc.Encode(e)
	require.NoError(t, err)
	assert.Equal(t, "note", ev.Type)
	assert.Equal(t, string(f.JSON()), string(ev.Envelope(1)), "the envelope Publish makes, to the byte")

	_, err = enc.Encode(eventbus.Event{Type: eventbus.TypeReplayComplete})
	assert.ErrorIs(t, err, eventbus.ErrInvalidEvent)
	small, err := backplane.NewEncoder(eventbus.Options{MaxEventBytes: 40})
	require.NoError(t, err)
	_, err = small.Encode(eventbus.Event{Type: "e", Data: strings.Repeat("x", 40)})
	assert.ErrorIs(t, err, eventbus.ErrEventTooLarge)
	assert.ErrorIs(t, small.CheckSignal("e", strings.Repeat("x", 40)), eventbus.ErrEventTooLarge)
	assert.ErrorIs(t, enc.CheckSignal("", "x"), eventbus.ErrInvalidEvent)
	assert.NoError(t, enc.CheckSignal("changed", "doc/1"))
	_, err = backplane.NewEncoder(eventbus.Options{MaxEventBytes: -1})
	assert.ErrorIs(t, err, eventbus.ErrInvalidOption)
}

func TestEncoderFingerprint(t *testing.T) {
	tick := time.UnixMilli(1700000000000)
	enc, err := backplane.NewEncoder(eventbus.Options{Now: func() time.Time { tick = tick.Add(time.Second); return tick }})
	require.NoError(t, err)
	e := eventbus.Event{Type: "note", Data: json.RawMessage(`{"a": 1}`)}
	a, err := enc.Fingerprint(e)
	require.NoError(t, err)
	assert.Regexp(t, `^[0-9a-f]{32}$`, a)
	b, err := enc.Fingerprint(eventbus.Event{Type: "note", Data: json.RawMessage(`{"a":1}`), Meta: map[string]any{"serverTimestamp": 5}})
	require.NoError(t, err)
	assert.Equal(t, a, b, "compacted data; the time of the attempt does not count")
	c, err := enc.Fingerprint(eventbus.Event{Type: "note", Data: json.RawMessage(`{"a":2}`)})
	require.NoError(t, err)
	assert.NotEqual(t, a, c)
	_, err = enc.Fingerprint(eventbus.Event{})
	assert.ErrorIs(t, err, eventbus.ErrInvalidEvent)
}
