// Package goroutines lists the goroutines that run k3's code, for tests
// that check that something closed leaves nothing of its own running.
package goroutines

import (
	"runtime/pprof"
	"slices"
	"strings"
)

// Running returns the stacks of the goroutines with a frame in one of
// k3's packages, other than those with a frame that names one of own (the
// test's own functions) and those that before lists (by the goroutine's
// id: what ran before, such as models that other tests keep open).
func Running(before []string, own ...string) []string {
	var b strings.Builder
	if err := pprof.Lookup("goroutine").WriteTo(&b, 2); err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, g := range strings.Split(b.String(), "\n\n") {
		// Its frames: not the line naming the function that started it.
		frames, _, _ := strings.Cut(g, "\ncreated by ")
		if !strings.Contains(frames, "\nk3/") || slices.ContainsFunc(own, func(f string) bool { return strings.Contains(frames, f) }) ||
			slices.ContainsFunc(before, func(b string) bool { return id(b) == id(g) }) {
			continue
		}
		out = append(out, g)
	}
	return out
}

// id is a stack's first line up to its state: "goroutine 12".
func id(stack string) string {
	head, _, _ := strings.Cut(stack, " [")
	return head
}
