//go:build !race

package interop

const raceEnabled = false
