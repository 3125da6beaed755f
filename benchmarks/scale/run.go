//go:build linux

package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ssebus/eventbus/internal/benchkit"
)

// config is one invocation's settings (the flags).
type config struct {
	conns, sessions int
	heartbeat, idle time.Duration
	fanouts         int
	impls           []string // in the first run's order
	runs            int
	settle          time.Duration // after the last connect, before the stats
	fanoutTimeout   time.Duration // per round
	roundGap        time.Duration // between fan-out rounds
	inflight        int           // connects in flight
	jsonLines       bool
	cpuProfile      string // the child's CPU profile file (per impl and run)
	stackProfile    string // the child's goroutine profile file (per impl and run)
	// sessiondBin is the cmd/sessiond binary -impl sessiond runs: given
	// by -sessiond-bin, else built by run.
	sessiondBin string

	exe      string   // the program the children run
	childEnv []string // added to the children's environment
}

// fdMargin is what a process needs beside its connections: stdio, the
// pipes to the child, listeners, the control connections, the poller.
const fdMargin = 64

// checkFiles refuses a connection count that the descriptor limit cannot
// hold. Go raises the soft RLIMIT_NOFILE to the hard limit at start (in
// this process and in the child alike), so the hard limit is what counts.
func checkFiles(conns int) error {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return fmt.Errorf("reading RLIMIT_NOFILE: %w", err)
	}
	if need := uint64(conns) + fdMargin; need > rl.Cur {
		most := int64(rl.Cur) - fdMargin
		return fmt.Errorf("-conns %d needs about %d open files in each process, and RLIMIT_NOFILE allows %d here: at most %d connections are possible (raise the hard limit to go further: ulimit -Hn as root, LimitNOFILE= under systemd)",
			conns, need, rl.Cur, max(most, 0))
	}
	return nil
}

// roundResult is one fan-out round of one implementation.
type roundResult struct {
	FirstMicros  float64 `json:"first_us"`   // the first client reached, from the event's timestamp
	P50Micros    float64 `json:"p50_us"`     // the median client
	P99Micros    float64 `json:"p99_us"`     // the 99th percentile
	LastMicros   float64 `json:"last_us"`    // the last client reached
	LoopMicros   float64 `json:"loop_us"`    // the server's publish loop, S publishes
	Delivered    int     `json:"delivered"`  // connections that got the event in time
	Missing      int     `json:"missing"`    // connections that did not
	SentMismatch int     `json:"mismatched"` // events whose timestamp is not the round's
	// CPU over the round, from before the publish to the last delivery
	// seen: the server's (user+system, its stats before and after) and
	// this process's, every client's reading included.
	ServerCPUMicros float64 `json:"server_cpu_us"`
	ClientCPUMicros float64 `json:"client_cpu_us"`
	WaitedSeconds   float64 `json:"waited_s"` // until every client had it, or the timeout
	// Heartbeats is how many heartbeat lines the clients received from the
	// publish until the round ended: work the server did beside the
	// fan-out, which differs by design (see the package doc).
	Heartbeats int64 `json:"heartbeats"`
}

// implResult is one implementation's measurement in one run, also its
// JSON line (-json). Per-connection figures are (after - baseline) / conns.
type implResult struct {
	Impl string `json:"impl"`
	Run  int    `json:"run"`
	// Binary is sessiond's binary and command line (-impl sessiond).
	Binary   string `json:"binary,omitempty"`
	Conns    int    `json:"conns"`
	Sessions int    `json:"sessions"`

	ConnectSeconds float64     `json:"connect_s"`
	Baseline       serverStats `json:"baseline"`
	Connected      serverStats `json:"connected"`

	StackPerConn         float64 `json:"stack_per_conn"`           // bytes, StackInuse after the collections
	StackBeforeGCPerConn float64 `json:"stack_before_gc_per_conn"` // bytes, StackInuse as found
	HeapPerConn          float64 `json:"heap_per_conn"`            // bytes, HeapInuse after the collections
	RSSPerConn           float64 `json:"rss_per_conn"`             // bytes, VmRSS after the collections
	RSSFreedPerConn      float64 `json:"rss_freed_per_conn"`       // bytes, VmRSS after FreeOSMemory
	GoroutinesPerConn    float64 `json:"goroutines_per_conn"`

	// After the fan-outs, the same collections again: what a delivery
	// left behind (a stack that grew on the write path and cannot shrink).
	AfterFanout             serverStats `json:"after_fanout"`
	StackAfterFanoutPerConn float64     `json:"stack_after_fanout_per_conn"`
	HeapAfterFanoutPerConn  float64     `json:"heap_after_fanout_per_conn"`

	IdleSeconds        float64 `json:"idle_s"`            // the heartbeat window, server wall time
	HeartbeatCPU       float64 `json:"heartbeat_cpu"`     // µs of server CPU per second per 1000 connections
	HeartbeatsMean     float64 `json:"heartbeats_mean"`   // per connection in the window
	HeartbeatsMin      int64   `json:"heartbeats_min"`    //
	HeartbeatsMax      int64   `json:"heartbeats_max"`    //
	HeartbeatsExpected float64 `json:"heartbeats_expect"` // idle / heartbeat

	Rounds             []roundResult `json:"rounds"`
	FirstMicros        float64       `json:"first_us"` // medians over the rounds
	P50Micros          float64       `json:"p50_us"`
	P99Micros          float64       `json:"p99_us"`
	LastMicros         float64       `json:"last_us"`
	LoopMicros         float64       `json:"loop_us"`
	HeartbeatsPerRound float64       `json:"heartbeats_per_round"` // median
	// CPU per delivery of a round (the round's CPU over the connections
	// reached), median of the rounds, in µs: the server's and the clients'.
	ServerCPUPerDelivery float64 `json:"server_cpu_per_delivery_us"`
	ClientCPUPerDelivery float64 `json:"client_cpu_per_delivery_us"`
	BytesPerFrame        float64 `json:"bytes_per_frame"`
	Lost                 int     `json:"lost"`       // deliveries missing after the timeout, every round
	Ended                int     `json:"ended"`      // connections whose stream ended early
	Unexpected           int64   `json:"unexpected"` // frames that were no round's event, or repeats
	LoadStart            string  `json:"load_start"` // /proc/loadavg
	LoadEnd              string  `json:"load_end"`
}

// runResult is one run: every implementation, in the order measured.
type runResult struct {
	Index   int
	Order   []string
	Results map[string]*implResult
}

// run measures cfg.runs runs, alternating the implementations' order from
// run to run, and writes each run's report to out as it ends, then the
// spread over the runs; progress goes to logw.
func run(cfg config, out, logw io.Writer) ([]runResult, error) {
	if err := checkFiles(cfg.conns); err != nil {
		return nil, err
	}
	for _, p := range []string{cfg.cpuProfile, cfg.stackProfile} {
		// The child writes them (in this process's directory) once
		// connected: refuse a missing directory before that.
		if dir := filepath.Dir(p); p != "" {
			if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
				return nil, fmt.Errorf("profile %s: no directory %s", p, dir)
			}
		}
	}
	if slices.Contains(cfg.impls, "sessiond") && cfg.sessiondBin == "" {
		dir, err := os.MkdirTemp("", "scale-sessiond-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		fmt.Fprintf(logw, "building %s\n", sessiondPkg)
		if cfg.sessiondBin, err = buildSessiond(dir); err != nil {
			return nil, err
		}
	}
	var runs []runResult
	for r := 1; r <= cfg.runs; r++ {
		order := slices.Clone(cfg.impls)
		if r%2 == 0 {
			slices.Reverse(order)
		}
		rr := runResult{Index: r, Order: order, Results: map[string]*implResult{}}
		for _, impl := range order {
			fmt.Fprintf(logw, "run %d/%d, %s: %d connections, %d sessions\n", r, cfg.runs, impl, cfg.conns, cfg.sessions)
			res, err := measure(cfg, impl, r, logw)
			if err != nil {
				return runs, fmt.Errorf("run %d, %s: %w", r, impl, err)
			}
			rr.Results[impl] = res
		}
		runs = append(runs, rr)
		writeRun(out, cfg, rr)
	}
	if cfg.runs > 1 {
		writeSpread(out, cfg, runs)
	}
	return runs, nil
}

// server is a running implementation, as measure drives it: a child
// (childProc), or sessiond (sessiondProc).
type server interface {
	sse() string // the address of the SSE streams
	// idBase is the id before round 1's event in every session (round k's
	// event has id idBase+k).
	idBase() uint64
	// stats reads the server's figures; with gc after the collections
	// settleGC describes.
	stats(gc bool) (serverStats, error)
	// publish publishes one event to every session, stamped with the
	// wall clock before the first.
	publish() (publishReply, error)
	startCPUProfile() error
	stopCPUProfile() error
	writeStackProfile() error
	stop()
}

// startServer starts impl's server for run.
func startServer(cfg config, impl string, run int) (server, error) {
	if impl == "sessiond" {
		return startSessiond(cfg, run)
	}
	return startChild(cfg, impl, run)
}

// childProc is a started child and the client of its control server.
type childProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	addrs childAddrs
	http  *http.Client
}

// profilePath names a profile file per implementation and run: FILE.ext
// becomes FILE-eventbus.ext (FILE-eventbus-run2.ext from the second run).
func profilePath(path, impl string, run int) string {
	if path == "" {
		return ""
	}
	ext := filepath.Ext(path)
	base := strings.TrimSuffix(path, ext) + "-" + impl
	if run > 1 {
		base += "-run" + strconv.Itoa(run)
	}
	return base + ext
}

func startChild(cfg config, impl string, run int) (*childProc, error) {
	perSession := (cfg.conns + cfg.sessions - 1) / cfg.sessions
	args := []string{
		"-serve=" + impl,
		"-sessions", strconv.Itoa(cfg.sessions),
		"-per-session", strconv.Itoa(perSession),
		"-heartbeat", cfg.heartbeat.String(),
	}
	if p := profilePath(cfg.cpuProfile, impl, run); p != "" {
		args = append(args, "-cpuprofile", p)
	}
	if p := profilePath(cfg.stackProfile, impl, run); p != "" {
		args = append(args, "-stackprofile", p)
	}
	cmd := exec.Command(cfg.exe, args...)
	cmd.Env = append(os.Environ(), cfg.childEnv...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &childProc{cmd: cmd, stdin: stdin, http: &http.Client{Timeout: 2 * time.Minute}}
	line := make(chan error, 1)
	go func() {
		br := bufio.NewReader(stdout)
		s, err := br.ReadString('\n')
		if err == nil {
			err = json.Unmarshal([]byte(s), &c.addrs)
		}
		line <- err
		_, _ = io.Copy(os.Stderr, br) // anything else it prints
	}()
	select {
	case err = <-line:
	case <-time.After(30 * time.Second):
		err = errors.New("no address line within 30 s")
	}
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("starting the %s server: %w", impl, err)
	}
	return c, nil
}

// stop closes the child's stdin, which ends it, and kills it if it has not
// exited within 10 s.
func (c *childProc) stop() {
	_ = c.stdin.Close()
	exited := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-exited
	}
}

func (c *childProc) call(method, path string, v any) error {
	req, err := http.NewRequest(method, "http://"+c.addrs.Control+path, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	if v == nil {
		return nil
	}
	return json.Unmarshal(b, v)
}

func (c *childProc) stats(gc bool) (serverStats, error) {
	var st serverStats
	path := "/stats"
	if gc {
		path += "?gc=1"
	}
	err := c.call(http.MethodGet, path, &st)
	return st, err
}

func (c *childProc) sse() string    { return c.addrs.SSE }
func (c *childProc) idBase() uint64 { return 0 }

func (c *childProc) publish() (publishReply, error) {
	var reply publishReply
	err := c.call(http.MethodPost, "/publish", &reply)
	return reply, err
}

func (c *childProc) startCPUProfile() error   { return c.call(http.MethodPost, "/profile/start", nil) }
func (c *childProc) stopCPUProfile() error    { return c.call(http.MethodPost, "/profile/stop", nil) }
func (c *childProc) writeStackProfile() error { return c.call(http.MethodPost, "/stackprofile", nil) }

// measure runs one implementation's steps: baseline, connect, memory,
// heartbeat window, fan-out rounds, close.
func measure(cfg config, impl string, run int, logw io.Writer) (_ *implResult, err error) {
	res := &implResult{Impl: impl, Run: run, Conns: cfg.conns, Sessions: cfg.sessions, LoadStart: benchkit.LoadAvg()}
	child, err := startServer(cfg, impl, run)
	if err != nil {
		return nil, err
	}
	defer child.stop()
	if impl == "sessiond" {
		res.Binary = strings.Join(append([]string{cfg.sessiondBin}, sessiondArgs(cfg)...), " ")
	}

	// (1) The baseline: the sessions exist, no connection.
	if res.Baseline, err = child.stats(true); err != nil {
		return nil, err
	}

	// (2) Connect, let the streams settle, measure.
	start := time.Now()
	fl, err := connect(child.sse(), routeOf(impl), cfg.conns, cfg.sessions, cfg.fanouts, child.idBase(), cfg.inflight)
	if err != nil {
		return nil, err
	}
	defer fl.close()
	res.ConnectSeconds = time.Since(start).Seconds()
	fmt.Fprintf(logw, "  connected in %.1f s\n", res.ConnectSeconds)
	time.Sleep(cfg.settle)
	if res.Connected, err = child.stats(true); err != nil {
		return nil, err
	}
	n := float64(cfg.conns)
	b, a := res.Baseline, res.Connected
	res.StackPerConn = (float64(a.StackInuse) - float64(b.StackInuse)) / n
	res.StackBeforeGCPerConn = (float64(a.StackInuseBeforeGC) - float64(b.StackInuseBeforeGC)) / n
	res.HeapPerConn = (float64(a.HeapInuse) - float64(b.HeapInuse)) / n
	res.RSSPerConn = float64(a.RSS-b.RSS) / n
	res.RSSFreedPerConn = float64(a.RSSFreed-b.RSSFreed) / n
	res.GoroutinesPerConn = float64(a.Goroutines-b.Goroutines) / n
	if cfg.stackProfile != "" {
		if err := child.writeStackProfile(); err != nil {
			return nil, err
		}
	}

	// (3) The heartbeat window: the server's CPU while every stream idles.
	if cfg.cpuProfile != "" {
		if err := child.startCPUProfile(); err != nil {
			return nil, err
		}
	}
	hb0 := fl.heartbeats()
	s0, err := child.stats(false)
	if err != nil {
		return nil, err
	}
	time.Sleep(cfg.idle)
	s1, err := child.stats(false)
	if err != nil {
		return nil, err
	}
	hb1 := fl.heartbeats()
	window := float64(s1.WallNanos-s0.WallNanos) / 1e9
	res.IdleSeconds = window
	res.HeartbeatCPU = float64(s1.CPUMicros-s0.CPUMicros) / window / (n / 1000)
	res.HeartbeatsExpected = cfg.idle.Seconds() / cfg.heartbeat.Seconds()
	res.HeartbeatsMin = -1
	var sum int64
	for i := range hb0 {
		d := hb1[i] - hb0[i]
		sum += d
		if res.HeartbeatsMin < 0 || d < res.HeartbeatsMin {
			res.HeartbeatsMin = d
		}
		res.HeartbeatsMax = max(res.HeartbeatsMax, d)
	}
	res.HeartbeatsMean = float64(sum) / n
	fmt.Fprintf(logw, "  heartbeat window %.1f s: %.0f µs/s per 1000 connections\n", window, res.HeartbeatCPU)

	// (4) The fan-out rounds. A collection of this process first, so that
	// the clients' garbage from the connect does not pause them mid-round.
	runtime.GC()
	for k := range cfg.fanouts {
		if k > 0 {
			time.Sleep(cfg.roundGap)
		}
		rd, err := fanout(child, fl, k, cfg.fanoutTimeout)
		if err != nil {
			return nil, err
		}
		res.Rounds = append(res.Rounds, rd)
		res.Lost += rd.Missing
		fmt.Fprintf(logw, "  fan-out %d: last client after %s, %d missing\n", k+1, fmtMicros(rd.LastMicros), rd.Missing)
	}
	if cfg.cpuProfile != "" {
		if err := child.stopCPUProfile(); err != nil {
			return nil, err
		}
	}
	res.FirstMicros = medianOf(res.Rounds, func(r roundResult) float64 { return r.FirstMicros })
	res.P50Micros = medianOf(res.Rounds, func(r roundResult) float64 { return r.P50Micros })
	res.P99Micros = medianOf(res.Rounds, func(r roundResult) float64 { return r.P99Micros })
	res.LastMicros = medianOf(res.Rounds, func(r roundResult) float64 { return r.LastMicros })
	res.LoopMicros = medianOf(res.Rounds, func(r roundResult) float64 { return r.LoopMicros })
	res.HeartbeatsPerRound = medianOf(res.Rounds, func(r roundResult) float64 { return float64(r.Heartbeats) })
	perDelivery := func(cpu func(roundResult) float64) func(roundResult) float64 {
		return func(r roundResult) float64 {
			if r.Delivered == 0 {
				return 0
			}
			return cpu(r) / float64(r.Delivered)
		}
	}
	res.ServerCPUPerDelivery = medianOf(res.Rounds, perDelivery(func(r roundResult) float64 { return r.ServerCPUMicros }))
	res.ClientCPUPerDelivery = medianOf(res.Rounds, perDelivery(func(r roundResult) float64 { return r.ClientCPUMicros }))
	var frames, bytes int64
	for _, c := range fl.conns {
		frames += c.frames.Load()
		bytes += c.frameBytes.Load()
	}
	if frames > 0 {
		res.BytesPerFrame = float64(bytes) / float64(frames)
	}
	if res.Ended = int(fl.ended.Load()); res.Ended > 0 {
		fmt.Fprintf(logw, "  %d streams ended before the end, the first found with: %v\n", res.Ended, fl.firstEnd())
	}
	res.Unexpected = fl.unexpected.Load()

	// The memory once more, now that every stream has written events.
	if res.AfterFanout, err = child.stats(true); err != nil {
		return nil, err
	}
	res.StackAfterFanoutPerConn = (float64(res.AfterFanout.StackInuse) - float64(b.StackInuse)) / n
	res.HeapAfterFanoutPerConn = (float64(res.AfterFanout.HeapInuse) - float64(b.HeapInuse)) / n

	// (5) Close every connection, then the child (deferred).
	fl.close()
	res.LoadEnd = benchkit.LoadAvg()
	return res, nil
}

// fanout runs round k: one event to every session, then waits for every
// connection to have it.
func fanout(child server, fl *fleet, k int, timeout time.Duration) (roundResult, error) {
	var rd roundResult
	hb := fl.totalHeartbeats()
	s0, err := child.stats(false)
	if err != nil {
		return rd, err
	}
	c0 := cpuMicros()
	start := time.Now()
	reply, err := child.publish()
	if err != nil {
		return rd, err
	}
	got := fl.waitRound(k, timeout)
	rd.WaitedSeconds = time.Since(start).Seconds()
	c1 := cpuMicros()
	s1, err := child.stats(false)
	if err != nil {
		return rd, err
	}
	rd.ServerCPUMicros = float64(s1.CPUMicros - s0.CPUMicros)
	rd.ClientCPUMicros = float64(c1 - c0)
	rd.Heartbeats = fl.totalHeartbeats() - hb
	rd.LoopMicros = float64(reply.LoopNanos) / 1e3
	lat := make([]float64, 0, got)
	for _, c := range fl.conns {
		at := c.arrived[k].Load()
		if at == 0 {
			continue
		}
		if c.sent[k].Load() != reply.Sent {
			rd.SentMismatch++
			continue
		}
		lat = append(lat, float64(at-reply.Sent)/1e3)
	}
	rd.Delivered = len(lat)
	rd.Missing = len(fl.conns) - rd.Delivered - rd.SentMismatch
	if len(lat) > 0 {
		slices.Sort(lat)
		rd.FirstMicros = lat[0]
		rd.P50Micros = percentile(lat, 0.50)
		rd.P99Micros = percentile(lat, 0.99)
		rd.LastMicros = lat[len(lat)-1]
	}
	if rd.SentMismatch > 0 {
		return rd, fmt.Errorf("round %d: %d events carried another timestamp than the round's", k+1, rd.SentMismatch)
	}
	return rd, nil
}

// percentile is the nearest-rank percentile of sorted values.
func percentile(sorted []float64, p float64) float64 {
	i := int(math.Ceil(float64(len(sorted))*p)) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func medianOf[T any](xs []T, f func(T) float64) float64 {
	v := make([]float64, len(xs))
	for i, x := range xs {
		v[i] = f(x)
	}
	return median(v)
}
