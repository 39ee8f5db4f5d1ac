package kda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"k3/compute"
	"k3/internal/cpu"
	"k3/internal/floatx"
	"k3/internal/kernel"
)

var limits = kernel.Limits

// prefillFLOPs is the per-token, per-head FLOP count of the reference
// (shared/reference/kda.md §4): 7d² token by token, 6d² + 10Cd + C²/3 chunked.
func prefillFLOPs(d, chunk int) float64 {
	if chunk == 0 {
		return 7 * float64(d*d)
	}
	return 6*float64(d*d) + 10*float64(chunk*d) + float64(chunk*chunk)/3
}

func benchPrefill(b *testing.B, chunk int) {
	const t, h, d = 4096, 16, 128
	be := cpu.New(0)
	defer be.Close()
	r := rand.New(rand.NewPCG(1, 1))
	mk := func(n int, s float64, dims ...int) compute.Tensor { return upload(b, be, randn(r, n, s), dims...) }
	a := compute.KDAArgs{
		Q: mk(t*h*d, 1, t, h, d), K: mk(t*h*d, 1, t, h, d), V: mk(t*h*d, 1, t, h, d), G: mk(t*h*d, 1, t, h, d),
		Beta: mk(t*h, 1, t, h), ALog: mk(h, 0.5, h), DTBias: mk(h*d, 0.5, h*d), Gate: compute.GateLowerBound, LowerBound: -5,
		Preprocess: true, Scale: float32(1 / math.Sqrt(d)), ChunkSize: chunk, State: mk(h*d*d, 0, 1, h, d, d), Out: mk(t*h*d, 0, t, h, d),
	}
	_, peak := limits()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := be.KDAChunk(&a); err != nil {
			b.Fatal(err)
		}
	}
	sec := b.Elapsed().Seconds() / float64(b.N)
	flops := prefillFLOPs(d, chunk) * t * h / sec
	b.ReportMetric(t/sec, "tokens/s")
	b.ReportMetric(flops/1e9, "GFLOP/s")
	if peak > 0 {
		b.ReportMetric(flops/peak, "of_peak")
	}
}

func BenchmarkPrefillChunk64(b *testing.B)   { benchPrefill(b, 64) }
func BenchmarkPrefillChunk16(b *testing.B)   { benchPrefill(b, 16) }
func BenchmarkPrefillRecurrent(b *testing.B) { benchPrefill(b, 0) }

// BenchmarkDecodeStep times one fused decode step of a Kimi-Linear-shaped
// layer (hidden 2304, 32 heads of 128, low-rank gates, bf16 weights) for one
// and for eight sequences, rotating over enough layers that weights come
// from DRAM, and reports the step as a share of its bandwidth bound: bf16
// weights read once, each sequence's fp32 state read and written once.
func BenchmarkDecodeStep(b *testing.B) {
	for _, bsz := range []int{1, 8} {
		b.Run(fmt.Sprintf("batch=%d", bsz), func(b *testing.B) { benchDecodeStep(b, bsz) })
	}
}

func benchDecodeStep(b *testing.B, bsz int) {
	const hidden, h, d, w = 2304, 32, 128, 4
	hd := h * d
	be := cpu.New(0)
	defer be.Close()
	r := rand.New(rand.NewPCG(2, 2))
	cfg := Config{Hidden: hidden, NumHeads: h, HeadDim: d, ConvKernel: w, LowerBound: 0, Eps: 1e-5}
	shapes := map[string][]int{
		"q_proj.weight": {hd, hidden}, "k_proj.weight": {hd, hidden}, "v_proj.weight": {hd, hidden},
		"q_conv1d.weight": {hd, 1, w}, "k_conv1d.weight": {hd, 1, w}, "v_conv1d.weight": {hd, 1, w},
		"f_a_proj.weight": {d, hidden}, "f_b_proj.weight": {hd, d}, "b_proj.weight": {h, hidden},
		"g_a_proj.weight": {d, hidden}, "g_b_proj.weight": {hd, d}, "o_norm.weight": {d},
		"o_proj.weight": {hidden, hd}, "A_log": {h}, "dt_bias": {hd},
	}
	var weightBytes int64
	src := func(name string) (compute.DType, []int, []byte, error) {
		shape := shapes[name]
		n := 1
		for _, s := range shape {
			n *= s
		}
		data := make([]byte, 2*n)
		for i := 0; i < n; i++ {
			h := floatx.BF16(float32(r.NormFloat64() * 0.02))
			data[2*i], data[2*i+1] = byte(h), byte(h>>8)
		}
		if len(shape) == 2 && name != "o_norm.weight" {
			weightBytes += int64(2 * n)
		}
		return compute.BF16, shape, data, nil
	}
	const copies = 4 // 4 × ~78 MB of weights: well past the last-level cache
	var layers []*Layer
	var states []*State
	for c := 0; c < copies; c++ {
		kw, err := LoadWeights(be, cfg, src)
		if err != nil {
			b.Fatal(err)
		}
		l, err := NewLayer(be, cfg, kw, bsz)
		if err != nil {
			b.Fatal(err)
		}
		st, err := NewState(be, cfg, bsz)
		if err != nil {
			b.Fatal(err)
		}
		layers, states = append(layers, l), append(states, st)
	}
	weightBytes /= copies
	stateBytes := int64(2*h*d*d*4) * int64(bsz)
	x := upload(b, be, randn(r, bsz*hidden, 1), bsz, hidden)
	y, _ := be.Alloc(compute.F32, bsz, hidden)
	rows := make([]int32, bsz+1)
	for i := range rows {
		rows[i] = int32(i)
	}
	seqs := make([]*Seqs, copies)
	for c, st := range states {
		seqs[c] = &Seqs{Cu: rows, Exact: bsz}
		for i := range bsz {
			seqs[c].States = append(seqs[c].States, st.Seq(i))
		}
	}
	for c := range layers { // warm the scratch pools
		layers[c].Forward(x, seqs[c], y)
	}
	allocs := testing.AllocsPerRun(5, func() { layers[0].Forward(x, seqs[0], y) })
	bw := kernel.BandwidthNow()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := layers[i%copies].Forward(x, seqs[i%copies], y); err != nil {
			b.Fatal(err)
		}
	}
	sec := b.Elapsed().Seconds() / float64(b.N)
	b.StopTimer()
	bw = max(bw, kernel.BandwidthNow()) // the probes next to the loop; the higher, so the share is a lower bound
	bound := float64(weightBytes+stateBytes) / bw
	b.ReportMetric(sec*1e6, "us/step")
	b.ReportMetric(sec*1e6/float64(bsz), "us/token")
	b.ReportMetric(bound/sec, "of_bw_bound")
	b.ReportMetric(float64(weightBytes+stateBytes)/sec/1e9, "GB/s")
	b.ReportMetric(allocs, "allocs/step")
}
