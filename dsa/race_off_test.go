//go:build !race

package dsa

const raceEnabled = false
