package eventbus

import (
	"go/ast"
	"go/build"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// handlerFiles are the files of the Handler, the package's SSE transport.
// They may use only what any transport outside the package could: the
// package's exported API, plus their own unexported declarations.
var handlerFiles = []string{"handler.go", "stream.go", "auth.go", "cors.go"}

// TestHandlerUsesOnlyExportedAPI type-checks the package (its non-test
// files, importing the standard library from the compiler's export data) and fails for every
// identifier in a Handler file that resolves to an unexported object of
// this package (a package-level name, a field or a method) declared outside
// the Handler's files: so a WebSocket transport, or any other, can be
// written outside the package with what the Handler uses (issue 14).
func TestHandlerUsesOnlyExportedAPI(t *testing.T) {
	t.Parallel()
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range handlerFiles {
		if !slices.Contains(pkg.GoFiles, name) {
			t.Fatalf("handler file %s is not a Go file of the package (renamed? update handlerFiles)", name)
		}
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range pkg.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(pkg.Dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	info := &types.Info{Uses: make(map[*ast.Ident]types.Object)}
	conf := types.Config{Importer: importer.ForCompiler(fset, "gc", nil)}
	tpkg, err := conf.Check(pkg.ImportPath, fset, files, info)
	if err != nil {
		t.Fatal(err)
	}
	isHandlerFile := func(pos token.Pos) bool {
		return slices.Contains(handlerFiles, filepath.Base(fset.Position(pos).Filename))
	}
	var bad []string
	for id, obj := range info.Uses {
		if obj.Pkg() != tpkg || obj.Exported() || !isHandlerFile(id.Pos()) || isHandlerFile(obj.Pos()) {
			continue
		}
		bad = append(bad, fset.Position(id.Pos()).String()+": "+id.Name+" (declared at "+filepath.Base(fset.Position(obj.Pos()).String())+")")
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Errorf("the Handler uses unexported API: %s", b)
	}
	if t.Failed() {
		t.Log("expose what the Handler needs as documented exported API (see Subscription.TakeReady and its kin), or move the helper into the Handler's files")
	}
}

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
