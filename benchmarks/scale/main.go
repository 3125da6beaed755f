//go:build linux

// Command scale measures what idle SSE connections cost a server, and how
// long one event takes to reach all of them, for eventbus's Handler beside
// a naive net/http SSE handler, in the same run, on loopback (issue 26),
// for the demo daemon cmd/sessiond, which serves that Handler the way
// a user runs it, and for the library's other transports on the same Hub:
// the multiplexed SSE route and the WebSocket (issue 34). It is Linux only
// (it reads /proc).
//
// Usage, from benchmarks/:
//
//	go run ./scale [-conns 10000] [-sessions 200] [-heartbeat 1s] [-idle 10s]
//	    [-fanouts 5] [-impl both|all|floors|transports|eventbus|mux|websocket|ws-smallbuf|sessiond|floor|floor-raw|naive|LIST] [-runs 1]
//	    [-json] [-cpuprofile-server FILE] [-stackprofile FILE]
//	    [-sessiond-bin PATH]
//
// -impl both (the default) is eventbus and naive, all adds sessiond
// (eventbus, sessiond, naive), floors adds the two floors (eventbus, floor,
// floor-raw, naive), transports the library's three transports beside
// naive (eventbus, mux, websocket, naive: issue 34), and a comma-separated
// LIST names the implementations in the order the first run measures them.
//
// # How
//
// This process drives the clients. For each implementation it starts
// itself again as a child process (-serve=eventbus or -serve=naive, an
// internal flag) that serves only that implementation, so the server's
// memory and CPU are measured alone. The child serves
// GET /session/{id}/events for S sessions (s0..s{S-1}, all created at
// start; eventbus's children GET /events and GET /ws too) on one port, and its control endpoints (GET /stats, POST
// /publish) on another; it exits when its stdin closes, so it never
// outlives this process.
//
//   - eventbus: an eventbus.Hub holding the sessions and an
//     eventbus.Handler (Lookup: the hub's LookupSession; Heartbeat from
//     -heartbeat; everything else its default).
//   - mux: the same Hub and Handler, its sessions served by an
//     eventbus.MuxHandler on GET /events?session=ID (one session per
//     connection): the multiplexed SSE route, whose id: line is the
//     composite cursor (the clients read the event's id from the data
//     envelope).
//   - websocket: the same Hub, Handler and MuxHandler, served over a
//     WebSocket by the websocket module's Handler{Mux: mux} on
//     GET /ws?session=ID (one session per connection). The clients are
//     github.com/coder/websocket connections (an http.Transport each, to
//     bind the source address), one goroutine each reading messages; the
//     heartbeat is the Handler's ping after -heartbeat of idle, which
//     coder's reader answers with a pong, and which the clients count
//     (OnPingReceived). A frame's bytes on the wire are those of the
//     message that carried it, its cursor line and its header included.
//     With -stackprofile, every child of this program (not sessiond)
//     writes a heap profile too, FILE-<impl>.heap.pprof, after a
//     collection: what the connections hold, by allocation site.
//   - ws-smallbuf: an instrument, not a design: websocket, but coder's
//     Conn gets a bufio.Reader and Writer of 512 bytes instead of the
//     4 KiB ones of net/http's connection (server.go, smallBufWriter).
//     It measures what smaller buffers alone would save while the stream
//     runs on the request's goroutine (nothing: net/http's connection
//     keeps its own 4 KiB ones reachable until ServeHTTP returns).
//   - sessiond: not a child of this program but the demo daemon itself,
//     cmd/sessiond, built from the working tree (go build
//     github.com/ssebus/eventbus/cmd/sessiond in its module's folder,
//     cmd/sessiond of the root module's, which the benchmarks module
//     replaces with ../: run from inside the repository) unless
//     -sessiond-bin names a binary (one that has -debug-addr), and run
//     with its defaults (epoch ids, so its frames are 33 bytes longer; the
//     memory limit of its budget, logged) but for -addr 127.0.0.1:0, -debug-addr
//     127.0.0.1:0 (the addresses are read from its log), -heartbeat,
//     -max-subscribers (twice the clients of a session, at least 64) and
//     -max-sessions (at least 1000). Each session is created by a POST of
//     an event before any client connects (so no stream's lookup creates
//     one; round k's event is then the session's event k+1). Its figures
//     are read from outside: VmRSS from /proc/PID/status, user+system CPU
//     from /proc/PID/stat (in 10 ms ticks), runtime.MemStats from
//     /debug/vars, the goroutine count from the first line of
//     /debug/pprof/goroutine?debug=1, and each collection before the
//     memory figures is a GET of /debug/pprof/heap?gc=1 (runtime.GC), as
//     many as a child runs (below). There is no RSS after FreeOSMemory
//     ("-"). Its log goes to stderr but for the "stream opened" line of
//     every connection. It ends with SIGTERM (and with this process:
//     Pdeathsig).
//   - naive: a broker per session, the naiveHTTP(false) baseline of the
//     peer harness (an RWMutex, a buffered channel per client, one Write
//     and one Flush per batch), with a heartbeat ticker per connection, the
//     way a naive handler keeps a connection alive. Its frames carry the
//     same bytes as eventbus's (the same encoder, backplane.Encoder).
//   - floor and floor-raw: measuring instruments, not designs (floor.go).
//     A pool of GOMAXPROCS workers writes every delivery, so no goroutine
//     is woken per connection: through net/http's ResponseWriter (floor),
//     or as a hand-framed chunk on the hijacked connection, one write
//     system call each and no goroutine per connection at all (floor-raw).
//     One ticker sends every connection's heartbeat. They tell how far
//     below naive a server can bring the fan-out when all that is left is
//     the kernel's write and the client's read.
//
// The clients are raw TCP connections (one goroutine each) that send an
// HTTP/1.1 GET and parse the stream minimally (the WebSocket's: coder's
// client connections, one goroutine each reading messages); their source addresses
// change every 10,000 connections (127.0.0.1, 127.0.0.2, ...) so that
// ports never run out, and at most 200 connect at a time.
//
// # What, per implementation, in this order
//
//  1. Baseline: the child's stats before any connection.
//  2. Memory: -conns connections, spread evenly over -sessions; once every
//     one has its response head (the 200 and the first flush) and 2 s more,
//     the stats again. Per connection is (after - baseline) / conns, of
//     StackInuse, HeapInuse, VmRSS and the goroutine count. Before reading
//     them the child runs runtime.GC at least 3 times, and again while
//     StackInuse still falls (at most 12): a collection halves a stack
//     only once, so one collection would leave a stack that grew during
//     the connect up to twice its steady size ("as found" is StackInuse
//     before them). RSS is given twice: after the collections, and after
//     debug.FreeOSMemory (without the free heap pages the runtime has not
//     yet returned to the OS).
//  3. Heartbeat CPU: the child's user+system CPU over an idle window of
//     -idle, in µs per second per 1000 connections; the clients count the
//     heartbeat lines each connection received in the window (expected:
//     idle / heartbeat).
//  4. Fan-out: -fanouts rounds, 500 ms apart, of one event to every
//     session (one publish per session in a loop in the child, the events
//     carrying the child's wall clock just before the loop); each round
//     waits until every connection has its event (at most 30 s: what is
//     missing then is reported as lost, apart from the latencies). Latency
//     is from that timestamp to each client's reading of the data line:
//     the first client, p50, p99 and the last client reached, per round
//     and their medians over the rounds. For sessiond the publish loop is
//     this process's: a POST of the event to every session, one after
//     another on one keep-alive connection, the timestamp this process's
//     clock before the first, so its figures include an HTTP round trip
//     per session that the others' in-process loop does not have. Each
//     round also reads the server's CPU (its stats) and this process's
//     (getrusage) just before the publish and once the round is over: CPU
//     per delivery, server and clients apart, since both share the
//     machine (the clients' figure includes the wait loop's polling,
//     a few µs a round). Then
//     the memory figures once
//     more, with the same collections: the stacks and heap per connection
//     after the fan-outs, what a delivery leaves behind.
//  5. Every connection closed, the child stopped.
//
// The report is a markdown table per run (rows: the figures; columns:
// eventbus, sessiond and naive, those measured, then the ratio of each of
// the others to naive when naive was measured), the rounds, and with -json
// one JSON line per implementation. -runs R repeats the whole comparison R times,
// alternating which implementation goes first, then gives each figure's
// spread. -cpuprofile-server FILE makes each child write a CPU profile of
// the heartbeat window and the fan-outs to FILE-<impl>.ext (FILE-<impl>-runN.ext
// from the second run); -stackprofile FILE makes it write its goroutine
// profile (debug=1: one entry per distinct stack) once connected, to find
// what keeps the stacks deep. sessiond's CPU profile is net/http/pprof's,
// of a fixed length: it covers the heartbeat window only, not the
// fan-outs.
//
// The heartbeats differ by design, and that weighs on the fan-out: the
// naive handler's ticker fires every -heartbeat whatever the stream does,
// while eventbus's heartbeat comes -heartbeat after the stream's last
// write, so an event postpones it. With rounds 500 ms apart and a 1 s
// heartbeat, eventbus writes no heartbeat during the rounds after the
// first, and the naive handler about conns x (the round's length) /
// heartbeat of them; the report counts the heartbeats the clients received
// during each round. To compare the fan-out alone, make the heartbeat
// longer than the whole run (-heartbeat 1h -idle 2s: the heartbeat CPU is
// then that of streams with nothing to write).
//
// A CPU profile (-cpuprofile-server) costs the child a little CPU of its
// own, in the heartbeat figure too.
//
// Both processes share the machine: the clients' reading is part of every
// fan-out figure, for both implementations alike. The load average at the
// start and the end of each measurement is printed with it. Each process
// needs a descriptor per connection: Go raises the soft RLIMIT_NOFILE to
// the hard limit at start, and -conns above what that allows is refused
// with the number that fits.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

func main() {
	if len(os.Args) > 1 && strings.HasPrefix(os.Args[1], "-serve=") {
		os.Exit(childMain(os.Args[1:]))
	}
	cfg, err := parseFlags(os.Args[1:], flag.ExitOnError)
	if err == nil {
		cfg.exe, err = os.Executable()
	}
	if err == nil {
		_, err = run(cfg, os.Stdout, os.Stderr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

// parseFlags reads the command line into a config.
func parseFlags(args []string, onError flag.ErrorHandling) (config, error) {
	cfg := config{
		settle:        2 * time.Second,
		fanoutTimeout: 30 * time.Second,
		roundGap:      500 * time.Millisecond,
		inflight:      200,
	}
	fs := flag.NewFlagSet("scale", onError)
	fs.SetOutput(os.Stderr)
	fs.IntVar(&cfg.conns, "conns", 10_000, "idle SSE connections to open")
	fs.IntVar(&cfg.sessions, "sessions", 200, "sessions the connections are spread over")
	fs.DurationVar(&cfg.heartbeat, "heartbeat", time.Second, "the servers' heartbeat interval")
	fs.DurationVar(&cfg.idle, "idle", 10*time.Second, "the idle window over which heartbeat CPU is measured")
	fs.IntVar(&cfg.fanouts, "fanouts", 5, "fan-out rounds (one event to every session each)")
	impl := fs.String("impl", "both", "implementations to measure: both (eventbus,naive), all (eventbus,sessiond,naive), floors (eventbus,floor,floor-raw,naive), transports (eventbus,mux,websocket,naive), eventbus, mux, websocket, ws-smallbuf, sessiond, floor, floor-raw, naive, or a comma-separated list of them")
	fs.IntVar(&cfg.runs, "runs", 1, "repeat the whole comparison this many times, alternating the order")
	fs.BoolVar(&cfg.jsonLines, "json", false, "also print one JSON line per implementation and run")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile-server", "", "write each child's CPU profile of the heartbeat window and the fan-outs to this file (-<impl> added)")
	fs.StringVar(&cfg.stackProfile, "stackprofile", "", "write each child's goroutine profile, once connected, to this file (-<impl> added)")
	fs.StringVar(&cfg.sessiondBin, "sessiond-bin", "", "the cmd/sessiond binary -impl sessiond runs (one with -debug-addr); empty: go build "+sessiondPkg+" from the working tree")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	var err error
	if cfg.impls, err = parseImpls(*impl); err != nil {
		return cfg, err
	}
	switch {
	case fs.NArg() > 0:
		return cfg, fmt.Errorf("unexpected arguments: %q", fs.Args())
	case cfg.conns < 1 || cfg.sessions < 1 || cfg.sessions > cfg.conns:
		return cfg, errors.New("want -conns >= -sessions >= 1")
	case cfg.heartbeat <= 0 || cfg.idle <= 0:
		return cfg, errors.New("want a positive -heartbeat and -idle")
	case cfg.fanouts < 1 || cfg.runs < 1:
		return cfg, errors.New("want -fanouts >= 1 and -runs >= 1")
	}
	return cfg, nil
}

// impls are the implementations, in the order of the report's columns.
var impls = []string{"eventbus", "mux", "websocket", "ws-smallbuf", "sessiond", "floor", "floor-raw", "naive"}

// parseImpls reads -impl: both, all, floors, or a comma-separated list of impls,
// each once. The measurement order of the first run is the list's.
func parseImpls(v string) ([]string, error) {
	switch v {
	case "both":
		return []string{"eventbus", "naive"}, nil
	case "all":
		return []string{"eventbus", "sessiond", "naive"}, nil
	case "floors":
		return []string{"eventbus", "floor", "floor-raw", "naive"}, nil
	case "transports":
		return []string{"eventbus", "mux", "websocket", "naive"}, nil
	}
	var out []string
	for name := range strings.SplitSeq(v, ",") {
		if !slices.Contains(impls, name) || slices.Contains(out, name) {
			return nil, fmt.Errorf("-impl %q: want both, all, floors, transports, or a list of distinct %s", v, strings.Join(impls, ", "))
		}
		out = append(out, name)
	}
	return out, nil
}
