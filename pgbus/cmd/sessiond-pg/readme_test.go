package main

import (
	"testing"

	"github.com/ssebus/eventbus/internal/doccheck"
)

// TestREADMECompiles type-checks the Go blocks of the module's README.md
// against the working tree's API, as the root module's TestDocsCompile
// does for its own Markdown (package doccheck). It lives beside the
// module's daemon because only the daemon may import the root's internal
// packages (.ci/no-internal.sh).
func TestREADMECompiles(t *testing.T) {
	if n := doccheck.Run(t, map[string]string{
		"pgbus":    "github.com/ssebus/eventbus/pgbus",
		"pgxpool":  "github.com/jackc/pgx/v5/pgxpool",
		"eventbus": "github.com/ssebus/eventbus",
		"context":  "context",
		"http":     "net/http",
		"log":      "log",
		"time":     "time",
	}, nil, "../../README.md"); n < 1 {
		t.Fatal("the README has a Go block: none was checked")
	}
}
