package kernel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// checkProduct compares dst = x·wᵀ with a float64 reference, within the
// rounding bound of a k-term float32 sum (k·2⁻²³ of the sum of magnitudes).
func checkProduct(t *testing.T, name string, got, x, w []float32, m, n, k int) {
	t.Helper()
	for i := range m {
		for j := range n {
			var want, mag float64
			for q := range k {
				p := float64(x[i*k+q]) * float64(w[j*k+q])
				want, mag = want+p, mag+math.Abs(p)
			}
			tol := float64(k)*0x1p-23*mag + 1e-30
			if d := math.Abs(float64(got[i*n+j]) - want); d > tol || math.IsNaN(d) {
				t.Fatalf("%s m=%d n=%d k=%d (%d,%d): %g want %g", name, m, n, k, i, j, got[i*n+j], want)
			}
		}
	}
}

// randBF16 returns bf16 weights and the same weights widened.
func randBF16(r *rand.Rand, n int) ([]uint16, []float32) {
	wb := make([]uint16, n)
	for i := range wb {
		wb[i] = uint16(math.Float32bits(float32(r.NormFloat64())) >> 16)
	}
	w := make([]float32, n)
	WidenBF16(w, wb)
	return wb, w
}

// TestMatMulPacked runs the packed GEMM on edge shapes (partial panels,
// tiles and weight blocks; k around the block size) for pools of one to
// three parts, f32 and bf16 weights, from unaligned starts.
func TestMatMulPacked(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, parts := range []int{1, 2, 3} {
		p := NewPool(parts)
		for _, m := range []int{1, 15, 16, 17, 63, 65} {
			for _, n := range []int{1, 5, 6, 7, 47, 48, 49, 97} {
				for _, k := range []int{1, 15, 17, 63, 255, 256, 257, 520} {
					x := randSlice(r, m*k+1)[1:]
					wb, w := randBF16(r, n*k+1)
					wb, w = wb[1:], w[1:]
					got, gotB := make([]float32, m*n), make([]float32, m*n)
					p.matMulPacked(got, x, w, nil, m, n, k)
					p.matMulPacked(gotB, x, nil, wb, m, n, k)
					checkProduct(t, "f32", got, x, w, m, n, k)
					for i := range got {
						if got[i] != gotB[i] {
							t.Fatalf("m=%d n=%d k=%d: bf16 weights give %g, the same weights widened %g", m, n, k, gotB[i], got[i])
						}
					}
				}
			}
		}
		p.Close()
	}
}

// TestMatMulPackedRowInvariant checks that an output depends only on its
// x row and weight row: the rows of x reversed give the rows of the
// product reversed, to the bit, although every row lands in another panel
// slot and the panels fill differently.
func TestMatMulPackedRowInvariant(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	p := NewPool(2)
	defer p.Close()
	m, n, k := 71, 29, 300
	x, w := randSlice(r, m*k), randSlice(r, n*k)
	rev := make([]float32, m*k)
	for i := range m {
		copy(rev[(m-1-i)*k:(m-i)*k], x[i*k:(i+1)*k])
	}
	a, b := make([]float32, m*n), make([]float32, m*n)
	p.matMulPacked(a, x, w, nil, m, n, k)
	p.matMulPacked(b, rev, w, nil, m, n, k)
	for i := range m {
		for j := range n {
			if a[i*n+j] != b[(m-1-i)*n+j] {
				t.Fatalf("row %d col %d: %g, reversed %g", i, j, a[i*n+j], b[(m-1-i)*n+j])
			}
		}
	}
}

// TestGemmTile compares the assembly register tile with its Go twin, from
// zero and continuing partial sums.
func TestGemmTile(t *testing.T) {
	if !useAVX2 {
		t.Skip("no assembly tile in this build")
	}
	r := rand.New(rand.NewPCG(25, 26))
	for _, kc := range []int{1, 2, 7, 64, 256} {
		for _, load := range []bool{false, true} {
			for _, xstride := range []int{gemmPanel, 21} {
				stride := kc + 3
				xp, w := randSlice(r, kc*xstride+gemmPanel), randSlice(r, gemmTileW*stride)
				got, want := randSlice(r, gemmTileW*gemmPanel), make([]float32, gemmTileW*gemmPanel)
				copy(want, got)
				gemmTile(xp, w, xstride, stride, kc, got, load)
				gemmTileGo(xp, w, xstride, stride, kc, want, load)
				for i := range got {
					if d := math.Abs(float64(got[i] - want[i])); d > 1e-5*float64(kc)*math.Max(1, math.Abs(float64(want[i]))) {
						t.Fatalf("kc=%d load=%v xstride=%d out[%d]: %g, Go %g", kc, load, xstride, i, got[i], want[i])
					}
				}
			}
		}
	}
}

func TestMatMulPackedNoAlloc(t *testing.T) {
	p := NewPool(0)
	defer p.Close()
	m, n, k := PackedMinRows, 100, 96
	x, w, y := make([]float32, m*k), make([]float32, n*k), make([]float32, m*n)
	wb := make([]uint16, len(w))
	p.matMulPacked(y, x, w, nil, m, n, k) // the buffers grow once
	if a := testing.AllocsPerRun(20, func() {
		p.matMulPacked(y, x, w, nil, m, n, k)
		p.matMulPacked(y, x, nil, wb, m, n, k)
	}); a != 0 && !raceEnabled {
		t.Errorf("packed MatMul allocates %v times per call", a)
	}
}

// BenchmarkPackedVsTiles runs the packed GEMM and the dot-form tiles side
// by side on bf16 weights by row count, depth and (for a few depths) width:
// where the two cross is where PackedMinRows, packedMinK, packedMinN and
// (with 512-bit FMAs) packedWideMinN and packedWideMinK belong.
func BenchmarkPackedVsTiles(b *testing.B) {
	p := NewPool(0)
	defer p.Close()
	r := rand.New(rand.NewPCG(1, 1))
	for _, nk := range [][2]int{{2048, 64}, {2048, 128}, {2048, 256}, {2048, 384}, {2048, 512}, {2048, 768},
		{2048, 1024}, {2048, 1536}, {2048, 2048}, {64, 768}, {128, 768}, {256, 768}, {384, 768}, {512, 768}, {640, 768}, {512, 384}, {768, 384}, {768, 128}, {64, 2048}, {256, 2048}, {128, 384}, {256, 384}, {128, 128}, {256, 128}, {512, 128}, {768, 64}, {384, 256}} {
		n, k := nk[0], nk[1]
		wb, _ := randBF16(r, n*k)
		for _, m := range []int{32, 64, 256} {
			x, y := randSlice(r, m*k), make([]float32, m*n)
			flop := 2 * float64(m*n*k)
			b.Run(fmt.Sprintf("n%d/k%d/m%d/packed", n, k, m), func(b *testing.B) {
				for range b.N {
					p.matMulPacked(y, x, nil, wb, m, n, k)
				}
				b.ReportMetric(flop*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
			b.Run(fmt.Sprintf("n%d/k%d/m%d/tiles", n, k, m), func(b *testing.B) {
				for range b.N {
					p.Run(matMulBF16Range, Args{Dst: y, X: x, WB: wb, M: m, N: n, K: k}, n, 16)
				}
				b.ReportMetric(flop*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkMatAccumulateRows runs MatAccumulate at the row counts where
// accGroup's plan takes eight-row groups (KDA's chunk of 16: 32 rows of
// keys and queries against the 128x128 state, Mqk·U of 16 rows, the
// solve's blocks of 8, the state update of 128 rows scaled), with and
// without them, alternating call by call on warm operands, and reports
// each as a share of one core's FMA peak probed in the same run.
func BenchmarkMatAccumulateRows(b *testing.B) {
	p := NewPool(0)
	defer p.Close()
	defer func() { accEight = true }()
	peak := p.PeakKernelFLOPS() / float64(p.Size())
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range []struct {
		m, n, k int
		scaled  bool
	}{{32, 128, 128, false}, {16, 128, 16, false}, {8, 128, 8, false}, {128, 128, 16, true}, {24, 128, 128, false}} {
		b.Run(fmt.Sprintf("m%d/n%d/k%d", c.m, c.n, c.k), func(b *testing.B) {
			a, bm, cm, s := randSlice(r, c.m*c.k), randSlice(r, c.k*c.n), randSlice(r, c.m*c.n), make([]float32, c.m)
			for i := range s {
				s[i] = 1
			}
			scratch := make([]float32, MatAccumulateScratch(c.k))
			const calls = 50
			med := alternateMedians(b, 2, func(mode int) {
				accEight = mode == 0
				for range calls {
					if c.scaled {
						MatAccumulateScaled(cm, c.n, s, a, bm, c.n, c.m, c.n, c.k, scratch)
					} else {
						MatAccumulate(cm, c.n, a, bm, c.n, c.m, c.n, c.k, scratch)
					}
				}
			})
			flop := 2 * float64(c.m*c.n*c.k) * calls
			if peak > 0 {
				b.ReportMetric(flop/(med[0]/1e9)/peak, "eights_of_peak")
				b.ReportMetric(flop/(med[1]/1e9)/peak, "sixes_of_peak")
			}
			b.ReportMetric(med[0]/med[1], "eights/sixes")
		})
	}
}

// TestMatAccumulate checks MatAccumulate against RankUpdate row by row, to
// the bit, with each tile width: the grouped attention path and KDA's
// chunk state update may use either.
func TestMatAccumulate(t *testing.T) { atTileWidths(t, &packedTile, testMatAccumulate) }

func testMatAccumulate(t *testing.T) {
	r := rand.New(rand.NewPCG(27, 28))
	for _, m := range []int{1, 5, 6, 7, 8, 12, 13, 14, 16, 22, 25, 32, 34, 48} {
		for _, n := range []int{1, 17, 64, 100, 128, 512} {
			for _, k := range []int{1, 7, 64} {
				ldb, ldc := n+3, n+2
				a, b := randSlice(r, m*k), randSlice(r, k*ldb)
				c := randSlice(r, m*ldc)
				// RankUpdate with a decay e equals the rows scaled by e
				// (Mul), then MatAccumulate: KDA's chunk state update
				// takes either.
				e := randSlice(r, n)
				want := slices.Clone(c)
				for row := range m {
					RankUpdate(want[row*ldc:row*ldc+n], e, a[row*k:(row+1)*k], b, ldb)
					Mul(c[row*ldc:row*ldc+n], c[row*ldc:row*ldc+n], e)
				}
				scratch := make([]float32, MatAccumulateScratch(k))
				MatAccumulate(c, ldc, a, b, ldb, m, n, k, scratch)
				for i := range c {
					if c[i] != want[i] {
						t.Fatalf("%d-bit tile m=%d n=%d k=%d: c[%d] = %v, RankUpdate %v", packedTile, m, n, k, i, c[i], want[i])
					}
				}
			}
		}
	}
}

// TestMatAccumulateScaled holds MatAccumulateScaled to the bits of Scale on
// every row and then MatAccumulate, at both tile widths, on shapes with and
// without whole row groups and whole 64-column blocks, with scales of 0, 1,
// negative and ordinary values.
func TestMatAccumulateScaled(t *testing.T) { atTileWidths(t, &packedTile, testMatAccumulateScaled) }

func testMatAccumulateScaled(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for _, m := range []int{1, 5, 6, 7, 8, 12, 13, 14, 16, 22, 25, 32, 128} {
		for _, n := range []int{1, 17, 64, 100, 128} {
			for _, k := range []int{0, 1, 7, 16} {
				ldb, ldc := n+3, n+2
				a, b := randSlice(r, m*k), randSlice(r, max(k, 1)*ldb)
				c, sc := randSlice(r, m*ldc), randSlice(r, m)
				sc[0] = 0
				if m > 2 {
					sc[1], sc[2] = 1, -sc[2]
				}
				want := slices.Clone(c)
				for row := range m {
					Scale(want[row*ldc:row*ldc+n], sc[row])
				}
				scratch := make([]float32, MatAccumulateScratch(k))
				MatAccumulate(want, ldc, a, b, ldb, m, n, k, scratch)
				MatAccumulateScaled(c, ldc, sc, a, b, ldb, m, n, k, scratch)
				for i := range c {
					if math.Float32bits(c[i]) != math.Float32bits(want[i]) {
						t.Fatalf("%d-bit tile m=%d n=%d k=%d: c[%d] = %v, Scale then MatAccumulate %v", packedTile, m, n, k, i, c[i], want[i])
					}
				}
			}
		}
	}
}

// TestGemmTilePair checks the 512-bit tile against the 256-bit one on each
// of its two panels, to the bit: both give every output one FMA chain over
// p in order. The panels lie as the packed GEMM lays them (16·k apart) and
// as MatAccumulate reads rows of 32 values (16 apart).
func TestGemmTilePair(t *testing.T) {
	if !hasZMM {
		t.Skip("no 512-bit tile on this CPU or path")
	}
	r := rand.New(rand.NewPCG(29, 30))
	const tileLen = gemmTileW * gemmPanel
	for _, kc := range []int{1, 2, 7, 64, 256} {
		for _, load := range []bool{false, true} {
			for _, lay := range []struct{ xstride, xoff, ooff, ostride int }{
				{gemmPanel, gemmPanel * kc, gemmNB * gemmPanel, gemmPanel},
				{37, gemmPanel, tileLen, gemmPanel},
				{2 * gemmPanel, gemmPanel, tileLen + 5, gemmPanel},
				{2 * gemmPanel, gemmPanel, gemmPanel, 2*gemmPanel + 3}, // MatAccumulate in place
			} {
				stride := kc + 3
				xp := randSlice(r, lay.xoff+kc*lay.xstride+gemmPanel)
				w := randSlice(r, gemmTileW*stride)
				got := randSlice(r, lay.ooff+(gemmTileW-1)*lay.ostride+gemmPanel+7)
				want := slices.Clone(got)
				gemmTilePair(xp, lay.xoff, w, lay.xstride, stride, kc, got, lay.ooff, lay.ostride, load)
				// The 256-bit tile writes rows of 16: gather each panel's
				// rows from the strided layout and scatter them back.
				for _, off := range []int{0, lay.ooff} {
					buf := make([]float32, tileLen)
					for q := range gemmTileW {
						copy(buf[q*gemmPanel:(q+1)*gemmPanel], want[off+q*lay.ostride:])
					}
					x := xp
					if off != 0 {
						x = xp[lay.xoff:]
					}
					gemmTile(x, w, lay.xstride, stride, kc, buf, load)
					for q := range gemmTileW {
						copy(want[off+q*lay.ostride:off+q*lay.ostride+gemmPanel], buf[q*gemmPanel:])
					}
				}
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("kc=%d load=%v layout %+v out[%d]: %g, 256-bit tile %g", kc, load, lay, i, got[i], want[i])
					}
				}
			}
		}
	}
}

// TestMatMulPackedWide checks that the packed GEMM gives the same bits
// with its 512-bit tile as with its 256-bit one, on the edge shapes of
// TestMatMulPacked (a lone last panel, partial tiles and blocks).
func TestMatMulPackedWide(t *testing.T) {
	if !hasZMM {
		t.Skip("no 512-bit tile on this CPU or path")
	}
	defer func(v int) { packedTile = v }(packedTile)
	r := rand.New(rand.NewPCG(31, 32))
	p := NewPool(2)
	defer p.Close()
	for _, m := range []int{15, 16, 17, 31, 32, 33, 48, 65, 100} {
		for _, n := range []int{1, 7, 48, 97} {
			for _, k := range []int{1, 17, 256, 300, 520} {
				x := randSlice(r, m*k)
				wb, w := randBF16(r, n*k)
				for _, bf := range []bool{false, true} {
					var wide, narrow []float32
					for _, bits := range []int{512, 256} {
						packedTile = bits
						y := make([]float32, m*n)
						if bf {
							p.matMulPacked(y, x, nil, wb, m, n, k)
						} else {
							p.matMulPacked(y, x, w, nil, m, n, k)
						}
						if bits == 512 {
							wide = y
						} else {
							narrow = y
						}
					}
					for i := range wide {
						if math.Float32bits(wide[i]) != math.Float32bits(narrow[i]) {
							t.Fatalf("m=%d n=%d k=%d bf16=%v: out[%d] = %g with the 512-bit tile, %g with the 256-bit one", m, n, k, bf, i, wide[i], narrow[i])
						}
					}
				}
			}
		}
	}
}

// TestTile2x8Wide checks the zmm 2x8 tiles against the 256-bit ones to the
// bit (f32 and bf16 weights, a pair of weight rows and one row taken
// twice), and the four-row zmm tile against two pairs: decode batches may
// run any of them, and a session's logits must not depend on which.
func TestTile2x8Wide(t *testing.T) {
	if !hasZMM {
		t.Skip("no 512-bit tiles on this CPU or path")
	}
	defer func(v int) { dotTileBits = v }(dotTileBits)
	r := rand.New(rand.NewPCG(33, 34))
	for _, k := range []int{8, 64, 768, 2056} {
		x := randSlice(r, 8*k)
		wq, _ := randBF16(r, 4*k)
		_, wf := randBF16(r, 4*k)
		wf[1] += 0x1p-20 // not a bf16 value: f32 weights proper
		for _, bf := range []bool{true, false} {
			var quad, pairs [8 * 5]float32
			if bf {
				dot4x8BF16ZMM(&x[0], k, &wq[0], k, k, &quad[0], 5)
				dot2x8BF16AVX512(&x[0], k, &wq[0], k, k, &pairs[0], 5)
				dot2x8BF16AVX512(&x[0], k, &wq[2*k], k, k, &pairs[2], 5)
			} else {
				dot4x8F32ZMM(&x[0], k, &wf[0], k, k, &quad[0], 5)
				dot2x8F32AVX512(&x[0], k, &wf[0], k, k, &pairs[0], 5)
				dot2x8F32AVX512(&x[0], k, &wf[2*k], k, k, &pairs[2], 5)
			}
			for i := range quad {
				if math.Float32bits(quad[i]) != math.Float32bits(pairs[i]) {
					t.Fatalf("k=%d bf16=%v four-row tile out[%d] = %g, two 256-bit pairs %g", k, bf, i, quad[i], pairs[i])
				}
			}
			if quad[0] == 0 || quad[3] == 0 || quad[39] != 0 {
				t.Fatalf("k=%d bf16=%v four-row tile wrote %v", k, bf, quad)
			}
		}
		wb, w := randBF16(r, 2*k)
		for _, bf := range []bool{false, true} {
			for _, wstride := range []int{k, 0} {
				a := Args{X: x, W: w, K: k}
				if bf {
					a = Args{X: x, WB: wb, K: k}
				}
				var got [2][24]float32
				for i, bits := range []int{512, 256} {
					dotTileBits = bits
					tile2x8(&a, 0, 0, wstride, &got[i][0], 3)
				}
				for i := range got[0] {
					if i%3 == 2 {
						continue // the stride's gap, never written
					}
					if math.Float32bits(got[0][i]) != math.Float32bits(got[1][i]) {
						t.Fatalf("k=%d bf16=%v wstride=%d out[%d]: zmm %g, 256-bit %g", k, bf, wstride, i, got[0][i], got[1][i])
					}
					q, c := i/3, i%3
					var want, mag float64
					for p := range k {
						v := float64(x[q*k+p]) * float64(w[c*wstride+p])
						want, mag = want+v, mag+math.Abs(v)
					}
					if d := math.Abs(float64(got[0][i]) - want); d > float64(k)*0x1p-23*mag {
						t.Fatalf("k=%d bf16=%v wstride=%d out[%d] = %g, float64 product %g", k, bf, wstride, i, got[0][i], want)
					}
				}
			}
		}
	}
}
