package eventbus

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

// The request bodies of the write routes (PublishHandler, SignalHandler):
// bounded in size, in time, and together, so that no client can make the
// daemon hold more than the handler's budget of bodies, whatever it sends
// (docs/SPEC.md section 6.9).

const (
	// DefaultBodyTimeout bounds the time a client takes to send a request
	// body to PublishHandler or SignalHandler, from the start of the
	// handler: a 16 MiB body at 1 MB/s fits. Past it: 408
	// request_timeout, and the connection is closed.
	DefaultBodyTimeout = 30 * time.Second
	// PublishBodySlack is what a publish body may carry beyond the largest
	// event (MaxEventBytes): the request's own field names and the
	// whitespace that compaction removes. PublishHandler's default
	// MaxBodyBytes is MaxEventBytes + PublishBodySlack.
	PublishBodySlack = 1 << 20
	// defaultBudgetBodies is how many bodies of the largest size a
	// handler's default BodyBudget admits at once.
	defaultBudgetBodies = 4
	// defaultSignalBodyBytes is SignalHandler's default MaxBodyBytes.
	defaultSignalBodyBytes = 1 << 20
)

// bodyBudget counts the bytes of the bodies a handler is reading. Its zero
// value is ready; it must not be copied after first use.
type bodyBudget struct {
	mu       sync.Mutex
	reserved int64
}

func (b *bodyBudget) reserve(n, budget int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.reserved+n > budget {
		return false
	}
	b.reserved += n
	return true
}

func (b *bodyBudget) release(n int64) {
	b.mu.Lock()
	b.reserved -= n
	b.mu.Unlock()
}

// bodyLimits are a handler's bounds of one body, with their defaults set.
type bodyLimits struct {
	max     int64         // the largest body
	timeout time.Duration // from the handler's start
	budget  int64         // the bodies read at once, at least max
}

// limits returns the bounds of fields maxBody, timeout and budget, each 0
// or negative for its default (budget: defaultBudgetBodies bodies of
// maxBody); a budget below maxBody is raised to it.
func limits(maxBody, defMax int64, timeout time.Duration, budget int64) bodyLimits {
	l := bodyLimits{max: maxBody, timeout: timeout, budget: budget}
	if l.max <= 0 {
		l.max = defMax
	}
	if l.timeout <= 0 {
		l.timeout = DefaultBodyTimeout
	}
	if l.budget <= 0 {
		l.budget = defaultBudgetBodies * l.max
	}
	l.budget = max(l.budget, l.max)
	return l
}

// readBody reads r's whole body within l, holding it once: into one buffer
// of the Content-Length when the request has one, so that a body of n
// bytes costs n bytes. A Content-Length above l.max is a *http.MaxBytesError
// before any byte is read, a body while the budget is spent by the bodies
// being read a 503 server_busy StatusError (both after refuse: the
// connection closes, the rest of the body is not read); a body that reads
// past l.max a *http.MaxBytesError, one that does not arrive within
// l.timeout an error wrapping os.ErrDeadlineExceeded, another failure of
// the read (the client went away) an invalid_body StatusError. The caller
// calls release once it no longer holds the body, error or not. It does
// not close the body (the server does).
func (b *bodyBudget) readBody(w http.ResponseWriter, r *http.Request, l bodyLimits) (body []byte, release func(), err error) {
	release = func() {}
	n := r.ContentLength
	if n == 0 || r.Body == nil || r.Body == http.NoBody {
		return nil, release, nil
	}
	if n > l.max {
		refuse(w)
		return nil, release, &http.MaxBytesError{Limit: l.max}
	}
	if n < 0 { // chunked, or HTTP/2 without Content-Length: at most max
		n = l.max
	}
	if !b.reserve(n, l.budget) {
		refuse(w)
		return nil, release, &StatusError{Status: http.StatusServiceUnavailable, Code: "server_busy",
			Message: "too many request bodies are being read; retry after Retry-After", RetryAfter: errorRetryAfter}
	}
	release = func() { b.release(n) }
	// The deadline needs no clearing once the body is read: the HTTP/1.1
	// server clears it when it reads the connection again, and on HTTP/2
	// it bounds this stream's body alone. A ResponseWriter that cannot set
	// deadlines (a test's recorder) reads without one.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(l.timeout))
	rd := http.MaxBytesReader(w, r.Body, l.max)
	if r.ContentLength > 0 {
		// The server ends the body at Content-Length (a shorter one: an
		// unexpected EOF), so the buffer is exactly the body.
		body = make([]byte, r.ContentLength)
		_, err = io.ReadFull(rd, body)
	} else {
		body, err = readAll(rd, l.max)
	}
	if err != nil {
		return nil, release, bodyError(err)
	}
	return body, release, nil
}

// readAll reads rd, a http.MaxBytesReader of limit bytes, to its end into
// a buffer that doubles from 4 KiB up to limit: a body of n bytes holds at
// most 2n bytes at once, and limit + limit/2 while the last copy is made
// (io.ReadAll's growth by a quarter allocates five times the body).
func readAll(rd io.Reader, limit int64) ([]byte, error) {
	buf := make([]byte, 0, min(limit, 4<<10))
	for {
		if len(buf) == cap(buf) {
			if int64(cap(buf)) >= limit {
				// Full: rd has only its end, or its error, left to give.
				var one [1]byte
				if n, err := rd.Read(one[:]); n == 0 && err == io.EOF {
					return buf, nil
				} else if err != nil {
					return nil, err
				}
				return nil, &http.MaxBytesError{Limit: limit}
			}
			grown := make([]byte, len(buf), min(2*int64(cap(buf)), limit))
			copy(grown, buf)
			buf = grown
		}
		n, err := rd.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// bodyError is the error of a body that could not be read or decoded:
// err itself when the table has it (past the size, past the deadline),
// else a 400 invalid_body StatusError naming err.
func bodyError(err error) error {
	var se *StatusError
	var mbe *http.MaxBytesError
	if errors.As(err, &se) || errors.As(err, &mbe) || errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	return &StatusError{Status: http.StatusBadRequest, Code: "invalid_body", Message: "malformed body: " + err.Error(), Err: err}
}

// refuse prepares the answer to a request whose body is not read: the
// connection closes after it, and the body's read deadline is now, so
// that the server does not wait on the body to discard it (it would read
// up to 256 KiB of it, for as long as the client takes).
func refuse(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
}

// rawSlice is a JSON value kept as the slice of the input it was decoded
// from (json.RawMessage copies it): for a body the caller owns.
type rawSlice []byte

func (s *rawSlice) UnmarshalJSON(b []byte) error {
	*s = b
	return nil
}

// decodeObject decodes body, which must be exactly one JSON object whose
// keys are among names (matched without regard to case, as encoding/json
// matches fields), each at most once, with nothing after it: what a
// json.Decoder with DisallowUnknownFields accepts, and stricter about a
// repeated field and trailing data. It returns the value of each name, in
// the order of names (nil when absent), each a slice of body.
func decodeObject(body []byte, names ...string) ([]rawSlice, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, errors.New("empty body")
	}
	var fields map[string]rawSlice
	if err := json.Unmarshal(body, &fields); err != nil {
		var typ *json.UnmarshalTypeError
		switch {
		case strings.Contains(err.Error(), "after top-level value"):
			return nil, errors.New("body holds more than one JSON value")
		case errors.As(err, &typ):
			return nil, fmt.Errorf("body is a JSON %s, not an object", typ.Value)
		}
		return nil, err
	}
	out := make([]rawSlice, len(names))
	for k, v := range fields {
		i := -1
		for j, name := range names {
			if strings.EqualFold(k, name) {
				i = j
			}
		}
		if i < 0 {
			return nil, fmt.Errorf("json: unknown field %q", k)
		}
		if out[i] != nil {
			return nil, fmt.Errorf("json: field %q given twice", names[i])
		}
		out[i] = v
	}
	return out, nil
}

// stringField decodes a string field of decodeObject's (absent or null:
// "").
func stringField(name string, v rawSlice) (string, error) {
	var s string
	if v == nil {
		return "", nil
	}
	if err := json.Unmarshal(v, &s); err != nil {
		return "", fmt.Errorf("json: field %q: %w", name, err)
	}
	return s, nil
}
