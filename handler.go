package eventbus

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrSessionNotFound is what a Handler's Lookup returns (or wraps) for an
// unknown session; the handler answers 404.
var ErrSessionNotFound = errors.New("eventbus: session not found")

// Handler serves one bus per request as a resumable Server-Sent Events
// stream (SPEC section 10), typically on a route such as
// "GET /session/{id}/events" of an [http.ServeMux].
//
// Request rules, checked in this order before subscribing: the writer must
// support flushing (else 500); Last-Event-ID comes from the header, or when
// that is absent or empty from the lastEventId query parameter, and is
// ASCII digits up to 2^53-1 (anything else is logged and means live only);
// the epoch comes from the Event-Epoch header or the epoch parameter;
// types, when present, is a comma-separated list of type filters (see
// SubscribeOptions.Types; an invalid one is 400 invalid_filter);
// maxQueued, when present, is one decimal in [16, 2048] (else 400
// invalid_max_queued); Lookup's ErrSessionNotFound is 404
// session_not_found; a full bus is 429 subscriber_limit_exceeded with
// Retry-After: 5. Error bodies are JSON {"error":...,"code":...}.
//
// The stream starts with the headers and "retry:", then writes every frame
// that is ready as one batch with one flush, a ": heartbeat" comment after
// Heartbeat without a write, and sets a write deadline before every write
// (when the connection supports one): a write that fails or blocks past it
// cancels the subscription at once. A client disconnect cancels it promptly.
// The handler starts no goroutine of its own.
//
// A Handler is safe for concurrent use once its fields are set; they must
// not change while it serves. Its zero value answers 404 to everything
// because it has no Lookup.
type Handler struct {
	// Lookup finds the bus of a request, typically by r.PathValue("id").
	// It returns an error wrapping ErrSessionNotFound (or a nil bus) for an
	// unknown session; any other error is a 500.
	Lookup func(r *http.Request) (*EventBus, error)
	// Logger receives diagnostics; nil means slog.Default().
	Logger *slog.Logger
	// Retry is the SSE reconnection delay sent first; 0 means DefaultRetry.
	Retry time.Duration
	// Heartbeat is the idle time before a comment line; 0 means
	// DefaultHeartbeat.
	Heartbeat time.Duration
	// WriteTimeout bounds each write and flush; 0 means DefaultWriteTimeout.
	WriteTimeout time.Duration
}

func (h *Handler) logger() *slog.Logger {
	if h.Logger != nil {
		return h.Logger
	}
	return slog.Default()
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeJSONError(w, http.StatusMethodNotAllowed, "method not allowed", "method_not_allowed", 0)
		return
	}
	if !canFlush(w) {
		writeJSONError(w, http.StatusInternalServerError, "response writer cannot flush", "streaming_unsupported", 0)
		return
	}
	query, qerr := url.ParseQuery(r.URL.RawQuery) // a malformed pair is skipped, the rest kept

	opts := SubscribeOptions{}
	raw := r.Header.Get("Last-Event-ID")
	if raw == "" {
		if v := query["lastEventId"]; len(v) > 0 {
			raw = v[0]
		}
	}
	if raw != "" {
		if id, ok := ParseLastEventID(raw); ok {
			opts.Resume, opts.LastEventID = true, id
		} else {
			h.logger().LogAttrs(r.Context(), slog.LevelWarn, "eventbus: malformed Last-Event-ID, serving live only",
				slog.String("value", strconv.Quote(truncate(raw, 64))))
		}
	}
	opts.Epoch = r.Header.Get("Event-Epoch")
	if opts.Epoch == "" {
		opts.Epoch = query.Get("epoch")
	}
	if v := query["types"]; len(v) > 0 {
		for _, list := range v {
			for t := range strings.SplitSeq(list, ",") {
				if t != "" {
					opts.Types = append(opts.Types, t)
				}
			}
		}
		if _, err := compileFilters(opts.Types); err != nil {
			writeJSONError(w, http.StatusBadRequest, err.Error(), "invalid_filter", 0)
			return
		}
	}
	if qerr != nil && rawParamCount(r.URL.RawQuery, "maxQueued") != len(query["maxQueued"]) {
		// ParseQuery skipped a maxQueued pair it could not decode ("%zz",
		// a ';' in the pair). Taking the default then would turn a value
		// that is not decimal into a 200 instead of SPEC 10's 400.
		writeJSONError(w, http.StatusBadRequest, "maxQueued must be a decimal number", "invalid_max_queued", 0)
		return
	}
	if v, ok := query["maxQueued"]; ok {
		n, err := parseMaxQueued(v)
		if err != nil {
			writeJSONError(w, http.StatusBadRequest, err.Error(), "invalid_max_queued", 0)
			return
		}
		opts.MaxQueued = n
	}

	var bus *EventBus
	var err error
	if h.Lookup != nil {
		bus, err = h.Lookup(r)
	}
	switch {
	case errors.Is(err, ErrSessionNotFound) || (err == nil && bus == nil):
		writeJSONError(w, http.StatusNotFound, "session not found", "session_not_found", 0)
		return
	case err != nil:
		h.logger().LogAttrs(r.Context(), slog.LevelError, "eventbus: session lookup failed", slog.String("error", err.Error()))
		writeJSONError(w, http.StatusInternalServerError, "session lookup failed", "internal", 0)
		return
	}

	if r.Method == http.MethodHead {
		// The headers a GET would get, without subscribing: a HEAD takes
		// no slot of the bus (and is never refused for a full one).
		writeStreamHeaders(w, r, bus)
		return
	}

	// The subscription watches the request context only while subscribing
	// (a fed bus's read of its log must stop when the client leaves). After
	// that the handler ends it itself: it waits on r.Context() in serve,
	// and on a failed write decides between cancelled and blocked. Left to
	// the context, the net/http cancellation that follows every failed
	// write, a deadline included, would race dropBlocked and count the
	// buffered frames of a blocked writer as cancelled.
	subCtx, cancelSub := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancelSub()
	unwatch := context.AfterFunc(r.Context(), cancelSub)
	if r.Context().Err() != nil {
		cancelSub() // at once: AfterFunc calls it on another goroutine
	}
	sub, err := bus.Subscribe(subCtx, opts)
	unwatch()
	if err != nil {
		var limit *SubscriberLimitError
		if errors.As(err, &limit) {
			w.Header().Set("Retry-After", "5")
			writeJSONError(w, http.StatusTooManyRequests, "subscriber limit exceeded", "subscriber_limit_exceeded", limit.Limit)
			return
		}
		writeJSONError(w, http.StatusInternalServerError, err.Error(), "internal", 0)
		return
	}
	defer sub.Close()

	writeStreamHeaders(w, r, bus)

	s := stream{
		w:       w,
		rc:      http.NewResponseController(w),
		timeout: orDefault(h.WriteTimeout, DefaultWriteTimeout),
	}
	s.buf = strconv.AppendInt(append(s.buf, "retry: "...), orDefault(h.Retry, DefaultRetry).Milliseconds(), 10)
	s.buf = append(s.buf, "\n\n"...)
	if err := s.flushBatch(); err != nil {
		h.dropBlocked(r.Context(), sub, &s, err)
		return
	}
	h.serve(r.Context(), sub, &s)
}

// serve is the stream loop: write what is ready as one batch, else wait for
// frames, the heartbeat or the client going away.
func (h *Handler) serve(ctx context.Context, sub *Subscription, s *stream) {
	defer func() {
		// A bug must not take the daemon down with a half-written stream:
		// tell the client, log it, and end this stream only.
		if p := recover(); p != nil {
			h.logger().LogAttrs(ctx, slog.LevelError, "eventbus: stream panicked", slog.Any("panic", p))
			s.buf = StreamErrorFrame("internal error", ErrorKindInternal).AppendSSE(s.buf[:0])
			_ = s.flushBatch()
		}
	}()
	heartbeat := orDefault(h.Heartbeat, DefaultHeartbeat)
	timer := time.NewTimer(heartbeat)
	defer timer.Stop()
	var frames []Frame
	for {
		var open bool
		// No yield before waiting: between batches the handler writes and
		// flushes, which gives the publisher time to queue more, and in the
		// peer harness's tight-publisher runs the yield gave 10x slower
		// outliers (BENCHMARKS.md).
		frames, open = sub.takeReady(frames[:0], false)
		s.reserve(frames)
		terminal := false
		for _, f := range frames {
			s.add(f)
			terminal = terminal || f.Terminal()
		}
		taken := len(frames)
		clear(frames) // do not pin delivered frames while idle
		if !open && !terminal && ctx.Err() == nil {
			if err := sub.Err(); err != nil && !errors.Is(err, ErrEvicted) && !errors.Is(err, ErrClosed) {
				// Ended for a reason the client would not otherwise learn
				// (an eviction and CloseWithError queue their own terminal
				// frame).
				s.add(StreamErrorFrame(err.Error(), ErrorKindInternal))
			}
		}
		if len(s.buf) > 0 || s.pending {
			if err := s.flushBatch(); err != nil {
				h.dropBlocked(ctx, sub, s, err)
				return
			}
			timer.Reset(heartbeat)
		}
		// Delivered only once written and flushed: the frames of a failed
		// batch are counted as dropped (blocked) instead, never as both.
		sub.bus.stats.delivered.Add(uint64(taken))
		if !open {
			// net/http still writes the end of the response after we
			// return (the last chunk); give it a deadline of its own, or
			// one that expired while the last batch went out would cut the
			// connection right after a terminal frame the client has read.
			s.armed = false
			s.arm()
			return
		}
		if taken > 0 {
			continue // more may have arrived while writing
		}
		select {
		case <-sub.Ready():
		case <-timer.C:
			s.buf = append(s.buf, ": heartbeat\n\n"...)
			if err := s.flushBatch(); err != nil {
				h.dropBlocked(ctx, sub, s, err)
				return
			}
			timer.Reset(heartbeat)
		case <-ctx.Done():
			return // the deferred Close cancels without drain
		}
	}
}

// dropBlocked ends a subscription whose write failed or hit its deadline:
// no drain, no frame (the connection is unusable).
// A write that fails because the client went away is a plain
// cancellation; anything else is counted as dropped, reason blocked.
func (h *Handler) dropBlocked(ctx context.Context, sub *Subscription, s *stream, err error) {
	// net/http cancels the request context as soon as a write on the
	// connection fails, a deadline included (HTTP/1.1 and HTTP/2 alike), so
	// a done context alone does not mean the client left: a write that hit
	// its deadline is a blocked writer either way.
	if ctx.Err() != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		sub.Close()
		return
	}
	sub.cancelBlocked(s.frames, err)
}

// stream batches frames for one response. Every batch is written with one
// Write when it fits maxBatchBuffer (frames of directWriteSize or more go
// out from their shared bytes) and flushed once, under one write deadline.
type stream struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	buf     []byte
	err     error // the first write error; later writes are skipped
	pending bool  // written since the last flush
	armed   bool  // the deadline of this batch is set
	frames  int   // frames in this batch
}

const (
	// Frames this large are written from their shared bytes instead of
	// being copied into the batch.
	directWriteSize = 64 << 10
	// A batch buffer beyond this is written out before it grows further,
	// and is not kept between batches.
	maxBatchBuffer = 1 << 20
)

// reserve makes room in the batch buffer for the frames add will copy,
// in one allocation: growing by doubling while a large batch is copied
// moved each byte several times and took a fifth of the handler's CPU with
// 256 clients (profile in BENCHMARKS.md).
func (s *stream) reserve(frames []Frame) {
	need := 0
	for _, f := range frames {
		if f.Size() < directWriteSize { // larger ones are written directly
			need += len(f.wire)
		}
	}
	if len(s.buf)+need <= maxBatchBuffer {
		s.buf = slices.Grow(s.buf, need)
	}
}

func (s *stream) add(f Frame) {
	s.frames++
	if s.err != nil {
		return
	}
	big := f.Size() >= directWriteSize
	if big || len(s.buf)+len(f.wire) > maxBatchBuffer {
		s.write(nil)
	}
	if big {
		s.write(f.wire)
		return
	}
	s.buf = f.AppendSSE(s.buf)
}

// write sends p, or the batch buffer when p is nil, under the batch's
// deadline.
func (s *stream) write(p []byte) {
	if p == nil {
		p = s.buf
		s.buf = s.buf[:0]
		if cap(s.buf) > maxBatchBuffer {
			s.buf = nil
		}
	}
	if s.err != nil || len(p) == 0 {
		return
	}
	s.arm()
	if s.err == nil {
		_, s.err = s.w.Write(p)
		s.pending = true
	}
}

func (s *stream) arm() {
	if s.armed {
		return
	}
	s.armed = true
	err := s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
	if err != nil && !errors.Is(err, http.ErrNotSupported) {
		s.err = err
	}
}

// flushBatch writes what is buffered, flushes once, and returns the first
// error of the batch.
func (s *stream) flushBatch() error {
	s.write(nil)
	if s.err == nil && s.pending {
		s.err = s.rc.Flush()
	}
	s.pending, s.armed = false, false
	if s.err == nil {
		// On an error the caller still needs the count: the frames of the
		// failed batch are counted as dropped, reason blocked.
		s.frames = 0
	}
	return s.err
}

// writeStreamHeaders sends SPEC 10's response headers and the 200 status.
func writeStreamHeaders(w http.ResponseWriter, r *http.Request, bus *EventBus) {
	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-cache, no-transform")
	if r.ProtoMajor == 1 {
		hd.Set("Connection", "keep-alive")
	}
	hd.Set("X-Accel-Buffering", "no")
	hd.Set("Event-Epoch", bus.Epoch())
	hd.Set("Access-Control-Expose-Headers", "Event-Epoch")
	w.WriteHeader(http.StatusOK)
}

// canFlush reports whether w, or a writer it wraps (the Unwrap convention
// of http.ResponseController), can flush. It is checked before subscribing:
// once the status line is out it is too late to answer 500.
func canFlush(w http.ResponseWriter) bool {
	for {
		switch x := w.(type) {
		case http.Flusher:
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return false
		}
	}
}

// ParseLastEventID parses a Last-Event-ID value strictly: one or more ASCII
// digits (leading zeros allowed) whose value is at most MaxEventID. Anything
// else, including a sign, a space or an empty string, reports false. It
// never allocates and reads a hostile 10 MB value in one pass.
func ParseLastEventID(s string) (uint64, bool) {
	if s == "" {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
		if n > MaxEventID {
			return 0, false
		}
	}
	return n, true
}

// parseMaxQueued applies SPEC 10's rules to the maxQueued values of a query.
func parseMaxQueued(v []string) (int, error) {
	if len(v) != 1 {
		return 0, errors.New("maxQueued must be given once")
	}
	if v[0] == "" {
		return 0, errors.New("maxQueued is empty")
	}
	n := 0
	for i := 0; i < len(v[0]); i++ {
		c := v[0][i]
		if c < '0' || c > '9' {
			return 0, errors.New("maxQueued must be a decimal number")
		}
		if n <= MaxClientMaxQueued {
			// Past the maximum the value is out of range whatever follows;
			// stop accumulating so 20 digits cannot overflow.
			n = n*10 + int(c-'0')
		}
	}
	if n < MinClientMaxQueued || n > MaxClientMaxQueued {
		return 0, errors.New("maxQueued must be between " + strconv.Itoa(MinClientMaxQueued) + " and " + strconv.Itoa(MaxClientMaxQueued))
	}
	return n, nil
}

// writeJSONError answers an error with {"error":msg,"code":code} and, for a
// positive limit, "limit".
func writeJSONError(w http.ResponseWriter, status int, msg, code string, limit int) {
	b := make([]byte, 0, 64+len(msg))
	b = append(b, `{"error":`...)
	b = appendJSONString(b, msg)
	b = append(b, `,"code":`...)
	b = appendJSONString(b, code)
	if limit > 0 {
		b = append(b, `,"limit":`...)
		b = strconv.AppendInt(b, int64(limit), 10)
	}
	b = append(b, "}\n"...)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// rawParamCount counts the pairs of a raw query whose key is key, also the
// pairs url.ParseQuery skips because they cannot be decoded.
func rawParamCount(rawQuery, key string) int {
	n := 0
	for rawQuery != "" {
		var pair string
		pair, rawQuery, _ = strings.Cut(rawQuery, "&")
		k, _, _ := strings.Cut(pair, "=")
		if u, err := url.QueryUnescape(k); err == nil {
			k = u
		}
		if k == key {
			n++
		}
	}
	return n
}
