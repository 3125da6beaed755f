package daemon

import (
	"fmt"
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
)

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
// wrapping eventbus.ErrIdempotencyKeyReused when it is not, without calling
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
			return 0, false, fmt.Errorf("%w: the key's first publish has id %d", eventbus.ErrIdempotencyKeyReused, r.id)
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
