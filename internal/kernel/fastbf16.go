package kernel

import (
	"math"
	"sync"
)

// The fast bf16 GEMM rounds x to bfloat16 (one part, what PyTorch's bf16
// matmul and vLLM do) and runs the product on the CPU's bf16 dot-product
// instruction (AVX512_BF16's VDPBF16PS), whose peak is about twice the
// fp32 FMA's on CPUs that have it. Rounding x costs accuracy: about 2^-9
// relative per element of x, which the exact kernels do not lose, so it is
// opt-in (FastBF16Available says whether this CPU has it) and serves long
// products only.

// FastBF16Available reports whether MatMulBF16Fast runs the bf16 dot
// product here; without it MatMulBF16Fast is MatMulBF16.
func FastBF16Available() bool { return hasBF16Dot }

// FastBF16Pays reports whether MatMulBF16Fast outruns the exact products
// here: the CPU has the bf16 dot product and runs it at least 1.25 times
// the FLOP rate of the FMAs the exact products issue (probed once). Where
// it does not, a backend asked for fast products is better served by the
// exact ones, faster and without the rounding.
func FastBF16Pays() bool { return fastBF16Pays() }

// fastTile is the register tile: four x rows by four weight rows.
const fastTile = 4

// fastJob holds a fast product's operands: x rounded to bf16 and padded to
// whole tiles of rows with zero rows. The pool owns one and reuses it.
type fastJob struct {
	mu      sync.Mutex
	dst, x  []float32
	xb      []uint16
	wb      []uint16
	m, n, k int
	m4      int
}

// MatMulBF16Fast is MatMulBF16 with x rounded to bfloat16 (round to nearest
// even) before the product, on the bf16 dot-product instruction where the
// CPU has it and k is a multiple of 32; otherwise it is MatMulBF16, exact.
// Each output is the tile's sixteen lane sums over k added in a fixed
// order, so a row's result does not depend on the other rows.
func (p *Pool) MatMulBF16Fast(dst, x []float32, w []uint16, m, n, k int) {
	checkMatMul(len(dst), len(x), len(w), m, n, k)
	if !hasBF16Dot || k%32 != 0 || k == 0 {
		p.MatMulBF16(dst, x, w, m, n, k)
		return
	}
	j := &p.fast
	j.mu.Lock()
	defer j.mu.Unlock()
	j.m4 = (m + fastTile - 1) / fastTile * fastTile
	if cap(j.xb) < j.m4*k {
		j.xb = make([]uint16, j.m4*k)
	}
	j.xb = j.xb[:j.m4*k]
	j.dst, j.x, j.wb, j.m, j.n, j.k = dst, x, w, m, n, k
	// Rounding x is the call's one serial-looking pass (m·k elements, as
	// many as a narrow product's weights): rows go over the pool too.
	p.Run(fastRoundRange, Args{Job: j}, m, fastRoundRows)
	clear(j.xb[m*k:])
	p.Run(fastRange, Args{Job: j}, (n+fastTile-1)/fastTile, 4)
	j.dst, j.x, j.wb = nil, nil, nil
}

// fastRoundRows is the fewest x rows a worker rounds to bf16 at a time.
const fastRoundRows = 16

// fastRoundRange rounds x rows [lo, hi) to bf16 into the job's buffer.
func fastRoundRange(a *Args, lo, hi int) {
	j := a.Job.(*fastJob)
	ToBF16(j.xb[lo*j.k:hi*j.k], j.x[lo*j.k:hi*j.k])
}

// fastRows is how many x rows a column group meets while its four weight
// rows stay in L1 (the rows' bf16 blocks, 64 rows of up to 8 KB, stay in L2).
const fastRows = 64

// fastRange computes the column groups [lo, hi) (groups of fastTile
// weight rows) for every x row. A short last group runs its rows one at a
// time, repeated across the tile, and the rows past m (zero rows of the
// padding) are computed but not stored.
func fastRange(a *Args, lo, hi int) {
	j := a.Job.(*fastJob)
	k, n := j.k, j.n
	var tile [fastTile * fastTile]float32
	for rb := 0; rb < j.m4; rb += fastRows {
		re := min(rb+fastRows, j.m4)
		for g := lo; g < hi; g++ {
			c0 := g * fastTile
			cols := min(fastTile, n-c0)
			for r := rb; r < re; r += fastTile {
				rows := min(fastTile, j.m-r) // at least 1: the padding is under a tile
				if cols == fastTile && rows == fastTile {
					tileBF16(j.xb[r*k:], k, j.wb[c0*k:], k, k, j.dst[r*n+c0:], n)
					continue
				}
				if cols == fastTile {
					tileBF16(j.xb[r*k:], k, j.wb[c0*k:], k, k, tile[:], fastTile)
					for q := range rows {
						copy(j.dst[(r+q)*n+c0:(r+q)*n+c0+fastTile], tile[q*fastTile:])
					}
					continue
				}
				for c := range cols {
					tileBF16(j.xb[r*k:], k, j.wb[(c0+c)*k:], 0, k, tile[:], fastTile)
					for q := range rows {
						j.dst[(r+q)*n+c0+c] = tile[q*fastTile]
					}
				}
			}
		}
	}
}

// tileBF16 runs the four-by-four tile (assembly where the CPU has
// VDPBF16PS, else its plain-Go twin), writing row r's four results to
// out[r*ostride:].
func tileBF16(x []uint16, xs int, w []uint16, ws, k int, out []float32, ostride int) {
	_ = x[3*xs+k-1]
	_ = w[3*ws+k-1]
	_ = out[3*ostride+fastTile-1]
	if hasBF16Dot {
		tileBF16AVX512(&x[0], xs, &w[0], ws, k, &out[0], ostride)
		return
	}
	tileBF16Go(x, xs, w, ws, k, out, ostride)
}

// tileBF16Go is the tile's specification: per accumulator lane i and step
// of 32, the products of elements 2i+1 and then 2i (exact in float32)
// added one at a time, as VDPBF16PS's description orders them; then the
// sixteen lanes summed as the assembly sums them.
func tileBF16Go(x []uint16, xs int, w []uint16, ws, k int, out []float32, ostride int) {
	for r := range fastTile {
		xr := x[r*xs : r*xs+k]
		for c := range fastTile {
			wc := w[c*ws : c*ws+k]
			var a [16]float32
			for s := 0; s < k; s += 32 {
				for i := range 16 {
					e := s + 2*i
					a[i] += bf16(xr[e+1]) * bf16(wc[e+1])
					a[i] += bf16(xr[e]) * bf16(wc[e])
				}
			}
			out[r*ostride+c] = laneSum(&a)
		}
	}
}

// laneSum adds an accumulator's sixteen lanes in the assembly's order:
// lane i with i+8, the result's i with i+4, then (0+1) + (2+3).
func laneSum(a *[16]float32) float32 {
	var y [8]float32
	for i := range y {
		y[i] = a[i] + a[i+8]
	}
	var z [4]float32
	for i := range z {
		z[i] = y[i] + y[i+4]
	}
	return (z[0] + z[1]) + (z[2] + z[3])
}

// ToBF16 rounds src to bfloat16 (to nearest, ties to even; NaN stays a
// quiet NaN) into dst.
func ToBF16(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	if n := len(src) &^ 15; hasZMM && n > 0 {
		toBF16ZMM(&dst[0], &src[0], n)
		dst, src = dst[n:], src[n:]
	}
	toBF16Scalar(dst, src)
}

// toBF16Scalar is ToBF16 one element at a time (the assembly's twin).
func toBF16Scalar(dst []uint16, src []float32) {
	for i, v := range src {
		b := math.Float32bits(v)
		if b&0x7fffffff > 0x7f800000 {
			dst[i] = uint16(b>>16) | 0x40
			continue
		}
		dst[i] = uint16((b + 0x7fff + (b>>16)&1) >> 16)
	}
}
