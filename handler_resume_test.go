package eventbus

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// With EpochIDs the writer puts "id: <epoch>:" before each event's shared
// bytes: framing a batch allocates nothing, as without it.
func TestEpochIDsFramingDoesNotAllocate(t *testing.T) {
	b := newBus(t, Options{RingSize: 64})
	frames := publishN(t, b, 16)
	frames = append(frames, replayCompleteFrame(1, 16, b.Epoch(), 0))
	for _, epochIDs := range []bool{false, true} {
		s := stream{w: newMemWriter()}
		if epochIDs {
			s.idPrefix = []byte("id: " + b.Epoch() + ":")
		}
		s.reserve(frames)
		allocs := testing.AllocsPerRun(100, func() {
			s.buf = s.buf[:0]
			s.reserve(frames)
			for _, f := range frames {
				s.add(f)
			}
		})
		require.Zero(t, allocs, "epochIDs=%v", epochIDs)
		recs, err := parseSSE(s.buf)
		require.NoError(t, err)
		require.Len(t, recs, 17)
		for i, r := range recs[:16] {
			want := strconv.Itoa(i + 1)
			if epochIDs {
				want = b.Epoch() + ":" + want
			}
			require.Equal(t, want, r.Event.ID)
		}
	}
}
