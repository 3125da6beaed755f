package backplanetest

import (
	"os"
	"testing"
)

// Env returns the environment variable name, which the CI script of a
// backplane sets (the URL of the engine server it started, say), for a
// harness whose engine the test binary cannot start itself. When it is
// unset the test is skipped with hint, unless CI=true, where it fails: a
// CI run never passes for want of its engine.
func Env(t testing.TB, name, hint string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not set (CI=true): %s", name, hint)
		}
		t.Skipf("%s is not set: %s", name, hint)
	}
	return v
}
