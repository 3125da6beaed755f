package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
)

// repo is the repository's working tree: its files and its modules.
type repo struct {
	Dir     string   // absolute
	Files   []string // slash-separated, relative to Dir: tracked, and untracked but not ignored
	Modules []*gomod // the root module first, then by folder
	root    *gomod   // Modules[0]
	byPath  map[string]*gomod
}

// gomod is one module of the repository.
type gomod struct {
	Dir       string // slash-separated, relative to the repository; "." for the root module
	Path      string // the module path
	File      *modfile.File
	Published bool // tagged and go-gettable (not a test harness)
}

// name is the module's (or a package's) path below the folder that holds
// the root module, with "-" for "/": "eventbus", "eventbus-redisbus". It
// names the module's files (baseline, consumer folder).
func (r *repo) name(importPath string) string {
	return strings.ReplaceAll(strings.TrimPrefix(importPath, path.Dir(r.root.Path)+"/"), "/", "-")
}

// loadRepo reads the modules of the repository at dir. The files are what
// git lists, so that what is ignored (node_modules, build output) is
// neither zipped nor mistaken for a module; a file not yet added counts.
func loadRepo(ctx context.Context, dir string, unpublished []string) (*repo, error) {
	out, err := command(ctx, dir, nil, "git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	if err != nil {
		return nil, err
	}
	r := &repo{Dir: dir, byPath: make(map[string]*gomod)}
	for _, f := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if f == "" {
			continue
		}
		// A tracked file deleted from the working tree is not released.
		if _, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(f))); err != nil {
			continue
		}
		r.Files = append(r.Files, f)
	}
	sort.Strings(r.Files)
	for _, f := range r.Files {
		if path.Base(f) != "go.mod" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(f)))
		if err != nil {
			return nil, err
		}
		mf, err := modfile.Parse(f, data, nil)
		if err != nil {
			return nil, err
		}
		if mf.Module == nil {
			return nil, fmt.Errorf("%s has no module line", f)
		}
		m := &gomod{Dir: path.Dir(f), Path: mf.Module.Mod.Path, File: mf, Published: true}
		r.Modules = append(r.Modules, m)
		r.byPath[m.Path] = m
	}
	slices.SortFunc(r.Modules, func(a, b *gomod) int {
		if (a.Dir == ".") != (b.Dir == ".") {
			if a.Dir == "." {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Dir, b.Dir)
	})
	if len(r.Modules) == 0 || r.Modules[0].Dir != "." {
		return nil, fmt.Errorf("%s: no go.mod at the root", dir)
	}
	r.root = r.Modules[0]
	for _, u := range unpublished {
		m := r.module(u)
		if m == nil {
			return nil, fmt.Errorf("-unpublished %s: no module in that folder", u)
		}
		if m == r.root {
			return nil, fmt.Errorf("-unpublished %s: the root module is always published", u)
		}
		m.Published = false
	}
	return r, nil
}

// module returns the module in folder dir, or nil.
func (r *repo) module(dir string) *gomod {
	for _, m := range r.Modules {
		if m.Dir == dir {
			return m
		}
	}
	return nil
}

// published returns the published modules, the root first.
func (r *repo) published() []*gomod {
	var out []*gomod
	for _, m := range r.Modules {
		if m.Published {
			out = append(out, m)
		}
	}
	return out
}

// owner returns the module of the repository that holds the package with
// this import path, or nil.
func (r *repo) owner(importPath string) *gomod {
	var best *gomod
	for _, m := range r.Modules {
		if (importPath == m.Path || strings.HasPrefix(importPath, m.Path+"/")) && (best == nil || len(m.Path) > len(best.Path)) {
			best = m
		}
	}
	return best
}

// files returns the files of the folder of m (those of nested modules too:
// the zip leaves them out), relative to that folder.
func (r *repo) files(m *gomod) []string {
	if m.Dir == "." {
		return r.Files
	}
	var out []string
	for _, f := range r.Files {
		if rest, ok := strings.CutPrefix(f, m.Dir+"/"); ok {
			out = append(out, rest)
		}
	}
	return out
}

// releaseVersion returns the one version at which the modules of the
// repository require each other, and every problem with the requirements:
// a module of the repository required at another version (v0.0.0 or a
// pseudo-version: no user can get it), or without the replace that makes
// development build against the working tree.
func (r *repo) releaseVersion(want string) (string, []string) {
	var problems []string
	versions := make(map[string][]string) // version -> "dir/go.mod requires path"
	for _, m := range r.Modules {
		replaced := make(map[string]string)
		for _, rep := range m.File.Replace {
			if rep.Old.Version == "" && rep.New.Version == "" {
				replaced[rep.Old.Path] = rep.New.Path
			}
		}
		for _, req := range m.File.Require {
			dep := r.byPath[req.Mod.Path]
			if dep == nil {
				continue
			}
			where := fmt.Sprintf("%s requires %s %s", path.Join(m.Dir, "go.mod"), dep.Path, req.Mod.Version)
			versions[req.Mod.Version] = append(versions[req.Mod.Version], where)
			rel := relDir(m.Dir, dep.Dir)
			if got, ok := replaced[dep.Path]; !ok || path.Clean(filepath.ToSlash(got)) != path.Clean(rel) {
				problems = append(problems, fmt.Sprintf("%s: want also \"replace %s => %s\" (the working tree, for development)", where, dep.Path, rel))
			}
			if m.Published && !dep.Published {
				problems = append(problems, fmt.Sprintf("%s: a published module requires %s, which is not (-unpublished)", where, dep.Dir))
			}
		}
	}
	if len(versions) == 0 {
		return "", append(problems, "no module requires another module of the repository: nothing says the release version")
	}
	if want == "" {
		// The version most requirements name is the release (the highest
		// of a tie); the others are the problems.
		for v, w := range versions {
			if want == "" || len(w) > len(versions[want]) || len(w) == len(versions[want]) && semver.Compare(v, want) > 0 {
				want = v
			}
		}
	}
	switch {
	case !semver.IsValid(want) || semver.Canonical(want) != want:
		problems = append(problems, fmt.Sprintf("release version %q is not a canonical semantic version", want))
	case module.IsPseudoVersion(want) || want == "v0.0.0":
		problems = append(problems, fmt.Sprintf("release version %s is no release (a pseudo-version or v0.0.0)", want))
	}
	var others []string
	for v, w := range versions {
		if v != want {
			for _, x := range w {
				others = append(others, fmt.Sprintf("%s, want %s (one release version for every module)", x, want))
			}
		}
	}
	sort.Strings(others)
	return want, append(problems, others...)
}

// relDir is the slash-separated path from folder from to folder to, both
// relative to the repository.
func relDir(from, to string) string {
	rel, err := filepath.Rel(filepath.FromSlash(from), filepath.FromSlash(to))
	if err != nil {
		return to
	}
	rel = filepath.ToSlash(rel)
	if !strings.HasPrefix(rel, ".") {
		rel = "./" + rel
	}
	return rel
}

// rel returns name (a path) relative to the repository, for messages.
func (r *repo) rel(name string) string {
	if rel, err := filepath.Rel(r.Dir, name); err == nil && !strings.HasPrefix(rel, "..") {
		return filepath.ToSlash(rel)
	}
	return name
}

// readFile returns a file of the working tree.
func (r *repo) readFile(name string) ([]byte, error) {
	return os.ReadFile(filepath.Join(r.Dir, filepath.FromSlash(name)))
}

// goSums returns the go.sum lines of every module of the repository,
// deduplicated: the hashes of the third-party modules the consumers need.
func (r *repo) goSums() []byte {
	seen := make(map[string]bool)
	var out bytes.Buffer
	for _, m := range r.Modules {
		data, err := r.readFile(path.Join(m.Dir, "go.sum"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			if line = strings.TrimSpace(line); line != "" && !seen[line] {
				seen[line] = true
				out.WriteString(line + "\n")
			}
		}
	}
	return out.Bytes()
}
