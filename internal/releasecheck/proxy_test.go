package main

import (
	"archive/zip"
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestProxyLayout checks the files a file:// GOPROXY reads, and that a
// module's zip holds its working tree less nested modules and what git
// ignores.
func TestProxyLayout(t *testing.T) {
	t.Parallel()
	dir, cfg := newFixture(t, nil, new(bytes.Buffer))
	r, err := loadRepo(t.Context(), dir, cfg.Unpublished)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	url, err := writeProxy(r, "v0.1.0", out)
	if err != nil {
		t.Fatal(err)
	}
	if want := "file://" + filepath.ToSlash(out); url != want {
		t.Errorf("url %s, want %s", url, want)
	}
	for _, f := range []string{"example.com/lib/@v/list", "example.com/lib/@v/v0.1.0.info", "example.com/lib/@v/v0.1.0.mod", "example.com/lib/sub/@v/v0.1.0.zip"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "example.com/lib/harness")); err == nil {
		t.Error("the unpublished harness module is served")
	}
	mod, err := os.ReadFile(filepath.Join(out, "example.com/lib/sub/@v/v0.1.0.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if string(mod) != fixture["sub/go.mod"] {
		t.Errorf("sub's .mod is\n%s\nwant its go.mod as it is (replace and all: it applies to no user)", mod)
	}
	zr, err := zip.OpenReader(filepath.Join(out, "example.com/lib/@v/v0.1.0.zip"))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	var names []string
	for _, f := range zr.File {
		names = append(names, strings.TrimPrefix(f.Name, "example.com/lib@v0.1.0/"))
	}
	want := []string{".gitignore", "go.mod", "internal/private/private.go", "internal/shared/shared.go", "lib.go"}
	slices.Sort(names)
	if !slices.Equal(names, want) {
		t.Errorf("root zip holds %q, want %q", names, want)
	}
}
