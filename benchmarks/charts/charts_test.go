package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The committed raw files and charts, from this package's directory.
const (
	rawDir    = "../../docs/bench"
	chartsDir = "../../docs/bench/charts"
)

// TestCommittedChartsAreUpToDate: every SVG in docs/bench/charts is
// exactly what the program makes from the committed raw files, and none is
// there that it does not make. A chart edited by hand, or a raw file
// changed without `go run ./charts`, fails here.
func TestCommittedChartsAreUpToDate(t *testing.T) {
	if err := checkCharts(rawDir, chartsDir); err != nil {
		t.Fatal(err)
	}
}

// TestChartsFromCommittedRawFiles renders every chart into a temporary
// directory and reads each back as SVG: a well-formed document whose text
// names every series it should, from the raw files it names.
func TestChartsFromCommittedRawFiles(t *testing.T) {
	out := t.TempDir()
	if err := writeCharts(rawDir, out); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"fanout-peers.svg":          {"naive (RWMutex + chan)", "cskr/pubsub/v2", "tmaxmax/go-sse Joe", "r3labs/sse/v2", "eventbus", "tight publisher", "closed-loop publisher (window 512)"},
		"fanout-baselines.svg":      {"eventbus", "naive", "naive-encode", "bbac50f (fanout.txt)", "d4fe300 (fanout-final.txt)"},
		"http-peers.svg":            {"naive, flush per batch", "naive, flush per event", "r3labs/sse/v2 Server", "tmaxmax/go-sse Server", "eventbus Handler"},
		"memory-per-connection.svg": {"goroutine stacks", "heap in use", "RSS", "eventbus", "sessiond", "naive", "floor", "floor-raw", "27.8", "36.3"},
	}
	if len(want) != len(charts) {
		t.Fatalf("%d charts, %d checked", len(charts), len(want))
	}
	for _, c := range charts {
		b, err := os.ReadFile(filepath.Join(out, c.file))
		if err != nil {
			t.Fatal(err)
		}
		texts, err := svgTexts(b)
		if err != nil {
			t.Fatalf("%s: %v", c.file, err)
		}
		for _, w := range want[c.file] {
			if !slices.Contains(texts, w) {
				t.Errorf("%s: no text %q in %q", c.file, w, texts)
			}
		}
		for _, src := range c.sources {
			if _, err := os.Stat(filepath.Join(rawDir, src)); err != nil {
				t.Errorf("%s: its source: %v", c.file, err)
			}
		}
	}
}

// svgTexts checks that b is an SVG document and returns the content of
// its text elements.
func svgTexts(b []byte) ([]string, error) {
	d := xml.NewDecoder(bytes.NewReader(b))
	var (
		texts []string
		root  string
		in    bool
		cur   strings.Builder
	)
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
			}
			if tok.Name.Local == "text" {
				in = true
				cur.Reset()
			}
		case xml.CharData:
			if in {
				cur.Write(tok)
			}
		case xml.EndElement:
			if tok.Name.Local == "text" {
				in = false
				texts = append(texts, cur.String())
			}
		}
	}
	if root != "svg" {
		return nil, errors.New("not an SVG document: root " + root)
	}
	return texts, nil
}

// TestChartedFiguresAreTheRawFiles checks a few charted medians against
// the figures BENCHMARKS.md and benchstat give for the same raw files.
func TestChartedFiguresAreTheRawFiles(t *testing.T) {
	peers, err := fanoutPeers(rawDir)
	if err != nil {
		t.Fatal(err)
	}
	at := func(p panel, name string, x float64) point {
		t.Helper()
		for _, s := range p.series {
			if s.name != name {
				continue
			}
			for _, pt := range s.pts {
				if pt.x == x {
					return pt
				}
			}
		}
		t.Fatalf("panel %q: no %s at %v", p.title, name, x)
		return point{}
	}
	if pt := at(peers.panels[0], "eventbus", 64); pt != (point{x: 64, y: 46.1, lo: 44.4, hi: 47.4}) {
		t.Errorf("eventbus at 64, tight: %+v, want 46.1 (44.4-47.4)", pt)
	}
	if pt := at(peers.panels[1], "r3labs/sse/v2", 1000); pt.y != 211.3 {
		t.Errorf("r3labs at 1000, closed loop: %+v, want 211.3", pt)
	}
	base, err := fanoutBaselines(rawDir)
	if err != nil {
		t.Fatal(err)
	}
	// benchstat's medians of the same 10 runs: 439.35n at bbac50f,
	// 51.30n at d4fe300.
	if pt := at(base.panels[0], "eventbus", 1); !near(pt.y, 439.35) {
		t.Errorf("eventbus at 1 subscriber, bbac50f: %v, want 439.35", pt.y)
	}
	if pt := at(base.panels[1], "eventbus", 64); !near(pt.y, 51.30) {
		t.Errorf("eventbus at 64 subscribers, d4fe300: %v, want 51.30", pt.y)
	}
	mem, err := memoryPerConnection(rawDir)
	if err != nil {
		t.Fatal(err)
	}
	rss := mem.bars.values[slices.Index(mem.bars.metrics, "RSS")]
	for impl, want := range map[string]float64{"eventbus": 27.8, "sessiond": 29.7, "naive": 36.3, "floor": 26.9, "floor-raw": 1.4} {
		if got := rss[slices.Index(mem.bars.groups, impl)]; got != want {
			t.Errorf("RSS per connection of %s: %v KiB, want %v", impl, got, want)
		}
	}
}

func near(a, b float64) bool { return a-b < 0.005 && b-a < 0.005 }

func TestParseGoBench(t *testing.T) {
	in := `goos: linux
cpu: AMD EPYC
BenchmarkFanout/subs=64/impl=naive-encode-2   	 100	  78.2 ns/op	  78.18 ns/delivery	 240 B/op	 3 allocs/op
BenchmarkFanout/subs=64/impl=naive-encode-2   --- a log line
PASS
`
	bs, err := parseGoBench(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 1 {
		t.Fatalf("%d results, want 1: %+v", len(bs), bs)
	}
	b := bs[0]
	if b.name != "BenchmarkFanout/subs=64/impl=naive-encode" || b.values["ns/delivery"] != 78.18 || b.values["allocs/op"] != 3 {
		t.Errorf("%+v", b)
	}
	if nameKey(b.name, "impl") != "naive-encode" || nameKey(b.name, "subs") != "64" || nameKey(b.name, "lib") != "" {
		t.Errorf("keys of %s", b.name)
	}
	if _, err := parseGoBench(strings.NewReader("BenchmarkX-2 10 5 ns/op 7\n")); err == nil {
		t.Error("a value without its unit: no error")
	}
}

// A run that lost events is left out of its library's line: never drawn
// as a speed.
func TestHarnessPanelLeavesLossyRunsOut(t *testing.T) {
	in := `## Run
### In-process fan-out
#### 1 subscriber(s), 5000 events

| library | result | ns/delivery | (min-max) | allocs/event | delivered | notes |
|---|---|---:|---:|---:|---:|---|
| a | ok | 10.5 | 9.0-12.0 | 1.00 | 15000/15000 |  |
| b | lossy | (3.0) | 2.0-4.0 | 1.00 | 14000/15000 |  |

#### 64 subscriber(s), 5000 events

| library | result | ns/delivery | (min-max) | allocs/event | delivered | notes |
|---|---|---:|---:|---:|---:|---|
| a | ok | 5 | 4-6 | 1.00 | 1/1 |  |
| b | ok | 6 | 5-7 | 1.00 | 1/1 |  |

### Stalled subscriber

| library | publisher | healthy subscribers complete |
|---|---|---|
| a | **blocked** after 1 events | 0/63 |
`
	tables, err := parseHarness(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) != 2 {
		t.Fatalf("%d tables, want the 2 with ns/delivery", len(tables))
	}
	p, err := harnessPanel(tables, "Run", "In-process fan-out", "t", "subscribers")
	if err != nil {
		t.Fatal(err)
	}
	want := []series{
		{name: "a", pts: []point{{1, 10.5, 9, 12}, {64, 5, 4, 6}}},
		{name: "b", pts: []point{{64, 6, 5, 7}}},
	}
	if len(p.series) != 2 || !slices.Equal(p.series[0].pts, want[0].pts) || !slices.Equal(p.series[1].pts, want[1].pts) {
		t.Errorf("series %+v, want %+v", p.series, want)
	}
	if _, err := harnessPanel(tables, "Run", "HTTP", "t", "clients"); err == nil {
		t.Error("no such tables: no error")
	}
}

func TestParseScale(t *testing.T) {
	in := `run 1/1, eventbus: 10 connections
### Run 1 of 1 (eventbus first, then naive)

| per connection, or per fan-out (median of the rounds) | eventbus | naive | eventbus/naive |
|---|---:|---:|---:|
| RSS per conn, after GCs | 27.8 KiB | 36.3 KiB | 0.77x |

| round | eventbus | naive |
|---:|---|---|
| 1 | 1 ms | 2 ms |

### Spread over 1 runs: min-max (median)

| metric | eventbus | naive | eventbus/naive |
|---|---:|---:|---:|
| RSS per conn, after GCs | 27.8 KiB-27.8 KiB (27.8 KiB) | 36.3 KiB-36.3 KiB (36.3 KiB) | 0.77x-0.77x (0.77x) |
`
	runs, err := parseScale(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 1 || !slices.Equal(runs[0].impls, []string{"eventbus", "naive"}) || len(runs[0].rows) != 1 {
		t.Fatalf("%+v", runs)
	}
	if v, err := kib(runs[0].rows["RSS per conn, after GCs"]["naive"]); err != nil || v != 36.3 {
		t.Errorf("naive RSS %v, %v", v, err)
	}
	if _, err := kib("0.77x"); err == nil {
		t.Error("a ratio read as KiB")
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in           []float64
		med, lo, max float64
	}{
		{[]float64{3, 1, 2}, 2, 1, 3},
		{[]float64{4, 1, 3, 2}, 2.5, 1, 4},
		{[]float64{7}, 7, 7, 7},
	} {
		m, lo, hi := median(c.in)
		if m != c.med || lo != c.lo || hi != c.max {
			t.Errorf("median(%v) = %v, %v, %v", c.in, m, lo, hi)
		}
	}
}

// A chart left in the directory that no chart makes fails the check,
// and writing removes it.
func TestStaleChartIsFound(t *testing.T) {
	out := t.TempDir()
	if err := writeCharts(rawDir, out); err != nil {
		t.Fatal(err)
	}
	if err := checkCharts(rawDir, out); err != nil {
		t.Fatalf("fresh charts: %v", err)
	}
	if err := os.WriteFile(filepath.Join(out, "old.svg"), []byte("<svg/>"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := checkCharts(rawDir, out); err == nil || !strings.Contains(err.Error(), "old.svg") {
		t.Errorf("a stale chart: %v", err)
	}
	// An edited chart fails too.
	p := filepath.Join(out, charts[0].file)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, bytes.Replace(b, []byte("eventbus"), []byte("eventbux"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := checkCharts(rawDir, out); err == nil || !strings.Contains(err.Error(), charts[0].file) {
		t.Errorf("an edited chart: %v", err)
	}
	if err := writeCharts(rawDir, out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(out, "old.svg")); !os.IsNotExist(err) {
		t.Errorf("old.svg after writing: %v", err)
	}
	if err := checkCharts(rawDir, out); err != nil {
		t.Errorf("after writing: %v", err)
	}
}
