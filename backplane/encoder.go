package backplane

import (
	"github.com/ssebus/eventbus"
	"github.com/ssebus/eventbus/internal/seam"
)

// Encoder validates and encodes events exactly as eventbus.EventBus.Publish
// does, without assigning an id: a backplane numbers events in its shared
// log (see NewMirror). It is the very encoder of every bus and Hub, so an
// event a backplane accepts is one Publish accepts, encoded to the byte.
// Make one with NewEncoder (PrepareBus makes a backplane's, Bus.Encoder).
//
// An Encoder is safe for concurrent use. Its zero value is not usable.
type Encoder struct {
	enc seam.Encoder[eventbus.Event]
}

// NewEncoder returns an encoder that applies opts' MaxEventBytes and stamps
// serverTimestamp with opts.Now (nil: the wall clock). It returns an error
// wrapping eventbus.ErrInvalidOption when opts are invalid (as eventbus.New
// would).
func NewEncoder(opts eventbus.Options) (*Encoder, error) {
	enc, err := root.NewEncoder(opts)
	if err != nil {
		return nil, err
	}
	return &Encoder{enc: enc}, nil
}

// EncodedEvent is an event encoded by an Encoder, everything but its id.
type EncodedEvent struct {
	// Type is the event's type (the SSE event: field).
	Type string
	// Tail is the JSON envelope after its leading `{"id":N`: the envelope
	// of the event numbered N is `{"id":` + N + Tail. It is the caller's.
	Tail []byte
}

// Envelope returns the complete JSON envelope of the event numbered id, as
// a LogEntry's JSON holds it.
func (e EncodedEvent) Envelope(id uint64) []byte { return seam.Encoded(e).Envelope(id) }

// Encode validates e and encodes it as Publish would. It returns an error
// wrapping eventbus.ErrInvalidEvent for an event Publish refuses as invalid
// (a type reserved for the synthetic frames included), and one wrapping
// eventbus.ErrEventTooLarge when its envelope, with the shortest id, is
// above MaxEventBytes (the envelope grows by the id's digits: a backplane
// that must be exact checks again once it has the id). Encode never
// panics, also when a MarshalJSON does.
func (enc *Encoder) Encode(e eventbus.Event) (EncodedEvent, error) {
	ev, err := enc.enc.Encode(e)
	return EncodedEvent(ev), err
}

// Fingerprint is the identity of e for idempotent publish: a hash (32 hex
// characters) of its encoding without the id and with serverTimestamp set
// to 0, so its type, data (compacted: {"a": 1} is {"a":1}), the other _meta
// keys and originatorClientId count, and the time of the attempt does not.
// Two attempts with one key and different fingerprints are a reused key
// (eventbus.ErrIdempotencyKeyReused). It is the identity
// eventbus.Hub.PublishIdempotent compares too, so a Hub and every
// backplane tell two events apart alike. It returns Encode's error for an
// event Publish would refuse.
func (enc *Encoder) Fingerprint(e eventbus.Event) (string, error) {
	return enc.enc.Fingerprint(e)
}

// CheckSignal validates a signal as eventbus.EventBus.Signal would, without
// delivering it: a backplane checks a signal before it spreads it to every
// replica (Set.PrepareSignal). It returns an error wrapping
// eventbus.ErrInvalidEvent for an invalid type and one wrapping
// eventbus.ErrEventTooLarge above MaxEventBytes.
func (enc *Encoder) CheckSignal(typ, about string) error {
	return enc.enc.CheckSignal(typ, about)
}
