package backplane

// Info describes a session as the engine and this replica see it: what a
// backplane's Info method returns, and what a daemon's GET /session/{id}
// answers. The zero value is a session the engine does not hold.
type Info struct {
	// Exists reports whether the engine holds the session (an epoch).
	Exists bool
	// Epoch, LastEventID, FirstEventID and Bytes are the log's: its
	// epoch, the last id assigned, the oldest id it holds (0: none), and
	// the envelope bytes it holds (0 for an engine that does not count
	// them; its README says so).
	Epoch        string
	LastEventID  uint64
	FirstEventID uint64
	Bytes        uint64
	// Local reports whether this replica holds a mirror of the session;
	// then LocalLastEventID is the last id it delivered and Subscribers
	// its subscriber count (Set.Local).
	Local            bool
	LocalLastEventID uint64
	Subscribers      int
}
