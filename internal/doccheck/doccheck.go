// Package doccheck type-checks the Go blocks of Markdown files against the
// working tree's API, so that every snippet a reader copies compiles. It is
// used by the docs tests of the root module (docs_test.go) and of the
// modules whose READMEs have Go blocks that need their own dependencies.
//
// A block that starts with a package clause is a file as it is. Any other
// block is wrapped: its import declarations and its top-level
// declarations (func, a method, type, var, const, starting a line) stay
// top level; every other line is a statement of one function body, in the
// block's order. The packages the block uses without importing them are
// imported from a fixed map of package names to import paths. The check
// ignores "declared and not used" and "imported and not used", nothing
// else: an undefined name, a wrong signature or a missing field is an
// error, reported at the Markdown file's line.
package doccheck

import (
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/scanner"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Run type-checks every ```go block of the Markdown files (paths from the
// test's directory, which name them in errors) with a Checker of packages
// made in the test's directory, and fails t for each block that does not
// compile, with its file, its line and the errors. A block that uses a
// package named in skip (package name → why) is not checked: t logs it
// with the reason. Run returns the number of blocks checked; it skips t
// without the go command.
func Run(t testing.TB, packages, skip map[string]string, files ...string) int {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go command")
	}
	c, err := NewChecker(".", packages)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, file := range files {
		blocks, err := Blocks(file, file)
		if err != nil {
			t.Error(err)
			continue
		}
		for _, b := range blocks {
			if uses := c.Uses(b, skip); len(uses) > 0 {
				t.Logf("%s:%d: not checked: it uses %s: %s", b.File, b.Line, strings.Join(uses, ", "), skip[uses[0]])
				continue
			}
			n++
			if err := c.Check(b); err != nil {
				t.Errorf("%s:%d: the block does not compile:\n%v", b.File, b.Line, err)
			}
		}
	}
	t.Logf("checked %d blocks of %d files", n, len(files))
	return n
}

// A Block is one ```go block of a Markdown file.
type Block struct {
	File string // the Markdown file, as the errors name it
	Line int    // the line of the block's first line of code (1-based)
	Code string // the block's code, unindented as its fence is
}

// Blocks returns the ```go blocks of the Markdown file at path, named name
// in errors (path when name is empty).
func Blocks(path, name string) ([]Block, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if name == "" {
		name = path
	}
	var (
		out    []Block
		cur    *Block
		indent string
		code   strings.Builder
	)
	for i, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimLeft(line, " \t")
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```go") && strings.TrimSpace(trimmed[len("```go"):]) == "":
			cur = &Block{File: name, Line: i + 2}
			indent = line[:len(line)-len(trimmed)]
			code.Reset()
		case cur != nil && strings.HasPrefix(trimmed, "```"):
			cur.Code = code.String()
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			code.WriteString(strings.TrimPrefix(line, indent))
			code.WriteByte('\n')
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: the ```go block is not closed", name, cur.Line-1)
	}
	return out, nil
}

// A Checker type-checks blocks against the packages of one module.
type Checker struct {
	fset     *token.FileSet
	packages map[string]string // package name → import path
	imp      types.Importer
}

// NewChecker returns a Checker whose blocks may use the packages of
// packages (package name → import path) without importing them. It asks
// the go command, run in dir (the module's directory or one below it;
// "" is the current one), for the export data of those packages and
// everything they import, built from the working tree: a block is checked
// against the API as it is now. It needs the go command.
func NewChecker(dir string, packages map[string]string) (*Checker, error) {
	paths := make([]string, 0, len(packages))
	for _, p := range packages {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	paths = slices.Compact(paths)
	cmd := exec.Command("go", append([]string{"list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}"}, paths...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -export: %v\n%s", err, stderr.Bytes())
	}
	exports := make(map[string]string)
	for _, line := range strings.Split(string(out), "\n") {
		if path, file, ok := strings.Cut(line, "\t"); ok && file != "" {
			exports[path] = file
		}
	}
	fset := token.NewFileSet()
	lookup := func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %q: only the checker's packages and their dependencies can be imported", path)
		}
		return os.Open(file)
	}
	return &Checker{fset: fset, packages: packages, imp: importer.ForCompiler(fset, "gc", lookup)}, nil
}

// Uses returns the names of the packages of names that b uses as
// qualifiers (name.X) without importing them, sorted. A block that does
// not parse uses none.
func (c *Checker) Uses(b Block, names map[string]string) []string {
	src, err := c.wrap(b, nil)
	if err != nil {
		return nil
	}
	f, err := parser.ParseFile(token.NewFileSet(), "block.go", src, 0)
	if err != nil {
		return nil
	}
	return qualifiers(f, names)
}

// qualifiers returns the names of names that f uses as the X of a
// selector and does not import, sorted.
func qualifiers(f *ast.File, names map[string]string) []string {
	imported := make(map[string]bool)
	for _, spec := range f.Imports {
		path := strings.Trim(spec.Path.Value, `"`)
		name := filepath.Base(path)
		if spec.Name != nil {
			name = spec.Name.Name
		}
		imported[name] = true
	}
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if x, ok := sel.X.(*ast.Ident); ok {
				if _, ok := names[x.Name]; ok && !imported[x.Name] && !slices.Contains(out, x.Name) {
					out = append(out, x.Name)
				}
			}
		}
		return true
	})
	slices.Sort(out)
	return out
}

// Check type-checks b. Its error lists every error but the two it ignores
// ("declared and not used", "imported and not used"), each at the Markdown
// file's line and column, followed by the code as it was checked.
func (c *Checker) Check(b Block) error {
	src, err := c.wrap(b, nil)
	if err != nil {
		return err
	}
	if f, err := parser.ParseFile(token.NewFileSet(), "block.go", src, 0); err == nil {
		if uses := qualifiers(f, c.packages); len(uses) > 0 {
			if src, err = c.wrap(b, uses); err != nil {
				return err
			}
		}
	}
	f, err := parser.ParseFile(c.fset, "block.go", src, parser.ParseComments)
	if err != nil {
		return fmt.Errorf("%w\n--- checked as:\n%s", scannerErrors(err), src)
	}
	var errs []error
	conf := types.Config{
		Importer: c.imp,
		Error: func(err error) {
			msg := err.Error()
			if strings.Contains(msg, "declared and not used") || strings.Contains(msg, "imported and not used") {
				return
			}
			errs = append(errs, err)
		},
	}
	_, _ = conf.Check("doc", c.fset, []*ast.File{f}, nil)
	if len(errs) > 0 {
		return fmt.Errorf("%w\n--- checked as:\n%s", errors.Join(errs...), src)
	}
	return nil
}

// scannerErrors returns a parser's error list as one error a line.
func scannerErrors(err error) error {
	var list scanner.ErrorList
	if !errors.As(err, &list) {
		return err
	}
	errs := make([]error, len(list))
	for i, e := range list {
		errs[i] = e
	}
	return errors.Join(errs...)
}

// wrap returns b as a Go file of package doc: as it is when it starts with
// a package clause, else its imports and declarations at top level and
// its other lines in a function body, importing the packages named in
// imports. Line directives keep the Markdown file's lines.
func (c *Checker) wrap(b Block, imports []string) (string, error) {
	directive := func(line int) string { return fmt.Sprintf("//line %s:%d:1\n", b.File, line) }
	if startsWithPackage(b.Code) {
		return directive(b.Line) + b.Code, nil
	}
	lines := strings.SplitAfter(b.Code, "\n")
	kind, err := lineKinds(b.Code, len(lines))
	if err != nil {
		return "", fmt.Errorf("%s:%d: %v", b.File, b.Line, err)
	}
	var out strings.Builder
	out.WriteString("package doc\n\n")
	if len(imports) > 0 {
		out.WriteString("import (\n")
		for _, name := range imports {
			fmt.Fprintf(&out, "\t%s %q\n", name, c.packages[name])
		}
		out.WriteString(")\n\n")
	}
	// Imports first, then declarations, then the body: each run of lines
	// of a kind after a line directive naming its first line.
	emit := func(k lineKind) {
		for i := 0; i < len(lines); i++ {
			if kind[i] != k {
				continue
			}
			out.WriteString(directive(b.Line + i))
			for ; i < len(lines) && kind[i] == k; i++ {
				out.WriteString(lines[i])
			}
			out.WriteString("\n")
		}
	}
	emit(importLine)
	emit(declLine)
	out.WriteString("func _() {\n")
	emit(stmtLine)
	out.WriteString("}\n")
	return out.String(), nil
}

// startsWithPackage reports whether code's first token is "package".
func startsWithPackage(code string) bool {
	var s scanner.Scanner
	fset := token.NewFileSet()
	s.Init(fset.AddFile("", -1, len(code)), []byte(code), nil, 0)
	_, tok, _ := s.Scan()
	return tok == token.PACKAGE
}

type lineKind int

const (
	stmtLine lineKind = iota
	declLine
	importLine
)

// lineKinds says of each of the n lines of code whether it is part of an
// import declaration, of another top-level declaration (one that starts
// at the start of a line, with func followed by a name or, for a method,
// by a space and its receiver), or a statement. A declaration ends at the
// end of the line of the first semicolon (written or implied by a newline)
// outside brackets after its keyword.
func lineKinds(code string, n int) ([]lineKind, error) {
	kinds := make([]lineKind, n)
	fset := token.NewFileSet()
	file := fset.AddFile("", -1, len(code))
	var s scanner.Scanner
	var serr error
	s.Init(file, []byte(code), func(pos token.Position, msg string) {
		if serr == nil {
			serr = fmt.Errorf("line %d: %s", pos.Line, msg)
		}
	}, 0)
	depth := 0
	inDecl := lineKind(-1)
	declStart := 0
	atStmtStart := true
	for {
		pos, tok, _ := s.Scan()
		if tok == token.EOF {
			break
		}
		p := file.Position(pos)
		switch tok {
		case token.LPAREN, token.LBRACE, token.LBRACK:
			depth++
		case token.RPAREN, token.RBRACE, token.RBRACK:
			depth--
		}
		if inDecl < 0 && depth == 0 && atStmtStart && p.Column == 1 {
			switch tok {
			case token.IMPORT:
				inDecl, declStart = importLine, p.Line
			case token.TYPE, token.VAR, token.CONST:
				inDecl, declStart = declLine, p.Line
			case token.FUNC:
				rest := code[file.Offset(pos)+len("func"):]
				if strings.HasPrefix(rest, " ") {
					inDecl, declStart = declLine, p.Line
				}
			}
		}
		atStmtStart = tok == token.SEMICOLON && depth == 0
		if atStmtStart && inDecl >= 0 {
			for l := declStart; l <= p.Line && l <= n; l++ {
				kinds[l-1] = inDecl
			}
			inDecl = -1
		}
	}
	return kinds, serr
}
