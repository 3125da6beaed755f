package doccheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestBlocks finds the ```go blocks, indented ones unindented, with the
// line of their first line of code, and none of another language.
func TestBlocks(t *testing.T) {
	md := "# t\n\n```go\nx := 1\n```\n\n```sh\nls\n```\n\n- a list:\n\n  ```go\n  y := 2\n  ```\n"
	path := filepath.Join(t.TempDir(), "t.md")
	if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
	blocks, err := Blocks(path, "t.md")
	if err != nil {
		t.Fatal(err)
	}
	want := []Block{{"t.md", 4, "x := 1\n"}, {"t.md", 14, "y := 2\n"}}
	if len(blocks) != len(want) || blocks[0] != want[0] || blocks[1] != want[1] {
		t.Fatalf("blocks %q, want %q", blocks, want)
	}
	if err := os.WriteFile(path, []byte("```go\nx := 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Blocks(path, "t.md"); err == nil || !strings.Contains(err.Error(), "not closed") {
		t.Fatalf("an unclosed block: %v", err)
	}
}

// TestCheck type-checks blocks against the working tree's package
// eventbus through the go command: what compiles passes (unused names and
// imports forgiven), an undefined name, a wrong signature and a missing
// field fail at the Markdown line, and a block that uses another module's
// package is reported by Uses.
func TestCheck(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go command")
	}
	c, err := NewChecker(".", map[string]string{
		"eventbus": "github.com/ssebus/eventbus",
		"context":  "context",
		"fmt":      "fmt",
		"http":     "net/http",
		"time":     "time",
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, code string
		want       []string // in the error; none: it compiles
	}{
		{"statements", "bus, err := eventbus.New(eventbus.Options{})\nunused := 1\n", nil},
		{"declarations and statements", "var bus *eventbus.EventBus\n\nfunc print(f eventbus.Frame) {\n\tfmt.Println(f.ID())\n}\n\nctx := context.Background()\nsub, _ := bus.Subscribe(ctx, eventbus.SubscribeOptions{})\nfor f := range sub.Events() {\n\tprint(f)\n}\n", nil},
		{"a method and a type", "type T struct{ n int }\n\nfunc (t *T) N() int { return t.n }\n\nx := (&T{}).N()\n", nil},
		{"a whole file", "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println() }\n", nil},
		{"an import of its own", "import eb \"github.com/ssebus/eventbus\"\n\nvar h eb.Handler\n", nil},
		{"a func literal statement", "func() {\n\tfmt.Println()\n}()\n", nil},
		{"undefined", "x := 1\nsub, err := bus.Subscribe(ctx, eventbus.SubscribeOptions{})\n", []string{"t.md:11:", "undefined: bus", "undefined: ctx"}},
		{"a wrong signature", "var bus *eventbus.EventBus\n\nbus.Subscribe(eventbus.SubscribeOptions{})\n", []string{"t.md:12:", "not enough arguments"}},
		{"a missing field", "h := &eventbus.Handler{Lookups: nil}\n", []string{"t.md:10:", "unknown field Lookups"}},
		{"a wrong field type", "o := eventbus.Options{RingSize: \"8000\"}\n", []string{"t.md:10:"}},
		{"a syntax error", "if x {\n", []string{"t.md:"}},
		{"an unknown package", "import \"example.com/nothing\"\n", []string{"t.md:10:", "example.com/nothing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.Check(Block{File: "t.md", Line: 10, Code: tc.code})
			if tc.want == nil {
				if err != nil {
					t.Fatalf("%v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("it compiles")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error does not say %q:\n%v", w, err)
				}
			}
		})
	}
	other := map[string]string{"ebprom": "", "redis": ""}
	if got := c.Uses(Block{File: "t.md", Line: 1, Code: "c := ebprom.NewCollector(hub)\nfmt.Println(c)\n"}, other); len(got) != 1 || got[0] != "ebprom" {
		t.Fatalf("Uses: %q, want [ebprom]", got)
	}
	if got := c.Uses(Block{File: "t.md", Line: 1, Code: "import ebprom \"x\"\nc := ebprom.NewCollector(hub)\n"}, other); len(got) != 0 {
		t.Fatalf("Uses of an imported name: %q, want none", got)
	}
}
