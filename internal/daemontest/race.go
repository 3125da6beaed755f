//go:build race

package daemontest

// raceEnabled: this binary is built with -race, and so are the daemons
// ReplicaSuite builds.
const raceEnabled = true
