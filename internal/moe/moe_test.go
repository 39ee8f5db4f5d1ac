package moe

import (
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"k3/compute"
	"k3/internal/cpu"
)

func up(b compute.Backend, v []float32, dims ...int) compute.Tensor {
	x, _ := b.Alloc(compute.F32, dims...)
	b.Write(x, v)
	return x
}

func rnd(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * 0.5)
	}
	return v
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

func silu(x float64) float64 { return x * sigmoid(x) }

// TestLayerMatchesNaive compares the grouped-by-expert layer (router,
// experts, shared expert, latent projections) with a per-token float64
// computation written from the equations. The latent width is none, less
// than the hidden width, or equal to it: the projections are learned
// matrices and apply at any width.
func TestLayerMatchesNaive(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	r := rand.New(rand.NewPCG(3, 4))
	for _, lat := range []int{0, 10, 16} {
		const tok, d, e, k, inter = 7, 16, 12, 3, 8
		latent := lat > 0
		din := d
		if latent {
			din = lat
		}
		x := rnd(r, tok*d)
		gate, bias := rnd(r, e*d), rnd(r, e)
		w1, w3, w2 := rnd(r, e*inter*din), rnd(r, e*inter*din), rnd(r, e*din*inter)
		sg, su, sd := rnd(r, inter*d), rnd(r, inter*d), rnd(r, d*inter)
		down, norm, upw := rnd(r, lat*d), rnd(r, lat), rnd(r, d*lat)
		w := &Weights{Gate: up(b, gate, e, d), Bias: up(b, bias, e), Act: compute.Activation{Kind: compute.SwiGLU}, Eps: 1e-6,
			Shared: &MLP{Gate: up(b, sg, inter, d), Up: up(b, su, inter, d), Down: up(b, sd, d, inter), Act: compute.Activation{Kind: compute.SwiGLU}}}
		for i := 0; i < e; i++ {
			w.W1 = append(w.W1, up(b, w1[i*inter*din:(i+1)*inter*din], inter, din))
			w.W3 = append(w.W3, up(b, w3[i*inter*din:(i+1)*inter*din], inter, din))
			w.W2 = append(w.W2, up(b, w2[i*din*inter:(i+1)*din*inter], din, inter))
		}
		if latent {
			w.LatentDown, w.LatentNorm, w.LatentUp = up(b, down, lat, d), up(b, norm, lat), up(b, upw, d, lat)
		}
		router := Router{TopK: k, NumGroups: 3, TopKGroup: 2, Renormalize: true, Scale: 2}
		layer, err := NewLayer(b, w, router, tok)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := b.Alloc(compute.F32, tok, d)
		if err := layer.Forward(up(b, x, tok, d), out, compute.Tensor{}, compute.Tensor{}); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, tok*d)
		b.Read(got, out)
		for ti := 0; ti < tok; ti++ {
			xt := x[ti*d : (ti+1)*d]
			dot := func(a, b []float32) float64 {
				s := 0.0
				for i := range a {
					s += float64(a[i]) * float64(b[i])
				}
				return s
			}
			scores, sel := make([]float64, e), make([]float64, e)
			for i := 0; i < e; i++ {
				scores[i] = sigmoid(dot(xt, gate[i*d:(i+1)*d]))
				sel[i] = scores[i] + float64(bias[i])
			}
			// Groups of 4: score = sum of the top two; keep the best 2 groups.
			type gs struct {
				g int
				s float64
			}
			var groups []gs
			for g := 0; g < 3; g++ {
				v := append([]float64(nil), sel[g*4:(g+1)*4]...)
				sort.Sort(sort.Reverse(sort.Float64Slice(v)))
				groups = append(groups, gs{g, v[0] + v[1]})
			}
			sort.SliceStable(groups, func(i, j int) bool { return groups[i].s > groups[j].s })
			keep := map[int]bool{groups[0].g: true, groups[1].g: true}
			cand := []int{}
			for i := 0; i < e; i++ {
				if keep[i/4] {
					cand = append(cand, i)
				}
			}
			sort.SliceStable(cand, func(i, j int) bool { return sel[cand[i]] > sel[cand[j]] })
			picks := cand[:k]
			total := 0.0
			for _, p := range picks {
				total += scores[p]
			}
			in := make([]float64, din)
			if latent {
				for c := 0; c < lat; c++ {
					in[c] = dot(xt, down[c*d:(c+1)*d])
				}
			} else {
				for c := range in {
					in[c] = float64(xt[c])
				}
			}
			in32 := make([]float32, din)
			for c := range in {
				in32[c] = float32(in[c])
			}
			routed := make([]float64, din)
			for _, p := range picks {
				wt := scores[p] / total * 2
				hdn := make([]float32, inter)
				for j := 0; j < inter; j++ {
					g := dot(in32, w1[(p*inter+j)*din:(p*inter+j+1)*din])
					u := dot(in32, w3[(p*inter+j)*din:(p*inter+j+1)*din])
					hdn[j] = float32(silu(g) * u)
				}
				for c := 0; c < din; c++ {
					routed[c] += wt * dot(hdn, w2[(p*din+c)*inter:(p*din+c+1)*inter])
				}
			}
			final := make([]float64, d)
			if latent {
				ss := 0.0
				for _, v := range routed {
					ss += v * v
				}
				inv := 1 / math.Sqrt(ss/float64(lat)+1e-6)
				rn := make([]float32, lat)
				for c := range rn {
					rn[c] = float32(routed[c] * inv * float64(norm[c]))
				}
				for c := 0; c < d; c++ {
					final[c] = dot(rn, upw[c*lat:(c+1)*lat])
				}
			} else {
				copy(final, routed)
			}
			sh := make([]float32, inter)
			for j := 0; j < inter; j++ {
				sh[j] = float32(silu(dot(xt, sg[j*d:(j+1)*d])) * dot(xt, su[j*d:(j+1)*d]))
			}
			for c := 0; c < d; c++ {
				want := final[c] + dot(sh, sd[c*inter:(c+1)*inter])
				if g := float64(got[ti*d+c]); !(math.Abs(g-want) <= 1e-4*(1+math.Abs(want))) {
					t.Fatalf("latent width %d token %d channel %d: %g want %g", lat, ti, c, g, want)
				}
			}
		}
	}
}

func TestRouterErrors(t *testing.T) {
	b := cpu.New(1)
	defer b.Close()
	logits, _ := b.Alloc(compute.F32, 2, 8)
	idx, _ := b.Alloc(compute.I32, 2, 9)
	wts, _ := b.Alloc(compute.F32, 2, 9)
	cases := []struct {
		a    compute.RouteArgs
		want string
	}{
		{compute.RouteArgs{TopK: 9, NumGroups: 1, TopKGroup: 1}, "top_k 9"},
		{compute.RouteArgs{TopK: 2, NumGroups: 3, TopKGroup: 1}, "num_expert_group 3"},
		{compute.RouteArgs{TopK: 2, NumGroups: 2, TopKGroup: 3}, "topk_group 3"},
	}
	for _, c := range cases {
		c.a.Logits, c.a.Indices, c.a.Weights = logits, idx, wts
		if err := b.MoERoute(&c.a); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want an error naming %q, got %v", c.want, err)
		}
	}
	gate, _ := b.Alloc(compute.F32, 8, 4)
	if _, err := NewLayer(b, &Weights{Gate: gate}, Router{TopK: 9}, 1); err == nil || !strings.Contains(err.Error(), "num_experts_per_token 9") {
		t.Errorf("NewLayer top_k > experts: %v", err)
	}
}

// A slot whose expert index is -1 adds nothing: the result equals the same
// routing with that slot's weight set to zero.
func TestExpertsSkipUnheldSlots(t *testing.T) {
	b := cpu.New(1)
	defer b.Close()
	r := rand.New(rand.NewPCG(9, 9))
	const tok, din, e, k, inter = 5, 8, 4, 2, 6
	var w1, w3, w2 []compute.Tensor
	for i := 0; i < e; i++ {
		w1 = append(w1, up(b, rnd(r, inter*din), inter, din))
		w3 = append(w3, up(b, rnd(r, inter*din), inter, din))
		w2 = append(w2, up(b, rnd(r, din*inter), din, inter))
	}
	x := up(b, rnd(r, tok*din), tok, din)
	idx := []int32{0, 1, 2, 3, 1, 3, 0, 2, 3, 0}
	wts := rnd(r, tok*k)
	skipIdx, zeroW := append([]int32(nil), idx...), append([]float32(nil), wts...)
	for i := range idx {
		if i%3 == 1 {
			skipIdx[i], zeroW[i] = -1, 0
		}
	}
	run := func(ix []int32, w []float32) []float32 {
		it, _ := b.Alloc(compute.I32, tok, k)
		b.Write(it, ix)
		out, _ := b.Alloc(compute.F32, tok, din)
		a := compute.ExpertArgs{X: x, Indices: it, Weights: up(b, w, tok, k), W1: w1, W3: w3, W2: w2,
			Act: compute.Activation{Kind: compute.SwiGLU}, Out: out}
		if err := b.MoEExperts(&a); err != nil {
			t.Fatal(err)
		}
		v := make([]float32, tok*din)
		b.Read(v, out)
		return v
	}
	got, want := run(skipIdx, wts), run(idx, zeroW)
	for i := range want {
		if !(math.Abs(float64(got[i]-want[i])) <= 1e-6) {
			t.Fatalf("element %d: %g with the slots skipped, %g with their weights zero", i, got[i], want[i])
		}
	}
	bad := append([]int32(nil), idx...)
	bad[0] = -2
	it, _ := b.Alloc(compute.I32, tok, k)
	b.Write(it, bad)
	out, _ := b.Alloc(compute.F32, tok, din)
	a := compute.ExpertArgs{X: x, Indices: it, Weights: up(b, wts, tok, k), W1: w1, W3: w3, W2: w2, Act: compute.Activation{Kind: compute.SwiGLU}, Out: out}
	if err := b.MoEExperts(&a); err == nil {
		t.Fatal("expert index -2 accepted")
	}
}
