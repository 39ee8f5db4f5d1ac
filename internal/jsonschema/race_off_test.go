//go:build !race

package jsonschema

const raceEnabled = false
