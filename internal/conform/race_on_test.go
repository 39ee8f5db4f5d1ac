//go:build race

package conform

// raceEnabled: the race detector slows the whole-model cases about tenfold.
const raceEnabled = true
