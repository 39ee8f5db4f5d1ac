package ascend

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
)

// MoEExperts against the pure-Go backend, by both routes: the
// composition over separate expert weights, and the grouped route over
// weights stacked by PrepareExperts (after PrepareMatMul, as the loader
// does, so bf16 experts are stacked in FRACTAL_NZ). bf16 and f32 expert
// weights, SwiGLU and SiTU, slots of -1 (experts on another rank), an
// expert no token picked, one token. The grouped route waits for nothing.
func TestMoEExperts(t *testing.T) {
	eachDriver(t, 64<<20, func(t *testing.T, a *Backend) {
		c := cpu.New(1)
		defer c.Close()
		rng := rand.New(rand.NewPCG(91, 92))
		const Din, I = 16, 24
		cases := []struct {
			T, K, E int
			idx     []int32
		}{
			{5, 2, 4, []int32{0, 2, 2, -1, 1, 0, 2, 0, 1, 2}},
			{1, 3, 5, []int32{4, -1, 0}},
			{7, 3, 6, nil},
		}
		for _, tc := range cases {
			T, K, E := tc.T, tc.K, tc.E
			idx := tc.idx
			if idx == nil {
				idx = make([]int32, T*K)
				for i := range idx {
					idx[i] = int32(rng.IntN(E+1)) - 1
				}
			}
			for _, stacked := range []bool{false, true} {
				for _, dt := range []compute.DType{compute.F32, compute.BF16} {
					for _, act := range []compute.Activation{{Kind: compute.SwiGLU}, {Kind: compute.SiTU, Beta: 2, LinearBeta: 3}} {
						xa, xc := both(t, a, c, compute.F32, randF32(rng, T*Din), T, Din)
						wa, wc := both(t, a, c, compute.F32, randF32(rng, T*K), T, K)
						ia, err := a.Alloc(compute.I32, T, K)
						require.NoError(t, err)
						require.NoError(t, a.Write(ia, idx))
						ic, err := c.Alloc(compute.I32, T, K)
						require.NoError(t, err)
						require.NoError(t, c.Write(ic, idx))
						var w1a, w3a, w2a, w1c, w3c, w2c []compute.Tensor
						for range E {
							x, y := both(t, a, c, dt, randF32(rng, I*Din), I, Din)
							w1a, w1c = append(w1a, x), append(w1c, y)
							x, y = both(t, a, c, dt, randF32(rng, I*Din), I, Din)
							w3a, w3c = append(w3a, x), append(w3c, y)
							x, y = both(t, a, c, dt, randF32(rng, Din*I), Din, I)
							w2a, w2c = append(w2a, x), append(w2c, y)
						}
						if stacked {
							for _, ws := range [][]compute.Tensor{w1a, w3a, w2a} {
								for e := range ws {
									ws[e], err = a.PrepareMatMul(ws[e])
									require.NoError(t, err)
								}
							}
							require.NoError(t, a.PrepareExperts(w1a, w3a, w2a))
							require.NotNil(t, stackOf(w1a))
							require.NotNil(t, stackOf(w2a))
						}
						oa, err := a.Alloc(compute.F32, T, Din)
						require.NoError(t, err)
						oc, err := c.Alloc(compute.F32, T, Din)
						require.NoError(t, err)
						waits := a.Waits()
						require.NoError(t, a.MoEExperts(&compute.ExpertArgs{X: xa, Indices: ia, Weights: wa, W1: w1a, W3: w3a, W2: w2a, Act: act, Out: oa}))
						if stacked {
							require.Equal(t, waits, a.Waits(), "the grouped route waited for the stream")
						}
						require.NoError(t, c.MoEExperts(&compute.ExpertArgs{X: xc, Indices: ic, Weights: wc, W1: w1c, W3: w3c, W2: w2c, Act: act, Out: oc}))
						closeRel(t, read(t, c, oc), read(t, a, oa), 1e-5, 1e-4, tc.T, tc.E, stacked, dt, act.Kind)
						// An expert's weight in the stack is still that
						// expert's for MatMul and Read.
						if stacked {
							e := E - 1
							ha, err := a.Alloc(compute.F32, T, I)
							require.NoError(t, err)
							hc, err := c.Alloc(compute.F32, T, I)
							require.NoError(t, err)
							require.NoError(t, a.MatMul(ha, xa, w1a[e]))
							require.NoError(t, c.MatMul(hc, xc, w1c[e]))
							closeRel(t, read(t, c, hc), read(t, a, ha), 1e-5, 1e-4, "matmul of a stacked expert", dt)
						}
					}
				}
			}
		}
	})
}

// PrepareExperts refuses experts that cannot share a stack, naming the
// expert, and leaves their tensors as they were.
func TestPrepareExpertsErrors(t *testing.T) {
	eachDriver(t, 8<<20, func(t *testing.T, a *Backend) {
		mk := func(dims ...int) compute.Tensor {
			x, err := a.Alloc(compute.F32, dims...)
			require.NoError(t, err)
			return x
		}
		w1 := []compute.Tensor{mk(8, 4), mk(8, 4), mk(6, 4)}
		w3 := []compute.Tensor{mk(8, 4), mk(8, 4), mk(8, 4)}
		w2 := []compute.Tensor{mk(4, 8), mk(4, 8), mk(4, 8)}
		orig := append([]compute.Tensor(nil), w1...)
		err := a.PrepareExperts(w1, w3, w2)
		require.ErrorIs(t, err, compute.ErrShape)
		require.ErrorContains(t, err, "w1")
		require.ErrorContains(t, err, "expert 2")
		require.Equal(t, orig, w1)
		require.Nil(t, stackOf(w1))
		require.ErrorIs(t, a.PrepareExperts(w1[:2], w3, w2), compute.ErrShape)
		// A refusal of the last kind moves none of the first two.
		w1 = []compute.Tensor{mk(8, 4), mk(8, 4)}
		w3 = []compute.Tensor{mk(8, 4), mk(8, 4)}
		w2 = []compute.Tensor{mk(4, 8), mk(4, 6)}
		orig1, orig3 := append([]compute.Tensor(nil), w1...), append([]compute.Tensor(nil), w3...)
		err = a.PrepareExperts(w1, w3, w2)
		require.ErrorIs(t, err, compute.ErrShape)
		require.ErrorContains(t, err, "w2")
		require.Equal(t, orig1, w1)
		require.Equal(t, orig3, w3)
	})
}

// The router through aclnnMoeGatingTopK against the pure-Go backend: the
// same experts in the same order, weights within rounding; grouped and
// plain, with and without a bias, renormalised or not.
func TestMoERoute(t *testing.T) {
	eachDriver(t, 8<<20, func(t *testing.T, a *Backend) {
		c := cpu.New(1)
		defer c.Close()
		rng := rand.New(rand.NewPCG(101, 102))
		const T = 6
		for _, r := range []struct{ E, K, G, KG int }{{16, 4, 1, 1}, {32, 6, 8, 3}, {64, 8, 4, 2}} {
			for _, bias := range []bool{false, true} {
				for _, renorm := range []bool{false, true} {
					la, lc := both(t, a, c, compute.F32, randF32(rng, T*r.E), T, r.E)
					var ba, bc compute.Tensor
					if bias {
						ba, bc = both(t, a, c, compute.F32, randF32(rng, r.E), r.E)
					}
					route := func(be compute.Backend, logits, bias compute.Tensor) ([]int32, []float32) {
						idx, err := be.Alloc(compute.I32, T, r.K)
						require.NoError(t, err)
						w, err := be.Alloc(compute.F32, T, r.K)
						require.NoError(t, err)
						require.NoError(t, be.MoERoute(&compute.RouteArgs{Logits: logits, Bias: bias, TopK: r.K, NumGroups: r.G,
							TopKGroup: r.KG, Renormalize: renorm, Scale: 2.5, Indices: idx, Weights: w}))
						gi := make([]int32, T*r.K)
						require.NoError(t, be.Read(&gi, idx))
						return gi, read(t, be, w)
					}
					ia, wa := route(a, la, ba)
					ic, wc := route(c, lc, bc)
					require.Equal(t, ic, ia, "%+v bias %v renorm %v", r, bias, renorm)
					closeRel(t, wc, wa, 1e-6, 1e-5, r, bias, renorm)
				}
			}
		}
	})
}
