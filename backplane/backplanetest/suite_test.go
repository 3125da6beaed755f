package backplanetest

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The suite passes on an engine that keeps the contract.
func TestMemory(t *testing.T) { Run(t, memHarness(memFaults{})) }

// recorder is a testing.TB that records a check's failures instead of
// failing the test: FailNow ends the check's goroutine, as testing's
// does, and the cleanups run when the check is over (record).
type recorder struct {
	testing.TB // the test: Name, TempDir, Helper, Log

	mu       sync.Mutex
	failed   bool
	skipped  bool
	msgs     []string
	cleanups []func()
}

func (r *recorder) note(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
	r.msgs = append(r.msgs, msg)
}

func (r *recorder) Fail()                             { r.note("Fail") }
func (r *recorder) FailNow()                          { r.note("FailNow"); runtime.Goexit() }
func (r *recorder) Error(args ...any)                 { r.note(fmt.Sprint(args...)) }
func (r *recorder) Errorf(format string, args ...any) { r.note(fmt.Sprintf(format, args...)) }
func (r *recorder) Fatal(args ...any)                 { r.note(fmt.Sprint(args...)); runtime.Goexit() }
func (r *recorder) Fatalf(format string, args ...any) {
	r.note(fmt.Sprintf(format, args...))
	runtime.Goexit()
}

func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *recorder) SkipNow() {
	r.mu.Lock()
	r.skipped = true
	r.mu.Unlock()
	runtime.Goexit()
}
func (r *recorder) Skip(args ...any)                 { r.Log(args...); r.SkipNow() }
func (r *recorder) Skipf(format string, args ...any) { r.Logf(format, args...); r.SkipNow() }
func (r *recorder) Skipped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.skipped
}

func (r *recorder) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

// record runs the check named name on h with a recorder, and returns it
// once the check and its cleanups are over.
func record(t *testing.T, name string, h Harness) *recorder {
	t.Helper()
	for _, c := range checks {
		if c.name != name {
			continue
		}
		r := &recorder{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			runCheck(r, c, h)
		}()
		<-done
		for i := len(r.cleanups) - 1; i >= 0; i-- {
			r.cleanups[i]()
		}
		return r
	}
	t.Fatalf("no check %q", name)
	return nil
}

// A deliberately broken engine fails the suite, and the failure names the
// promise it broke; the same check passes on the engine unbroken.
func TestBrokenEngineFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		faults memFaults
		check  string
		want   string
	}{
		{"ids not contiguous", memFaults{skipID: 3}, "IDsContiguous",
			"backplanetest: ids are not contiguous from 1 across replicas: got 4 after 2"},
		{"ids not contiguous, seen by a subscriber", memFaults{skipID: 5}, "OneOrderEverywhere",
			"backplanetest: replicas do not deliver one order: "},
		{"epoch not kept", memFaults{newEpochs: true}, "EpochKept",
			"backplanetest: the session's epoch is not kept: "},
		{"epoch not kept across an idle release", memFaults{newEpochs: true}, "IdleRelease",
			"backplanetest: an idle mirror is not released, or its session changed: "},
		{"a reserved type appended", memFaults{reservedTypes: true}, "ReservedTypes",
			"backplanetest: a synthetic frame's type is not refused without using an id: publish of type replay_complete: id 1"},
		{"session ids checked by length alone", memFaults{bytesOnlyIDs: true}, "InvalidSessionIDs",
			"backplanetest: a session id the shared rule refuses is not refused with the module's ErrInvalidSession: Publish of \"a\\xff\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := record(t, tc.check, memHarness(tc.faults))
			if !r.Failed() || len(r.msgs) == 0 || !strings.HasPrefix(r.msgs[0], tc.want) {
				t.Fatalf("%s on the broken engine: failed %v, messages %q; want the first to start %q", tc.check, r.Failed(), r.msgs, tc.want)
			}
			t.Logf("the suite says: %s", r.msgs[0])
			if ok := record(t, tc.check, memHarness(memFaults{})); ok.Failed() || ok.Skipped() {
				t.Fatalf("%s on the engine unbroken: %q (skipped %v)", tc.check, ok.msgs, ok.Skipped())
			}
		})
	}
}

// A check whose control the harness lacks is skipped, not failed.
func TestMissingControlSkips(t *testing.T) {
	h := memHarness(memFaults{})
	start := h.Start
	h.Start = func(t testing.TB, n int, o Options) Cluster {
		c := start(t, n, o)
		c.Gates, c.Down, c.Up, c.Lose = nil, nil, nil, nil
		return c
	}
	h.TrimsBytes = false
	for _, name := range []string{"ResumeOnALaggingReplica", "Outage", "LostLog", "TrimByBytes"} {
		if r := record(t, name, h); !r.Skipped() || r.Failed() {
			t.Fatalf("%s without its control: skipped %v, failures %q", name, r.Skipped(), r.msgs)
		}
	}
}
