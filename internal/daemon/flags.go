package daemon

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/ssebus/eventbus"
)

// NewFlags returns a flag set named name with the shared flags defined on
// it, described as docs says where the daemons differ, and the Flags they
// are stored in; the daemon defines its own flags on fs, then calls Parse.
// The flag set returns parse errors (and flag.ErrHelp for -h) instead of
// exiting, and writes its messages to out; its Usage prints usage, then
// the defaults of every flag.
func NewFlags(name, usage string, out io.Writer, docs FlagDocs) (fs *flag.FlagSet, f *Flags) {
	fs = flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	f = new(Flags)
	f.register(fs, docs)
	return fs, f
}

// Parse parses args with fs. Positional arguments are refused: Parse
// prints the usage and returns an error naming them. A -h returns
// flag.ErrHelp, as fs.Parse does.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	return nil
}

// Flags are the flags both daemons take, as NewFlags defines them; their
// values are valid once the flag set has parsed the arguments.
// A zero size or duration means the default of package eventbus or of its
// Handler.
type Flags struct {
	Addr            string        // -addr: listen address
	RingSize        int           // -ring: events kept per session for resumes
	MaxSubscribers  int           // -max-subscribers: concurrent streams per session
	MaxQueued       int           // -max-queued: per-stream live frame backlog
	MaxEventBytes   int           // -max-event-bytes: largest encoded event a POST may publish
	Heartbeat       time.Duration // -heartbeat: SSE heartbeat interval
	Retry           time.Duration // -retry: SSE retry: directive
	RetryJitter     time.Duration // -retry-jitter: random extra retry: per connection
	WriteTimeout    time.Duration // -write-timeout: deadline of one SSE write+flush
	EpochIDs        bool          // -epoch-ids: SSE ids "<epoch>:<N>" (on by default)
	CORSOrigin      string        // -cors-origin: comma-separated origins allowed to open the stream, or "*"
	CORSCredentials bool          // -cors-credentials: allow credentialed cross-origin streams
	TLSCert, TLSKey string        // -tls-cert, -tls-key: serve HTTPS (HTTP/2 and HTTP/1.1) with this pair
	Demo            bool          // -demo: publish "tick" events to session DemoSession
	DemoInterval    time.Duration // -demo-interval: interval between demo ticks
	ShutdownTimeout time.Duration // -shutdown-timeout: how long shutdown waits for open requests
	// -shutdown-retry-after: the retryAfter of the stream_error shutdown
	// every stream gets at shutdown (0: eventbus.DefaultShutdownRetryAfter)
	ShutdownRetryAfter time.Duration
	// -idempotency-window: how long an Idempotency-Key of a POST is
	// remembered (0: eventbus.DefaultIdempotencyWindow; sessiond passes it
	// to its Hub, the replicas to their backplane)
	IdempotencyWindow time.Duration
	// -auth-token: the static bearer token every /session route needs
	// (Authorization: Bearer, or the cookie of POST /login); empty: none
	AuthToken string
	// -token-lifetime: how long a stream (and a login) lasts before it must
	// reauthenticate; 0: no bound. Needs -auth-token.
	TokenLifetime time.Duration
	// -body-timeout: the deadline of reading a request body (408 past
	// it); 0: DefaultBodyTimeout
	BodyTimeout time.Duration
	// -body-budget: request body bytes read at once (503 server_busy past
	// it); 0: DefaultBodyBudgetBodies bodies of the largest size
	BodyBudget int64
	// -header-timeout: how long a client may take to send a request's
	// headers; 0: DefaultReadHeaderTimeout
	HeaderTimeout time.Duration
	Verbose       bool // -v: debug logging
	// -overflow: what a stream whose queue overflows gets (evict, resync
	// or catchup); the zero value is evict.
	Overflow eventbus.OverflowPolicy
	// -debug-addr and -debug-public: the debug listener (pprof and
	// expvar) Server.Run opens; the zero value is none.
	Debug Debug
	// -max-stream-sessions: the most sessions one multiplexed stream
	// (GET /events) serves; defined only for a daemon whose FlagDocs has
	// StreamSessions (0 otherwise).
	MaxStreamSessions int
}

// overflowNames are -overflow's values, by policy.
var overflowNames = map[string]eventbus.OverflowPolicy{
	"evict":   eventbus.OverflowEvict,
	"resync":  eventbus.OverflowResync,
	"catchup": eventbus.OverflowCatchUp,
}

// overflowFlag is -overflow as a flag.Value over a Flags field.
type overflowFlag struct{ p *eventbus.OverflowPolicy }

func (o overflowFlag) String() string {
	if o.p == nil {
		return "" // the flag package's zero value, so that -h shows the default
	}
	for name, p := range overflowNames {
		if p == *o.p {
			return name
		}
	}
	return "evict"
}

func (o overflowFlag) Set(s string) error {
	p, ok := overflowNames[s]
	if !ok {
		return fmt.Errorf("must be evict, resync or catchup")
	}
	*o.p = p
	return nil
}

// FlagDocs is what the daemons say differently about the shared flags.
type FlagDocs struct {
	DefaultAddr    string // default of -addr
	Ring           string // help of -ring
	MaxSubscribers string // help of -max-subscribers
	WriteTimeout   string // help of -write-timeout
	// StreamSessions is the help of -max-stream-sessions; empty: the
	// daemon serves no multiplexed stream and has no such flag.
	StreamSessions string
}

// register defines the shared flags on fs, storing into f.
func (f *Flags) register(fs *flag.FlagSet, docs FlagDocs) {
	fs.StringVar(&f.Addr, "addr", docs.DefaultAddr, "listen address")
	fs.IntVar(&f.RingSize, "ring", 0, docs.Ring)
	fs.IntVar(&f.MaxSubscribers, "max-subscribers", 0, docs.MaxSubscribers)
	fs.IntVar(&f.MaxQueued, "max-queued", 0, "per-stream live frame backlog (0: eventbus default 256)")
	fs.IntVar(&f.MaxEventBytes, "max-event-bytes", 0, "largest encoded event a POST may publish (0: eventbus default 16 MiB)")
	fs.DurationVar(&f.Heartbeat, "heartbeat", 0, "SSE heartbeat after this long without a write (0: handler default 15s)")
	fs.DurationVar(&f.Retry, "retry", 0, "SSE retry: directive sent to clients (0: handler default 3s)")
	fs.DurationVar(&f.RetryJitter, "retry-jitter", 0, "each connection's retry: is -retry plus a random delay up to this (0: handler default, half of -retry; negative: none)")
	fs.DurationVar(&f.WriteTimeout, "write-timeout", 0, docs.WriteTimeout)
	fs.BoolVar(&f.EpochIDs, "epoch-ids", true, `SSE id lines "<epoch>:<N>", so that a browser's own Last-Event-ID names the epoch (-epoch-ids=false: "N", the SPEC wire)`)
	fs.StringVar(&f.CORSOrigin, "cors-origin", "", `origins allowed to open the SSE stream from other pages, comma-separated (e.g. "https://app.example,http://localhost:5173"), or "*" for any (not with -cors-credentials); empty: no CORS`)
	fs.BoolVar(&f.CORSCredentials, "cors-credentials", false, "allow cross-origin streams with credentials (cookies, withCredentials); needs -cors-origin naming the origins (not \"*\")")
	fs.StringVar(&f.TLSCert, "tls-cert", "", "PEM certificate file: serve HTTPS, with HTTP/2 (needs -tls-key); without it the daemon serves HTTP/1.1 and h2c (HTTP/2 with prior knowledge)")
	fs.StringVar(&f.TLSKey, "tls-key", "", "PEM private key file of -tls-cert")
	fs.BoolVar(&f.Demo, "demo", false, `publish "tick" events to session "`+DemoSession+`"`)
	fs.DurationVar(&f.DemoInterval, "demo-interval", 500*time.Millisecond, "interval between demo ticks")
	fs.DurationVar(&f.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "how long shutdown waits for open requests; at it the connections left are closed (a client that does not read is cut) and the daemon exits")
	fs.DurationVar(&f.ShutdownRetryAfter, "shutdown-retry-after", 0, "at shutdown every stream ends with stream_error shutdown carrying this retryAfter: clients come back after a random delay between it and twice it (0: eventbus default 2s)")
	fs.DurationVar(&f.IdempotencyWindow, "idempotency-window", 0, "how long a POST's Idempotency-Key is remembered (0: 10m)")
	fs.StringVar(&f.AuthToken, "auth-token", "", "require this static bearer token on every /session route (Authorization: Bearer <token>, or the cookie POST /login sets for it); empty: no access control")
	fs.DurationVar(&f.TokenLifetime, "token-lifetime", 0, "with -auth-token: a stream (and a login) lasts this long, then ends with stream_error reauthenticate and the client resumes with fresh credentials (0: no bound)")
	fs.DurationVar(&f.BodyTimeout, "body-timeout", DefaultBodyTimeout, "deadline of receiving a request body, from its headers on; a slower body gets 408 and its connection is closed")
	fs.Int64Var(&f.BodyBudget, "body-budget", 0, fmt.Sprintf("request body bytes read at once; a body beyond it gets 503 server_busy with Retry-After before it is read (0: %d bodies of the largest size, -max-event-bytes plus 1 MiB)", DefaultBodyBudgetBodies))
	fs.DurationVar(&f.HeaderTimeout, "header-timeout", DefaultReadHeaderTimeout, "how long a client may take to send a request's headers; a slower one (slowloris) has its connection closed")
	if docs.StreamSessions != "" {
		fs.IntVar(&f.MaxStreamSessions, "max-stream-sessions", eventbus.DefaultMaxStreamSessions, docs.StreamSessions)
	}
	fs.StringVar(&f.Debug.Addr, "debug-addr", "", "serve the runtime's profiles and counters on this second address, e.g. 127.0.0.1:6060: net/http/pprof under /debug/pprof/, expvar's /debug/vars (memstats); "+
		"it must be loopback unless -debug-public (empty: none)")
	fs.BoolVar(&f.Debug.Public, "debug-public", false, "allow a -debug-addr that is not loopback (logged as a warning): its profiles and its command line, -auth-token included, are open to whoever reaches it")
	fs.BoolVar(&f.Verbose, "v", false, "debug logging")
	fs.Var(overflowFlag{&f.Overflow}, "overflow", "`policy` for a stream whose queue overflows: evict (client_evicted; it reconnects and resumes), "+
		"resync (its queue is dropped for a state_resync_required; evicted on the third overflow within 60s) or "+
		"catchup (it reads what it missed from the session's ring, nothing lost while the ring holds it)")
}

// Auth returns the access control of -auth-token and -token-lifetime, nil
// without -auth-token; realm names the daemon in WWW-Authenticate, secure
// marks its cookie Secure (the daemon serves HTTPS). It returns an error
// for an invalid token, or -token-lifetime without -auth-token.
func (f *Flags) Auth(realm string, secure bool) (*Auth, error) {
	if f.AuthToken == "" {
		if f.TokenLifetime != 0 {
			return nil, errors.New("-token-lifetime needs -auth-token")
		}
		return nil, nil
	}
	return NewAuth(AuthOptions{Token: f.AuthToken, Lifetime: f.TokenLifetime, Realm: realm, Secure: secure})
}

// Logger returns a text logger writing to out: at Debug level with -v,
// else at Info.
func (f *Flags) Logger(out io.Writer) *slog.Logger {
	level := slog.LevelInfo
	if f.Verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level}))
}

// Handler sets the stream settings the flags give on h: Heartbeat, Retry,
// RetryJitter, WriteTimeout, EpochIDs and CORS. It returns an error for
// -cors-credentials without -cors-origin, and for -cors-origin "*" with
// -cors-credentials (eventbus.CORS.Validate refuses it: every site would
// read the streams with its visitors' cookies).
func (f *Flags) Handler(h *eventbus.Handler) error {
	h.Heartbeat, h.Retry, h.RetryJitter, h.WriteTimeout = f.Heartbeat, f.Retry, f.RetryJitter, f.WriteTimeout
	h.BareIDs = !f.EpochIDs
	h.CORS = nil
	var origins []string
	for o := range strings.SplitSeq(f.CORSOrigin, ",") {
		if o = strings.TrimSpace(o); o != "" {
			origins = append(origins, o)
		}
	}
	switch {
	case len(origins) > 0:
		cors := &eventbus.CORS{Origins: origins, Credentials: f.CORSCredentials}
		if cors.Validate() != nil {
			return errors.New(`-cors-origin "*" with -cors-credentials would let every site read the streams with its visitors' cookies: list the allowed origins in -cors-origin, or drop -cors-credentials`)
		}
		h.CORS = cors
	case f.CORSCredentials:
		return errors.New("-cors-credentials needs -cors-origin")
	}
	return nil
}

// TLSConfig returns the TLS configuration of -tls-cert and -tls-key, or nil
// without them; an error when only one is given or the pair does not load.
func (f *Flags) TLSConfig() (*tls.Config, error) {
	if f.TLSCert == "" && f.TLSKey == "" {
		return nil, nil
	}
	if f.TLSCert == "" || f.TLSKey == "" {
		return nil, errors.New("-tls-cert and -tls-key go together")
	}
	cert, err := tls.LoadX509KeyPair(f.TLSCert, f.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("-tls-cert/-tls-key: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// BusOptions returns the bus options the flags set (ring size, subscriber
// and queue limits, event size limit, overflow policy), logging to logger.
// The options are not validated here; eventbus.New does that.
func (f *Flags) BusOptions(logger *slog.Logger) eventbus.Options {
	return eventbus.Options{
		RingSize:       f.RingSize,
		MaxSubscribers: f.MaxSubscribers,
		MaxQueued:      f.MaxQueued,
		MaxEventBytes:  f.MaxEventBytes,
		OverflowPolicy: f.Overflow,
		Logger:         logger,
	}
}

// Limits returns the Server limits the flags set: the header and body
// timeouts, the largest body (MaxBody of -max-event-bytes) and the body
// budget; the header size and keep-alive limits keep their defaults.
func (f *Flags) Limits() Limits {
	return Limits{ReadHeaderTimeout: f.HeaderTimeout, BodyTimeout: f.BodyTimeout, MaxBody: MaxBody(f.MaxEventBytes), BodyBudget: f.BodyBudget}
}
