// Command releasecheck checks, before a release is tagged, that the modules
// of this repository install the way a user installs them, and that their
// API stays compatible with the last release (RELEASING.md).
//
// Usage, from this folder (it is its own module, so the library gains no
// dependency):
//
//	go run . [-repo DIR] [-unpublished DIRS] [-version V] [-keep] COMMAND
//
// The commands:
//
//	modules    every go.mod of the repository requires its sibling modules at
//	           one release version V, with a replace to the working tree; the
//	           published modules, zipped from the working tree at V, are served
//	           from a file module proxy, and one module outside the repository
//	           per published module go-gets it at V and builds a program that
//	           imports each of its packages (and its commands)
//	api        apidiff compares the API of every published module, and of the
//	           internal packages one module imports from another, with the last
//	           release tag (v*), or with the baseline in this folder's api/ when
//	           there is no tag yet; an incompatible change fails
//	check      both
//	write-api  re-cuts the baseline (api/) from the working tree
//
// The baseline lives in this module's folder, so that the root module's zip,
// which leaves nested modules out, does not carry it to every user.
//
// A module is published unless -unpublished names its folder (test harnesses
// that nobody imports). The release version V is the one the modules
// require; -version asserts it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
)

func main() {
	repoDir := flag.String("repo", "../..", "the repository's root folder")
	unpublished := flag.String("unpublished", "", "comma-separated folders of modules that are not published")
	version := flag.String("version", "", "the release version the modules must require (default: the one they require)")
	keep := flag.Bool("keep", false, "keep the temporary folder (proxy, consumers) and print its path")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: releasecheck [flags] modules|api|check|write-api\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	toolDir, err := os.Getwd()
	if err == nil {
		err = run(ctx, flag.Arg(0), config{
			Repo:        *repoDir,
			Unpublished: splitList(*unpublished),
			Version:     *version,
			ToolDir:     toolDir,
			Baseline:    filepath.Join(toolDir, "api"),
			Keep:        *keep,
			Out:         os.Stdout,
		})
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "releasecheck: %v\n", err)
		os.Exit(1)
	}
}

// run carries out one command; see the package doc.
func run(ctx context.Context, command string, cfg config) error {
	if err := cfg.init(); err != nil {
		return err
	}
	r, err := loadRepo(ctx, cfg.Repo, cfg.Unpublished)
	if err != nil {
		return err
	}
	switch command {
	case "modules":
		return checkModules(ctx, r, cfg)
	case "api":
		return checkAPI(ctx, r, cfg)
	case "check":
		// Both, whatever the first says: a release needs to know every
		// problem at once.
		return errors.Join(checkModules(ctx, r, cfg), checkAPI(ctx, r, cfg))
	case "write-api":
		return writeAPI(ctx, r, cfg)
	}
	return fmt.Errorf("unknown command %q (modules, api, check, write-api)", command)
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, filepath.ToSlash(filepath.Clean(f)))
		}
	}
	return out
}
