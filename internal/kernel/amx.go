package kernel

import (
	"math"
	"sync"
)

// The AMX product runs a bf16-weight product on the CPU's matrix engine
// (AMX-BF16 tiles) and stays fp32-accurate by splitting each fp32
// activation into three bf16 parts, hi + mid + lo, whose sum is the value
// to within an ulp or so of fp32 (8 significant bits each). Every part
// meets every weight in a tile dot product whose bf16 products are exact
// in fp32, accumulated in fp32.
//
// The weights take their own layout (PackAMX): 16-column panels, each a run
// of k-blocks of 32, each block one 1 KB tile whose row i holds the pairs
// (w[c][32b+2i], w[c][32b+2i+1]) of the panel's sixteen columns c, the
// order TDPBF16PS reads a B tile in. Columns are padded to whole pairs of
// panels and k to whole blocks with zeros.
//
// Each part of an x row is a row of the A operand (part rows 3r, 3r+1,
// 3r+2 for x row r; five x rows to a tile), and meets the weights in one
// accumulator over the k-blocks, each a tile dot product over the block's
// sixteen pairs; an output is then (hi + mid) + lo of its row's three
// accumulators. Tile rows are independent, so a row's result does not
// depend on the other rows of the product: a product of one row, of 8 or
// of 512 gives each row the same bits.

// AMXPanel is the width of an AMX weight panel (a tile's sixteen float32
// columns); panels are laid out in pairs.
const AMXPanel = 16

// amxKBlock is the k extent of one tile product (sixteen bf16 pairs).
const amxKBlock = 32

// amxParts is how many bf16 parts an fp32 activation is split into.
const amxParts = 3

// AMXAvailable reports whether the AMX product runs here: the CPU has
// AMX-BF16 and the kernel granted the process the tile data state, and
// K3_KERNEL does not cap the path below it.
func AMXAvailable() bool { return hasAMX }

// AMXEmulated reports that the AMX paths run without AMX tiles, their
// tile products on the plain-Go twin (K3_AMX=emulate; tests only, far
// too slow to measure anything).
func AMXEmulated() bool { return amxEmulated }

// AMXPreferred reports whether a backend should lay bf16 weights out for
// the AMX product (PackAMX): where it runs and K3_KERNEL=amx asks for it.
func AMXPreferred() bool { return amxPreferred }

// AMXLen returns the length of the AMX form of an [n, k] weight.
func AMXLen(n, k int) int {
	return amxCols(n) * amxKPad(k)
}

// amxCols is n rounded up to whole pairs of panels.
func amxCols(n int) int { return (n + 2*AMXPanel - 1) / (2 * AMXPanel) * 2 * AMXPanel }

// amxKPad is k rounded up to whole k-blocks.
func amxKPad(k int) int { return (k + amxKBlock - 1) / amxKBlock * amxKBlock }

// PackAMX writes w [n, k] in AMX form into dst (AMXLen(n, k) long): the
// tile of panel p and k-block b starts at (p*kb + b)*512 and holds at
// 32i + 2c + e the weight w[16p+c][32b+2i+e], zero past n or k.
func PackAMX(dst, w []uint16, n, k int) {
	checkPackAMX(dst, w, n, k)
	packAMXPanels(dst, w, n, k, 0, amxCols(n)/AMXPanel)
}

// PackAMX is PackAMX with the panels split over the pool.
func (p *Pool) PackAMX(dst, w []uint16, n, k int) {
	checkPackAMX(dst, w, n, k)
	p.Run(packAMXRange, Args{WB: dst, M: n, K: k, Job: &amxPackJob{w: w}}, amxCols(n)/AMXPanel, 8)
}

type amxPackJob struct{ w []uint16 }

func packAMXRange(a *Args, lo, hi int) {
	packAMXPanels(a.WB, a.Job.(*amxPackJob).w, a.M, a.K, lo, hi)
}

func checkPackAMX(dst, w []uint16, n, k int) {
	if len(w) < n*k || len(dst) != AMXLen(n, k) {
		panic("kernel: PackAMX operand lengths do not match the shape")
	}
}

// packAMXPanels writes panels [p0, p1) of w's AMX form. A panel of sixteen
// rows of w has its whole k-blocks transposed in vector registers
// (packAMXTilesAVX512, where the repacking kernels run); the rest of a
// panel, and panels past n, go element by element.
func packAMXPanels(dst, w []uint16, n, k, p0, p1 int) {
	kp := amxKPad(k)
	for p := p0; p < p1; p++ {
		pan := dst[p*AMXPanel*kp : (p+1)*AMXPanel*kp]
		full := k / amxKBlock
		if hasAVX512BW && full > 0 && (p+1)*AMXPanel <= n {
			src := w[p*AMXPanel*k : (p+1)*AMXPanel*k]
			next := src
			if (p+2)*AMXPanel <= n {
				next = w[(p+1)*AMXPanel*k : (p+2)*AMXPanel*k]
			}
			_ = pan[full*512-1]
			packAMXTilesAVX512(&pan[0], &src[0], 2*k, full, &next[0])
			clear(pan[full*512:])
			for c := range AMXPanel {
				for kk := full * amxKBlock; kk < k; kk++ {
					i, e := kk%amxKBlock/2, kk%2
					pan[full*512+i*32+2*c+e] = src[c*k+kk]
				}
			}
			continue
		}
		clear(pan)
		for c := range AMXPanel {
			col := p*AMXPanel + c
			if col >= n {
				break
			}
			wr := w[col*k : col*k+k]
			for kk, v := range wr {
				b, i, e := kk/amxKBlock, kk%amxKBlock/2, kk%2
				pan[b*512+i*32+2*c+e] = v
			}
		}
	}
}

// UnpackAMX is PackAMX's inverse: it writes the [n, k] weight that wp holds
// in AMX form into w.
func UnpackAMX(w, wp []uint16, n, k int) {
	kp := amxKPad(k)
	for col := range n {
		p, c := col/AMXPanel, col%AMXPanel
		pan := wp[p*AMXPanel*kp:]
		for kk := range k {
			b, i, e := kk/amxKBlock, kk%amxKBlock/2, kk%2
			w[col*k+kk] = pan[b*512+i*32+2*c+e]
		}
	}
}

// SplitBF16 writes x's three bf16 parts: hi is x rounded to bf16 (to
// nearest even), mid the remainder x-hi rounded, lo what then remains,
// rounded. x-hi and x-hi-mid are exact in float32, so hi+mid+lo holds 24
// significant bits or more of x (a remainder below float32's normal range
// counts as zero, as the CPU's conversion reads it). Inputs that are not
// finite give parts whose products are NaN.
func SplitBF16(hi, mid, lo []uint16, x []float32) {
	hi, mid, lo = hi[:len(x)], mid[:len(x)], lo[:len(x)]
	i := 0
	if hasAMX && !amxGo {
		i = len(x) &^ 15
		if i > 0 {
			splitBF16AVX512(&hi[0], &mid[0], &lo[0], &x[0], i)
		}
	}
	for ; i < len(x); i++ {
		v := x[i]
		h := roundBF16DAZ(v)
		r := v - bf16(h)
		m := roundBF16DAZ(r)
		hi[i], mid[i], lo[i] = h, m, roundBF16DAZ(r-bf16(m))
	}
}

// roundBF16DAZ rounds v to bfloat16, to nearest, ties to even, reading v
// below the normal range as zero of its sign (VCVTNEPS2BF16's rules).
func roundBF16DAZ(v float32) uint16 {
	b := math.Float32bits(v)
	switch {
	case b&0x7fffffff > 0x7f800000:
		return uint16(b>>16) | 0x40
	case b&0x7f800000 == 0:
		return uint16(b>>16) & 0x8000
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// amxTileRows is how many part rows a tile of A holds: fifteen of its
// sixteen, five x rows of three parts (or fifteen x rows of one, in the
// fast product).
const amxTileRows = 15

// amxJob is one AMX product: the activations' part rows and the operands.
// Products take one from amxJobs, so serial products may run concurrently
// and none allocates once the jobs have grown.
type amxJob struct {
	dst, x  []float32
	w       []uint16 // AMX form (PackAMX)
	wk      []uint16 // the k-major form MatMulKMajorAMX repacks into w
	m, n, k int
	ld      int // dst's row stride (n, or more for a slab of columns)
	kp      int
	np      int      // parts an x row is split into: amxParts, or 1 (fast)
	rows    int      // x rows a tile holds: amxTileRows / np
	parts   []uint16 // [np*m][kp]: row np*r+q is part q of x row r
	chunk   int      // pairs of panels per work item
	chunks  int      // column chunks
	blocks  int      // blocks of two tiles of x rows (2*rows)
}

// amxChunk is how many pairs of panels a work item covers: 256 columns,
// so that an item's weights (kp*256*2 bytes, 384 KB at k = 768) stay in
// L2 while it meets its row blocks; a product of one block takes items of
// amxChunkFew pairs, which balance over the pool.
const (
	amxChunk    = 8
	amxChunkFew = 2
)

// amxKRange is how many k-blocks amxTiles2 runs before moving to the next
// group in a product of many row blocks: two tiles of part rows over it
// (15 KB) stay in L1.
const amxKRange = 8

// amxStreamBlocks is the most row blocks (of 2*rows x rows) a product can
// have and still run each pair of panels over the whole k, prefetching its
// weights into L2. Such a product (a decode batch, a verification, a
// scheduler's pass) reads its weights from memory for most of its time,
// and two streams read end to end keep more of the bandwidth than sixteen
// visited a k-range at a time (docs/bench); its part rows then come from
// L2. A product of more blocks reads the weights from L2 for every block
// after the first, so it keeps its part rows in L1 over k-ranges instead
// and does not prefetch (there the prefetch cost the GEMM's rate).
const amxStreamBlocks = 3

// amxGo makes the product run its plain-Go twin (tests).
var amxGo bool

var amxJobs = sync.Pool{New: func() any { return new(amxJob) }}

// amxScratch holds one call's part-row outputs: two tiles' rows by a
// chunk's columns.
var amxScratch = sync.Pool{New: func() any {
	s := make([]float32, 2*amxTileRows*amxChunk*2*AMXPanel)
	return &s
}}

// prepare sets the job up for the product (dst, x, wp, m, n, k) with x
// split into np parts.
func (j *amxJob) prepare(dst, x []float32, wp []uint16, m, n, k, np int) {
	j.dst, j.x, j.w, j.m, j.n, j.k, j.ld = dst, x, wp, m, n, k, n
	j.kp = amxKPad(k)
	j.np, j.rows = np, amxTileRows/np
	size := np * m * j.kp
	if cap(j.parts) < size {
		j.parts = make([]uint16, size)
	}
	j.parts = j.parts[:size]
	j.blocks = (m + 2*j.rows - 1) / (2 * j.rows)
	j.chunk = amxChunk
	if j.blocks == 1 {
		j.chunk = amxChunkFew
	}
	j.columns(n)
}

// columns sets the job's work items for n output columns.
func (j *amxJob) columns(n int) {
	j.n = n
	groups := amxCols(n) / (2 * AMXPanel)
	j.chunks = (groups + j.chunk - 1) / j.chunk
}

// split writes the part rows of x rows [r0, r1), zero past k: three
// parts (SplitBF16), or one, x rounded to bf16 as SplitBF16 rounds hi.
func (j *amxJob) split(r0, r1 int) {
	kp, np := j.kp, j.np
	for r := r0; r < r1; r++ {
		p := j.parts[np*r*kp : np*(r+1)*kp]
		xr := j.x[r*j.k : (r+1)*j.k]
		if np == 1 {
			RoundBF16DAZ(p[:j.k], xr)
		} else {
			SplitBF16(p[:kp], p[kp:2*kp], p[2*kp:], xr)
		}
		if j.k < kp {
			for q := range np {
				clear(p[q*kp+j.k : (q+1)*kp])
			}
		}
	}
}

func amxSplitRange(a *Args, lo, hi int) { a.Job.(*amxJob).split(lo, hi) }

// MatMulAMX computes dst[m, n] = x[m, k] · wᵀ for a bf16 weight w [n, k] in
// AMX form (PackAMX). Where the AMX product is not available it runs the
// plain-Go twin, which gives the same bits.
func (p *Pool) MatMulAMX(dst, x []float32, wp []uint16, m, n, k int) {
	p.matMulAMX(dst, x, wp, m, n, k, amxParts)
}

// MatMulAMXFast is MatMulAMX with x rounded to bf16 (one part, to nearest
// even, SplitBF16's hi) instead of split: a third of the tile products, about 2^-9
// relative per element of x lost (the opt-in fast product; decode stays
// exact). A row's result still does not depend on the other rows.
func (p *Pool) MatMulAMXFast(dst, x []float32, wp []uint16, m, n, k int) {
	p.matMulAMX(dst, x, wp, m, n, k, 1)
}

// matMulAMX is the product with x split into np parts, on the pool, or on
// the calling goroutine alone where p is nil.
func (p *Pool) matMulAMX(dst, x []float32, wp []uint16, m, n, k, np int) {
	checkAMX(len(dst), len(x), len(wp), m, n, k)
	if m == 0 || n == 0 {
		return
	}
	j := amxJobs.Get().(*amxJob)
	defer amxJobs.Put(j)
	j.prepare(dst, x, wp, m, n, k, np)
	if p == nil {
		j.split(0, m)
		j.run(0, j.chunks*j.blocks)
	} else {
		p.Run(amxSplitRange, Args{Job: j}, m, 16)
		p.Run(amxRange, Args{Job: j}, j.chunks*j.blocks, 1)
	}
	j.dst, j.x, j.w = nil, nil, nil
}

// MatMulAMXSerial is MatMulAMX on the calling goroutine alone. Calls may
// run concurrently.
func MatMulAMXSerial(dst, x []float32, wp []uint16, m, n, k int) {
	(*Pool)(nil).matMulAMX(dst, x, wp, m, n, k, amxParts)
}

func checkAMX(nd, nx, nw, m, n, k int) {
	if nd < m*n || nx < m*k || nw != AMXLen(n, k) {
		panic("kernel: MatMulAMX operand lengths do not match the shape")
	}
}

func amxRange(a *Args, lo, hi int) { a.Job.(*amxJob).run(lo, hi) }

// run computes work items [lo, hi): item i is the row block i mod blocks
// of the column chunk i / blocks, so that consecutive items share their
// weights. With one row block the items' groups are contiguous and are
// run a scratch's worth at a time.
func (j *amxJob) run(lo, hi int) {
	groups := amxCols(j.n) / (2 * AMXPanel)
	sp := amxScratch.Get().(*[]float32)
	defer amxScratch.Put(sp)
	if j.blocks == 1 {
		end := min(hi*j.chunk, groups)
		for g := lo * j.chunk; g < end; g += amxChunk {
			j.block(*sp, 0, j.m, g, min(g+amxChunk, end))
		}
		return
	}
	for it := lo; it < hi; it++ {
		c, b := it/j.blocks, it%j.blocks
		r0 := 2 * j.rows * b
		j.block(*sp, r0, min(r0+2*j.rows, j.m), c*j.chunk, min((c+1)*j.chunk, groups))
	}
}

// block computes x rows [r0, r1) (at most 2*j.rows) against the column
// groups [g0, g1) (at most amxChunk pairs of panels) of j.w.
func (j *amxJob) block(s []float32, r0, r1, g0, g1 int) {
	j.blockOf(s, j.w[g0*2*AMXPanel*j.kp:], g0*2*AMXPanel, r0, r1, g1-g0)
}

// blockOf computes x rows [r0, r1) against groups pairs of panels in AMX
// form at w, whose first column is output column c0: the part rows'
// outputs into the scratch s, then each output the sum of its row's three,
// (hi + mid) + lo (or its row's one, in the fast product).
func (j *amxJob) blockOf(s []float32, w []uint16, c0, r0, r1, groups int) {
	cs := groups * 2 * AMXPanel
	j.tiles(s, cs, w, r0, r1, groups)
	cols := min(cs, j.n-c0)
	for r := r0; r < r1; r++ {
		pr := s[j.np*(r-r0)*cs:]
		d := j.dst[r*j.ld+c0 : r*j.ld+c0+cols]
		if j.np == 1 {
			copy(d, pr[:cols])
			continue
		}
		sum3(d, pr[:cols], pr[cs:cs+cols], pr[2*cs:2*cs+cols])
	}
}

// tiles writes the part rows of x rows [r0, r1) against groups pairs of
// panels at w to s (cs floats a row).
func (j *amxJob) tiles(s []float32, cs int, w []uint16, r0, r1, groups int) {
	kb := j.kp / amxKBlock
	a := j.parts[j.np*r0*j.kp:]
	prows := j.np * (r1 - r0)
	if !hasAMX || amxGo || amxEmulated {
		amxTilesGo(a, j.kp, w, kb, prows, s, cs, groups)
		return
	}
	_ = s[(prows-1)*cs+cs-1]
	var cfg amxConfig
	if r1-r0 > j.rows {
		cfg.set(amxTileRows, prows-amxTileRows)
		if j.blocks <= amxStreamBlocks {
			amxTiles2(&cfg, &a[0], 2*j.kp, &w[0], kb, &s[0], 4*cs, groups, 2*AMXPanel*j.kp, 0, 1)
			return
		}
		// k in ranges of amxKRange blocks, each range over all the groups,
		// so that the range's part rows stay in L1 from group to group;
		// the accumulators are stored and reloaded exactly between ranges.
		for b0, acc := 0, 0; b0 < kb; b0, acc = b0+amxKRange, 1 {
			nb := min(amxKRange, kb-b0)
			amxTiles2(&cfg, &a[b0*amxKBlock], 2*j.kp, &w[b0*512], nb, &s[0], 4*cs, groups, 2*AMXPanel*j.kp, acc, 0)
		}
		return
	}
	cfg.set(prows, 0)
	amxTiles1(&cfg, &a[0], 2*j.kp, &w[0], kb, &s[0], 4*cs, groups)
}

// sum3 writes (a[i] + b[i]) + c[i] to dst[i].
func sum3(dst, a, b, c []float32) {
	n := len(dst)
	a, b, c = a[:n], b[:n], c[:n]
	i := 0
	if hasAMX && !amxGo {
		i = n &^ 15
		if i > 0 {
			sum3AVX512(&dst[0], &a[0], &b[0], &c[0], i)
		}
	}
	for ; i < n; i++ {
		dst[i] = (a[i] + b[i]) + c[i]
	}
}

// amxConfig is the 64-byte tile configuration LDTILECFG loads (palette 1):
// bytes per row of each of the eight tiles at 16+2t, rows at 48+t.
type amxConfig [64]byte

// set configures the accumulators and A tile of the first block (tmm0,
// tmm1, tmm4) for rows0 part rows and those of the second (tmm2, tmm3,
// tmm5) for rows1, with the B tiles (tmm6, tmm7) of 16 rows; every tile
// row is 64 bytes. With rows1 = 0 (amxTiles1) tmm5 is a second A tile of
// rows0 rows and tmm2, tmm3 second B tiles.
func (c *amxConfig) set(rows0, rows1 int) {
	*c = amxConfig{}
	c[0] = 1
	rows := [8]int{rows0, rows0, rows1, rows1, rows0, rows1, 16, 16}
	if rows1 == 0 {
		rows[2], rows[3], rows[5] = 16, 16, rows0
	}
	for t, r := range rows {
		c[16+2*t] = 64
		c[48+t] = byte(r)
	}
}

// amxTilesGo is the tile kernels' plain-Go twin: for each of prows part
// rows (at a, row stride as elements) and each column of the groups, one
// float32 accumulator from zero over k-blocks, adding each tile dot
// product as TDPBF16PS computes it: the products of the even elements of
// the block's sixteen pairs summed in one float32 chain from zero, those
// of the odd elements in another (the products are exact), the two chains
// added, and that added to the accumulator, every sum rounded to nearest
// even; bf16 inputs below the normal range count as zero and float32
// results below it are flushed to zero. (The chain structure is the
// instruction's description in Intel's SDM; the flushing and the order of
// the pairs within a chain were checked against the hardware by
// TestMatMulAMX.) It widens each block's operands once (what
// amxTilesSpec, its one-loop statement in the tests, does per product),
// since K3_AMX=emulate runs whole models on it.
func amxTilesGo(a []uint16, as int, w []uint16, kb, prows int, c []float32, cs, groups int) {
	kp := kb * amxKBlock
	var wt [2 * AMXPanel][amxKBlock]float32 // a block's weights, column by column: pair i at 2i, 2i+1
	var ar [amxKBlock]float32
	for g := range groups {
		for r := range prows {
			clear(c[r*cs+g*2*AMXPanel : r*cs+(g+1)*2*AMXPanel])
		}
		for b := range kb {
			for col := range 2 * AMXPanel {
				tile := w[(2*g+col/AMXPanel)*AMXPanel*kp+b*512:]
				cc := col % AMXPanel
				for i := range 16 {
					wt[col][2*i] = dazBF16(tile[i*32+2*cc])
					wt[col][2*i+1] = dazBF16(tile[i*32+2*cc+1])
				}
			}
			for r := range prows {
				for e, v := range a[r*as+b*amxKBlock : r*as+(b+1)*amxKBlock] {
					ar[e] = dazBF16(v)
				}
				out := c[r*cs+g*2*AMXPanel : r*cs+(g+1)*2*AMXPanel]
				for col := range out {
					wc := &wt[col]
					var even, odd float32
					for i := range 16 {
						even = ftz(even + ar[2*i]*wc[2*i])
						odd = ftz(odd + ar[2*i+1]*wc[2*i+1])
					}
					out[col] = ftz(out[col] + ftz(even+odd))
				}
			}
		}
	}
}

// dazBF16 widens a bf16 value, reading a subnormal as zero of its sign.
func dazBF16(h uint16) float32 {
	if h&0x7f80 == 0 {
		h &= 0x8000
	}
	return bf16(h)
}

// ftz flushes a float32 below the normal range to zero of its sign.
func ftz(v float32) float32 {
	b := math.Float32bits(v)
	if b&0x7f800000 == 0 {
		return math.Float32frombits(b & 0x80000000)
	}
	return v
}
