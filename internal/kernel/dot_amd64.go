//go:build !purego

package kernel

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/cpu"
)

// forced is K3_KERNEL, which caps the kernel path below what the CPU has
// (see Path), so that the tests can run every path the machine has.
var forced = os.Getenv("K3_KERNEL")

func forcedPath() string { return forced }

// useAVX2 selects the assembly dot products; the plain-Go loops remain the
// specification they are tested against.
var useAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA && forced != "go"

// useAVX512 selects kernels that need AVX-512VL's 32 vector registers. They
// keep the 256-bit lanes of the AVX2 kernels, so results do not depend on
// which set runs.
var useAVX512 = useAVX2 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && forced != "avx2"

// hasAVX512BW selects AVX512BW's word shuffles (the k-major panels'
// repacking for the AMX tiles).
var hasAVX512BW = useAVX512 && cpu.X86.HasAVX512BW

// hasBF16Dot reports AVX512_BF16 (VDPBF16PS), measured by PeakBF16DotFLOPS;
// only the opt-in MatMulBF16Fast uses it (it rounds activations to
// bfloat16).
var hasBF16Dot = useAVX512 && cpu.X86.HasAVX512BF16 && cpu.X86.HasAVX512BW && forced != "avx512"

// hasZMM reports that the CPU can run the 512-bit kernels (AVX-512F and
// VL, not capped below them by K3_KERNEL).
var hasZMM = useAVX512 && forced != "avx512"

// wideFMA reports whether the 512-bit kernels run (the packed GEMM's tile,
// the zmm 2x8 and 4x8 tiles): where the CPU has them and either
// K3_KERNEL=zmm forces them or a probe finds a 512-bit FMA at least 1.5
// times as fast as a 256-bit one (2.0x on Zen 5; Zen 4 runs it as two
// halves, about 1x); K3_KERNEL=halfzmm answers no without the probe. Each of those kernels gives the same bits as its
// 256-bit twin, but the answer also moves the packed GEMM's range
// (usePacked), whose roundings differ from the dot-form tiles'. The probe
// runs once, at the first use, so the answer is fixed for the process.
var wideFMA = sync.OnceValue(func() bool {
	if !hasZMM {
		return false
	}
	switch forced {
	case "zmm":
		return true
	case "halfzmm":
		return false
	}
	return zmmRatio() >= 1.5
})

// fastBF16Pays reports whether the bf16 dot product (VDPBF16PS) runs at
// least 1.25 times the FLOP rate of the FMAs the exact products issue
// (512-bit where wideFMA, else 256-bit): 1.8-1.9x on Zen 4 and Zen 5,
// about 0.5x on an Intel Xeon with AMX, where the fast product ran at 0.6x
// the exact one (docs/bench). Probed once, at the first use; under
// K3_AMX=emulate the answer is the Xeon's, no, so that the emulated run
// makes an AMX CPU's choices in the fast backend too.
var fastBF16Pays = sync.OnceValue(func() bool {
	return hasBF16Dot && !amxEmulated && bf16DotRatio() >= 1.25
})

// bf16DotRatio measures on the calling goroutine the FLOP rate of a
// VDPBF16PS loop over that of the exact products' FMA loop.
func bf16DotRatio() float64 {
	fma, flops := fmaLoopAVX2, 16.0
	if wideFMA() {
		fma, flops = fmaLoopAVX512, 32
	}
	tFMA, tDot := bestOfPairs(fma, dpbf16LoopAVX512)
	return (64 / tDot.Seconds()) / (flops / tFMA.Seconds())
}

// zmmRatio measures on the calling goroutine how many times the 256-bit
// FMA rate a 512-bit FMA loop runs.
func zmmRatio() float64 {
	t256, t512 := bestOfPairs(fmaLoopAVX2, fmaLoopAVX512)
	return 2 * t256.Seconds() / t512.Seconds()
}

// bestOfPairs times two register-only loops of the same iteration count
// in five interleaved pairs (about a millisecond in all) and returns the
// best time of each.
func bestOfPairs(a, b func(n int)) (ta, tb time.Duration) {
	const iters = 40_000
	for r := range 5 {
		start := time.Now()
		a(iters)
		da := time.Since(start)
		start = time.Now()
		b(iters)
		db := time.Since(start)
		if r == 0 || da < ta {
			ta = da
		}
		if r == 0 || db < tb {
			tb = db
		}
	}
	return ta, tb
}

//go:noescape
func fmaLoopAVX512(n int)

//go:noescape
func gemm32x6AVX512(xp *float32, w *float32, wstride, kc int, out *float32, load, xstride, xoff, ooff, ostride int, scale *float32)

//go:noescape
func gemm32x8AVX512(xp *float32, w *float32, wstride, kc int, out *float32, load, xstride, xoff, ooff, ostride int, scale *float32)

//go:noescape
func gemm32x12AVX512(xp *float32, w *float32, wstride, kc int, out *float32, load, xstride, xoff, ooff, ostride int, scale *float32)

//go:noescape
func tileBF16AVX512(x *uint16, xstride int, w *uint16, wstride, k int, out *float32, ostride int)

// toBF16ZMM is ToBF16 over the first n&^15 elements (fastbf16_amd64.s).
//
//go:noescape
func toBF16ZMM(dst *uint16, src *float32, n int)

//go:noescape
func sumAVX2(x *float32, n int) float32

//go:noescape
func fmaLoopAVX2(n int)

//go:noescape
func axpyAVX2(y *float32, a float32, x *float32, n int)

//go:noescape
func dotAVX2(x, y *float32, n int) float32

//go:noescape
func scaleAVX2(x *float32, a float32, n int)

//go:noescape
func dot4x2BF16AVX2(x *float32, xstride int, w *uint16, stride, n int, out *[8]float32)

//go:noescape
func dot4x1BF16AVX2(x *float32, w *uint16, stride, n int, out *[4]float32)

//go:noescape
func widenBF16AVX2(dst *float32, src *uint16, n int)

//go:noescape
func rowUpdateAVX2(row, u, o *float32, a, b, c float32, n int)

//go:noescape
func expAVX2(x *float32, n int, k *[16]float32)

//go:noescape
func sigmoidAVX2(x *float32, n int, k *[16]float32)

//go:noescape
func expZMM(x *float32, n int, k *[16]float32)

//go:noescape
func sigmoidZMM(x *float32, n int, k *[16]float32)

//go:noescape
func expScaleZMM(d1, d2, x1, x2, a *float32, as int, b *float32, bs, rows, n int, k *[16]float32)

//go:noescape
func twiceAbsQuotientAVX2(dst, x *float32, n int, c float32)

//go:noescape
func mulScaleZMM(dst, x, w *float32, s float32, n int)

//go:noescape
func situZMM(dst, gate, up *float32, n int, k, c *[16]float32)

//go:noescape
func sigmoidMulZMM(dst, gate, up *float32, n int, k *[16]float32)

//go:noescape
func convSiLU4ZMM(out, x, w *float32, stride, rows, cols int, k *[16]float32)

// expBody is the shared vector exponential called by expAVX2 and
// sigmoidAVX2 (register calling convention of its own; not callable from Go).
//
//lint:ignore U1000 called only from assembly (CALL from other TEXT blocks), which staticcheck does not see
func expBody()

//go:noescape
func dot2x4BF16AVX2(x *float32, xstride int, w *uint16, wstride, k int, out *float32, ostride int)

//go:noescape
func triadAVX2(a, b, c *float32, s float32, n int)

//go:noescape
func dot4x2F32AVX2(x *float32, xstride int, w *float32, stride, n int, out *[8]float32)

//go:noescape
func rowUpdateDotAVX2(row, e, k, q *float32, a float32, n int) float32

//go:noescape
func reluAxpyAVX2(y *float32, a float32, x *float32, n int)

//go:noescape
func dot2x8BF16AVX512(x *float32, xstride int, w *uint16, wstride, k int, out *float32, ostride int)

// reduce2x4 is the 2x4 tiles' reduction and store, as dot2x4BF16AVX2 does it (own register
// convention; not callable from Go).
//
//lint:ignore U1000 called only from assembly (CALL from other TEXT blocks), which staticcheck does not see
func reduce2x4()

// store4x1 is the stream kernels' shared reduction and store (own register
// convention; not callable from Go).
//
//lint:ignore U1000 called only from assembly (CALL from other TEXT blocks), which staticcheck does not see
func store4x1()

//go:noescape
func mulAddAVX2(y, a, b *float32, n int)

//go:noescape
func dot2x8F32AVX512(x *float32, xstride int, w *float32, wstride, k int, out *float32, ostride int)

//go:noescape
func rankUpdateAVX2(row, e, a, b *float32, ldb, c, n int)

//go:noescape
func addAVX2(dst, a, b *float32, n int)

//go:noescape
func mulAVX2(dst, a, b *float32, n int)

//go:noescape
func subAVX2(dst, a, b *float32, n int)

//go:noescape
func mixAVX2(out, x, y *float32, a, b, c float32, n int)

//go:noescape
func indexerBlockAVX2(t, kt, q, w *float32, hi, di int)

//go:noescape
func transpose8AVX2(kt, src *float32, stride, di int)

//go:noescape
func indexerBlockZMM(t, kt, q, w *float32, hi, di int)

//go:noescape
func attnLogitsZMM(zt, k *float32, kstride int, qt *float32, hg, d, acc int)

//go:noescape
func indexerRowsZMM(t, k *float32, kstride int, qt, w *float32, hi, di int, ahead *float32, step int)

//go:noescape
func indexerRows32ZMM(t, k *float32, kstride int, qt, w *float32, hi, di int, ahead *float32, step int, acc *float32)

//go:noescape
func indexerRowsBF16ZMM(t, k *float32, kstride int, kb *uint16, qp *uint32, w *float32, hi, di int, ahead *float32, step int, acc *float32)

//go:noescape
func indexerBlockBF16ZMM(t *float32, kt *uint32, qb *uint16, w *float32, hi, di int)

//go:noescape
func attnLogitsBF16ZMM(zt *float32, k *uint16, kstride int, qp *uint32, hg, d, acc int)

//go:noescape
func matAccPairs6x32ZMM(c *float32, ldc int, a *uint16, lda int, b *uint32, ldb, kp int)

//go:noescape
func pairRowsBF16ZMM(dst *uint32, lo, hi *float32, n int)

//go:noescape
func matAccPairs1x64ZMM(c *float32, a *uint16, b *uint32, ldb, kp int)

//go:noescape
func gemm16x6AVX2(xp *float32, w *float32, wstride, kc int, out *float32, load, xstride, ostride int)

//go:noescape
func read4AVX2(x *float32, n int) float32

//go:noescape
func triadPlainAVX2(a, b, c *float32, s float32, n int)

//go:noescape
func streams4x1BF16AVX2(x *float32, w *uint16, k, rows, gap int, out *float32)

//go:noescape
func streams4x1F32AVX2(x *float32, w *float32, k, rows, gap int, out *float32)

//go:noescape
func dpbf16LoopAVX512(n int)

//go:noescape
func replayRowsAVX2(row, a, k, u *float32, n, stride, ustride, vecs int)

//go:noescape
func replayRowsZMM(row, a, k, u *float32, n, stride, ustride, vecs int)

//go:noescape
func kdaRowsAVX2(st, ke, e, k, q, v, o, u *float32, beta float32, dk, dv int)

//go:noescape
func kdaRowsZMM(st, ke, e, k, q, v, o, u *float32, beta float32, dk, dv int)

//go:noescape
func rows8BF16AVX2(x *float32, xstride int, w *uint16, rows, k int, out *float32, ostride int)

//go:noescape
func rows8F32AVX2(x *float32, xstride int, w *float32, rows, k int, out *float32, ostride int)

// reduce8x1 is rows8's reduction and store (own register convention; not
// callable from Go).
//
//lint:ignore U1000 called only from assembly (CALL from other TEXT blocks), which staticcheck does not see
func reduce8x1()

//go:noescape
func maxAVX2(x *float32, n int) float32

//go:noescape
func situAVX2(dst, gate, up, sg, eg, eu *float32, n int, c *[16]float32)

// tanhBody is situAVX2's vector tanhExp (own register convention; not
// callable from Go).
//
//lint:ignore U1000 called only from assembly (CALL from other TEXT blocks), which staticcheck does not see
func tanhBody()

//go:noescape
func tile4x3BF16AVX2(x *float32, xstride, rows int, w *uint16, triples, k int, out *float32, ostride int)

//go:noescape
func tile4x3F32AVX2(x *float32, xstride, rows int, w *float32, triples, k int, out *float32, ostride int)

// store4x3 is the four-by-three tiles' reduction and store (own register
// convention; not callable from Go).
//
//lint:ignore U1000 called only from assembly (CALL from other TEXT blocks), which staticcheck does not see
func store4x3()

//go:noescape
func dot2x8BF16ZMM(x *float32, xstride int, w *uint16, wstride, k int, out *float32, ostride int)

//go:noescape
func dot2x8F32ZMM(x *float32, xstride int, w *float32, wstride, k int, out *float32, ostride int)

// store2x8ZMM is the zmm 2x8 tiles' reduction and store (own register
// convention; not callable from Go).
//
//lint:ignore U1000 called only from assembly (CALL from other TEXT blocks), which staticcheck does not see
func store2x8ZMM()

// store4x8ZMM is the four-row zmm tiles' reduction and store (own
// register convention; not callable from Go).
//
//lint:ignore U1000 called only from assembly (CALL from other TEXT blocks), which staticcheck does not see
func store4x8ZMM()

//go:noescape
func dot4x8BF16ZMM(x *float32, xstride int, w *uint16, wstride, k int, out *float32, ostride int)

//go:noescape
func dot4x4BF16ZMM(x *float32, xstride int, w *uint16, wstride, k int, out *float32, ostride int)

//go:noescape
func dot4x8F32ZMM(x *float32, xstride int, w *float32, wstride, k int, out *float32, ostride int)
