package kernel

import "sync"

// The packed GEMM serves long products (prefill): x is packed once into
// panels of sixteen interleaved rows, and a register tile of sixteen x rows
// by six weight rows runs over k in blocks, so that a panel's block stays in
// L1 while the tiles of a weight block use it, and the weights are read in
// their own layout (bf16 blocks widened once per worker). Every output is
// one FMA chain over k in order, whatever the blocking and whichever rows
// share its tile, so equal rows of x give equal outputs. It is not the
// summation order of the dot-form tiles that decode uses, so the switch
// between the two depends only on the product's shape (usePacked), and
// never below PackedMinRows rows: products of up to compute.InvariantRows
// rows (decode batches) must give each row the result it gets alone.
const (
	gemmPanel = 16  // x rows per packed panel (two vectors)
	gemmTileW = 6   // weight rows per register tile
	gemmKC    = 256 // k block: a panel block is 16 KB
	gemmNB    = 48  // weight rows per block (their results stay in a tile buffer)
)

// PackedMinRows is the row count from which MatMul and MatMulBF16 use the
// packed GEMM (for k >= packedMinK). Products with fewer rows (decode,
// batches of fewer sessions) use the dot-form tiles, whose results do not
// depend on the row count.
const PackedMinRows = 64

// packedMinK is the depth from which the packed GEMM beats the dot-form
// tiles at any width. Below it the eight-row tiles' x rows (8·k floats)
// fit in L1: with AVX-512VL the 2x8 tile then runs near the FMA peak and
// wins, while the packed GEMM pays for packing x and for its transposed
// stores. Without AVX-512 the eight-row tile is rows8, bound by loads, and
// the packed GEMM already wins from k 256 once there are packedMinN
// columns to spread its packing over. BenchmarkPackedVsTiles measures both
// crossovers (by depth and by width); docs/bench/README.md has the figures.
const (
	packedMinK = 1024
	packedMinN = 512
)

// packedWideMinN and packedWideMinK are the width and depth from which
// the packed GEMM takes a product when it runs 512-bit FMAs. Narrower or
// shallower products take the dot-form tiles, which run on zmm registers
// too (four weight rows against eight x rows): there the packed GEMM's
// packing of x and its transposed stores are spread over too few columns
// or too short a k loop (BenchmarkPackedVsTiles).
const (
	packedWideMinN = 640
	packedWideMinK = 256
)

// usePacked reports whether an m×k by k×n product takes the packed GEMM.
func usePacked(m, n, k int) bool {
	if !useAVX2 || m < PackedMinRows {
		return false
	}
	if packedWide() {
		return n >= packedWideMinN && k >= packedWideMinK
	}
	return k >= packedMinK || !useAVX512 && k >= 256 && n >= packedMinN
}

// packedTile forces the packed GEMM's tile width (and MatAccumulate's) for
// tests and benchmarks: 0 follows wideFMA (hasZMM for MatAccumulate), 256
// and 512 force that many bits (512 needs hasZMM).
var packedTile int

// accWide reports whether MatAccumulate and MatAccumulateScaled run the
// 512-bit tile: wherever the CPU has the 512-bit kernels, since both
// widths give the same bits and it runs 1.11x the 256-bit tile even on
// Zen 4's halved 512-bit FMAs (at KDA's 128x128x16; docs/bench).
// packedTile forces it as it forces the packed GEMM's.
func accWide() bool {
	switch packedTile {
	case 256:
		return false
	case 512:
		return hasZMM
	}
	return hasZMM
}

// packedWide reports whether the packed GEMM runs its 512-bit tile.
func packedWide() bool {
	switch packedTile {
	case 256:
		return false
	case 512:
		return hasZMM
	}
	return wideFMA()
}

// gemmJob holds a packed product's operands and buffers. The pool owns one
// and reuses its buffers, so a warm product allocates nothing.
type gemmJob struct {
	mu      sync.Mutex // held for the whole product: the buffers outlive one Run
	dst, x  []float32
	w       []float32
	wb      []uint16
	m, n, k int
	parts   int
	xp      []float32   // packed x: [panel][k][16], missing rows zero
	wide    [][]float32 // per part: a weight block widened or padded
}

func (p *Pool) matMulPacked(dst, x, w []float32, wb []uint16, m, n, k int) {
	g := &p.gemm
	g.mu.Lock()
	defer g.mu.Unlock()
	panels := (m + gemmPanel - 1) / gemmPanel
	g.dst, g.x, g.w, g.wb, g.m, g.n, g.k = dst, x, w, wb, m, n, k
	g.parts = min(p.Size(), (n+gemmTileW-1)/gemmTileW)
	g.xp = grow(g.xp, panels*gemmPanel*k)
	for len(g.wide) < g.parts {
		g.wide = append(g.wide, nil)
	}
	for i := range g.parts {
		g.wide[i] = grow(g.wide[i], gemmNB*k)
	}
	p.Run(packPanels, Args{Job: g}, panels, 1)
	p.Run(gemmParts, Args{Job: g}, g.parts, 1)
	g.dst, g.x, g.w, g.wb = nil, nil, nil, nil
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// packPanels packs panels [lo, hi) of x: xp[(panel*k+p)*16+i] = x[panel*16+i][p].
func packPanels(a *Args, lo, hi int) {
	g := a.Job.(*gemmJob)
	k := g.k
	for ip := lo; ip < hi; ip++ {
		xp := g.xp[ip*gemmPanel*k : (ip+1)*gemmPanel*k]
		for i := range gemmPanel {
			r := ip*gemmPanel + i
			if r >= g.m {
				for p := range k {
					xp[p*gemmPanel+i] = 0
				}
				continue
			}
			row := g.x[r*k : r*k+k]
			for p, v := range row {
				xp[p*gemmPanel+i] = v
			}
		}
	}
}

// gemmParts computes parts [lo, hi) of the output columns, each a run of
// whole register tiles.
func gemmParts(a *Args, lo, hi int) {
	g := a.Job.(*gemmJob)
	tiles := (g.n + gemmTileW - 1) / gemmTileW
	per := (tiles + g.parts - 1) / g.parts * gemmTileW
	for part := lo; part < hi; part++ {
		g.columns(g.wide[part], part*per, min((part+1)*per, g.n))
	}
}

// columns computes output columns [c0, c1) for all rows, using wide (gemmNB
// rows of k) for widened or padded weight blocks. With 512-bit FMAs
// (wideFMA) two panels go through the register tile together, each x
// vector a zmm register; a lone last panel takes the 256-bit tile. Every
// output is the same FMA chain either way.
func (g *gemmJob) columns(wide []float32, c0, c1 int) {
	m, n, k := g.m, g.n, g.k
	const half = gemmNB * gemmPanel
	var tile [2 * half]float32 // tile[h*half+j*16+i]: panel h, weight row j, panel row i
	pair := packedWide()
	for jb := c0; jb < c1; jb += gemmNB {
		nb := min(gemmNB, c1-jb)
		tiles := (nb + gemmTileW - 1) / gemmTileW
		wblk := wide
		switch {
		case g.wb != nil:
			WidenBF16(wide[:nb*k], g.wb[jb*k:(jb+nb)*k])
			clear(wide[nb*k : tiles*gemmTileW*k])
		case nb%gemmTileW != 0:
			copy(wide, g.w[jb*k:(jb+nb)*k])
			clear(wide[nb*k : tiles*gemmTileW*k])
		default:
			wblk = g.w[jb*k : (jb+nb)*k]
		}
		for r0 := 0; r0 < m; {
			panels := 1
			if pair && r0+gemmPanel < m {
				panels = 2
			}
			xp := g.xp[r0*k : (r0+panels*gemmPanel)*k]
			for pc := 0; pc < k; pc += gemmKC {
				kc := min(gemmKC, k-pc)
				for t := range tiles {
					out := tile[t*gemmTileW*gemmPanel:]
					if panels == 2 {
						gemmTilePair(xp[pc*gemmPanel:], gemmPanel*k, wblk[t*gemmTileW*k+pc:], gemmPanel, k, kc, out, half, gemmPanel, pc > 0)
					} else {
						gemmTile(xp[pc*gemmPanel:], wblk[t*gemmTileW*k+pc:], gemmPanel, k, kc, out, pc > 0)
					}
				}
			}
			for h := range panels {
				base := r0 + h*gemmPanel
				for i := range min(gemmPanel, m-base) {
					d := g.dst[(base+i)*n+jb : (base+i)*n+jb+nb]
					for j := range d {
						d[j] = tile[h*half+j*gemmPanel+i]
					}
				}
			}
			r0 += panels * gemmPanel
		}
	}
}

// gemmTile runs the register tile: out[r*16+i] (+)= sum_p<kc w[r*wstride+p]
// * xp[p*xstride+i] for r < 6, i < 16.
func gemmTile(xp, w []float32, xstride, wstride, kc int, out []float32, load bool) {
	_ = out[gemmTileW*gemmPanel-1]
	_ = w[(gemmTileW-1)*wstride+kc-1]
	_ = xp[(kc-1)*xstride+gemmPanel-1]
	if useAVX2 {
		l := 0
		if load {
			l = 1
		}
		gemm16x6AVX2(&xp[0], &w[0], wstride, kc, &out[0], l, xstride, gemmPanel)
		return
	}
	gemmTileGo(xp, w, xstride, wstride, kc, out, load)
}

// gemmTileAt is gemmTile's 256-bit tile with output row r at
// out[r*ostride:] (MatAccumulate's rows in place); callers check useAVX2.
func gemmTileAt(xp, w []float32, xstride, wstride, kc int, out []float32, ostride int) {
	_ = out[(gemmTileW-1)*ostride+gemmPanel-1]
	_ = w[(gemmTileW-1)*wstride+kc-1]
	_ = xp[(kc-1)*xstride+gemmPanel-1]
	gemm16x6AVX2(&xp[0], &w[0], wstride, kc, &out[0], 1, xstride, ostride)
}

// gemmTilePair runs gemmTile on two x panels, xoff floats apart, with the
// same weights: output row r of the first panel is out[r*ostride:], of the
// second out[ooff+r*ostride:] (gemmTile's layout is ostride 16). It is the
// 512-bit tile, so callers check hasZMM first.
func gemmTilePair(xp []float32, xoff int, w []float32, xstride, wstride, kc int, out []float32, ooff, ostride int, load bool) {
	mode := 0
	if load {
		mode = 1
	}
	gemmTilePairMode(xp, xoff, w, xstride, wstride, kc, out, ooff, ostride, mode, nil)
}

// gemmTilePairScaled is gemmTilePair loading out with each of its six rows
// first multiplied by scale[r].
func gemmTilePairScaled(xp []float32, xoff int, w []float32, xstride, wstride, kc int, out []float32, ooff, ostride int, scale []float32) {
	_ = scale[gemmTileW-1]
	gemmTilePairMode(xp, xoff, w, xstride, wstride, kc, out, ooff, ostride, 2, &scale[0])
}

// gemmTilePairMode checks the operands of gemm32x6AVX512 and runs it with
// its load mode (0 zero, 1 load, 2 load with row scales).
func gemmTilePairMode(xp []float32, xoff int, w []float32, xstride, wstride, kc int, out []float32, ooff, ostride, mode int, scale *float32) {
	_ = out[ooff+(gemmTileW-1)*ostride+gemmPanel-1]
	_ = out[(gemmTileW-1)*ostride+gemmPanel-1]
	_ = w[(gemmTileW-1)*wstride+kc-1]
	_ = xp[xoff+(kc-1)*xstride+gemmPanel-1]
	gemm32x6AVX512(&xp[0], &w[0], wstride, kc, &out[0], mode, xstride, xoff, ooff, ostride, scale)
}

// gemmTileRows is gemmTilePairMode on rows (12 or 8) weight rows
// (gemm32x12AVX512, gemm32x8AVX512), scale (mode 2) holding as many row
// scales.
func gemmTileRows(rows int, xp []float32, xoff int, w []float32, xstride, wstride, kc int, out []float32, ooff, ostride, mode int, scale *float32) {
	_ = out[ooff+(rows-1)*ostride+gemmPanel-1]
	_ = w[(rows-1)*wstride+kc-1]
	_ = xp[xoff+(kc-1)*xstride+gemmPanel-1]
	if rows == 2*gemmTileW {
		gemm32x12AVX512(&xp[0], &w[0], wstride, kc, &out[0], mode, xstride, xoff, ooff, ostride, scale)
		return
	}
	gemm32x8AVX512(&xp[0], &w[0], wstride, kc, &out[0], mode, xstride, xoff, ooff, ostride, scale)
}

// accGroup returns how many of the rest rows of a 512-bit MatAccumulate
// the next group takes: twelve, eight, or six (whole or, fewer left,
// padded). Even counts go in whole groups where twelves, eights and a six
// cover them (14 = 8+6, 16 = 8+8, 22 = 8+8+6): a padded group costs
// more than a whole twelve (docs/bench), and a six-row group issues half
// a twelve's FMAs for the same loads of x.
func accGroup(rest int) int {
	switch {
	case accEight && (rest == 14 || rest == 16 || rest == 22 || rest == 8):
		return 8
	case rest >= 2*gemmTileW:
		return 2 * gemmTileW
	}
	return gemmTileW
}

// accEight false leaves the eight-row groups out of accGroup's plan, for
// the benchmark that compares the two (BenchmarkMatAccumulateRows).
var accEight = true

// accWhole returns how many of m rows the 512-bit MatAccumulate covers
// with whole groups (accGroup's plan); the rest go through a padded one.
func accWhole(m int) int {
	r0 := 0
	for m-r0 >= gemmTileW {
		r0 += accGroup(m - r0)
	}
	return r0
}

// gemmTileGo is gemmTile in Go (separate roundings where the assembly
// fuses the multiply-add).
func gemmTileGo(xp, w []float32, xstride, wstride, kc int, out []float32, load bool) {
	for r := range gemmTileW {
		wr := w[r*wstride : r*wstride+kc]
		for i := range gemmPanel {
			var s float32
			if load {
				s = out[r*gemmPanel+i]
			}
			for p, v := range wr {
				s += v * xp[p*xstride+i]
			}
			out[r*gemmPanel+i] = s
		}
	}
}

// MatAccumulateWide reports whether MatAccumulate runs its 512-bit tiles
// (else the 256-bit one, or plain Go).
func MatAccumulateWide() bool { return useAVX2 && accWide() }

// MatAccumulateScratch is the scratch MatAccumulate needs for depth k.
func MatAccumulateScratch(k int) int { return gemmTileW*k + 2*gemmTileW*gemmPanel }

// MatAccumulate adds a·b to m rows of c: c[r·ldc+x] becomes the FMA chain
// over i < k of a[r·k+i]·b[i·ldb+x], in i order, starting from its value,
// for x < n: per output exactly what RankUpdate does with e = 1 (dimensions
// past the last whole 64 take its plain-Go tail, as it does). It runs the
// packed GEMM's register tile on b in place, with the rows of a broadcast,
// so each element of b is loaded once for six rows instead of once per row
// (attention's values: one block of positions for all the heads that share
// it). scratch holds at least MatAccumulateScratch(k) floats.
func MatAccumulate(c []float32, ldc int, a, b []float32, ldb, m, n, k int, scratch []float32) {
	matAccumulate(c, ldc, nil, a, b, ldb, m, n, k, scratch)
}

// MatAccumulateScaled is MatAccumulate on c's rows each first multiplied
// by its scale (c[r·ldc+x] = s[r]·c[r·ldc+x], one rounded product as Scale
// makes it, then the FMA chain): the bits of Scale on every row and then
// MatAccumulate. Where the 512-bit tile runs a whole group of rows in
// place it scales them as it loads them, so the rows are read and written
// once (KDA's chunk update: diag(e^{G_last}) S + Kᵀ U).
func MatAccumulateScaled(c []float32, ldc int, s, a, b []float32, ldb, m, n, k int, scratch []float32) {
	if m == 0 || n == 0 {
		return
	}
	_ = s[m-1]
	// The parts the tile does not scale: rows past the last whole group of
	// gemmTileW, and columns past the tile's (all of them off the 512-bit
	// tile, or with k = 0).
	fused := 0
	if useAVX2 && accWide() && k > 0 {
		fused = n &^ 63
	}
	groups := accWhole(m)
	for r := range m {
		lo := fused
		if r >= groups {
			lo = 0
		}
		if lo < n {
			Scale(c[r*ldc+lo:r*ldc+n], s[r])
		}
	}
	if fused == 0 {
		MatAccumulate(c, ldc, a, b, ldb, m, n, k, scratch)
		return
	}
	matAccumulate(c, ldc, s, a, b, ldb, m, n, k, scratch)
}

// matAccumulate is MatAccumulate; with s set, the 512-bit tile's whole row
// groups scale their rows of c by s as they load them.
func matAccumulate(c []float32, ldc int, s, a, b []float32, ldb, m, n, k int, scratch []float32) {
	if m == 0 || n == 0 || k == 0 {
		return
	}
	_ = c[(m-1)*ldc+n-1]
	_ = a[m*k-1]
	_ = b[(k-1)*ldb+n-1]
	const tileLen = gemmTileW * gemmPanel
	wpad := scratch[:gemmTileW*k]
	out := scratch[gemmTileW*k : gemmTileW*k+2*tileLen]
	xv := 0
	if useAVX2 {
		xv = n &^ 63 // RankUpdate's assembly part
	}
	// With 512-bit FMAs the tile takes 32 columns at a time (two panels of
	// 16, 16 floats apart); xv is a multiple of 64, so no lone panel is left.
	step, wide := gemmPanel, accWide()
	if wide {
		step = 2 * gemmPanel
	}
	for r0 := 0; r0 < m; r0 += gemmTileW {
		if g := accGroup(m - r0); wide && g > gemmTileW && xv > 0 {
			// Twelve or eight whole rows on c in place, on those tiles.
			mode, sp := 1, (*float32)(nil)
			if s != nil {
				mode, sp = 2, &s[r0]
			}
			for x0 := 0; x0 < xv; x0 += step {
				gemmTileRows(g, b[x0:], gemmPanel, a[r0*k:], ldb, k, k, c[r0*ldc+x0:], gemmPanel, ldc, mode, sp)
			}
			r0 += g - gemmTileW
			continue
		}
		rows := min(gemmTileW, m-r0)
		w := a[r0*k:]
		if rows < gemmTileW {
			copy(wpad, a[r0*k:(r0+rows)*k])
			clear(wpad[rows*k:])
			w = wpad
		}
		for x0 := 0; x0 < xv; x0 += step {
			if rows == gemmTileW {
				// Whole row groups run on c in place.
				switch {
				case wide && s != nil:
					gemmTilePairScaled(b[x0:], gemmPanel, w, ldb, k, k, c[r0*ldc+x0:], gemmPanel, ldc, s[r0:])
				case wide:
					gemmTilePair(b[x0:], gemmPanel, w, ldb, k, k, c[r0*ldc+x0:], gemmPanel, ldc, true)
				default:
					gemmTileAt(b[x0:], w, ldb, k, k, c[r0*ldc+x0:], ldc)
				}
				continue
			}
			for r := range rows {
				copy(out[r*gemmPanel:(r+1)*gemmPanel], c[(r0+r)*ldc+x0:])
				if wide {
					copy(out[tileLen+r*gemmPanel:tileLen+(r+1)*gemmPanel], c[(r0+r)*ldc+x0+gemmPanel:])
				}
			}
			if wide {
				gemmTilePair(b[x0:], gemmPanel, w, ldb, k, k, out, tileLen, gemmPanel, true)
			} else {
				gemmTile(b[x0:], w, ldb, k, k, out, true)
			}
			for r := range rows {
				copy(c[(r0+r)*ldc+x0:(r0+r)*ldc+x0+gemmPanel], out[r*gemmPanel:])
				if wide {
					copy(c[(r0+r)*ldc+x0+gemmPanel:(r0+r)*ldc+x0+step], out[tileLen+r*gemmPanel:])
				}
			}
		}
	}
	for r := range m {
		ar := a[r*k : (r+1)*k]
		for x := xv; x < n; x++ {
			acc := c[r*ldc+x]
			for i, ai := range ar {
				acc += ai * b[i*ldb+x]
			}
			c[r*ldc+x] = acc
		}
	}
}
