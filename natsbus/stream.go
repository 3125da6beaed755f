package natsbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The messages of a session's subject "<Subject>.s.<token>", oldest first:
//
//	a tombstone (optional)  Eventbus-Deleted: 1, Nats-Rollup: sub, Nats-TTL: 1m; no body
//	a marker (optional)     Eventbus-Epoch: <epoch>, Eventbus-Id: 0; no body
//	events                  Eventbus-Epoch: <epoch>, Eventbus-Id: <id>, body "<type>\n<envelope>";
//	                        a keyed publish also Nats-Msg-Id and Eventbus-Fp (its fingerprint)
//
// Every message but a tombstone carries the session's epoch, so the last
// message alone tells the epoch and the last id (head). The marker is
// written when a session is first opened before its first publish, so that
// every replica agrees on the epoch; the stream's per-subject limit trims
// it like an event (it is the oldest). A tombstone's rollup purges the
// subject: after it come only messages of a new epoch. The type is in the
// body, not a header, so that any type the core accepts (no CR or LF)
// round-trips exactly; the envelope never holds a newline.
const (
	hdrEpoch   = "Eventbus-Epoch"
	hdrID      = "Eventbus-Id"
	hdrFp      = "Eventbus-Fp"
	hdrDeleted = "Eventbus-Deleted"

	// tombstoneTTL is how long a tombstone stays: readers see it live;
	// one that misses it (reconnecting meanwhile) notices the epoch
	// change at its next check.
	tombstoneTTL = time.Minute
)

// JetStream API error codes the backplane branches on.
const (
	codeNoMessage          = 10037 // no message found
	codeStreamNotFound     = 10059
	codeStreamCreate       = 10049 // a create failed; "error creating store for stream" among others
	codeWrongLastSeq       = 10071 // wrong last sequence: {seq}
	codeDuplicateInProcess = 10158 // duplicate message id is in process
	codeWrongLastSeqBusy   = 10164 // wrong last sequence (a clustered stream: another publish in process)
)

// logMsg is one message of a session's subject, parsed.
type logMsg struct {
	seq     uint64 // stream sequence
	subject string
	deleted bool   // a tombstone
	epoch   string // "" for a tombstone
	id      uint64 // 0: a marker or a tombstone
	fp      string // the fingerprint of a keyed publish
	typ     string
	env     []byte
}

// parseMsg reads a message of a session's subject; with body false it
// reads the headers only (what a head needs: a malformed body is the
// reader's and the resume's concern).
func parseMsg(seq uint64, subject string, hdr nats.Header, data []byte, body bool) (logMsg, error) {
	m := logMsg{seq: seq, subject: subject}
	if hdr.Get(hdrDeleted) != "" {
		m.deleted = true
		return m, nil
	}
	m.epoch = hdr.Get(hdrEpoch)
	if len(m.epoch) != 32 {
		return m, fmt.Errorf("natsbus: message %d on %s has no epoch", seq, subject)
	}
	id, err := strconv.ParseUint(hdr.Get(hdrID), 10, 64)
	if err != nil {
		return m, fmt.Errorf("natsbus: message %d on %s has no id", seq, subject)
	}
	m.id, m.fp = id, hdr.Get(hdrFp)
	if id == 0 || !body {
		return m, nil
	}
	for i, c := range data {
		if c == '\n' {
			m.typ, m.env = string(data[:i]), data[i+1:]
			return m, nil
		}
	}
	return m, fmt.Errorf("natsbus: message %d on %s has no type line", seq, subject)
}

// head is what the last message of a session's subject says.
type head struct {
	seq   uint64 // its stream sequence, 0 when the subject is empty
	epoch string // "" when the session has none: empty, or a tombstone
	id    uint64 // the last id assigned
}

// createAttempts bounds createStream's creates that the server fails with
// its generic creation error.
const createAttempts = 4

// ensureStream creates the stream when it is missing and sets on it what
// the backplane relies on (see New), keeping the rest of its config.
func (b *Backplane) ensureStream(ctx context.Context) error {
	b.streamMu.Lock()
	defer b.streamMu.Unlock()
	want := func(cfg *jetstream.StreamConfig) bool {
		changed := false
		subj := b.opts.Subject + ".s.>"
		has := false
		for _, s := range cfg.Subjects {
			has = has || s == subj
		}
		if !has {
			cfg.Subjects, changed = append(cfg.Subjects, subj), true
		}
		set := func(ok bool) {
			changed = changed || ok
		}
		set(cfg.MaxMsgsPerSubject != int64(b.bus.MaxLen))
		cfg.MaxMsgsPerSubject = int64(b.bus.MaxLen)
		set(cfg.Duplicates != b.opts.IdempotencyWindow)
		cfg.Duplicates = b.opts.IdempotencyWindow
		set(!cfg.AllowRollup || !cfg.AllowMsgTTL || !cfg.AllowDirect || cfg.DenyPurge)
		cfg.AllowRollup, cfg.AllowMsgTTL, cfg.AllowDirect, cfg.DenyPurge = true, true, true, false
		return changed
	}
	st, err := b.js.Stream(ctx, b.opts.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		cfg := jetstream.StreamConfig{
			Name:     b.opts.Stream,
			Storage:  jetstream.FileStorage,
			Replicas: b.opts.Replicas,
		}
		want(&cfg)
		created, cerr := b.createStream(ctx, cfg)
		if cerr != nil || created {
			return cerr
		}
		st, err = b.js.Stream(ctx, b.opts.Stream) // another replica created it meanwhile
	}
	if err != nil {
		return err
	}
	cfg := st.CachedInfo().Config
	if want(&cfg) {
		_, err = b.js.UpdateStream(ctx, cfg)
	}
	return err
}

// createStream creates the stream with cfg, or finds that another replica
// has: created is false then, and err nil.
func (b *Backplane) createStream(ctx context.Context, cfg jetstream.StreamConfig) (created bool, err error) {
	for attempt := 1; ; attempt++ {
		_, err := b.js.CreateStream(ctx, cfg)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, jetstream.ErrStreamNameAlreadyInUse):
			return false, nil
		}
		// Right after a stream is deleted (a lost log), the server can fail
		// a create with a generic error, "error creating store for
		// stream", while another replica recreates it or the old store is
		// still being removed (seen once in CI). It passes: look again,
		// and try again a few times.
		if ae := apiError(err); ae == nil || ae.ErrorCode != codeStreamCreate || attempt == createAttempts {
			return false, err
		}
		if _, serr := b.js.Stream(ctx, b.opts.Stream); serr == nil {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, err
		case <-time.After(time.Duration(attempt) * 25 * time.Millisecond):
		}
	}
}

// apiError returns the JetStream API error in err, or nil.
func apiError(err error) *jetstream.APIError {
	var ae *jetstream.APIError
	if errors.As(err, &ae) {
		return ae
	}
	return nil
}

// errNotFound is getMsg's answer when there is no such message.
var errNotFound = errors.New("natsbus: no message")

// msgGetRequest is the body of a JetStream message get.
type msgGetRequest struct {
	Seq     uint64 `json:"seq,omitempty"`
	LastFor string `json:"last_by_subj,omitempty"`
	NextFor string `json:"next_by_subj,omitempty"`
	Batch   int    `json:"batch,omitempty"`
}

// getMsg reads one message through the stream's leader
// ($JS.API.STREAM.MSG.GET, not a direct get, which any replica of the
// stream answers and which may lag): what the backplane decides by (the
// epoch, the last id) is never stale. A missing stream is created again
// (a lost stream: the sessions start new epochs) and reads as no message.
// A read while the connection reconnects, or cut under it, waits for the
// reconnect and is sent again (link.read), within ctx.
func (b *Backplane) getMsg(ctx context.Context, req msgGetRequest, body bool) (logMsg, error) {
	q, _ := json.Marshal(req)
	var resp *nats.Msg
	err := b.link.read(ctx, func(ctx context.Context) (err error) {
		resp, err = b.nc.RequestWithContext(ctx, b.api+"STREAM.MSG.GET."+b.opts.Stream, q)
		return err
	})
	if err != nil {
		return logMsg{}, err
	}
	var r struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Subject string `json:"subject"`
			Seq     uint64 `json:"seq"`
			Header  []byte `json:"hdrs"`
			Data    []byte `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return logMsg{}, fmt.Errorf("natsbus: message get: %w", err)
	}
	switch {
	case r.Error != nil && r.Error.ErrorCode == codeNoMessage:
		return logMsg{}, errNotFound
	case r.Error != nil && r.Error.ErrorCode == codeStreamNotFound:
		if err := b.ensureStream(ctx); err != nil {
			return logMsg{}, fmt.Errorf("natsbus: the stream is lost and cannot be created again: %w", err)
		}
		b.log.Warn("natsbus: the stream was lost; created it again", "stream", b.opts.Stream)
		return logMsg{}, errNotFound
	case r.Error != nil:
		return logMsg{}, r.Error
	case r.Message == nil:
		return logMsg{}, errors.New("natsbus: message get: empty answer")
	}
	var hdr nats.Header
	if len(r.Message.Header) > 0 {
		if hdr, err = nats.DecodeHeadersMsg(r.Message.Header); err != nil {
			return logMsg{}, err
		}
	}
	return parseMsg(r.Message.Seq, r.Message.Subject, hdr, r.Message.Data, body)
}

// head reads the last message of subj.
func (b *Backplane) head(ctx context.Context, subj string) (head, error) {
	m, err := b.getMsg(ctx, msgGetRequest{LastFor: subj}, false)
	switch {
	case errors.Is(err, errNotFound):
		return head{}, nil
	case err != nil:
		return head{}, err
	}
	return head{seq: m.seq, epoch: m.epoch, id: m.id}, nil
}

// errEpochGone is the error of a read of an epoch the subject no longer
// holds.
var errEpochGone = errors.New("natsbus: the session's epoch is gone (deleted or replaced)")

// firstEvent returns the first event (id > 0) of epoch on subj at or
// after stream sequence from; ok is false when there is none. It fails
// with errEpochGone when it finds an event of another epoch.
func (b *Backplane) firstEvent(ctx context.Context, subj, epoch string) (logMsg, bool, error) {
	return b.nextEvent(ctx, subj, epoch, 0)
}

func (b *Backplane) nextEvent(ctx context.Context, subj, epoch string, from uint64) (logMsg, bool, error) {
	for {
		m, err := b.getMsg(ctx, msgGetRequest{Seq: from, NextFor: subj}, true)
		switch {
		case errors.Is(err, errNotFound):
			return logMsg{}, false, nil
		case err != nil:
			return logMsg{}, false, err
		case m.id > 0 && m.epoch != epoch:
			return logMsg{}, false, errEpochGone
		case m.id > 0:
			return m, true, nil
		}
		from = m.seq + 1 // a marker or a tombstone
	}
}

// tombstone rolls subj up: one message that purges every other message of
// the subject, atomically, and expires after tombstoneTTL.
//
// It is sent at most once (link.send): a second tombstone could purge a
// new epoch that another replica started after the first.
func (b *Backplane) tombstone(ctx context.Context, subj string) error {
	msg := &nats.Msg{Subject: subj, Header: nats.Header{}}
	msg.Header.Set(hdrDeleted, "1")
	msg.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	return b.link.send(ctx, func() error {
		_, err := b.js.PublishMsg(ctx, msg, jetstream.WithMsgTTL(tombstoneTTL))
		return err
	})
}

// directBatch reads up to n messages of subj from stream sequence from on
// with one batched direct get (answered by any replica of the stream,
// which may lag the leader: the caller checks what it got). more reports
// that the subject holds messages past the batch. Like getMsg, it waits
// for a reconnect and is sent again after a cut, within ctx.
func (b *Backplane) directBatch(ctx context.Context, subj string, from uint64, n int) (msgs []logMsg, more bool, err error) {
	err = b.link.read(ctx, func(ctx context.Context) (err error) {
		msgs, more, err = b.directBatchOnce(ctx, subj, from, n)
		return err
	})
	return msgs, more, err
}

// directBatchOnce is one attempt of directBatch.
func (b *Backplane) directBatchOnce(ctx context.Context, subj string, from uint64, n int) (msgs []logMsg, more bool, err error) {
	inbox := b.nc.NewRespInbox()
	sub, err := b.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, false, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	body, _ := json.Marshal(msgGetRequest{Seq: from, NextFor: subj, Batch: n})
	if err := b.nc.PublishRequest(b.api+"DIRECT.GET."+b.opts.Stream, inbox, body); err != nil {
		return nil, false, err
	}
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return nil, false, err
		}
		switch status := m.Header.Get("Status"); status {
		case "":
		case "204": // end of batch
			return msgs, m.Header.Get("Nats-Num-Pending") != "0", nil
		case "404":
			return msgs, false, nil
		default:
			return nil, false, fmt.Errorf("natsbus: direct get: status %s %s", status, m.Header.Get("Description"))
		}
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return nil, false, fmt.Errorf("natsbus: direct get: no sequence")
		}
		lm, err := parseMsg(seq, m.Header.Get(jetstream.SubjectHeader), m.Header, m.Data, true)
		if err != nil {
			return nil, false, err
		}
		msgs = append(msgs, lm)
	}
}
