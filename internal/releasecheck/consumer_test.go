package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestModulesInstall: the fixture's modules, served at v0.1.0 from the
// file proxy, install and build in a module outside the repository.
func TestModulesInstall(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	_, cfg := newFixture(t, nil, &out)
	if err := runFixture(t, "modules", cfg); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	containsAll(t, "output", out.String(),
		"ok   go get example.com/lib@v0.1.0,",
		"ok   go get example.com/lib/sub@v0.1.0,",
		"ok   2 published modules at v0.1.0")
	if strings.Contains(out.String(), "harness") {
		t.Errorf("the unpublished harness was checked:\n%s", out.String())
	}
}

// TestModulesFailOnUnreleasedRequirement is the case this tool exists for:
// sub still requires the root at v0.0.0 (with the replace that hides it
// inside the repository). A user's go get of sub then fails, because no
// proxy has v0.0.0; so must the check, with the user's error and not only
// the requirement check's.
func TestModulesFailOnUnreleasedRequirement(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	_, cfg := newFixture(t, map[string]string{
		"sub/go.mod": strings.Replace(fixture["sub/go.mod"], "example.com/lib v0.1.0", "example.com/lib v0.0.0", 1),
	}, &out)
	cfg.Version = "v0.1.0"
	err := runFixture(t, "modules", cfg)
	if err == nil {
		t.Fatalf("no error:\n%s", out.String())
	}
	containsAll(t, "error", err.Error(),
		"sub/go.mod requires example.com/lib v0.0.0, want v0.1.0",
		"a user's go get example.com/lib/sub@v0.1.0:",
		"go get example.com/lib/sub@v0.1.0: exit status 1",
		"downloading example.com/lib v0.0.0")
	// The root alone still installs.
	containsAll(t, "output", out.String(), "ok   go get example.com/lib@v0.1.0,")
}

// TestModulesFailOnBrokenBuild: a module whose package does not compile
// at the release (sub uses a root function the release lacks) fails the
// check, though go get succeeds.
func TestModulesFailOnBrokenBuild(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	_, cfg := newFixture(t, map[string]string{
		"sub/sub.go": strings.Replace(fixture["sub/sub.go"], "lib.Hello()", "lib.Goodbye()", 1),
	}, &out)
	err := runFixture(t, "modules", cfg)
	if err == nil || !strings.Contains(err.Error(), "undefined: lib.Goodbye") {
		t.Fatalf("error %v, want the build's undefined: lib.Goodbye\n%s", err, out.String())
	}
}

// containsAll fails t for every want that got (named what) lacks.
func containsAll(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(got, want) {
			t.Errorf("%s lacks %q:\n%s", what, want, got)
		}
	}
}
