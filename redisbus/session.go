package redisbus

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ssebus/eventbus"
)

// session is this replica's mirror of one session: a mirror bus fed by one
// reader goroutine. It is created by the first lookup (which runs open);
// concurrent lookups wait for ready.
type session struct {
	b      *Backplane
	id     string
	keys   []string // the scripts' KEYS (Backplane.keys)
	meta   string   // meta hash key
	prefix string   // stream key without the epoch

	ready chan struct{} // closed when open has finished
	// Set by open before ready is closed (bus and cancel under b.mu).
	err    error
	opened time.Time // when open asked Redis for the epoch
	bus    *eventbus.EventBus
	epoch  string
	stream string
	rctx   context.Context // the reader's
	cancel context.CancelFunc

	lastActive time.Time // guarded by b.mu
}

// errReleased is the error of a session released (Delete, a new epoch)
// while it was being opened; a waiting lookup tries again.
var errReleased = errors.New("redisbus: session released while opening")

func (s *session) isReady() bool {
	select {
	case <-s.ready:
		return s.err == nil
	default:
		return false
	}
}

// session returns the ready session id, creating it when needed.
func (b *Backplane) session(ctx context.Context, id string) (*session, error) {
	if err := validSession(id); err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return nil, eventbus.ErrClosed
		}
		s := b.sessions[id]
		if s == nil {
			keys := b.keys(id)
			s = &session{b: b, id: id, keys: keys, meta: keys[0], prefix: keys[1], ready: make(chan struct{})}
			b.sessions[id] = s
			s.lastActive = time.Now()
			b.mu.Unlock()
			s.open()
		} else {
			s.lastActive = time.Now()
			b.mu.Unlock()
			select {
			case <-s.ready:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if errors.Is(s.err, errReleased) && attempt < 3 {
			continue
		}
		if s.err != nil {
			return nil, s.err
		}
		b.mu.Lock()
		current := b.sessions[id] == s
		b.mu.Unlock()
		if !current && attempt < 3 {
			continue // released meanwhile (idle, a new epoch, Delete)
		}
		return s, nil
	}
}

// open reads (or creates) the session's epoch and last id in Redis, builds
// the mirror and starts the reader. It runs detached from the request that
// asked for it: other lookups wait for it too.
func (s *session) open() {
	b := s.b
	defer close(s.ready)
	fail := func(err error) {
		s.err = err
		b.mu.Lock()
		if b.sessions[s.id] == s {
			delete(b.sessions, s.id)
		}
		b.mu.Unlock()
	}
	s.opened = time.Now()
	ctx, cancel := context.WithTimeout(b.ctx, b.opts.PublishTimeout)
	res, err := ensureScript.Run(ctx, b.client, s.keys,
		eventbus.NewEpoch(), b.opts.KeyTTL.Milliseconds()).StringSlice()
	cancel()
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("unexpected reply %q", res)
	}
	if err != nil {
		fail(unavailable("open", s.id, err))
		return
	}
	last, err := strconv.ParseUint(res[1], 10, 64)
	if err != nil {
		fail(unavailable("open", s.id, fmt.Errorf("unexpected last id %q", res[1])))
		return
	}
	bus, err := eventbus.NewFed(b.busOpts, eventbus.FeedOptions{
		Epoch: res[0], NextID: last + 1, Log: s, LagTimeout: b.opts.PublishTimeout})
	if err != nil {
		fail(unavailable("open", s.id, err)) // a corrupt epoch; the options were validated by New
		return
	}
	rctx, rcancel := context.WithCancel(b.ctx)
	b.mu.Lock()
	if b.closed || b.sessions[s.id] != s {
		b.mu.Unlock()
		rcancel()
		bus.Close()
		if b.closed {
			s.err = eventbus.ErrClosed
		} else {
			s.err = errReleased
		}
		return
	}
	s.bus, s.epoch, s.stream, s.rctx, s.cancel = bus, res[0], s.prefix+res[0], rctx, rcancel
	b.byBus[bus] = s
	b.wg.Add(1)
	b.mu.Unlock()
	go s.run(rctx, last)
}

// stop ends the reader and closes the mirror (its streams drain, then end).
// The session must already be out of the backplane's maps. Idempotent.
func (s *session) stop() { s.stopWith("", "") }

// stopWith is stop; with a kind, the mirror's streams end with a terminal
// stream_error of that kind and message (EventBus.CloseWithError).
func (s *session) stopWith(kind, message string) {
	s.b.mu.Lock()
	cancel, bus := s.cancel, s.bus
	s.b.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	switch {
	case bus == nil:
	case kind != "":
		bus.CloseWithError(kind, message)
	default:
		bus.Close()
	}
}

// expire removes s from the backplane and stops it.
func (b *Backplane) expire(s *session, why string) {
	b.remove(s)
	b.log.Info("redisbus: session released", "session", s.id, "epoch", s.epoch, "reason", why)
	s.stop()
}

// remove takes s out of the backplane's maps, so that the next lookup of
// its session makes a new one.
func (b *Backplane) remove(s *session) {
	b.mu.Lock()
	if b.sessions[s.id] == s {
		delete(b.sessions, s.id)
	}
	if s.bus != nil && b.byBus[s.bus] == s {
		delete(b.byBus, s.bus)
	}
	b.mu.Unlock()
}

// outage ends s after its reader could not reach Redis for OutageTimeout:
// out of the maps first (a new stream then asks Redis again, and fails
// while it is down), then every stream of the mirror gets what it had
// queued and a terminal stream_error "unavailable", so that its client
// reconnects with backoff and resumes from its cursor.
func (b *Backplane) outage(s *session, err error) {
	b.remove(s)
	b.log.Warn("redisbus: redis unreachable past OutageTimeout; the session's streams end",
		"session", s.id, "epoch", s.epoch, "outageTimeout", b.opts.OutageTimeout, "error", err)
	s.stopWith(eventbus.ErrorKindUnavailable, fmt.Sprintf(
		"redisbus: Redis unreachable for %v; reconnect with backoff and resume from the last event id", b.opts.OutageTimeout))
}

// Reader backoff after a Redis error.
const (
	minBackoff = 50 * time.Millisecond
	maxBackoff = 2 * time.Second
	// readSlack is added to ReadBlock for the deadline of one XREAD.
	readSlack = 2 * time.Second
)

// run is the session's reader: XREAD BLOCK from the last id it fed, into
// the mirror, until ctx ends or the epoch changes. After a timeout or an
// error it checks the session's epoch in Redis: a different or missing one
// means the stream is lost, and the mirror is released. When no call has
// reached Redis for OutageTimeout, the mirror ends with a terminal
// stream_error (outage).
func (s *session) run(ctx context.Context, last uint64) {
	b := s.b
	defer b.wg.Done()
	var delay time.Duration
	failing := false
	check := false
	lastOK := time.Now() // the last answer from Redis
	var lastErr error
	for ctx.Err() == nil {
		// Every call is bounded by what is left of the outage bound, so a
		// hung Redis ends the streams at OutageTimeout, not one call later.
		left := time.Until(lastOK.Add(b.opts.OutageTimeout))
		if left <= 0 {
			b.outage(s, lastErr)
			return
		}
		if check {
			e, err := s.currentEpoch(ctx, min(b.opts.PublishTimeout, left))
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				lastErr = err
				delay = s.failed(ctx, &failing, delay, left, err)
				continue
			}
			lastOK, check = time.Now(), false
			if e != s.epoch {
				b.expire(s, "epoch changed: the stream was lost or deleted")
				return
			}
		}
		if h := b.readHook.Load(); h != nil {
			(*h)(ctx, s.id)
			if ctx.Err() != nil {
				return
			}
		}
		// A healthy XREAD answers after block; block is at most half of
		// what is left, so that its answer comes before the bound.
		block := min(b.opts.ReadBlock, max(left/2, time.Millisecond))
		rctx, cancel := context.WithTimeout(ctx, min(block+readSlack, left))
		streams, err := b.client.XRead(rctx, &redis.XReadArgs{
			Streams: []string{s.stream, strconv.FormatUint(last, 10) + "-0"},
			Count:   int64(b.opts.ReadCount),
			Block:   block,
		}).Result()
		cancel()
		switch {
		case errors.Is(err, redis.Nil):
			lastOK = time.Now()
			check = true // quiet: is the stream still ours?
			continue
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			lastErr = err
			delay = s.failed(ctx, &failing, delay, left, err)
			check = true
			continue
		}
		lastOK = time.Now()
		if failing {
			failing = false
			b.log.Info("redisbus: reader reconnected", "session", s.id, "lastEventId", last)
		}
		delay = 0
		for _, st := range streams {
			for _, m := range st.Messages {
				e, err := parseEntry(m)
				if err != nil {
					// Skipped: the next entry is a gap, which resyncs.
					b.log.Error("redisbus: malformed stream entry", "session", s.id, "entry", m.ID, "error", err)
					continue
				}
				if err := s.bus.Append(e); err != nil {
					if errors.Is(err, eventbus.ErrClosed) {
						return
					}
					b.log.Error("redisbus: entry refused by the mirror", "session", s.id, "id", e.ID, "error", err)
				}
				last = e.ID
			}
		}
	}
}

// failed logs a Redis error (the first of a streak as a warning) and
// sleeps the next backoff, at most left; it returns that backoff.
func (s *session) failed(ctx context.Context, failing *bool, delay, left time.Duration, err error) time.Duration {
	if !*failing {
		*failing = true
		s.b.log.Warn("redisbus: reader lost redis; retrying with backoff", "session", s.id, "error", err)
	}
	delay = min(max(2*delay, minBackoff), maxBackoff)
	d := delay/2 + rand.N(delay/2+1) // jitter, so replicas do not retry in step
	t := time.NewTimer(min(d, left))
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return delay
}

// currentEpoch returns the session's epoch in Redis, "" when it has none
// or its stream is lost (epochScript), waiting at most timeout.
func (s *session) currentEpoch(ctx context.Context, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return epochScript.Run(ctx, s.b.client, s.keys[:2]).Text()
}

// Head implements eventbus.Log: the stream's epoch and last id in Redis.
func (s *session) Head(ctx context.Context) (epoch string, last uint64, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.b.opts.PublishTimeout)
	defer cancel()
	v, err := s.b.client.HMGet(ctx, s.meta, "epoch", "last").Result()
	if err != nil {
		return "", 0, err
	}
	if len(v) != 2 {
		return "", 0, fmt.Errorf("redisbus: unexpected reply %q", v)
	}
	epoch, _ = v[0].(string)
	return epoch, parseUint(v[1]), nil
}

// historyBatch is the most entries one XRANGE of a resume reads.
const historyBatch = 1000

// ReadHistory implements eventbus.Log: the stream's entries in req's
// range, and the first id it holds. With req.MaxBytes it stops after the
// first entry past it (the replay stops there anyway), so a resume from far
// back does not read the whole ring.
func (s *session) ReadHistory(ctx context.Context, req eventbus.HistoryRequest) ([]eventbus.LogEntry, uint64, error) {
	after, upto := req.After, req.Upto
	{
		if upto <= after {
			return nil, 0, nil
		}
		ctx, cancel := context.WithTimeout(ctx, s.b.opts.PublishTimeout)
		defer cancel()
		var out []eventbus.LogEntry
		spent := 0
		for from := after + 1; from <= upto; {
			msgs, err := s.b.client.XRangeN(ctx, s.stream, strconv.FormatUint(from, 10)+"-0",
				strconv.FormatUint(upto, 10)+"-0", historyBatch).Result()
			if err != nil {
				return nil, 0, err
			}
			for _, m := range msgs {
				e, err := parseEntry(m)
				if err != nil {
					return nil, 0, err
				}
				out = append(out, e)
				spent += len(e.JSON)
				if req.MaxBytes > 0 && len(out) > 1 && spent > req.MaxBytes {
					return out, out[0].ID, nil
				}
				from = e.ID + 1
			}
			if len(msgs) < historyBatch {
				break
			}
		}
		if len(out) > 0 {
			return out, out[0].ID, nil
		}
		// Nothing in (after, upto]: trimmed away, or the stream is lost.
		msgs, err := s.b.client.XRangeN(ctx, s.stream, "-", "+", 1).Result()
		if err != nil {
			return nil, 0, err
		}
		if len(msgs) == 0 {
			return nil, 0, fmt.Errorf("redisbus: the stream of session %q (epoch %s) is lost", s.id, s.epoch)
		}
		e, err := parseEntry(msgs[0])
		if err != nil {
			return nil, 0, err
		}
		return nil, e.ID, nil
	}
}

// parseEntry reads a stream entry "<id>-0" {t: type, j: envelope}.
func parseEntry(m redis.XMessage) (eventbus.LogEntry, error) {
	ms, seq, _ := strings.Cut(m.ID, "-")
	id, err := strconv.ParseUint(ms, 10, 64)
	if err != nil || seq != "0" || id == 0 {
		return eventbus.LogEntry{}, fmt.Errorf("redisbus: entry id %q is not <id>-0", m.ID)
	}
	t, ok1 := m.Values["t"].(string)
	j, ok2 := m.Values["j"].(string)
	if !ok1 || !ok2 {
		return eventbus.LogEntry{}, fmt.Errorf("redisbus: entry %q lacks t or j", m.ID)
	}
	return eventbus.LogEntry{ID: id, Type: t, JSON: []byte(j)}, nil
}
