package kernel

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// benchBatchBF16 times a decode batch's product, m rows of x against bf16
// weights [n, k], warm (one matrix, cache-resident after the first call)
// or cold (rotated over enough copies to defeat the cache), and reports
// GFLOP/s, the share of the FMA peak and, cold, the share of the
// bandwidth probed right before and after the loop.
func benchBatchBF16(b *testing.B, m, n, k int, cold bool) { benchBF16Layout(b, m, n, k, cold, stored) }

// benchLayout is a bf16 weight layout a benchmark runs.
type benchLayout int

const (
	stored benchLayout = iota // [n, k]: dot-form tiles, packed GEMM
	kmajor                    // MatMulKMajor
	kpairs                    // MatMulKPairs (x rounded to bf16)
)

// benchBF16Layout is benchBatchBF16 with the weights in the given layout.
func benchBF16Layout(b *testing.B, m, n, k int, cold bool, layout benchLayout) {
	_, peak := Limits()
	p := NewPool(0)
	defer p.Close()
	copies := 1
	if cold {
		copies = max(2, (768<<20)/(n*k*2))
	}
	x := make([]float32, m*k)
	for i := range x {
		x[i] = float32(i%13) / 13
	}
	y := make([]float32, m*n)
	ws := make([][]uint16, copies)
	for c := range ws {
		ws[c] = make([]uint16, n*k)
		for i := range ws[c] {
			ws[c][i] = 0x3f80 + uint16((i+c)&63)
		}
		switch layout {
		case kmajor:
			wp := make([]uint16, KMajorLen(n, k))
			PackKMajor(wp, ws[c], n, k)
			ws[c] = wp
		case kpairs:
			wp := make([]uint16, KPairLen(n, k))
			PackKPairs(wp, ws[c], n, k)
			ws[c] = wp
		}
	}
	bw := 0.0
	if cold {
		bw = BandwidthNow()
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		switch layout {
		case kmajor:
			p.MatMulKMajor(y, x, ws[i%copies], m, n, k)
		case kpairs:
			p.MatMulKPairs(y, x, ws[i%copies], m, n, k)
		default:
			p.MatMulBF16(y, x, ws[i%copies], m, n, k)
		}
	}
	sec := b.Elapsed().Seconds()
	b.StopTimer()
	flops := 2 * float64(m*n*k) * float64(b.N) / sec
	b.ReportMetric(flops/1e9, "GFLOP/s")
	b.ReportMetric(flops/peak, "of_peak")
	if cold {
		bw = max(bw, BandwidthNow())
		b.ReportMetric(float64(n*k*2)*float64(b.N)/sec/bw, "of_bandwidth")
	}
}

// benchX returns m rows of k floats of a fixed pattern.
func benchX(m, k int) []float32 {
	x := make([]float32, m*k)
	for i := range x {
		x[i] = float32(i%13) / 13
	}
	return x
}

// alternateMedians calls run(mode) for each of n modes in turn for as
// long as b loops, so that a shared host's drift hits every mode alike,
// and returns each mode's median time.
func alternateMedians(b *testing.B, n int, run func(mode int)) []float64 {
	times := make([][]float64, n)
	b.ResetTimer()
	for b.Loop() {
		for mode := range n {
			start := time.Now()
			run(mode)
			times[mode] = append(times[mode], float64(time.Since(start)))
		}
	}
	b.StopTimer()
	med := make([]float64, n)
	for mode, t := range times {
		slices.Sort(t)
		med[mode] = t[len(t)/2]
	}
	return med
}

// BenchmarkKMajorVsDot runs the products of bf16 weights in their own
// layout (dot-form tiles, the packed GEMM from PackedMinRows rows) and
// k-major (PackKMajor) side by side, cold, at a decode row, a decode
// batch, a scheduler pass and a prefill chunk; 64x768 is a router's
// shape, narrower than KMajorMinN.
func BenchmarkKMajorVsDot(b *testing.B) {
	for _, sh := range [][2]int{{2304, 768}, {768, 2048}, {64, 768}} {
		for _, m := range []int{1, 2, 3, 4, 8, 24, 512} {
			for _, layout := range []benchLayout{stored, kmajor} {
				name := fmt.Sprintf("n%d/k%d/m%d/%s", sh[0], sh[1], m, []string{"dot", "kmajor"}[layout])
				b.Run(name, func(b *testing.B) { benchBF16Layout(b, m, sh[0], sh[1], true, layout) })
			}
		}
	}
}

// BenchmarkKPairsVsKMajor runs the fast product over pair-interleaved
// weights (x rounded to bf16, VDPBF16PS) beside the exact k-major one,
// cold, at a decode row, a decode batch and a prefill chunk.
func BenchmarkKPairsVsKMajor(b *testing.B) {
	for _, sh := range [][2]int{{2304, 768}, {768, 2048}, {768, 768}, {384, 768}} {
		for _, m := range []int{1, 8, 256} {
			for _, layout := range []benchLayout{kmajor, kpairs} {
				name := fmt.Sprintf("n%d/k%d/m%d/%s", sh[0], sh[1], m, []string{"", "kmajor", "kpairs"}[layout])
				b.Run(name, func(b *testing.B) { benchBF16Layout(b, m, sh[0], sh[1], true, layout) })
			}
		}
	}
}

// BenchmarkKPair8Ahead runs the fast product's eight-row pair tile with
// its weight stream prefetched 1,536 bytes ahead and not at all
// (kpair8Ahead's two answers), cold at a decode batch (weights rotated
// over 512 MB) and over cache-resident weights at a prefill chunk, in
// alternating batches, and reports the median time with the prefetch
// over that without it (above 1: the prefetch costs).
func BenchmarkKPair8Ahead(b *testing.B) {
	if !hasBF16Dot {
		b.Skip("no VDPBF16PS")
	}
	p := NewPool(0)
	defer p.Close()
	defer func() { kpair8AheadBytes = -1 }()
	for _, sh := range [][3]int{{8, 384, 768}, {8, 2304, 768}, {8, 768, 2048}, {256, 2304, 768}, {256, 768, 2048}} {
		m, n, k := sh[0], sh[1], sh[2]
		b.Run(fmt.Sprintf("%dx%dx%d", m, n, k), func(b *testing.B) {
			copies, calls := max(2, (512<<20)/(n*k*2)), 20
			if m > 8 {
				copies, calls = 1, 2
			}
			ws := make([][]uint16, copies)
			for c := range ws {
				w := make([]uint16, n*k)
				for i := range w {
					w[i] = 0x3f80 + uint16((i+c)&63)
				}
				ws[c] = make([]uint16, KPairLen(n, k))
				PackKPairs(ws[c], w, n, k)
			}
			x, y := benchX(m, k), make([]float32, m*n)
			it := 0
			med := alternateMedians(b, 2, func(mode int) {
				kpair8AheadBytes = []int{1536, 0}[mode]
				for range calls {
					p.MatMulKPairs(y, x, ws[it%copies], m, n, k)
					it++
				}
			})
			b.ReportMetric(med[0]/med[1], "ahead/none")
		})
	}
}

func BenchmarkBatch8BF16_2304x768Warm(b *testing.B) { benchBatchBF16(b, 8, 2304, 768, false) }
func BenchmarkBatch8BF16_2304x768Cold(b *testing.B) { benchBatchBF16(b, 8, 2304, 768, true) }

func BenchmarkPrefillBF16_512x2304x768(b *testing.B) { benchMatMul(b, 512, 2304, 768, true) }
func BenchmarkPrefillF32_512x2304x768(b *testing.B)  { benchMatMul(b, 512, 2304, 768, false) }

// A real K3 width: eight x rows of 7168 floats outgrow L1.
func BenchmarkBatch8BF16_2048x7168Cold(b *testing.B) { benchBatchBF16(b, 8, 2048, 7168, true) }
func BenchmarkBatch8BF16_768x2048Cold(b *testing.B)  { benchBatchBF16(b, 8, 768, 2048, true) }

// BenchmarkTiles4x3 runs the four-by-three tiles against the tiles they
// replaced (rows8 and the 2x4 decode tile) on one product shape, cold
// (weights rotated over 512 MB), in alternating batches of 20 so that a
// shared host's drift hits both alike, and reports the old tiles' median
// time over the new ones' (above 1: the new tiles are faster).
func BenchmarkTiles4x3(b *testing.B) {
	if !useAVX2 || useAVX512 {
		b.Skip("the four-by-three tiles run on AVX2 CPUs without AVX-512VL")
	}
	p := NewPool(0)
	defer p.Close()
	for _, sh := range [][3]int{{5, 2304, 768}, {6, 2304, 768}, {7, 2304, 768}, {8, 2304, 768}, {9, 2304, 768}, {10, 2304, 768}, {11, 2304, 768}, {13, 2304, 768}, {5, 768, 2048}, {7, 768, 2048}, {18, 2304, 768}, {40, 2304, 768}, {6, 768, 2048}, {8, 768, 2048}, {18, 768, 2048}} {
		m, n, k := sh[0], sh[1], sh[2]
		b.Run(fmt.Sprintf("bf16_%dx%dx%d", m, n, k), func(b *testing.B) {
			copies := max(2, (512<<20)/(n*k*2))
			ws := make([][]uint16, copies)
			for c := range ws {
				ws[c] = make([]uint16, n*k)
				for i := range ws[c] {
					ws[c][i] = 0x3f80 + uint16((i+c)&63)
				}
			}
			x, y := benchX(m, k), make([]float32, m*n)
			it := 0
			med := alternateMedians(b, 2, func(mode int) {
				tiles43Off = mode == 1
				for range 20 {
					p.MatMulBF16(y, x, ws[it%copies], m, n, k)
					it++
				}
			})
			tiles43Off = false
			b.ReportMetric(med[1]/med[0], "old/new")
		})
	}
}

// BenchmarkTiles4x3F32 is BenchmarkTiles4x3 for float32 weights that stay
// in cache, as attention's score and value blocks use them (eight query
// rows against a block of keys, all rows of a chunk against them).
func BenchmarkTiles4x3F32(b *testing.B) {
	if !useAVX2 || useAVX512 {
		b.Skip("the four-by-three tiles run on AVX2 CPUs without AVX-512VL")
	}
	for _, sh := range [][3]int{{8, 64, 96}, {8, 64, 288}, {32, 64, 288}, {8, 96, 64}} {
		m, n, k := sh[0], sh[1], sh[2]
		b.Run(fmt.Sprintf("f32_%dx%dx%d", m, n, k), func(b *testing.B) {
			w, x, y := make([]float32, n*k), benchX(m, k), make([]float32, m*n)
			for i := range w {
				w[i] = float32(i%7) / 7
			}
			med := alternateMedians(b, 2, func(mode int) {
				tiles43Off = mode == 1
				for range 200 {
					MatMulSerial(y, x, w, m, n, k)
				}
			})
			tiles43Off = false
			b.ReportMetric(med[1]/med[0], "old/new")
		})
	}
}

// BenchmarkTile2x8Wide runs decode-batch products (8 and 16 rows, bf16
// weights, warm and cold; f32 weights warm, among them attention's score
// block shape 8x512x64) on the zmm 2x8 tiles and on the 256-bit ones side
// by side; both give the same bits.
func BenchmarkTile2x8Wide(b *testing.B) {
	if !hasZMM {
		b.Skip("no 512-bit tiles on this CPU or path")
	}
	defer func(v int) { dotTileBits = v }(dotTileBits)
	for _, s := range []struct {
		m, n, k int
		cold    bool
	}{{8, 2304, 768, false}, {8, 2304, 768, true}, {16, 2304, 768, false}, {8, 768, 2048, true}, {16, 768, 384, false}} {
		for _, bits := range []int{512, 256} {
			name := fmt.Sprintf("m%d/n%d/k%d/cold=%v/%d-bit", s.m, s.n, s.k, s.cold, bits)
			b.Run(name, func(b *testing.B) {
				dotTileBits = bits
				benchBatchBF16(b, s.m, s.n, s.k, s.cold)
			})
		}
	}
	p := NewPool(0)
	defer p.Close()
	for _, s := range [][3]int{{8, 2304, 768}, {8, 512, 64}, {16, 768, 384}} {
		m, n, k := s[0], s[1], s[2]
		x, w, y := make([]float32, m*k), make([]float32, n*k), make([]float32, m*n)
		for i := range w {
			w[i] = float32(i%7) / 7
		}
		for _, bits := range []int{512, 256} {
			b.Run(fmt.Sprintf("f32/m%d/n%d/k%d/%d-bit", m, n, k, bits), func(b *testing.B) {
				dotTileBits = bits
				for b.Loop() {
					p.MatMul(y, x, w, m, n, k)
				}
				b.ReportMetric(2*float64(m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkOneShare runs one-row products, cold (weights rotated over
// 768 MB), with RunShares' one range a goroutine and with Run's pieces,
// in alternating batches, and reports the median time of each and
// shares/pieces (below 1: one range a goroutine is faster): the dot-form
// tiles' narrow weights and the k-major few-row tile's.
func BenchmarkOneShare(b *testing.B) {
	p := NewPool(0)
	defer p.Close()
	defer func() { oneShare = true }()
	for _, c := range []struct {
		n, k   int
		layout benchLayout
		f32    bool // float32 weights (MatMul) instead of bf16
	}{{64, 768, stored, false}, {256, 768, stored, false}, {768, 64, kmajor, false}, {768, 384, kmajor, false}, {2304, 768, kmajor, false},
		{64, 768, stored, true}, {256, 768, stored, true}, {768, 768, stored, true}} {
		name := []string{"dot", "kmajor"}[c.layout]
		if c.f32 {
			name = "f32"
		}
		b.Run(fmt.Sprintf("n%d/k%d/%s", c.n, c.k, name), func(b *testing.B) {
			n, k := c.n, c.k
			size := n * k
			if c.layout == kmajor {
				size = KMajorLen(n, k)
			}
			elem := 2
			if c.f32 {
				elem = 4
			}
			copies := max(2, (768<<20)/(elem*size))
			ws := make([][]uint16, copies)
			var wf [][]float32
			for i := range ws {
				w := make([]uint16, n*k)
				for e := range w {
					w[e] = 0x3f80 + uint16((e+i)&63)
				}
				switch {
				case c.f32:
					f := make([]float32, n*k)
					for e, v := range w {
						f[e] = float32(v&63) / 64
					}
					wf = append(wf, f)
				case c.layout == kmajor:
					ws[i] = make([]uint16, size)
					PackKMajor(ws[i], w, n, k)
				default:
					ws[i] = w
				}
			}
			x, y := benchX(1, k), make([]float32, n)
			const calls = 20
			it := 0
			med := alternateMedians(b, 2, func(mode int) {
				oneShare = mode == 0
				for range calls {
					switch {
					case c.f32:
						p.MatMul(y, x, wf[it%copies], 1, n, k)
					case c.layout == kmajor:
						p.MatMulKMajor(y, x, ws[it%copies], 1, n, k)
					default:
						p.MatMulBF16(y, x, ws[it%copies], 1, n, k)
					}
					it++
				}
			})
			b.ReportMetric(med[0]/calls/1e3, "µs_shares")
			b.ReportMetric(med[1]/calls/1e3, "µs_pieces")
			b.ReportMetric(med[0]/med[1], "shares/pieces")
		})
	}
}
