package eventbus

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ---------------------------------------------------------------------------
// New and options (SPEC 1.2).

func TestNewZeroOptionsMeanDefaults(t *testing.T) {
	b, err := New(Options{})
	require.NoError(t, err)
	defer b.Close()
	o := b.opts
	assert.Equal(t, DefaultRingSize, o.RingSize)
	assert.Equal(t, DefaultRingMaxBytes, o.RingMaxBytes)
	assert.Equal(t, DefaultMaxEventBytes, o.MaxEventBytes)
	assert.Equal(t, DefaultMaxSubscribers, o.MaxSubscribers)
	assert.Equal(t, DefaultMaxQueued, o.MaxQueued)
	assert.Equal(t, DefaultMaxQueuedBytes, o.MaxQueuedBytes)
	assert.Equal(t, DefaultReplayBudgetBytes, o.ReplayBudgetBytes)

	// The defaults reach a subscription too.
	s := subscribe(t, b, SubscribeOptions{})
	c := s.q.counts()
	assert.Equal(t, DefaultMaxQueued, c.maxQueued)
	assert.Equal(t, DefaultMaxQueuedBytes, c.maxBytes)
}

func TestNewKeepsPositiveOptions(t *testing.T) {
	b, err := New(Options{
		RingSize: 1, RingMaxBytes: 2, MaxEventBytes: 3, MaxSubscribers: 4,
		MaxQueued: 5, MaxQueuedBytes: 6, ReplayBudgetBytes: 7,
	})
	require.NoError(t, err)
	defer b.Close()
	o := b.opts
	assert.Equal(t, []int{1, 2, 3, 4, 5, 6, 7},
		[]int{o.RingSize, o.RingMaxBytes, o.MaxEventBytes, o.MaxSubscribers, o.MaxQueued, o.MaxQueuedBytes, o.ReplayBudgetBytes})
}

func TestNewRejectsNegativeOptions(t *testing.T) {
	for name, set := range map[string]func(*Options){
		"RingSize":          func(o *Options) { o.RingSize = -1 },
		"RingMaxBytes":      func(o *Options) { o.RingMaxBytes = -1 },
		"MaxEventBytes":     func(o *Options) { o.MaxEventBytes = -1 },
		"MaxSubscribers":    func(o *Options) { o.MaxSubscribers = -1 },
		"MaxQueued":         func(o *Options) { o.MaxQueued = -1 },
		"MaxQueuedBytes":    func(o *Options) { o.MaxQueuedBytes = -1 },
		"ReplayBudgetBytes": func(o *Options) { o.ReplayBudgetBytes = -1 },
	} {
		t.Run(name, func(t *testing.T) {
			var o Options
			set(&o)
			b, err := New(o)
			require.Error(t, err)
			assert.Nil(t, b)
			assert.ErrorIs(t, err, ErrInvalidOption)
			assert.Contains(t, err.Error(), name)
		})
	}
}

func TestNewRejectsRingSizeAboveMaxRingSize(t *testing.T) {
	b, err := New(Options{RingSize: MaxRingSize})
	require.NoError(t, err)
	require.NoError(t, b.Close())

	_, err = New(Options{RingSize: MaxRingSize + 1})
	assert.ErrorIs(t, err, ErrInvalidOption)
}

func TestNewRingSizeBoundsTheRing(t *testing.T) {
	b := newBus(t, Options{RingSize: 3})
	publishNumbered(t, b, 10)
	assert.Equal(t, 3, b.ring.Len())
	assert.Equal(t, uint64(8), b.ring.firstID())
}

func TestNewRingMaxBytesBoundsTheRing(t *testing.T) {
	b := newBus(t, Options{RingMaxBytes: 1000})
	for range 10 {
		publishSized(t, b, "t", 300)
	}
	assert.Equal(t, 3, b.ring.Len())
	assert.Equal(t, 900, b.ring.Bytes())
	assert.Equal(t, uint64(8), b.ring.firstID())
}

func TestNewMaxEventBytesLimitsPublish(t *testing.T) {
	b := newBus(t, Options{MaxEventBytes: 200})
	publishSized(t, b, "t", 200)
	_, err := b.Publish(sizedEvent(t, 2, 201))
	assert.ErrorIs(t, err, ErrEventTooLarge)
}

func TestNewMaxSubscribersLimitsSubscribe(t *testing.T) {
	b := newBus(t, Options{MaxSubscribers: 2})
	subscribe(t, b, SubscribeOptions{})
	subscribe(t, b, SubscribeOptions{})
	_, err := b.Subscribe(context.Background(), SubscribeOptions{})
	assert.ErrorIs(t, err, ErrSubscriberLimitExceeded)
}

func TestNewMaxQueuedIsTheSubscriptionDefault(t *testing.T) {
	b := newBus(t, Options{MaxQueued: 20})
	def := subscribe(t, b, SubscribeOptions{})
	own := subscribe(t, b, SubscribeOptions{MaxQueued: 30})
	assert.Equal(t, 20, def.q.counts().maxQueued)
	assert.Equal(t, 30, own.q.counts().maxQueued)

	publishNumbered(t, b, 21) // the 21st overflows the default subscriber only
	fs, open := def.AppendReady(nil)
	assert.False(t, open)
	assert.Equal(t, TypeClientEvicted, fs[len(fs)-1].Type())
	assert.Equal(t, 1, b.SubscriberCount())
	assert.Equal(t, 21, own.q.counts().liveCount)
}

func TestNewMaxQueuedBytesCapsEverySubscription(t *testing.T) {
	b := newBus(t, Options{MaxQueuedBytes: 1000})
	s1 := subscribe(t, b, SubscribeOptions{})
	s2 := subscribe(t, b, SubscribeOptions{MaxQueued: 2048})
	publishSized(t, b, "t", 600)
	publishSized(t, b, "t", 600)
	for _, s := range []*Subscription{s1, s2} {
		fs, open := s.AppendReady(nil)
		assert.False(t, open)
		assert.Equal(t, []string{"#1", TypeClientEvicted}, describe(fs))
		assert.ErrorIs(t, s.Err(), ErrEvicted)
	}
}

func TestNewReplayBudgetBytesLimitsResume(t *testing.T) {
	b := newBus(t, Options{ReplayBudgetBytes: 1000})
	for range 5 {
		publishSized(t, b, "t", 300)
	}
	s := subscribe(t, b, SubscribeOptions{Resume: true})
	fs, _ := s.AppendReady(nil)
	assert.Equal(t, seqOf(idRange(1, 3), TypeStateResyncRequired, TypeReplayComplete), describe(fs))
}

func TestNewLoggerReceivesDiagnostics(t *testing.T) {
	buf := &logCapture{}
	logger := buf.logger()
	b := newBus(t, Options{Logger: logger})
	_, err := b.Publish(Event{Type: ""})
	require.Error(t, err)
	assert.Contains(t, buf.String(), "publish rejected")
	assert.Contains(t, buf.String(), `"level":"WARN"`)
}

func TestNewNilLoggerUsesSlogDefault(t *testing.T) {
	buf := &logCapture{}
	logger := buf.logger()
	old := slog.Default()
	slog.SetDefault(logger)
	defer slog.SetDefault(old)

	b, err := New(Options{Now: testNow})
	require.NoError(t, err)
	defer b.Close()
	_, err = b.Publish(Event{Type: "a\nb"})
	require.Error(t, err)
	assert.Contains(t, buf.String(), "publish rejected")
}

func TestSubscribeRejectsNegativeMaxQueued(t *testing.T) {
	b := newBus(t, Options{})
	s, err := b.Subscribe(context.Background(), SubscribeOptions{MaxQueued: -1})
	assert.ErrorIs(t, err, ErrInvalidOption)
	assert.Nil(t, s)
	assert.Equal(t, 0, b.SubscriberCount())
}
