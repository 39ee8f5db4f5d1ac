package kernel

import "math"

// bf16 widens one bfloat16 weight.
func bf16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Dot returns sum x[i]*y[i].
func Dot(x, y []float32) float32 {
	y = y[:len(x)]
	var s0, s1, s2, s3 float32
	i := 0
	if useAVX2 && len(x) >= 8 {
		i = len(x) &^ 7
		s0 = dotAVX2(&x[0], &y[0], i)
	}
	for ; i+4 <= len(x); i += 4 {
		s0 += x[i] * y[i]
		s1 += x[i+1] * y[i+1]
		s2 += x[i+2] * y[i+2]
		s3 += x[i+3] * y[i+3]
	}
	for ; i < len(x); i++ {
		s0 += x[i] * y[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// MatMul computes dst[m,n] = sum_k x[m,k] * w[n,k] (y = x W^T, the Linear
// layout) for x [M,K], w [N,K], dst [M,N]. Every weight row is read once per
// call, for all M rows of x, so a decode batch costs one pass over W.
func (p *Pool) MatMul(dst, x, w []float32, m, n, k int) {
	checkMatMul(len(dst), len(x), len(w), m, n, k)
	if usePacked(m, n, k) {
		p.matMulPacked(dst, x, w, nil, m, n, k)
		return
	}
	p.splitMatMul(Args{Dst: dst, X: x, W: w, M: m, N: n, K: k}, matMulRange, matMulRows)
}

// MatMulBF16 is MatMul with bfloat16 weights, widened in registers.
func (p *Pool) MatMulBF16(dst, x []float32, w []uint16, m, n, k int) {
	checkMatMul(len(dst), len(x), len(w), m, n, k)
	if usePacked(m, n, k) {
		p.matMulPacked(dst, x, nil, w, m, n, k)
		return
	}
	p.splitMatMul(Args{Dst: dst, X: x, WB: w, M: m, N: n, K: k}, matMulBF16Range, matMulBF16Rows)
}

// splitMatMul runs a product of the dot-form tiles over the pool: cols
// computes a range of weight rows (output columns) for every x row, rows a
// range of x rows against the whole weight. One x row reads the weight as
// four spaced streams (streams4x1), which every range restarts, so it runs
// as one range a goroutine; a weight too narrow to split (byRows) splits
// by x rows; any other product by weight rows in Run's pieces.
func (p *Pool) splitMatMul(a Args, cols, rows func(a *Args, lo, hi int)) {
	switch {
	case a.M == 1:
		p.RunShares(cols, a, a.N, 16)
	case p.byRows(a.M, a.N):
		p.RunShares(rows, a, a.M, 8)
	default:
		p.Run(cols, a, a.N, 16)
	}
}

// byRows reports whether a product of m x rows against a weight of n rows
// splits over the pool by x rows rather than by weight rows: where the
// weight has too few rows for a range of sixteen a goroutine (KDA's b_proj
// of a head's six rows, the indexer's weights) and x enough rows that each
// goroutine still takes a prefill-sized block (the tiles walk x rows in
// groups of eight). Every output keeps its arithmetic (the tiles'
// per-output chains do not depend on the rows beside it), so the bits are
// those of the split by weight rows.
func (p *Pool) byRows(m, n int) bool {
	return m >= byRowsMin && (n+15)/16 < p.Size()
}

// byRowsMin is the fewest x rows byRows splits by.
const byRowsMin = 64

// matMulRows and matMulBF16Rows compute x rows [lo, hi) against the whole
// weight.
func matMulRows(a *Args, lo, hi int) {
	b := rowsOf(a, lo, hi)
	matMulRange(&b, 0, a.N)
}

func matMulBF16Rows(a *Args, lo, hi int) {
	b := rowsOf(a, lo, hi)
	matMulBF16Range(&b, 0, a.N)
}

// rowsOf returns a's product restricted to x rows [lo, hi).
func rowsOf(a *Args, lo, hi int) Args {
	b := *a
	b.X, b.Dst, b.M = a.X[lo*a.K:], a.Dst[lo*a.N:], hi-lo
	return b
}

func checkMatMul(nd, nx, nw, m, n, k int) {
	if nd < m*n || nx < m*k || nw < n*k {
		panic("kernel: MatMul operand too short")
	}
}

// matMulRange computes output columns [lo, hi) for float32 weights, with
// the structure and arithmetic of matMulBF16Range (see there): four-row
// weight tiles against pairs of x rows, whole-tile runs for a single row.
func matMulRange(a *Args, lo, hi int) {
	k := a.K
	if a.M == 1 && useAVX2 && k%8 == 0 && k > 0 {
		gap := (hi - lo) / 4
		if gap > 0 {
			streams4x1F32AVX2(&a.X[0], &a.W[lo*k], k, gap, gap, &a.Dst[lo])
		}
		lo += 4 * gap
	}
	// Groups of eight x rows on the eight-row tiles (2x8 with AVX-512VL
	// registers, else rows8, which for f32 weights beats the four-by-two
	// tiles from eight rows: attention's blocks of 8 query rows against 64
	// keys, BenchmarkAttnDense), the weights walked
	// in L2-sized blocks; same per-output arithmetic as the four-by-two
	// tiles that take the remaining rows.
	if tiles4x3(a, lo, hi) {
		return
	}
	r8 := 0
	if useAVX2 && k%8 == 0 && k > 0 && a.M >= 8 {
		r8 = a.M &^ 7
		const tileCols = 32
		pairsHi := lo + (hi-lo)&^1
		for jb := lo; jb < hi; jb += tileCols {
			tiles8(a, jb, min(jb+tileCols, hi), pairsHi, r8)
		}
		if useAVX512 && (hi-lo)%2 == 1 {
			loneWeightRow(a, hi-1, 0, r8, r8)
		}
	}
	tiles4x2(a, lo, hi, r8)
}

// dot4x2F32 is dot4x2BF16 for float32 weights.
func dot4x2F32(x []float32, xs int, w []float32, stride, k int, d *[8]float32) {
	*d = [8]float32{}
	done := 0
	if useAVX2 && k >= 8 {
		done = k &^ 7
		dot4x2F32AVX2(&x[0], xs, &w[0], stride, done, d)
	}
	if done < k {
		for r := 0; r < 2; r++ {
			xr := x[r*xs+done : r*xs+k]
			d0, d1, d2, d3 := dot4(xr, w[done:], w[stride+done:], w[2*stride+done:], w[3*stride+done:])
			d[r*4], d[r*4+1], d[r*4+2], d[r*4+3] = d[r*4]+d0, d[r*4+1]+d1, d[r*4+2]+d2, d[r*4+3]+d3
		}
	}
}

func dot4(x, w0, w1, w2, w3 []float32) (float32, float32, float32, float32) {
	w0, w1, w2, w3 = w0[:len(x)], w1[:len(x)], w2[:len(x)], w3[:len(x)]
	var a0, a1, a2, a3, b0, b1, b2, b3 float32
	i := 0
	for ; i+2 <= len(x); i += 2 {
		x0, x1 := x[i], x[i+1]
		a0 += x0 * w0[i]
		a1 += x0 * w1[i]
		a2 += x0 * w2[i]
		a3 += x0 * w3[i]
		b0 += x1 * w0[i+1]
		b1 += x1 * w1[i+1]
		b2 += x1 * w2[i+1]
		b3 += x1 * w3[i+1]
	}
	if i < len(x) {
		x0 := x[i]
		a0 += x0 * w0[i]
		a1 += x0 * w1[i]
		a2 += x0 * w2[i]
		a3 += x0 * w3[i]
	}
	return a0 + b0, a1 + b1, a2 + b2, a3 + b3
}

// WidenBF16 widens bfloat16 values to float32.
func WidenBF16(dst []float32, src []uint16) {
	src = src[:len(dst)]
	i := 0
	if useAVX2 && len(dst) >= 8 {
		i = len(dst) &^ 7
		widenBF16AVX2(&dst[0], &src[0], i)
	}
	for ; i < len(dst); i++ {
		dst[i] = bf16(src[i])
	}
}

// matMulBF16Range computes output columns [lo, hi) for bf16 weights: a
// tile of four weight rows against two rows of x at a time, each weight
// widened once per pair of rows (and, streaming from memory, overlapping
// the loads with the arithmetic). A lone last x row goes through a kernel
// with the same per-row arithmetic, and a leftover weight row through the
// tile with its row repeated, so every output element gets the same
// arithmetic whatever the batch: a session's logits do not depend on who it
// is batched with.
func matMulBF16Range(a *Args, lo, hi int) {
	k, n := a.K, a.N
	if a.M == 1 && useAVX2 && k%8 == 0 && k > 0 {
		// One row of x: the range's rows as four long streams (same
		// arithmetic as dot4x1BF16AVX2 and the tiles), then the leftover
		// rows below.
		gap := (hi - lo) / 4
		if gap > 0 {
			streams4x1BF16AVX2(&a.X[0], &a.WB[lo*k], k, gap, gap, &a.Dst[lo])
		}
		lo += 4 * gap
	}
	// Without AVX-512, tiles4x3 takes the longer products (above); what
	// follows runs the rest, and all of them with tiles43Off.
	//
	// Rows [0, rTile) go through tiles that widen each weight once per
	// group of x rows: two weight rows against eight (AVX-512VL registers)
	// or four rows of x, or, without AVX-512 and for prefill-sized
	// products, one weight row against eight (rows8: the x rows are memory
	// operands, which bounds it by loads, so decode batches keep the 2x4
	// tile); the rest through the four-by-two tiles below. Decode batches
	// of 4 to 16 rows always take the tiles; longer (prefill) products
	// walk the weights in blocks of tileCols rows so that a block stays in
	// L2 while the eight x rows stay in L1.
	if tiles4x3(a, lo, hi) {
		return
	}
	rTile, r8 := 0, 0
	decode := a.M >= 4 && a.M <= 16
	if useAVX2 && k%8 == 0 && k > 0 {
		if a.M >= 8 && (useAVX512 || !decode) {
			r8 = a.M &^ 7
		}
		rTile = r8
		if decode || (dotWide() && a.M <= 32) {
			// Four rows beside the groups of eight (a scheduler's pass of
			// decode rows and a prompt's chunk) take the four-row tiles,
			// on zmm registers a weight quad widened once for the four.
			rTile = a.M &^ 3
		}
	}
	if rTile > 0 && r8 == 0 {
		// A decode batch without the 2x8 tile: each weight pair meets every
		// group of four x rows while it is in L1, so the weights stream from
		// memory without pause (a block walked once per group would leave
		// memory idle while the later groups reread it from L2).
		pairsHi := lo + (hi-lo)&^1
		for j := lo; j < pairsHi; j += 2 {
			for r := 0; r < rTile; r += 4 {
				dot2x4BF16AVX2(&a.X[r*k], k, &a.WB[j*k], k, k, &a.Dst[r*n+j], n)
			}
		}
		if (hi-lo)%2 == 1 {
			loneWeightRow(a, hi-1, 0, 0, rTile)
		}
	} else if rTile > 0 {
		const tileCols = 64
		pairsHi := lo + (hi-lo)&^1
		for jb := lo; jb < hi; jb += tileCols {
			je := min(jb+tileCols, hi)
			tiles8(a, jb, je, pairsHi, r8)
			for r := r8; r < rTile; r += 4 {
				j := jb
				if dotWide() {
					for ; j+4 <= min(je, pairsHi); j += 4 {
						dot4x4BF16ZMM(&a.X[r*k], k, &a.WB[j*k], k, k, &a.Dst[r*n+j], n)
					}
				}
				for ; j < min(je, pairsHi); j += 2 {
					dot2x4BF16AVX2(&a.X[r*k], k, &a.WB[j*k], k, k, &a.Dst[r*n+j], n)
				}
			}
		}
		if (hi-lo)%2 == 1 {
			r0 := r8 // the eight-row tiles without AVX-512 took the odd column
			if useAVX512 {
				r0 = 0
			}
			loneWeightRow(a, hi-1, r0, r8, rTile)
		}
	}
	tiles4x2(a, lo, hi, rTile)
}

// dot4x2BF16 computes the dot products of two rows of x (x[0:k] and
// x[xs:xs+k]; xs 0: one row) with four bf16 weight rows w[c*stride:] into
// d[r*4+c].
func dot4x2BF16(x []float32, xs int, w []uint16, stride, k int, d *[8]float32) {
	*d = [8]float32{}
	done := 0
	if useAVX2 && k >= 8 {
		done = k &^ 7
		if xs == 0 {
			dot4x1BF16AVX2(&x[0], &w[0], stride, done, (*[4]float32)(d[:4]))
		} else {
			dot4x2BF16AVX2(&x[0], xs, &w[0], stride, done, d)
		}
	}
	if done < k {
		for r := 0; r < 2; r++ {
			xr := x[r*xs+done : r*xs+k]
			d0, d1, d2, d3 := dot4BF16(xr, w[done:], w[stride+done:], w[2*stride+done:], w[3*stride+done:])
			d[r*4], d[r*4+1], d[r*4+2], d[r*4+3] = d[r*4]+d0, d[r*4+1]+d1, d[r*4+2]+d2, d[r*4+3]+d3
		}
	}
}

func dot4BF16(x []float32, w0, w1, w2, w3 []uint16) (float32, float32, float32, float32) {
	w0, w1, w2, w3 = w0[:len(x)], w1[:len(x)], w2[:len(x)], w3[:len(x)]
	var a0, a1, a2, a3, b0, b1, b2, b3 float32
	i := 0
	for ; i+2 <= len(x); i += 2 {
		// Two adjacent bf16 weights load as one 32-bit word: the low one
		// widens by a shift, the high one by a mask.
		x0, x1 := x[i], x[i+1]
		u0 := uint32(w0[i]) | uint32(w0[i+1])<<16
		u1 := uint32(w1[i]) | uint32(w1[i+1])<<16
		u2 := uint32(w2[i]) | uint32(w2[i+1])<<16
		u3 := uint32(w3[i]) | uint32(w3[i+1])<<16
		a0 += x0 * math.Float32frombits(u0<<16)
		a1 += x0 * math.Float32frombits(u1<<16)
		a2 += x0 * math.Float32frombits(u2<<16)
		a3 += x0 * math.Float32frombits(u3<<16)
		b0 += x1 * math.Float32frombits(u0&0xffff0000)
		b1 += x1 * math.Float32frombits(u1&0xffff0000)
		b2 += x1 * math.Float32frombits(u2&0xffff0000)
		b3 += x1 * math.Float32frombits(u3&0xffff0000)
	}
	if i < len(x) {
		x0 := x[i]
		a0 += x0 * bf16(w0[i])
		a1 += x0 * bf16(w1[i])
		a2 += x0 * bf16(w2[i])
		a3 += x0 * bf16(w3[i])
	}
	return a0 + b0, a1 + b1, a2 + b2, a3 + b3
}

// MatMulSerial is MatMul on the calling goroutine alone, for callers that
// already run in parallel (one expert per worker).
func MatMulSerial(dst, x, w []float32, m, n, k int) {
	checkMatMul(len(dst), len(x), len(w), m, n, k)
	a := Args{Dst: dst, X: x, W: w, M: m, N: n, K: k}
	matMulRange(&a, 0, n)
}

// MatMulBF16Serial is MatMulBF16 on the calling goroutine alone.
func MatMulBF16Serial(dst, x []float32, w []uint16, m, n, k int) {
	checkMatMul(len(dst), len(x), len(w), m, n, k)
	a := Args{Dst: dst, X: x, WB: w, M: m, N: n, K: k}
	matMulBF16Range(&a, 0, n)
}

// tile2x8 runs the eight-row tile for the product's weights (f32 or bf16)
// on x rows [r, r+8) and weight rows j and j+wstride (wstride 0: row j
// twice), writing out[q*ostride+c].
func tile2x8(a *Args, r, j, wstride int, out *float32, ostride int) {
	k := a.K
	wide := dotWide()
	switch {
	case a.WB != nil && wide:
		dot2x8BF16ZMM(&a.X[r*k], k, &a.WB[j*k], wstride, k, out, ostride)
	case a.WB != nil:
		dot2x8BF16AVX512(&a.X[r*k], k, &a.WB[j*k], wstride, k, out, ostride)
	case wide:
		dot2x8F32ZMM(&a.X[r*k], k, &a.W[j*k], wstride, k, out, ostride)
	default:
		dot2x8F32AVX512(&a.X[r*k], k, &a.W[j*k], wstride, k, out, ostride)
	}
}

// dotTileBits forces the 2x8 tiles' register width for tests and
// benchmarks: 0 follows wideFMA, 256 and 512 force that many bits (512
// needs hasZMM). Both widths give the same bits.
var dotTileBits int

// dotWide reports whether the 2x8 tiles run on zmm registers (two weight
// rows' 256-bit lanes in one register, half the FMA instructions).
func dotWide() bool {
	switch dotTileBits {
	case 256:
		return false
	case 512:
		return hasZMM
	}
	return wideFMA()
}

// tiles8 computes columns [jb, je) for x rows [0, r8) (r8 a multiple of
// eight) with the eight-row tiles: with AVX-512VL the 2x8 tile on the
// column pairs below pairsHi (loneWeightRow takes an odd last column),
// else rows8, one weight row at a time against all eight x rows.
func tiles8(a *Args, jb, je, pairsHi, r8 int) {
	k, n := a.K, a.N
	for r := 0; r < r8; r += 8 {
		if !useAVX512 {
			if a.WB != nil {
				rows8BF16AVX2(&a.X[r*k], k, &a.WB[jb*k], je-jb, k, &a.Dst[r*n+jb], n)
			} else {
				rows8F32AVX2(&a.X[r*k], k, &a.W[jb*k], je-jb, k, &a.Dst[r*n+jb], n)
			}
			continue
		}
		j, end := jb, min(je, pairsHi)
		if dotWide() {
			// Four weight rows a call where they are there: the same
			// outputs as two pairs, with each x chunk loaded once for
			// both (BenchmarkTile2x8Wide).
			for ; j+4 <= end; j += 4 {
				if a.WB != nil {
					dot4x8BF16ZMM(&a.X[r*k], k, &a.WB[j*k], k, k, &a.Dst[r*n+j], n)
				} else {
					dot4x8F32ZMM(&a.X[r*k], k, &a.W[j*k], k, k, &a.Dst[r*n+j], n)
				}
			}
		}
		for ; j < end; j += 2 {
			tile2x8(a, r, j, k, &a.Dst[r*n+j], n)
		}
	}
}

// loneWeightRow computes column j, the last of an odd count, for x rows
// [r0, rTile): the two-row tiles run with the row taken twice, eight x rows
// at a time below r8 and four (bf16 only) from there, so the column gets the
// same arithmetic as its neighbours.
func loneWeightRow(a *Args, j, r0, r8, rTile int) {
	k, n := a.K, a.N
	var pair [16]float32
	for r := r0; r < r8; r += 8 {
		tile2x8(a, r, j, 0, &pair[0], 2)
		for q := 0; q < 8; q++ {
			a.Dst[(r+q)*n+j] = pair[2*q]
		}
	}
	for r := r8; r < rTile; r += 4 {
		dot2x4BF16AVX2(&a.X[r*k], k, &a.WB[j*k], 0, k, &pair[0], 2)
		for q := 0; q < 4; q++ {
			a.Dst[(r+q)*n+j] = pair[2*q]
		}
	}
}

// tiles4x2 computes columns [lo, hi) for x rows [r0, M) with the four-by-two
// tile: pairs of x rows (a lone last row with itself) against four weight
// rows, the last columns one weight row at a time.
func tiles4x2(a *Args, lo, hi, r0 int) {
	k, n := a.K, a.N
	var d [8]float32
	for j := lo; j < hi; j += 4 {
		rows := min(4, hi-j)
		for r := r0; r < a.M; r += 2 {
			xs := k
			if r+1 >= a.M {
				xs = 0 // a lone row: paired with itself
			}
			x := a.X[r*k : r*k+xs+k]
			if rows < 4 {
				for c := 0; c < rows; c++ {
					dot4x2(a, x, xs, j+c, 0, &d)
					a.Dst[r*n+j+c] = d[0]
					if xs != 0 {
						a.Dst[(r+1)*n+j+c] = d[4]
					}
				}
				continue
			}
			dot4x2(a, x, xs, j, k, &d)
			copy(a.Dst[r*n+j:r*n+j+4], d[:4])
			if xs != 0 {
				copy(a.Dst[(r+1)*n+j:(r+1)*n+j+4], d[4:])
			}
		}
	}
}

// dot4x2 runs dot4x2BF16 or dot4x2F32, by the product's weights, on weight
// rows from j, stride apart.
func dot4x2(a *Args, x []float32, xs, j, stride int, d *[8]float32) {
	k := a.K
	if a.WB != nil {
		dot4x2BF16(x, xs, a.WB[j*k:], stride, k, d)
	} else {
		dot4x2F32(x, xs, a.W[j*k:], stride, k, d)
	}
}

// tiles4x3 computes columns [lo, hi) of a product on a CPU with AVX2 and
// without AVX-512VL, and reports whether it did: groups of four x rows
// against triples of weight rows (tile4x3BF16AVX2 and its f32 twin), the
// last group overlapping the one before when the rows are not a multiple
// of four (its shared rows get the same values again), the last one or two
// columns through the four-by-two tiles. It takes f32 products of four
// rows or more, bf16 ones of more than sixteen and bf16 ones of an odd
// number of rows from five (see below); on the prefill-chunk sizes beside
// a decode batch (18 and 40 rows) it runs 1.1 to 1.5 times as fast as
// rows8 did, and on odd verify passes 1.07 to 1.2 times as fast as the
// 2x4 tile (BenchmarkTiles4x3, docs/bench). While
// the x rows fit in L2 every triple meets all the groups in one call, so
// the weights stream from memory once and without pause; larger products
// walk the weights in blocks that stay in L2 while each group of x rows
// runs over them from L1.
func tiles4x3(a *Args, lo, hi int) bool {
	k, n, m := a.K, a.N, a.M
	if !useAVX2 || useAVX512 || k%8 != 0 || k == 0 || m < 4 || tiles43Off {
		return false
	}
	if a.WB != nil && m <= 16 && (m%2 == 0 || k > 1024) {
		// Even decode batches keep the 2x4 tile, which streams their
		// weights as well; odd ones gain (the 2x4 tile's lone last row
		// costs a pass of its own), at the widths where the x rows stay
		// near L1 (BenchmarkTiles4x3).
		return false
	}
	run := func(r, rows, j, triples int) {
		if a.WB != nil {
			tile4x3BF16AVX2(&a.X[r*k], k, rows, &a.WB[j*k], triples, k, &a.Dst[r*n+j], n)
		} else {
			tile4x3F32AVX2(&a.X[r*k], k, rows, &a.W[j*k], triples, k, &a.Dst[r*n+j], n)
		}
	}
	triples := (hi - lo) / 3
	if triples > 0 {
		if m*k*4 <= tile43Stream {
			run(0, m, lo, triples)
		} else {
			const blockTriples = 16
			for t := 0; t < triples; t += blockTriples {
				nt := min(blockTriples, triples-t)
				for r := 0; r < m; r += 4 {
					run(min(r, m-4), 4, lo+3*t, nt)
				}
			}
		}
	}
	tiles4x2(a, lo+3*triples, hi, 0)
	return true
}

// tile43Stream is the most x bytes for which tiles4x3 runs every weight
// triple against all the rows in one call (half a Zen 3 core's L2).
const tile43Stream = 256 << 10

// tiles43Off turns tiles4x3 off, for BenchmarkTiles4x3's side-by-side
// runs against the tiles it replaced (rows8 and the 2x4 decode tile) and
// for the batch-invariance test, which runs both.
var tiles43Off bool
