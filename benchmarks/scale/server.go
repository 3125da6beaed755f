//go:build linux

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/backplane"
	"github.com/ssebus/eventbus/benchmarks/internal/naive"
	ebws "github.com/ssebus/eventbus/websocket"
)

// The child: one implementation's SSE server, and a control server on
// another port through which the parent reads its stats and makes it
// publish. It exits when its stdin closes (the parent ended, whatever the
// way), or on SIGTERM or SIGINT.

// eventType is the type of every published event.
const eventType = "tick"

// tick is the data of every published event: the server's wall clock, in
// Unix nanoseconds, just before the publish loop. Clients measure each
// delivery's latency from it (both processes read the same clock).
type tick struct {
	Sent int64 `json:"sent"`
}

// publisher publishes one event to every session.
type publisher interface {
	publishAll(sent int64) error
}

// childAddrs is the one line a child prints on stdout once it listens.
type childAddrs struct {
	SSE     string `json:"sse"`
	Control string `json:"control"`
}

// serverStats is what GET /stats answers.
type serverStats struct {
	WallNanos int64 `json:"wall_ns"` // time.Now().UnixNano() at the end of the request
	// RSS is VmRSS, in bytes; with gc=1, after the collections.
	RSS int64 `json:"rss"`
	// RSSFreed is VmRSS after debug.FreeOSMemory (gc=1 only): without the
	// heap pages that are free but not yet returned to the OS.
	RSSFreed   int64  `json:"rss_freed,omitempty"`
	HeapInuse  uint64 `json:"heap_inuse"`
	HeapAlloc  uint64 `json:"heap_alloc"`
	StackInuse uint64 `json:"stack_inuse"`
	StackSys   uint64 `json:"stack_sys"`
	Sys        uint64 `json:"sys"`
	NumGC      uint32 `json:"num_gc"`
	// StackInuseBeforeGC is StackInuse as the request found it (gc=1 only),
	// before the collections shrank the stacks.
	StackInuseBeforeGC uint64 `json:"stack_inuse_before_gc,omitempty"`
	GCs                int    `json:"gcs,omitempty"` // collections this request ran
	Goroutines         int    `json:"goroutines"`
	CPUMicros          int64  `json:"cpu_us"` // user + system, since the process started
}

// Stack shrinking: a collection halves the stack of a goroutine that uses
// less than a quarter of it, once per collection, and frees a stack span
// only when every stack in it is free. So one runtime.GC leaves stacks that
// grew during the connect (or a heartbeat) up to twice their steady size.
// settleGC runs at least minGCs collections and goes on, up to maxGCs,
// while StackInuse still falls, so that every implementation is measured
// at its steady state, whatever depth its stacks reached.
const (
	minGCs = 3
	maxGCs = 12
)

func settleGC() int {
	var ms runtime.MemStats
	prev := uint64(0)
	n := 0
	for n < maxGCs {
		runtime.GC()
		n++
		runtime.ReadMemStats(&ms)
		if n >= minGCs && ms.StackInuse >= prev {
			break
		}
		prev = ms.StackInuse
	}
	return n
}

// readRSS returns VmRSS from /proc/self/status, in bytes.
func readRSS() (int64, error) { return readRSSOf("self") }

// readRSSOf returns VmRSS from /proc/<pid>/status, in bytes.
func readRSSOf(pid string) (int64, error) {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
			f := bytes.Fields(v) // "12345", "kB"
			if len(f) == 2 && string(f[1]) == "kB" {
				kb, err := strconv.ParseInt(string(f[0]), 10, 64)
				if err != nil {
					return 0, err
				}
				return kb << 10, nil
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS line in /proc/%s/status", pid)
}

// cpuMicros returns the process's user and system CPU time, in µs.
func cpuMicros() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return ru.Utime.Nano()/1000 + ru.Stime.Nano()/1000
}

func collectStats(gc bool) (serverStats, error) {
	var st serverStats
	var ms runtime.MemStats
	if gc {
		runtime.ReadMemStats(&ms)
		st.StackInuseBeforeGC = ms.StackInuse
		st.GCs = settleGC()
	}
	runtime.ReadMemStats(&ms)
	st.HeapInuse, st.HeapAlloc = ms.HeapInuse, ms.HeapAlloc
	st.StackInuse, st.StackSys = ms.StackInuse, ms.StackSys
	st.Sys, st.NumGC = ms.Sys, ms.NumGC
	st.Goroutines = runtime.NumGoroutine()
	var err error
	if st.RSS, err = readRSS(); err != nil {
		return st, err
	}
	if gc {
		debug.FreeOSMemory()
		if st.RSSFreed, err = readRSS(); err != nil {
			return st, err
		}
	}
	st.CPUMicros = cpuMicros()
	st.WallNanos = time.Now().UnixNano()
	return st, nil
}

// busServer is the eventbus implementations: a Hub with every session
// created at start, and the library's three routes on it, the same
// Handler's settings for all three: the single stream (eventbus:
// GET /session/{id}/events, Handler), the multiplexed one (mux:
// GET /events?session=ID, a MuxHandler on that Handler) and the WebSocket
// (websocket: GET /ws?session=ID, the websocket module's Handler on that
// MuxHandler). Each child serves all three; its parent's clients use the
// one it measures.
type busServer struct {
	hub *eventbus.Hub
	ids []string
}

func newBusServer(ids []string, perSession int, heartbeat time.Duration) (*busServer, http.Handler, error) {
	hub, err := eventbus.NewHub(eventbus.HubOptions{
		// Room for every client of a session, and as many again: a client
		// that retries its connect may find its first attempt still
		// subscribed.
		Bus:         eventbus.Options{MaxSubscribers: max(eventbus.DefaultMaxSubscribers, 2*perSession)},
		MaxSessions: max(eventbus.DefaultMaxSessions, len(ids)),
		// The sessions exist before their first subscriber: none may
		// expire, however long the parent takes to connect.
		IdleTimeout: -1,
	})
	if err != nil {
		return nil, nil, err
	}
	for _, id := range ids {
		if _, err := hub.GetOrCreate(id); err != nil {
			return nil, nil, err
		}
	}
	mux := http.NewServeMux()
	h := &eventbus.Handler{Lookup: hub.LookupSession, Heartbeat: heartbeat, BareIDs: true /* the naive handler's wire */}
	mux.Handle("GET /session/{id}/events", h)
	streams := &eventbus.MuxHandler{Handler: h}
	mux.Handle("GET /events", streams)
	wsh := &ebws.Handler{Mux: streams}
	mux.Handle("GET /ws", wsh)
	mux.HandleFunc("GET /ws-smallbuf", func(w http.ResponseWriter, r *http.Request) { wsh.ServeHTTP(smallBufWriter{w}, r) })
	return &busServer{hub: hub, ids: ids}, mux, nil
}

func (s *busServer) publishAll(sent int64) error {
	for _, id := range s.ids {
		if _, err := s.hub.Publish(id, eventbus.Event{Type: eventType, Data: tick{Sent: sent}}); err != nil {
			return fmt.Errorf("session %s: %w", id, err)
		}
	}
	return nil
}

// naiveServer is the naive implementation: a broker per session.
type naiveServer struct {
	brokers []*naiveSession
	enc     *backplane.Encoder
}

func newNaiveServer(ids []string, heartbeat time.Duration) (*naiveServer, http.Handler, error) {
	enc, err := backplane.NewEncoder(eventbus.Options{})
	if err != nil {
		return nil, nil, err
	}
	s := &naiveServer{enc: enc}
	var byID map[string]*naiveSession
	s.brokers, byID = newSessions[naiveSession](ids)
	mux := http.NewServeMux()
	mux.Handle("GET /session/{id}/events", naiveHandler(byID, heartbeat))
	return s, mux, nil
}

// publishAll encodes the event once per session, as Hub.Publish does (the
// same encoder, the same bytes), and builds its frame once per session.
func (s *naiveServer) publishAll(sent int64) error {
	for _, b := range s.brokers {
		e, err := s.enc.Encode(eventbus.Event{Type: eventType, Data: tick{Sent: sent}})
		if err != nil {
			return err
		}
		id := b.next.Add(1)
		b.Publish(naive.Msg{ID: id, Data: appendNaiveFrame(nil, id, e)})
	}
	return nil
}

// newSessions makes a T for each of ids, in their order and by id (a map
// that is read-only once serving).
func newSessions[T any](ids []string) ([]*T, map[string]*T) {
	list := make([]*T, 0, len(ids))
	byID := make(map[string]*T, len(ids))
	for _, id := range ids {
		t := new(T)
		list = append(list, t)
		byID[id] = t
	}
	return list, byID
}

// sessionIDs returns s0..s{n-1}.
func sessionIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "s" + strconv.Itoa(i)
	}
	return ids
}

// child is a running child's control state.
type child struct {
	pub          publisher
	cpuProfile   string // file for the CPU profile; "" refuses /profile/start
	stackProfile string // file for the goroutine profile; "" refuses /stackprofile

	mu      sync.Mutex
	profile *os.File // the CPU profile being written
}

func (c *child) stopProfile() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.profile == nil {
		return nil
	}
	pprof.StopCPUProfile()
	err := c.profile.Close()
	c.profile = nil
	return err
}

func (c *child) controlMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		st, err := collectStats(r.URL.Query().Get("gc") == "1")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		writeJSON(w, st)
	})
	mux.HandleFunc("POST /publish", func(w http.ResponseWriter, _ *http.Request) {
		start := time.Now()
		sent := start.UnixNano()
		if err := c.pub.publishAll(sent); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		writeJSON(w, publishReply{Sent: sent, LoopNanos: time.Since(start).Nanoseconds()})
	})
	mux.HandleFunc("POST /profile/start", func(w http.ResponseWriter, _ *http.Request) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.cpuProfile == "" || c.profile != nil {
			http.Error(w, "no profile file, or a profile is running", http.StatusConflict)
			return
		}
		f, err := os.Create(c.cpuProfile)
		if err == nil {
			if err = pprof.StartCPUProfile(f); err != nil {
				f.Close()
			}
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		c.profile = f
	})
	mux.HandleFunc("POST /profile/stop", func(w http.ResponseWriter, _ *http.Request) {
		if err := c.stopProfile(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	mux.HandleFunc("POST /stackprofile", func(w http.ResponseWriter, _ *http.Request) {
		if c.stackProfile == "" {
			http.Error(w, "no stack profile file", http.StatusConflict)
			return
		}
		f, err := os.Create(c.stackProfile)
		if err == nil {
			// debug=1: one entry per distinct stack with its count and
			// every frame, so the handler goroutines of 10,000
			// connections read as a few entries.
			err = pprof.Lookup("goroutine").WriteTo(f, 1)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err == nil {
			err = writeHeapProfile(heapProfilePath(c.stackProfile))
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	return mux
}

// heapProfilePath is the heap profile's file beside the stack profile's:
// FILE.ext becomes FILE.heap.pprof.
func heapProfilePath(stackProfile string) string {
	return strings.TrimSuffix(stackProfile, filepath.Ext(stackProfile)) + ".heap.pprof"
}

// writeHeapProfile writes the heap profile (pprof's format, inuse_space
// after a collection: what every connection holds, by allocation site) to
// path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	err = pprof.Lookup("heap").WriteTo(f, 0)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// publishReply is what POST /publish answers.
type publishReply struct {
	Sent      int64 `json:"sent"`    // the events' timestamp, Unix ns
	LoopNanos int64 `json:"loop_ns"` // how long the publish loop took
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// childMain runs a child with its command line (the -serve flag first) and
// returns the exit code.
func childMain(args []string) int {
	fs := flag.NewFlagSet("scale -serve", flag.ContinueOnError)
	impl := fs.String("serve", "", "implementation to serve: eventbus, mux, websocket, floor, floor-raw or naive")
	sessions := fs.Int("sessions", 200, "sessions")
	perSession := fs.Int("per-session", 50, "clients per session the parent will open")
	heartbeat := fs.Duration("heartbeat", time.Second, "heartbeat interval")
	cpuProfile := fs.String("cpuprofile", "", "file for the CPU profile /profile/start begins")
	stackProfile := fs.String("stackprofile", "", "file for the goroutine profile of /stackprofile")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := serveChild(*impl, *sessions, *perSession, *heartbeat, *cpuProfile, *stackProfile); err != nil {
		fmt.Fprintln(os.Stderr, "scale -serve:", err)
		return 1
	}
	return 0
}

func serveChild(impl string, sessions, perSession int, heartbeat time.Duration, cpuProfile, stackProfile string) error {
	if _, err := readRSS(); err != nil {
		return fmt.Errorf("reading RSS (Linux only): %w", err)
	}
	ids := sessionIDs(sessions)
	var (
		pub publisher
		h   http.Handler
		err error
	)
	switch impl {
	case "eventbus", "mux", "websocket", "ws-smallbuf":
		pub, h, err = newBusServer(ids, perSession, heartbeat)
	case "naive":
		pub, h, err = newNaiveServer(ids, heartbeat)
	case "floor", "floor-raw":
		pub, h, err = newFloorServer(ids, heartbeat, impl == "floor-raw")
	default:
		err = fmt.Errorf("unknown implementation %q", impl)
	}
	if err != nil {
		return err
	}
	sseLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	ctlLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	c := &child{pub: pub, cpuProfile: cpuProfile, stackProfile: stackProfile}

	done := make(chan error, 3)
	go func() {
		// The parent holds our stdin: EOF means it is gone or done.
		_, _ = io.Copy(io.Discard, os.Stdin)
		done <- nil
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sig; done <- nil }()
	// The same server settings for both implementations; the SSE server
	// is net/http's default but for ReadHeaderTimeout, as in the peer
	// harness (it arms no timer once the request is read).
	sseSrv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { done <- fmt.Errorf("SSE server: %w", sseSrv.Serve(sseLn)) }()
	ctlSrv := &http.Server{Handler: c.controlMux(), ReadHeaderTimeout: 10 * time.Second}
	go func() { done <- fmt.Errorf("control server: %w", ctlSrv.Serve(ctlLn)) }()

	out := bufio.NewWriter(os.Stdout)
	if err := json.NewEncoder(out).Encode(childAddrs{SSE: sseLn.Addr().String(), Control: ctlLn.Addr().String()}); err != nil {
		return err
	}
	if err := out.Flush(); err != nil {
		return err
	}
	err = <-done
	if perr := c.stopProfile(); err == nil {
		err = perr
	}
	return err
}

// smallBufSize is the size of the buffers ws-smallbuf gives coder's Conn.
const smallBufSize = 512

// smallBufWriter is the instrument ws-smallbuf (not a design): the
// ResponseWriter the websocket Handler gets on GET /ws-smallbuf, whose
// Hijack (which the Handler's reaches through http.ResponseController)
// hands coder/websocket a bufio.Reader and Writer of smallBufSize over
// the connection instead of net/http's 4 KiB ones, when the client sent
// nothing past its handshake. It tells whether smaller buffers alone
// would make an idle WebSocket cheaper while the stream runs on the
// request's goroutine, whose net/http connection still holds its own.
type smallBufWriter struct{ http.ResponseWriter }

func (w smallBufWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w smallBufWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil || brw.Reader.Buffered() > 0 {
		return c, brw, err
	}
	return c, bufio.NewReadWriter(bufio.NewReaderSize(c, smallBufSize), bufio.NewWriterSize(c, smallBufSize)), nil
}
