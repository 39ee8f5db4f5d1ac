package ascend

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
)

// A call on the same operands launches the cached executor again (no
// phase 1) with the same results; another view, attribute or weight
// prepares a new one; a span freed and reused by a tensor of the same
// shape is the same operation.
func TestExecutorReuse(t *testing.T) {
	eachDriver(t, 8<<20, func(t *testing.T, a *Backend) {
		c := cpu.New(1)
		defer c.Close()
		rng := rand.New(rand.NewPCG(51, 52))
		const M, N, K = 3, 5, 8
		wa, wc := both(t, a, c, compute.F32, randF32(rng, N*K), N, K)
		out, err := a.Alloc(compute.F32, M, N)
		require.NoError(t, err)
		want, err := c.Alloc(compute.F32, M, N)
		require.NoError(t, err)
		count := func() [2]int64 { p, r := a.Executors(); return [2]int64{p, r} }
		start := count()
		for i := range 3 {
			v := randF32(rng, M*K)
			xa, xc := both(t, a, c, compute.F32, v, M, K)
			require.NoError(t, a.MatMul(out, xa, wa))
			require.NoError(t, c.MatMul(want, xc, wc))
			closeRel(t, read(t, c, want), read(t, a, out), 1e-6, 1e-5, "matmul", i)
			a.Free(xa) // the next x takes the same span: the same operation
		}
		require.Equal(t, [2]int64{start[0] + 1, start[1] + 2}, count(), "one executor prepared, launched three times")

		require.NoError(t, a.RMSNorm(out, out, compute.Tensor{}, 1e-5))
		require.NoError(t, a.RMSNorm(out, out, compute.Tensor{}, 1e-6))
		require.NoError(t, a.RMSNorm(out, out, compute.Tensor{}, 1e-5))
		got := count()
		require.Equal(t, int64(2), got[0]-start[0]-1, "eps is part of the key")
		require.Equal(t, int64(1), got[1]-start[1]-2)

		require.NoError(t, a.MatMul(out.Rows(0, 2), both1(t, a, rng, 2, K), wa))
		require.Equal(t, got[0]+1, count()[0], "another view prepares another executor")
	})
}

func both1(t *testing.T, a *Backend, rng *rand.Rand, rows, k int) compute.Tensor {
	x, err := a.FromHost(compute.F32, compute.F32, f32bytes(randF32(rng, rows*k)), rows, k)
	require.NoError(t, err)
	return x
}
