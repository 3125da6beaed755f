// Package daemontest runs the demo daemon cmd/sessiond as a process for the
// end-to-end tests of other modules (e2e/, interop/, cmd/sessiond's own),
// which may import it because their paths lie under
// github.com/ssebus/eventbus: it builds the binary, starts it on a
// loopback port, stops it with SIGTERM, and talks to its JSON routes.
// Every helper fails the test on an unexpected answer.
//
// ReplicaSuite does the same for the backplane modules' replica daemons
// (sessiond-redis, sessiond-pg, sessiond-nats): one set of black-box
// checks that each daemon's main_test.go runs with a harness of its
// engine. RunReplica runs such a daemon in the test's process, and
// WebSocketAcrossReplicas checks its GET /ws and GET /events across two
// replicas, speaking WebSocket through sseclient's dialer interface so
// that this package, like the root module, imports no WebSocket library.
package daemontest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Daemon is a running cmd/sessiond, started by Start. Its methods are for
// the test's goroutine (they call t.Fatal).
type Daemon struct {
	t   testing.TB
	cmd *exec.Cmd
	// Base is the daemon's URL without a trailing slash: http://host:port,
	// or https:// with -tls-cert.
	Base string
	// HTTP is the client Call uses; a test may set its Transport (to trust
	// a test certificate).
	HTTP *http.Client
	// Header is sent with every Call (and so with Status and Publish),
	// such as the Authorization of a daemon started with -auth-token.
	Header http.Header

	mu   sync.Mutex
	logs bytes.Buffer
	done chan struct{} // closed when stderr hits EOF
}

// LogText returns what the daemon has logged so far.
func (d *Daemon) LogText() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.logs.String()
}

// Build compiles cmd/sessiond of the repository whose root module is in
// rootDir into a temp dir, with -race when race is set, and returns the
// binary. cmd/sessiond is a module of its own (its dependencies stay out
// of the root module), so it is built inside its folder, where its go.mod
// replaces the root with the working tree.
func Build(ctx context.Context, t testing.TB, rootDir string, race bool) string {
	t.Helper()
	return build(ctx, t, filepath.Join(rootDir, "cmd", "sessiond"), ".", "sessiond", race)
}

// build compiles the main package pkg in dir into a temp dir as name,
// with -race when race is set, and returns the binary.
func build(ctx context.Context, t testing.TB, dir, pkg, name string, race bool) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the daemon: %v", err)
	}
	bin := filepath.Join(t.TempDir(), name)
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	args = append(args, pkg)
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

// Start runs bin on a free loopback port and waits for its listening
// log line. Cleanup kills it if the test did not stop it. The daemon runs
// with -create-on-stream: a stream (or a HEAD of it) creates its session, so that a client
// reconnecting across a restart or a DELETE finds a new epoch (a test of
// the 404 of an unknown session passes -create-on-stream=false).
func Start(ctx context.Context, t testing.TB, bin string, args ...string) *Daemon {
	t.Helper()
	return start(ctx, t, exec.Command(bin, append([]string{"-addr", "127.0.0.1:0", "-create-on-stream"}, args...)...),
		regexp.MustCompile(`msg="sessiond listening" addr=\S+ url=(\S+)/`), func(url string) string { return url })
}

// start runs cmd and waits for the log line addrRE matches; base makes
// the daemon's Base of its first submatch.
func start(ctx context.Context, t testing.TB, cmd *exec.Cmd, addrRE *regexp.Regexp, base func(string) string) *Daemon {
	t.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &Daemon{t: t, cmd: cmd, done: make(chan struct{}), HTTP: &http.Client{Timeout: 10 * time.Second}}
	addrCh := make(chan string, 1)
	go func() {
		defer close(d.done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			d.mu.Lock()
			d.logs.WriteString(line + "\n")
			d.mu.Unlock()
			if m := addrRE.FindStringSubmatch(line); m != nil {
				select {
				case addrCh <- m[1]:
				default:
				}
			}
		}
		io.Copy(io.Discard, stderr) // after a scanner error
	}()
	t.Cleanup(func() {
		d.HTTP.CloseIdleConnections()
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-d.done
			cmd.Wait()
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.LogText())
		}
	})
	select {
	case m := <-addrCh:
		d.Base = base(m)
	case <-d.done:
		t.Fatalf("the daemon exited before listening:\n%s", d.LogText())
	case <-ctx.Done():
		t.Fatalf("the daemon did not start listening: %v\n%s", ctx.Err(), d.LogText())
	}
	return d
}

// PID returns the daemon's process id, for a test that reads its
// /proc entries (open descriptors, peak RSS).
func (d *Daemon) PID() int { return d.cmd.Process.Pid }

// Stop sends SIGTERM and expects a clean exit: every bus closed, then the
// HTTP server shut down while the browser still holds its stream open.
func (d *Daemon) Stop(timeout time.Duration) {
	d.t.Helper()
	if err := d.terminate(timeout); err != nil {
		d.t.Fatal(err)
	}
}

// terminate is Stop, returning what went wrong.
func (d *Daemon) terminate(timeout time.Duration) error {
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-d.done:
	case <-time.After(timeout):
		return fmt.Errorf("the daemon did not exit within %v of SIGTERM", timeout)
	}
	if err := d.cmd.Wait(); err != nil {
		return fmt.Errorf("the daemon exited with %v after SIGTERM", err)
	}
	return nil
}

// Kill ends the daemon with SIGKILL, as a crash would: no shutdown frame,
// every connection cut, every in-memory session lost; it returns once the
// process has exited, so that a new daemon may listen on its address.
func (d *Daemon) Kill() {
	d.t.Helper()
	if err := d.cmd.Process.Kill(); err != nil {
		d.t.Fatal(err)
	}
	<-d.done
	_ = d.cmd.Wait() // "signal: killed"
}

// Call sends a request and decodes a JSON answer into out (when non-nil).
func (d *Daemon) Call(method, path, body string, wantStatus int, out any) {
	d.t.Helper()
	a := d.Do(method, path, body, nil)
	if a.Status != wantStatus {
		d.t.Fatalf("%s %s: %d %s, want %d", method, path, a.Status, a.Raw, wantStatus)
	}
	if out != nil {
		if err := json.Unmarshal(a.Raw, out); err != nil {
			d.t.Fatalf("%s %s: %q: %v", method, path, a.Raw, err)
		}
	}
}

// Answer is a response read by Do.
type Answer struct {
	Status int
	Header http.Header
	Raw    []byte         // the body
	JSON   map[string]any // the body decoded, nil when it is no JSON object
}

// Code is the "code" of a JSON error answer.
func (a Answer) Code() any { return a.JSON["code"] }

// Do sends a request with d.Header and then header, and reads the answer
// whatever its status; it fails the test only when no answer comes.
func (d *Daemon) Do(method, path, body string, header http.Header) Answer {
	d.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, d.Base+path, rd)
	if err != nil {
		d.t.Fatal(err)
	}
	for _, h := range []http.Header{d.Header, header} {
		for k, v := range h {
			req.Header[k] = v
		}
	}
	resp, err := d.HTTP.Do(req)
	if err != nil {
		d.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		d.t.Fatal(err)
	}
	a := Answer{Status: resp.StatusCode, Header: resp.Header, Raw: b}
	json.Unmarshal(b, &a.JSON)
	return a
}

// Status is the daemon's GET /session/{id} answer.
type Status struct {
	Epoch          string `json:"epoch"`
	LastEventID    uint64 `json:"lastEventId"`
	Subscribers    int    `json:"subscribers"`
	Streams        int    `json:"streams"`
	StreamsOpened  int    `json:"streamsOpened"`
	StreamsResumed int    `json:"streamsResumed"`
	LastResumeFrom string `json:"lastResumeFrom"`
}

// Status returns the status of session, which must exist.
func (d *Daemon) Status(session string) Status {
	d.t.Helper()
	var st Status
	d.Call(http.MethodGet, "/session/"+session, "", http.StatusOK, &st)
	return st
}

// StatusIfAny is Status for a session that may not exist yet (a page whose
// stream creates it may not have opened it yet): ok is false on a 404.
func (d *Daemon) StatusIfAny(session string) (st Status, ok bool) {
	d.t.Helper()
	a := d.Do(http.MethodGet, "/session/"+session, "", nil)
	if a.Status == http.StatusNotFound {
		return Status{}, false
	}
	if a.Status != http.StatusOK {
		d.t.Fatalf("GET /session/%s: %d %s", session, a.Status, a.Raw)
	}
	if err := json.Unmarshal(a.Raw, &st); err != nil {
		d.t.Fatalf("GET /session/%s: %q: %v", session, a.Raw, err)
	}
	return st, true
}

// Publish posts one "note" event (a type the viewer listens for) and
// returns its id.
func (d *Daemon) Publish(session string, n int) uint64 {
	d.t.Helper()
	var res struct {
		ID uint64 `json:"id"`
	}
	body := fmt.Sprintf(`{"type":"note","data":{"n":%d},"originatorClientId":"e2e"}`, n)
	d.Call(http.MethodPost, "/session/"+session+"/events", body, http.StatusOK, &res)
	return res.ID
}

// FreeAddr returns a loopback address nothing listens on, for a daemon
// that must come back on the same one after a restart.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln := listen(t, "127.0.0.1:0")
	defer ln.Close()
	return ln.Addr().String()
}

// WaitUntil polls cond every 20 ms until it is true or timeout passes.
func WaitUntil(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; last state: %s", timeout, what, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// IDs returns from, from+1, ..., to: the ids a client must have seen.
func IDs(from, to uint64) []uint64 {
	var ids []uint64
	for i := from; i <= to; i++ {
		ids = append(ids, i)
	}
	return ids
}
