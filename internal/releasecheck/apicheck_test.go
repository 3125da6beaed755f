package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAPI cuts the fixture's baseline, then changes the working tree: an
// addition passes, a removal or a changed signature fails, in the root
// module, in the sub-module and in the internal package sub imports across
// the module boundary; a change to an internal package no other module
// imports passes.
func TestAPI(t *testing.T) {
	t.Parallel()
	type change struct{ file, from, to string }
	tests := []struct {
		name    string
		changes []change
		fails   string // "" when compatible
	}{
		{name: "unchanged"},
		{name: "addition", changes: []change{{"lib.go", "// Hello greets.", "// Bye says bye.\nfunc Bye() string { return \"bye\" }\n\n// Hello greets."}}},
		{name: "removal", changes: []change{
			{"lib.go", "func Hello() string", "func hello() string"},
			{"sub/sub.go", "lib.Hello()", `"hello"`},
			{"sub/sub.go", "\t\"example.com/lib\"\n", ""},
		}, fails: "example.com/lib: incompatible with the baseline api:\n\tHello: removed"},
		{name: "changed signature", changes: []change{
			{"sub/sub.go", "func Greet() (string, int)", "func Greet(n int) (string, int)"},
			{"sub/cmd/subcmd/main.go", "sub.Greet()", "sub.Greet(1)"},
		}, fails: "example.com/lib/sub: incompatible with the baseline api:\n\tGreet: changed from func() (string, int) to func(int) (string, int)"},
		{name: "cross-module internal", changes: []change{
			{"internal/shared/shared.go", "func Shared() int", "func Shared(n int) int"},
			{"sub/sub.go", "shared.Shared()", "shared.Shared(1)"},
		}, fails: "example.com/lib/internal/shared: incompatible"},
		{name: "private internal", changes: []change{{"internal/private/private.go", "func Private() int", "func Private(n int) int"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			dir, cfg := newFixture(t, nil, &out)
			if err := runFixture(t, "write-api", cfg); err != nil {
				t.Fatal(err)
			}
			for _, c := range tt.changes {
				edit(t, filepath.Join(dir, c.file), c.from, c.to)
			}
			err := runFixture(t, "api", cfg)
			switch {
			case tt.fails == "" && err != nil:
				t.Fatalf("%v\n%s", err, out.String())
			case tt.fails != "" && (err == nil || !strings.Contains(err.Error(), tt.fails)):
				t.Fatalf("error %v, want one with %q\n%s", err, tt.fails, out.String())
			}
			if tt.name == "addition" && !strings.Contains(out.String(), "add  example.com/lib: Bye: added") {
				t.Errorf("the addition is not listed:\n%s", out.String())
			}
		})
	}
}

// TestAPIAgainstTag: once a release is tagged, the check compares with the
// tree at the tag, not with the baseline (here there is none), and lets
// through the breaks semantic versioning allows.
func TestAPIAgainstTag(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	dir, cfg := newFixture(t, nil, &out)
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-q", "-m", "v0.1.0")
	git(t, dir, "tag", "v0.1.0")
	git(t, dir, "tag", "sub/v0.1.0")
	if err := runFixture(t, "api", cfg); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "compatible with release v0.1.0") {
		t.Errorf("output does not name the tag:\n%s", out.String())
	}
	edit(t, filepath.Join(dir, "lib.go"), "func Hello() string", "func Hello() []byte")
	edit(t, filepath.Join(dir, "lib.go"), `return "hello"`, `return []byte("hello")`)
	edit(t, filepath.Join(dir, "sub/sub.go"), "lib.Hello()", "string(lib.Hello())")
	err := runFixture(t, "api", cfg)
	if err == nil || !strings.Contains(err.Error(), "example.com/lib: incompatible with release v0.1.0:\n\tHello: changed from func() string to func() []byte") {
		t.Fatalf("error %v, want Hello's change against v0.1.0\n%s", err, out.String())
	}

	// A patch release may not break; a new minor of v0 may, and lists the
	// break.
	bump := func(v string) {
		for _, f := range []string{"sub/go.mod", "harness/go.mod"} {
			writeFile(t, filepath.Join(dir, f), strings.Replace(fixture[f], "example.com/lib v0.1.0", "example.com/lib "+v, 1))
		}
	}
	bump("v0.1.1")
	if err := runFixture(t, "api", cfg); err == nil {
		t.Fatalf("a break in the patch release v0.1.1 passed\n%s", out.String())
	}
	bump("v0.2.0")
	out.Reset()
	if err := runFixture(t, "api", cfg); err != nil {
		t.Fatalf("a break in v0.2.0, a new minor of v0: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "BREAK example.com/lib: Hello: changed from func() string to func() []byte (allowed: v0.2.0") {
		t.Errorf("the allowed break is not listed:\n%s", out.String())
	}
}

func edit(t *testing.T, name, from, to string) {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte(from)) {
		t.Fatalf("%s has no %q", name, from)
	}
	if err := os.WriteFile(name, bytes.Replace(data, []byte(from), []byte(to), 1), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestParseReport(t *testing.T) {
	t.Parallel()
	inc, com := parseReport([]byte("Incompatible changes:\n- A: removed\nCompatible changes:\n- B: added\n- C: added\n"))
	if len(inc) != 1 || inc[0] != "A: removed" || len(com) != 2 || com[1] != "C: added" {
		t.Errorf("incompatible %q, compatible %q", inc, com)
	}
	if inc, _ := parseReport([]byte("- X: something, no header\n")); len(inc) != 1 {
		t.Errorf("an unheaded change is not counted as a break: %q", inc)
	}
	if inc, com := parseReport(nil); inc != nil || com != nil {
		t.Errorf("an empty report: %q %q", inc, com)
	}
}
