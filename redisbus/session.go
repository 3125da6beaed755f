package redisbus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
)

// session is this replica's mirror of one session: a mirror bus fed by one
// reader goroutine. The mirror set (b.set) opens it with engine.Open on
// the first lookup.
type session struct {
	backplane.Session
	b      *Backplane
	keys   []string // the scripts' KEYS (Backplane.keys)
	meta   string   // meta hash key
	prefix string   // stream key without the epoch
	stream string   // stream key, set by Open
}

// engine is the Redis half of the mirror set (backplane.Engine).
type engine struct{ b *Backplane }

func (g engine) New(id string) *session {
	keys := g.b.keys(id)
	return &session{b: g.b, keys: keys, meta: keys[0], prefix: keys[1]}
}

// Open reads (or creates) the session's epoch and last id in Redis.
func (g engine) Open(ctx context.Context, s *session) (backplane.Start, error) {
	res, err := ensureScript.Run(ctx, g.b.client, s.keys,
		eventbus.NewEpoch(), g.b.opts.KeyTTL.Milliseconds()).StringSlice()
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("unexpected reply %q", res)
	}
	if err != nil {
		return backplane.Start{}, err
	}
	last, err := strconv.ParseUint(res[1], 10, 64)
	if err != nil {
		return backplane.Start{}, fmt.Errorf("unexpected last id %q", res[1])
	}
	s.stream = s.prefix + res[0]                           // before the mirror, whose resumes read it
	return backplane.Start{Epoch: res[0], Last: last}, nil // entry "<id>-0": the id is the cursor
}

func (g engine) Run(ctx context.Context, s *session, from backplane.Start) { s.run(ctx, from.Last) }

func (g engine) Epoch(ctx context.Context, s *session) (string, error) {
	return s.currentEpoch(ctx, g.b.opts.PublishTimeout)
}

// readSlack is added to ReadBlock for the deadline of one XREAD.
const readSlack = 2 * time.Second

// run is the session's reader: XREAD BLOCK from the last id it fed, into
// the mirror, until ctx ends or the epoch changes. After a timeout or an
// error it checks the session's epoch in Redis: a different or missing one
// means the stream is lost, and the mirror is released. When no call has
// reached Redis for OutageTimeout, the mirror ends with a terminal
// stream_error (outage).
func (s *session) run(ctx context.Context, last uint64) {
	b := s.b
	var backoff backplane.Backoff
	failing := false
	check := false
	lastOK := time.Now() // the last answer from Redis
	var lastErr error
	for ctx.Err() == nil {
		// Every call is bounded by what is left of the outage bound, so a
		// hung Redis ends the streams at OutageTimeout, not one call later.
		left := time.Until(lastOK.Add(b.opts.OutageTimeout))
		if left <= 0 {
			b.set.Outage(s, lastOK, lastErr)
			return
		}
		if check {
			e, err := s.currentEpoch(ctx, min(b.opts.PublishTimeout, left))
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				lastErr = err
				s.failed(ctx, &failing, &backoff, left, err)
				continue
			}
			lastOK, check = time.Now(), false
			if e != s.Epoch {
				b.set.Expire(s, "epoch changed: the stream was lost or deleted")
				return
			}
		}
		if h := b.readHook.Load(); h != nil {
			(*h)(ctx, s.ID)
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
			s.failed(ctx, &failing, &backoff, left, err)
			check = true
			continue
		}
		lastOK = time.Now()
		if failing {
			failing = false
			b.log.Info("redisbus: reader reconnected", "session", s.ID, "lastEventId", last)
		}
		backoff.Reset()
		for _, st := range streams {
			for _, m := range st.Messages {
				e, err := parseEntry(m)
				if err != nil {
					// Skipped: the next entry is a gap, which resyncs.
					b.log.Error("redisbus: malformed stream entry", "session", s.ID, "entry", m.ID, "error", err)
					continue
				}
				if err := backplane.Append(s.Bus, e); err != nil {
					if errors.Is(err, eventbus.ErrClosed) {
						return
					}
					b.log.Error("redisbus: entry refused by the mirror", "session", s.ID, "id", e.ID, "error", err)
				}
				last = e.ID
			}
		}
	}
}

// failed logs a Redis error (the first of a streak as a warning) and
// sleeps the next backoff, at most left.
func (s *session) failed(ctx context.Context, failing *bool, backoff *backplane.Backoff, left time.Duration, err error) {
	if !*failing {
		*failing = true
		s.b.log.Warn("redisbus: reader lost redis; retrying with backoff", "session", s.ID, "error", err)
	}
	backoff.Sleep(ctx, left)
}

// currentEpoch returns the session's epoch in Redis, "" when it has none
// or its stream is lost (epochScript), waiting at most timeout.
func (s *session) currentEpoch(ctx context.Context, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return epochScript.Run(ctx, s.b.client, s.keys[:2]).Text()
}

// Head implements backplane.Log: the stream's epoch and last id in Redis.
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

// ReadHistory implements backplane.Log: the stream's entries in req's
// range, and the first id it holds. With req.MaxBytes it stops after the
// first entry past it (the replay stops there anyway), so a resume from far
// back does not read the whole ring.
func (s *session) ReadHistory(ctx context.Context, req backplane.HistoryRequest) ([]backplane.LogEntry, uint64, error) {
	after, upto := req.After, req.Upto
	{
		if upto <= after {
			return nil, 0, nil
		}
		ctx, cancel := context.WithTimeout(ctx, s.b.opts.PublishTimeout)
		defer cancel()
		var out []backplane.LogEntry
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
			return nil, 0, fmt.Errorf("redisbus: the stream of session %q (epoch %s) is lost", s.ID, s.Epoch)
		}
		e, err := parseEntry(msgs[0])
		if err != nil {
			return nil, 0, err
		}
		return nil, e.ID, nil
	}
}

// parseEntry reads a stream entry "<id>-0" {t: type, j: envelope}.
func parseEntry(m redis.XMessage) (backplane.LogEntry, error) {
	ms, seq, _ := strings.Cut(m.ID, "-")
	id, err := strconv.ParseUint(ms, 10, 64)
	if err != nil || seq != "0" || id == 0 {
		return backplane.LogEntry{}, fmt.Errorf("redisbus: entry id %q is not <id>-0", m.ID)
	}
	t, ok1 := m.Values["t"].(string)
	j, ok2 := m.Values["j"].(string)
	if !ok1 || !ok2 {
		return backplane.LogEntry{}, fmt.Errorf("redisbus: entry %q lacks t or j", m.ID)
	}
	return backplane.LogEntry{ID: id, Type: t, JSON: []byte(j)}, nil
}
