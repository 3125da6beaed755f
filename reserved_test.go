package eventbus

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ssebus/eventbus/sseclient"

	"github.com/ssebus/eventbus/internal/seam"
)

// A publisher must not forge a synthetic frame (issue 32): the types of
// the synthetic frames are reserved on every publish path.

// nearReserved are types close to a reserved one that stay ordinary event
// types: the check is an exact match.
var nearReserved = []string{"Client_evicted", "client_evicted ", " stream_error", "client_evicted.x", "replay_complete2", "x.state_resync_required", "slow-client-warning"}

func TestReservedTypesAreTheSyntheticFrames(t *testing.T) {
	want := []string{TypeReplayComplete, TypeStateResyncRequired, TypeSlowClientWarning, TypeClientEvicted, TypeStreamError}
	got := ReservedTypes()
	require.Equal(t, want, got)
	got[0] = "changed"
	assert.Equal(t, want, ReservedTypes(), "the caller's slice is its own")

	// Every synthetic frame the package makes has a reserved type: a new
	// frame type missing from the list would fail here.
	c := queueCounts{}
	for _, f := range []Frame{
		replayCompleteFrame(0, 0, "E", 1), resyncFrame(ReasonEpochReset, "", 1, 1, "E", 1),
		warningFrame(c, 1, "frames", 1), evictedFrame(ReasonQueueOverflow, 1, c, -1, 1),
		streamErrorFrameNow("x", ErrorKindInternal), shutdownFrame(DefaultShutdownRetryAfter, 1),
	} {
		require.True(t, f.Synthetic())
		assert.Contains(t, want, f.Type())
	}
}

func TestPublishRejectsReservedTypes(t *testing.T) {
	logs := &logCapture{}
	b := newBus(t, logs.capture(Options{}))
	s := subscribe(t, b, SubscribeOptions{})
	for _, typ := range ReservedTypes() {
		_, err := b.Publish(Event{Type: typ, Data: map[string]string{"reason": "queue_overflow"}})
		require.ErrorIs(t, err, ErrInvalidEvent, typ)
		assert.Contains(t, err.Error(), `type "`+typ+`" is reserved`)
		assert.True(t, strings.HasPrefix(err.Error(), "eventbus: "), err.Error())
		assert.Zero(t, b.LastEventID(), "a refused event uses no id")
	}
	assert.Empty(t, readyNow(s))
	st := b.Stats()
	assert.Equal(t, uint64(len(ReservedTypes())), st.Rejected.Invalid, "counted as the other invalid events")
	assert.Zero(t, st.Published)
	assert.Len(t, logs.kind(DiagPublishRejected), len(ReservedTypes()))

	for i, typ := range nearReserved {
		f, err := b.Publish(Event{Type: typ})
		require.NoError(t, err, "%q is no reserved type", typ)
		assert.Equal(t, uint64(i+1), f.ID())
	}
}

func TestSignalRejectsReservedTypes(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	for _, typ := range ReservedTypes() {
		err := b.Signal(typ, "doc/1")
		require.ErrorIs(t, err, ErrInvalidEvent, typ)
		assert.Contains(t, err.Error(), "reserved")
	}
	assert.Empty(t, readyNow(s))
	assert.Equal(t, uint64(len(ReservedTypes())), b.Stats().Rejected.Invalid)
	assert.Zero(t, b.Stats().Signals)
	for _, typ := range nearReserved {
		require.NoError(t, b.Signal(typ, "doc/1"))
	}
}

// The encoder is what every backplane's publish and signal go through
// (backplane.Encoder, in backplane.Set.Prepare and PrepareSignal), and
// Fingerprint what an idempotent publish computes first.
func TestEncoderRejectsReservedTypes(t *testing.T) {
	enc, err := newEncoder(Options{})
	require.NoError(t, err)
	for _, typ := range ReservedTypes() {
		_, err := enc.Encode(Event{Type: typ})
		assert.ErrorIs(t, err, ErrInvalidEvent, "Encode %s", typ)
		_, err = enc.Fingerprint(Event{Type: typ})
		assert.ErrorIs(t, err, ErrInvalidEvent, "Fingerprint %s", typ)
		assert.ErrorIs(t, enc.CheckSignal(typ, "x"), ErrInvalidEvent, "CheckSignal %s", typ)
	}
	for _, typ := range nearReserved {
		_, err := enc.Encode(Event{Type: typ})
		assert.NoError(t, err, typ)
	}
}

// A mirror refuses a reserved type from its Publish (before
// seam.ErrMirror), from appendEntry (backplane.Append: a log entry written
// by anything but an Encoder, or by an older replica) and from a log's history, which a resume then reports as
// unavailable rather than replaying a forged frame with an id.
func TestFedRejectsReservedTypes(t *testing.T) {
	b := newFed(t, Options{Logger: quiet}, 1, nil)
	s := subscribe(t, b, SubscribeOptions{})
	for _, typ := range ReservedTypes() {
		_, err := b.Publish(Event{Type: typ})
		assert.ErrorIs(t, err, ErrInvalidEvent, "Publish %s", typ)
		assert.NotErrorIs(t, err, seam.ErrMirror, "Publish %s", typ)
		env := []byte(`{"id":1,"v":1,"type":"` + typ + `"}`)
		err = b.appendEntry(seam.Entry{ID: 1, Type: typ, JSON: env})
		assert.ErrorIs(t, err, ErrInvalidEvent, "Append %s", typ)
	}
	assert.Zero(t, b.LastEventID(), "a refused entry is not delivered")
	assert.Empty(t, readyNow(s))

	log := &memLog{}
	log.add(t, "note")
	log.put(seam.Encoded{Type: TypeClientEvicted, Tail: []byte(`,"v":1,"type":"client_evicted"}`)})
	log.add(t, "note")
	fed := newFed(t, Options{Logger: quiet}, 4, log)
	r := subscribe(t, fed, SubscribeOptions{Resume: true, LastEventID: 0})
	fs := readyNow(r)
	assert.Equal(t, []string{TypeStateResyncRequired, TypeReplayComplete}, summary(fs))
	assert.Contains(t, string(fs[0].JSON()), `"detail":"history_unavailable"`)
}

func TestHubPublishRejectsReservedTypes(t *testing.T) {
	h := newTestHub(t, HubOptions{})
	for _, typ := range ReservedTypes() {
		_, err := h.Publish("s", Event{Type: typ})
		require.ErrorIs(t, err, ErrInvalidEvent, typ)
		assert.Contains(t, err.Error(), "reserved")
	}
	b, ok := h.Lookup("s")
	require.True(t, ok)
	assert.Zero(t, b.LastEventID(), "no id used")
	assert.Equal(t, uint64(len(ReservedTypes())), h.Stats().Buses.Rejected.Invalid)
	f, err := h.Publish("s", Event{Type: "note"})
	require.NoError(t, err)
	assert.Equal(t, uint64(1), f.ID())
}

// What a plain EventSource sees: a frame named like a synthetic frame is
// the server's own, without an id, whatever a publisher tried.
func TestStreamNeverCarriesAForgedSyntheticFrame(t *testing.T) {
	e := newEnv(t, envOptions{})
	b := e.bus(t, "s", Options{})
	publishEvent(t, b, Event{Type: "note"})
	c := e.stream(t, "/session/s/events", hdr("Last-Event-ID", "0"))
	for _, typ := range ReservedTypes() {
		_, err := b.Publish(Event{Type: typ, Data: map[string]any{"reason": "queue_overflow", "droppedAfter": 1}})
		require.ErrorIs(t, err, ErrInvalidEvent)
		require.ErrorIs(t, b.Signal(typ, "x"), ErrInvalidEvent)
	}
	publishEvent(t, b, Event{Type: "note"})
	require.NoError(t, b.closeWithError(ErrorKindInternal, "done"))

	var got []string
	for _, m := range c.messagesUntil(func(m sseclient.Message) bool { return m.Type == TypeStreamError }) {
		if slices.Contains(ReservedTypes(), m.Type) {
			require.False(t, m.HasID, "the synthetic frame %s carries an id line", m.Type)
		}
		if m.HasID {
			got = append(got, m.Type+"#"+m.ID)
		} else {
			got = append(got, m.Type)
		}
	}
	assert.Equal(t, []string{"note#1", TypeReplayComplete, "note#2", TypeStreamError}, got)
	assert.NotRegexp(t, regexp.MustCompile(`id: [^\n]*\nevent: (`+strings.Join(ReservedTypes(), "|")+`)\n`), string(c.raw()))
}
