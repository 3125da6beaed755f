package eventbus

import (
	"bytes"
	"fmt"
	"regexp"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ---------------------------------------------------------------------------
// Publish (SPEC 3, 4).

func TestPublishAssignsContiguousIDsFromOne(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	fs := publishNumbered(t, b, 3)
	assert.Equal(t, []string{"#1", "#2", "#3"}, describe(fs))
	got, _ := s.AppendReady(nil)
	assert.Equal(t, []string{"#1", "#2", "#3"}, describe(got))
	for i, f := range fs {
		assert.True(t, bytes.HasPrefix(f.JSON(), fmt.Appendf(nil, `{"id":%d,`, i+1)), "%s", f.JSON())
	}
}

func TestPublishReturnsTheStampedFrame(t *testing.T) {
	b := newBus(t, Options{})
	s := subscribe(t, b, SubscribeOptions{})
	f := publishEvent(t, b, Event{Type: "t", Data: 1})
	assert.Equal(t, uint64(1), f.ID())
	assert.Equal(t, "t", f.Type())
	assert.False(t, f.Synthetic())
	assert.False(t, f.Terminal())
	got, _ := s.AppendReady(nil)
	require.Len(t, got, 1)
	assert.Equal(t, f.String(), got[0].String())
}

func TestPublishOnClosedBusReturnsErrClosed(t *testing.T) {
	buf := &logCapture{}
	logger := buf.logger()
	b := newBus(t, Options{Logger: logger})
	publishNumbered(t, b, 2)
	require.NoError(t, b.Close())

	f, err := b.Publish(Event{Type: "t"})
	assert.ErrorIs(t, err, ErrClosed)
	assert.Equal(t, Frame{}, f)
	// Even an invalid event: the closed check comes first and is silent.
	_, err = b.Publish(Event{Type: ""})
	assert.ErrorIs(t, err, ErrClosed)
	assert.Equal(t, uint64(2), b.LastEventID(), "no id used")
	assert.Empty(t, buf.String())
}

func TestPublishNeverBlocksOnSubscriberThatNeverReads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBus(t, Options{MaxQueued: 16})
		stuck := subscribe(t, b, SubscribeOptions{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for range 10_000 {
				if _, err := b.Publish(Event{Type: "t", Data: "x"}); err != nil {
					panic(err)
				}
			}
		}()
		synctest.Wait() // every goroutine is done or durably blocked
		select {
		case <-done:
		default:
			t.Fatal("Publish blocked")
		}
		assert.Equal(t, uint64(10_000), b.LastEventID())
		assert.Equal(t, 0, b.SubscriberCount())
		assert.ErrorIs(t, stuck.Err(), ErrEvicted)
	})
}

// ---------------------------------------------------------------------------
// Accessors.

func TestLastEventIDIsZeroBeforeFirstPublish(t *testing.T) {
	b := newBus(t, Options{})
	assert.Equal(t, uint64(0), b.LastEventID())
	publishNumbered(t, b, 3)
	assert.Equal(t, uint64(3), b.LastEventID())
	_, _ = b.Publish(Event{}) // rejected: no change
	assert.Equal(t, uint64(3), b.LastEventID())
}

func TestEpochIs32LowercaseHexAndDiffersBetweenBuses(t *testing.T) {
	hex32 := regexp.MustCompile(`^[0-9a-f]{32}$`)
	seen := map[string]bool{}
	for range 20 {
		b := newBus(t, Options{})
		assert.Regexp(t, hex32, b.Epoch())
		assert.Equal(t, b.Epoch(), b.Epoch(), "stable for the bus")
		assert.False(t, seen[b.Epoch()], "epoch repeated")
		seen[b.Epoch()] = true
	}
}

func TestSubscriberCountTracksSubscriptions(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 16})
	assert.Equal(t, 0, b.SubscriberCount())
	s1 := subscribe(t, b, SubscribeOptions{})
	s2 := subscribe(t, b, SubscribeOptions{})
	s3 := subscribe(t, b, SubscribeOptions{MaxQueued: 100})
	assert.Equal(t, 3, b.SubscriberCount())
	s1.Close()
	assert.Equal(t, 2, b.SubscriberCount())
	publishNumbered(t, b, 17) // evicts s2
	assert.ErrorIs(t, s2.Err(), ErrEvicted)
	assert.Equal(t, 1, b.SubscriberCount())
	require.NoError(t, b.Close())
	assert.Equal(t, 0, b.SubscriberCount())
	assert.NoError(t, s3.Err())
}
