package eventbus

// The stream engine (stream.go) through its public seam (transport.go),
// with an in-memory Transport that records what it is given: the ends,
// the sessions a stream gains and loses while it is served (Add, Remove),
// the cursor a transport reads, the calls' contract. The SSE transport's
// bytes are handler_test.go's and mux_test.go's.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ssebus/eventbus/internal/muxcursor"
)

// recBatch is what a recTransport was given in one WriteBatch.
type recBatch struct {
	frames []string // "session:type#id"
	cursor string   // the cursor after the batch, when CursorMoved
	moved  bool
}

// recTransport is a Transport that records its batches on a channel.
// block, when set, holds WriteBatch until it is closed; fail makes
// WriteBatch return it; panics makes the next WriteBatch panic.
type recTransport struct {
	batches     chan recBatch
	keepalives  atomic.Int32
	interrupted atomic.Int32
	block       atomic.Pointer[chan struct{}]
	fail        atomic.Pointer[error]
	panics      atomic.Bool
}

func newRecTransport() *recTransport { return &recTransport{batches: make(chan recBatch, 1024)} }

func (t *recTransport) WriteBatch(b *Batch) error {
	if t.panics.CompareAndSwap(true, false) {
		panic("recTransport: boom")
	}
	if block := t.block.Load(); block != nil {
		<-*block
	}
	rb := recBatch{moved: b.CursorMoved()}
	for i := range b.Len() {
		f, m := b.Frame(i), b.Member(i)
		rb.frames = append(rb.frames, fmt.Sprintf("%s:%s#%d", m.Session(), f.Type(), f.ID()))
		if !strings.HasPrefix(string(f.JSON()), "{") || len(m.SessionMember()) == 0 {
			panic("recTransport: a frame without its envelope or member")
		}
	}
	if rb.moved {
		rb.cursor = string(b.AppendCursor(nil, b.Len()-1))
	}
	t.batches <- rb
	if err := t.fail.Load(); err != nil {
		return *err
	}
	return nil
}

func (t *recTransport) Keepalive() error { t.keepalives.Add(1); return nil }
func (t *recTransport) Interrupt()       { t.interrupted.Add(1) }

// next returns the next batch, waiting for it (in a synctest bubble, until
// every goroutine is blocked).
func (t *recTransport) next(tb testing.TB) recBatch {
	tb.Helper()
	select {
	case b := <-t.batches:
		return b
	case <-time.After(10 * time.Second):
		tb.Fatal("no batch")
		return recBatch{}
	}
}

// frames returns the frames of the batches until one holds want (or the
// stream has none left), concatenated, and the last cursor seen.
func (t *recTransport) until(tb testing.TB, want string) (frames []string, cursor string) {
	tb.Helper()
	for {
		b := t.next(tb)
		frames = append(frames, b.frames...)
		if b.moved {
			cursor = b.cursor
		}
		for _, f := range b.frames {
			if f == want {
				return frames, cursor
			}
		}
	}
}

// engineEnv is a MuxHandler over a map of buses, with an Authorize that
// grants each session the subject "user-<session>" and, when expires is
// set, a lifetime.
type engineEnv struct {
	buses   map[string]*EventBus
	h       *Handler
	m       *MuxHandler
	expires map[string]time.Time
}

func newEngineEnv(t *testing.T, maxSessions int, ids ...string) *engineEnv {
	e := &engineEnv{buses: map[string]*EventBus{}, expires: map[string]time.Time{}}
	for _, id := range ids {
		e.buses[id] = newBus(t, Options{RingSize: 64})
	}
	e.h = &Handler{
		Lookup: func(_ *http.Request, s string) (*EventBus, error) {
			if b := e.buses[s]; b != nil {
				return b, nil
			}
			return nil, ErrSessionNotFound
		},
		Authorize: func(_ *http.Request, s string, _ *EventBus) (Grant, error) {
			if s == "forbidden" {
				return Grant{}, Forbidden("not yours")
			}
			return Grant{Subject: "user-" + s, Expires: e.expires[s]}, nil
		},
	}
	e.m = &MuxHandler{Handler: e.h, MaxStreamSessions: maxSessions}
	return e
}

// open opens a stream for query, failing the test when it is refused.
func (e *engineEnv) open(t *testing.T, query string) *Stream {
	t.Helper()
	w := httptest.NewRecorder()
	st := e.m.OpenStream(w, httptest.NewRequest(http.MethodGet, "/ws?"+query, nil))
	require.NotNil(t, st, "refused: %d %s", w.Code, w.Body)
	return st
}

// serve runs st.Serve on its own goroutine; the returned func cancels its
// context and returns its end.
func serve(tb testing.TB, st *Stream, t Transport) (stop func() StreamEnd, done <-chan StreamEnd) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan StreamEnd, 1)
	finished := make(chan struct{})
	go func() { ch <- st.Serve(ctx, t); close(finished) }()
	// A test that fails leaves no stream running (synctest would call it
	// a deadlock, goleak a leak).
	tb.Cleanup(func() {
		cancel()
		if tr, ok := t.(*recTransport); ok {
			if block := tr.block.Swap(nil); block != nil {
				close(*block)
			}
		}
		<-finished
	})
	return func() StreamEnd { cancel(); return <-ch }, ch
}

// statusOf returns the status and code of a *StatusError, or fails.
func statusOf(t *testing.T, err error) (int, string) {
	t.Helper()
	var se *StatusError
	require.True(t, errors.As(err, &se), "want a *StatusError, got %v", err)
	return se.Status, se.code()
}

func TestStreamAddAndRemove(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEngineEnv(t, 3, "a", "b", "c", "d")
		a, b, c := e.buses["a"], e.buses["b"], e.buses["c"]
		publishN(t, c, 4)
		st := e.open(t, "session=a")
		tr := newRecTransport()
		stop, _ := serve(t, st, tr)

		greeting := tr.next(t)
		require.Empty(t, greeting.frames, "the first batch has no frames")
		require.True(t, greeting.moved)
		require.Equal(t, muxcursor.Cursor{muxcursor.NewEntry("a", a.Epoch(), 0)}.String(), greeting.cursor)

		publishN(t, a, 1)
		require.Equal(t, []string{"a:e#1"}, tr.next(t).frames)

		// Live: from the next event of b.
		require.NoError(t, st.Add("b", ""))
		synctest.Wait()
		added := tr.next(t)
		require.Empty(t, added.frames)
		require.True(t, added.moved, "a session added moves the cursor")
		publishN(t, b, 1)
		batch := tr.next(t)
		require.Equal(t, []string{"b:e#1"}, batch.frames)
		require.Equal(t, muxcursor.Cursor{muxcursor.NewEntry("a", a.Epoch(), 1), muxcursor.NewEntry("b", b.Epoch(), 1)}.String(), batch.cursor)

		// Resumed from its entry of a cursor: what it missed, then its
		// replay_complete.
		cur := muxcursor.Cursor{muxcursor.NewEntry("c", c.Epoch(), 2)}.String()
		require.NoError(t, st.Add("c", cur))
		frames, cursor := tr.until(t, "c:replay_complete#0")
		require.Equal(t, []string{"c:e#3", "c:e#4", "c:replay_complete#0"}, frames)
		require.Equal(t, muxcursor.Cursor{muxcursor.NewEntry("a", a.Epoch(), 1), muxcursor.NewEntry("b", b.Epoch(), 1), muxcursor.NewEntry("c", c.Epoch(), 4)}.String(), cursor)

		// The refusals, as the route would answer them; none changes the
		// stream.
		for _, tc := range []struct {
			session      string
			status       int
			code         string
			cursorString string
		}{
			{"b", 400, "invalid_sessions", ""},
			{"d", 400, "invalid_sessions", ""}, // a fourth, over MaxStreamSessions 3
			{"", 400, "invalid_session_id", ""},
			{"bad\xff", 400, "invalid_session_id", ""},
		} {
			status, code := statusOf(t, st.Add(tc.session, tc.cursorString))
			require.Equal(t, tc.status, status, "Add(%q)", tc.session)
			require.Equal(t, tc.code, code, "Add(%q)", tc.session)
		}

		// Removed: its frames stop, the cursor no longer names it, a
		// second Remove is a 404.
		require.NoError(t, st.Remove("a"))
		synctest.Wait()
		removed := tr.next(t)
		require.True(t, removed.moved)
		require.Equal(t, muxcursor.Cursor{muxcursor.NewEntry("b", b.Epoch(), 1), muxcursor.NewEntry("c", c.Epoch(), 4)}.String(), removed.cursor)
		status, code := statusOf(t, st.Remove("a"))
		require.Equal(t, 404, status)
		require.Equal(t, "session_not_in_stream", code)
		publishN(t, a, 1)
		publishN(t, b, 1)
		require.Equal(t, []string{"b:e#2"}, tr.next(t).frames, "nothing more of a")
		require.Zero(t, a.SubscriberCount(), "a's subscription ended")

		// Unknown and forbidden sessions are the route's 404 and 403.
		status, code = statusOf(t, st.Add("nobody", ""))
		require.Equal(t, 404, status)
		require.Equal(t, "session_not_found", code)
		e.buses["forbidden"] = newBus(t, Options{})
		status, code = statusOf(t, st.Add("forbidden", ""))
		require.Equal(t, 403, status)
		require.Equal(t, "forbidden", code)

		require.Equal(t, StreamGone, stop())
		for id, bus := range e.buses {
			require.Zero(t, bus.SubscriberCount(), "session %s", id)
		}
		status, code = statusOf(t, st.Add("a", ""))
		require.Equal(t, http.StatusGone, status, "an ended stream refuses changes")
		require.Equal(t, "stream_ended", code)
	})
}

// An Add whose cursor is not one is served live after cursor_invalid, as
// the route serves a session of such a cursor: never an error, never a
// silent live start.
func TestStreamAddWithAnUnusableCursor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEngineEnv(t, 4, "a", "b", "c")
		publishN(t, e.buses["b"], 2)
		st := e.open(t, "session=a")
		tr := newRecTransport()
		stop, _ := serve(t, st, tr)
		tr.next(t)
		for _, garbage := range []string{"not-a-cursor", strings.Repeat("m1", 5000)} {
			require.NoError(t, st.Add("b", garbage))
			frames, _ := tr.until(t, "b:state_resync_required#0")
			require.Equal(t, []string{"b:state_resync_required#0"}, frames)
			require.NoError(t, st.Remove("b"))
			synctest.Wait()
			tr.next(t)
		}
		// "0": from the start of its ring.
		require.NoError(t, st.Add("b", "0"))
		frames, _ := tr.until(t, "b:replay_complete#0")
		require.Equal(t, []string{"b:e#1", "b:e#2", "b:replay_complete#0"}, frames)
		require.Equal(t, StreamGone, stop())
	})
}

// Sessions added and removed many times reuse the stream's ReadyGroup
// places: a long-lived socket is not worn out by changes.
func TestStreamChangesReuseGroupPlaces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEngineEnv(t, 2, "a", "b", "c")
		st := e.open(t, "session=a")
		tr := newRecTransport()
		stop, _ := serve(t, st, tr)
		tr.next(t)
		for i := range 50 {
			id := []string{"b", "c"}[i%2]
			require.NoError(t, st.Add(id, ""), "round %d", i)
			synctest.Wait()
			tr.next(t)
			publishN(t, e.buses[id], 1)
			require.Equal(t, []string{fmt.Sprintf("%s:e#%d", id, i/2+1)}, tr.next(t).frames)
			require.NoError(t, st.Remove(id))
			synctest.Wait()
			tr.next(t)
		}
		require.Equal(t, StreamGone, stop())
	})
}

// While the stream is blocked in a write, Removes hold their places until
// the loop does them: Adds past the group's places are 429
// too_many_changes, and nothing breaks once the write returns.
func TestStreamTooManyChangesWhileBlocked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEngineEnv(t, 1, "a", "b", "c", "d")
		st := e.open(t, "session=a")
		tr := newRecTransport()
		stop, _ := serve(t, st, tr)
		tr.next(t)
		block := make(chan struct{})
		tr.block.Store(&block)
		publishN(t, e.buses["a"], 1) // the loop blocks writing it
		synctest.Wait()
		require.NoError(t, st.Remove("a"))
		require.NoError(t, st.Add("b", "")) // the second place of 2
		require.NoError(t, st.Remove("b"))
		status, code := statusOf(t, st.Add("c", ""))
		require.Equal(t, http.StatusTooManyRequests, status)
		require.Equal(t, "too_many_changes", code)
		close(*tr.block.Swap(nil))
		require.Equal(t, []string{"a:e#1"}, tr.next(t).frames)
		synctest.Wait()
		tr.next(t) // the changes
		require.NoError(t, st.Add("d", ""))
		publishN(t, e.buses["d"], 1)
		frames, _ := tr.until(t, "d:e#1")
		require.Equal(t, []string{"d:e#1"}, frames)
		require.Equal(t, StreamGone, stop())
	})
}

// A stream of an SSE route never changes its sessions.
func TestStreamOfARouteRefusesChanges(t *testing.T) {
	e := newEngineEnv(t, 2, "a", "b")
	w := httptest.NewRecorder()
	st := e.m.open(w, httptest.NewRequest(http.MethodGet, "/events?session=a", nil), false)
	require.NotNil(t, st)
	defer st.Close()
	status, code := statusOf(t, st.Add("b", ""))
	require.Equal(t, http.StatusMethodNotAllowed, status)
	require.Equal(t, "method_not_allowed", code)
	status, _ = statusOf(t, st.Remove("a"))
	require.Equal(t, http.StatusMethodNotAllowed, status)
}

// Each StreamEnd, with the frames written before it.
func TestStreamEnds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cause func(e *engineEnv, st *Stream, tr *recTransport)
		end   StreamEnd
		last  string // the last frame written, "" for none
	}{
		{"closed", func(e *engineEnv, _ *Stream, _ *recTransport) { e.buses["a"].Close(); e.buses["b"].Close() }, StreamClosed, "b:stream_error#0"},
		{"shutdown", func(e *engineEnv, _ *Stream, _ *recTransport) {
			e.buses["a"].Close()
			synctest.Wait() // a leaves first; b's shutdown frame ends the stream
			require.NoError(t, e.buses["b"].CloseForShutdown(time.Second))
		}, StreamShutdown, "b:stream_error#0"},
		{"revoked", func(e *engineEnv, _ *Stream, _ *recTransport) { require.Equal(t, 1, e.h.Revoke("user-b")) }, StreamRevoked, "b:stream_error#0"},
		{"failed", func(e *engineEnv, _ *Stream, tr *recTransport) {
			err := errors.New("write failed")
			tr.fail.Store(&err)
			publishN(t, e.buses["a"], 1)
		}, StreamFailed, "a:e#1"},
		{"panicked", func(e *engineEnv, _ *Stream, tr *recTransport) {
			tr.panics.Store(true)
			publishN(t, e.buses["a"], 1)
		}, StreamPanicked, "a:stream_error#0"},
		{"interrupted", func(e *engineEnv, st *Stream, tr *recTransport) {
			st.interrupt() // what a Hub's budget does
			publishN(t, e.buses["a"], 1)
		}, StreamFailed, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEngineEnv(t, 2, "a", "b")
				st := e.open(t, "session=a&session=b")
				tr := newRecTransport()
				stop, done := serve(t, st, tr)
				tr.next(t)
				tc.cause(e, st, tr)
				synctest.Wait()
				var last string
				for len(tr.batches) > 0 {
					if b := <-tr.batches; len(b.frames) > 0 {
						last = b.frames[len(b.frames)-1]
					}
				}
				select {
				case end := <-done:
					require.Equal(t, tc.end, end)
				default:
					t.Fatalf("the stream did not end (%s)", stop())
				}
				require.Equal(t, tc.last, last)
				if tc.name == "interrupted" {
					require.Equal(t, int32(1), tr.interrupted.Load())
				}
				require.Zero(t, e.buses["a"].SubscriberCount())
				require.Zero(t, e.buses["b"].SubscriberCount())
			})
		})
	}
}

// A Grant's lifetime ends the stream with stream_error reauthenticate
// naming the session whose Grant expires first, an added session's
// included; heartbeats come after Heartbeat of silence.
func TestStreamLifetimeAndKeepalive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEngineEnv(t, 3, "a", "b")
		e.h.Heartbeat = 10 * time.Second
		e.expires["a"] = time.Now().Add(time.Minute)
		e.expires["b"] = time.Now().Add(35 * time.Second)
		st := e.open(t, "session=a")
		tr := newRecTransport()
		_, done := serve(t, st, tr)
		tr.next(t)
		require.NoError(t, st.Add("b", ""))
		time.Sleep(25 * time.Second)
		synctest.Wait()
		require.Equal(t, int32(2), tr.keepalives.Load(), "at 10 s and 20 s of silence")
		time.Sleep(10 * time.Second)
		synctest.Wait()
		frames, _ := tr.until(t, "b:stream_error#0")
		require.Equal(t, []string{"b:stream_error#0"}, frames, "the added session's Grant expires first")
		require.Equal(t, StreamExpired, <-done)
	})
}

// Revoke reaches a session added while the stream is served, through its
// Grant's subject; once that session is removed, its subject no longer
// names the stream.
func TestStreamRevokeOfAnAddedSession(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEngineEnv(t, 3, "a", "b", "c")
		st := e.open(t, "session=a")
		tr := newRecTransport()
		_, done := serve(t, st, tr)
		tr.next(t)
		require.NoError(t, st.Add("b", ""))
		require.NoError(t, st.Add("c", ""))
		synctest.Wait()
		require.NoError(t, st.Remove("b"))
		synctest.Wait()
		require.Zero(t, e.h.Revoke("user-b"), "b left the stream")
		require.Equal(t, 1, e.h.Revoke("user-c"))
		synctest.Wait()
		frames, _ := tr.until(t, "c:stream_error#0")
		require.Equal(t, "c:stream_error#0", frames[len(frames)-1])
		require.Equal(t, StreamRevoked, <-done)
	})
}

// Batch.AppendCursor gives the cursor after any frame, in any order of
// calls.
func TestBatchAppendCursorInAnyOrder(t *testing.T) {
	a, b := newBus(t, Options{}), newBus(t, Options{})
	ma, mb := newMember("a", a), newMember("b", b)
	st := &Stream{order: []*Member{ma, mb}}
	st.layCursor()
	fa, fb := publishN(t, a, 2), publishN(t, b, 1)
	batch := &Batch{st: st, frames: []Frame{fa[0], fb[0], replayCompleteFrame(0, 0, a.Epoch(), 0), fa[1]}, owners: []*Member{ma, mb, ma, ma}}
	want := func(ida, idb uint64) string {
		return muxcursor.Cursor{muxcursor.NewEntry("a", a.Epoch(), ida), muxcursor.NewEntry("b", b.Epoch(), idb)}.String()
	}
	for _, i := range []int{3, 0, -1, 1, 2, 3, 1} {
		got := string(batch.AppendCursor(nil, i))
		switch i {
		case -1:
			require.Equal(t, want(0, 0), got)
		case 0:
			require.Equal(t, want(1, 0), got)
		case 1, 2:
			require.Equal(t, want(1, 1), got, "i=%d", i)
		case 3:
			require.Equal(t, want(2, 1), got)
		}
	}
	require.Panics(t, func() { batch.AppendCursor(nil, 4) })
}

// Serve serves once; a stream closed unserved serves nothing and holds no
// subscription.
func TestStreamServeOnce(t *testing.T) {
	e := newEngineEnv(t, 2, "a")
	st := e.open(t, "session=a")
	require.Equal(t, 1, e.buses["a"].SubscriberCount())
	st.Close()
	require.Zero(t, e.buses["a"].SubscriberCount())
	require.Equal(t, StreamGone, st.Serve(context.Background(), newRecTransport()))

	st = e.open(t, "session=a")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.Equal(t, StreamGone, st.Serve(ctx, newRecTransport()))
	require.Equal(t, StreamGone, st.Serve(context.Background(), newRecTransport()), "a second Serve")
	require.Zero(t, e.buses["a"].SubscriberCount())

	var names []string
	for e := StreamGone; e <= StreamPanicked; e++ {
		names = append(names, e.String())
	}
	require.Equal(t, "gone failed evicted closed shutdown revoked expired panicked", strings.Join(names, " "))
	require.Equal(t, "StreamEnd(99)", StreamEnd(99).String())
}

// Add from many goroutines while the stream serves: each session is added
// once, the stream never holds more than its most, and every subscription
// ends with the stream.
func TestStreamConcurrentAdds(t *testing.T) {
	ids := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	e := newEngineEnv(t, 4, ids...)
	st := e.open(t, "session=a")
	tr := newRecTransport()
	go func() {
		for range tr.batches {
		}
	}()
	stop, _ := serve(t, st, tr)
	var wg sync.WaitGroup
	var added atomic.Int32
	for _, id := range ids[1:] {
		for range 3 {
			wg.Go(func() {
				if st.Add(id, "") == nil {
					added.Add(1)
				}
			})
		}
	}
	wg.Wait()
	require.Equal(t, int32(3), added.Load(), "a has the first of 4 places")
	require.Equal(t, StreamGone, stop())
	close(tr.batches)
	for id, bus := range e.buses {
		require.Zero(t, bus.SubscriberCount(), "session %s", id)
	}
}
