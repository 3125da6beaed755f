package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/ssebus/eventbus"
)

// Defaults of the in-memory daemon's idempotency keys.
const (
	// DefaultIdempotencyWindow is how long a key is remembered, as
	// redisbus.DefaultIdempotencyWindow.
	DefaultIdempotencyWindow = 10 * time.Minute
	// DefaultIdempotencyKeys is the most keys one session remembers; past
	// it the oldest is forgotten first (so a daemon of MaxSessions
	// sessions holds at most MaxSessions × this many, whatever clients
	// send).
	DefaultIdempotencyKeys = 256
	// MaxIdempotencyKeyBytes bounds a key, as in every backplane.
	MaxIdempotencyKeyBytes = 255
)

var (
	// ErrInvalidIdempotencyKey is wrapped by the error for a key that is
	// not 1 to MaxIdempotencyKeyBytes bytes of printable ASCII.
	ErrInvalidIdempotencyKey = errors.New("daemon: invalid idempotency key")
	// ErrIdempotencyKeyReused is wrapped by the error of a publish whose
	// key a publish of a different event used within the window.
	ErrIdempotencyKeyReused = errors.New("daemon: idempotency key reused for a different event")
)

// ValidIdempotencyKey checks key with the rule every backplane applies: 1
// to MaxIdempotencyKeyBytes bytes of printable ASCII (0x20 to 0x7E).
func ValidIdempotencyKey(key string) error {
	if len(key) == 0 || len(key) > MaxIdempotencyKeyBytes {
		return fmt.Errorf("%w: %d bytes, want 1 to %d", ErrInvalidIdempotencyKey, len(key), MaxIdempotencyKeyBytes)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return fmt.Errorf("%w: byte %d is %#x, want printable ASCII", ErrInvalidIdempotencyKey, i, key[i])
		}
	}
	return nil
}

// Fingerprint is the identity of e for idempotency, as the backplanes
// define it: its encoding by enc (type, data, _meta, originatorClientId)
// with serverTimestamp set to 0, hashed. It returns enc's error for an
// event Publish would refuse.
func Fingerprint(enc *eventbus.Encoder, e eventbus.Event) (string, error) {
	meta := make(map[string]any, len(e.Meta)+1)
	maps.Copy(meta, e.Meta)
	meta["serverTimestamp"] = 0
	e.Meta = meta
	ev, err := enc.Encode(e)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(ev.Tail)
	return hex.EncodeToString(sum[:16]), nil
}

// Idempotency remembers the idempotency keys of one in-memory session's
// publishes, so that a client retrying a POST whose answer it lost appends
// its event once. It is safe for concurrent use; its zero value uses the
// defaults. A new session (after DELETE) gets a new one: a new epoch
// forgets the keys, as with a backplane.
type Idempotency struct {
	// Window is how long a key is remembered after its first publish; 0
	// means DefaultIdempotencyWindow.
	Window time.Duration
	// Max is the most keys remembered; 0 means DefaultIdempotencyKeys.
	Max int

	mu    sync.Mutex
	byKey map[string]idemRecord
	order []idemEntry // keys by first publish (so by expiry), oldest first
}

type idemRecord struct {
	id          uint64
	fingerprint string
	expires     time.Time
}

type idemEntry struct {
	key     string
	expires time.Time
}

// Publish runs publish, which appends an event whose Fingerprint is fp and
// returns its id, unless key was used within the window: then it returns
// that publish's id with duplicate true when fp is the same, and an error
// wrapping ErrIdempotencyKeyReused when it is not, without calling
// publish. An error from publish is returned as it is, and the key stays
// unused. publish is called with the store's lock held, so that two
// concurrent publishes with one key append once: it must not block (an
// EventBus.Publish does not).
func (c *Idempotency) Publish(key, fp string, publish func() (uint64, error)) (id uint64, duplicate bool, err error) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forget(now)
	if r, ok := c.byKey[key]; ok {
		if r.fingerprint != fp {
			return 0, false, fmt.Errorf("%w: the key's first publish has id %d", ErrIdempotencyKeyReused, r.id)
		}
		return r.id, true, nil
	}
	id, err = publish()
	if err != nil {
		return 0, false, err
	}
	if c.byKey == nil {
		c.byKey = make(map[string]idemRecord)
	}
	max := c.Max
	if max <= 0 {
		max = DefaultIdempotencyKeys
	}
	for len(c.byKey) >= max {
		c.pop()
	}
	window := c.Window
	if window <= 0 {
		window = DefaultIdempotencyWindow
	}
	exp := now.Add(window)
	c.byKey[key] = idemRecord{id: id, fingerprint: fp, expires: exp}
	c.order = append(c.order, idemEntry{key, exp})
	return id, false, nil
}

// forget drops the keys expired at now.
func (c *Idempotency) forget(now time.Time) {
	for len(c.order) > 0 && !c.order[0].expires.After(now) {
		c.pop()
	}
}

// pop drops the oldest key.
func (c *Idempotency) pop() {
	e := c.order[0]
	c.order[0] = idemEntry{}
	c.order = c.order[1:]
	delete(c.byKey, e.key) // a key has one entry: it is recorded only when absent
	if len(c.order) == 0 {
		c.order = nil // let the backing array go
	}
}
