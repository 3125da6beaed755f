package main

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	pubsub "github.com/cskr/pubsub/v2"
	r3sse "github.com/r3labs/sse/v2"
	gosse "github.com/tmaxmax/go-sse"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
	"github.com/ssebus/eventbus/benchmarks/internal/naive"
)

// benchPayload is the event data every library carries: {"n":1}.
const benchPayload = `{"n":1}`

// appendEnvelope builds the JSON envelope the non-eventbus adapters publish:
// the same shape and size eventbus encodes, server timestamp included, so
// every library carries the same bytes and does one encoding per event.
func appendEnvelope(dst []byte, seq uint64) []byte {
	dst = append(dst, `{"id":`...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, `,"v":1,"type":"bench","data":`...)
	dst = append(dst, benchPayload...)
	dst = append(dst, `,"_meta":{"serverTimestamp":`...)
	dst = strconv.AppendInt(dst, time.Now().UnixMilli(), 10)
	return append(dst, "}}"...)
}

func newEnvelope(seq uint64) []byte { return appendEnvelope(make([]byte, 0, 96), seq) }

// ---------------------------------------------------------------------------
// (1) naive baseline: sync.RWMutex + one buffered chan per subscriber,
// blocking send.

// naiveMsg is the naive baseline's message (package naive).
type naiveMsg = naive.Msg

// naiveFanout with encoder set encodes each event with eventbus's own
// encoder (backplane.Encoder), which validates and encodes exactly as
// Publish does (one allocation, the same bytes): issue 13's baseline for
// one subscriber is a naive bus that delivers "the same encoded bytes
// (encode once, same validation)". Without it, the event is the hand-built envelope of
// appendEnvelope: the same bytes, no validation.
type naiveFanout struct {
	cfg     config
	encoder *backplane.Encoder
	b       naive.Broker
	wg      sync.WaitGroup
}

func (f *naiveFanout) start(sinks []*sink) error {
	var running sync.WaitGroup
	for _, s := range sinks {
		ch := f.b.Subscribe(f.cfg.queue)
		runSink(&f.wg, &running, s, func() { drainChan(ch, s) })
	}
	running.Wait()
	return nil
}

// drainChan is a channel subscriber's loop: every message's id into s
// until the channel closes.
func drainChan(ch <-chan naiveMsg, s *sink) {
	for m := range ch {
		s.see(m.ID)
	}
	s.end("closed")
}

func (f *naiveFanout) publish(seq uint64) error {
	if f.encoder != nil {
		e, err := f.encoder.Encode(eventbus.Event{Type: "bench", Data: benchData})
		if err != nil {
			return err
		}
		f.b.Publish(naiveMsg{ID: seq, Data: e.Tail})
		return nil
	}
	f.b.Publish(naiveMsg{ID: seq, Data: newEnvelope(seq)})
	return nil
}

func (f *naiveFanout) stop() { f.b.Close(); f.wg.Wait() }

// ---------------------------------------------------------------------------
// (2) github.com/cskr/pubsub/v2: one topic, Sub channels of cfg.queue
// capacity, blocking Pub.

type pubsubFanout struct {
	cfg config
	ps  *pubsub.PubSub[string, naiveMsg]
	wg  sync.WaitGroup
}

func (f *pubsubFanout) start(sinks []*sink) error {
	f.ps = pubsub.New[string, naiveMsg](f.cfg.queue)
	var running sync.WaitGroup
	for _, s := range sinks {
		ch := f.ps.Sub("bench") // synchronous: registered when Sub returns
		runSink(&f.wg, &running, s, func() { drainChan(ch, s) })
	}
	running.Wait()
	return nil
}

func (f *pubsubFanout) publish(seq uint64) error {
	f.ps.Pub(naiveMsg{ID: seq, Data: newEnvelope(seq)}, "bench")
	return nil
}

func (f *pubsubFanout) stop() { f.ps.Shutdown(); f.wg.Wait() }

// ---------------------------------------------------------------------------
// (3) github.com/tmaxmax/go-sse Joe, in-process: each subscriber is a
// Joe.Subscribe call with a MessageWriter whose Send checks the id. Joe calls
// Send synchronously from its own single goroutine, so "draining" happens on
// Joe's goroutine, one subscriber after the other.

// joeReady is a Replayer that does nothing but tell us when Joe has taken a
// subscription: Joe calls Replay on its goroutine right before adding the
// subscriber, and handles the next publish only after that.
type joeReady struct{ wg *sync.WaitGroup }

func (j joeReady) Put(m *gosse.Message, _ []string) (*gosse.Message, error) { return m, nil }
func (j joeReady) Replay(gosse.Subscription) error                          { j.wg.Done(); return nil }

type joeWriter struct{ s *sink }

func (w joeWriter) Send(m *gosse.Message) error {
	w.s.waitRelease()
	seq, err := strconv.ParseUint(m.ID.String(), 10, 64)
	if err != nil {
		return err
	}
	w.s.see(seq)
	return nil
}

func (w joeWriter) Flush() error { return nil }

var joeTopics = []string{gosse.DefaultTopic}

type joeFanout struct {
	joe    *gosse.Joe
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (f *joeFanout) start(sinks []*sink) error {
	var ready sync.WaitGroup
	ready.Add(len(sinks))
	f.joe = &gosse.Joe{Replayer: joeReady{&ready}}
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	for _, s := range sinks {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			err := f.joe.Subscribe(ctx, gosse.Subscription{Client: joeWriter{s}, Topics: joeTopics})
			if err != nil && !errors.Is(err, gosse.ErrProviderClosed) {
				s.end("error: " + err.Error())
				return
			}
			s.end("closed")
		}()
	}
	ready.Wait()
	return nil
}

func (f *joeFanout) publish(seq uint64) error {
	m := &gosse.Message{ID: gosse.ID(strconv.FormatUint(seq, 10)), Type: gosse.Type("bench")}
	m.AppendData(string(newEnvelope(seq)))
	return f.joe.Publish(m, joeTopics)
}

func (f *joeFanout) stop() {
	f.cancel()
	f.wg.Wait()
	_ = f.joe.Shutdown(context.Background())
}

// ---------------------------------------------------------------------------
// (4) github.com/r3labs/sse/v2 Server. Its only public subscriber is the
// HTTP handler (Stream.addSubscriber is unexported), so the in-process
// adapter drives Server.ServeHTTP with an in-memory ResponseWriter (no
// sockets) that reads the "id:" line of every event. AutoReplay is off: with
// it on, the server keeps every event forever and renumbers ids from 0.

type r3Fanout struct {
	srv    *r3sse.Server
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newR3Server() *r3sse.Server {
	srv := r3sse.New()
	srv.AutoReplay = false
	srv.CreateStream("bench")
	return srv
}

// r3Writer is an in-memory http.ResponseWriter + http.Flusher. r3labs writes
// each field with one fmt.Fprintf, so an id arrives as one Write "id: N\n".
type r3Writer struct {
	s      *sink
	h      http.Header
	ready  func()
	headed bool
}

func (w *r3Writer) Header() http.Header { return w.h }
func (w *r3Writer) WriteHeader(int) {
	if !w.headed {
		w.headed = true
		w.ready()
	}
}

func (w *r3Writer) Write(p []byte) (int, error) {
	w.s.waitRelease()
	if len(p) > 4 && string(p[:4]) == "id: " {
		seq, err := strconv.ParseUint(string(p[4:len(p)-1]), 10, 64)
		if err == nil {
			w.s.see(seq)
		}
	}
	return len(p), nil
}
func (w *r3Writer) Flush() {}

func (f *r3Fanout) start(sinks []*sink) error {
	f.srv = newR3Server()
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	var ready sync.WaitGroup
	ready.Add(len(sinks))
	for _, s := range sinks {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "/events?stream=bench", nil)
		if err != nil {
			return err
		}
		w := &r3Writer{s: s, h: http.Header{}, ready: ready.Done}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.srv.ServeHTTP(w, req)
			s.end("closed")
		}()
	}
	ready.Wait()
	return nil
}

func (f *r3Fanout) publish(seq uint64) error {
	f.srv.Publish("bench", &r3sse.Event{
		ID:    strconv.AppendUint(make([]byte, 0, 8), seq, 10),
		Event: []byte("bench"),
		Data:  newEnvelope(seq),
	})
	return nil
}

func (f *r3Fanout) stop() {
	f.cancel() // each handler deregisters, which closes its channel
	f.wg.Wait()
	f.srv.Close()
}

// newNaiveEncoding is the naive bus that encodes with eventbus's encoder
// (backplane.Encoder).
func newNaiveEncoding(c config) fanout {
	enc, err := backplane.NewEncoder(eventbus.Options{})
	if err != nil {
		panic(err) // the zero Options are valid
	}
	return &naiveFanout{cfg: c, encoder: enc}
}
