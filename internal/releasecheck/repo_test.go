package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

func TestReleaseVersion(t *testing.T) {
	t.Parallel()
	const subReplace = "\nreplace example.com/lib => ../\n"
	tests := []struct {
		name    string
		sub     string // sub/go.mod after its module and go lines
		want    string // -version
		version string
		problem string // "" for none
	}{
		{name: "release", sub: "require example.com/lib v0.1.0\n" + subReplace, version: "v0.1.0"},
		{name: "asserted", sub: "require example.com/lib v0.1.0\n" + subReplace, want: "v0.1.0", version: "v0.1.0"},
		{name: "asserted other", sub: "require example.com/lib v0.1.0\n" + subReplace, want: "v0.2.0", version: "v0.2.0",
			problem: "sub/go.mod requires example.com/lib v0.1.0, want v0.2.0"},
		{name: "v0.0.0 beside a release", sub: "require example.com/lib v0.0.0\n" + subReplace, want: "v0.1.0", version: "v0.1.0",
			problem: "sub/go.mod requires example.com/lib v0.0.0, want v0.1.0"},
		{name: "no replace", sub: "require example.com/lib v0.1.0\n", version: "v0.1.0",
			problem: `sub/go.mod requires example.com/lib v0.1.0: want also "replace example.com/lib => .."`},
		{name: "replace elsewhere", sub: "require example.com/lib v0.1.0\n\nreplace example.com/lib => ../../lib\n", version: "v0.1.0",
			problem: `want also "replace example.com/lib => .."`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir, cfg := newFixture(t, map[string]string{
				"sub/go.mod": "module example.com/lib/sub\n\ngo 1.25\n\n" + tt.sub,
			}, new(bytes.Buffer))
			r, err := loadRepo(t.Context(), dir, cfg.Unpublished)
			if err != nil {
				t.Fatal(err)
			}
			version, problems := r.releaseVersion(tt.want)
			if version != tt.version {
				t.Errorf("version %q, want %q", version, tt.version)
			}
			if tt.problem == "" && len(problems) > 0 || tt.problem != "" && !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tt.problem) }) {
				t.Errorf("problems %q, want one with %q", problems, tt.problem)
			}
		})
	}
}

func TestReleaseVersionRefusesNonReleases(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"v0.0.0", "v0.0.0-00010101000000-000000000000"} {
		dir, cfg := newFixture(t, map[string]string{
			"sub/go.mod":     "module example.com/lib/sub\n\ngo 1.25\n\nrequire example.com/lib " + v + "\n\nreplace example.com/lib => ../\n",
			"harness/go.mod": "module example.com/lib/harness\n\ngo 1.25\n\nrequire example.com/lib " + v + "\n\nreplace example.com/lib => ../\n",
		}, new(bytes.Buffer))
		r, err := loadRepo(t.Context(), dir, cfg.Unpublished)
		if err != nil {
			t.Fatal(err)
		}
		if _, problems := r.releaseVersion(""); len(problems) == 0 {
			t.Errorf("every module requires the root at %s: no problem reported", v)
		}
	}
}

func TestLoadRepo(t *testing.T) {
	t.Parallel()
	dir, cfg := newFixture(t, nil, new(bytes.Buffer))
	r, err := loadRepo(t.Context(), dir, cfg.Unpublished)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range r.Modules {
		got = append(got, m.Dir+" "+m.Path)
	}
	want := []string{". example.com/lib", "harness example.com/lib/harness", "sub example.com/lib/sub"}
	if !slices.Equal(got, want) {
		t.Errorf("modules %q, want %q (root first, then by folder)", got, want)
	}
	if pub := r.published(); len(pub) != 2 || pub[0].Dir != "." || pub[1].Dir != "sub" {
		t.Errorf("published %v, want the root and sub", pub)
	}
	if slices.Contains(r.Files, "node_modules/ignored.js") {
		t.Error("a file git ignores is listed")
	}
	if o := r.owner("example.com/lib/sub/cmd/subcmd"); o == nil || o.Dir != "sub" {
		t.Errorf("owner of sub/cmd/subcmd: %v, want sub", o)
	}
	if _, err := loadRepo(t.Context(), dir, []string{"nope"}); err == nil {
		t.Error("-unpublished of a folder with no module: no error")
	}
}
