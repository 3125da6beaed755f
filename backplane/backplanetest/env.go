package backplanetest

import (
	"os"
	"os/exec"
	"sync"
	"testing"
)

// Env returns the environment variable name, which the CI script of a
// backplane sets (the URL of the engine server it started, say), for a
// harness whose engine the test binary cannot start itself. When it is
// unset the test is skipped with hint, unless CI=true, where it fails: a
// CI run never passes for want of its engine.
func Env(t testing.TB, name, hint string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set (CI=true): %s", name, hint)
		}
		t.Skipf("%s is not set: %s", name, hint)
	}
	return v
}

// Control runs the verbs of a command that controls an engine server a
// CI script started ("restart", "pause", "resume": .ci/pg.sh writes one),
// for a harness's Cluster.Down and Up. A Control that has paused the
// server resumes it when its test ends.
type Control struct {
	t   testing.TB
	cmd string

	mu     sync.Mutex
	paused bool
}

// NewControl returns a Control for the command cmd (a path).
func NewControl(t testing.TB, cmd string) *Control {
	c := &Control{t: t, cmd: cmd}
	t.Cleanup(c.Resume)
	return c
}

func (c *Control) run(verb string) {
	c.t.Helper()
	out, err := exec.Command(c.cmd, verb).CombinedOutput()
	if err != nil {
		c.t.Fatalf("%s %s: %v: %s", c.cmd, verb, err, out)
	}
}

// Restart restarts the server and returns once it accepts connections.
func (c *Control) Restart() { c.t.Helper(); c.run("restart") }

// Pause stops every process of the server (SIGSTOP): it accepts
// connections and answers nothing.
func (c *Control) Pause() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.run("pause")
	c.paused = true
}

// Resume continues a paused server. Idempotent.
func (c *Control) Resume() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.paused {
		c.run("resume")
		c.paused = false
	}
}
