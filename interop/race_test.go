//go:build race

package interop

// raceEnabled makes the test build the daemon with -race too.
const raceEnabled = true
