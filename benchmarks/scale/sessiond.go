//go:build linux

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The sessiond implementation: the repository's demo daemon, cmd/sessiond,
// as its users run it, with the figures read from outside the process:
// VmRSS from /proc/PID/status, its CPU from /proc/PID/stat, and the rest
// from its debug listener (-debug-addr): runtime.MemStats from
// /debug/vars, the goroutine count from /debug/pprof/goroutine, and the
// collections before the memory figures by /debug/pprof/heap?gc=1, which
// runs runtime.GC.

// sessiondPkg is what the parent builds when -sessiond-bin is not given.
const sessiondPkg = "github.com/ssebus/eventbus/cmd/sessiond"

// buildSessiond builds cmd/sessiond into dir and returns the binary's path.
// cmd/sessiond is a module of its own, which neither the root module nor
// this one contains, so it is built inside its folder: cmd/sessiond of the
// root module's working tree, which go list names when run from inside the
// repository (benchmarks/ or the root: the benchmarks module replaces the
// root module with ../).
func buildSessiond(dir string) (string, error) {
	var stderr bytes.Buffer
	list := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/ssebus/eventbus")
	list.Stderr = &stderr
	root, err := list.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m github.com/ssebus/eventbus (run from inside the repository, or give -sessiond-bin): %w\n%s", err, stderr.Bytes())
	}
	bin := filepath.Join(dir, "sessiond")
	cmd := exec.Command("go", "build", "-o", bin, sessiondPkg)
	cmd.Dir = filepath.Join(strings.TrimSpace(string(root)), "cmd", "sessiond")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s in %s (run from inside the repository, or give -sessiond-bin): %w\n%s", sessiondPkg, cmd.Dir, err, out)
	}
	return bin, nil
}

// sessiondProc is a running sessiond and the clients this process talks
// to it with.
type sessiondProc struct {
	cmd      *exec.Cmd
	pid      int
	sseAddr  string
	debug    string       // the debug listener's address
	ids      []string     // the sessions, created at start
	pub      *http.Client // the publishes: one keep-alive connection
	dbg      *http.Client // the debug listener
	cpuProf  string       // -cpuprofile-server's file, or ""
	stackOut string       // -stackprofile's file, or ""
	idle     time.Duration

	profDone chan error    // the CPU profile being taken
	logDone  chan struct{} // closed when its log ends
}

// sessiondArgs is sessiond's command line: both listeners on free loopback
// ports, the heartbeat of -heartbeat, and room for every client of a
// session (twice over: a client that retries its connect may find its first
// attempt still subscribed) and for every session. Everything else is
// sessiond's default.
func sessiondArgs(cfg config) []string {
	perSession := (cfg.conns + cfg.sessions - 1) / cfg.sessions
	return []string{
		"-addr", "127.0.0.1:0",
		"-debug-addr", "127.0.0.1:0",
		"-heartbeat", cfg.heartbeat.String(),
		"-max-subscribers", strconv.Itoa(max(64, 2*perSession)),
		"-max-sessions", strconv.Itoa(max(1000, cfg.sessions)),
	}
}

// The log lines sessiond writes at start, in this order, with the
// addresses of its listeners.
var (
	debugLine  = regexp.MustCompile(`msg="sessiond debug listening" addr=(\S+)`)
	listenLine = regexp.MustCompile(`msg="sessiond listening" addr=(\S+)`)
)

// startSessiond starts bin, learns its addresses from its log, and creates
// the sessions s0..s{S-1} with one POST each (its first event, id 1, which
// no client sees: they connect later, without Last-Event-ID), so that no
// stream's lookup creates one. Its log goes to stderr, but for its "stream
// opened" lines.
func startSessiond(cfg config, run int) (*sessiondProc, error) {
	cmd := exec.Command(cfg.sessiondBin, sessiondArgs(cfg)...)
	// It has no stdin to watch: a parent that dies takes it along.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &sessiondProc{
		cmd: cmd, pid: cmd.Process.Pid, ids: sessionIDs(cfg.sessions),
		pub:      &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}, Timeout: time.Minute},
		dbg:      &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}, Timeout: 2 * time.Minute},
		cpuProf:  profilePath(cfg.cpuProfile, "sessiond", run),
		stackOut: profilePath(cfg.stackProfile, "sessiond", run),
		idle:     cfg.idle,
		logDone:  make(chan struct{}),
	}
	addrs := make(chan [2]string, 1)
	go p.readLog(stderr, addrs)
	select {
	case a := <-addrs:
		p.debug, p.sseAddr = a[0], a[1]
	case <-time.After(30 * time.Second):
		err = fmt.Errorf("no listening lines within 30 s")
	}
	if err == nil {
		err = p.createSessions()
	}
	if err != nil {
		p.stop()
		return nil, fmt.Errorf("starting %s: %w", cfg.sessiondBin, err)
	}
	return p, nil
}

// readLog reads sessiond's log until it ends: it sends the two addresses
// once it has both, and copies the lines to stderr, but for the "stream
// opened" of every connection.
func (p *sessiondProc) readLog(r io.Reader, addrs chan<- [2]string) {
	defer close(p.logDone)
	var debug, listen string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, `msg="stream opened"`) {
			continue
		}
		fmt.Fprintln(os.Stderr, "  sessiond:", line)
		if m := debugLine.FindStringSubmatch(line); m != nil {
			debug = m[1]
		} else if m := listenLine.FindStringSubmatch(line); m != nil {
			listen = m[1]
		}
		if debug != "" && listen != "" && addrs != nil {
			addrs <- [2]string{debug, listen}
			addrs = nil
		}
	}
}

// post publishes one event to session id.
func (p *sessiondProc) post(id, body string) error {
	resp, err := p.pub.Post("http://"+p.sseAddr+"/session/"+id+"/events", "application/json", strings.NewReader(body))
	if err != nil {
		return err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("POST /session/%s/events: %s: %s", id, resp.Status, bytes.TrimSpace(b))
	}
	return err
}

func (p *sessiondProc) createSessions() error {
	for _, id := range p.ids {
		if err := p.post(id, `{"type":"created"}`); err != nil {
			return err
		}
	}
	return nil
}

func (p *sessiondProc) sse() string { return p.sseAddr }

// idBase: every session's first event is the one that created it.
func (p *sessiondProc) idBase() uint64 { return 1 }

// publish POSTs one event to every session, one after another on one
// keep-alive connection, each carrying this process's clock before the
// first: the loop includes each POST's HTTP round trip.
func (p *sessiondProc) publish() (publishReply, error) {
	start := time.Now()
	sent := start.UnixNano()
	body, err := json.Marshal(struct {
		Type string `json:"type"`
		Data tick   `json:"data"`
	}{eventType, tick{Sent: sent}})
	if err != nil {
		return publishReply{}, err
	}
	for _, id := range p.ids {
		if err := p.post(id, string(body)); err != nil {
			return publishReply{}, err
		}
	}
	return publishReply{Sent: sent, LoopNanos: time.Since(start).Nanoseconds()}, nil
}

// get returns the body of a 200 answer of the debug listener to path.
func (p *sessiondProc) get(path string) ([]byte, error) {
	resp, err := p.dbg.Get("http://" + p.debug + path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s: %s", path, resp.Status, bytes.TrimSpace(b))
	}
	return b, err
}

// debugMemStats is the part of /debug/vars' "memstats" (runtime.MemStats)
// the report uses.
type debugMemStats struct {
	HeapInuse, HeapAlloc, StackInuse, StackSys, Sys uint64
	NumGC                                           uint32
}

func (p *sessiondProc) memStats() (debugMemStats, error) {
	var v struct {
		MemStats *debugMemStats `json:"memstats"`
	}
	b, err := p.get("/debug/vars")
	if err == nil {
		err = json.Unmarshal(b, &v)
	}
	if err == nil && v.MemStats == nil {
		err = fmt.Errorf("/debug/vars has no memstats")
	}
	if err != nil {
		return debugMemStats{}, err
	}
	return *v.MemStats, nil
}

// goroutines reads the count on the first line of the goroutine profile,
// "goroutine profile: total N".
func (p *sessiondProc) goroutines() (int, error) {
	b, err := p.get("/debug/pprof/goroutine?debug=1")
	if err != nil {
		return 0, err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	n, ok := bytes.CutPrefix(line, []byte("goroutine profile: total "))
	if !ok {
		return 0, fmt.Errorf("goroutine profile starts %q", line)
	}
	return strconv.Atoi(string(n))
}

// clockTick is the unit of /proc/PID/stat's CPU times: USER_HZ, 100 on
// every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// procCPUMicros returns the user and system CPU time of process pid, every
// thread's, in µs (in steps of clockTick).
func procCPUMicros(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses,
	// so the fields count from the last ')'; utime and stime are the
	// 14th and 15th fields, the 12th and 13th after it.
	i := bytes.LastIndexByte(b, ')')
	f := bytes.Fields(b[i+1:])
	if i < 0 || len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, b)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(string(s), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return ticks * clockTick.Microseconds(), nil
}

// stats reads sessiond's figures as collectStats reads the child's. With gc
// it collects as settleGC does, each collection a GET of
// /debug/pprof/heap?gc=1, reading StackInuse after each; then MemStats
// and the goroutine count. Without gc it reads only /proc (RSS and CPU),
// which costs sessiond nothing: the heartbeat window is measured so. RSS
// after debug.FreeOSMemory is not measured (no route runs it).
func (p *sessiondProc) stats(gc bool) (serverStats, error) {
	var st serverStats
	if gc {
		ms, err := p.memStats()
		if err != nil {
			return st, err
		}
		st.StackInuseBeforeGC = ms.StackInuse
		prev := uint64(0)
		for st.GCs < maxGCs {
			if _, err := p.get("/debug/pprof/heap?gc=1"); err != nil {
				return st, err
			}
			st.GCs++
			if ms, err = p.memStats(); err != nil {
				return st, err
			}
			if st.GCs >= minGCs && ms.StackInuse >= prev {
				break
			}
			prev = ms.StackInuse
		}
		st.HeapInuse, st.HeapAlloc = ms.HeapInuse, ms.HeapAlloc
		st.StackInuse, st.StackSys = ms.StackInuse, ms.StackSys
		st.Sys, st.NumGC = ms.Sys, ms.NumGC
		if st.Goroutines, err = p.goroutines(); err != nil {
			return st, err
		}
	}
	var err error
	if st.RSS, err = readRSSOf(strconv.Itoa(p.pid)); err != nil {
		return st, err
	}
	if st.CPUMicros, err = procCPUMicros(p.pid); err != nil {
		return st, err
	}
	st.WallNanos = time.Now().UnixNano()
	return st, nil
}

// startCPUProfile starts net/http/pprof's CPU profile of -idle (rounded up
// to a second): it has a fixed length, so it covers the heartbeat window
// and not the fan-outs, unlike the other implementations' profile.
func (p *sessiondProc) startCPUProfile() error {
	if p.cpuProf == "" || p.profDone != nil {
		return fmt.Errorf("no profile file, or a profile is running")
	}
	f, err := os.Create(p.cpuProf)
	if err != nil {
		return err
	}
	p.profDone = make(chan error, 1)
	seconds := int((p.idle + time.Second - 1) / time.Second)
	go func() {
		b, err := p.get("/debug/pprof/profile?seconds=" + strconv.Itoa(seconds))
		if err == nil {
			_, err = f.Write(b)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		p.profDone <- err
	}()
	return nil
}

func (p *sessiondProc) stopCPUProfile() error {
	if p.profDone == nil {
		return nil
	}
	err := <-p.profDone
	p.profDone = nil
	return err
}

// writeStackProfile writes the goroutine profile (debug=1) to -stackprofile's file.
func (p *sessiondProc) writeStackProfile() error {
	if p.stackOut == "" {
		return fmt.Errorf("no stack profile file")
	}
	b, err := p.get("/debug/pprof/goroutine?debug=1")
	if err == nil {
		err = os.WriteFile(p.stackOut, b, 0o644)
	}
	return err
}

// stop ends sessiond with SIGTERM, as its users do (its streams are closed
// by then: the shutdown is quick), and kills it if it has not exited within
// 15 s (its -shutdown-timeout is 10 s).
func (p *sessiondProc) stop() {
	if p.profDone != nil {
		_ = p.stopCPUProfile()
	}
	p.pub.CloseIdleConnections()
	p.dbg.CloseIdleConnections()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	exited := make(chan struct{})
	go func() {
		<-p.logDone // the log ends as the process does; Wait closes the pipe
		_ = p.cmd.Wait()
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-exited
	}
}
