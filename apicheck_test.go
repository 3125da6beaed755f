package eventbus

import (
	"go/ast"
	"go/build"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// handlerFiles are the files of the Handler, the package's SSE transport.
// They may use only what any transport outside the package could: the
// package's exported API, plus their own unexported declarations.
var handlerFiles = []string{"handler.go", "stream.go", "auth.go", "cors.go", "mux.go"}

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
	conf := types.Config{Importer: moduleImporter{fset, importer.ForCompiler(fset, "gc", nil), modulePath(t), pkg.Dir}}
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

// moduleImporter imports the standard library from the compiler's export
// data and this module's own packages (internal/...) by type-checking
// their source, for which the compiler has no export data here.
type moduleImporter struct {
	fset   *token.FileSet
	gc     types.Importer
	module string // the import path of the module's root package
	dir    string // its directory
}

// modulePath reads the module path from go.mod.
func modulePath(t *testing.T) string {
	b, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if m, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.TrimSpace(m)
		}
	}
	t.Fatal("go.mod names no module")
	return ""
}

func (im moduleImporter) Import(path string) (*types.Package, error) {
	rel, ok := strings.CutPrefix(path, im.module+"/")
	if !ok {
		return im.gc.Import(path)
	}
	p, err := build.ImportDir(filepath.Join(im.dir, filepath.FromSlash(rel)), 0)
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for _, name := range p.GoFiles {
		f, err := parser.ParseFile(im.fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return (&types.Config{Importer: im}).Check(path, im.fset, files, nil)
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
