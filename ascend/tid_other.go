//go:build !linux

package ascend

// threadID is 0 where the OS thread's id is not at hand: work issued from
// other goroutines during a capture is then not held back (CANN runs on
// Linux only; this build serves the host driver's tests).
func threadID() int { return 0 }
