package moe

import (
	"math/rand/v2"
	"testing"

	"k3/compute"
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

// BenchmarkExpertsBatch8 times the expert products of a decode batch at the
// 100M preset's shape (64 experts of width 64 on a latent of 384, bf16,
// SiTU): 8 tokens, each routed to 4 random experts, over 24 layers' worth
// of experts (221 MB) in turn so that the weights come from memory as in a
// model step. It reports the bytes of the distinct experts read per second
// and as a share of the bandwidth probed right before and after the loop.
func BenchmarkExpertsBatch8(b *testing.B) {
	const din, e, k, inter, t, layers = 384, 64, 4, 64, 8, 24
	be := cpu.New(0)
	defer be.Close()
	r := rand.New(rand.NewPCG(9, 10))
	type layer struct{ w1, w3, w2 []compute.Tensor }
	ls := make([]layer, layers)
	for l := range ls {
		for i := 0; i < e; i++ {
			ls[l].w1 = append(ls[l].w1, bf16Tensor(be, r, inter, din))
			ls[l].w3 = append(ls[l].w3, bf16Tensor(be, r, inter, din))
			ls[l].w2 = append(ls[l].w2, bf16Tensor(be, r, din, inter))
		}
	}
	// Routings: distinct experts per token, as the router picks them.
	const routings = 64
	idx := make([][]int32, routings)
	distinct := 0
	for i := range idx {
		seen := map[int32]bool{}
		for len(idx[i]) < t*k {
			ex := int32(r.IntN(e))
			tok := len(idx[i]) / k
			dup := false
			for _, p := range idx[i][tok*k:] {
				dup = dup || p == ex
			}
			if !dup {
				idx[i] = append(idx[i], ex)
				seen[ex] = true
			}
		}
		distinct += len(seen)
	}
	x, _ := be.Alloc(compute.F32, t, din)
	xv := make([]float32, t*din)
	for i := range xv {
		xv[i] = float32(r.NormFloat64())
	}
	be.Write(x, xv)
	out, _ := be.Alloc(compute.F32, t, din)
	wts, _ := be.Alloc(compute.F32, t, k)
	wv := make([]float32, t*k)
	for i := range wv {
		wv[i] = 0.25
	}
	be.Write(wts, wv)
	ids := make([]compute.Tensor, routings)
	for i := range ids {
		ids[i], _ = be.Alloc(compute.I32, t, k)
		be.Write(ids[i], idx[i])
	}
	args := compute.ExpertArgs{X: x, Weights: wts, Out: out, Act: compute.Activation{Kind: compute.SiTU, Beta: 4, LinearBeta: 25}}
	run := func(i int) error {
		l := ls[i%layers]
		args.Indices, args.W1, args.W3, args.W2 = ids[i%routings], l.w1, l.w3, l.w2
		return be.MoEExperts(&args)
	}
	if err := run(0); err != nil {
		b.Fatal(err)
	}
	bw := kernel.BandwidthNow()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := run(i); err != nil {
			b.Fatal(err)
		}
	}
	sec := b.Elapsed().Seconds() / float64(b.N)
	b.StopTimer()
	bw = max(bw, kernel.BandwidthNow())
	bytes := float64(distinct) / routings * 3 * inter * din * 2
	b.ReportMetric(sec*1e6, "us/call")
	b.ReportMetric(bytes/sec/1e9, "GB/s")
	b.ReportMetric(bytes/bw/sec, "of_bw_bound")
}
