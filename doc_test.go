package eventbus

import (
	"go/build"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageDocIsInDocGo checks the package's front door: doc.go holds
// the package comment, and no other file holds one (go doc would show
// them all, in file order, before anything else).
func TestPackageDocIsInDocGo(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range append(pkg.GoFiles, pkg.TestGoFiles...) {
		f, err := parser.ParseFile(fset, filepath.Join(pkg.Dir, name), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case name == "doc.go" && (f.Doc == nil || !strings.HasPrefix(f.Doc.Text(), "Package eventbus ")):
			t.Errorf("doc.go has no package comment starting %q", "Package eventbus ")
		case name != "doc.go" && f.Doc != nil:
			t.Errorf("%s has a package comment; it belongs in doc.go", name)
		}
	}
}
