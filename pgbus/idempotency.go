package pgbus

import (
	"crypto/sha256"
	"fmt"
	"maps"

	"github.com/ssebus/eventbus"
)

// validKey checks an idempotency key: 1 to MaxIdempotencyKeyBytes bytes of
// printable ASCII (0x20 to 0x7e).
func validKey(key string) error {
	if key == "" || len(key) > MaxIdempotencyKeyBytes {
		return fmt.Errorf("%w: %d bytes, want 1 to %d", ErrInvalidIdempotencyKey, len(key), MaxIdempotencyKeyBytes)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: byte %d is %#02x, not printable ASCII", ErrInvalidIdempotencyKey, i, c)
		}
	}
	return nil
}

// fingerprint identifies what a retry must repeat for its key to count as
// the same publish: the event as encoded (type, data, _meta,
// originatorClientId) with serverTimestamp set to 0, so that the time a
// retry is stamped with does not make it another event, and {"a": 1} and
// {"a":1} are the same data. This is redisbus's and the in-memory demo
// daemon's definition too. It returns the encoder's error for an event
// Publish would refuse.
func fingerprint(enc *eventbus.Encoder, e eventbus.Event) ([]byte, error) {
	meta := make(map[string]any, len(e.Meta)+1)
	maps.Copy(meta, e.Meta)
	meta["serverTimestamp"] = 0
	e.Meta = meta
	ev, err := enc.Encode(e)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(ev.Tail)
	return sum[:], nil
}
