package ebprom_test

import (
	"os"
	"testing"

	"github.com/ssebus/eventbus/internal/doccheck"
)

// TestDocsCompile type-checks the Go blocks of the repository's
// docs/prometheus.md, whose Prometheus block the root module's
// TestDocsCompile leaves to this module (it needs client_golang), against
// the working tree's API (package doccheck). Outside a checkout of the
// repository (this module alone) there is no such file: skipped.
func TestDocsCompile(t *testing.T) {
	const doc = "../docs/prometheus.md"
	if _, err := os.Stat(doc); err != nil {
		t.Skipf("not in a checkout of the repository: %v", err)
	}
	n := doccheck.Run(t, map[string]string{
		"ebprom":     "github.com/ssebus/eventbus/prometheus",
		"prometheus": "github.com/prometheus/client_golang/prometheus",
		"promhttp":   "github.com/prometheus/client_golang/prometheus/promhttp",
		"eventbus":   "github.com/ssebus/eventbus",
		"expvar":     "expvar",
		"http":       "net/http",
	}, nil, doc)
	if n < 2 {
		t.Fatalf("checked %d blocks of %s; it has 2", n, doc)
	}
}
