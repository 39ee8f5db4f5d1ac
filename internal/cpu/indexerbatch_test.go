package cpu

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
)

// TestLightningIndexerBatch: calls run as one batch give every selection,
// count and score bitwise what each call gives alone: decode rows over
// paged keys (16 heads, whose rows take the row tiles where the 512-bit
// kernels run, and 8), a verify-sized run, a ragged call over contiguous
// keys, and a call whose scores fill several waves; the batch's error
// names its call.
func TestLightningIndexerBatch(t *testing.T) {
	b := New(2)
	defer b.Close()
	r := rand.New(rand.NewPCG(10, 10))
	const di, topK = 32, 48
	rnd := func(n int) []float32 { return normals(r, n) }
	up := func(v []float32, dims ...int) compute.Tensor { return upload(b, v, dims...) }
	type spec struct {
		hi, l int
		pos   []int32
		cu    []int32 // two sequences of the keys: keys split at cu[1], rows at cu[0]
		page  int
	}
	specs := []spec{
		{hi: 16, l: 700, pos: []int32{699}, page: 64},
		{hi: 16, l: 90, pos: []int32{89}, page: 16},
		{hi: 8, l: 300, pos: []int32{299}, page: 64},
		{hi: 8, l: 520, pos: []int32{512, 513, 514, 515, 516, 517, 518, 519}, page: 256},
		{hi: 8, l: 400, pos: []int32{3, 100, 7, 180}, cu: []int32{2, 200}},
		{hi: 16, l: 40, pos: []int32{39}},
	}
	var ixs []*compute.IndexerArgs
	var wantIdx, wantCnt [][]int32
	var wantSc [][]float32
	read := func(a *compute.IndexerArgs) ([]int32, []int32, []float32) {
		idx, cnt, sc := make([]int32, a.Indices.Len()), make([]int32, a.Counts.Len()), make([]float32, a.Scores.Len())
		must(0, b.Read(idx, a.Indices))
		must(0, b.Read(cnt, a.Counts))
		must(0, b.Read(sc, a.Scores))
		return idx, cnt, sc
	}
	for _, s := range specs {
		n := len(s.pos)
		k := up(rnd(s.l*di), s.l, di)
		a := &compute.IndexerArgs{Q: up(rnd(n*s.hi*di), n, s.hi, di), K: k, W: up(rnd(n*s.hi), n, s.hi), QPos: uploadI32(b, s.pos), TopK: topK,
			Indices: must(b.Alloc(compute.I32, n, topK)), Counts: must(b.Alloc(compute.I32, n)), Scores: must(b.Alloc(compute.F32, n, s.l))}
		if s.cu != nil {
			a.CuSeqlensQ, a.CuSeqlensK = []int32{0, s.cu[0], int32(n)}, []int32{0, s.cu[1], int32(s.l)}
		}
		if s.page > 0 {
			a.K, a.KPages, a.PageSize, a.KLen = compute.Tensor{}, pagesFrom(t, b, k, s.page, r), s.page, s.l
		}
		require.NoError(t, b.LightningIndexer(a))
		idx, cnt, sc := read(a)
		wantIdx, wantCnt, wantSc = append(wantIdx, idx), append(wantCnt, cnt), append(wantSc, sc)
		p := *a
		p.Indices, p.Counts, p.Scores = must(b.Alloc(compute.I32, n, topK)), must(b.Alloc(compute.I32, n)), must(b.Alloc(compute.F32, n, s.l))
		ixs = append(ixs, &p)
	}
	check := func(name string, run func([]*compute.IndexerArgs) error) {
		t.Helper()
		for _, a := range ixs {
			require.NoError(t, b.Fill(a.Indices, 7))
			require.NoError(t, b.Fill(a.Scores, 7))
		}
		require.NoError(t, run(ixs), name)
		for i, a := range ixs {
			idx, cnt, sc := read(a)
			require.Equal(t, wantIdx[i], idx, "%s: call %d: selections", name, i)
			require.Equal(t, wantCnt[i], cnt, "%s: call %d: counts", name, i)
			require.True(t, bitsEqual(wantSc[i], sc), "%s: call %d: scores", name, i)
		}
	}
	check("LightningIndexerBatch", b.LightningIndexerBatch)
	check("one after another", func(c []*compute.IndexerArgs) error { return compute.LightningIndexerBatch(plainBackend{b}, c) })
	saved := indexerWave
	indexerWave = 2000 // the 520-key call alone fills waves, the decode rows share the last
	check("waves", b.LightningIndexerBatch)
	indexerWave = saved
	require.NoError(t, b.LightningIndexerBatch(nil))

	bad := *ixs[3]
	bad.TopK = 0
	err := b.LightningIndexerBatch([]*compute.IndexerArgs{ixs[0], ixs[1], ixs[2], &bad})
	require.ErrorContains(t, err, "indexer call 3 of 4")
	require.ErrorContains(t, err, "top-k 0")
	err = compute.LightningIndexerBatch(plainBackend{b}, []*compute.IndexerArgs{&bad, ixs[0]})
	require.ErrorContains(t, err, "indexer call 0 of 2")
}
