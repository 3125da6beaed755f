//go:build race

package e2e

// raceEnabled makes the test build the daemon with -race too.
const raceEnabled = true
