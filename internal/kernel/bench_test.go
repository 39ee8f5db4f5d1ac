package kernel

import (
	"math/rand/v2"
	"testing"
)

func streamBandwidth() float64 { bw, _ := Limits(); return bw }

func BenchmarkStreamRead(b *testing.B) {
	for i := 0; i < b.N; i++ {
		_ = streamBandwidth()
	}
	b.ReportMetric(streamBandwidth()/1e9, "GB/s")
}

// benchMatVec times y = W x for weights rotated over enough matrices to
// defeat the cache, and reports GB/s and the ratio to the bandwidth probed
// right before and after (the higher of a read pass and a STREAM triad).
func benchMatVec(b *testing.B, rows, cols int, bf16w bool) {
	p := NewPool(0)
	defer p.Close()
	elem := 4
	if bf16w {
		elem = 2
	}
	copies := max(2, (768<<20)/(rows*cols*elem))
	x := make([]float32, cols)
	y := make([]float32, rows)
	for i := range x {
		x[i] = rand.Float32()
	}
	var wf [][]float32
	var wb [][]uint16
	for c := 0; c < copies; c++ {
		if bf16w {
			w := make([]uint16, rows*cols)
			for i := range w {
				w[i] = 0x3f80 + uint16(i&63)
			}
			wb = append(wb, w)
		} else {
			w := make([]float32, rows*cols)
			for i := range w {
				w[i] = float32(i&63) / 64
			}
			wf = append(wf, w)
		}
	}
	bw := BandwidthNow()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if bf16w {
			p.MatMulBF16(y, x, wb[i%copies], 1, rows, cols)
		} else {
			p.MatMul(y, x, wf[i%copies], 1, rows, cols)
		}
	}
	bytes := float64(rows * cols * elem)
	gbs := bytes * float64(b.N) / b.Elapsed().Seconds()
	b.StopTimer()
	bw = max(bw, BandwidthNow()) // the probes next to the loop; the higher, so the share is a lower bound
	b.ReportMetric(gbs/1e9, "GB/s")
	b.ReportMetric(gbs/bw, "of_bandwidth")
	b.ReportMetric(bw/1e9, "bandwidth_GB/s")
}

func BenchmarkMatVecF32_4096x4096(b *testing.B)  { benchMatVec(b, 4096, 4096, false) }
func BenchmarkMatVecF32_2048x8192(b *testing.B)  { benchMatVec(b, 2048, 8192, false) }
func BenchmarkMatVecBF16_4096x4096(b *testing.B) { benchMatVec(b, 4096, 4096, true) }
func BenchmarkMatVecBF16_2048x8192(b *testing.B) { benchMatVec(b, 2048, 8192, true) }

// Small decode products (a 100M model's shared expert): per-call costs and
// prefetch distance matter more than the inner loop.
func BenchmarkMatVecBF16_768x384(b *testing.B)  { benchMatVec(b, 768, 384, true) }
func BenchmarkMatVecBF16_384x768(b *testing.B)  { benchMatVec(b, 384, 768, true) }
func BenchmarkMatVecBF16_2304x768(b *testing.B) { benchMatVec(b, 2304, 768, true) }

// benchMatMul times C = A·Bᵀ (the Linear layout) and reports GFLOP/s and
// the share of the FMA peak measured in the same run.
func benchMatMul(b *testing.B, m, n, k int, bf16w bool) {
	_, peak := Limits()
	p := NewPool(0)
	defer p.Close()
	x := make([]float32, m*k)
	for i := range x {
		x[i] = float32(i%13) / 13
	}
	y := make([]float32, m*n)
	w := make([]float32, n*k)
	wb := make([]uint16, n*k)
	for i := range w {
		w[i] = float32(i%7) / 7
		wb[i] = 0x3f80 + uint16(i&63)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if bf16w {
			p.MatMulBF16(y, x, wb, m, n, k)
		} else {
			p.MatMul(y, x, w, m, n, k)
		}
	}
	flops := 2 * float64(m) * float64(n) * float64(k) * float64(b.N) / b.Elapsed().Seconds()
	b.ReportMetric(flops/1e9, "GFLOP/s")
	if peak > 0 {
		b.ReportMetric(flops/peak, "of_peak")
	}
}

func BenchmarkMatMulF32_256x2048x2048(b *testing.B)  { benchMatMul(b, 256, 2048, 2048, false) }
func BenchmarkMatMulF32_1024x1024x1024(b *testing.B) { benchMatMul(b, 1024, 1024, 1024, false) }
func BenchmarkMatMulBF16_256x2048x2048(b *testing.B) { benchMatMul(b, 256, 2048, 2048, true) }

// BenchmarkVectorExp times the vector exponential and the kernels built on
// it over 4,096 floats that stay in L1, in ns per sixteen floats (compare
// builds side by side: the figure is the arithmetic's alone).
func BenchmarkVectorExp(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	const n = 4096
	x, y := make([]float32, n), make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * 4)
	}
	for _, k := range []struct {
		name string
		f    func()
	}{
		{"exp", func() { copy(y, x); ExpSlice(y) }},
		{"sigmoid", func() { copy(y, x); SigmoidSlice(y) }},
		{"silu", func() { copy(y, x); SiLUInPlace(y) }},
		{"situ", func() { SiTU(y, x, x, 4, 25) }},
		{"sigmoid-mul", func() { SigmoidMul(y, x, x) }},
	} {
		b.Run(k.name, func(b *testing.B) {
			for range b.N {
				k.f()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/(n/16), "ns/vector")
		})
	}
}
