//go:build !linux

package safetensors

// dropPages is a no-op where k3 does not rely on madvise's semantics.
func dropPages(b []byte) {}
