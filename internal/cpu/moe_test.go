package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

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
	// Tokens, their experts (distinct, in no order) and weights.
	route := func(n int) ([]float32, []int32, []float32) {
		x := make([]float32, n*din)
		for i := range x {
			x[i] = float32(r.NormFloat64() * 0.5)
		}
		idx := make([]int32, n*topk)
		wts := make([]float32, n*topk)
		for i := range n {
			for s, e := range r.Perm(ne)[:topk] {
				idx[i*topk+s], wts[i*topk+s] = int32(e), float32(0.2+r.Float64())
			}
		}
		return x, idx, wts
	}
	run := func(x []float32, idx []int32, wts []float32) []float32 {
		n := len(x) / din
		out := must(b.Alloc(compute.F32, n, din))
		it := must(b.Alloc(compute.I32, n, topk))
		require.NoError(t, b.Write(it, idx))
		a := compute.ExpertArgs{X: upload(b, x, n, din), Indices: it, Weights: upload(b, wts, n, topk),
			W1: w1, W3: w3, W2: w2, Act: compute.Activation{Kind: compute.SwiGLU}, Out: out}
		require.NoError(t, b.MoEExperts(&a))
		got := make([]float32, n*din)
		require.NoError(t, b.Read(got, out))
		return got
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
