package eventbus

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func ringIDs(r *ring) []uint64 {
	var out []uint64
	for i := range r.Len() {
		out = append(out, r.at(i).id)
	}
	return out
}

func appendRange(r *ring, from, to uint64, size int) {
	for id := from; id <= to; id++ {
		r.append(coreQueueFrame(id, size).ref())
	}
}

func TestRingEmpty(t *testing.T) {
	r := newRing(10, 1000)
	assert.Equal(t, 0, r.Len())
	assert.Equal(t, 0, r.Bytes())
	assert.Equal(t, uint64(0), r.firstID())
	assert.Equal(t, uint64(0), r.lastID())
	assert.Equal(t, -1, r.indexOf(0))
	assert.Equal(t, -1, r.indexOf(1))
}

func TestRingIndexOfIsOffsetFromFirstID(t *testing.T) {
	r := newRing(4, 1<<20)
	appendRange(&r, 1, 10, 10) // holds 7..10, wrapped
	require.Equal(t, []uint64{7, 8, 9, 10}, ringIDs(&r))
	for id := uint64(7); id <= 10; id++ {
		i := r.indexOf(id)
		assert.Equal(t, int(id-7), i)
		assert.Equal(t, id, r.at(i).id)
	}
	for _, id := range []uint64{0, 1, 6, 11, 1 << 63} {
		assert.Equal(t, -1, r.indexOf(id), "id %d", id)
	}
}

func TestRingIndexOfIsConstantTime(t *testing.T) {
	skipIfShort(t, "a timing check of 100,000 lookups")
	const n = 100_000
	r := newRing(n, 1<<30)
	appendRange(&r, 1, n, 1)
	// n lookups: a few milliseconds when O(1), seconds when each scans the
	// ring (n*n/2 = 5e9 steps). The bound is loose for -race and slow CI.
	start := time.Now()
	for i := range n {
		id := uint64(i) + 1
		if r.indexOf(id) != i {
			t.Fatalf("indexOf(%d) != %d", id, i)
		}
	}
	assert.Less(t, time.Since(start), 500*time.Millisecond, "indexOf looks linear")
}

func TestRingClearsOverwrittenSlots(t *testing.T) {
	// Dropped by count: the slot of the oldest is taken by the newest, and
	// no slot holds an id outside the ring.
	r := newRing(4, 1<<20)
	appendRange(&r, 1, 6, 10)
	require.Len(t, r.slots, 4)
	for i := range r.slots {
		assert.GreaterOrEqual(t, r.slots[i].Load().id, uint64(3))
	}

	// Dropped by bytes: the freed slot is zeroed, so the ring does not pin
	// the dropped frame's bytes.
	r = newRing(16, 250)
	appendRange(&r, 1, 3, 100) // 300 > 250: frame 1 goes
	require.Equal(t, []uint64{2, 3}, ringIDs(&r))
	assert.Nil(t, r.slots[1].Load(), "the slot of id 1")

	// reset releases everything.
	r.reset()
	assert.Nil(t, r.slots)
	assert.Equal(t, 0, r.Len())
	assert.Equal(t, 0, r.Bytes())
}

func TestRingBoundedByCount(t *testing.T) {
	r := newRing(5, 1<<20)
	appendRange(&r, 1, 100, 10)
	assert.Equal(t, 5, r.Len())
	assert.Equal(t, 50, r.Bytes())
	assert.Equal(t, []uint64{96, 97, 98, 99, 100}, ringIDs(&r))
	assert.Equal(t, uint64(96), r.firstID())
	assert.Equal(t, uint64(100), r.lastID())
}

func TestRingBoundedByBytes(t *testing.T) {
	r := newRing(100, 1000)
	appendRange(&r, 1, 10, 300)
	assert.Equal(t, []uint64{8, 9, 10}, ringIDs(&r))
	assert.Equal(t, 900, r.Bytes())
	// Exactly maxBytes is within the bound.
	r = newRing(100, 1000)
	appendRange(&r, 1, 4, 250)
	assert.Equal(t, []uint64{1, 2, 3, 4}, ringIDs(&r))
	assert.Equal(t, 1000, r.Bytes())
}

func TestRingNewestAlwaysStays(t *testing.T) {
	r := newRing(10, 100)
	appendRange(&r, 1, 3, 50)
	r.append(coreQueueFrame(4, 5000).ref()) // larger than the whole budget
	assert.Equal(t, []uint64{4}, ringIDs(&r))
	assert.Equal(t, 5000, r.Bytes())
	r.append(coreQueueFrame(5, 10).ref()) // now the big one goes
	assert.Equal(t, []uint64{5}, ringIDs(&r))
	assert.Equal(t, 10, r.Bytes())

	r = newRing(1, 1<<20)
	appendRange(&r, 1, 3, 10)
	assert.Equal(t, []uint64{3}, ringIDs(&r))
}

func TestRingGrowsByDoublingUpToMaxLen(t *testing.T) {
	r := newRing(100, 1<<20)
	assert.Empty(t, r.slots, "a quiet session pays for nothing")
	var sizes []int
	for id := uint64(1); id <= 250; id++ {
		r.append(coreQueueFrame(id, 1).ref())
		if len(sizes) == 0 || sizes[len(sizes)-1] != len(r.slots) {
			sizes = append(sizes, len(r.slots))
		}
	}
	assert.Equal(t, []int{16, 32, 64, 128}, sizes, "powers of two, up to the first at or above maxLen")
	assert.Equal(t, 100, r.Len(), "it still holds maxLen")
	assert.Equal(t, uint64(151), r.firstID())

	small := newRing(3, 1<<20)
	small.append(coreQueueFrame(1, 1).ref())
	assert.Len(t, small.slots, 4, "never above the power of two at or above maxLen")
	one := newRing(1, 1<<20)
	appendRange(&one, 1, 3, 1)
	assert.Len(t, one.slots, 1)
	assert.Equal(t, []uint64{3}, ringIDs(&one))
}

func TestRingLoadWithoutTheLock(t *testing.T) {
	r := newRing(8, 1<<20)
	assert.Nil(t, r.load(1), "empty")
	appendRange(&r, 1, 20, 1) // holds 13..20 in 8 slots
	for id := uint64(13); id <= 20; id++ {
		assert.Equal(t, id, r.load(id).id)
	}
	assert.Nil(t, r.load(12), "dropped: its slot holds 20")
	r.reset()
	assert.Nil(t, r.load(20))

	// A reader that holds the slots from before a grow finds what it wants
	// in the new ones.
	g := newRing(64, 1<<20)
	appendRange(&g, 1, 16, 1)
	old := g.view.Load()
	appendRange(&g, 17, 17, 1) // grows to 32
	require.NotSame(t, old, g.view.Load())
	assert.Nil(t, old.s[17&15].Load().idIf(17), "the old slots never see 17")
	assert.Equal(t, uint64(17), g.load(17).id)
}

func TestRingGrowthWhileWrappedKeepsOrder(t *testing.T) {
	// Bytes keep the ring short while the backing slice wraps; then larger
	// budgets are not possible on one ring, so wrap by count and grow a
	// fresh one: growth copies in order from head.
	r := newRing(100, 100)
	appendRange(&r, 1, 40, 10) // holds 31..40 (100 bytes), head has moved
	require.Equal(t, uint64(31), r.firstID())
	r.maxBytes = 1 << 20 // let it grow from here
	appendRange(&r, 41, 90, 10)
	want := make([]uint64, 0, 60)
	for id := uint64(31); id <= 90; id++ {
		want = append(want, id)
	}
	assert.Equal(t, want, ringIDs(&r))
	for _, id := range want {
		assert.Equal(t, id, r.at(r.indexOf(id)).id)
	}
}

func TestRingNonContiguousAppendRestarts(t *testing.T) {
	r := newRing(10, 1<<20)
	appendRange(&r, 1, 5, 10)
	r.append(coreQueueFrame(9, 10).ref())
	assert.Equal(t, []uint64{9}, ringIDs(&r))
	assert.Equal(t, 10, r.Bytes())
	assert.Equal(t, 0, r.indexOf(9))
	assert.Equal(t, -1, r.indexOf(5))
}

// idIf returns f when it has id, else nil.
func (f *frame) idIf(id uint64) *frame {
	if f != nil && f.id == id {
		return f
	}
	return nil
}
