package pgbus

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"

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
// the same publish: the event's type and its data as encoded (absent data
// differs from null). The timestamp, the metadata and the originator are
// left out: a retry stamps a new serverTimestamp.
func fingerprint(ev eventbus.EncodedEvent) []byte {
	var env struct {
		Data json.RawMessage `json:"data"`
	}
	// The envelope is the encoder's own valid JSON; an error is impossible,
	// and would leave Data empty, which only makes the fingerprint coarser.
	_ = json.Unmarshal(ev.Envelope(0), &env)
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(ev.Type)))
	h.Write(n[:])
	h.Write([]byte(ev.Type))
	if env.Data != nil {
		h.Write([]byte{1})
		h.Write(env.Data)
	} else {
		h.Write([]byte{0})
	}
	return h.Sum(nil)
}
