package moe

import (
	"math/rand/v2"
	"testing"

	"k3/internal/compute"
	"k3/internal/cpu"
	"k3/internal/kernel"
)

// bf16Tensor makes a random bf16 weight cheaply (small random mantissas).
func bf16Tensor(b compute.Backend, r *rand.Rand, dims ...int) compute.Tensor {
	n := 1
	for _, d := range dims {
		n *= d
	}
	data := make([]byte, 2*n)
	for i := 0; i < n; i++ {
		h := uint16(0x3c00) | uint16(r.Uint32()&0x7f) | uint16(r.Uint32()&1)<<15
		data[2*i], data[2*i+1] = byte(h), byte(h>>8)
	}
	t, err := b.FromHost(compute.BF16, compute.BF16, data, dims...)
	if err != nil {
		panic(err)
	}
	return t
}

// BenchmarkDecode16of256 times one token through a MoE layer with 256
// experts (hidden 2304, expert width 1024: Kimi-Linear shapes), 16 active,
// bf16 weights (3.6 GB in all), and reports the time as a share of the
// bandwidth bound of the bytes it must read: the router and the 16 active
// experts.
func BenchmarkDecode16of256(b *testing.B) {
	const d, e, k, inter = 2304, 256, 16, 1024
	be := cpu.New(0)
	defer be.Close()
	r := rand.New(rand.NewPCG(5, 6))
	w := &Weights{Gate: bf16Tensor(be, r, e, d), Act: compute.Activation{Kind: compute.SwiGLU}}
	for i := 0; i < e; i++ {
		w.W1 = append(w.W1, bf16Tensor(be, r, inter, d))
		w.W3 = append(w.W3, bf16Tensor(be, r, inter, d))
		w.W2 = append(w.W2, bf16Tensor(be, r, d, inter))
	}
	layer, err := NewLayer(be, w, Router{TopK: k, NumGroups: 1, TopKGroup: 1, Renormalize: true, Scale: 1}, 1)
	if err != nil {
		b.Fatal(err)
	}
	// Different tokens route to different experts, so most steps read
	// experts that are not in cache.
	var xs []compute.Tensor
	for i := 0; i < 64; i++ {
		v := make([]float32, d)
		for j := range v {
			v[j] = float32(r.NormFloat64())
		}
		x, _ := be.Alloc(compute.F32, 1, d)
		be.Write(x, v)
		xs = append(xs, x)
	}
	out, _ := be.Alloc(compute.F32, 1, d)
	layer.Forward(xs[0], out, compute.Tensor{}, compute.Tensor{})
	allocs := testing.AllocsPerRun(3, func() { layer.Forward(xs[1], out, compute.Tensor{}, compute.Tensor{}) })
	bw := kernel.BandwidthNow()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := layer.Forward(xs[i%len(xs)], out, compute.Tensor{}, compute.Tensor{}); err != nil {
			b.Fatal(err)
		}
	}
	sec := b.Elapsed().Seconds() / float64(b.N)
	b.StopTimer()
	bw = max(bw, kernel.BandwidthNow()) // the probes next to the loop; the higher, so the share is a lower bound
	bytes := float64(2 * (e*d + k*3*inter*d))
	b.ReportMetric(sec*1e6, "us/token")
	b.ReportMetric(bytes/bw/sec, "of_bw_bound")
	b.ReportMetric(bytes/sec/1e9, "GB/s")
	b.ReportMetric(allocs, "allocs/token")
}

// BenchmarkPrefill64of4 times a 256-token chunk through a MoE layer of the
// 100M preset's shape (64 experts, top-4, width 384, expert width 64, bf16,
// SiTU) and reports the experts' products as GFLOP/s against the FMA peak
// measured in the same run.
func BenchmarkPrefill64of4(b *testing.B) {
	const d, e, k, inter, t = 384, 64, 4, 64, 256
	be := cpu.New(0)
	defer be.Close()
	r := rand.New(rand.NewPCG(7, 8))
	w := &Weights{Gate: bf16Tensor(be, r, e, d), Act: compute.Activation{Kind: compute.SiTU, Beta: 4, LinearBeta: 25}}
	for i := 0; i < e; i++ {
		w.W1 = append(w.W1, bf16Tensor(be, r, inter, d))
		w.W3 = append(w.W3, bf16Tensor(be, r, inter, d))
		w.W2 = append(w.W2, bf16Tensor(be, r, d, inter))
	}
	layer, err := NewLayer(be, w, Router{TopK: k, NumGroups: 1, TopKGroup: 1, Renormalize: true, Scale: 1}, t)
	if err != nil {
		b.Fatal(err)
	}
	v := make([]float32, t*d)
	for j := range v {
		v[j] = float32(r.NormFloat64())
	}
	x, _ := be.Alloc(compute.F32, t, d)
	be.Write(x, v)
	out, _ := be.Alloc(compute.F32, t, d)
	_, peak := kernel.Limits()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := layer.Forward(x, out, compute.Tensor{}, compute.Tensor{}); err != nil {
			b.Fatal(err)
		}
	}
	sec := b.Elapsed().Seconds() / float64(b.N)
	flops := float64(2 * t * k * 3 * inter * d)
	b.ReportMetric(sec*1e3, "ms/chunk")
	b.ReportMetric(flops/sec/1e9, "GFLOP/s")
	b.ReportMetric(flops/sec/peak, "of_peak")
}
