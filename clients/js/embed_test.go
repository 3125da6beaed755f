package js_test

import (
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	js "github.com/ssebus/eventbus/clients/js"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestEmbedsWhatThePackagePublishes: the embedded files are exactly the
// files package.json publishes (but the README), byte for byte, and every
// module they import is one of them. A module added to the npm package but
// not to the go:embed line fails here.
func TestEmbedsWhatThePackagePublishes(t *testing.T) {
	raw, err := os.ReadFile("package.json")
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct {
		Files []string `json:"files"`
	}
	if err := json.Unmarshal(raw, &pkg); err != nil {
		t.Fatal(err)
	}
	var published []string
	for _, f := range pkg.Files {
		if f != "README.md" {
			published = append(published, f)
		}
	}
	var embedded []string
	if err := fs.WalkDir(js.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			embedded = append(embedded, p)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(published)
	slices.Sort(embedded)
	if !slices.Equal(published, embedded) {
		t.Fatalf("embedded %v, package.json publishes %v", embedded, published)
	}
	imports := regexp.MustCompile(`(?m)^\s*(?:import|export)\b[^;]*?\bfrom\s+"(\./[^"]+)"`)
	for _, name := range embedded {
		got, err := fs.ReadFile(js.FS(), name)
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("%s: the embedded copy differs from the file", name)
		}
		if !strings.HasSuffix(name, ".js") {
			continue
		}
		for _, m := range imports.FindAllStringSubmatch(string(got), -1) {
			if !slices.Contains(embedded, strings.TrimPrefix(m[1], "./")) {
				t.Errorf("%s imports %s, which is not embedded", name, m[1])
			}
		}
	}
}

func TestHandler(t *testing.T) {
	srv := httptest.NewServer(http.StripPrefix("/static/eventbus-client", js.Handler()))
	defer srv.Close()
	get := func(method, path string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	want, _ := os.ReadFile("client.js")
	resp, body := get(http.MethodGet, "/static/eventbus-client/client.js")
	if resp.StatusCode != 200 || body != string(want) ||
		resp.Header.Get("Content-Type") != "text/javascript; charset=utf-8" ||
		resp.Header.Get("Cache-Control") != "no-cache" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("GET client.js: %d %v, %d bytes", resp.StatusCode, resp.Header, len(body))
	}
	if resp, body := get(http.MethodHead, "/static/eventbus-client/index.js"); resp.StatusCode != 200 || body != "" {
		t.Fatalf("HEAD index.js: %d %q", resp.StatusCode, body)
	}
	for _, p := range []string{"/static/eventbus-client/", "/static/eventbus-client/embed.go", "/static/eventbus-client/package.json",
		"/static/eventbus-client/test/helpers.js", "/static/eventbus-client/nope.js"} {
		if resp, _ := get(http.MethodGet, p); resp.StatusCode != 404 {
			t.Errorf("GET %s: %d, want 404", p, resp.StatusCode)
		}
	}
	if resp, _ := get(http.MethodPost, "/static/eventbus-client/index.js"); resp.StatusCode != 405 || resp.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST: %d %v", resp.StatusCode, resp.Header)
	}
}
