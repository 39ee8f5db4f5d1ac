package attnres

import (
	"testing"
	"time"

	"k3/compute"
	"k3/internal/cpu"
	"k3/kda"
)

// cheapBF16 fills a bf16 tensor with small pseudo-random values fast
// enough for a 880 MB layer.
func cheapBF16(b compute.Backend, seed uint32, dims ...int) (compute.DType, []int, []byte, error) {
	n := 1
	for _, d := range dims {
		n *= d
	}
	data := make([]byte, 2*n)
	x := seed | 1
	for i := 0; i < n; i++ {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		h := uint16(0x3c00) | uint16(x&0x7f) | uint16(x>>31)<<15
		data[2*i], data[2*i+1] = byte(h), byte(h>>8)
	}
	return compute.BF16, dims, data, nil
}

// BenchmarkDecodeOverhead compares AttnRes's cost per decoder layer at
// decode (hidden 7168, 9 sources: the K3 shape; two-phase path with the
// block's 24 queries prepared once per 12 layers plus two updates per layer)
// with one K3-shaped KDA attention sublayer decode step (96 heads × 128,
// bf16 weights). The paper reports an overhead under 2% of the whole
// layer; this compares against the attention half only, so the true share
// is smaller still.
func BenchmarkDecodeOverhead(b *testing.B) {
	const d, h, hd, w, sources, block = 7168, 96, 128, 4, 9, 12
	be := cpu.New(0)
	defer be.Close()
	cfg := kda.Config{Hidden: d, NumHeads: h, HeadDim: hd, ConvKernel: w, FullRankGate: true, LowerBound: -5, Eps: 1e-5}
	shapes := map[string][]int{
		"q_proj.weight": {h * hd, d}, "k_proj.weight": {h * hd, d}, "v_proj.weight": {h * hd, d},
		"q_conv1d.weight": {h * hd, w}, "k_conv1d.weight": {h * hd, w}, "v_conv1d.weight": {h * hd, w},
		"f_a_proj.weight": {hd, d}, "f_b_proj.weight": {h * hd, hd}, "b_proj.weight": {h, d},
		"g_proj.weight": {h * hd, d}, "o_norm.weight": {hd}, "o_proj.weight": {d, h * hd}, "A_log": {h}, "dt_bias": {h * hd},
	}
	seed := uint32(1)
	src := func(name string) (compute.DType, []int, []byte, error) {
		seed++
		return cheapBF16(be, seed, shapes[name]...)
	}
	kw, err := kda.LoadWeights(be, cfg, src)
	if err != nil {
		b.Fatal(err)
	}
	layer, err := kda.NewLayer(be, cfg, kw, 1)
	if err != nil {
		b.Fatal(err)
	}
	st, err := kda.NewState(be, cfg, 1)
	if err != nil {
		b.Fatal(err)
	}
	one := &kda.Seqs{Cu: []int32{0, 1}, States: []*kda.State{st}, Exact: 1}
	x, _ := be.Alloc(compute.F32, 1, d)
	y, _ := be.Alloc(compute.F32, 1, d)

	// AttnRes state for one token: 8 committed blocks plus the partial.
	rnd := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i%17)/17 - 0.5
		}
		return v
	}
	up := func(v []float32, dims ...int) compute.Tensor {
		t, _ := be.Alloc(compute.F32, dims...)
		be.Write(t, v)
		return t
	}
	blocks := make([]compute.Tensor, sources-1)
	for i := range blocks {
		blocks[i] = up(rnd(d), 1, d)
	}
	queries := up(rnd(2*block*d), 2*block, d)
	num, _ := be.Alloc(compute.F32, 2*block, 1, d)
	mx, _ := be.Alloc(compute.F32, 2*block, 1)
	sum, _ := be.Alloc(compute.F32, 2*block, 1)
	partial := up(rnd(d), 1, d)
	delta := up(rnd(d), 1, d)
	hout, _ := be.Alloc(compute.F32, 1, d)
	prep := compute.AttnResPrepareArgs{Blocks: blocks, Queries: queries, Eps: 1e-5, Num: num, Max: mx, Sum: sum}
	upd := compute.AttnResUpdateArgs{Partial: partial, HasPartial: true, Delta: delta, Query: queries.Rows(0, 1).Reshape(d), Eps: 1e-5,
		Num: num.Rows(0, 1).Reshape(1, d), Max: mx.Rows(0, 1).Reshape(1), Sum: sum.Rows(0, 1).Reshape(1), H: hout}

	layer.Forward(x, one, y)
	b.ResetTimer()
	var tLayer, tRes time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if err := layer.Forward(x, one, y); err != nil {
			b.Fatal(err)
		}
		tLayer += time.Since(start)
		start = time.Now()
		// One layer's share: 1/12 of the block's prepare, two updates.
		const preps = 12
		for r := 0; r < preps; r++ {
			if err := be.AttnResPrepare(&prep); err != nil {
				b.Fatal(err)
			}
			for s := 0; s < 2*block; s++ {
				if err := be.AttnResUpdate(&upd); err != nil {
					b.Fatal(err)
				}
			}
		}
		tRes += time.Since(start) / (preps * block)
	}
	b.ReportMetric(float64(tLayer.Microseconds())/float64(b.N), "us/kda_layer")
	b.ReportMetric(float64(tRes.Nanoseconds())/1e3/float64(b.N), "us/attnres_per_layer")
	b.ReportMetric(float64(tRes)/float64(tLayer), "attnres_share")
}
