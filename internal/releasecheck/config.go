package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// config is what a command needs besides the repository.
type config struct {
	Repo        string   // the repository's root folder
	Unpublished []string // folders (slash-separated, relative to Repo) of modules nobody imports
	Version     string   // the release version the modules must require; "" takes theirs
	ToolDir     string   // this module's folder: where "go tool apidiff" resolves
	Keep        bool     // keep the temporary folder

	// Baseline is the folder of the API baseline, for when no release is
	// tagged: apidiff's export data of every published module (apidiff -m
	// -w) and of every internal package a published module imports from
	// another module (apidiff -w), one file each, named by repo.apiFile.
	Baseline string
	Out      io.Writer

	// FallbackProxy follows the local proxies in the consumers' GOPROXY:
	// third-party modules missing from the module cache come from it.
	// Empty means the environment's "go env GOPROXY".
	FallbackProxy string
	// ModCache is the module cache whose download folder serves the
	// consumers' third-party modules as a file proxy (never our own: the
	// consumers have a fresh cache of their own). Empty means "go env
	// GOMODCACHE".
	ModCache string
}

func (c *config) init() error {
	var err error
	if c.Repo, err = filepath.Abs(c.Repo); err != nil {
		return err
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	if c.FallbackProxy == "" {
		if c.FallbackProxy, err = goEnv("GOPROXY"); err != nil {
			return err
		}
	}
	if c.ModCache == "" {
		if c.ModCache, err = goEnv("GOMODCACHE"); err != nil {
			return err
		}
	}
	return nil
}

func (c *config) logf(format string, args ...any) {
	fmt.Fprintf(c.Out, format+"\n", args...)
}

// tempDir makes the folder a command works in and returns the function
// that removes it (or, with Keep, says where it is).
func (c *config) tempDir(name string) (string, func(), error) {
	dir, err := os.MkdirTemp("", "releasecheck-"+name+"-")
	if err != nil {
		return "", nil, err
	}
	return dir, func() {
		if c.Keep {
			c.logf("kept %s", dir)
			return
		}
		os.RemoveAll(dir)
	}, nil
}

func goEnv(name string) (string, error) {
	out, err := exec.Command("go", "env", name).Output()
	if err != nil {
		return "", fmt.Errorf("go env %s: %v", name, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// command runs name with args in dir, with the environment plus env (which
// wins), and returns its standard output; an error carries the command
// line and its standard error.
func command(ctx context.Context, dir string, env []string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("in %s: %s %s: %v\n%s", dir, name, strings.Join(args, " "), err, indent(stderr.String()))
	}
	return stdout.Bytes(), nil
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return ""
	}
	return "\t" + strings.ReplaceAll(s, "\n", "\n\t")
}
