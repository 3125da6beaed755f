package eventbus

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
)

// Idempotent publish: within a key's window, a publish retried with the
// same key appends nothing and answers the first one's id. The publish
// itself belongs to whoever keeps the keys (Hub.PublishIdempotent,
// hub_idempotency.go; each backplane's PublishIdempotent); this file is
// what they share: the key's rule (CheckIdempotencyKey) and the event's
// identity (the encoder's fingerprint: the Hub's records hold it, and
// package backplane exposes it as backplane.Encoder.Fingerprint). Its
// sentinels, ErrInvalidIdempotencyKey and ErrIdempotencyKeyReused, are in
// errors.go with the others. The rules are docs/SPEC.md section 8.3.

// MaxIdempotencyKeyBytes bounds an idempotency key (CheckIdempotencyKey).
const MaxIdempotencyKeyBytes = 255

// CheckIdempotencyKey checks an idempotency key with the rule every
// backplane and demo daemon applies: 1 to MaxIdempotencyKeyBytes bytes of
// printable ASCII (0x20 to 0x7E). It returns nil or an error wrapping
// ErrInvalidIdempotencyKey. Idempotent publish itself is a Hub's
// (Hub.PublishIdempotent) or a backplane's (redisbus.PublishIdempotent):
// within its window, a publish with a key already used appends nothing
// and answers the first publish's id.
func CheckIdempotencyKey(key string) error {
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

// Fingerprint is the identity of e for idempotent publish, in hex
// (backplane.Encoder.Fingerprint, whose doc is the contract): the
// fingerprint below, which Hub.PublishIdempotent compares, so that a Hub
// and every backplane tell two events apart alike.
func (enc *encoder) Fingerprint(e Event) (string, error) {
	sum, err := enc.fingerprint(e)
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(sum[:]), nil
}

// fingerprint is the identity of e for idempotent publish: the first 16
// bytes of the SHA-256 of its encoding without the id and with
// serverTimestamp set to 0, so its type, data (compacted: {"a": 1} is
// {"a":1}), the other _meta keys and originatorClientId count, and the time
// of the attempt does not. Two attempts with one key and different
// fingerprints are a reused key (ErrIdempotencyKeyReused). It returns
// Encode's error for an event Publish would refuse.
func (enc *encoder) fingerprint(e Event) ([16]byte, error) {
	meta := make(map[string]any, len(e.Meta)+1)
	maps.Copy(meta, e.Meta)
	meta["serverTimestamp"] = 0
	e.Meta = meta
	ev, err := enc.Encode(e)
	if err != nil {
		return [16]byte{}, err
	}
	sum := sha256.Sum256(ev.Tail)
	return [16]byte(sum[:16]), nil
}
