package eventbus_test

import (
	"io/fs"
	"os"
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
	"ebprom":     "the prometheus module's: prometheus/docs_test.go checks it",
	"prometheus": "the prometheus module's: prometheus/docs_test.go checks it",
	"promhttp":   "the prometheus module's: prometheus/docs_test.go checks it",
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
	if n := doccheck.Run(t, docPackages, otherModules, markdownFiles(t)...); n < 15 {
		t.Fatalf("checked %d blocks; the docs have more", n)
	}
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
