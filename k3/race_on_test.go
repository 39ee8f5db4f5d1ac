//go:build race

package k3

// raceEnabled skips allocation counts: the race detector makes sync.Pool
// drop items on purpose, so pooled scratch is reallocated.
const raceEnabled = true
