package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/floatx"
	"k3/internal/kernel"
)

// TestExpertsOnTiles: an MoEExperts call of amxMinRows tokens or more (a
// prefill chunk) gives every token the float64 result within float32
// summation error and, bit for bit, the result it gets among other
// tokens. Where the AMX tiles run, its products of k-major experts at
// least amxMinK deep are MatMulAMX's over PackAMX of the weight, and the
// others (narrow experts in the stored layout, the shallow) keep their
// one-row bits; elsewhere a token gets what it gets alone.
func TestExpertsOnTiles(t *testing.T) {
	for _, sh := range []struct{ din, inter int }{{256, 64}, {128, 384}, {384, 384}} {
		t.Run(fmt.Sprintf("din=%d inter=%d", sh.din, sh.inter), func(t *testing.T) {
			testExpertsOnTiles(t, sh.din, sh.inter)
		})
	}
}

func testExpertsOnTiles(t *testing.T, din, inter int) {
	const ne, topk, tok = 8, 2, 40
	b := New(2)
	defer b.Close()
	r := rand.New(rand.NewPCG(31, uint64(din)))
	var w1, w3, w2 []compute.Tensor
	var v1, v3, v2 [][]float32
	weight := func(n, k int) (compute.Tensor, []float32) {
		w, vals := bf16Weight(t, b, r, n, k)
		p, err := b.PrepareMatMul(w)
		require.NoError(t, err)
		return p, vals
	}
	for range ne {
		w, v := weight(inter, din)
		w1, v1 = append(w1, w), append(v1, v)
		w, v = weight(inter, din)
		w3, v3 = append(w3, w), append(v3, v)
		w, v = weight(din, inter)
		w2, v2 = append(w2, w), append(v2, v)
	}
	require.NoError(t, b.PrepareExperts(w1, w3, w2))
	// Tokens, their experts (distinct, in no order) and weights.
	route := func(n int) ([]float32, []int32, []float32) {
		x := make([]float32, n*din)
		for i := range x {
			x[i] = float32(r.NormFloat64() * 0.5)
		}
		idx, wts := weightedRoutes(r, n, ne, topk)
		return x, idx, wts
	}
	run := func(x []float32, idx []int32, wts []float32) []float32 {
		return runExperts(t, b, x, idx, wts, topk, w1, w3, w2)
	}
	x, idx, wts := route(tok)
	got := run(x, idx, wts)

	// The float64 product of the same operands, each hidden row rounded to
	// float32 as the kernels hold it, within 1e-5 of the sum of the terms'
	// magnitudes (outputs cancel).
	dot := func(a []float32, w []float32) (s, abs float64) {
		for i := range a {
			s += float64(a[i]) * float64(w[i])
			abs += math.Abs(float64(a[i]) * float64(w[i]))
		}
		return s, abs
	}
	for i := range tok {
		xi := x[i*din : (i+1)*din]
		want, scale := make([]float64, din), make([]float64, din)
		for s := range topk {
			e := idx[i*topk+s]
			h := make([]float32, inter)
			for j := range inter {
				g, _ := dot(xi, v1[e][j*din:(j+1)*din])
				u, _ := dot(xi, v3[e][j*din:(j+1)*din])
				h[j] = float32(g / (1 + math.Exp(-g)) * u)
			}
			for c := range din {
				y, abs := dot(h, v2[e][c*inter:(c+1)*inter])
				want[c] += float64(wts[i*topk+s]) * y
				scale[c] += float64(wts[i*topk+s]) * abs
			}
		}
		for c := range din {
			require.InDelta(t, want[c], got[i*din+c], 1e-5*scale[c], "token %d channel %d", i, c)
		}
	}

	// The first five tokens among forty others: the same bits.
	const kept = 5
	x2, idx2, wts2 := route(tok)
	copy(x2, x[:kept*din])
	copy(idx2, idx[:kept*topk])
	copy(wts2, wts[:kept*topk])
	require.Equal(t, got[:kept*din], run(x2, idx2, wts2)[:kept*din], "a token's result depends on the other tokens")

	if !longOnTiles(b.packing(), din) {
		for i := range kept {
			alone := run(x[i*din:(i+1)*din], idx[i*topk:(i+1)*topk], wts[i*topk:(i+1)*topk])
			require.Equal(t, alone, got[i*din:(i+1)*din], "token %d: off the tiles a long call keeps a token's own arithmetic", i)
		}
		t.Skip("no AMX tiles for long products here (an AMX CPU, K3_KERNEL unset or amx)")
	}
	// The bits: each expert's products one row at a time (the tiles' rows
	// are independent, and so are the others' up to 32), the slots added
	// in expert order as MoEExperts adds them.
	tiles := 0
	product := func(y, x []float32, w compute.Tensor, v []float32, long bool) {
		n, k := w.Dims[0], w.Dims[1]
		_, how, _ := packedOf(w)
		if how == amxTiles {
			tiles++ // K3_KERNEL=amx: every product of it on the tiles
		}
		if !long || how != kMajor || k < amxMinK {
			require.NoError(t, serialMatMul(y, x, nil, w, 1, false))
			return
		}
		wb := make([]uint16, n*k)
		for i, f := range v {
			wb[i] = floatx.BF16(f)
		}
		wp := make([]uint16, kernel.AMXLen(n, k))
		kernel.PackAMX(wp, wb, n, k)
		kernel.MatMulAMXSerial(y, x, wp, 1, n, k)
		tiles++
	}
	// A call of fewer than amxMinRows tokens (decode, verification) keeps
	// the stored and k-major products.
	short := run(x[:kept*din], idx[:kept*topk], wts[:kept*topk])
	for i := range kept {
		want := func(long bool) []float32 {
			xi := x[i*din : (i+1)*din]
			order := slices.Clone(idx[i*topk : (i+1)*topk])
			slices.Sort(order)
			acc := make([]float32, din)
			for _, e := range order {
				gate, up := make([]float32, inter), make([]float32, inter)
				product(gate, xi, w1[e], v1[e], long)
				product(up, xi, w3[e], v3[e], long)
				kernel.SwiGLU(gate, gate, up)
				y := make([]float32, din)
				product(y, gate, w2[e], v2[e], long)
				s := slices.Index(idx[i*topk:(i+1)*topk], e)
				kernel.Axpy(acc, wts[i*topk+s], y)
			}
			return acc
		}
		require.Equal(t, want(true), got[i*din:(i+1)*din], "token %d: the tiles' bits", i)
		require.Equal(t, want(false), short[i*din:(i+1)*din], "token %d: a short call's bits", i)
	}
	if inter >= kernel.KMajorMinN {
		require.NotZero(t, tiles, "no k-major expert product on the tiles")
	}
}

// TestExpertSchedules: MoEExperts gives the same bits whether each worker
// takes whole experts or the call runs as passes over the products'
// panel ranges (expertPasses), on the exact and the fast backend, for
// stored-layout, k-major (gate and up as one weight where narrow, from 48
// rows) and pair-interleaved experts, SwiGLU and SiTU,
// one token routed to one expert and calls of up to a prefill chunk's
// length (where the AMX tiles run, long calls keep whole products on
// them).
func TestExpertSchedules(t *testing.T) {
	defer func(f func(int, int) bool) { expertPasses = f }(expertPasses)
	for _, fast := range []bool{false, true} {
		for i, sh := range []struct{ din, inter int }{{256, 64}, {100, 400}, {384, 64}, {128, 384}, {384, 512}, {256, 40}, {100, 48}} {
			for _, c := range []struct{ tok, topk int }{{1, 1}, {1, 2}, {3, 2}, {8, 2}, {40, 2}, {130, 2}} {
				t.Run(fmt.Sprintf("fast=%v/din=%d/inter=%d/tok=%d/topk=%d", fast, sh.din, sh.inter, c.tok, c.topk), func(t *testing.T) {
					if raceEnabled && i >= 2 {
						t.Skip("two shapes (even and odd widths) hold the schedules' concurrency under the race detector")
					}
					testExpertSchedules(t, fast, sh.din, sh.inter, c.tok, c.topk)
				})
			}
		}
	}
}

func testExpertSchedules(t *testing.T, fast bool, din, inter, tok, topk int) {
	const ne = 8
	b := New(2)
	if fast {
		b = NewFastBF16(2)
	}
	defer b.Close()
	r := rand.New(rand.NewPCG(uint64(din*inter), uint64(tok)))
	w1, w3, w2 := preparedExperts(t, b, r, ne, din, inter)
	x := make([]float32, tok*din)
	for i := range x {
		x[i] = float32(r.NormFloat64() * 0.5)
	}
	idx, wts := make([]int32, tok*topk), make([]float32, tok*topk)
	for i := range tok {
		for s, e := range r.Perm(ne)[:topk] {
			idx[i*topk+s], wts[i*topk+s] = int32(e), float32(0.2+r.Float64())
		}
	}
	act := compute.Activation{Kind: compute.SwiGLU}
	if din%2 == 0 && tok%2 == 1 {
		act = compute.Activation{Kind: compute.SiTU, Beta: 3, LinearBeta: 5}
	}
	var got [2][]float32
	for i, passes := range []bool{false, true} {
		expertPasses = func(int, int) bool { return passes }
		out := must(b.Alloc(compute.F32, tok, din))
		it := must(b.Alloc(compute.I32, tok, topk))
		require.NoError(t, b.Write(it, idx))
		a := compute.ExpertArgs{X: upload(b, x, tok, din), Indices: it, Weights: upload(b, wts, tok, topk),
			W1: w1, W3: w3, W2: w2, Act: act, Out: out}
		require.NoError(t, b.MoEExperts(&a))
		got[i] = make([]float32, tok*din)
		require.NoError(t, b.Read(got[i], out))
	}
	require.Equal(t, got[0], got[1], "whole experts (want) against passes over panel ranges")
}

// weightedRoutes is routes with a weight in [0.2, 1.2) a slot, drawn
// after the slot's expert.
func weightedRoutes(r *rand.Rand, tok, ne, topk int) ([]int32, []float32) {
	idx, wts := make([]int32, tok*topk), make([]float32, tok*topk)
	for i := range tok {
		for s, e := range r.Perm(ne)[:topk] {
			idx[i*topk+s], wts[i*topk+s] = int32(e), float32(0.2+r.Float64())
		}
	}
	return idx, wts
}

// runExperts runs b's MoEExperts (SwiGLU) over x's tokens, routed topk a
// token to idx with weights wts, and returns the output read back. The
// output starts as NaN: Out is overwritten, not added to.
func runExperts(t testing.TB, b *Backend, x []float32, idx []int32, wts []float32, topk int, w1, w3, w2 []compute.Tensor) []float32 {
	t.Helper()
	n := len(idx) / topk
	din := len(x) / n
	it := must(b.Alloc(compute.I32, n, topk))
	require.NoError(t, b.Write(it, idx))
	out := must(b.Alloc(compute.F32, n, din))
	require.NoError(t, b.Fill(out, float32(math.NaN())))
	a := compute.ExpertArgs{X: upload(b, x, n, din), Indices: it, Weights: upload(b, wts, n, topk),
		W1: w1, W3: w3, W2: w2, Act: compute.Activation{Kind: compute.SwiGLU}, Out: out}
	require.NoError(t, b.MoEExperts(&a))
	got := make([]float32, n*din)
	require.NoError(t, b.Read(got, out))
	return got
}

// routes returns tok tokens' top-k expert indices, each token's k
// distinct experts of ne in no order.
func routes(r *rand.Rand, tok, ne, topk int) []int32 {
	idx := make([]int32, tok*topk)
	for i := range tok {
		for s, e := range r.Perm(ne)[:topk] {
			idx[i*topk+s] = int32(e)
		}
	}
	return idx
}

// preparedExperts makes ne experts' bf16 weights (w1 and w3 [inter, din],
// w2 [din, inter]) laid out as b lays out a model's (PrepareMatMul, then
// PrepareExperts).
func preparedExperts(t testing.TB, b *Backend, r *rand.Rand, ne, din, inter int) (w1, w3, w2 []compute.Tensor) {
	t.Helper()
	weight := func(n, k int) compute.Tensor {
		w, _ := bf16Weight(t, b, r, n, k)
		p, err := b.PrepareMatMul(w)
		require.NoError(t, err)
		return p
	}
	for range ne {
		w1, w3, w2 = append(w1, weight(inter, din)), append(w3, weight(inter, din)), append(w2, weight(din, inter))
	}
	require.NoError(t, b.PrepareExperts(w1, w3, w2))
	return w1, w3, w2
}

// TestMoESplit: calls of moeSplitMin tokens or more route and add the
// experts' outputs token by token on the workers, each token getting the
// bits it gets in a short call (routed alone; among five tokens, whose
// outputs MoEExperts adds in one sweep), with and without expert groups
// and bias, and with slots of experts another rank holds (-1).
func TestMoESplit(t *testing.T) {
	b := New(2)
	defer b.Close()
	r := rand.New(rand.NewPCG(41, 42))
	const tok, e, topk = 130, 64, 4
	require.GreaterOrEqual(t, tok, moeSplitMin)
	logits := normals(r, tok*e)
	for _, c := range []compute.RouteArgs{
		{TopK: topk, Renormalize: true, Scale: 2.5},
		{TopK: topk, NumGroups: 8, TopKGroup: 3, Scale: 1, Bias: upload(b, normals(r, e), e)},
	} {
		route := func(rows []float32) ([]int32, []float32) {
			n := len(rows) / e
			a := c
			a.Logits = upload(b, rows, n, e)
			a.Indices, a.Weights = must(b.Alloc(compute.I32, n, topk)), must(b.Alloc(compute.F32, n, topk))
			require.NoError(t, b.MoERoute(&a))
			idx, wts := make([]int32, n*topk), make([]float32, n*topk)
			require.NoError(t, b.Read(idx, a.Indices))
			require.NoError(t, b.Read(wts, a.Weights))
			return idx, wts
		}
		idx, wts := route(logits)
		for i := range tok {
			ai, aw := route(logits[i*e : (i+1)*e])
			require.Equal(t, ai, idx[i*topk:(i+1)*topk], "groups %d: token %d's experts", c.NumGroups, i)
			require.Equal(t, aw, wts[i*topk:(i+1)*topk], "groups %d: token %d's weights", c.NumGroups, i)
		}
	}

	const din, inter = 128, 384
	w1, w3, w2 := preparedExperts(t, b, r, e, din, inter)
	x := normals(r, tok*din)
	wts := normals(r, tok*topk)
	idx := routes(r, tok, e, topk)
	idx[3*topk+1], idx[7*topk] = -1, -1
	run := func(n int) []float32 {
		return runExperts(t, b, x[:n*din], idx[:n*topk], wts[:n*topk], topk, w1, w3, w2)
	}
	long := run(tok)
	if longOnTiles(b.packing(), din) {
		t.Skip("a long call's experts run on the AMX tiles here, with other bits than a short call's")
	}
	require.Equal(t, run(8), long[:8*din], "the first eight tokens in a short call and in a long one")
}

// TestExpertActivationUnsupported: an unknown activation is an error
// naming it under either schedule, not a panic.
func TestExpertActivationUnsupported(t *testing.T) {
	defer func(f func(int, int) bool) { expertPasses = f }(expertPasses)
	b := New(2)
	defer b.Close()
	r := rand.New(rand.NewPCG(9, 10))
	const ne, din, inter = 2, 64, 384
	w1, w3, w2 := preparedExperts(t, b, r, ne, din, inter)
	it := must(b.Alloc(compute.I32, 1, 1))
	require.NoError(t, b.Write(it, []int32{1}))
	a := compute.ExpertArgs{X: upload(b, normals(r, din), 1, din), Indices: it, Weights: upload(b, []float32{1}, 1, 1),
		W1: w1, W3: w3, W2: w2, Act: compute.Activation{Kind: 9}, Out: must(b.Alloc(compute.F32, 1, din))}
	for _, passes := range []bool{false, true} {
		expertPasses = func(int, int) bool { return passes }
		err := b.MoEExperts(&a)
		require.ErrorIs(t, err, compute.ErrUnsupported, "passes %v", passes)
		require.ErrorContains(t, err, "activation 9")
	}
}

// TestExpertPassesPolicy: the passes take calls whose whole experts would
// leave more than an eighth of the goroutines' turns idle, and no others.
func TestExpertPassesPolicy(t *testing.T) {
	for _, c := range []struct {
		active, goroutines int
		passes             bool
	}{
		{1, 2, true}, {2, 2, false}, {3, 2, true}, {4, 2, false}, {5, 2, true}, {7, 2, false},
		{26, 2, false}, {27, 2, false}, {6, 8, true}, {8, 6, true}, {12, 6, false}, {60, 16, false}, {1, 1, false},
	} {
		assert.Equal(t, c.passes, expertPasses(c.active, c.goroutines), "%d experts, %d goroutines", c.active, c.goroutines)
	}
}

// TestExpertAllocs: once warm, an MoEExperts call allocates nothing under
// either schedule.
func TestExpertAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	defer func(f func(int, int) bool) { expertPasses = f }(expertPasses)
	for _, c := range []struct {
		fast  bool
		inter int
	}{{false, 384}, {true, 384}, {false, 64}} {
		fast, inter := c.fast, c.inter
		b := New(2)
		if fast {
			b = NewFastBF16(2)
		}
		r := rand.New(rand.NewPCG(5, 6))
		const ne, din, tok, topk = 4, 256, 3, 2
		w1, w3, w2 := preparedExperts(t, b, r, ne, din, inter)
		it := must(b.Alloc(compute.I32, tok, topk))
		require.NoError(t, b.Write(it, []int32{0, 1, 2, 3, 1, 2}))
		a := compute.ExpertArgs{X: upload(b, normals(r, tok*din), tok, din), Indices: it, Weights: upload(b, normals(r, tok*topk), tok, topk),
			W1: w1, W3: w3, W2: w2, Act: compute.Activation{Kind: compute.SwiGLU}, Out: must(b.Alloc(compute.F32, tok, din))}
		for _, passes := range []bool{false, true} {
			expertPasses = func(int, int) bool { return passes }
			require.NoError(t, b.MoEExperts(&a))
			allocs := testing.AllocsPerRun(20, func() {
				if err := b.MoEExperts(&a); err != nil {
					t.Fatal(err)
				}
			})
			require.Zero(t, allocs, "fast %v, inter %d, passes %v", fast, inter, passes)
		}
		b.Close()
	}
}

// BenchmarkMoEExperts runs MoEExperts calls of laid-out bf16 experts
// under both schedules in turn (whole experts a worker, then passes over
// panel ranges, eight calls each), cold: rotated over
// copies of the active experts (as a model's MoE layers) holding at
// least 256 MB. Shapes: the 1B preset's experts (2048 wide, 512 inner,
// 16 of them) at a decode batch of 8 tokens with top-6, and one token
// with top-6, top-3 and top-1 (one expert for two workers); the 100M
// preset's (384 wide, 64 inner, 64 of them) at a batch of 8 with top-4.
// It reports each schedule's share of the bandwidth probed before and
// after (the experts' weight bytes read per second) and whole/passes,
// the whole experts' time over the passes'.
func BenchmarkMoEExperts(b *testing.B) {
	defer func(f func(int, int) bool) { expertPasses = f }(expertPasses)
	for _, c := range []struct {
		name                      string
		din, inter, ne, tok, topk int
	}{
		{"1b/tokens=8/top6", 2048, 512, 16, 8, 6},
		{"1b/tokens=1/top6", 2048, 512, 16, 1, 6},
		{"1b/tokens=1/top3", 2048, 512, 16, 1, 3},
		{"1b/tokens=1/top1", 2048, 512, 16, 1, 1},
		{"100m/tokens=8/top4", 384, 64, 64, 8, 4},
	} {
		be := New(0)
		r := rand.New(rand.NewPCG(7, 8))
		idx := routes(r, c.tok, c.ne, c.topk)
		active := map[int32]bool{}
		for _, e := range idx {
			active[e] = true
		}
		// Copies of the active experts (the others, never read, shared).
		per := 3 * c.din * c.inter * 2 * len(active)
		copies := max(2, (256<<20)/per)
		type layer struct{ w1, w3, w2 []compute.Tensor }
		layers := make([]layer, copies)
		weight := func(n, k int) compute.Tensor {
			w, _ := bf16Weight(b, be, r, n, k)
			p, err := be.PrepareMatMul(w)
			if err != nil {
				b.Fatal(err)
			}
			return p
		}
		for l := range layers {
			for e := range c.ne {
				if l > 0 && !active[int32(e)] {
					layers[l].w1 = append(layers[l].w1, layers[0].w1[e])
					layers[l].w3 = append(layers[l].w3, layers[0].w3[e])
					layers[l].w2 = append(layers[l].w2, layers[0].w2[e])
					continue
				}
				layers[l].w1 = append(layers[l].w1, weight(c.inter, c.din))
				layers[l].w3 = append(layers[l].w3, weight(c.inter, c.din))
				layers[l].w2 = append(layers[l].w2, weight(c.din, c.inter))
			}
		}
		it := must(be.Alloc(compute.I32, c.tok, c.topk))
		if err := be.Write(it, idx); err != nil {
			b.Fatal(err)
		}
		a := compute.ExpertArgs{X: upload(be, normals(r, c.tok*c.din), c.tok, c.din), Indices: it,
			Weights: upload(be, normals(r, c.tok*c.topk), c.tok, c.topk), Act: compute.Activation{Kind: compute.SwiGLU},
			Out: must(be.Alloc(compute.F32, c.tok, c.din))}
		b.Run(c.name, func(b *testing.B) {
			bw := kernel.BandwidthNow()
			var took [2]time.Duration
			b.ResetTimer()
			// Each schedule in turn for a run of calls, the first of each
			// run untimed: a worker left idle by a run of calls that
			// did not need it parks, and a model's other operations keep
			// it awake between its MoE calls.
			const run = 8
			for i := 0; i < b.N; i += run {
				for s, passes := range []bool{false, true} {
					expertPasses = func(int, int) bool { return passes }
					for c := range run + 1 {
						l := layers[(2*i+s*run+c)%copies]
						a.W1, a.W3, a.W2 = l.w1, l.w3, l.w2
						start := time.Now()
						if err := be.MoEExperts(&a); err != nil {
							b.Fatal(err)
						}
						if c > 0 {
							took[s] += time.Since(start)
						}
					}
				}
			}
			b.StopTimer()
			bw = max(bw, kernel.BandwidthNow())
			bytes := float64(len(active)*3*c.din*c.inter*2) * float64((b.N+run-1)/run*run)
			b.ReportMetric(bytes/took[0].Seconds()/bw, "whole_of_bandwidth")
			b.ReportMetric(bytes/took[1].Seconds()/bw, "passes_of_bandwidth")
			b.ReportMetric(float64(took[0])/float64(took[1]), "whole/passes")
		})
		be.Close()
	}
}

// BenchmarkMoEExpertsPrefill times MoEExperts on a prefill chunk's shape:
// 256 tokens routed top-k over the experts (about 16 rows an expert at
// the 100M preset's 64 experts top-4), cold (rotated over copies of the
// experts holding at least 256 MB, as a model's MoE layers are), laid out
// as a model's (PrepareMatMul, then PrepareExperts: narrow experts' gate
// and up as one weight) and, alternating call by call, with
// PrepareMatMul's layout alone. It reports each one's GFLOP/s as a share
// of the FMA peak probed in the same run (the 512-bit one where the CPU
// has it) and paired/alone, the time of the experts laid out alone over
// the model's layout.
func BenchmarkMoEExpertsPrefill(b *testing.B) {
	for _, c := range []struct {
		name                      string
		din, inter, ne, tok, topk int
	}{
		{"100m/tokens=256/top4", 384, 64, 64, 256, 4},
		{"1b/tokens=256/top6", 2048, 512, 16, 256, 6},
	} {
		be := New(0)
		r := rand.New(rand.NewPCG(7, 9))
		idx := routes(r, c.tok, c.ne, c.topk)
		per := 3 * c.din * c.inter * 2 * c.ne
		copies := max(2, (256<<20)/per)
		type layer struct{ w1, w3, w2 []compute.Tensor }
		var layers [2][]layer // PrepareExperts'd, PrepareMatMul alone
		weight := func(n, k int) compute.Tensor {
			w, _ := bf16Weight(b, be, r, n, k)
			return must(be.PrepareMatMul(w))
		}
		for v := range layers {
			layers[v] = make([]layer, copies)
			for l := range layers[v] {
				ly := &layers[v][l]
				for range c.ne {
					ly.w1 = append(ly.w1, weight(c.inter, c.din))
					ly.w3 = append(ly.w3, weight(c.inter, c.din))
					ly.w2 = append(ly.w2, weight(c.din, c.inter))
				}
				if v == 0 {
					must(0, be.PrepareExperts(ly.w1, ly.w3, ly.w2))
				}
			}
		}
		it := must(be.Alloc(compute.I32, c.tok, c.topk))
		must(0, be.Write(it, idx))
		a := compute.ExpertArgs{X: upload(be, normals(r, c.tok*c.din), c.tok, c.din), Indices: it,
			Weights: upload(be, normals(r, c.tok*c.topk), c.tok, c.topk), Act: compute.Activation{Kind: compute.SwiGLU},
			Out: must(be.Alloc(compute.F32, c.tok, c.din))}
		b.Run(c.name, func(b *testing.B) {
			peak := be.Pool().PeakKernelFLOPS()
			var took [2]time.Duration
			b.ResetTimer()
			for i := range b.N {
				for v := range layers {
					l := layers[v][i%copies]
					a.W1, a.W3, a.W2 = l.w1, l.w3, l.w2
					start := time.Now()
					if err := be.MoEExperts(&a); err != nil {
						b.Fatal(err)
					}
					took[v] += time.Since(start)
				}
			}
			flops := 2 * 3 * float64(c.din*c.inter) * float64(c.tok*c.topk) * float64(b.N)
			if peak > 0 {
				b.ReportMetric(flops/took[0].Seconds()/peak, "paired_of_peak")
				b.ReportMetric(flops/took[1].Seconds()/peak, "alone_of_peak")
			}
			b.ReportMetric(float64(took[1])/float64(took[0]), "alone/paired")
		})
		be.Close()
	}
}
