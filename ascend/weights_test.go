package ascend

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
)

// A BF16 weight prepared in FRACTAL_NZ gives MatMul the products of the
// row-major weight, over shapes that are and are not multiples of the
// fractal; only MatMul may read it; F32 weights stay as they are.
func TestPrepareMatMul(t *testing.T) {
	eachDriver(t, 16<<20, func(t *testing.T, a *Backend) {
		c := cpu.New(1)
		defer c.Close()
		rng := rand.New(rand.NewPCG(41, 42))
		for _, sh := range [][3]int{{3, 37, 21}, {5, 32, 48}, {1, 16, 16}, {4, 7, 70}} {
			M, N, K := sh[0], sh[1], sh[2]
			wa, wc := both(t, a, c, compute.BF16, randF32(rng, N*K), N, K)
			xa, xc := both(t, a, c, compute.F32, randF32(rng, M*K), M, K)
			p, err := a.PrepareMatMul(wa)
			require.NoError(t, err)
			require.NotEqual(t, wa.Mem, p.Mem, "a new buffer in NZ")
			require.Equal(t, wa.Dims, p.Dims, "the seam's shape [N, K] is kept")
			oa, err := a.Alloc(compute.F32, M, N)
			require.NoError(t, err)
			oc, err := c.Alloc(compute.F32, M, N)
			require.NoError(t, err)
			require.NoError(t, a.MatMul(oa, xa, p))
			require.NoError(t, c.MatMul(oc, xc, wc))
			closeRel(t, read(t, c, oc), read(t, a, oa), 1e-5, 1e-5, "matmul with an NZ weight", sh)

			// Only MatMul reads it.
			dst, err := a.Alloc(compute.BF16, N, K)
			require.NoError(t, err)
			err = a.Copy(dst, p)
			require.ErrorIs(t, err, compute.ErrShape)
			assert.Contains(t, err.Error(), "FRACTAL_NZ")
			if N > 1 {
				err = a.MatMul(oa.Reshape(M, N).Rows(0, M), xa, p.Rows(0, 1))
				require.Error(t, err, "a view of rows of an NZ weight")
			}
			ids, err := a.FromHost(compute.I32, compute.I32, i32bytes([]int32{0}), 1)
			require.NoError(t, err)
			err = a.Embedding(oa.Rows(0, 1), p, ids)
			require.ErrorIs(t, err, compute.ErrShape, "an embedding lookup in an NZ weight")
			again, err := a.PrepareMatMul(p)
			require.NoError(t, err)
			require.Equal(t, p, again, "preparing twice changes nothing")
		}
		f, _ := both(t, a, c, compute.F32, randF32(rng, 6), 2, 3)
		p, err := a.PrepareMatMul(f)
		require.NoError(t, err)
		require.Equal(t, f, p, "an F32 weight stays ND")
	})
}
