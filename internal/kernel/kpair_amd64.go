//go:build !purego

package kernel

// The pair tiles (kpair_amd64.s) are the k-major tiles for pair-interleaved
// weights and bf16 x rows: kp steps of one k pair each.

//go:noescape
func kpair8(x *uint16, xstride int, w *uint16, kp int, out *float32, ostride, acc, ahead int)

//go:noescape
func kpair4(x *uint16, xstride int, w *uint16, kp int, out *float32, ostride int, acc int)

//go:noescape
func kpair2(x *uint16, xstride int, w *uint16, kp int, out *float32, ostride int, acc int)

//go:noescape
func kpair1(x *uint16, xstride int, w *uint16, kp int, out *float32, ostride int, acc int)

//go:noescape
func kpair4x2(x *uint16, xstride int, w *[2]*uint16, kp int, out *[2]*float32, ostride, acc, ahead int)

//go:noescape
func kpair2x4(x *uint16, xstride int, w *[4]*uint16, kp int, out *[4]*float32, ostride, acc, ahead int)

//go:noescape
func kpair1x4(x *uint16, xstride int, w *[4]*uint16, kp int, out *[4]*float32, ostride, acc, ahead int)
