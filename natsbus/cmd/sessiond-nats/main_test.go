package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/ssebus/eventbus/backplane/backplanetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const wait = 10 * time.Second

// startNATS runs a JetStream server embedded in the test binary on a free
// loopback port until the test ends, and returns it and its URL.
func startNATS(t *testing.T) (*server.Server, string) {
	// Registered first, so it runs last: after the streams and daemons.
	t.Cleanup(http.DefaultClient.CloseIdleConnections)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(wait) {
		t.Fatal("nats-server did not start")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s, "nats://127.0.0.1:" + strconv.Itoa(port)
}

// daemon runs one replica until the test ends and returns its base URL.
func daemon(t *testing.T, url, name string, extra ...string) string {
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan string, 1)
	errc := make(chan error, 1)
	args := append([]string{"-addr", "127.0.0.1:0", "-nats", url, "-name", name, "-stream", "D"}, extra...)
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
	case <-time.After(wait):
		t.Fatalf("%s did not start", name)
	}
	return ""
}

// post sends a JSON POST with optional headers and returns the status,
// the decoded body and the response headers.
func post(t *testing.T, url, body string, header map[string]string) (int, map[string]any, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]any
	json.NewDecoder(resp.Body).Decode(&v)
	return resp.StatusCode, v, resp.Header
}

func publish(t *testing.T, url, body string) map[string]any {
	t.Helper()
	code, v, _ := post(t, url, body, nil)
	if code != 200 {
		t.Fatalf("POST %s: %d %v", url, code, v)
	}
	return v
}

func TestRunFlags(t *testing.T) {
	var out strings.Builder
	if err := run(context.Background(), []string{"-h"}, &out, nil); err == nil || !strings.Contains(out.String(), "-nats") ||
		!strings.Contains(out.String(), "sessiond-nats") || !strings.Contains(out.String(), "-outage-timeout") {
		t.Fatalf("-h: %v\n%s", err, out.String())
	}
	if err := run(context.Background(), []string{"-overflow", "drop"}, io.Discard, nil); err == nil {
		t.Fatal("-overflow drop was accepted")
	}
}

// The README's two-daemon demo: publish on A, resume on B, a signal, the
// status, and DELETE ending B's stream.
func TestTwoReplicas(t *testing.T) {
	_, url := startNATS(t)
	a, b := daemon(t, url, "A"), daemon(t, url, "B")
	var epoch string
	for i := 1; i <= 3; i++ {
		v := publish(t, a+"/session/s1/events", `{"type":"note","data":{"n":`+strconv.Itoa(i)+`}}`)
		if v["id"] != float64(i) {
			t.Fatalf("publish %d: %v", i, v)
		}
		epoch = v["epoch"].(string)
	}
	s := backplanetest.Open(t, http.DefaultClient, b+"/session/s1/events", map[string]string{"Last-Event-ID": "1", "Event-Epoch": epoch})
	if s.Epoch != epoch {
		t.Fatalf("B's epoch %q, A's %q", s.Epoch, epoch)
	}
	backplanetest.WantIDs(t, s.Events(2, wait), 2, 3)
	if f := s.Next(wait); f.Event != "replay_complete" {
		t.Fatalf("want replay_complete, got %+v", f)
	}
	publish(t, b+"/session/s1/events", `{"type":"note"}`)
	backplanetest.WantIDs(t, s.Events(1, wait), 4, 4)
	if code, v, _ := post(t, a+"/session/s1/signal", `{"type":"doc.changed","about":"doc/1"}`, nil); code != http.StatusNoContent {
		t.Fatalf("signal: %d %v", code, v)
	}
	if f := s.Next(wait); f.Event != "doc.changed" || f.Str(t, "about") != "doc/1" {
		t.Fatalf("want the signal, got %+v", f)
	}
	st, err := http.Get(a + "/session/s1")
	if err != nil {
		t.Fatal(err)
	}
	var info map[string]any
	json.NewDecoder(st.Body).Decode(&info)
	st.Body.Close()
	if info["lastEventId"] != float64(4) || info["firstEventId"] != float64(1) || info["epoch"] != epoch || info["replica"] != "A" {
		t.Fatalf("status on A: %v", info)
	}
	if st, err = http.Get(a + "/session/nothing"); err != nil {
		t.Fatal(err)
	}
	st.Body.Close()
	if st.StatusCode != 404 {
		t.Fatalf("status of an unknown session: %s", st.Status)
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
	if rest := s.Ended(wait); len(rest) != 0 {
		t.Fatalf("frames after DELETE: %+v", rest)
	}
	if v := publish(t, b+"/session/s1/events", `{"type":"note"}`); v["id"] != float64(1) || v["epoch"] == epoch {
		t.Fatalf("publish after DELETE: %v", v)
	}
}

// The Idempotency-Key header: a retry answers the first id with
// "duplicate":true on any replica, another event under the key is 422, a
// malformed key is 400.
func TestIdempotencyKeyHeader(t *testing.T) {
	_, url := startNATS(t)
	a, b := daemon(t, url, "A"), daemon(t, url, "B")
	key := map[string]string{"Idempotency-Key": "order-17"}
	code, v, _ := post(t, a+"/session/s/events", `{"type":"order","data":{"n":17}}`, key)
	if code != 200 || v["id"] != float64(1) || v["duplicate"] != nil {
		t.Fatalf("first: %d %v", code, v)
	}
	code, v, _ = post(t, b+"/session/s/events", `{"type":"order","data":{ "n" : 17 }}`, key)
	if code != 200 || v["id"] != float64(1) || v["duplicate"] != true {
		t.Fatalf("retry: %d %v", code, v)
	}
	code, v, _ = post(t, b+"/session/s/events", `{"type":"order","data":{"n":18}}`, key)
	if code != http.StatusUnprocessableEntity || v["code"] != "idempotency_key_reused" {
		t.Fatalf("key reused: %d %v", code, v)
	}
	for _, k := range []string{"", "caf\u00e9", strings.Repeat("k", 256)} {
		code, v, _ = post(t, a+"/session/s/events", `{"type":"order"}`, map[string]string{"Idempotency-Key": k})
		if code != http.StatusBadRequest || v["code"] != "invalid_idempotency_key" {
			t.Fatalf("key %q: %d %v", k, code, v)
		}
	}
	if v := publish(t, a+"/session/s/events", `{"type":"order"}`); v["id"] != float64(2) {
		t.Fatalf("next publish: %v", v)
	}
}

// NATS down: a publish is 503 unavailable (nothing appended) with
// Retry-After, a new stream 503 too.
func TestNATSDown(t *testing.T) {
	s, url := startNATS(t)
	a := daemon(t, url, "A", "-publish-timeout", "300ms")
	publish(t, a+"/session/s/events", `{"type":"e"}`)
	s.Shutdown()
	s.WaitForShutdown()
	deadline := time.Now().Add(wait)
	for {
		code, v, h := post(t, a+"/session/s/events", `{"type":"e"}`, nil)
		if code == 503 && v["code"] == "unavailable" && h.Get("Retry-After") != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("publish with NATS down: %d %v", code, v)
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, err := http.Get(a + "/session/other/events")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a new stream with NATS down: %s %v", resp.Status, resp.Header)
	}
}
