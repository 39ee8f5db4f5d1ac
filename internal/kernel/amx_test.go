package kernel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// amxShapes are products with short row blocks, a short last pair of
// panels, a lone short panel and k off the block size.
var amxShapes = [][3]int{
	{1, 32, 32}, {1, 100, 40}, {5, 16, 64}, {16, 48, 768}, {17, 33, 31},
	{31, 64, 96}, {32, 256, 128}, {33, 300, 77}, {70, 96, 200}, {9, 1000, 64},
	{8, 80, 600}, {27, 40, 300}, {45, 64, 520}, // whole k in a few row blocks, k-ranges in many
}

// TestPackAMX checks PackAMX against its documented index, with whole
// tiles transposed in vector registers where the CPU has them and element
// by element.
func TestPackAMX(t *testing.T) {
	saved := hasAVX512BW
	defer func() { hasAVX512BW = saved }()
	for _, vec := range []bool{true, false} {
		hasAVX512BW = vec && saved
		t.Run(fmt.Sprintf("vector=%v", hasAVX512BW), testPackAMX)
	}
}

func testPackAMX(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, sh := range [][2]int{{1, 1}, {15, 3}, {16, 32}, {33, 40}, {100, 65}, {64, 384}, {48, 97}, {31, 128}} {
		n, k := sh[0], sh[1]
		w := kmajWeights(r, n*k)
		wp := make([]uint16, AMXLen(n, k))
		for i := range wp {
			wp[i] = 0xffff // every padding element must be written
		}
		PackAMX(wp, w, n, k)
		// The documented index, element by element.
		kb := amxKPad(k) / amxKBlock
		for p := range amxCols(n) / AMXPanel {
			for b := range kb {
				for i := range 16 {
					for c := range AMXPanel {
						for e := range 2 {
							col, kk := p*AMXPanel+c, b*amxKBlock+2*i+e
							want := uint16(0)
							if col < n && kk < k {
								want = w[col*k+kk]
							}
							require.Equal(t, want, wp[(p*kb+b)*512+32*i+2*c+e], "n=%d k=%d panel %d block %d pair %d col %d", n, k, p, b, i, c)
						}
					}
				}
			}
		}
		got := make([]uint16, n*k)
		UnpackAMX(got, wp, n, k)
		require.Equal(t, w, got)
		pooled := make([]uint16, len(wp))
		p := NewPool(3)
		p.PackAMX(pooled, w, n, k)
		p.Close()
		require.Equal(t, wp, pooled)
	}
}

func TestSplitBF16(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	x := make([]float32, 4099) // a tail past whole vectors
	for i := range x {
		x[i] = float32(r.NormFloat64() * math.Pow(2, float64(r.IntN(40)-20)))
	}
	x[0], x[1], x[2] = 0, 1, float32(math.Copysign(0, -1))
	x[3], x[4] = math.Float32frombits(0x00400000), 0x1p-120*1.2345 // a subnormal; a remainder below normal
	x[5], x[6] = float32(math.Inf(1)), float32(math.NaN())
	x[4097] = math.Float32frombits(0x80000123)
	split := func(twin bool) (hi, mid, lo []uint16) {
		amxGo = twin
		defer func() { amxGo = false }()
		hi, mid, lo = make([]uint16, len(x)), make([]uint16, len(x)), make([]uint16, len(x))
		SplitBF16(hi, mid, lo, x)
		return hi, mid, lo
	}
	hi, mid, lo := split(true)
	require.Equal(t, []uint16{0, 0, 0}, []uint16{hi[3], mid[3], lo[3]}, "a subnormal input reads as zero")
	for i, v := range x {
		if math.IsInf(float64(v), 0) || v != v || math.Abs(float64(v)) < 0x1p-100 {
			continue
		}
		sum := float64(bf16(hi[i])) + float64(bf16(mid[i])) + float64(bf16(lo[i]))
		require.LessOrEqual(t, math.Abs(sum-float64(v)), math.Abs(float64(v))*0x1p-24, "x[%d] = %g: parts sum to %g", i, v, sum)
	}
	if !hasAMX {
		t.Skip("no AMX here: the twin alone ran")
	}
	h2, m2, l2 := split(false)
	require.Equal(t, hi, h2, "hi: VCVTNEPS2BF16 against the twin")
	require.Equal(t, mid, m2, "mid")
	require.Equal(t, lo, l2, "lo")
	one := make([]uint16, len(x))
	RoundBF16DAZ(one, x)
	require.Equal(t, hi, one, "the fast product's one part is hi")
}

// amxRef is the product in float64 over the weights the packed form holds.
func amxRef(x []float32, w []uint16, m, n, k int) []float64 {
	out := make([]float64, m*n)
	for r := range m {
		for c := range n {
			var s float64
			for kk := range k {
				s += float64(x[r*k+kk]) * float64(bf16(w[c*k+kk]))
			}
			out[r*n+c] = s
		}
	}
	return out
}

// TestMatMulAMX checks the tiles against their plain-Go twin bitwise and the twin against a float64 product: the
// three-part split keeps fp32 accuracy (well inside 1e-5 of the row's
// scale).
func TestMatMulAMX(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	p := NewPool(2)
	defer p.Close()
	for _, sh := range amxShapes {
		m, n, k := sh[0], sh[1], sh[2]
		t.Run(fmt.Sprintf("%dx%dx%d", m, n, k), func(t *testing.T) {
			x, w := amxOperands(r, m, n, k, 1)
			twin := amxAllKernels(t, p, x, w, m, n, k)
			ref := amxRef(x, w, m, n, k)
			for i, v := range twin {
				require.InDelta(t, ref[i], v, 1e-5*math.Sqrt(float64(k))*2, "twin out[%d]", i)
			}
		})
	}
}

// TestAMXSubnormals: with x near the bottom of float32's range, products,
// chains and remainders fall below it, and every kernel flushes them as
// the tile unit does.
func TestAMXSubnormals(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	p := NewPool(2)
	defer p.Close()
	for _, sh := range [][3]int{{1, 64, 96}, {20, 32, 64}} {
		m, n, k := sh[0], sh[1], sh[2]
		x, w := amxOperands(r, m, n, k, 0x1p-125)
		twin := amxAllKernels(t, p, x, w, m, n, k)
		// The flushed remainders show: the result is further from the
		// float64 product than the split's 24 bits allow.
		ref := amxRef(x, w, m, n, k)
		worst := 0.0
		for i, v := range twin {
			worst = max(worst, math.Abs(float64(v)-ref[i])/0x1p-125)
		}
		require.Greater(t, worst, 1e-3, "nothing flushed: the case does not reach the subnormals")
	}
}

// TestAMXTilesTwin holds amxTilesGo, which widens each block's operands
// once, to amxTilesSpec bit for bit: random part rows and weights with
// subnormals, signed zeros, infinities and NaNs among them, over several
// row counts, k-blocks and column groups, written into a wider c.
func TestAMXTilesTwin(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 32))
	special := []uint16{0x0000, 0x8000, 0x0001, 0x807f, 0x0080, 0x7f7f}
	word := func(tiny bool) uint16 {
		switch {
		case r.IntN(2000) == 0:
			return []uint16{0x7f80, 0xff80, 0x7fc1}[r.IntN(3)] // infinities, a NaN
		case r.IntN(8) == 0:
			return special[r.IntN(len(special))]
		}
		// Exponents near the bottom of the range as well as the middle,
		// so that chains and sums fall below it.
		e := uint16(1 + r.IntN(12))
		if !tiny && r.IntN(2) == 0 {
			e = uint16(120 + r.IntN(16))
		}
		return uint16(r.IntN(2))<<15 | e<<7 | uint16(r.IntN(128))
	}
	for _, sh := range [][3]int{{1, 1, 1}, {3, 2, 1}, {15, 1, 3}, {30, 2, 2}, {7, 3, 5}} {
		prows, kb, groups := sh[0], sh[1], sh[2]
		as := kb*amxKBlock + 5
		a := make([]uint16, prows*as)
		for i := range a {
			// Every third part row tiny throughout, so that whole chains
			// and sums fall below the normal range and are flushed.
			a[i] = word(i/as%3 == 2)
		}
		w := make([]uint16, 2*groups*AMXPanel*kb*amxKBlock)
		for i := range w {
			w[i] = word(false)
		}
		cs := groups*2*AMXPanel + 3
		got, want := make([]float32, prows*cs), make([]float32, prows*cs)
		for i := range got {
			got[i], want[i] = 7, 7
		}
		amxTilesGo(a, as, w, kb, prows, got, cs, groups)
		amxTilesSpec(a, as, w, kb, prows, want, cs, groups)
		finite := 0
		for i := range got {
			if want[i] != want[i] {
				// Which NaN's payload survives a sum follows the
				// compiler's operand order; that it is NaN does not.
				require.True(t, got[i] != got[i], "%d part rows, %d k-blocks, %d groups: c[%d] = %g, want NaN", prows, kb, groups, i, got[i])
				continue
			}
			require.Equal(t, math.Float32bits(want[i]), math.Float32bits(got[i]), "%d part rows, %d k-blocks, %d groups: c[%d] = %g, want %g", prows, kb, groups, i, got[i], want[i])
			finite++
		}
		require.Greater(t, finite, len(got)*3/4, "most outputs are numbers")
	}

	// Sums of normal numbers that cancel to below the normal range are
	// flushed to zero: the even and odd chains' (row 0, block 1:
	// 1.5·2⁻¹²⁵ − 1.25·2⁻¹²⁵, added to 2⁻¹²⁰ from block 0, which 2⁻¹²⁷
	// unflushed would change) and the accumulator's (row 1: the same
	// across blocks 0 and 1).
	bits := func(v float32) uint16 { return uint16(math.Float32bits(v) >> 16) }
	a := make([]uint16, 2*2*amxKBlock)
	w := make([]uint16, 2*AMXPanel*2*amxKBlock)
	w[0], w[1], w[512], w[513] = bits(0x1p-62), bits(0x1p-62), bits(0x1p-62), bits(0x1p-62)
	a[0] = bits(0x1p-58)
	a[amxKBlock], a[amxKBlock+1] = bits(1.5*0x1p-63), bits(-1.25*0x1p-63)
	a[2*amxKBlock], a[3*amxKBlock] = bits(1.5*0x1p-63), bits(-1.25*0x1p-63)
	want := make([]float32, 2*2*AMXPanel)
	want[0] = 0x1p-120
	for _, tiles := range []func(a []uint16, as int, w []uint16, kb, prows int, c []float32, cs, groups int){amxTilesGo, amxTilesSpec} {
		c := make([]float32, 2*2*AMXPanel)
		for i := range c {
			c[i] = 7
		}
		tiles(a, 2*amxKBlock, w, 2, 2, c, 2*AMXPanel, 1)
		require.Equal(t, want, c, "cancelled sums flushed")
	}
}

// amxTilesSpec is the tile kernels' specification: for each of prows part
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
// TestMatMulAMX.)
func amxTilesSpec(a []uint16, as int, w []uint16, kb, prows int, c []float32, cs, groups int) {
	kp := kb * amxKBlock
	for g := range groups {
		for col := range 2 * AMXPanel {
			pan := w[(2*g+col/AMXPanel)*AMXPanel*kp:]
			cc := col % AMXPanel
			for r := range prows {
				var acc float32
				for b := range kb {
					wt := pan[b*512:]
					ar := a[r*as+b*amxKBlock:]
					var even, odd float32
					for i := range 16 {
						even = ftz(even + dazBF16(ar[2*i])*dazBF16(wt[i*32+2*cc]))
						odd = ftz(odd + dazBF16(ar[2*i+1])*dazBF16(wt[i*32+2*cc+1]))
					}
					acc = ftz(acc + ftz(even+odd))
				}
				c[r*cs+g*2*AMXPanel+col] = acc
			}
		}
	}
}

// amxOperands returns x [m, k] (not bf16-representable, times scale) and
// bf16 weights [n, k].
func amxOperands(r *rand.Rand, m, n, k int, scale float64) ([]float32, []uint16) {
	_, x := randBF16(r, m*k)
	for i := range x {
		x[i] = float32(float64(x[i]) * (1 + r.Float64()) * scale)
	}
	return x, kmajWeights(r, n*k)
}

// amxAllKernels runs the product on the twin and, where the CPU has AMX, on
// the tiles (pooled and serial), requires them all equal bit for bit, and
// returns the twin's result.
func amxAllKernels(t *testing.T, p *Pool, x []float32, w []uint16, m, n, k int) []float32 {
	t.Helper()
	wp := make([]uint16, AMXLen(n, k))
	PackAMX(wp, w, n, k)
	amxGo = true
	twin := make([]float32, m*n)
	p.MatMulAMX(twin, x, wp, m, n, k)
	amxGo = false
	if !hasAMX {
		return twin
	}
	got := make([]float32, m*n+3)
	got[m*n], got[m*n+1] = 7, 7
	p.MatMulAMX(got[:m*n], x, wp, m, n, k)
	require.Equal(t, twin, got[:m*n], "tiles against the twin")
	require.Equal(t, float32(7), got[m*n], "tiles wrote past dst")
	serial := make([]float32, m*n)
	MatMulAMXSerial(serial, x, wp, m, n, k)
	require.Equal(t, twin, serial, "tiles, serial")
	return twin
}

// TestAMXRowsInvariant: each row's outputs are the same alone as in the
// product of all rows, whichever row block and tile rows it fell in.
func TestAMXRowsInvariant(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	p := NewPool(2)
	defer p.Close()
	m, n, k := 45, 80, 96
	_, x := randBF16(r, m*k)
	for i := range x {
		x[i] *= 1.37
	}
	w := kmajWeights(r, n*k)
	wp := make([]uint16, AMXLen(n, k))
	PackAMX(wp, w, n, k)
	all := make([]float32, m*n)
	p.MatMulAMX(all, x, wp, m, n, k)
	for _, span := range [][2]int{{0, 1}, {17, 18}, {44, 45}, {3, 11}, {20, 45}, {4, 6}, {9, 21}} {
		a, b := span[0], span[1]
		part := make([]float32, (b-a)*n)
		p.MatMulAMX(part, x[a*k:b*k], wp, b-a, n, k)
		require.Equal(t, all[a*n:b*n], part, "rows [%d, %d)", a, b)
	}
}

// TestAMXAllocs: a warm AMX product allocates nothing, on the pool and
// serially, at decode and prefill sizes (the twin where the CPU has no
// AMX: the same jobs and scratch).
func TestAMXAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	r := rand.New(rand.NewPCG(13, 14))
	pool := NewPool(2)
	defer pool.Close()
	n, k := 300, 96
	wp := make([]uint16, AMXLen(n, k))
	PackAMX(wp, kmajWeights(r, n*k), n, k)
	for _, m := range []int{1, 3, 8, 70} {
		x, y := randSlice(r, m*k), make([]float32, m*n)
		require.Zero(t, testing.AllocsPerRun(20, func() { pool.MatMulAMX(y, x, wp, m, n, k) }), "%d rows on the pool", m)
		require.Zero(t, testing.AllocsPerRun(20, func() { MatMulAMXSerial(y, x, wp, m, n, k) }), "%d rows serially", m)
	}
}

// TestMatMulAMXFast: the one-part product on the tiles equals its twin
// bit for bit, is the product of x rounded to bf16 (to 1e-5 of the row's
// scale) and within 2^-8 of the exact product's scale, and gives a row
// the same bits alone as among others.
func TestMatMulAMXFast(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	p := NewPool(2)
	defer p.Close()
	for _, sh := range [][3]int{{1, 32, 32}, {7, 100, 40}, {16, 48, 768}, {31, 64, 96}, {45, 300, 77}} {
		m, n, k := sh[0], sh[1], sh[2]
		x, w := amxOperands(r, m, n, k, 1)
		wp := make([]uint16, AMXLen(n, k))
		PackAMX(wp, w, n, k)
		amxGo = true
		twin := make([]float32, m*n)
		p.MatMulAMXFast(twin, x, wp, m, n, k)
		amxGo = false
		xb := make([]uint16, len(x))
		ToBF16(xb, x)
		xr := make([]float32, len(x))
		WidenBF16(xr, xb)
		rounded, exact := amxRef(xr, w, m, n, k), amxRef(x, w, m, n, k)
		for i, v := range twin {
			row := i / n
			var scale float64
			for kk := range k {
				scale += math.Abs(float64(x[row*k+kk]) * float64(bf16(w[i%n*k+kk])))
			}
			require.InDelta(t, rounded[i], v, 1e-6*scale+1e-30, "%dx%dx%d out[%d] against the rounded x", m, n, k, i)
			require.InDelta(t, exact[i], v, 0x1p-8*scale+1e-30, "%dx%dx%d out[%d] against the exact x", m, n, k, i)
		}
		if !hasAMX {
			continue
		}
		got := make([]float32, m*n)
		p.MatMulAMXFast(got, x, wp, m, n, k)
		require.Equal(t, twin, got, "%dx%dx%d: tiles against the twin", m, n, k)
		one := make([]float32, n)
		p.MatMulAMXFast(one, x[(m-1)*k:], wp, 1, n, k)
		require.Equal(t, got[(m-1)*n:], one, "%dx%dx%d: the last row alone", m, n, k)
	}
}

// BenchmarkAMXRow times one-row products over weights rotated across
// copies (768 MB, from memory; K3_BENCH_COPIES sets another count) in
// k-major form and in AMX form, and reports GB/s and the share of the
// bandwidth probed before and after: what keeps the AMX layout opt-in
// (docs/bench).
func BenchmarkAMXRow(b *testing.B) {
	if !hasAMX || amxEmulated {
		b.Skip("no AMX here")
	}
	for _, sh := range [][2]int{{2304, 768}, {768, 2048}, {2048, 8192}} {
		n, k := sh[0], sh[1]
		r := rand.New(rand.NewPCG(1, 2))
		w := kmajWeights(r, n*k)
		x := randSlice(r, k)
		y := make([]float32, n)
		for _, layout := range []string{"kmajor", "amx"} {
			b.Run(fmt.Sprintf("%dx%d/%s", n, k, layout), func(b *testing.B) {
				p := NewPool(0)
				defer p.Close()
				size := KMajorLen(n, k)
				if layout != "kmajor" {
					size = AMXLen(n, k)
				}
				copies := max(2, (768<<20)/(2*size))
				if s := os.Getenv("K3_BENCH_COPIES"); s != "" {
					copies, _ = strconv.Atoi(s)
					copies = max(copies, 1)
				}
				ws := make([][]uint16, copies)
				for c := range ws {
					ws[c] = make([]uint16, size)
					if layout == "kmajor" {
						PackKMajor(ws[c], w, n, k)
					} else {
						PackAMX(ws[c], w, n, k)
					}
				}
				bw := BandwidthNow()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if layout == "kmajor" {
						p.MatMulKMajor(y, x, ws[i%copies], 1, n, k)
					} else {
						p.MatMulAMX(y, x, ws[i%copies], 1, n, k)
					}
				}
				gbs := float64(2*n*k) * float64(b.N) / b.Elapsed().Seconds()
				b.StopTimer()
				bw = max(bw, BandwidthNow())
				b.ReportMetric(gbs/1e9, "GB/s")
				b.ReportMetric(gbs/bw, "of_bandwidth")
			})
		}
	}
}

// BenchmarkAMXStep runs amxTiles2's k-step on one goroutine, its four tile
// products a round over and over: on zeroed tiles (the peak PeakAMXFLOPS
// probes), on tiles holding weights and activations' bf16 parts, with the
// step's four tile loads, and with the accumulators drained every eight
// rounds as between groups. It reports GFLOP/s and the share of the
// zeroed tiles' rate in the same run: the ceiling an exact three-part
// product's tiles can reach on this core is a third of the last figure
// (ARCHITECTURE, "AMX tiles"; docs/bench).
func BenchmarkAMXStep(b *testing.B) {
	if !hasAMX || amxEmulated {
		b.Skip("no AMX here")
	}
	r := rand.New(rand.NewPCG(3, 4))
	a := make([]uint16, 1024)
	hi, mid, lo := a[:256], a[256:512], make([]uint16, 256)
	SplitBF16(hi, mid, lo, randSlice(r, 256))
	copy(a[512:], a[:512])
	w := kmajWeights(r, 1024)
	c := make([]float32, 4096)
	const rounds = 1 << 16
	var cfg amxConfig
	cfg.set(16, 16)
	zero := 0.0
	for _, mode := range []string{"zero", "data", "loads", "drains"} {
		b.Run(mode, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				switch mode {
				case "zero":
					amxPeakLoop(&cfg, rounds)
				case "data":
					amxStepLoop(&cfg, rounds, &a[0], &w[0], &c[0], 0)
				case "loads":
					amxStepLoop(&cfg, rounds, &a[0], &w[0], &c[0], 1)
				default:
					amxStepLoop(&cfg, rounds, &a[0], &w[0], &c[0], 2)
				}
			}
			rate := 4 * 16384 * rounds * float64(b.N) / b.Elapsed().Seconds()
			if mode == "zero" {
				zero = rate
			}
			b.ReportMetric(rate/1e9, "GFLOP/s")
			if zero > 0 {
				b.ReportMetric(rate/zero, "of_zeroed")
			}
		})
	}
}

// BenchmarkAMXAfterIdle times a one-row product of a 384x768 weight on one
// goroutine after the core has spent gap spinning or running 512-bit FMAs,
// on the AMX tiles and, beside it, k-major: after a while without them,
// the tiles' first instructions stall longer than the FMAs' (ARCHITECTURE,
// "AMX tiles"). The weight stays in L2, so the time is the core's alone.
func BenchmarkAMXAfterIdle(b *testing.B) {
	if !hasAMX || amxEmulated {
		b.Skip("the AMX tiles do not run here")
	}
	const n, k = 384, 768
	r := rand.New(rand.NewPCG(31, 32))
	x, w := amxOperands(r, 1, n, k, 1)
	wa := make([]uint16, AMXLen(n, k))
	PackAMX(wa, w, n, k)
	wk := make([]uint16, KMajorLen(n, k))
	PackKMajor(wk, w, n, k)
	y := make([]float32, n)
	for _, fill := range []string{"spin", "fma512"} {
		for _, gap := range []time.Duration{0, time.Microsecond, 5 * time.Microsecond, 20 * time.Microsecond, 100 * time.Microsecond} {
			for _, layout := range []string{"amx", "kmajor"} {
				b.Run(fmt.Sprintf("%s/%s/gap=%v", fill, layout, gap), func(b *testing.B) {
					var spent time.Duration
					for range b.N {
						for start := time.Now(); time.Since(start) < gap; {
							if fill == "fma512" {
								fmaLoopAVX512(20)
							}
						}
						start := time.Now()
						if layout == "amx" {
							MatMulAMXSerial(y, x, wa, 1, n, k)
						} else {
							MatMulKMajorSerial(y, x, wk, 1, n, k)
						}
						spent += time.Since(start)
					}
					b.ReportMetric(float64(spent.Nanoseconds())/float64(b.N), "ns/product")
				})
			}
		}
	}
}

// BenchmarkPackAMX times PackAMX (the load-time layout under
// K3_KERNEL=amx, the narrow weights' tile copies) with whole tiles
// transposed in vector registers where the CPU has them, and element by
// element.
func BenchmarkPackAMX(b *testing.B) {
	for _, sh := range [][2]int{{64, 768}, {2304, 768}} {
		n, k := sh[0], sh[1]
		w := kmajWeights(rand.New(rand.NewPCG(5, 6)), n*k)
		wp := make([]uint16, AMXLen(n, k))
		for _, vec := range []bool{true, false} {
			b.Run(fmt.Sprintf("vector=%v/%dx%d", vec && hasAVX512BW, n, k), func(b *testing.B) {
				saved := hasAVX512BW
				defer func() { hasAVX512BW = saved }()
				hasAVX512BW = vec && saved
				for range b.N {
					PackAMX(wp, w, n, k)
				}
				b.ReportMetric(float64(2*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		}
	}
}
