package cpu

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/compute"
)

// pagesFrom copies a contiguous cache x ([l, width...]) into pages of size
// rows, in a scrambled order of allocation so that no page follows its
// predecessor in memory; the last page is padded with garbage rows.
func pagesFrom(t *testing.T, b *Backend, x compute.Tensor, size int, r *rand.Rand) []compute.Tensor {
	l := x.Dims[0]
	width := x.Len() / l
	host := make([]float32, x.Len())
	require.NoError(t, b.Read(host, x))
	n := (l + size - 1) / size
	pages := make([]compute.Tensor, n)
	dims := append([]int{size}, x.Dims[1:x.Rank]...)
	for _, i := range r.Perm(n) {
		pages[i] = must(b.Alloc(compute.F32, dims...))
		rows := make([]float32, size*width)
		for j := range rows {
			rows[j] = float32(r.NormFloat64()) * 1e3 // rows past the end must never be read
		}
		copy(rows, host[i*size*width:min(l, (i+1)*size)*width])
		require.NoError(t, b.Write(pages[i], rows))
	}
	return pages
}

// TestPagedAttentionEqualsContiguous: attention over a paged cache gives
// bitwise the contiguous cache's output on every path (row by row,
// grouped heads, dense blocked, index-sparse; MQA and separate values;
// with and without rope), on the exact backend and on
// NewFastBF16Indexer (the bf16 logits of the 32-head sparse case).
func TestPagedAttentionEqualsContiguous(t *testing.T) {
	for _, b := range []*Backend{New(2), NewFastBF16Indexer(2)} {
		t.Run(b.Name(), func(t *testing.T) {
			defer b.Close()
			testPagedAttention(t, b)
		})
	}
}

func testPagedAttention(t *testing.T, b *Backend) {
	r := rand.New(rand.NewPCG(5, 5))
	for _, c := range []attnCase{
		{t: 1, l: 200, hq: 4, hkv: 2, dk: 16, dr: 8, dv: 12},                     // row by row, decode
		{t: 3, l: 300, hq: 8, hkv: 1, dk: 32, dr: 8, dv: 32, mqa: true},          // grouped heads, MQA
		{t: 20, l: 150, hq: 4, hkv: 2, dk: 16, dr: 8, dv: 16},                    // row by row, a short pass
		{t: 12, l: 190, hq: 8, hkv: 1, dk: 24, dv: 24, mqa: true},                // grouped heads, MQA, no rope
		{t: 2, l: 260, hq: 8, hkv: 1, dk: 16, dr: 4, dv: 16, k: 40, mqa: true},   // sparse, grouped
		{t: 5, l: 130, hq: 2, hkv: 2, dk: 8, dr: 4, dv: 8, k: 30},                // sparse, per-head lists
		{t: 2, l: 300, hq: 32, hkv: 1, dk: 64, dr: 16, dv: 64, k: 70, mqa: true}, // sparse, the logits tile
		// Passes of more than compute.InvariantRows rows: the dense blocked
		// paths (grouped where MatAccumulate runs its 512-bit tiles or a kv
		// head serves 4+ query heads) and a short sparse pass masked on them.
		{t: 40, l: 150, hq: 4, hkv: 2, dk: 16, dr: 8, dv: 16},
		{t: 40, l: 190, hq: 8, hkv: 1, dk: 24, dv: 64, mqa: false},
		{t: 40, l: 100, hq: 6, hkv: 1, dk: 16, dr: 4, dv: 16, k: 60, mqa: true, causal: true},
	} {
		for _, size := range []int{64, 128} {
			a := attnArgs(t, b, c, 11)
			require.NoError(t, b.Attention(a))
			want, wantLSE := make([]float32, a.Out.Len()), make([]float32, a.LSE.Len())
			must(0, b.Read(want, a.Out))
			must(0, b.Read(wantLSE, a.LSE))

			p := *a
			p.KPages, p.PageSize = pagesFrom(t, b, a.K, size, r), size
			if !c.mqa {
				p.VPages = pagesFrom(t, b, a.V, size, r)
			}
			if c.dr > 0 {
				p.KRopePages = pagesFrom(t, b, a.KRope, size, r)
			}
			p.K, p.V, p.KRope = compute.Tensor{}, compute.Tensor{}, compute.Tensor{}
			p.Out, p.LSE = must(b.Alloc(compute.F32, a.Out.Dims[:3]...)), must(b.Alloc(compute.F32, a.LSE.Dims[:2]...))
			require.NoError(t, b.Attention(&p), "%+v pages of %d", c, size)
			got, gotLSE := make([]float32, p.Out.Len()), make([]float32, p.LSE.Len())
			must(0, b.Read(got, p.Out))
			must(0, b.Read(gotLSE, p.LSE))
			require.Equal(t, want, got, "%+v pages of %d: output", c, size)
			require.Equal(t, wantLSE, gotLSE, "%+v pages of %d: lse", c, size)
		}
	}
	// Bad pages are errors naming them.
	a := attnArgs(t, b, attnCase{t: 1, l: 100, hq: 2, hkv: 1, dk: 8, dv: 8, mqa: true}, 3)
	p := *a
	p.K, p.V = compute.Tensor{}, compute.Tensor{}
	p.KPages, p.PageSize = pagesFrom(t, b, a.K, 64, r), 48
	assert.ErrorContains(t, b.Attention(&p), "multiple of 64")
	p.PageSize = 128
	assert.ErrorContains(t, b.Attention(&p), "page 0")
	p.PageSize = 64
	p.KVLen = 129
	assert.ErrorContains(t, b.Attention(&p), "kv length")
}

// TestPagedIndexerEqualsContiguous: the Lightning Indexer over a paged key
// cache selects exactly what it selects over the contiguous one, with
// bitwise the same scores. With 16 heads and each row in a wave of its
// own, the rows are scored from the keys as stored (kernel.IndexerRows)
// wherever 16 keys share a page, and from transposed blocks otherwise.
// It runs on the exact backend and on NewFastBF16Indexer (bf16 tiles
// where they run).
func TestPagedIndexerEqualsContiguous(t *testing.T) {
	for _, b := range []*Backend{New(2), NewFastBF16Indexer(2)} {
		t.Run(b.Name(), func(t *testing.T) {
			defer b.Close()
			testPagedIndexer(t, b)
		})
	}
}

// testPagedIndexer runs TestPagedIndexerEqualsContiguous on b (for the
// fast backend, its bf16 indexer where it runs).
func testPagedIndexer(t *testing.T, b *Backend) {
	r := rand.New(rand.NewPCG(6, 6))
	const tq, l, di, topK = 5, 1100, 16, 64
	rnd := func(n int) []float32 { return normals(r, n) }
	up := func(v []float32, dims ...int) compute.Tensor { return upload(b, v, dims...) }
	keys := rnd(l * di)
	copy(keys[700*di:701*di], keys[30*di:31*di]) // an exact tie the order must settle
	k := up(keys, l, di)
	pos := []int32{10, 500, 700, 1000, l - 1}
	var a compute.IndexerArgs
	for _, hi := range []int{4, 16} {
		a = compute.IndexerArgs{Q: up(rnd(tq*hi*di), tq, hi, di), K: k, W: up(rnd(tq*hi), tq, hi), QPos: uploadI32(b, pos), TopK: topK,
			Indices: must(b.Alloc(compute.I32, tq, topK)), Scores: must(b.Alloc(compute.F32, tq, l))}
		require.NoError(t, b.LightningIndexer(&a))
		wantIdx, wantScores := make([]int32, tq*topK), make([]float32, tq*l)
		must(0, b.Read(wantIdx, a.Indices))
		must(0, b.Read(wantScores, a.Scores))
		for _, wave := range []int{indexerWave, 1} {
			for _, size := range []int{8, 16, 64, 256} {
				p := a
				p.K, p.KPages, p.PageSize, p.KLen = compute.Tensor{}, pagesFrom(t, b, k, size, r), size, l
				p.Indices, p.Scores = must(b.Alloc(compute.I32, tq, topK)), must(b.Alloc(compute.F32, tq, l))
				saved := indexerWave
				indexerWave = wave
				require.NoError(t, b.LightningIndexer(&p))
				indexerWave = saved
				gotIdx, gotScores := make([]int32, tq*topK), make([]float32, tq*l)
				must(0, b.Read(gotIdx, p.Indices))
				must(0, b.Read(gotScores, p.Scores))
				require.Equal(t, wantIdx, gotIdx, "%d heads, waves of %d scores, pages of %d: selections", hi, wave, size)
				require.True(t, bitsEqual(wantScores, gotScores), "%d heads, waves of %d scores, pages of %d: scores", hi, wave, size)
			}
		}
	}
	p := a
	p.K, p.KPages, p.PageSize, p.KLen = compute.Tensor{}, pagesFrom(t, b, k, 64, r), 96, l
	assert.ErrorContains(t, b.LightningIndexer(&p), "power of two")
}
