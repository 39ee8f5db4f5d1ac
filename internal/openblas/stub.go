//go:build !(openblas && cgo)

// Package openblas binds the few OpenBLAS routines `k3 bench kernels`
// compares k3's kernels with; this build has no binding (build with
// -tags openblas and cgo, against libopenblas-dev).
package openblas

// Available reports whether the binding is built in.
const Available = false

// SetThreads does nothing without the binding.
func SetThreads(n int) {}

// CoreName is empty without the binding.
func CoreName() string { return "" }

// Sgemm panics without the binding.
func Sgemm(c, a, b []float32, m, n, k int) { panic("openblas: not built in") }

// Sgemv panics without the binding.
func Sgemv(y, w, x []float32, n, k int) { panic("openblas: not built in") }
