package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ssebus/eventbus/internal/benchkit"
)

// daemonConfig is the orchestration mode: start a daemon binary, burst
// against it, and watch its memory from outside.
type daemonConfig struct {
	bin  string   // the daemon's binary (cmd/sessiond built)
	args []string // its flags after "-addr 127.0.0.1:0"
	env  []string // added to this process's environment (besides GODEBUG=gctrace=1)
	// create is the session created with a POST before the burst; empty:
	// none (the burst's path names a session that does not exist).
	create string
	settle time.Duration // from the session's creation to the burst
	after  time.Duration // watched after the burst
	sample time.Duration // the RSS sampling interval
	// nudge: at the end, force nudgeCollections collections by allocating
	// in the daemon (POSTs of a 1 MiB body it refuses), to read the live
	// heap then.
	nudge bool
	// dump: end the daemon with SIGQUIT instead of SIGTERM, and count the
	// goroutines of the stack dump the runtime writes.
	dump    bool
	log     string // file for the daemon's whole stderr; empty: none
	samples string // CSV file of the RSS samples; empty: none
	label   string // the case's name in the report's table row
}

// rssSample is one reading of /proc/PID/status.
type rssSample struct {
	at       time.Duration // from the start of the burst (negative: before)
	rss, hwm int64         // VmRSS and VmHWM, bytes
}

// gcLine is one GODEBUG=gctrace=1 line of the daemon: its heap at the
// start of the collection, at the end of marking, and what was marked live,
// in MiB (the runtime's "MB" are 2^20 bytes).
type gcLine struct {
	num                 int
	before, after, live int64
	goal                int64
	forced              bool
	// at is when this process read the line, from the start of the
	// burst; inBurst: the line was read after the burst started (at is
	// set).
	at      time.Duration
	inBurst bool
}

var (
	gcHeapRe = regexp.MustCompile(`(\d+)->(\d+)->(\d+) MB, (\d+) MB goal`)
	gcNumRe  = regexp.MustCompile(`^gc (\d+) @`)
)

// parseGC parses a gctrace line; ok is false for any other line. The
// runtime writes a gctrace line in pieces, so a log line written at the
// same time can tear it in two: the part with the heap figures is taken
// wherever it is (its number is then -1).
func parseGC(line string) (g gcLine, ok bool) {
	m := gcHeapRe.FindStringSubmatch(line)
	if m == nil {
		return gcLine{}, false
	}
	n := func(s string) int64 { v, _ := strconv.ParseInt(s, 10, 64); return v }
	g = gcLine{num: -1, before: n(m[1]), after: n(m[2]), live: n(m[3]), goal: n(m[4]),
		forced: strings.Contains(line, "(forced)")}
	if m := gcNumRe.FindStringSubmatch(line); m != nil {
		g.num = int(n(m[1]))
	}
	return g, true
}

var addrRe = regexp.MustCompile(`\blistening\b.*\baddr=(\S+)`)

// parseListening returns the address of a daemon's "<name> listening
// addr=..." log line, or "".
func parseListening(line string) string {
	if m := addrRe.FindStringSubmatch(line); m != nil {
		return strings.Trim(m[1], `"`)
	}
	return ""
}

// parseStatus returns VmRSS and VmHWM of a /proc/PID/status, in bytes.
func parseStatus(b []byte) (rss, hwm int64, err error) {
	found := 0
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		var dst *int64
		switch {
		case bytes.HasPrefix(line, []byte("VmRSS:")):
			dst = &rss
		case bytes.HasPrefix(line, []byte("VmHWM:")):
			dst = &hwm
		default:
			continue
		}
		f := strings.Fields(string(line))
		if len(f) != 3 || f[2] != "kB" {
			return 0, 0, fmt.Errorf("unexpected status line %q", line)
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return 0, 0, err
		}
		*dst = v << 10
		found++
	}
	if found != 2 {
		return 0, 0, errors.New("no VmRSS and VmHWM in the status (not Linux?)")
	}
	return rss, hwm, nil
}

func readStatus(pid int) (rss, hwm int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	return parseStatus(b)
}

// daemonProc is the daemon process and what its stderr said.
type daemonProc struct {
	cmd  *exec.Cmd
	addr chan string
	exit chan struct{} // closed when stderr is done (the process ended)

	mu      sync.Mutex
	burst   time.Time // the start of the burst; zero before
	gcs     []gcLine
	lines   int64
	notable []string // the memory-limit line, warnings and errors (the first few)
	// dumping: SIGQUIT was sent; goroutines counts the goroutines of the
	// dump the runtime writes then.
	dumping    bool
	goroutines int

	stopOnce sync.Once
}

var goroutineRe = regexp.MustCompile(`^goroutine \d+ `)

func startDaemon(cfg daemonConfig) (*daemonProc, error) {
	args := append([]string{"-addr", "127.0.0.1:0"}, cfg.args...)
	cmd := exec.Command(cfg.bin, args...)
	env := append(os.Environ(), cfg.env...)
	godebug := "gctrace=1"
	if v := os.Getenv("GODEBUG"); v != "" {
		godebug = v + ",gctrace=1"
	}
	cmd.Env = append(env, "GODEBUG="+godebug)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = cmd.Stderr // nil: discarded
	var logw *bufio.Writer
	var logf *os.File
	if cfg.log != "" {
		if logf, err = os.Create(cfg.log); err != nil {
			return nil, err
		}
		logw = bufio.NewWriterSize(logf, 1<<20)
	}
	if err := cmd.Start(); err != nil {
		if logf != nil {
			logf.Close()
		}
		return nil, err
	}
	d := &daemonProc{cmd: cmd, addr: make(chan string, 1), exit: make(chan struct{})}
	go func() {
		defer close(d.exit)
		if logf != nil {
			defer logf.Close()
			defer logw.Flush()
		}
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		haveAddr := false
		for sc.Scan() {
			line := sc.Text()
			if logw != nil {
				logw.WriteString(line)
				logw.WriteByte('\n')
			}
			if g, ok := parseGC(line); ok {
				d.mu.Lock()
				if !d.burst.IsZero() {
					g.at = time.Since(d.burst)
					g.inBurst = true
				}
				d.gcs = append(d.gcs, g)
				d.mu.Unlock()
				continue
			}
			d.mu.Lock()
			if d.dumping && goroutineRe.MatchString(line) {
				d.goroutines++
			}
			d.lines++
			if strings.Contains(line, "memory limit") || (len(d.notable) < 8 &&
				(strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") || strings.Contains(line, "panic"))) {
				d.notable = append(d.notable, line)
			}
			d.mu.Unlock()
			if !haveAddr {
				if a := parseListening(line); a != "" {
					haveAddr = true
					d.addr <- a
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	return d, nil
}

// stop ends the daemon with SIGTERM, then SIGKILL after 15 s; once.
func (d *daemonProc) stop() { d.end(syscall.SIGTERM) }

// dump ends the daemon with SIGQUIT, at which the Go runtime writes every
// goroutine's stack to stderr and exits, and returns how many goroutines
// the dump shows (the runtime's own included), or -1 when the daemon had
// already ended.
func (d *daemonProc) dump() int {
	select {
	case <-d.exit:
		return -1
	default:
	}
	d.mu.Lock()
	d.dumping = true
	d.mu.Unlock()
	d.end(syscall.SIGQUIT)
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.goroutines
}

func (d *daemonProc) end(sig os.Signal) {
	d.stopOnce.Do(func() {
		_ = d.cmd.Process.Signal(sig)
		select {
		case <-d.exit:
		case <-time.After(15 * time.Second):
			_ = d.cmd.Process.Kill()
			<-d.exit
		}
		_ = d.cmd.Wait()
	})
}

func (d *daemonProc) gcCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.gcs)
}

// post sends a POST of body to url and returns its status.
func post(ctx context.Context, client *http.Client, url string, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// daemonReport is what one orchestrated case measured.
type daemonReport struct {
	label              string
	attack             attackResult
	burst              time.Duration // the burst's length as run
	loadStart, loadEnd string
	baseline           rssSample
	samples            []rssSample
	peak               int64 // VmHWM at the end of the watch
	gcs                []gcLine
	burstGCs           int
	burstMaxLive       int64
	burstLastLive      int64         // the last collection that started before the end of the burst
	nudgeAt            time.Duration // the nudge's start, from the burst's
	nudgeGCs           []gcLine      // the collections the nudge made (nudgeCollections, or fewer on failure)
	nudgeBytes         int64
	nudgeRSS           int64
	lines              int64
	notable            []string
	daemonArgs         []string
	nudgeErr           string
	goroutines         int // in the SIGQUIT dump at the end; -1: none taken
}

// at returns the sample closest to d after the burst's end.
func (r *daemonReport) at(d time.Duration) rssSample {
	want := r.burst + d
	best := rssSample{rss: -1}
	for _, s := range r.samples {
		if best.rss < 0 || absDur(s.at-want) < absDur(best.at-want) {
			best = s
		}
	}
	return best
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// runDaemon starts the daemon, creates the session, samples the daemon's
// RSS while the burst runs and for cfg.after after it, forces a
// collection (cfg.nudge) and stops the daemon.
func runDaemon(ctx context.Context, cfg daemonConfig, acfg attackConfig, progress io.Writer) (*daemonReport, error) {
	d, err := startDaemon(cfg)
	if err != nil {
		return nil, err
	}
	defer d.stop()
	select {
	case acfg.addr = <-d.addr:
	case <-d.exit:
		return nil, errors.New("the daemon ended before it listened")
	case <-time.After(15 * time.Second):
		return nil, errors.New("the daemon did not log its listen address in 15 s")
	}
	pid := d.cmd.Process.Pid
	fmt.Fprintf(progress, "daemon %s %s: pid %d, listening on %s\n", cfg.bin, strings.Join(cfg.args, " "), pid, acfg.addr)
	r := &daemonReport{label: cfg.label, daemonArgs: cfg.args}
	client := &http.Client{Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	base := "http://" + acfg.addr
	if cfg.create != "" {
		code, err := post(ctx, client, base+"/session/"+cfg.create+"/events", []byte(`{"type":"rapidreset","data":{"n":0}}`))
		if err != nil {
			return nil, fmt.Errorf("creating session %q: %w", cfg.create, err)
		}
		if code != http.StatusOK {
			return nil, fmt.Errorf("creating session %q: status %d", cfg.create, code)
		}
	}
	client.CloseIdleConnections()
	sleep(ctx, cfg.settle)

	// The sampler runs from just before the burst to the end of the watch.
	var (
		smu     sync.Mutex
		samples []rssSample
		t0      time.Time
	)
	rss, hwm, err := readStatus(pid)
	if err != nil {
		return nil, err
	}
	r.baseline = rssSample{rss: rss, hwm: hwm}
	r.loadStart = benchkit.LoadAvg()
	t0 = time.Now()
	d.mu.Lock()
	d.burst = t0
	d.mu.Unlock()
	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tk := time.NewTicker(cfg.sample)
		defer tk.Stop()
		for {
			rss, hwm, err := readStatus(pid)
			if err == nil {
				smu.Lock()
				samples = append(samples, rssSample{at: time.Since(t0), rss: rss, hwm: hwm})
				smu.Unlock()
			}
			select {
			case <-sampleCtx.Done():
				return
			case <-tk.C:
			}
		}
	}()
	fmt.Fprintf(progress, "burst: %d conns, %.0f streams/s, %v on %s\n", acfg.conns, acfg.rate, acfg.duration, acfg.path)
	res, err := attack(ctx, acfg)
	if err != nil {
		stopSampling()
		<-sampled
		return nil, err
	}
	r.attack = res
	r.burst = time.Since(t0)
	fmt.Fprintf(progress, "burst done: %.0f resets/s; watching %v\n", res.Rate(), cfg.after)
	sleep(ctx, cfg.after-(time.Since(t0)-r.burst))
	stopSampling()
	<-sampled
	if _, hwm, err := readStatus(pid); err == nil {
		r.peak = hwm
	}
	r.loadEnd = benchkit.LoadAvg()
	smu.Lock()
	r.samples = samples
	smu.Unlock()

	r.nudgeAt = time.Since(t0)
	if cfg.nudge {
		r.nudgeGCs, r.nudgeBytes, r.nudgeErr = nudge(ctx, d, client, base)
		if rss, _, err := readStatus(pid); err == nil {
			r.nudgeRSS = rss
		}
	}
	if cfg.samples != "" {
		if err := writeSamples(cfg.samples, r); err != nil {
			return nil, err
		}
	}

	d.mu.Lock()
	r.gcs = append([]gcLine(nil), d.gcs...)
	r.lines = d.lines
	r.notable = append([]string(nil), d.notable...)
	d.mu.Unlock()
	r.goroutines = -1
	if cfg.dump {
		r.goroutines = d.dump()
	}
	for _, g := range r.gcs {
		// A line read within 250 ms of the end is of a collection that
		// started in the burst.
		if !g.inBurst || g.at > min(r.burst+250*time.Millisecond, r.nudgeAt) {
			continue
		}
		r.burstGCs++
		r.burstMaxLive = max(r.burstMaxLive, g.live)
		r.burstLastLive = g.live
	}
	return r, nil
}

// nudgeBody is a JSON object the daemons refuse (400 invalid_body, an
// unknown field) after reading it whole: 1 MiB allocated and dropped.
var nudgeBody = func() []byte {
	b := []byte(`{"rapidresetNudge":"`)
	b = append(b, bytes.Repeat([]byte("x"), 1<<20-len(b)-2)...)
	return append(b, `"}`...)
}()

// nudgeCollections is how many collections the nudge makes: what a
// sync.Pool holds survives one collection (in its victim cache) and goes
// at the second, so the second's live heap is what the daemon keeps.
const nudgeCollections = 2

// nudge makes the daemon collect: it POSTs nudgeBody until the gctrace
// lines of nudgeCollections collections after the first POST have arrived
// (at most 4 GiB or 60 s), and returns those collections, and what failed.
func nudge(ctx context.Context, d *daemonProc, client *http.Client, base string) ([]gcLine, int64, string) {
	n0 := d.gcCount()
	got := func() []gcLine {
		d.mu.Lock()
		defer d.mu.Unlock()
		return append([]gcLine(nil), d.gcs[n0:]...)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var sent int64
	url := base + "/session/rapidreset-nudge/events"
	for sent < 4<<30 {
		if d.gcCount() >= n0+nudgeCollections {
			return got()[:nudgeCollections], sent, ""
		}
		code, err := post(ctx, client, url, nudgeBody)
		if err != nil {
			return got(), sent, err.Error()
		}
		if code != http.StatusBadRequest {
			return got(), sent, fmt.Sprintf("a nudge POST got status %d, not 400", code)
		}
		sent += int64(len(nudgeBody))
	}
	return got(), sent, fmt.Sprintf("fewer than %d collections after 4 GiB of refused bodies", nudgeCollections)
}

// nudged returns the last collection of a nudge that succeeded.
func (r *daemonReport) nudged() (gcLine, bool) {
	if r.nudgeErr != "" || len(r.nudgeGCs) == 0 {
		return gcLine{}, false
	}
	return r.nudgeGCs[len(r.nudgeGCs)-1], true
}

func writeSamples(path string, r *daemonReport) error {
	var b bytes.Buffer
	b.WriteString("seconds_from_burst_start,vmrss_kib,vmhwm_kib\n")
	for _, s := range r.samples {
		fmt.Fprintf(&b, "%.3f,%d,%d\n", s.at.Seconds(), s.rss>>10, s.hwm>>10)
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// tableHeader is the header of the rows tableRow writes.
const tableHeader = "| case | resets/s read by the server (sent; GOAWAYs; errors) | peak RSS (VmHWM) | RSS at end of burst | RSS +5 s | RSS +30 s | live heap, last GC of the burst (max) | live heap, 2nd GC forced at the end |\n" +
	"|---|---:|---:|---:|---:|---:|---:|---:|"

func (r *daemonReport) tableRow() string {
	nudge := "-"
	if g, ok := r.nudged(); ok {
		nudge = fmt.Sprintf("%d MiB (+%.0f s)", g.live, (g.at - r.burst).Seconds())
	}
	return fmt.Sprintf("| %s | %.0f (%.0f; %d; %d) | %s | %s | %s | %s | %d MiB (%d MiB) | %s |",
		r.label, r.attack.Rate(), r.attack.SentRate(), r.attack.GoAways, r.attack.Errors, mib(r.peak), mib(r.at(0).rss),
		mib(r.at(5*time.Second).rss), mib(r.at(30*time.Second).rss), r.burstLastLive, r.burstMaxLive, nudge)
}

func (r *daemonReport) write(w io.Writer, after time.Duration) {
	fmt.Fprintf(w, "== %s (daemon flags: %s)\n", r.label, strings.Join(r.daemonArgs, " "))
	fmt.Fprint(w, r.attack.String())
	fmt.Fprintf(w, "load average %s at the burst's start, %s at the end of the watch\n", r.loadStart, r.loadEnd)
	fmt.Fprintf(w, "RSS before the burst %s; peak (VmHWM) %s\n", mib(r.baseline.rss), mib(r.peak))
	fmt.Fprintln(w, "RSS from the end of the burst (the sample nearest):")
	offsets := []time.Duration{0}
	for _, d := range []time.Duration{time.Second, 5 * time.Second, 10 * time.Second, 20 * time.Second, 30 * time.Second, after} {
		if d <= after && d > offsets[len(offsets)-1] {
			offsets = append(offsets, d)
		}
	}
	for _, d := range offsets {
		s := r.at(d)
		fmt.Fprintf(w, "  %+5.1f s: %s (sample at %+.2f s)\n", d.Seconds(), mib(s.rss), (s.at - r.burst).Seconds())
	}
	fmt.Fprintf(w, "collections during the burst: %d; live heap at the last %d MiB, at most %d MiB\n", r.burstGCs, r.burstLastLive, r.burstMaxLive)
	fmt.Fprintln(w, "collections after the burst (s from its end: heap start->end->live MiB, goal):")
	for _, g := range r.gcs {
		if g.inBurst && g.at > r.burst {
			note := ""
			if g.forced {
				note = " (forced)"
			}
			if g.at >= r.nudgeAt {
				note += " (during the nudge)"
			}
			fmt.Fprintf(w, "  %+6.1f s: gc %d %d->%d->%d MiB, goal %d MiB%s\n", (g.at - r.burst).Seconds(), g.num, g.before, g.after, g.live, g.goal, note)
		}
	}
	switch {
	case r.nudgeErr == "" && len(r.nudgeGCs) > 0:
		lives := make([]string, len(r.nudgeGCs))
		for i, g := range r.nudgeGCs {
			lives[i] = fmt.Sprintf("%d MiB", g.live)
		}
		fmt.Fprintf(w, "%d collections forced at the end by %s of refused POST bodies: live heap %s; RSS after them %s\n",
			len(r.nudgeGCs), mib(r.nudgeBytes), strings.Join(lives, ", then "), mib(r.nudgeRSS))
	case r.nudgeErr != "":
		fmt.Fprintf(w, "the nudge failed: %s\n", r.nudgeErr)
	}
	if r.goroutines >= 0 {
		fmt.Fprintf(w, "goroutines at the end (the daemon's SIGQUIT dump, the runtime's own included): %d\n", r.goroutines)
	}
	fmt.Fprintf(w, "daemon log lines (besides gctrace): %d\n", r.lines)
	for _, l := range r.notable {
		if len(l) > 300 {
			l = l[:300] + "..."
		}
		fmt.Fprintf(w, "  %s\n", l)
	}
	fmt.Fprintln(w, tableHeader)
	fmt.Fprintln(w, r.tableRow())
}
