// Command benchmarks compares eventbus with peer Go pub/sub and SSE libraries
// on the same workloads and checks every delivery.
//
//	go run . [-events N] [-subs 1,64,1000] [-count 3] [-timeout 30s] ...
//
// It prints markdown tables. BENCHMARKS.md (repository root) has the recorded
// runs, docs/bench/peers-default.md their raw output.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ssebus/eventbus/internal/benchkit"
)

// libraries in report order; the eventbus adapters register themselves from
// their own file.
var (
	libraries = []library{
		{name: "naive (RWMutex + chan)", new: func(c config) fanout { return &naiveFanout{cfg: c} }},
		{name: "naive + eventbus Encoder", new: newNaiveEncoding},
		{name: "cskr/pubsub/v2", new: func(c config) fanout { return &pubsubFanout{cfg: c} }},
		{name: "tmaxmax/go-sse Joe", new: func(config) fanout { return &joeFanout{} }},
		{name: "r3labs/sse/v2", new: func(config) fanout { return &r3Fanout{} }},
	}
	httpLibraries = []httpLibrary{
		{name: "naive, flush per batch", new: naiveHTTP(false)},
		{name: "naive, flush per event", new: naiveHTTP(true)},
		{name: "r3labs/sse/v2 Server", new: r3labsHTTP},
		{name: "tmaxmax/go-sse Server", new: gosseHTTP},
	}
)

type httpLibrary struct {
	name string
	new  func(cfg config) *httpServer
}

func (h httpLibrary) asLibrary() library {
	return library{name: h.name, new: func(c config) fanout { return &httpFanout{newServer: h.new, cfg: c} }}
}

type flags struct {
	events      int
	subs        []int
	count       int
	timeout     time.Duration
	stall       time.Duration
	queue       int
	stallSubs   int
	stallEvents int
	httpEvents  int
	httpCount   int
	maxDeliv    int
	httpClients []int
	scenarios   []string
	libs        string
	window      int
	httpWindow  int
	pacedRates  []int
	pacedSubs   []int
	pacedHTTP   []int
	pacedCount  int
	pacedDur    time.Duration
	pacedModes  []string
	ring        int
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bad number %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func main() {
	var fl flags
	var subs, httpClients, scenarios, pacedRates, pacedSubs, pacedHTTP, pacedModes string
	flag.IntVar(&fl.events, "events", 5000, "events per in-process fan-out run")
	flag.StringVar(&subs, "subs", "1,64,1000", "subscriber counts for the in-process fan-out")
	flag.IntVar(&fl.count, "count", 3, "repetitions of each measured run (median reported)")
	flag.DurationVar(&fl.timeout, "timeout", 30*time.Second, "hard deadline of one run (watchdog)")
	flag.DurationVar(&fl.stall, "stall", 3*time.Second, "no progress at all for this long = blocked (watchdog)")
	flag.IntVar(&fl.ring, "ring", 0, "eventbus's RingSize (0: its default, 8000): under catch-up, how far behind a subscriber may fall (RingSize / rate is the time it covers)")
	flag.IntVar(&fl.queue, "queue", 1024, "per-subscriber buffer for the libraries that let us choose it (naive chan cap, pubsub cap, eventbus MaxQueued; max 2048)")
	flag.IntVar(&fl.stallSubs, "stall-subs", 64, "subscribers in the stalled-subscriber scenario (one of them never reads)")
	flag.IntVar(&fl.stallEvents, "stall-events", 5000, "events published in the stalled-subscriber scenario")
	flag.IntVar(&fl.maxDeliv, "max-deliveries", 2_000_000, "cap events x subscribers of one in-process run by using fewer events for large subscriber counts (never fewer than 2 x -queue, so overflow stays possible)")
	flag.IntVar(&fl.httpEvents, "http-events", 2000, "events per HTTP run (keep it above -queue, or a non-blocking bus can never overflow)")
	flag.IntVar(&fl.httpCount, "http-count", 2, "repetitions of each HTTP run")
	flag.IntVar(&fl.httpWindow, "http-window", 0, "closed-loop publisher window for the HTTP scenario (0: tight loop)")
	flag.StringVar(&httpClients, "http-clients", "16,256", "HTTP client counts")
	flag.IntVar(&fl.window, "window", 0, "closed-loop publisher window for the fanout-window scenario (0: half of -queue)")
	flag.StringVar(&pacedRates, "paced-rates", "1000,3000,10000,30000,100000,300000,1000000", "rates (events/s) the paced scenarios try, lowest first, until one is not sustained")
	flag.StringVar(&pacedSubs, "paced-subs", "1,64,1000", "subscriber counts of the in-process paced scenario")
	flag.StringVar(&pacedHTTP, "paced-http-clients", "16", "client counts of the paced HTTP scenario")
	flag.IntVar(&fl.pacedCount, "paced-count", 1, "runs per rate in the paced scenarios; a rate counts as sustained only when every run is lossless and keeps pace")
	flag.DurationVar(&fl.pacedDur, "paced-duration", 300*time.Millisecond, "length of one paced run (events = rate x duration, at least 2000)")
	flag.StringVar(&pacedModes, "paced-modes", "spin,burst,spin+pause,burst+pause", "publisher pace (spin: a spin-wait per event; burst: sleep between 1 ms bursts; sleep: sleep until each event; yield: runtime.Gosched until each event), +pause: subscribers pause 2-5 ms about every 50 ms")
	flag.StringVar(&scenarios, "scenarios", "fanout,fanout-window,stall,http,paced,paced-http", "scenarios to run: fanout (tight publisher), fanout-window (publisher at most -window events ahead of the slowest subscriber), stall, http, paced (a publisher at a fixed rate, in process), paced-http")
	flag.StringVar(&fl.libs, "libs", "", "only libraries whose name contains one of these comma-separated substrings")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	var err error
	if fl.subs, err = parseInts(subs); err != nil {
		fatal(err)
	}
	if fl.httpClients, err = parseInts(httpClients); err != nil {
		fatal(err)
	}
	if fl.pacedRates, err = parseInts(pacedRates); err != nil {
		fatal(err)
	}
	if fl.pacedSubs, err = parseInts(pacedSubs); err != nil {
		fatal(err)
	}
	if fl.pacedHTTP, err = parseInts(pacedHTTP); err != nil {
		fatal(err)
	}
	fl.pacedModes = strings.Split(pacedModes, ",")
	for _, m := range fl.pacedModes {
		if _, ok := pacerOf(m); !ok {
			fatal(fmt.Errorf("bad -paced-modes entry %q", m))
		}
	}
	fl.scenarios = strings.Split(scenarios, ",")
	if fl.queue < 1 || fl.queue > 2048 || fl.count < 1 || fl.httpCount < 1 || fl.events < 1 || fl.stallSubs < 2 {
		fatal(fmt.Errorf("bad flags"))
	}
	if fl.window <= 0 {
		fl.window = fl.queue / 2
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fatal(err)
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	run(os.Stdout, fl)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "benchmarks:", err)
	os.Exit(2)
}

func selected(name, filter string) bool {
	if filter == "" {
		return true
	}
	for _, f := range strings.Split(filter, ",") {
		if f != "" && strings.Contains(strings.ToLower(name), strings.ToLower(f)) {
			return true
		}
	}
	return false
}

func run(w io.Writer, fl flags) {
	start := time.Now()
	cfg := config{queue: fl.queue, ring: fl.ring}
	o := runOpts{timeout: fl.timeout, stall: fl.stall, stopMax: 5 * time.Second}
	fmt.Fprintf(w, "# eventbus peer comparison\n\n")
	fmt.Fprintf(w, "%s, GOOS/GOARCH %s/%s, NumCPU %d, GOMAXPROCS %d, CPU %q\n\n", runtime.Version(), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), cpuModel())
	fmt.Fprintf(w, "load average at start: %s\n\n", benchkit.LoadAvg())
	fmt.Fprintf(w, "flags: -events %d -subs %s -count %d -timeout %s -stall %s -queue %d -ring %d -window %d -stall-subs %d -stall-events %d -max-deliveries %d -http-events %d -http-count %d -http-window %d -http-clients %s -paced-rates %s -paced-subs %s -paced-http-clients %s -paced-count %d -paced-duration %s -paced-modes %s -scenarios %s\n\n",
		fl.events, joinInts(fl.subs), fl.count, fl.timeout, fl.stall, fl.queue, fl.ring, fl.window, fl.stallSubs, fl.stallEvents, fl.maxDeliv, fl.httpEvents, fl.httpCount, fl.httpWindow, joinInts(fl.httpClients),
		joinInts(fl.pacedRates), joinInts(fl.pacedSubs), joinInts(fl.pacedHTTP), fl.pacedCount, fl.pacedDur, strings.Join(fl.pacedModes, ","), strings.Join(fl.scenarios, ","))

	if slices.Contains(fl.scenarios, "fanout") {
		fmt.Fprintf(w, "## In-process fan-out\n\n")
		fmt.Fprintf(w, "One publisher in a tight loop, N subscribers each draining in its own goroutine; median of %d runs.\n", fl.count)
		fmt.Fprintf(w, "ns/delivery = wall time / (events x subscribers); allocs/event = Mallocs delta / events (whole process).\n\n")
		for _, n := range fl.subs {
			fmt.Fprintf(w, "### %d subscriber(s), %d events\n\n", n, fl.eventsFor(n))
			printRuns(w, runAll(libraries, cfg, n, fl.eventsFor(n), fl.count, o, fl.libs))
		}
	}
	if slices.Contains(fl.scenarios, "fanout-window") {
		fmt.Fprintf(w, "## In-process fan-out, closed-loop publisher\n\n")
		fmt.Fprintf(w, "Same workload, but the publisher never runs more than %d events ahead of the slowest subscriber "+
			"(checked every 32 events against progress published every 64 deliveries; while ahead it yields, then sleeps 20µs at a time). "+
			"This is the fair comparison for a bus whose Publish never blocks.\n\n", fl.window)
		wo := o
		wo.window = fl.window
		for _, n := range fl.subs {
			fmt.Fprintf(w, "### %d subscriber(s), %d events, window %d\n\n", n, fl.eventsFor(n), fl.window)
			printRuns(w, runAll(libraries, cfg, n, fl.eventsFor(n), fl.count, wo, fl.libs))
		}
	}
	if slices.Contains(fl.scenarios, "stall") {
		fmt.Fprintf(w, "## Stalled subscriber\n\n")
		fmt.Fprintf(w, "%d subscribers, one never reads; %d events published in a tight loop. "+
			"\"blocked\" = the publisher made no progress for 1s. Healthy = got every event the publisher managed to publish, once, in order.\n\n",
			fl.stallSubs, fl.stallEvents)
		fmt.Fprintf(w, "| library | publisher | healthy subscribers complete | fewest events a healthy one had | stalled one evicted | stalled one, once released, received |\n")
		fmt.Fprintf(w, "|---|---|---|---|---|---|\n")
		for _, lib := range libraries {
			if !selected(lib.name, fl.libs) {
				continue
			}
			r := runStall(lib, cfg, fl.stallSubs, fl.stallEvents, time.Second, 5*time.Second)
			printStall(w, r)
		}
		fmt.Fprintln(w)
	}
	if slices.Contains(fl.scenarios, "http") {
		fmt.Fprintf(w, "## HTTP over loopback\n\n")
		mode := "tight publish loop"
		ho := o
		if fl.httpWindow > 0 {
			ho.window = fl.httpWindow
			mode = fmt.Sprintf("closed-loop publisher, window %d", fl.httpWindow)
		}
		fmt.Fprintf(w, "One publisher (%s), N HTTP clients on 127.0.0.1 parsing SSE and checking every id; %d events; median of %d runs. "+
			"ns/delivery = wall / (events x clients); allocs/event counts server and clients (same process).\n\n", mode, fl.httpEvents, fl.httpCount)
		var libs []library
		for _, h := range httpLibraries {
			libs = append(libs, h.asLibrary())
		}
		for _, n := range fl.httpClients {
			fmt.Fprintf(w, "### %d clients\n\n", n)
			printRuns(w, runAll(libs, cfg, n, fl.httpEvents, fl.httpCount, ho, fl.libs))
		}
	}
	if slices.Contains(fl.scenarios, "paced") {
		fmt.Fprintf(w, "## Paced publisher, in process\n\n")
		fmt.Fprintf(w, "One publisher at a fixed rate, N subscribers, every delivery checked; a rate is sustained when nothing is lost "+
			"(no gap, no duplicate, no stream ended early) in each of %d run(s) of %s and the publisher achieved 95%% of it. "+
			"Latency: from just before publish to the subscriber, every 8th event. Rates tried: %s.\n\n", fl.pacedCount, fl.pacedDur, joinInts(fl.pacedRates))
		for _, n := range fl.pacedSubs {
			for _, mode := range fl.pacedModes {
				fmt.Fprintf(w, "### %d subscriber(s), %s (load average %s)\n\n", n, pacedModeName(mode), benchkit.LoadAvg())
				runPacedTable(w, libraries, cfg, n, mode, fl)
			}
		}
	}
	if slices.Contains(fl.scenarios, "paced-http") {
		fmt.Fprintf(w, "## Paced publisher, HTTP over loopback\n\n")
		var libs []library
		for _, h := range httpLibraries {
			libs = append(libs, h.asLibrary())
		}
		for _, n := range fl.pacedHTTP {
			for _, mode := range fl.pacedModes {
				fmt.Fprintf(w, "### %d clients, %s (load average %s)\n\n", n, pacedModeName(mode), benchkit.LoadAvg())
				runPacedTable(w, libs, cfg, n, mode, fl)
			}
		}
	}
	fmt.Fprintf(w, "total run time: %s; load average at end: %s\n", time.Since(start).Round(100*time.Millisecond), benchkit.LoadAvg())
}

// pacerOf is the publisher's pacer of a -paced-modes entry.
func pacerOf(mode string) (benchkit.Pacer, bool) {
	for _, p := range []benchkit.Pacer{benchkit.Spin, benchkit.Burst, benchkit.Sleep, benchkit.Yield} {
		if mode == p.String() || mode == p.String()+"+pause" {
			return p, true
		}
	}
	return 0, false
}

func pacedModeName(mode string) string {
	p, _ := pacerOf(mode)
	name := map[benchkit.Pacer]string{
		benchkit.Spin:  "spin-wait pace",
		benchkit.Burst: "1 ms bursts with sleeps",
		benchkit.Sleep: "a sleep until each event",
		benchkit.Yield: "runtime.Gosched until each event",
	}[p]
	if strings.HasSuffix(mode, "+pause") {
		name += ", subscribers pausing 2-5 ms every 20-80 ms"
	}
	return name
}

func runPacedTable(w io.Writer, libs []library, cfg config, subs int, mode string, fl flags) {
	pacer, _ := pacerOf(mode)
	o := pacedOpts{pacer: pacer, pause: strings.HasSuffix(mode, "+pause"),
		duration: fl.pacedDur, settle: 3 * time.Second}
	var rows []pacedRow
	var names []string
	for _, lib := range libs {
		if !selected(lib.name, fl.libs) {
			continue
		}
		rows = append(rows, sweepPaced(lib, cfg, subs, fl.pacedRates, fl.pacedCount, o))
		names = append(names, lib.name)
	}
	printPaced(w, rows, names)
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "n/a"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "n/a"
}

// eventsFor is the number of events of one in-process run with subs
// subscribers: -events, lowered to keep events x subs near -max-deliveries,
// but never below 2 x -queue (or -events if that is smaller).
func (fl flags) eventsFor(subs int) int {
	e := fl.events
	if fl.maxDeliv > 0 && e*subs > fl.maxDeliv {
		e = max(fl.maxDeliv/subs, min(fl.events, 2*fl.queue))
	}
	return e
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

type aggregate struct {
	lib      string
	runs     []result
	okRuns   int
	worst    result
	medianNs float64
	minNs    float64
	maxNs    float64
	medAlloc float64
}

func runAll(libs []library, cfg config, subs, events, count int, o runOpts, filter string) []aggregate {
	var out []aggregate
	for _, lib := range libs {
		if !selected(lib.name, filter) {
			continue
		}
		a := aggregate{lib: lib.name}
		for range count {
			r := runFanout(lib, cfg, subs, events, o)
			a.runs = append(a.runs, r)
			if r.status == statusOK {
				a.okRuns++
			} else if a.worst.status == "" || a.worst.status == statusOK {
				a.worst = r
			}
			if r.status == statusBlocked || r.status == statusError {
				break // do not wait for the watchdog again
			}
		}
		if a.worst.status == "" {
			a.worst = a.runs[0]
		}
		ns := make([]float64, len(a.runs))
		al := make([]float64, len(a.runs))
		for i, r := range a.runs {
			ns[i], al[i] = r.nsPerDelivery, r.allocsPerEvent
		}
		slices.Sort(ns)
		slices.Sort(al)
		a.medianNs, a.minNs, a.maxNs = median(ns), ns[0], ns[len(ns)-1]
		a.medAlloc = median(al)
		out = append(out, a)
	}
	return out
}

// median of a sorted slice (mean of the middle two for an even length).
func median(v []float64) float64 {
	return (v[(len(v)-1)/2] + v[len(v)/2]) / 2
}

func printRuns(w io.Writer, aggs []aggregate) {
	fmt.Fprintf(w, "| library | result | ns/delivery | (min-max) | allocs/event | delivered | notes |\n")
	fmt.Fprintf(w, "|---|---|---:|---:|---:|---:|---|\n")
	for _, a := range aggs {
		res := string(statusOK)
		if a.okRuns != len(a.runs) {
			res = fmt.Sprintf("**%s** (%d/%d runs ok)", a.worst.status, a.okRuns, len(a.runs))
		}
		ns := fmt.Sprintf("%.1f", a.medianNs)
		if a.okRuns != len(a.runs) {
			ns = "(" + ns + ")" // not comparable: the run did not deliver everything
		}
		var delivered, want, warnings, missing, dup uint64
		ended, evicted := 0, 0
		for _, r := range a.runs {
			delivered += r.delivered
			want += uint64(r.events * r.subs)
			warnings += r.warnings
			missing += r.missing
			dup += r.dup
			ended += r.ended
			evicted += r.evicted
		}
		notes := ""
		switch a.worst.status {
		case statusLossy:
			notes = fmt.Sprintf("all runs: missing %d, dup/reordered %d, %d subscriber streams ended early (%d evicted)", missing, dup, ended, evicted)
		case statusOK:
		default:
			notes = a.worst.detail
		}
		if warnings > 0 {
			notes = strings.TrimSpace(notes + fmt.Sprintf("; %d slow_client_warning frames", warnings))
			notes = strings.TrimPrefix(notes, "; ")
		}
		fmt.Fprintf(w, "| %s | %s | %s | %.1f-%.1f | %.2f | %d/%d | %s |\n",
			a.lib, res, ns, a.minNs, a.maxNs, a.medAlloc, delivered, want, notes)
	}
	fmt.Fprintln(w)
}

func printStall(w io.Writer, r stallResult) {
	pub := fmt.Sprintf("never blocked (published all %d)", r.publishedBefore)
	if r.publisherBlock {
		pub = fmt.Sprintf("**blocked** after %d events", r.publishedBefore)
	}
	ev := "no"
	if r.stalledEvicted {
		ev = "yes"
	}
	stalled := fmt.Sprintf("%d", r.stalledGot)
	if r.stalledReason != "" && r.stalledReason != "closed" {
		stalled += " then " + r.stalledReason
	}
	if r.hung {
		fmt.Fprintf(w, "| %s | %s | ? | %d | ? | teardown hung %s |\n", r.lib, pub, r.healthyMin, r.detail)
		return
	}
	fmt.Fprintf(w, "| %s | %s | %d/%d | %d | %s | %s |\n", r.lib, pub, r.healthyAll, r.healthyTotal, r.healthyMin, ev, stalled)
}
