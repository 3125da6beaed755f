package main

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// A chart is one SVG file made from raw files of docs/bench.
type chart struct {
	file    string   // its name in the output directory
	sources []string // the raw files it reads, relative to docs/bench
	// make reads the raw files from dir and returns the figure.
	make func(dir string) (figure, error)
}

// charts are every chart the program makes, in the order BENCHMARKS.md
// shows them.
var charts = []chart{
	{file: "fanout-peers.svg", sources: []string{"peers-default.md"}, make: fanoutPeers},
	{file: "fanout-baselines.svg", sources: []string{"fanout.txt", "fanout-final.txt"}, make: fanoutBaselines},
	{file: "http-peers.svg", sources: []string{"peers-default.md"}, make: httpPeers},
	{file: "memory-per-connection.svg", sources: []string{"stream-cost-scale-floors.txt", "stream-cost-scale-detached.txt"}, make: memoryPerConnection},
}

// A figure is what a chart draws: panels of lines side by side, or one
// bar chart, with a legend of its series on the right.
type figure struct {
	panels []panel // line panels, log-log
	bars   *bars   // or a grouped bar chart
	ylabel string
	note   string // under the legend: where the data comes from
}

// A panel is one plot of lines against a numeric x.
type panel struct {
	title, xlabel string
	series        []series
}

// A series is one library's line: its median at each x, with the spread
// of the runs behind it as an error bar.
type series struct {
	name string
	pts  []point
}

type point struct{ x, y, lo, hi float64 }

// bars is a grouped bar chart: a group per implementation, a bar per
// metric.
type bars struct {
	groups  []string
	metrics []string
	values  [][]float64 // [metric][group]
}

// render makes every chart from the raw files in rawDir and returns the
// SVG bytes by file name, in the order of charts.
func render(rawDir string) ([]string, map[string][]byte, error) {
	var names []string
	out := map[string][]byte{}
	for _, c := range charts {
		f, err := c.make(rawDir)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", c.file, err)
		}
		b, err := f.svg()
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", c.file, err)
		}
		names = append(names, c.file)
		out[c.file] = b
	}
	return names, out, nil
}

func readFile(dir, name string) (*os.File, error) { return os.Open(filepath.Join(dir, name)) }

// fanoutPeers is the peer harness's in-process fan-out: ns per delivery
// against subscribers for every library, with a tight and with a
// closed-loop publisher (the default run in peers-default.md).
func fanoutPeers(dir string) (figure, error) {
	tables, err := harnessTables(dir, "peers-default.md")
	if err != nil {
		return figure{}, err
	}
	const run = "Default run (tight publisher for fan-out, stall and HTTP; queue 1024)"
	tight, err := harnessPanel(tables, run, "In-process fan-out", "tight publisher", "subscribers")
	if err != nil {
		return figure{}, err
	}
	closed, err := harnessPanel(tables, run, "In-process fan-out, closed-loop publisher", "closed-loop publisher (window 512)", "subscribers")
	if err != nil {
		return figure{}, err
	}
	return figure{
		panels: []panel{tight, closed},
		ylabel: "ns per delivery (log)",
		note:   "median of 3 runs, bars min-max;\ndocs/bench/peers-default.md,\nd4fe300 (AMD, 2 vCPU)",
	}, nil
}

// httpPeers is the peer harness over loopback HTTP: ns per delivered event
// against clients for every handler, tight and closed-loop publisher.
func httpPeers(dir string) (figure, error) {
	tables, err := harnessTables(dir, "peers-default.md")
	if err != nil {
		return figure{}, err
	}
	tight, err := harnessPanel(tables, "Default run (tight publisher for fan-out, stall and HTTP; queue 1024)",
		"HTTP over loopback", "tight publisher", "clients")
	if err != nil {
		return figure{}, err
	}
	closed, err := harnessPanel(tables, "HTTP with a closed-loop publisher (`go run . -scenarios http -http-window 512`)",
		"HTTP over loopback", "closed-loop publisher (window 512)", "clients")
	if err != nil {
		return figure{}, err
	}
	return figure{
		panels: []panel{tight, closed},
		ylabel: "ns per delivered event (log)",
		note:   "median of 2 runs, bars min-max;\ndocs/bench/peers-default.md,\nd4fe300 (AMD, 2 vCPU)",
	}, nil
}

func harnessTables(dir, name string) ([]harnessTable, error) {
	f, err := readFile(dir, name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := parseHarness(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return t, nil
}

// harnessPanel gathers the tables under the headings h2 and h3, one per
// size (the number their h4 starts with), into a line per library. A
// library's lossy or blocked cell is left out of its line.
func harnessPanel(tables []harnessTable, h2, h3, title, xlabel string) (panel, error) {
	p := panel{title: title, xlabel: xlabel}
	idx := map[string]int{}
	for _, t := range tables {
		if t.h2 != h2 || t.h3 != h3 {
			continue
		}
		x, err := leadingInt(t.h4)
		if err != nil {
			return p, err
		}
		for _, lib := range t.libs {
			i, ok := idx[lib]
			if !ok {
				i = len(p.series)
				idx[lib] = i
				p.series = append(p.series, series{name: lib})
			}
			if c := t.cells[lib]; c.ok {
				p.series[i].pts = append(p.series[i].pts, point{x: float64(x), y: c.median, lo: c.min, hi: c.max})
			}
		}
	}
	if len(p.series) == 0 {
		return p, fmt.Errorf("no tables under %q / %q", h2, h3)
	}
	return p, nil
}

// fanoutBaselines is BenchmarkFanout of the root module: eventbus against
// the naive channel bus and the naive bus that encodes with encoding/json,
// at bbac50f and at d4fe300, the median of 10 runs with their min-max.
func fanoutBaselines(dir string) (figure, error) {
	var panels []panel
	for _, src := range []struct{ file, title string }{
		{"fanout.txt", "bbac50f (fanout.txt)"},
		{"fanout-final.txt", "d4fe300 (fanout-final.txt)"},
	} {
		f, err := readFile(dir, src.file)
		if err != nil {
			return figure{}, err
		}
		bs, err := parseGoBench(f)
		f.Close()
		if err != nil {
			return figure{}, fmt.Errorf("%s: %w", src.file, err)
		}
		p := panel{title: src.title, xlabel: "subscribers"}
		type key struct {
			impl string
			subs int
		}
		runs := map[key][]float64{}
		var impls []string
		var subs []int
		for _, b := range bs {
			if !strings.HasPrefix(b.name, "BenchmarkFanout/") {
				continue
			}
			v, ok := b.values["ns/delivery"]
			if !ok {
				continue
			}
			n, err := strconv.Atoi(nameKey(b.name, "subs"))
			if err != nil {
				return figure{}, fmt.Errorf("%s: %s: %v", src.file, b.name, err)
			}
			impl := nameKey(b.name, "impl")
			if !slices.Contains(impls, impl) {
				impls = append(impls, impl)
			}
			if !slices.Contains(subs, n) {
				subs = append(subs, n)
			}
			runs[key{impl, n}] = append(runs[key{impl, n}], v)
		}
		for _, impl := range impls {
			s := series{name: impl}
			for _, n := range subs {
				if vs := runs[key{impl, n}]; len(vs) > 0 {
					med, lo, hi := median(vs)
					s.pts = append(s.pts, point{x: float64(n), y: med, lo: lo, hi: hi})
				}
			}
			p.series = append(p.series, s)
		}
		if len(p.series) == 0 {
			return figure{}, fmt.Errorf("%s: no BenchmarkFanout results", src.file)
		}
		panels = append(panels, p)
	}
	return figure{
		panels: panels,
		ylabel: "ns per delivery (log)",
		note:   "BenchmarkFanout, median of 10\nruns, bars min-max; AMD, 2 vCPU",
	}, nil
}

// memoryMetrics are the rows of the scale program charted per
// connection, with the name each gets in the legend.
var memoryMetrics = []struct{ row, name string }{
	{"goroutine stacks per conn (StackInuse, after GCs)", "goroutine stacks"},
	{"heap per conn (HeapInuse, after GCs)", "heap in use"},
	{"RSS per conn, after GCs", "RSS"},
}

// memoryPerConnection is what the server holds per idle connection at
// 10,000 connections (the scale program): goroutine stacks, heap and RSS,
// the median over the runs. eventbus, floor, floor-raw and naive come from
// the runs with the floors, sessiond from the runs with -impl all; a later
// file takes an implementation over an earlier one.
func memoryPerConnection(dir string) (figure, error) {
	order := []string{"eventbus", "sessiond", "naive", "floor", "floor-raw"}
	vals := map[string]map[string][]float64{} // impl → metric → runs
	// sessiond's runs first; the floors' runs then replace eventbus and naive.
	for _, name := range []string{"stream-cost-scale-detached.txt", "stream-cost-scale-floors.txt"} {
		f, err := readFile(dir, name)
		if err != nil {
			return figure{}, err
		}
		runs, err := parseScale(f)
		f.Close()
		if err != nil {
			return figure{}, fmt.Errorf("%s: %w", name, err)
		}
		if len(runs) == 0 {
			return figure{}, fmt.Errorf("%s: no run", name)
		}
		fresh := map[string]map[string][]float64{}
		for _, r := range runs {
			for _, impl := range r.impls {
				if fresh[impl] == nil {
					fresh[impl] = map[string][]float64{}
				}
				for _, m := range memoryMetrics {
					row, ok := r.rows[m.row]
					if !ok {
						return figure{}, fmt.Errorf("%s: no row %q", name, m.row)
					}
					v, err := kib(row[impl])
					if err != nil {
						return figure{}, fmt.Errorf("%s: %s, %s: %v", name, m.row, impl, err)
					}
					fresh[impl][m.row] = append(fresh[impl][m.row], v)
				}
			}
		}
		for impl, m := range fresh {
			vals[impl] = m
		}
	}
	b := &bars{}
	for _, impl := range order {
		if vals[impl] != nil {
			b.groups = append(b.groups, impl)
		}
	}
	if len(b.groups) != len(order) {
		return figure{}, fmt.Errorf("implementations found: %v, want %v", b.groups, order)
	}
	for _, m := range memoryMetrics {
		b.metrics = append(b.metrics, m.name)
		row := make([]float64, len(b.groups))
		for i, impl := range b.groups {
			row[i], _, _ = median(vals[impl][m.row])
		}
		b.values = append(b.values, row)
	}
	return figure{
		bars:   b,
		ylabel: "KiB per idle connection",
		note: "10,000 idle SSE connections,\nafter GCs, median of the runs:\n" +
			"stream-cost-scale-floors.txt (5),\nsessiond: ...-detached.txt (3)",
	}, nil
}

// Layout of every figure.
var (
	panelWidth  = 9 * vg.Centimeter
	legendWidth = 5.2 * vg.Centimeter
	figHeight   = 8.5 * vg.Centimeter
)

// styleOf gives each library the same colour and glyph in every chart.
func styleOf(name string) (color.Color, draw.GlyphDrawer, []vg.Length, vg.Length) {
	n := strings.ToLower(name)
	thin := vg.Points(1.2)
	dashed := []vg.Length{vg.Points(4), vg.Points(2)}
	switch {
	case strings.Contains(n, "eventbus"):
		return color.RGBA{R: 0x1f, G: 0x4e, B: 0xb4, A: 0xff}, draw.CircleGlyph{}, nil, vg.Points(2.4)
	case strings.Contains(n, "naive-encode"), strings.Contains(n, "flush per event"):
		return color.RGBA{R: 0x80, G: 0x80, B: 0x80, A: 0xff}, draw.TriangleGlyph{}, dashed, thin
	case strings.Contains(n, "naive"):
		return color.RGBA{R: 0x30, G: 0x30, B: 0x30, A: 0xff}, draw.BoxGlyph{}, nil, thin
	case strings.Contains(n, "cskr"):
		return color.RGBA{R: 0x2c, G: 0x9a, B: 0x40, A: 0xff}, draw.PyramidGlyph{}, nil, thin
	case strings.Contains(n, "go-sse"):
		return color.RGBA{R: 0xe0, G: 0x7b, B: 0x00, A: 0xff}, draw.SquareGlyph{}, nil, thin
	case strings.Contains(n, "r3labs"):
		return color.RGBA{R: 0xc0, G: 0x22, B: 0x22, A: 0xff}, draw.CrossGlyph{}, nil, thin
	}
	return color.Black, draw.RingGlyph{}, nil, thin
}

// barColors are the metrics' colours in a bar chart.
var barColors = []color.Color{
	color.RGBA{R: 0x9e, G: 0xb9, B: 0xe8, A: 0xff},
	color.RGBA{R: 0x4f, G: 0x7f, B: 0xd0, A: 0xff},
	color.RGBA{R: 0x1f, G: 0x3e, B: 0x8a, A: 0xff},
}

// svg draws the figure: its panels (or bars) from the left, the legend
// and the note in a column on the right.
func (f figure) svg() ([]byte, error) {
	cols := max(len(f.panels), 1)
	width := vg.Length(cols)*panelWidth + legendWidth
	if f.bars != nil {
		width = 2*panelWidth + legendWidth
	}
	c := vgsvg.New(width, figHeight)
	dc := draw.New(c)
	area := draw.Crop(dc, 0, -legendWidth, 0, 0)
	side := draw.Crop(dc, width-legendWidth, 0, 0, 0)
	leg := plot.NewLegend()
	leg.Top, leg.Left = true, true
	leg.YOffs = -vg.Points(16)
	leg.TextStyle.Font.Size = vg.Points(10)
	leg.Padding = vg.Points(5)
	var plots []*plot.Plot
	if f.bars != nil {
		p, err := f.barPlot(&leg)
		if err != nil {
			return nil, err
		}
		plots = []*plot.Plot{p}
	} else {
		for i, pn := range f.panels {
			p, err := f.linePlot(pn, i == 0, &leg)
			if err != nil {
				return nil, err
			}
			plots = append(plots, p)
		}
	}
	tiles := draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Millimeter * 4, PadTop: vg.Millimeter * 8,
		PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	canvases := plot.Align([][]*plot.Plot{plots}, tiles, area)
	title := leg.TextStyle
	title.Font.Size = vg.Points(11)
	title.XAlign = draw.XCenter
	for i, p := range plots {
		p.Draw(canvases[0][i])
		// The panel's title, drawn here so that every panel's is at the
		// same height whatever its axes need.
		if i < len(f.panels) {
			da := p.DataCanvas(canvases[0][i])
			area.FillText(title, vg.Point{X: (da.Min.X + da.Max.X) / 2, Y: area.Max.Y - vg.Millimeter*6}, f.panels[i].title)
		}
	}
	leg.Draw(side)
	sty := leg.TextStyle
	sty.Font.Size = vg.Points(8)
	sty.Color = color.Gray{Y: 0x50}
	lines := strings.Split(f.note, "\n")
	h := sty.Height("M") * 1.25
	for i, l := range lines {
		y := vg.Millimeter*4 + vg.Length(len(lines)-1-i)*h
		side.FillText(sty, vg.Point{X: side.Min.X + vg.Points(2), Y: side.Min.Y + y}, l)
	}
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// linePlot is one panel: log-log, each series a line through its medians
// with min-max error bars, the series of one x spread apart a little so
// that their bars do not hide each other.
func (f figure) linePlot(pn panel, first bool, leg *plot.Legend) (*plot.Plot, error) {
	p := plot.New()
	p.X.Label.Text = pn.xlabel + " (log)"
	if first {
		p.Y.Label.Text = f.ylabel
	}
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.Add(plotter.NewGrid())
	var xs []float64
	ylo, yhi := math.Inf(1), math.Inf(-1)
	n := len(pn.series)
	for i, s := range pn.series {
		if len(s.pts) == 0 {
			continue
		}
		dodge := math.Pow(1.07, float64(i)-float64(n-1)/2)
		xy := make(plotter.XYs, len(s.pts))
		errs := make(yErrs, len(s.pts))
		for j, pt := range s.pts {
			xy[j] = plotter.XY{X: pt.x * dodge, Y: pt.y}
			errs[j] = plotter.XY{X: pt.y - pt.lo, Y: pt.hi - pt.y}
			if !slices.Contains(xs, pt.x) {
				xs = append(xs, pt.x)
			}
			ylo, yhi = math.Min(ylo, pt.lo), math.Max(yhi, pt.hi)
		}
		line, scatter, err := plotter.NewLinePoints(xy)
		if err != nil {
			return nil, err
		}
		eb, err := plotter.NewYErrorBars(xyErrs{xy, errs})
		if err != nil {
			return nil, err
		}
		col, glyph, dashes, width := styleOf(s.name)
		line.Color, line.Width, line.Dashes = col, width, dashes
		scatter.Color, scatter.Shape, scatter.Radius = col, glyph, vg.Points(3)
		eb.Color, eb.Width, eb.CapWidth = col, vg.Points(0.8), vg.Points(4)
		p.Add(line, eb, scatter)
		if first {
			leg.Add(s.name, line, scatter)
		}
	}
	if len(xs) == 0 {
		return nil, fmt.Errorf("panel %q: nothing to plot", pn.title)
	}
	xmin, xmax := slicesMinMax(xs)
	p.X.Min, p.X.Max = xmin/1.6, xmax*1.6
	p.Y.Min, p.Y.Max = ylo/1.25, yhi*1.25
	p.X.Tick.Marker = plot.ConstantTicks(numTicks(xs))
	p.Y.Tick.Marker = ticks125{}
	return p, nil
}

// barPlot is the grouped bar chart, each bar labelled with its value.
func (f figure) barPlot(leg *plot.Legend) (*plot.Plot, error) {
	b := f.bars
	p := plot.New()
	p.Y.Label.Text = f.ylabel
	p.Add(plotter.NewGrid())
	w := vg.Points(16)
	m := len(b.metrics)
	ymax := 0.0
	for i, name := range b.metrics {
		bc, err := plotter.NewBarChart(plotter.Values(b.values[i]), w)
		if err != nil {
			return nil, err
		}
		bc.Color = barColors[i%len(barColors)]
		bc.LineStyle.Width = 0
		bc.Offset = w * vg.Length(float64(i)-float64(m-1)/2)
		p.Add(bc)
		leg.Add(name, bc)
		var lxy plotter.XYs
		var labels []string
		for g, v := range b.values[i] {
			lxy = append(lxy, plotter.XY{X: float64(g), Y: v})
			labels = append(labels, strconv.FormatFloat(v, 'f', 1, 64))
			ymax = math.Max(ymax, v)
		}
		l, err := plotter.NewLabels(plotter.XYLabels{XYs: lxy, Labels: labels})
		if err != nil {
			return nil, err
		}
		for j := range l.TextStyle {
			l.TextStyle[j].Font.Size = vg.Points(7)
			l.TextStyle[j].XAlign = draw.XCenter
		}
		l.Offset = vg.Point{X: bc.Offset, Y: vg.Points(2)}
		p.Add(l)
	}
	p.NominalX(b.groups...)
	p.Y.Min, p.Y.Max = 0, ymax*1.12
	return p, nil
}

// yErrs are error bars as (below, above) distances in X and Y.
type yErrs []plotter.XY

type xyErrs struct {
	plotter.XYs
	e yErrs
}

func (e xyErrs) YError(i int) (float64, float64) { return e.e[i].X, e.e[i].Y }

func slicesMinMax(xs []float64) (lo, hi float64) {
	lo, hi = xs[0], xs[0]
	for _, x := range xs {
		lo, hi = math.Min(lo, x), math.Max(hi, x)
	}
	return lo, hi
}

// numTicks labels exactly the sizes measured.
func numTicks(xs []float64) []plot.Tick {
	var t []plot.Tick
	for _, x := range xs {
		t = append(t, plot.Tick{Value: x, Label: strconv.FormatFloat(x, 'f', -1, 64)})
	}
	return t
}

// ticks125 marks 1, 2 and 5 times each power of ten in the range, a
// readable set on a log axis.
type ticks125 struct{}

func (ticks125) Ticks(lo, hi float64) []plot.Tick {
	var t []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= lo && v <= hi {
				t = append(t, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
			}
		}
	}
	return t
}
