package ascend

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
)

// The Lightning Indexer's composition against the pure-Go backend: the
// same positions in the same order, -1 past each row's count, the same
// counts and scores; packed sequences and a paged cache.
func TestLightningIndexer(t *testing.T) {
	eachDriver(t, 32<<20, func(t *testing.T, a *Backend) {
		c := cpu.New(1)
		defer c.Close()
		rng := rand.New(rand.NewPCG(111, 112))
		const HI, DI, K, W = 3, 16, 5, 12
		for _, paged := range []bool{false, true} {
			cuQ, cuK, qpos := []int32{0, 3, 5}, []int32{0, 9, 12}, []int32{0, 4, 8, 1, 2}
			if paged {
				cuQ, cuK, qpos = nil, nil, []int32{3, 10, 1}
			}
			T := len(qpos)
			L := 12
			qa, qc := both(t, a, c, compute.F32, randF32(rng, T*HI*DI), T, HI, DI)
			wa, wc := both(t, a, c, compute.F32, randF32(rng, T*HI), T, HI)
			args := func(be compute.Backend, q, w compute.Tensor, keys []float32) *compute.IndexerArgs {
				x := &compute.IndexerArgs{Q: q, W: w, QPos: positions(t, be, qpos), CuSeqlensQ: cuQ, CuSeqlensK: cuK, TopK: K}
				if paged {
					const page = 8
					for p := 0; p*page < L; p++ {
						chunk := make([]float32, page*DI)
						copy(chunk, keys[p*page*DI:min((p+1)*page, L)*DI])
						pt, err := be.FromHost(compute.F32, compute.F32, f32bytes(chunk), page, DI)
						require.NoError(t, err)
						x.KPages = append(x.KPages, pt)
					}
					x.PageSize, x.KLen = page, L
				} else {
					k, err := be.FromHost(compute.F32, compute.F32, f32bytes(keys), L, DI)
					require.NoError(t, err)
					x.K = k
				}
				var err error
				x.Indices, err = be.Alloc(compute.I32, T, K)
				require.NoError(t, err)
				x.Counts, err = be.Alloc(compute.I32, T)
				require.NoError(t, err)
				x.Scores, err = be.Alloc(compute.F32, T, W)
				require.NoError(t, err)
				return x
			}
			keys := randF32(rng, L*DI)
			xa, xc := args(a, qa, wa, keys), args(c, qc, wc, keys)
			require.NoError(t, a.LightningIndexer(xa))
			require.NoError(t, c.LightningIndexer(xc))
			ints := func(be compute.Backend, x compute.Tensor) []int32 {
				v := make([]int32, x.Len())
				require.NoError(t, be.Read(&v, x))
				return v
			}
			require.Equal(t, ints(c, xc.Indices), ints(a, xa.Indices), "indices, paged %v", paged)
			require.Equal(t, ints(c, xc.Counts), ints(a, xa.Counts), "counts, paged %v", paged)
			closeRel(t, read(t, c, xc.Scores), read(t, a, xa.Scores), 1e-5, 1e-5, "scores, paged", paged)
		}
	})
}
