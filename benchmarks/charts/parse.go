package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// A goBench is one result line of go test -bench output: its name
// without the -GOMAXPROCS suffix, and its value for each unit.
type goBench struct {
	name   string
	values map[string]float64
}

// parseGoBench reads go test -bench output and returns its result lines in
// order; everything else (headers, PASS, comments) is skipped.
func parseGoBench(r io.Reader) ([]goBench, error) {
	var out []goBench
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.ParseInt(f[1], 10, 64); err != nil {
			continue // a benchmark's own log line, not a result
		}
		if len(f)%2 != 0 {
			return nil, fmt.Errorf("line %d: a value without its unit: %q", n, sc.Text())
		}
		b := goBench{name: trimProcs(f[0]), values: map[string]float64{}}
		for i := 2; i < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("line %d: %v", n, err)
			}
			b.values[f[i+1]] = v
		}
		out = append(out, b)
	}
	return out, sc.Err()
}

var procsSuffix = regexp.MustCompile(`-\d+$`)

// trimProcs drops the -GOMAXPROCS suffix go test adds to a name.
func trimProcs(name string) string { return procsSuffix.ReplaceAllString(name, "") }

// nameKey returns the value of key in a benchmark name's sub-benchmark
// parts (key=value), or "" if there is none.
func nameKey(name, key string) string {
	for _, part := range strings.Split(name, "/") {
		if v, ok := strings.CutPrefix(part, key+"="); ok {
			return v
		}
	}
	return ""
}

// A cell is one figure of a harness table: the median, the spread of the
// runs behind it, and whether the run was clean. A run that lost, blocked
// or failed is not a speed: its figure is never plotted.
type cell struct {
	median, min, max float64
	ok               bool
}

// A harnessTable is one table of the peer harness's Markdown output: the
// headings above it and the figures of each library, in the table's order.
type harnessTable struct {
	h2, h3, h4 string
	libs       []string
	cells      map[string]cell
}

// parseHarness reads the peer harness's Markdown (go run . in benchmarks/,
// as kept in docs/bench/peers-default.md) and returns every table that has
// a library, result and ns/delivery column.
func parseHarness(r io.Reader) ([]harnessTable, error) {
	var (
		out        []harnessTable
		h2, h3, h4 string
		cur        *harnessTable
		cols       map[string]int
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "#### "):
			h4, cur = line[5:], nil
			continue
		case strings.HasPrefix(line, "### "):
			h3, h4, cur = line[4:], "", nil
			continue
		case strings.HasPrefix(line, "## "):
			h2, h3, h4, cur = line[3:], "", "", nil
			continue
		case !strings.HasPrefix(line, "|"):
			cur = nil
			continue
		}
		row := tableRow(line)
		if cur == nil {
			cols = map[string]int{}
			for i, c := range row {
				cols[c] = i
			}
			_, lib := cols["library"]
			_, res := cols["result"]
			_, ns := cols["ns/delivery"]
			_, spread := cols["(min-max)"]
			if !lib || !res || !ns || !spread {
				cols = nil
			}
			out = append(out, harnessTable{h2: h2, h3: h3, h4: h4, cells: map[string]cell{}})
			cur = &out[len(out)-1]
			continue
		}
		if cols == nil || isRule(row) {
			continue
		}
		if len(row) <= max(cols["ns/delivery"], cols["(min-max)"]) {
			return nil, fmt.Errorf("line %d: a short row: %q", n, line)
		}
		lib := row[cols["library"]]
		c := cell{ok: row[cols["result"]] == "ok"}
		var err error
		if c.ok {
			if c.median, err = strconv.ParseFloat(row[cols["ns/delivery"]], 64); err == nil {
				c.min, c.max, err = parseRange(row[cols["(min-max)"]])
			}
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %v", n, err)
		}
		cur.libs = append(cur.libs, lib)
		cur.cells[lib] = c
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	// Tables without the columns (the stalled subscriber's) are dropped.
	return slices.DeleteFunc(out, func(t harnessTable) bool { return len(t.libs) == 0 }), nil
}

// tableRow splits a Markdown table row into its trimmed cells.
func tableRow(line string) []string {
	line = strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|")
	cells := strings.Split(line, "|")
	for i, c := range cells {
		cells[i] = strings.TrimSpace(c)
	}
	return cells
}

// isRule reports whether a row is a table's header rule (|---|---:|).
func isRule(row []string) bool {
	for _, c := range row {
		if strings.Trim(c, "-:") != "" {
			return false
		}
	}
	return true
}

// parseRange parses "130.3-259.3".
func parseRange(s string) (lo, hi float64, err error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return 0, 0, fmt.Errorf("not a range: %q", s)
	}
	if lo, err = strconv.ParseFloat(a, 64); err == nil {
		hi, err = strconv.ParseFloat(b, 64)
	}
	return lo, hi, err
}

// leadingInt returns the number a heading starts with ("64 subscriber(s),
// 5000 events" → 64).
func leadingInt(s string) (int, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0, fmt.Errorf("no number in %q", s)
	}
	return strconv.Atoi(f[0])
}

// A scaleRun is one run's table of the scale program (benchmarks/scale):
// for each row, the figure of each implementation.
type scaleRun struct {
	impls []string
	rows  map[string]map[string]string
}

// scaleHeader is the first column's header of the scale program's table
// of one run (not of its spread over runs, which is a summary).
const scaleHeader = "per connection, or per fan-out (median of the rounds)"

// parseScale reads the scale program's Markdown output (several runs, with
// or without the progress lines) and returns each run's table. Columns of
// ratios (eventbus/naive) are not implementations and are left out.
func parseScale(r io.Reader) ([]scaleRun, error) {
	var (
		out  []scaleRun
		cur  *scaleRun
		cols []string
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "|") {
			cur = nil
			continue
		}
		row := tableRow(line)
		if cur == nil {
			if row[0] != scaleHeader {
				cols = nil
				cur = &scaleRun{} // another table: skipped to its end
				continue
			}
			cols = row
			out = append(out, scaleRun{rows: map[string]map[string]string{}})
			cur = &out[len(out)-1]
			for _, c := range row[1:] {
				if !strings.Contains(c, "/") {
					cur.impls = append(cur.impls, c)
				}
			}
			continue
		}
		if cols == nil || isRule(row) {
			continue
		}
		if len(row) != len(cols) {
			return nil, fmt.Errorf("line %d: %d cells under %d columns", n, len(row), len(cols))
		}
		vals := map[string]string{}
		for i, c := range cols[1:] {
			vals[c] = row[i+1]
		}
		cur.rows[row[0]] = vals
	}
	return out, sc.Err()
}

// kib parses a figure of the scale program such as "27.8 KiB".
func kib(s string) (float64, error) {
	v, ok := strings.CutSuffix(s, " KiB")
	if !ok {
		return 0, fmt.Errorf("not KiB: %q", s)
	}
	return strconv.ParseFloat(v, 64)
}

// median returns the median of vs (the mean of the middle two for an even
// count), and their minimum and maximum.
func median(vs []float64) (med, lo, hi float64) {
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		med = s[n/2]
	} else {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return med, s[0], s[n-1]
}
