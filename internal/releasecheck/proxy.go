package main

import (
	"encoding/json"
	"io"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"time"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

// writeProxy lays out, under dir, a module proxy that serves every
// published module of r at version, zipped from the working tree, the way
// GOPROXY=file://dir reads it: <escaped module path>/@v/list, and
// <version>.info, .mod and .zip beside it. It returns the proxy's URL.
func writeProxy(r *repo, version, dir string) (string, error) {
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return "", err
	}
	for _, m := range r.published() {
		esc, err := module.EscapePath(m.Path)
		if err != nil {
			return "", err
		}
		escVersion, err := module.EscapeVersion(version)
		if err != nil {
			return "", err
		}
		vdir := filepath.Join(dir, filepath.FromSlash(esc), "@v")
		if err := os.MkdirAll(vdir, 0o755); err != nil {
			return "", err
		}
		gomod, err := r.readFile(path.Join(m.Dir, "go.mod"))
		if err != nil {
			return "", err
		}
		base := filepath.Join(vdir, escVersion)
		if err := writeFiles(map[string][]byte{
			filepath.Join(vdir, "list"): []byte(version + "\n"),
			base + ".info":              info,
			base + ".mod":               gomod,
		}); err != nil {
			return "", err
		}
		if err := writeZip(r, m, version, base+".zip"); err != nil {
			return "", err
		}
	}
	return (&url.URL{Scheme: "file", Path: filepath.ToSlash(dir)}).String(), nil
}

func writeFiles(files map[string][]byte) error {
	for name, data := range files {
		if err := os.WriteFile(name, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// writeZip writes the module zip of m at version: the files of its folder
// in the working tree, less what a module zip leaves out (nested modules,
// vendor folders), checked by the same code the go command uses.
func writeZip(r *repo, m *gomod, version, name string) error {
	var files []modzip.File
	for _, f := range r.files(m) {
		files = append(files, treeFile{
			rel: f,
			abs: filepath.Join(r.Dir, filepath.FromSlash(m.Dir), filepath.FromSlash(f)),
		})
	}
	return createFile(name, func(w io.Writer) error {
		return modzip.Create(w, module.Version{Path: m.Path, Version: version}, files)
	})
}

// createFile creates the file name with what write writes, and reports the
// first error, the close's included.
func createFile(name string, write func(io.Writer) error) (err error) {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	return write(f)
}

// treeFile is a file of the working tree, as golang.org/x/mod/zip reads it.
type treeFile struct{ rel, abs string }

func (f treeFile) Path() string                 { return f.rel }
func (f treeFile) Lstat() (os.FileInfo, error)  { return os.Lstat(f.abs) }
func (f treeFile) Open() (io.ReadCloser, error) { return os.Open(f.abs) }
