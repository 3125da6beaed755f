package eventbus

// owner is what a bus belongs to, when it belongs to anything: a Hub's
// session (hubSession, hub.go: idle expiry and the byte budget) or a shared
// log's feed (feed, backplane.go: a backplane's mirror, newMirror). It is set when the bus is built
// and never changes. The bus knows nothing of either: it tells its owner of
// the few moments of its life that are the owner's business, here, and
// nothing else of the bus refers to a Hub or a backplane. A bus on its own
// (New) has none: each of these moments costs it one test of a nil
// interface, and no clock read, no atomic.
//
// The methods are called by the bus's own goroutines (a publisher, a
// subscriber's, the closer); those marked Locked under the bus lock, where
// they must not block, log or take another bus's lock, and the others
// without it.
type owner interface {
	// publishing is called by Publish before the bus lock, for a valid
	// event whose frame costs at most size bytes (frame.held), with the
	// publish's clock reading (Unix ms; 0 when it needed none: the caller
	// stamped the event and there is no MaxAge). It returns what the owner
	// reserved for the frame, handed back to ringChangedLocked, or an
	// error that refuses the event, which Publish returns as it is
	// (seam.ErrMirror on a mirror).
	publishing(size, now int64) (reserved int64, err error)
	// ringChangedLocked is called under the bus lock whenever the ring
	// changed: Publish's append (with what publishing reserved, also when
	// the bus turned out closed and the frame went nowhere), appendEntry's, a
	// drop by age, Close's reset, a trim (reserved 0). The owner may drop more of the
	// ring, oldest first, the newest frame too (a Hub's budget).
	ringChangedLocked(reserved int64)
	// used is called when the bus is used without a publish: a signal
	// (without the lock), or the last subscriber leaving (under it).
	used()
	// heldLocked is called under the bus lock when a subscriber came to
	// hold ring history from from (a frame.pin position: a replay), and
	// releasedLocked when a subscriber unregistered with frames to drain
	// let go of them (it drained them or was cancelled): a Hub's budget
	// counts what subscribers hold beyond the ring (hub_pins.go).
	heldLocked(from uint64)
	releasedLocked()
	// closed is called once, without the lock, when the bus has closed
	// (any of the Close methods, a Hub's expiry): after the ring's reset,
	// before the subscriptions get their end.
	closed()
}
