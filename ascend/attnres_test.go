package ascend

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
)

// Both AttnRes phases' compositions against the pure-Go backend: prepare
// over 0 to 3 blocks, then update without a partial, with a first delta
// and with a second one.
func TestAttnRes(t *testing.T) {
	eachDriver(t, 16<<20, func(t *testing.T, a *Backend) {
		c := cpu.New(1)
		defer c.Close()
		rng := rand.New(rand.NewPCG(61, 62))
		const S, T, D = 3, 4, 16
		for nb := range 4 {
			alloc := func(shape ...int) (compute.Tensor, compute.Tensor) {
				x, err := a.Alloc(compute.F32, shape...)
				require.NoError(t, err)
				y, err := c.Alloc(compute.F32, shape...)
				require.NoError(t, err)
				return x, y
			}
			var ba, bc []compute.Tensor
			for range nb {
				x, y := both(t, a, c, compute.F32, randF32(rng, T*D), T, D)
				ba, bc = append(ba, x), append(bc, y)
			}
			qa, qc := both(t, a, c, compute.F32, randF32(rng, S*D), S, D)
			na, nc := alloc(S, T, D)
			ma, mc := alloc(S, T)
			sa, sc := alloc(S, T)
			require.NoError(t, a.AttnResPrepare(&compute.AttnResPrepareArgs{Blocks: ba, Queries: qa, Eps: 1e-6, Num: na, Max: ma, Sum: sa}))
			require.NoError(t, c.AttnResPrepare(&compute.AttnResPrepareArgs{Blocks: bc, Queries: qc, Eps: 1e-6, Num: nc, Max: mc, Sum: sc}))
			closeRel(t, read(t, c, nc), read(t, a, na), 1e-6, 1e-5, "num", nb)
			closeRel(t, read(t, c, mc), read(t, a, ma), 1e-6, 1e-5, "max", nb)
			closeRel(t, read(t, c, sc), read(t, a, sa), 1e-6, 1e-5, "sum", nb)

			pa, pc := alloc(T, D)
			ha, hc := alloc(T, D)
			ua := &compute.AttnResUpdateArgs{Partial: pa, Query: qa.Rows(0, 1).Reshape(D), Eps: 1e-6,
				Num: na.Rows(1, 2).Reshape(T, D), Max: ma.Rows(1, 2).Reshape(T), Sum: sa.Rows(1, 2).Reshape(T), H: ha}
			uc := &compute.AttnResUpdateArgs{Partial: pc, Query: qc.Rows(0, 1).Reshape(D), Eps: 1e-6,
				Num: nc.Rows(1, 2).Reshape(T, D), Max: mc.Rows(1, 2).Reshape(T), Sum: sc.Rows(1, 2).Reshape(T), H: hc}
			// The update's pre-norm: asked for on the second step (with a
			// weight) and the third (without).
			oa, oc := alloc(T, D)
			wa, wc := both(t, a, c, compute.F32, randF32(rng, D), D)
			for step := range 3 {
				if step > 0 { // a sublayer's output joins the partial
					ua.Delta, uc.Delta = both(t, a, c, compute.F32, randF32(rng, T*D), T, D)
				} else if nb == 0 {
					continue // nothing to attend to: the pure-Go backend's error case
				}
				switch step {
				case 1:
					ua.Normed, ua.NormWeight, ua.NormEps = oa, wa, 1e-5
					uc.Normed, uc.NormWeight, uc.NormEps = oc, wc, 1e-5
				case 2:
					ua.NormWeight, uc.NormWeight = compute.Tensor{}, compute.Tensor{}
				}
				require.NoError(t, a.AttnResUpdate(ua))
				require.NoError(t, c.AttnResUpdate(uc))
				require.Equal(t, uc.HasPartial, ua.HasPartial)
				closeRel(t, read(t, c, hc), read(t, a, ha), 1e-5, 1e-4, "h", nb, step)
				closeRel(t, read(t, c, pc), read(t, a, pa), 0, 0, "partial", nb, step)
				if step > 0 {
					closeRel(t, read(t, c, oc), read(t, a, oa), 1e-5, 1e-4, "pre-norm", nb, step)
				}
			}
		}
	})
}
