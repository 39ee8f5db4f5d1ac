package ascend

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/compute/computetest"
	"k3/internal/floatx"
)

// Reads and writes are typed as the seam says, on both drivers, and a
// prepared FRACTAL_NZ weight reads in row-major order.
func TestTypedReadWrite(t *testing.T) {
	eachDriver(t, 8<<20, func(t *testing.T, b *Backend) {
		computetest.TypedReadWrite(t, b)

		const N, K = 20, 36
		wv := randF32(rand.New(rand.NewPCG(95, 96)), N*K)
		w, err := b.FromHost(compute.BF16, compute.F32, f32bytes(wv), N, K)
		require.NoError(t, err)
		w, err = b.PrepareMatMul(w)
		require.NoError(t, err)
		d, err := bufOf(w)
		require.NoError(t, err)
		require.NotNil(t, d.nz, "the weight is stored in FRACTAL_NZ")
		wGot := make([]float32, N*K)
		require.NoError(t, b.Read(wGot, w))
		wBits := make([]uint16, N*K)
		require.NoError(t, b.Read(wBits, w))
		for i, f := range wv {
			h := floatx.BF16(f)
			require.Equal(t, h, wBits[i], "prepared weight element %d", i)
			require.Equal(t, floatx.FromBF16(h), wGot[i], "prepared weight element %d", i)
		}
		require.Error(t, b.Write(w, wv), "a prepared weight is written only by PrepareMatMul")
	})
}

// KDAChunk and CausalConv over a pool of states equal the calls over one
// state per sequence, and ScatterRows puts rows where its indices say,
// on both drivers.
func TestStatePools(t *testing.T) {
	eachDriver(t, 8<<20, func(t *testing.T, b *Backend) {
		computetest.StatePools(t, b)
		computetest.Scatter(t, b)
	})
}

// Attention and the indexer over pools and a page table (gathered by
// aclnnIndexSelect) equal the calls over page lists, on both drivers.
func TestPagePools(t *testing.T) {
	eachDriver(t, 16<<20, func(t *testing.T, b *Backend) { computetest.PagePools(t, b) })
}

// Degenerate pooled operands are errors, not panics, on both drivers.
func TestPagePoolsDegenerate(t *testing.T) {
	eachDriver(t, 8<<20, func(t *testing.T, b *Backend) {
		pool, _ := b.Alloc(compute.F32, 64, 1, 1)
		table, _ := b.Alloc(compute.I32, 1)
		pos, _ := b.Alloc(compute.I32, 1)
		iq, _ := b.Alloc(compute.F32, 1, 1, 0)
		w, _ := b.Alloc(compute.F32, 1, 1)
		idx, _ := b.Alloc(compute.I32, 1, 1)
		require.Error(t, b.LightningIndexer(&compute.IndexerArgs{Q: iq, W: w, KPool: pool, PageTable: table, PageSize: 64, KLen: 1, QPos: pos, TopK: 1, Indices: idx}))
		q, _ := b.Alloc(compute.F32, 1, 1, 0)
		out, _ := b.Alloc(compute.F32, 1, 1, 0)
		require.Error(t, b.Attention(&compute.AttnArgs{Q: q, KPool: pool, PageTable: table, PageSize: 64, QPos: pos, KVLen: 1, Causal: true, Out: out}))
	})
}
