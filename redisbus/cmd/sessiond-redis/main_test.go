package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startRedis runs a redis-server without persistence on a free loopback
// port until the test ends (skipped without one, unless CI=true).
func startRedis(t *testing.T) string {
	addr, _ := startRedisProcess(t)
	return addr
}

// startRedisProcess is startRedis, also returning the process (to pause it
// with SIGSTOP, or kill it).
func startRedisProcess(t *testing.T) (string, *os.Process) {
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
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGCONT); cmd.Process.Kill(); <-done })
	addr := "127.0.0.1:" + port
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr, cmd.Process
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
	lines, resp := streamLines(t, b+"/session/s1/events", http.Header{"Last-Event-Id": {"1"}, "Event-Epoch": {epoch}}, "id: ", "event: ")
	if resp.Header.Get("Event-Epoch") != epoch {
		t.Fatalf("B's epoch %q, A's %q", resp.Header.Get("Event-Epoch"), epoch)
	}
	expect := func(want ...string) {
		t.Helper()
		expectLines(t, lines, want...)
	}
	expect("id: "+epoch+":2", "event: note", "id: "+epoch+":3", "event: note", "event: replay_complete") // -epoch-ids is on
	post(t, b+"/session/s1/events", `{"type":"note"}`)
	expect("id: "+epoch+":4", "event: note")
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

// postKey is POST with an Idempotency-Key; it returns the status, the
// Retry-After header and the decoded body.
func postKey(t *testing.T, url, key, body string) (int, string, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]any
	json.NewDecoder(resp.Body).Decode(&v)
	return resp.StatusCode, resp.Header.Get("Retry-After"), v
}

// The demo POST with Idempotency-Key, end to end: a duplicate is 200 with
// the first id and "duplicate":true, the key with another event 422, an
// invalid key 400; a publish to a hung Redis is 503 publish_outcome_unknown,
// and its retry with the same key finds it appended once; with Redis down
// a publish and a new stream are 503, with Retry-After.
func TestIdempotentPublish(t *testing.T) {
	r, proc := startRedisProcess(t)
	a := daemon(t, r, "A", "-publish-timeout", "300ms")
	defer http.DefaultClient.CloseIdleConnections()
	url := a + "/session/s/events"
	body := `{"type":"order","data":{"n":1}}`
	st, _, v := postKey(t, url, "k1", body)
	if st != 200 || v["id"] != float64(1) || v["duplicate"] != nil {
		t.Fatalf("first: %d %v", st, v)
	}
	epoch := v["epoch"]
	if st, _, v = postKey(t, url, "k1", body); st != 200 || v["id"] != float64(1) || v["duplicate"] != true || v["epoch"] != epoch {
		t.Fatalf("duplicate: %d %v", st, v)
	}
	if st, _, v = postKey(t, url, "k1", `{"type":"order","data":{"n":2}}`); st != 422 || v["code"] != "idempotency_key_reused" {
		t.Fatalf("reused: %d %v", st, v)
	}
	if st, _, v = postKey(t, url, strings.Repeat("k", 256), body); st != 400 || v["code"] != "invalid_idempotency_key" {
		t.Fatalf("invalid key: %d %v", st, v)
	}

	proc.Signal(syscall.SIGSTOP)
	st, retryAfter, v := postKey(t, url, "k2", body)
	proc.Signal(syscall.SIGCONT)
	msg, _ := v["error"].(string)
	if st != 503 || v["code"] != "publish_outcome_unknown" || retryAfter == "" ||
		!strings.Contains(msg, "may or may not") || !strings.Contains(msg, "same Idempotency-Key") {
		t.Fatalf("publish to a hung Redis: %d Retry-After %q %v", st, retryAfter, v)
	}
	lastID := func() float64 {
		resp, err := http.Get(a + "/session/s")
		if err != nil {
			return -1
		}
		defer resp.Body.Close()
		var info map[string]any
		json.NewDecoder(resp.Body).Decode(&info)
		id, _ := info["lastEventId"].(float64)
		return id
	}
	for deadline := time.Now().Add(10 * time.Second); lastID() != 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the timed-out publish was not applied: last id %v", lastID())
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if st, _, v = postKey(t, url, "k2", body); st == 200 || time.Now().After(deadline) {
			break
		}
	}
	if st != 200 || v["id"] != float64(2) || v["duplicate"] != true {
		t.Fatalf("retry after the timeout: %d %v", st, v)
	}
	if id := lastID(); id != 2 {
		t.Fatalf("last id %v after the retry, want 2", id)
	}

	proc.Kill()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c, err := net.Dial("tcp", r)
		if err != nil {
			break // Redis is gone
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("redis-server still accepts connections after SIGKILL")
		}
	}
	// Unavailable when the refusal is known within the publish timeout;
	// here go-redis's dial retries (5 × 100 ms) outlast it, and a publish
	// that timed out while dialing cannot be told from one that was sent:
	// outcome unknown, the safe answer.
	st, retryAfter, v = postKey(t, url, "k3", body)
	if code := v["code"]; st != 503 || retryAfter == "" || (code != "unavailable" && code != "publish_outcome_unknown") {
		t.Fatalf("publish with Redis down: %d Retry-After %q %v", st, retryAfter, v)
	}
	resp, err := http.Get(a + "/session/other/events")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("new stream with Redis down: %s, Retry-After %q", resp.Status, resp.Header.Get("Retry-After"))
	}
}

// streamLines opens url with hdr and sends its lines that start with one of
// prefixes (default: id:, event: and data:) on the returned channel until
// the stream ends (then the channel closes).
func streamLines(t *testing.T, url string, hdr http.Header, prefixes ...string) (<-chan string, *http.Response) {
	if len(prefixes) == 0 {
		prefixes = []string{"id: ", "event: ", "data: "}
	}
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			l := sc.Text()
			if slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(l, p) }) {
				lines <- l
			}
		}
	}()
	return lines, resp
}

func expectLines(t *testing.T, lines <-chan string, want ...string) {
	t.Helper()
	for _, w := range want {
		select {
		case l := <-lines:
			if l != w && !(strings.HasSuffix(w, "*") && strings.HasPrefix(l, strings.TrimSuffix(w, "*"))) {
				t.Fatalf("got %q, want %q", l, w)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("timed out waiting for %q", w)
		}
	}
}

// Epoch ids (on by default in the demo daemons) through the backplane:
// the mirrors of every replica carry the session's shared epoch, so an id
// a browser got from A resumes on B, and after a DELETE (a new epoch in
// Redis) the same id is an epoch_reset, never a join of two epochs.
func TestEpochIDsAcrossReplicas(t *testing.T) {
	r := startRedis(t)
	a, b := daemon(t, r, "A"), daemon(t, r, "B")
	defer http.DefaultClient.CloseIdleConnections()
	var epoch string
	for i := 1; i <= 3; i++ {
		epoch = post(t, a+"/session/s1/events", `{"type":"note","data":{"n":`+strconv.Itoa(i)+`}}`)["epoch"].(string)
	}
	lines, _ := streamLines(t, a+"/session/s1/events?lastEventId=0", nil)
	expectLines(t, lines, "id: "+epoch+":1", "event: note", `data: {"id":1,*`)

	// What a browser's EventSource sends back by itself, to the other replica.
	lines, _ = streamLines(t, b+"/session/s1/events", http.Header{"Last-Event-Id": {epoch + ":1"}})
	expectLines(t, lines, "id: "+epoch+":2", "event: note", `data: {"id":2,*`, "id: "+epoch+":3", "event: note", "data: *",
		"event: replay_complete", `data: {"v":1,"type":"replay_complete","data":{"replayedCount":2,"lastReplayedEventId":3,"lastEventId":3,"epoch":"`+epoch+`"}*`)
	post(t, a+"/session/s1/events", `{"type":"note"}`)
	expectLines(t, lines, "id: "+epoch+":4", "event: note", `data: {"id":4,*`)

	del, _ := http.NewRequest("DELETE", a+"/session/s1", nil)
	dr, err := http.DefaultClient.Do(del)
	if err != nil {
		t.Fatal(err)
	}
	dr.Body.Close()
	var next string
	for i := 1; i <= 5; i++ { // the new epoch is already past the old cursor
		next = post(t, b+"/session/s1/events", `{"type":"note"}`)["epoch"].(string)
	}
	if next == epoch {
		t.Fatal("DELETE kept the epoch")
	}
	for _, replica := range []string{a, b} {
		lines, _ = streamLines(t, replica+"/session/s1/events", http.Header{"Last-Event-Id": {epoch + ":4"}})
		expectLines(t, lines, "event: state_resync_required",
			`data: {"v":1,"type":"state_resync_required","data":{"reason":"epoch_reset","detail":"epoch_mismatch","lastDeliveredId":4,"earliestAvailableId":1,"epoch":"`+next+`"}*`,
			"id: "+next+":1", "event: note")
	}
}

// The routes answer JSON errors, and /disconnect?mode=abort resets the
// connections of this replica's streams.
func TestDisconnectModesAndJSONErrors(t *testing.T) {
	r := startRedis(t)
	a := daemon(t, r, "A")
	defer http.DefaultClient.CloseIdleConnections()
	post(t, a+"/session/s2/events", `{"type":"note"}`)
	lines, resp := streamLines(t, a+"/session/s2/events", nil)
	res := post(t, a+"/session/s2/disconnect?mode=abort", "")
	if res["disconnected"] != float64(1) || res["mode"] != "abort" {
		t.Fatalf("abort: %v", res)
	}
	for range lines {
	}
	if _, err := resp.Body.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("after the abort: %v, want a connection reset", err)
	}
	for _, c := range []struct{ method, path, code string }{
		{"PUT", "/session/s2/events", "method_not_allowed"},
		{"GET", "/session/s2/signal", "method_not_allowed"},
		{"GET", "/nope", "not_found"},
		{"POST", "/session/s2/disconnect?mode=x", "invalid_mode"},
	} {
		req, _ := http.NewRequest(c.method, a+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		if v["code"] != c.code || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: %s %v", c.method, c.path, resp.Status, v)
		}
	}
}

// -auth-token on two replicas: no credentials, no stream (and no session
// in Redis); the login cookie of one replica is accepted by the other
// (it is signed with the shared token, not stored); a logout on a replica
// ends its streams of the subject with stream_error revoked.
func TestAuthTokenAcrossReplicas(t *testing.T) {
	r := startRedis(t)
	flags := []string{"-auth-token", "rtok", "-token-lifetime", "1m"}
	a, b := daemon(t, r, "A", flags...), daemon(t, r, "B", flags...)
	defer http.DefaultClient.CloseIdleConnections()
	send := func(method, url, body string, hdr http.Header) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		for k, vs := range hdr {
			req.Header[k] = vs
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp, string(out)
	}
	bearer := http.Header{"Authorization": {"Bearer rtok"}}

	resp, body := send("GET", a+"/session/auth/events", "", nil)
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") != `Bearer realm="sessiond-redis"` {
		t.Fatalf("anonymous stream: %s %v %s", resp.Status, resp.Header, body)
	}
	if resp, body := send("GET", a+"/session/auth", "", bearer); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("the anonymous stream made a session: %s %s", resp.Status, body)
	}
	resp, body = send("POST", a+"/login", `{"token":"rtok","subject":"alice"}`, nil)
	if resp.StatusCode != 200 || len(resp.Cookies()) != 1 {
		t.Fatalf("login on A: %s %s", resp.Status, body)
	}
	cookie := http.Header{"Cookie": {resp.Cookies()[0].Name + "=" + resp.Cookies()[0].Value}}
	if resp, body := send("POST", b+"/session/auth/events", `{"type":"a"}`, cookie); resp.StatusCode != 200 {
		t.Fatalf("publish on B with A's cookie: %s %s", resp.Status, body)
	}
	lines, _ := streamLines(t, b+"/session/auth/events", http.Header{"Cookie": cookie["Cookie"], "Last-Event-Id": {"0"}}, "event: ")
	expectLines(t, lines, "event: a", "event: replay_complete")
	resp, body = send("POST", b+"/logout", "", cookie)
	if resp.StatusCode != 200 || !strings.Contains(body, `"revoked":1`) {
		t.Fatalf("logout on B: %s %s", resp.Status, body)
	}
	expectLines(t, lines, "event: stream_error")
}
