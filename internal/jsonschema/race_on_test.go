//go:build race

package jsonschema

// raceEnabled skips allocation counts: the race detector makes sync.Pool
// drop items on purpose, so pooled scratch is reallocated.
const raceEnabled = true
