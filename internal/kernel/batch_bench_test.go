package kernel

import "testing"

// benchBatchBF16 times a decode batch's product, m rows of x against bf16
// weights [n, k], warm (one matrix, cache-resident after the first call)
// or cold (rotated over enough copies to defeat the cache), and reports
// GFLOP/s, the share of the FMA peak and, cold, the share of the
// bandwidth probed right before and after the loop.
func benchBatchBF16(b *testing.B, m, n, k int, cold bool) {
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
	}
	bw := 0.0
	if cold {
		bw = BandwidthNow()
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p.MatMulBF16(y, x, ws[i%copies], m, n, k)
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

func BenchmarkBatch8BF16_2304x768Warm(b *testing.B) { benchBatchBF16(b, 8, 2304, 768, false) }
func BenchmarkBatch8BF16_2304x768Cold(b *testing.B) { benchBatchBF16(b, 8, 2304, 768, true) }

func BenchmarkPrefillBF16_512x2304x768(b *testing.B) { benchMatMul(b, 512, 2304, 768, true) }
func BenchmarkPrefillF32_512x2304x768(b *testing.B)  { benchMatMul(b, 512, 2304, 768, false) }

// A real K3 width: eight x rows of 7168 floats outgrow L1.
func BenchmarkBatch8BF16_2048x7168Cold(b *testing.B) { benchBatchBF16(b, 8, 2048, 7168, true) }
func BenchmarkBatch8BF16_768x2048Cold(b *testing.B)  { benchBatchBF16(b, 8, 768, 2048, true) }
