package eventbus_test

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ssebus/eventbus/internal/doccheck"
)

// docPackages are the packages a Go block of this module's Markdown may
// use without importing them, by the name it uses: this module's and the
// standard library's.
var docPackages = map[string]string{
	"eventbus":      "github.com/ssebus/eventbus",
	"backplane":     "github.com/ssebus/eventbus/backplane",
	"backplanetest": "github.com/ssebus/eventbus/backplane/backplanetest",
	"sseclient":     "github.com/ssebus/eventbus/sseclient",
	"eventbusjs":    "github.com/ssebus/eventbus/clients/js",
	"daemontest":    "github.com/ssebus/eventbus/internal/daemontest",

	"context": "context",
	"errors":  "errors",
	"expvar":  "expvar",
	"flag":    "flag",
	"fmt":     "fmt",
	"http":    "net/http",
	"io":      "io",
	"json":    "encoding/json",
	"log":     "log",
	"os":      "os",
	"signal":  "os/signal",
	"slog":    "log/slog",
	"strings": "strings",
	"syscall": "syscall",
	"testing": "testing",
	"time":    "time",
}

// otherModules are the packages of the repository's other modules that a
// block of this module's Markdown may use: such a block cannot compile in
// this module (it needs that module's dependencies), so this test skips it
// and that module's docs test checks it.
var otherModules = map[string]string{
	"ebprom":     "prometheus/docs_test.go",
	"prometheus": "prometheus/docs_test.go",
	"promhttp":   "prometheus/docs_test.go",
}

// TestDocsCompile type-checks every ```go block of this module's Markdown
// (README.md, docs/, clients/js/README.md, ...; not the other modules'
// folders, whose docs tests check their READMEs) against the working
// tree's API, as package doccheck says: a block that is not a whole file
// is wrapped, its declarations at top level and its statements in a
// function body, and the packages it uses are imported. Only "declared
// and not used" and "imported and not used" are forgiven: a block must
// declare what it uses.
func TestDocsCompile(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go command")
	}
	files := markdownFiles(t)
	c, err := doccheck.NewChecker(".", docPackages)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, file := range files {
		blocks, err := doccheck.Blocks(file, file)
		if err != nil {
			t.Error(err)
			continue
		}
		for _, b := range blocks {
			if uses := c.Uses(b, otherModules); len(uses) > 0 {
				t.Logf("%s:%d: skipped: it uses %s, checked by %s", b.File, b.Line, strings.Join(uses, ", "), otherModules[uses[0]])
				continue
			}
			n++
			if err := c.Check(b); err != nil {
				t.Errorf("%s:%d: the block does not compile:\n%v", b.File, b.Line, err)
			}
		}
	}
	if n < 10 {
		t.Fatalf("checked %d blocks; the docs have more", n)
	}
	t.Logf("checked %d blocks of %d files", n, len(files))
}

// markdownFiles returns the Markdown files of this module: every *.md
// under the repository but in folders of other modules (a go.mod of
// their own), node_modules, testdata and hidden folders.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != "." && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata") {
				return filepath.SkipDir
			}
			if path != "." {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if strings.HasSuffix(path, ".md") {
			files = append(files, filepath.ToSlash(path))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"README.md", "docs/SPEC.md", "clients/js/README.md"} {
		found := false
		for _, f := range files {
			found = found || f == want
		}
		if !found {
			t.Fatalf("%s is not among the Markdown files %v", want, files)
		}
	}
	return files
}
