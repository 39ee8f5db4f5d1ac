//go:build !race

package k3

const raceEnabled = false
