package main

import (
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

var testOpts = runOpts{timeout: 10 * time.Second, stall: 2 * time.Second, stopMax: 5 * time.Second}

func TestSinkAccounting(t *testing.T) {
	sinks, g := newSinks(1, 5, -1)
	s := sinks[0]
	for _, seq := range []uint64{1, 2, 2, 4, 3, 5} {
		s.see(seq)
	}
	// 2 again: dup; 4 skips 3: missing 1; 3 late: dup (reordered); 5 completes.
	if s.dup != 2 || s.missing != 1 || !s.complete || s.got != 6 {
		t.Fatalf("dup %d missing %d complete %v got %d", s.dup, s.missing, s.complete, s.got)
	}
	select {
	case <-g.all:
	default:
		t.Fatal("group not done")
	}
	s.see(5)
	if s.dup != 3 {
		t.Fatalf("delivery after completion not counted: dup %d", s.dup)
	}

	sinks, _ = newSinks(1, 10, -1)
	s = sinks[0]
	s.see(1)
	s.see(2)
	s.end("evicted")
	if s.missing != 8 || !s.ended || s.gapMissing() != 0 {
		t.Fatalf("missing %d ended %v gap %d", s.missing, s.ended, s.gapMissing())
	}
}

// fakeFanout delivers through a channel per subscriber and misbehaves on
// purpose: drop skips every 10th event, dupe delivers every 10th twice,
// block makes publish hang from event blockAt on.
type fakeFanout struct {
	drop, dupe bool
	blockAt    uint64
	chans      []chan uint64
	wg         sync.WaitGroup
	unblock    chan struct{}
}

func (f *fakeFanout) start(sinks []*sink) error {
	f.unblock = make(chan struct{})
	for _, s := range sinks {
		ch := make(chan uint64, 64)
		f.chans = append(f.chans, ch)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			s.waitRelease()
			for seq := range ch {
				s.see(seq)
			}
			s.end("closed")
		}()
	}
	return nil
}

func (f *fakeFanout) publish(seq uint64) error {
	if f.blockAt != 0 && seq >= f.blockAt {
		<-f.unblock
		return nil
	}
	for _, ch := range f.chans {
		if f.drop && seq%10 == 0 {
			continue
		}
		ch <- seq
		if f.dupe && seq%10 == 0 {
			ch <- seq
		}
	}
	return nil
}

func (f *fakeFanout) stop() {
	close(f.unblock)
	for _, ch := range f.chans {
		close(ch)
	}
	f.wg.Wait()
}

func TestHarnessReportsLossDupAndBlock(t *testing.T) {
	cases := []struct {
		name string
		f    func() *fakeFanout
		want status
	}{
		{"correct", func() *fakeFanout { return &fakeFanout{} }, statusOK},
		{"drop", func() *fakeFanout { return &fakeFanout{drop: true} }, statusLossy},
		{"dupe", func() *fakeFanout { return &fakeFanout{dupe: true} }, statusLossy},
		{"block", func() *fakeFanout { return &fakeFanout{blockAt: 500} }, statusBlocked},
	}
	o := testOpts
	o.stall = time.Second
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lib := library{name: c.name, new: func(config) fanout { return c.f() }}
			r := runFanout(lib, config{queue: 64}, 4, 1000, o)
			if r.status != c.want {
				t.Fatalf("status %s (%s), want %s", r.status, r.detail, c.want)
			}
		})
	}
}

// TestLibrariesDeliverEverything: every adapter, small sizes, both publisher
// modes, must pass the checks (otherwise the harness, not the library, is
// suspect and the comparison is void).
func TestLibrariesDeliverEverything(t *testing.T) {
	for _, window := range []int{0, 128} {
		o := testOpts
		o.window = window
		for _, lib := range libraries {
			for _, subs := range []int{1, 16} {
				r := runFanout(lib, config{queue: 2048}, subs, 500, o)
				if r.status != statusOK {
					// eventbus may evict (or resync) under a tight publisher;
					// that is a result, not a harness bug, so only the closed
					// loop must pass. The catch-up policy loses nothing in both.
					if (lib.name == "eventbus" || lib.name == "eventbus resync") && window == 0 && r.status == statusLossy {
						t.Logf("%s subs=%d tight loop: %s", lib.name, subs, r.detail)
						continue
					}
					t.Errorf("%s subs=%d window=%d: %s %s", lib.name, subs, window, r.status, r.detail)
				}
			}
		}
	}
}

func TestHTTPDeliverEverything(t *testing.T) {
	o := testOpts
	o.window = 128
	for _, h := range httpLibraries {
		r := runFanout(h.asLibrary(), config{queue: 1024}, 4, 300, o)
		if r.status != statusOK {
			t.Errorf("%s: %s %s", h.name, r.status, r.detail)
		}
	}
}

func TestStallScenario(t *testing.T) {
	for _, lib := range libraries {
		r := runStall(lib, config{queue: 256}, 8, 2000, 500*time.Millisecond, 5*time.Second)
		if r.hung {
			t.Errorf("%s: teardown hung", lib.name)
			continue
		}
		t.Logf("%s: blocked=%v after %d, healthy %d/%d, evicted=%v stalled got %d", lib.name, r.publisherBlock, r.publishedBefore, r.healthyAll, r.healthyTotal, r.stalledEvicted, r.stalledGot)
		switch {
		case lib.name == "eventbus catchup":
			// The stalled one is behind (evicted only after 30 s without a
			// take); the others get everything.
			if r.publisherBlock || r.healthyAll != r.healthyTotal {
				t.Errorf("%s: publisher blocked %v, healthy complete %d/%d", lib.name, r.publisherBlock, r.healthyAll, r.healthyTotal)
			}
		case strings.HasPrefix(lib.name, "eventbus"):
			if r.publisherBlock || !r.stalledEvicted {
				t.Errorf("%s: publisher blocked %v, stalled evicted %v", lib.name, r.publisherBlock, r.stalledEvicted)
			}
		case !r.publisherBlock:
			t.Errorf("%s: expected the publisher to block behind the stalled subscriber", lib.name)
		}
	}
}

// readSSE, the HTTP scenario's hand-written reader, reads what
// sseclient.Parser reads on streams with LF or CRLF line ends (every server
// of the scenario writes LF): the same ids, warnings and end.
func TestReadSSE(t *testing.T) {
	streams := []struct {
		in, end string
		got     uint64 // ids seen
		next    uint64 // the next id expected
		warns   uint64
	}{
		{"retry: 3000\n\n: heartbeat\n\nid: 1\nevent: bench\ndata: {}\n\n" +
			"event: slow_client_warning\ndata: {}\n\n" +
			"id:2\r\ndata: x\r\n\r\n" +
			"event: client_evicted\ndata: {}\n\n", "evicted", 2, 3, 1},
		{":\nid: 1\nevent: bench\ndata: a\ndata: b\n\n:\n" +
			"id: 2\nevent: bench\nfoo: bar\ndata\n\n" +
			"id: x\nevent: stream_error\ndata: {}\n\n" +
			"id: 3\nevent: bench\ndata: cut", "stream_error", 2, 3, 0},
		{"id: 1\r\nevent: bench\r\ndata: {}\r\n\r\nid: 3\ndata: {}\n\nid: 2\ndata: {}\n\n", "closed", 3, 4, 0},
	}
	for i, c := range streams {
		for name, read := range map[string]func(io.Reader, *sink) string{"readSSE": readSSE, "sseclient.Parser": readSSEParser} {
			sinks, _ := newSinks(1, 5, -1)
			s := sinks[0]
			end := read(strings.NewReader(c.in), s)
			if end != c.end || s.got != c.got || s.next != c.next || s.warnings != c.warns {
				t.Errorf("stream %d, %s: end %q got %d next %d warnings %d, want %q %d %d %d", i, name, end, s.got, s.next, s.warnings, c.end, c.got, c.next, c.warns)
			}
		}
	}
}

// TestPacedScenario: at a rate every library sustains, every one passes
// (else the harness is suspect), latency is recorded; and a rate far too
// high for the tight evicting bus is reported as not sustained with the
// reason.
func TestPacedScenario(t *testing.T) {
	o := pacedOpts{rate: 2000, duration: 200 * time.Millisecond, settle: 3 * time.Second}
	for _, lib := range libraries {
		r := runPacedOnce(lib, config{queue: 256}, 4, o)
		if !r.sustained() {
			t.Errorf("%s at 2000/s: %s", lib.name, r.why())
		}
		if r.lat.Quantile(0.5) <= 0 {
			t.Errorf("%s: no latency recorded", lib.name)
		}
	}
	for _, lib := range libraries {
		if lib.name != "eventbus catchup" {
			continue
		}
		// Pausing subscribers at 20,000/s with a queue of 16: catch-up
		// keeps every event.
		po := pacedOpts{rate: 20_000, pause: true, duration: 300 * time.Millisecond, settle: 3 * time.Second}
		if r := runPacedOnce(lib, config{queue: 16}, 4, po); !r.lossless() {
			t.Errorf("%s, queue 16, pausing: %s", lib.name, r.why())
		}
	}
}
