package eventbus

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReadyGroup(t *testing.T) {
	b := newBus(t, Options{MaxSubscribers: 3})
	g := NewReadyGroup(3)
	s0 := subscribe(t, b, SubscribeOptions{Group: g})
	s1 := subscribe(t, b, SubscribeOptions{Group: g})
	require.Equal(t, g.Ready(), s1.Ready(), "a member's Ready is the group's")
	require.Empty(t, g.Woken(nil), "nothing signalled yet")

	publishN(t, b, 1)
	<-g.Ready()
	require.Equal(t, []int{0, 1}, g.Woken(nil), "both were waiting (new)")
	require.Same(t, s1, g.Member(1))
	require.Nil(t, g.Member(2))
	require.Nil(t, g.Member(-1))
	require.Empty(t, g.Woken(nil), "Woken clears the marks")
	fs, _ := s0.TakeReady(nil)
	require.Len(t, fs, 1)
	publishN(t, b, 1)
	// s0 took frames last time: it is not waiting, so it does not signal;
	// s1 has not taken since its first signal, so it does not either.
	require.Empty(t, g.Woken(nil))
	fs, _ = s0.TakeReady(nil)
	require.Len(t, fs, 1)
	fs, _ = s0.TakeReady(nil)
	require.Empty(t, fs, "empty: waiting now")
	publishN(t, b, 1)
	<-g.Ready()
	require.Equal(t, []int{0}, g.Woken(nil))

	s1.Close()
	<-g.Ready()
	require.Equal(t, []int{1}, g.Woken(nil), "an end signals")

	// A full bus takes no place in the group; a full group is an error.
	subscribe(t, b, SubscribeOptions{Group: g})
	_, err := b.Subscribe(context.Background(), SubscribeOptions{Group: g})
	require.ErrorIs(t, err, ErrInvalidOption, "the group is full")
	full := newBus(t, Options{MaxSubscribers: 1})
	subscribe(t, full, SubscribeOptions{})
	g2 := NewReadyGroup(1)
	_, err = full.Subscribe(context.Background(), SubscribeOptions{Group: g2})
	require.ErrorIs(t, err, ErrSubscriberLimitExceeded)
	require.Nil(t, g2.Member(0), "the refused subscription gave its number back")
	s1b := subscribe(t, newBus(t, Options{}), SubscribeOptions{Group: g2})
	require.Same(t, s1b, g2.Member(0))
	require.Panics(t, func() { NewReadyGroup(0) })
}

// TestReadyGroupChunks: a group sized for many members allocates their
// places as members take them (a chunk of 8 at a time), numbers members
// across chunks, gives a left place to the next member, and is full at its
// size.
func TestReadyGroupChunks(t *testing.T) {
	b := newBus(t, Options{MaxSubscribers: 64})
	g := NewReadyGroup(20)
	chunks := func() (n int) {
		for i := range g.chunks {
			if g.chunks[i].Load() != nil {
				n++
			}
		}
		return n
	}
	require.Equal(t, 0, chunks(), "no place before a member")
	subs := make([]*Subscription, 0, 20)
	for range 9 {
		subs = append(subs, subscribe(t, b, SubscribeOptions{Group: g}))
	}
	require.Equal(t, 2, chunks(), "9 members: two chunks of 8")
	require.Same(t, subs[8], g.Member(8))
	require.Nil(t, g.Member(9), "a place of an allocated chunk nobody took")
	require.Nil(t, g.Member(16), "a place of a chunk not allocated")

	publishN(t, b, 1)
	<-g.Ready()
	require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7, 8}, g.Woken(nil))

	subs[3].Close()
	<-g.Ready()
	require.Equal(t, []int{3}, g.Woken(nil), "an ended member is named once more")
	g.leave(subs[3])
	require.Nil(t, g.Member(3))
	s := subscribe(t, b, SubscribeOptions{Group: g})
	require.Same(t, s, g.Member(3), "the lowest free place")
	for range 11 {
		subscribe(t, b, SubscribeOptions{Group: g})
	}
	require.Equal(t, 3, chunks())
	_, err := b.Subscribe(context.Background(), SubscribeOptions{Group: g})
	require.ErrorIs(t, err, ErrInvalidOption, "20 members: full")
}
