package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/sseclient"
)

// readmeProgram returns the Go code of a README section: the first ```go
// block after the heading "## "+heading.
func readmeProgram(t *testing.T, root, heading string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no %q section", "## "+heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	_, code, ok := strings.Cut(section, "\n```go\n")
	if !ok {
		t.Fatal("the section has no ```go block")
	}
	code, _, ok = strings.Cut(code, "\n```\n")
	if !ok || !strings.HasPrefix(code, "package main\n") {
		t.Fatalf("the section's first go block is not a whole program:\n%s", code)
	}
	return code + "\n"
}

// completeDaemon is the README's complete daemon: the program in
// examples/daemon, which the README links.
const completeDaemon = "examples/daemon/main.go"

// exampleProgram returns the Go code of the README's complete daemon, after
// checking that the README still links to it.
func exampleProgram(t *testing.T, root string) string {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "("+completeDaemon+")") {
		t.Fatalf("README.md does not link %s", completeDaemon)
	}
	b, err := os.ReadFile(filepath.Join(root, completeDaemon))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestREADMEDaemon builds each of the README's daemons (the one of "In
// twenty lines", exactly as the README has it, and the complete one the
// README links, examples/daemon), in a module of their own that uses this
// repository, runs each on a free port, publishes an event and reads it
// back from the stream, checks that a GET of an unknown session is a 404
// and an invalid event a JSON 400 invalid_event, and (the short one) that
// a DELETE is 204. The complete one is stopped with SIGTERM with a stream open and must
// exit 0; the short one, which has no shutdown, is killed.
func TestREADMEDaemon(t *testing.T) {
	for _, c := range []struct {
		name     string
		program  func(t *testing.T, root string) string
		graceful bool
	}{
		{"In_twenty_lines", func(t *testing.T, root string) string {
			code := readmeProgram(t, root, "In twenty lines")
			// About twenty lines: main's body, and the whole program
			// within 30 (issue 33: it was 42).
			if n := strings.Count(code, "\n"); n > 30 {
				t.Fatalf("the README's twenty-line daemon has %d lines", n)
			}
			return code
		}, false},
		{"A_complete_daemon", exampleProgram, true},
	} {
		t.Run(c.name, func(t *testing.T) { testREADMEDaemon(t, c.program, c.graceful) })
	}
}

func testREADMEDaemon(t *testing.T, program func(t *testing.T, root string) string, graceful bool) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("needs the go command")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := fmt.Sprintf("module example.com/readmedaemon\n\ngo 1.25\n\nrequire github.com/ssebus/eventbus v0.0.0\n\nreplace github.com/ssebus/eventbus => %s\n", root)
	for name, text := range map[string]string{"go.mod": gomod, "main.go": program(t, root)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin := filepath.Join(dir, "daemon")
	build := exec.CommandContext(ctx, goBin, "build", "-o", bin, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of the README's daemon: %v\n%s", err, out)
	}
	vet := exec.CommandContext(ctx, goBin, "vet", ".")
	vet.Dir, vet.Env = dir, build.Env
	if out, err := vet.CombinedOutput(); err != nil {
		t.Fatalf("go vet of the README's daemon: %v\n%s", err, out)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var logs strings.Builder
	// start runs the daemon on addr; the process is killed at the end of
	// the test if it is still running. exited gets Wait's answer.
	start := func() (cmd *exec.Cmd, exited chan error) {
		cmd = exec.Command(bin, "-addr", addr)
		cmd.Stderr = &logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited = make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		t.Cleanup(func() {
			if cmd.ProcessState == nil {
				cmd.Process.Kill()
				<-exited
			}
		})
		return cmd, exited
	}
	cmd, exited := start()
	base := "http://" + addr
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	// firstPublish posts until the daemon answers (it is starting).
	firstPublish := func(event string) *http.Response {
		t.Helper()
		var resp *http.Response
		var err error
		for deadline := time.Now().Add(20 * time.Second); ; {
			resp, err = client.Post(base+"/session/s1/events", "application/json", strings.NewReader(event))
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("the README's daemon does not answer: %v\n%s", err, logs.String())
		}
		return resp
	}
	resp := firstPublish(`{"type":"note","data":{"text":"hi"}}`)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var published struct {
		ID    uint64 `json:"id"`
		Epoch string `json:"epoch"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &published) != nil || published.ID != 1 ||
		!regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(published.Epoch) {
		t.Fatalf("publish: %d %s, want 200 {\"id\":1,\"epoch\":...}", resp.StatusCode, body)
	}
	// The error table (docs/SPEC.md 6.9): a bad event is 400 invalid_event,
	// as JSON.
	resp, err = client.Post(base+"/session/s1/events", "application/json", strings.NewReader(`{"type":""}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), `"code":"invalid_event"`) {
		t.Fatalf("publish of an invalid event: %d %s, want 400 invalid_event", resp.StatusCode, body)
	}

	if resp, err := client.Get(base + "/session/nobody/events"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET of an unknown session: %v %v, want 404", resp, err)
	} else {
		resp.Body.Close()
	}

	req, _ := http.NewRequest(http.MethodGet, base+"/session/s1/events", nil)
	req.Header.Set("Last-Event-ID", "0")
	stream, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if stream.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d", stream.StatusCode)
	}
	p := sseclient.NewParser(stream.Body)
	m, err := p.Next()
	for err == nil && m.Kind != sseclient.KindEvent { // the retry field, a heartbeat
		m, err = p.Next()
	}
	if _, id, ok := eventbus.ParseEventID(m.ID); err != nil || !ok || id != 1 || !strings.Contains(m.ID, ":") || m.Type != "note" || !strings.Contains(string(m.Data), `"data":{"text":"hi"}`) {
		t.Fatalf("the stream's first event: %+v, %v", m, err)
	}

	if !graceful {
		// A restart behind a plain client that sets nothing (issue 33: the
		// safe default): the client read through id 3 of the first run,
		// the daemon is killed and starts again, the session's new run
		// publishes 6 events. The resume with the last id the client saw
		// must say state_resync_required epoch_reset, not skip ids 1-3 of
		// the new run as if they were the ones already seen.
		for _, text := range []string{"two", "three"} {
			resp, err := client.Post(base+"/session/s1/events", "application/json", strings.NewReader(`{"type":"note","data":{"text":"`+text+`"}}`))
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("publish: %v %v", resp, err)
			}
			resp.Body.Close()
		}
		var last string
		for last == "" || !strings.HasSuffix(last, ":3") {
			if m, err = p.Next(); err != nil {
				t.Fatalf("reading events 2 and 3: %v", err)
			}
			if m.Kind == sseclient.KindEvent {
				last = m.ID
			}
		}
		stream.Body.Close()
		client.CloseIdleConnections()
		cmd.Process.Kill()
		<-exited
		start() // the cleanup kills it
		resp := firstPublish(`{"type":"note","data":{"text":"after 1"}}`)
		resp.Body.Close()
		for i := 2; i <= 6; i++ {
			resp, err := client.Post(base+"/session/s1/events", "application/json", strings.NewReader(fmt.Sprintf(`{"type":"note","data":{"text":"after %d"}}`, i)))
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("publish after the restart: %v %v", resp, err)
			}
			resp.Body.Close()
		}
		req, _ := http.NewRequest(http.MethodGet, base+"/session/s1/events", nil)
		req.Header.Set("Last-Event-ID", last)
		stream, err := client.Do(req)
		if err != nil || stream.StatusCode != http.StatusOK {
			t.Fatalf("resume after the restart: %v %v", stream, err)
		}
		p := sseclient.NewParser(stream.Body)
		var got []string
		for len(got) < 8 {
			m, err := p.Next()
			if err != nil {
				t.Fatalf("resume after the restart: %v after %q", err, got)
			}
			if m.Kind != sseclient.KindEvent {
				continue
			}
			_, id, _ := eventbus.ParseEventID(m.ID)
			if m.Type == eventbus.TypeStateResyncRequired {
				if !strings.Contains(string(m.Data), `"reason":"epoch_reset"`) {
					t.Fatalf("the resume's resync: %s, want epoch_reset", m.Data)
				}
				got = append(got, m.Type)
				continue
			}
			got = append(got, fmt.Sprintf("%s#%d", m.Type, id))
		}
		stream.Body.Close()
		want := []string{eventbus.TypeStateResyncRequired, "note#1", "note#2", "note#3", "note#4", "note#5", "note#6", eventbus.TypeReplayComplete + "#0"}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("resume with %s after a restart:\n got %q\nwant %q", last, got, want)
		}

		// DELETE ends the session: 204, and its stream is gone.
		req, _ = http.NewRequest(http.MethodDelete, base+"/session/s1", nil)
		if resp, err := client.Do(req); err != nil || resp.StatusCode != http.StatusNoContent {
			t.Fatalf("DELETE: %v %v, want 204", resp, err)
		} else {
			resp.Body.Close()
		}
		if resp, err := client.Get(base + "/session/s1/events"); err != nil || resp.StatusCode != http.StatusNotFound {
			t.Fatalf("GET after DELETE: %v %v, want 404", resp, err)
		} else {
			resp.Body.Close()
		}
		return // the deferred kill ends it
	}
	// SIGTERM while the stream is open: the hub closes the bus, the stream
	// gets stream_error shutdown and ends (the order of docs/hub.md: the
	// hub's Shutdown beside the server's, not the server's Close cutting
	// it), the server shuts down, the process exits 0.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	streamEnded := make(chan string, 1)
	go func() {
		rest, _ := io.ReadAll(stream.Body)
		streamEnded <- string(rest)
	}()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the README's daemon exited with %v after SIGTERM\n%s", err, logs.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the README's daemon did not exit within 15s of SIGTERM")
	}
	if rest := <-streamEnded; !strings.Contains(rest, "event: stream_error\n") || !strings.Contains(rest, `"errorKind":"shutdown"`) {
		t.Fatalf("the stream ended without stream_error shutdown; it ended with:\n%s", rest)
	}
	stream.Body.Close()
}
