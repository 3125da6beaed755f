package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a small repository laid out like this one: a root module
// example.com/lib, a published sub-module sub that imports the root and
// one of its internal packages, with a command, and an unpublished
// harness module. It needs no third-party module and no network.
var fixture = map[string]string{
	".gitignore": "node_modules/\n",
	"go.mod":     "module example.com/lib\n\ngo 1.25\n",
	"lib.go": `// Package lib is a fixture.
package lib

// Hello greets.
func Hello() string { return "hello" }
`,
	"internal/shared/shared.go": `// Package shared is what sub imports across the module boundary.
package shared

// Shared is a number.
func Shared() int { return 1 }
`,
	"internal/private/private.go": `// Package private is imported by the root module only.
package private

// Private is a number.
func Private() int { return 2 }
`,
	"node_modules/ignored.js": "ignored by git, so not released\n",
	"sub/go.mod": `module example.com/lib/sub

go 1.25

require example.com/lib v0.1.0

replace example.com/lib => ../
`,
	"sub/sub.go": `// Package sub is a fixture.
package sub

import (
	"example.com/lib"
	"example.com/lib/internal/shared"
)

// Greet returns the root's greeting and the shared number.
func Greet() (string, int) { return lib.Hello(), shared.Shared() }
`,
	"sub/cmd/subcmd/main.go": `package main

import "example.com/lib/sub"

func main() { println(sub.Greet()) }
`,
	"harness/go.mod": `module example.com/lib/harness

go 1.25

require example.com/lib v0.1.0

replace example.com/lib => ../
`,
	"harness/harness.go": `package harness

import _ "example.com/lib"
`,
}

// newFixture writes the fixture, with edits (a file set to "" is
// removed), into a new git repository and returns its folder and a
// config for it whose output goes to out.
func newFixture(t *testing.T, edits map[string]string, out *bytes.Buffer) (string, config) {
	t.Helper()
	dir := t.TempDir()
	files := make(map[string]string)
	for name, data := range fixture {
		files[name] = data
	}
	for name, data := range edits {
		files[name] = data
	}
	for name, data := range files {
		if data == "" {
			continue
		}
		writeFile(t, filepath.Join(dir, filepath.FromSlash(name)), data)
	}
	git(t, dir, "init", "-q")
	toolDir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return dir, config{
		Repo:          dir,
		Unpublished:   []string{"harness"},
		ToolDir:       toolDir,
		Baseline:      filepath.Join(dir, "api"),
		Out:           out,
		FallbackProxy: "off", // the fixture's modules are all local: no network
	}
}

func writeFile(t *testing.T, name, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func git(t *testing.T, dir string, args ...string) {
	t.Helper()
	env := []string{
		"GIT_AUTHOR_NAME=releasecheck", "GIT_AUTHOR_EMAIL=releasecheck@example.com",
		"GIT_COMMITTER_NAME=releasecheck", "GIT_COMMITTER_EMAIL=releasecheck@example.com",
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
	}
	if _, err := command(context.Background(), dir, env, "git", args...); err != nil {
		t.Fatal(err)
	}
}

// runFixture runs a command of the tool on the fixture.
func runFixture(t *testing.T, command string, cfg config) error {
	t.Helper()
	return run(t.Context(), command, cfg)
}
