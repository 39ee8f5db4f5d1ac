//go:build !purego

package kernel

// The k-major tiles (kmajor_amd64.s) run x rows against one 48-row panel
// of k-major bf16 weights for k steps; acc != 0 continues from out.

//go:noescape
func kmaj8(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int, ahead int)

//go:noescape
func kmaj4(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int)

//go:noescape
func kmaj2(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int)

//go:noescape
func kmaj1(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int)

// The edge tiles run eight or sixteen x rows against the first 16
// (kmaj8e1, kmaj16e1) or 32 (kmaj8e2) columns of a panel, writing only
// those.

//go:noescape
func kmaj8e1(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int)

//go:noescape
func kmaj16e1(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int)

//go:noescape
func kmaj8e2(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int)

// The multi-stream tiles run R x rows against one panel in each of S
// streams: w holds the S panels' pointers, out the S output pointers.

//go:noescape
func kmaj4x2(x *float32, xstride int, w *[2]*uint16, k int, out *[2]*float32, ostride, acc, ahead int)

//go:noescape
func kmaj2x4(x *float32, xstride int, w *[4]*uint16, k int, out *[4]*float32, ostride, acc, ahead int)

//go:noescape
func kmaj1x4(x *float32, xstride int, w *[4]*uint16, k int, out *[4]*float32, ostride, acc, ahead int)
