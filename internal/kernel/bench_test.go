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
// defeat the cache, and reports GB/s and the ratio to the triad bandwidth.
func benchMatVec(b *testing.B, rows, cols int, bf16w bool) {
	bw := streamBandwidth()
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
	b.ReportMetric(gbs/1e9, "GB/s")
	b.ReportMetric(gbs/bw, "of_stream")
	b.ReportMetric(bw/1e9, "stream_GB/s")
}

func BenchmarkMatVecF32_4096x4096(b *testing.B)  { benchMatVec(b, 4096, 4096, false) }
func BenchmarkMatVecF32_2048x8192(b *testing.B)  { benchMatVec(b, 2048, 8192, false) }
func BenchmarkMatVecBF16_4096x4096(b *testing.B) { benchMatVec(b, 4096, 4096, true) }
func BenchmarkMatVecBF16_2048x8192(b *testing.B) { benchMatVec(b, 2048, 8192, true) }
