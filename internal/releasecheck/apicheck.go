package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/mod/semver"
)

// surface is what the API check compares: a published module, or an
// internal package that a library package of a published module imports
// from another module.
// The latter is API too: a module v0.1.0 builds against whatever root
// version a user's build selects, and so against that version's internal
// package (the backplane modules import none since the kit is public).
type surface struct {
	Path  string // module path, or the package's import path
	Owner *gomod // the module that holds it
	Pkg   bool   // an internal package, not a whole module
}

// apiFile is the name of the export data file of s.
func (r *repo) apiFile(s surface) string { return r.name(s.Path) + ".x" }

// surfaces returns what the API check compares, the modules first.
func surfaces(ctx context.Context, r *repo) ([]surface, error) {
	var out []surface
	for _, m := range r.published() {
		out = append(out, surface{Path: m.Path, Owner: m})
	}
	seen := make(map[string]bool)
	var pkgs []surface
	for _, m := range r.published() {
		// The imports of library packages only: a user's build compiles
		// them against the root version it selects, which may be newer
		// than the one this module requires, while go install builds a
		// command at the versions its own module requires.
		list, err := command(ctx, filepath.Join(r.Dir, filepath.FromSlash(m.Dir)), goEnvFixed, "go", "list", "-f", `{{if ne .Name "main"}}{{range .Imports}}{{.}}{{"\n"}}{{end}}{{end}}`, "./...")
		if err != nil {
			return nil, err
		}
		for _, p := range strings.Fields(string(list)) {
			if o := r.owner(p); o != nil && o != m && isInternal(p) && !seen[p] {
				seen[p] = true
				pkgs = append(pkgs, surface{Path: p, Owner: o, Pkg: true})
			}
		}
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].Path < pkgs[j].Path })
	return append(out, pkgs...), nil
}

// goEnvFixed keeps the go command to the module it runs in and to the
// toolchain at hand.
var goEnvFixed = []string{"GOWORK=off", "GOTOOLCHAIN=local"}

// apidiffEnv is goEnvFixed with -trimpath: the export data apidiff writes
// then names source files by module@version, not by the folder of this
// checkout, so a baseline cut anywhere is the same bytes. (No VCS stamp:
// the tree of a tag is no repository.)
var apidiffEnv = append(slices.Clip(goEnvFixed), "GOFLAGS=-trimpath -buildvcs=false")

// prepareAPI returns the path of the apidiff binary, built (and cached by
// the go command) at the version this module's go.mod pins, and the
// surfaces of r.
func prepareAPI(ctx context.Context, r *repo, cfg config) (string, []surface, error) {
	out, err := command(ctx, cfg.ToolDir, goEnvFixed, "go", "tool", "-n", "apidiff")
	if err != nil {
		return "", nil, err
	}
	ss, err := surfaces(ctx, r)
	return strings.TrimSpace(string(out)), ss, err
}

// writeExports writes the export data of every surface found in the tree
// at treeDir (the working tree, or a release's) into outDir, and returns
// the surfaces it wrote. A surface the tree lacks (a module or package
// added since) is left out.
func writeExports(ctx context.Context, bin, treeDir string, ss []surface, r *repo, outDir string) ([]surface, error) {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	var wrote []surface
	for _, s := range ss {
		modDir := filepath.Join(treeDir, filepath.FromSlash(s.Owner.Dir))
		if !isModule(modDir, s.Owner.Path) {
			continue
		}
		args := []string{"-m", "-w", filepath.Join(outDir, r.apiFile(s)), s.Path}
		if s.Pkg {
			rel := strings.TrimPrefix(s.Path, s.Owner.Path+"/")
			if fi, err := os.Stat(filepath.Join(modDir, filepath.FromSlash(rel))); err != nil || !fi.IsDir() {
				continue
			}
			args = args[1:]
		}
		if _, err := command(ctx, modDir, apidiffEnv, bin, args...); err != nil {
			return nil, err
		}
		wrote = append(wrote, s)
	}
	return wrote, nil
}

// isModule reports whether dir holds the go.mod of the module path.
func isModule(dir, modPath string) bool {
	data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`) == modPath
		}
	}
	return false
}

// writeAPI re-cuts the baseline from the working tree: the API a release
// promises to keep.
func writeAPI(ctx context.Context, r *repo, cfg config) error {
	bin, ss, err := prepareAPI(ctx, r, cfg)
	if err != nil {
		return err
	}
	dir := cfg.Baseline
	old, _ := filepath.Glob(filepath.Join(dir, "*.x"))
	for _, f := range old {
		if err := os.Remove(f); err != nil {
			return err
		}
	}
	wrote, err := writeExports(ctx, bin, r.Dir, ss, r, dir)
	if err != nil {
		return err
	}
	for _, s := range wrote {
		cfg.logf("wrote %s (%s)", r.rel(filepath.Join(dir, r.apiFile(s))), s.Path)
	}
	return nil
}

// checkAPI compares the API of the working tree with the last release: the
// highest tag v* when the repository has one (the tree at that tag), else
// the baseline (config.Baseline). An incompatible change fails, unless the
// modules require a version that semantic versioning lets break the tag's
// API; compatible changes are listed.
func checkAPI(ctx context.Context, r *repo, cfg config) error {
	start := time.Now()
	bin, ss, err := prepareAPI(ctx, r, cfg)
	if err != nil {
		return err
	}
	baseDir, label := cfg.Baseline, "the baseline "+r.rel(cfg.Baseline)
	breakOK := ""
	tag, err := lastTag(ctx, r)
	if err != nil {
		return err
	}
	if tag != "" {
		// Semantic versioning lets a v0 module break its API in a new
		// minor version (and any module in a new major, which for Go is
		// a new module path): a release the modules already require at
		// such a version lists its breaks (for CHANGELOG.md) and passes.
		if version, _ := r.releaseVersion(cfg.Version); semver.Compare(version, tag) > 0 &&
			(semver.Major(version) != semver.Major(tag) || semver.Major(tag) == "v0" && semver.MajorMinor(version) != semver.MajorMinor(tag)) {
			breakOK = version
		}
		tmp, done, err := cfg.tempDir("api")
		if err != nil {
			return err
		}
		defer done()
		tree := filepath.Join(tmp, "tree")
		if err := extractTag(ctx, r, tag, tree); err != nil {
			return err
		}
		baseDir, label = filepath.Join(tmp, "exports"), "release "+tag
		if _, err := writeExports(ctx, bin, tree, ss, r, baseDir); err != nil {
			return fmt.Errorf("the API of %s: %w", tag, err)
		}
	}
	var errs []error
	for _, s := range ss {
		old := filepath.Join(baseDir, r.apiFile(s))
		if _, err := os.Stat(old); err != nil {
			cfg.logf("new  %s: not in %s (added since)", s.Path, label)
			continue
		}
		args := []string{"-m", old, s.Path}
		if s.Pkg {
			args = []string{"-allow-internal", old, s.Path}
		}
		out, err := command(ctx, filepath.Join(r.Dir, filepath.FromSlash(s.Owner.Dir)), apidiffEnv, bin, args...)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		incompatible, compatible := parseReport(out)
		for _, c := range compatible {
			cfg.logf("add  %s: %s", s.Path, c)
		}
		if len(incompatible) > 0 && breakOK != "" {
			for _, c := range incompatible {
				cfg.logf("BREAK %s: %s (allowed: %s is a new minor of v0 or a new major; say it in CHANGELOG.md)", s.Path, c, breakOK)
			}
			continue
		}
		if len(incompatible) > 0 {
			errs = append(errs, fmt.Errorf("%s: incompatible with %s:\n\t%s", s.Path, label, strings.Join(incompatible, "\n\t")))
			continue
		}
		cfg.logf("ok   %s: compatible with %s", s.Path, label)
	}
	if len(errs) > 0 {
		return fmt.Errorf("API:\n%w\n(a break waits for a version that may break: a new minor while v0, a new major after; a break made on purpose before the first tag: re-cut the baseline, RELEASING.md)", errors.Join(errs...))
	}
	cfg.logf("ok   API of %d modules and internal packages compatible with %s (%.1fs)", len(ss), label, time.Since(start).Seconds())
	return nil
}

// parseReport splits apidiff's text report into its incompatible and its
// compatible changes.
func parseReport(out []byte) (incompatible, compatible []string) {
	var section *[]string
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case line == "Incompatible changes:":
			section = &incompatible
		case line == "Compatible changes:":
			section = &compatible
		case strings.HasPrefix(line, "- "):
			if section == nil {
				// No header: apidiff's format changed; count it as a
				// break rather than pass it unread.
				section = &incompatible
			}
			*section = append(*section, strings.TrimPrefix(line, "- "))
		}
	}
	return incompatible, compatible
}

// lastTag returns the highest release tag of the root module (v*, not the
// sub-modules' dir/v*), or "".
func lastTag(ctx context.Context, r *repo) (string, error) {
	out, err := command(ctx, r.Dir, nil, "git", "tag", "-l", "v*")
	if err != nil {
		return "", err
	}
	best := ""
	for _, t := range strings.Fields(string(out)) {
		if semver.IsValid(t) && (best == "" || semver.Compare(t, best) > 0) {
			best = t
		}
	}
	return best, nil
}

// extractTag writes the tree of tag into dir (git archive).
func extractTag(ctx context.Context, r *repo, tag, dir string) error {
	out, err := command(ctx, r.Dir, nil, "git", "archive", "--format=tar", tag)
	if err != nil {
		return err
	}
	tr := tar.NewReader(bytes.NewReader(out))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean(h.Name)
		if name == "." || strings.HasPrefix(name, "../") || path.IsAbs(name) {
			continue
		}
		target := filepath.Join(dir, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(target, 0o755)
		case tar.TypeReg:
			if err = os.MkdirAll(filepath.Dir(target), 0o755); err == nil {
				err = createFile(target, func(w io.Writer) error {
					_, err := io.Copy(w, tr)
					return err
				})
			}
		}
		if err != nil {
			return err
		}
	}
}
