//go:build !amd64 || purego

package kernel

import "os"

const useAVX2 = false

const useAVX512 = false

const hasBF16Dot = false

const hasZMM = false

func wideFMA() bool { return false }

func fastBF16Pays() bool { return false }

func zmmRatio() float64 { return 0 }

func fmaLoopAVX512(n int) { panic("kernel: no assembly on this platform") }

func gemm32x6AVX512(xp *float32, w *float32, wstride, kc int, out *float32, load, xstride, xoff, ooff, ostride int, scale *float32) {
	panic("kernel: no assembly on this platform")
}

func gemm32x8AVX512(xp *float32, w *float32, wstride, kc int, out *float32, load, xstride, xoff, ooff, ostride int, scale *float32) {
	panic("kernel: no assembly on this platform")
}

func gemm32x12AVX512(xp *float32, w *float32, wstride, kc int, out *float32, load, xstride, xoff, ooff, ostride int, scale *float32) {
	panic("kernel: no assembly on this platform")
}

// forcedPath is K3_KERNEL; without assembly there is nothing to cap.
func forcedPath() string { return os.Getenv("K3_KERNEL") }

func sumAVX2(x *float32, n int) float32 { panic("kernel: no assembly on this platform") }

func fmaLoopAVX2(n int) { panic("kernel: no assembly on this platform") }

func axpyAVX2(y *float32, a float32, x *float32, n int) {
	panic("kernel: no assembly on this platform")
}

func dotAVX2(x, y *float32, n int) float32 { panic("kernel: no assembly on this platform") }

func scaleAVX2(x *float32, a float32, n int) { panic("kernel: no assembly on this platform") }

func dot4x2BF16AVX2(x *float32, xstride int, w *uint16, stride, n int, out *[8]float32) {
	panic("kernel: no assembly on this platform")
}

func dot4x1BF16AVX2(x *float32, w *uint16, stride, n int, out *[4]float32) {
	panic("kernel: no assembly on this platform")
}

func widenBF16AVX2(dst *float32, src *uint16, n int) { panic("kernel: no assembly on this platform") }

func rowUpdateAVX2(row, u, o *float32, a, b, c float32, n int) {
	panic("kernel: no assembly on this platform")
}

func expAVX2(x *float32, n int, k *[16]float32)     { panic("kernel: no assembly on this platform") }
func sigmoidAVX2(x *float32, n int, k *[16]float32) { panic("kernel: no assembly on this platform") }
func expZMM(x *float32, n int, k *[16]float32)      { panic("kernel: no assembly on this platform") }
func sigmoidZMM(x *float32, n int, k *[16]float32)  { panic("kernel: no assembly on this platform") }

func sigmoidMulZMM(dst, gate, up *float32, n int, k *[16]float32) {
	panic("kernel: no assembly on this platform")
}

func expScaleZMM(d1, d2, x1, x2, a *float32, as int, b *float32, bs, rows, n int, k *[16]float32) {
	panic("kernel: no assembly on this platform")
}
func twiceAbsQuotientAVX2(dst, x *float32, n int, c float32) {
	panic("kernel: no assembly on this platform")
}
func mulScaleZMM(dst, x, w *float32, s float32, n int) {
	panic("kernel: no assembly on this platform")
}
func situZMM(dst, gate, up *float32, n int, k, c *[16]float32) {
	panic("kernel: no assembly on this platform")
}
func convSiLU4ZMM(out, x, w *float32, stride, rows, cols int, k *[16]float32) {
	panic("kernel: no assembly on this platform")
}

func dot2x4BF16AVX2(x *float32, xstride int, w *uint16, wstride, k int, out *float32, ostride int) {
	panic("kernel: no assembly on this platform")
}

func triadAVX2(a, b, c *float32, s float32, n int) { panic("kernel: no assembly on this platform") }

func dot4x2F32AVX2(x *float32, xstride int, w *float32, stride, n int, out *[8]float32) {
	panic("kernel: no assembly on this platform")
}

func rowUpdateDotAVX2(row, e, k, q *float32, a float32, n int) float32 {
	panic("kernel: no assembly on this platform")
}

func reluAxpyAVX2(y *float32, a float32, x *float32, n int) {
	panic("kernel: no assembly on this platform")
}

func dot2x8BF16AVX512(x *float32, xstride int, w *uint16, wstride, k int, out *float32, ostride int) {
	panic("kernel: no assembly on this platform")
}

func mulAddAVX2(y, a, b *float32, n int) { panic("kernel: no assembly on this platform") }

func dot2x8F32AVX512(x *float32, xstride int, w *float32, wstride, k int, out *float32, ostride int) {
	panic("kernel: no assembly on this platform")
}

func rankUpdateAVX2(row, e, a, b *float32, ldb, c, n int) {
	panic("kernel: no assembly on this platform")
}

func addAVX2(dst, a, b *float32, n int) { panic("kernel: no assembly on this platform") }
func mulAVX2(dst, a, b *float32, n int) { panic("kernel: no assembly on this platform") }
func subAVX2(dst, a, b *float32, n int) { panic("kernel: no assembly on this platform") }

func mixAVX2(out, x, y *float32, a, b, c float32, n int) {
	panic("kernel: no assembly on this platform")
}

func indexerBlockAVX2(t, kt, q, w *float32, hi, di int) {
	panic("kernel: no assembly on this platform")
}

func indexerBlockZMM(t, kt, q, w *float32, hi, di int) {
	panic("kernel: no assembly on this platform")
}

func attnLogitsZMM(zt, k *float32, kstride int, qt *float32, hg, d, acc int) {
	panic("kernel: no assembly on this platform")
}

func indexerRowsZMM(t, k *float32, kstride int, qt, w *float32, hi, di int, ahead *float32, step int) {
	panic("kernel: no assembly on this platform")
}

func indexerRows32ZMM(t, k *float32, kstride int, qt, w *float32, hi, di int, ahead *float32, step int, acc *float32) {
	panic("kernel: no assembly on this platform")
}

func indexerRowsBF16ZMM(t, k *float32, kstride int, kb *uint16, qp *uint32, w *float32, hi, di int, ahead *float32, step int, acc *float32) {
	panic("kernel: no assembly on this platform")
}

func indexerBlockBF16ZMM(t *float32, kt *uint32, qb *uint16, w *float32, hi, di int) {
	panic("kernel: no assembly on this platform")
}

func attnLogitsBF16ZMM(zt *float32, k *uint16, kstride int, qp *uint32, hg, d, acc int) {
	panic("kernel: no assembly on this platform")
}

func matAccPairs6x32ZMM(c *float32, ldc int, a *uint16, lda int, b *uint32, ldb, kp int) {
	panic("kernel: no assembly on this platform")
}

func pairRowsBF16ZMM(dst *uint32, lo, hi *float32, n int) {
	panic("kernel: no assembly on this platform")
}

func matAccPairs1x64ZMM(c *float32, a *uint16, b *uint32, ldb, kp int) {
	panic("kernel: no assembly on this platform")
}

func transpose8AVX2(kt, src *float32, stride, di int) {
	panic("kernel: no assembly on this platform")
}

func gemm16x6AVX2(xp *float32, w *float32, wstride, kc int, out *float32, load, xstride, ostride int) {
	panic("kernel: no assembly on this platform")
}

func read4AVX2(x *float32, n int) float32 { panic("kernel: no assembly on this platform") }

func triadPlainAVX2(a, b, c *float32, s float32, n int) {
	panic("kernel: no assembly on this platform")
}

func streams4x1BF16AVX2(x *float32, w *uint16, k, rows, gap int, out *float32) {
	panic("kernel: no assembly on this platform")
}

func streams4x1F32AVX2(x *float32, w *float32, k, rows, gap int, out *float32) {
	panic("kernel: no assembly on this platform")
}

func dpbf16LoopAVX512(n int) { panic("kernel: no assembly on this platform") }

func replayRowsAVX2(row, a, k, u *float32, n, stride, ustride, vecs int) {
	panic("kernel: no assembly on this platform")
}

func replayRowsZMM(row, a, k, u *float32, n, stride, ustride, vecs int) {
	panic("kernel: no assembly on this platform")
}

func kdaRowsAVX2(st, ke, e, k, q, v, o, u *float32, beta float32, dk, dv int) {
	panic("kernel: no assembly on this platform")
}

func kdaRowsZMM(st, ke, e, k, q, v, o, u *float32, beta float32, dk, dv int) {
	panic("kernel: no assembly on this platform")
}

func rows8BF16AVX2(x *float32, xstride int, w *uint16, rows, k int, out *float32, ostride int) {
	panic("kernel: no assembly on this platform")
}

func rows8F32AVX2(x *float32, xstride int, w *float32, rows, k int, out *float32, ostride int) {
	panic("kernel: no assembly on this platform")
}

func maxAVX2(x *float32, n int) float32 { panic("kernel: no assembly on this platform") }

func situAVX2(dst, gate, up, sg, eg, eu *float32, n int, c *[16]float32) {
	panic("kernel: no assembly on this platform")
}

func tile4x3BF16AVX2(x *float32, xstride, rows int, w *uint16, triples, k int, out *float32, ostride int) {
	panic("kernel: no assembly on this platform")
}

func tile4x3F32AVX2(x *float32, xstride, rows int, w *float32, triples, k int, out *float32, ostride int) {
	panic("kernel: no assembly on this platform")
}

func toBF16ZMM(dst *uint16, src *float32, n int) { panic("kernel: no assembly on this platform") }

func tileBF16AVX512(x *uint16, xstride int, w *uint16, wstride, k int, out *float32, ostride int) {
	panic("kernel: no assembly on this platform")
}

func dot2x8BF16ZMM(x *float32, xstride int, w *uint16, wstride, k int, out *float32, ostride int) {
	panic("kernel: no assembly on this platform")
}

func dot2x8F32ZMM(x *float32, xstride int, w *float32, wstride, k int, out *float32, ostride int) {
	panic("kernel: no assembly on this platform")
}

func dot4x4BF16ZMM(x *float32, xstride int, w *uint16, wstride, k int, out *float32, ostride int) {
	panic("kernel: no assembly on this platform")
}

func dot4x8BF16ZMM(x *float32, xstride int, w *uint16, wstride, k int, out *float32, ostride int) {
	panic("kernel: no assembly on this platform")
}

func dot4x8F32ZMM(x *float32, xstride int, w *float32, wstride, k int, out *float32, ostride int) {
	panic("kernel: no assembly on this platform")
}

func kmaj8(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int, ahead int) {
	panic("kernel: no assembly on this platform")
}

func kmaj4(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int) {
	panic("kernel: no assembly on this platform")
}

func kmaj2(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int) {
	panic("kernel: no assembly on this platform")
}

func kmaj1(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int) {
	panic("kernel: no assembly on this platform")
}

func kmaj8e1(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int) {
	panic("kernel: no assembly on this platform")
}

func kmaj16e1(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int) {
	panic("kernel: no assembly on this platform")
}

func kmaj8e2(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int) {
	panic("kernel: no assembly on this platform")
}

func kmaj4x2(x *float32, xstride int, w *[2]*uint16, k int, out *[2]*float32, ostride, acc, ahead int) {
	panic("kernel: no assembly on this platform")
}

func kmaj2x4(x *float32, xstride int, w *[4]*uint16, k int, out *[4]*float32, ostride, acc, ahead int) {
	panic("kernel: no assembly on this platform")
}

func kmaj1x4(x *float32, xstride int, w *[4]*uint16, k int, out *[4]*float32, ostride, acc, ahead int) {
	panic("kernel: no assembly on this platform")
}

func kpair8(x *uint16, xstride int, w *uint16, kp int, out *float32, ostride, acc, ahead int) {
	panic("kernel: no assembly on this platform")
}

func kpair4(x *uint16, xstride int, w *uint16, kp int, out *float32, ostride int, acc int) {
	panic("kernel: no assembly on this platform")
}

func kpair2(x *uint16, xstride int, w *uint16, kp int, out *float32, ostride int, acc int) {
	panic("kernel: no assembly on this platform")
}

func kpair1(x *uint16, xstride int, w *uint16, kp int, out *float32, ostride int, acc int) {
	panic("kernel: no assembly on this platform")
}

func kpair4x2(x *uint16, xstride int, w *[2]*uint16, kp int, out *[2]*float32, ostride, acc, ahead int) {
	panic("kernel: no assembly on this platform")
}

func kpair2x4(x *uint16, xstride int, w *[4]*uint16, kp int, out *[4]*float32, ostride, acc, ahead int) {
	panic("kernel: no assembly on this platform")
}

func kpair1x4(x *uint16, xstride int, w *[4]*uint16, kp int, out *[4]*float32, ostride, acc, ahead int) {
	panic("kernel: no assembly on this platform")
}

const hasAMX = false

const amxEmulated = false

const amxCPU = false

var hasAVX512BW = false

const amxPreferred = false

func amxTiles2(cfg *amxConfig, a *uint16, astride int, b *uint16, kb int, c *float32, cstride, groups, pstride, acc, stream int) {
	panic("kernel: no assembly on this platform")
}

func amxTiles1(cfg *amxConfig, a *uint16, astride int, b *uint16, kb int, c *float32, cstride, groups int) {
	panic("kernel: no assembly on this platform")
}

func repackKMajorAMXAVX512(dst, src *uint16, pairs, pstride int, idx *[32]uint16) {
	panic("kernel: no assembly on this platform")
}

func packAMXTilesAVX512(dst, src *uint16, stride, blocks int, next *uint16) {
	panic("kernel: no assembly on this platform")
}

func transpose16AVX512(dst, src *float32, sstride, dstride int) {
	panic("kernel: no assembly on this platform")
}

func gatherRowsAVX512(dst, src *float32, rows, width, stride int) {
	panic("kernel: no assembly on this platform")
}

func amxPeakLoop(cfg *amxConfig, n int) { panic("kernel: no assembly on this platform") }

func amxStepLoop(cfg *amxConfig, n int, a, b *uint16, c *float32, mode int) {
	panic("kernel: no assembly on this platform")
}

func splitBF16AVX512(hi, mid, lo *uint16, x *float32, n int) {
	panic("kernel: no assembly on this platform")
}

func sum3AVX512(dst, a, b, c *float32, n int) { panic("kernel: no assembly on this platform") }

func roundBF16AVX512(dst *uint16, x *float32, n int) { panic("kernel: no assembly on this platform") }

func prefetchFloats(p *float32, n int) {}
