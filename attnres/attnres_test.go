package attnres

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"k3/compute"
	"k3/internal/cpu"
)

// unfused hides a backend's fused AttnRes phases, so that the Stream
// runs their composition.
type unfused struct{ compute.Backend }

func (unfused) AttnResPrepare(*compute.AttnResPrepareArgs) error { return compute.ErrUnsupported }
func (unfused) AttnResUpdate(*compute.AttnResUpdateArgs) error   { return compute.ErrUnsupported }

// TestStreamMatchesOracle runs random block and full stacks through the
// two-phase Stream, fused and composed, and checks every sublayer input
// and the output against the direct aggregation over the bookkept
// sources, and the pre-norms asked for against RMSNorm of those inputs,
// bit for bit.
func TestStreamMatchesOracle(t *testing.T) {
	cb := cpu.New(2)
	defer cb.Close()
	r := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 16; trial++ {
		var b compute.Backend = cb
		if trial%2 == 1 {
			b = unfused{cb}
		}
		layers := 1 + r.IntN(7)
		j := 2 * layers
		per := []int{1, 2, 4, 6}[r.IntN(4)]
		tok, d := 1+r.IntN(4), 8*(1+r.IntN(3))
		if trial >= 12 { // past the fused update's split over the pool
			tok, d = 300+r.IntN(40), 128
		}
		const eps = 1e-6
		rnd := func(n int, s float64) []float32 {
			v := make([]float32, n)
			for i := range v {
				v[i] = float32(r.NormFloat64() * s)
			}
			return v
		}
		w, g := rnd(j*d, 1), rnd(j*d, 1)
		ow, og := rnd(d, 1), rnd(d, 1)
		fq := make([]float32, j*d)
		for i := 0; i < j; i++ {
			FuseQuery(fq[i*d:(i+1)*d], w[i*d:(i+1)*d], g[i*d:(i+1)*d])
		}
		oq := make([]float32, d)
		FuseQuery(oq, ow, og)
		up := func(v []float32, dims ...int) compute.Tensor {
			x, _ := b.Alloc(compute.F32, dims...)
			b.Write(x, v)
			return x
		}
		maxT := tok + r.IntN(3) // buffers larger than the pass
		st, err := NewStream(b, up(fq, j, d), up(oq, d), per, maxT, eps)
		if err != nil {
			t.Fatal(err)
		}
		emb := rnd(tok*d, 1)
		if err := st.Begin(up(emb, tok, d)); err != nil {
			t.Fatal(err)
		}
		// Oracle bookkeeping on the host.
		var blocks [][]float32
		partial := append([]float32(nil), emb...)
		has := true
		h, _ := b.Alloc(compute.F32, tok, d)
		normed, _ := b.Alloc(compute.F32, tok, d)
		sep, _ := b.Alloc(compute.F32, tok, d)
		// norm asks sublayer s for its pre-norm on most steps, with a
		// weight or without.
		norm := func(s int) Norm {
			switch (s + trial) % 3 {
			case 0:
				return Norm{}
			case 1:
				return Norm{Out: normed, Weight: up(rnd(d, 1), d), Eps: 1e-5}
			}
			return Norm{Out: normed, Eps: 1e-6}
		}
		checkNorm := func(what string, n Norm) {
			t.Helper()
			if n.Out.IsZero() {
				return
			}
			if err := cb.RMSNorm(sep, h, n.Weight, n.Eps); err != nil {
				t.Fatal(err)
			}
			got, want := make([]float32, tok*d), make([]float32, tok*d)
			b.Read(got, normed)
			b.Read(want, sep)
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("trial %d %s: pre-norm [%d] %g, RMSNorm of the input %g", trial, what, i, got[i], want[i])
				}
			}
		}
		var delta compute.Tensor
		var deltaHost []float32
		for s := 0; s < j; s++ {
			if deltaHost != nil {
				if has {
					for i := range partial {
						partial[i] += deltaHost[i]
					}
				} else {
					partial, has = append([]float32(nil), deltaHost...), true
				}
			}
			if s%per == 0 {
				blocks = append(blocks, partial)
				partial, has = make([]float32, tok*d), false
			}
			srcs := append([][]float32(nil), blocks...)
			if has {
				srcs = append(srcs, partial)
			}
			want := make([]float32, tok*d)
			Aggregate(want, srcs, w[s*d:(s+1)*d], g[s*d:(s+1)*d], tok, d, eps)
			n := norm(s)
			if err := st.Next(delta, h, n); err != nil {
				t.Fatal(err)
			}
			checkNorm(fmt.Sprintf("sublayer %d", s), n)
			got := make([]float32, tok*d)
			b.Read(got, h)
			for i := range want {
				if !(math.Abs(float64(got[i]-want[i])) <= 1e-4*(1+math.Abs(float64(want[i])))) {
					t.Fatalf("trial %d sublayer %d: %g want %g", trial, s, got[i], want[i])
				}
			}
			deltaHost = rnd(tok*d, 2)
			delta = up(deltaHost, tok, d)
		}
		for i := range partial {
			if has {
				partial[i] += deltaHost[i]
			} else {
				partial[i] = deltaHost[i]
			}
		}
		want := make([]float32, tok*d)
		Aggregate(want, append(blocks, partial), ow, og, tok, d, eps)
		n := norm(j)
		if err := st.Final(delta, h, n); err != nil {
			t.Fatal(err)
		}
		checkNorm("output", n)
		got := make([]float32, tok*d)
		b.Read(got, h)
		for i := range want {
			if !(math.Abs(float64(got[i]-want[i])) <= 1e-4*(1+math.Abs(float64(want[i])))) {
				t.Fatalf("trial %d output: %g want %g", trial, got[i], want[i])
			}
		}
		if len(st.Blocks()) != len(blocks) {
			t.Fatalf("trial %d: %d blocks, oracle %d", trial, len(st.Blocks()), len(blocks))
		}
	}
}

func TestStreamErrors(t *testing.T) {
	b := cpu.New(1)
	defer b.Close()
	q, _ := b.Alloc(compute.F32, 4, 8)
	oq, _ := b.Alloc(compute.F32, 7)
	if _, err := NewStream(b, q, oq, 2, 4, 1e-6); err == nil {
		t.Error("mismatched output query accepted")
	}
	oq, _ = b.Alloc(compute.F32, 8)
	st, err := NewStream(b, q, oq, 2, 2, 1e-6)
	if err != nil {
		t.Fatal(err)
	}
	big, _ := b.Alloc(compute.F32, 3, 8)
	if err := st.Begin(big); err == nil {
		t.Error("more tokens than the stream holds accepted")
	}
}
