package ascend

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
)

// MoEExperts' composition against the pure-Go backend: bf16 and f32
// expert weights, SwiGLU and SiTU, a slot of -1 (an expert on another
// rank) and an expert no token picked.
func TestMoEExperts(t *testing.T) {
	eachDriver(t, 32<<20, func(t *testing.T, a *Backend) {
		c := cpu.New(1)
		defer c.Close()
		rng := rand.New(rand.NewPCG(91, 92))
		const T, Din, I, E, K = 5, 16, 24, 4, 2
		idx := []int32{0, 2, 2, -1, 1, 0, 2, 0, 1, 2}
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
				oa, err := a.Alloc(compute.F32, T, Din)
				require.NoError(t, err)
				oc, err := c.Alloc(compute.F32, T, Din)
				require.NoError(t, err)
				require.NoError(t, a.MoEExperts(&compute.ExpertArgs{X: xa, Indices: ia, Weights: wa, W1: w1a, W3: w3a, W2: w2a, Act: act, Out: oa}))
				require.NoError(t, c.MoEExperts(&compute.ExpertArgs{X: xc, Indices: ic, Weights: wc, W1: w1c, W3: w3c, W2: w2c, Act: act, Out: oc}))
				closeRel(t, read(t, c, oc), read(t, a, oa), 1e-5, 1e-4, dt, act.Kind)
			}
		}
	})
}
