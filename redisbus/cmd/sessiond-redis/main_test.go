package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startRedis runs a redis-server without persistence on a free loopback
// port until the test ends (skipped without one, unless CI=true).
func startRedis(t *testing.T) string {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server not found (CI=true): %v", err)
		}
		t.Skipf("redis-server not found: %v (apt-get install -y redis-server; CI=true makes this a failure)", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	addr := "127.0.0.1:" + port
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatal("redis-server did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// daemon runs one replica until the test ends and returns its base URL;
// flags are added to its command line.
func daemon(t *testing.T, redisAddr, name string, flags ...string) string {
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	args := append([]string{"-addr", "127.0.0.1:0", "-redis", redisAddr, "-name", name, "-prefix", "demo:" + t.Name() + ":"}, flags...)
	go func() {
		errc <- run(ctx, args, io.Discard, func(a string) { addrc <- a })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("%s: run: %v", name, err)
		}
	})
	select {
	case a := <-addrc:
		return "http://" + a
	case err := <-errc:
		t.Fatalf("%s: %v", name, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not start", name)
	}
	return ""
}

func post(t *testing.T, url, body string) map[string]any {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]any
	json.NewDecoder(resp.Body).Decode(&v)
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %s %v", url, resp.Status, v)
	}
	return v
}

func TestRunFlags(t *testing.T) {
	var out strings.Builder
	if err := run(context.Background(), []string{"-h"}, &out, nil); err == nil || !strings.Contains(out.String(), "-overflow policy") {
		t.Fatalf("-h: %v\n%s", err, out.String())
	}
	if err := run(context.Background(), []string{"-overflow", "drop"}, io.Discard, nil); err == nil {
		t.Fatal("-overflow drop was accepted")
	}
}

// The README's two-daemon demo: publish on A, resume on B.
func TestTwoReplicas(t *testing.T) {
	r := startRedis(t)
	// B serves its streams under the catch-up overflow policy (-overflow
	// is a shared daemon flag): nothing in this demo depends on it.
	a, b := daemon(t, r, "A"), daemon(t, r, "B", "-overflow", "catchup")
	defer http.DefaultClient.CloseIdleConnections()
	var epoch string
	for i := 1; i <= 3; i++ {
		v := post(t, a+"/session/s1/events", `{"type":"note","data":{"n":`+strconv.Itoa(i)+`}}`)
		if v["id"] != float64(i) {
			t.Fatalf("publish %d: %v", i, v)
		}
		epoch = v["epoch"].(string)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", b+"/session/s1/events", nil)
	req.Header.Set("Last-Event-ID", "1")
	req.Header.Set("Event-Epoch", epoch)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Event-Epoch") != epoch {
		t.Fatalf("B's epoch %q, A's %q", resp.Header.Get("Event-Epoch"), epoch)
	}
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "id: ") || strings.HasPrefix(l, "event: ") {
				lines <- l
			}
		}
	}()
	expect := func(want ...string) {
		t.Helper()
		for _, w := range want {
			select {
			case l := <-lines:
				if l != w {
					t.Fatalf("got %q, want %q", l, w)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("timed out waiting for %q", w)
			}
		}
	}
	expect("id: 2", "event: note", "id: 3", "event: note", "event: replay_complete")
	post(t, b+"/session/s1/events", `{"type":"note"}`)
	expect("id: 4", "event: note")
	sr, err := http.Post(a+"/session/s1/signal", "application/json", strings.NewReader(`{"type":"doc.changed","about":"doc/1"}`))
	if err != nil {
		t.Fatal(err)
	}
	sr.Body.Close()
	if sr.StatusCode != http.StatusNoContent {
		t.Fatalf("signal: %s", sr.Status)
	}
	expect("event: doc.changed")

	st, err := http.Get(a + "/session/s1")
	if err != nil {
		t.Fatal(err)
	}
	var info map[string]any
	json.NewDecoder(st.Body).Decode(&info)
	st.Body.Close()
	if info["lastEventId"] != float64(4) || info["epoch"] != epoch {
		t.Fatalf("status on A: %v", info)
	}
	del, _ := http.NewRequest("DELETE", a+"/session/s1", nil)
	dr, err := http.DefaultClient.Do(del)
	if err != nil {
		t.Fatal(err)
	}
	dr.Body.Close()
	if dr.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE: %s", dr.Status)
	}
	// B notices the deleted session (within its ReadBlock) and ends its
	// stream.
	select {
	case l, ok := <-lines:
		if ok {
			t.Fatalf("frame after DELETE: %q", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("B's stream did not end after DELETE")
	}
}
