package sseclient

import (
	"encoding/json"
	"fmt"
)

// maxEventID is the largest id the server assigns (2^53-1, so that
// JavaScript clients read every id exactly).
const maxEventID = 1<<53 - 1

// The synthetic frame types of the eventbus wire; they carry no id.
const (
	TypeReplayComplete      = "replay_complete"
	TypeStateResyncRequired = "state_resync_required"
	TypeSlowClientWarning   = "slow_client_warning"
	TypeClientEvicted       = "client_evicted"
	TypeStreamError         = "stream_error"
)

// Event is a published event, delivered once: duplicates are dropped by id
// within an epoch.
type Event struct {
	// Session is, on a multiplexed stream (Client.Sessions), the session
	// the event belongs to; "" on a single stream.
	Session string
	// ID is the per-session id, 1, 2, 3 ... within Epoch.
	ID uint64
	// Epoch is the epoch the id belongs to; empty while the client does not
	// know it (a server that sends neither Event-Epoch nor epoch ids).
	Epoch string
	Type  string
	// Data is the event's JSON data: nil when it was published without
	// any, "null" when it was published as null.
	Data json.RawMessage
	// Meta is the envelope's "_meta" object (serverTimestamp and the keys
	// the publisher set).
	Meta json.RawMessage
	// ServerTimestamp is _meta.serverTimestamp: Unix milliseconds.
	ServerTimestamp    int64
	OriginatorClientID string
	// Replayed is true for events replayed after a reconnect, before the
	// OnCaughtUp of that connection.
	Replayed bool
}

// Signal is a change notification (eventbus EventBus.Signal): a type and
// the resource it is about, without id or data, never replayed.
type Signal struct {
	Session         string // its session on a multiplexed stream, else ""
	Type            string
	About           string
	Meta            json.RawMessage
	ServerTimestamp int64
}

// CaughtUp is replay_complete: what the server could replay after a resume
// has been delivered; live events follow.
type CaughtUp struct {
	// Session is its session on a multiplexed stream (each session that
	// resumed has its own), else "".
	Session             string `json:"-"`
	ReplayedCount       int    `json:"replayedCount"`
	LastReplayedEventID uint64 `json:"lastReplayedEventId"`
	LastEventID         uint64 `json:"lastEventId"`
	Epoch               string `json:"epoch"`
}

// IDRange is an inclusive range of ids. The zero IDRange (From 0) is
// empty: ids start at 1.
type IDRange struct {
	From, To uint64
}

// Empty reports whether r holds no id.
func (r IDRange) Empty() bool { return r.From == 0 || r.From > r.To }

// Resync is state_resync_required: events were lost (the server's ring no
// longer held them, the daemon restarted, the subscriber overflowed under
// the resync policy, the server could not use the cursor the client sent);
// the application should refetch its state. A
// replay_budget_exceeded resync is not reported: the client resumes on its
// own and loses nothing.
type Resync struct {
	// Session is its session on a multiplexed stream, else "".
	Session string
	// Reason is epoch_reset, ring_evicted, queue_overflow,
	// queue_bytes_overflow, cursor_invalid (the stream went on live from
	// EarliestAvailableID), or a newer server's reason.
	Reason string
	// Detail is the server's detail (epoch_mismatch), or "epoch_changed"
	// when the client saw a new epoch without an epoch_reset frame.
	Detail              string
	LastDeliveredID     uint64
	EarliestAvailableID uint64
	// Epoch is the epoch the stream continues in.
	Epoch string
	// PreviousEpoch is, for epoch_reset, the epoch of the cursor that is no
	// longer valid (empty when unknown).
	PreviousEpoch string
	// Missing is the ids of the current epoch this client lacks and will
	// not receive; empty when none are, or (for a reset the client detected
	// itself at a non-event frame) when that is unknown. For epoch_reset the
	// rest of the previous epoch is lost too, however long it was.
	Missing IDRange
}

// SlowWarning is slow_client_warning: the server's queue for this client
// passed 75% of a cap.
type SlowWarning struct {
	Session        string `json:"-"` // its session on a multiplexed stream, else ""
	QueueSize      int    `json:"queueSize"`
	MaxQueued      int    `json:"maxQueued"`
	LastEventID    uint64 `json:"lastEventId"`
	QueuedBytes    int    `json:"queuedBytes"`
	MaxQueuedBytes int    `json:"maxQueuedBytes"`
	// Threshold is "frames", "bytes" or "frames_and_bytes".
	Threshold string `json:"threshold"`
}

// Eviction is client_evicted: the server dropped this client. The Client
// reconnects with backoff and resumes from its cursor.
type Eviction struct {
	// Session is, on a multiplexed stream, the session whose queue
	// overflowed: the whole stream ends, and every session resumes.
	Session string `json:"-"`
	// Reason is queue_overflow, queue_bytes_overflow or repeated_overflow.
	Reason string `json:"reason"`
	// DroppedAfter is the first id not delivered on that connection.
	DroppedAfter   uint64 `json:"droppedAfter"`
	QueueSize      int    `json:"queueSize"`
	MaxQueued      int    `json:"maxQueued"`
	QueuedBytes    int    `json:"queuedBytes"`
	MaxQueuedBytes int    `json:"maxQueuedBytes"`
	// EventBytes is the size of the event that did not fit (bytes reason
	// only).
	EventBytes int `json:"eventBytes"`
}

// envelope is the JSON of every frame (SPEC 5.1 and 5.2).
type envelope struct {
	Session            string          `json:"session"` // multiplexed streams only
	ID                 *json.Number    `json:"id"`
	Type               string          `json:"type"`
	Data               json.RawMessage `json:"data"`
	Meta               json.RawMessage `json:"_meta"`
	About              *string         `json:"about"`
	OriginatorClientID string          `json:"originatorClientId"`
}

// resyncData is state_resync_required's data.
type resyncData struct {
	Reason              string `json:"reason"`
	Detail              string `json:"detail"`
	LastDeliveredID     uint64 `json:"lastDeliveredId"`
	EarliestAvailableID uint64 `json:"earliestAvailableId"`
	Epoch               string `json:"epoch"`
}

// streamErrorData is stream_error's data.
type streamErrorData struct {
	Error     string `json:"error"`
	ErrorKind string `json:"errorKind"`
	// RetryAfter is the milliseconds of a shutdown's retryAfter; nil when
	// absent. A float, so that a fraction does not fail the whole frame.
	RetryAfter *float64 `json:"retryAfter"`
}

// kindShutdown is the errorKind of a server going away (eventbus
// ErrorKindShutdown).
const kindShutdown = "shutdown"

// kindClosed is the errorKind of a session whose bus closed (deleted)
// while streaming (eventbus ErrorKindClosed): a single stream ends with it,
// a multiplexed one drops that session and goes on.
const kindClosed = "closed"

// id returns the envelope's id, which must be an integer in [0, 2^53-1].
func (e *envelope) id() (uint64, error) {
	var n uint64
	s := e.ID.String()
	if s == "" || len(s) > 16 {
		return 0, fmt.Errorf("%w: event id %q", ErrProtocol, s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%w: event id %q", ErrProtocol, s)
		}
		n = n*10 + uint64(s[i]-'0')
	}
	if n > maxEventID {
		return 0, fmt.Errorf("%w: event id %q", ErrProtocol, s)
	}
	return n, nil
}

// serverTimestamp reads _meta.serverTimestamp; 0 when absent.
func serverTimestamp(meta json.RawMessage) int64 {
	if meta == nil {
		return 0
	}
	var m struct {
		ServerTimestamp float64 `json:"serverTimestamp"`
	}
	if json.Unmarshal(meta, &m) != nil {
		return 0
	}
	return int64(m.ServerTimestamp)
}

// ParseEventID parses a cursor as the server accepts it (docs/SPEC.md
// sections 5.4 and 6.2): "N" or "<epoch>:<N>", N ASCII digits (leading
// zeros allowed) up to 2^53-1, epoch exactly 32 lowercase hex digits. The
// epoch is empty for the plain form. Anything else reports false.
func ParseEventID(s string) (epoch string, id uint64, ok bool) {
	n := s
	for i := 0; i < len(s); i++ {
		if s[i] == ':' {
			epoch, n = s[:i], s[i+1:]
			if !validEpoch(epoch) {
				return "", 0, false
			}
			break
		}
	}
	if n == "" {
		return "", 0, false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if c < '0' || c > '9' {
			return "", 0, false
		}
		id = id*10 + uint64(c-'0')
		if id > maxEventID {
			return "", 0, false
		}
	}
	return epoch, id, true
}

// validEpoch reports whether s is an epoch: 32 lowercase hex digits.
func validEpoch(s string) bool {
	if len(s) != 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
