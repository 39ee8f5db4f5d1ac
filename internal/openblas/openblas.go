//go:build openblas && cgo

// Package openblas binds the few OpenBLAS routines `k3 bench kernels`
// compares k3's kernels with. It is benchmark-only: built with the
// openblas tag against Debian's libopenblas-dev; the default build never
// uses cgo. Set OPENBLAS_CORETYPE=SkylakeX on CPUs that Debian's OpenBLAS
// misdetects, before the program starts.
package openblas

/*
#cgo LDFLAGS: -lopenblas
#include <cblas.h>
char* openblas_get_corename(void);
void openblas_set_num_threads(int);
*/
import "C"

// Available reports whether the binding is built in.
const Available = true

// SetThreads sets OpenBLAS's thread count.
func SetThreads(n int) { C.openblas_set_num_threads(C.int(n)) }

// CoreName is the kernel set OpenBLAS chose for this CPU.
func CoreName() string { return C.GoString(C.openblas_get_corename()) }

// Sgemm computes c[m,n] = a[m,k] · b[n,k]ᵀ (row major; the Linear layout).
func Sgemm(c, a, b []float32, m, n, k int) {
	C.cblas_sgemm(C.CblasRowMajor, C.CblasNoTrans, C.CblasTrans, C.blasint(m), C.blasint(n), C.blasint(k),
		1, (*C.float)(&a[0]), C.blasint(k), (*C.float)(&b[0]), C.blasint(k), 0, (*C.float)(&c[0]), C.blasint(n))
}

// Sgemv computes y[n] = w[n,k] · x[k].
func Sgemv(y, w, x []float32, n, k int) {
	C.cblas_sgemv(C.CblasRowMajor, C.CblasNoTrans, C.blasint(n), C.blasint(k), 1, (*C.float)(&w[0]), C.blasint(k),
		(*C.float)(&x[0]), 1, 0, (*C.float)(&y[0]), 1)
}
