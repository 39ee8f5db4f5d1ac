package dsa

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
)

// countingBackend counts the indexer calls and products it passes on.
type countingBackend struct {
	compute.Backend
	indexer, matmuls int
	indexerRows      int // the query rows of the indexer calls
}

func (b *countingBackend) LightningIndexer(a *compute.IndexerArgs) error {
	b.indexer++
	b.indexerRows += a.Q.Dim(0)
	return b.Backend.LightningIndexer(a)
}

func (b *countingBackend) MatMul(dst, x, w compute.Tensor) error {
	b.matmuls++
	return b.Backend.MatMul(dst, x, w)
}

// countingLayer makes a layer of cfg with random weights (seed) on a
// one-goroutine backend that counts its indexer calls and products, with
// DenseSelections as dense, and caches fresh caches of 64 positions; the
// backend closes when the test ends.
func countingLayer(t *testing.T, cfg Config, seed uint64, dense bool, caches int) (*countingBackend, *Layer, []*Cache) {
	t.Helper()
	base := cpu.New(1)
	t.Cleanup(func() { base.Close() })
	b := &countingBackend{Backend: base}
	w, err := LoadWeights(b, cfg, randomSource(cfg, seed))
	require.NoError(t, err)
	l, err := NewLayer(b, cfg, w, 8)
	require.NoError(t, err)
	l.DenseSelections = dense
	cs := make([]*Cache, caches)
	for i := range cs {
		cs[i], err = NewCache(NewPool(b, cfg), 64)
		require.NoError(t, err)
	}
	return b, l, cs
}

// TestDenseRowsSkipIndexer: without DenseSelections, a run or chunk whose
// rows have all seen at most TopK positions skips the indexer, and a pass
// none of whose rows selects skips wq_b and weights_proj; the outputs are
// bitwise those of a layer that selects for every row, since such rows
// attend densely either way. The passes: chunks, single steps and exact
// runs of one sequence below, across and past TopK, then a batch of a
// sequence below TopK beside one past it.
func TestDenseRowsSkipIndexer(t *testing.T) {
	cfg := testConfig()
	ix := *cfg.Indexer
	ix.TopK = 8
	cfg.Indexer = &ix
	passes := []struct {
		rows  []int // per sequence: a is 0, b is 1
		exact bool
		want  int // indexer calls of the skipping layer
	}{
		{[]int{3}, false, 0}, {[]int{1}, true, 0}, {[]int{1}, true, 0}, {[]int{2}, true, 0},
		{[]int{3}, true, 1}, {[]int{2}, false, 1}, {[]int{1}, true, 1},
		{[]int{1, 1}, true, 1}, // a new sequence below TopK beside the first
	}
	type result struct {
		out              []float32
		indexer, matmuls int
	}
	run := func(dense bool) result {
		b, l, cs := countingLayer(t, cfg, 5, dense, 2)
		r := rand.New(rand.NewPCG(5, 5))
		var res result
		b.indexer, b.matmuls = 0, 0
		for pi, p := range passes {
			s := &Seqs{Cu: []int32{0}}
			n := 0
			for i, k := range p.rows {
				// The second sequence of the last pass is new.
				c := cs[0]
				if i == 1 {
					c = cs[1]
				}
				s.Caches = append(s.Caches, c)
				n += k
				s.Cu = append(s.Cu, int32(n))
			}
			if p.exact {
				s.Exact = len(p.rows)
			}
			before := b.indexer
			y, _ := b.Alloc(compute.F32, n, cfg.Hidden)
			require.NoError(t, l.Forward(up(t, b, randn(r, n*cfg.Hidden), n, cfg.Hidden), s, y), "pass %d", pi)
			res.out = append(res.out, get(b, y)...)
			if !dense {
				require.Equal(t, p.want, b.indexer-before, "pass %d: indexer calls", pi)
			}
		}
		res.indexer, res.matmuls = b.indexer, b.matmuls
		return res
	}
	all, skip := run(true), run(false)
	require.Equal(t, all.out, skip.out, "outputs")
	require.Equal(t, len(passes)+1, all.indexer, "indexer calls with DenseSelections: every run (the last pass has two)")
	require.Equal(t, all.matmuls-8, skip.matmuls, fmt.Sprintf("products: the four passes that select nothing skip wq_b and weights_proj (%d with DenseSelections)", all.matmuls))
}

// TestChunkRowsSkipIndexer: a prefill chunk that crosses TopK gives its
// rows that have seen at most TopK every position they have seen as their
// list without scoring them; the outputs are bitwise those of a layer
// with DenseSelections (which scores those rows after they attend, for
// Indices: its selections there hold every position too). Chunks: from
// position 0 (four of seven rows skip), from 2 (two of five), from 3 (one
// of six), then steps past TopK, whose selections read the cache the
// chunks wrote.
func TestChunkRowsSkipIndexer(t *testing.T) {
	cfg := testConfig()
	ix := *cfg.Indexer
	ix.TopK = 4
	cfg.Indexer = &ix
	type pass struct {
		seq, rows int
		exact     bool
		scored    int // indexer rows of the skipping layer
	}
	passes := []pass{
		{0, 7, false, 3},
		{1, 2, false, 0}, {1, 5, false, 3},
		{2, 3, false, 0}, {2, 6, false, 5},
		{0, 1, true, 1}, {1, 2, true, 2}, {2, 1, true, 1},
	}
	run := func(dense bool) ([]float32, [][]int32) {
		b, l, cs := countingLayer(t, cfg, 6, dense, 3)
		r := rand.New(rand.NewPCG(6, 6))
		var out []float32
		var sels [][]int32
		for pi, p := range passes {
			s := &Seqs{Cu: []int32{0, int32(p.rows)}, Caches: []*Cache{cs[p.seq]}}
			if p.exact {
				s.Exact = 1
			}
			before := b.indexerRows
			y, _ := b.Alloc(compute.F32, p.rows, cfg.Hidden)
			require.NoError(t, l.Forward(up(t, b, randn(r, p.rows*cfg.Hidden), p.rows, cfg.Hidden), s, y), "pass %d", pi)
			out = append(out, get(b, y)...)
			if dense {
				sel := make([]int32, p.rows*ix.TopK)
				require.NoError(t, b.Read(&sel, l.Indices(p.rows)))
				sels = append(sels, sel)
				require.Equal(t, p.rows, b.indexerRows-before, "pass %d: rows scored with DenseSelections", pi)
			} else {
				require.Equal(t, p.scored, b.indexerRows-before, "pass %d: rows scored", pi)
			}
		}
		return out, sels
	}
	all, sels := run(true)
	skip, _ := run(false)
	require.Equal(t, all, skip, "outputs")
	// The first chunk's rows 0-3 have seen 1-4 positions: the indexer's
	// lists there hold each of them once.
	for r := range 4 {
		got := slices.Clone(sels[0][r*ix.TopK : (r+1)*ix.TopK])
		slices.Sort(got)
		want := []int32{-1, -1, -1, -1}
		for j := 0; j <= r; j++ {
			want[ix.TopK-r-1+j] = int32(j)
		}
		require.Equal(t, want, got, "row %d's selection", r)
	}

	// The same seven rows cut as four (which attend densely, seeing at
	// most TopK) and three: within float32 rounding of the one chunk.
	base := cpu.New(1)
	defer base.Close()
	w, err := LoadWeights(base, cfg, randomSource(cfg, 6))
	require.NoError(t, err)
	l, err := NewLayer(base, cfg, w, 8)
	require.NoError(t, err)
	x := randn(rand.New(rand.NewPCG(7, 7)), 7*cfg.Hidden)
	// forward returns the outputs and the first pass's first four rows of
	// Indices.
	forward := func(cuts ...int) ([]float32, []int32) {
		c, err := NewCache(NewPool(base, cfg), 64)
		require.NoError(t, err)
		var out []float32
		first := make([]int32, 4*ix.TopK)
		r0 := 0
		for i, n := range cuts {
			y, _ := base.Alloc(compute.F32, n, cfg.Hidden)
			require.NoError(t, l.Forward(up(t, base, x[r0*cfg.Hidden:(r0+n)*cfg.Hidden], n, cfg.Hidden), &Seqs{Cu: []int32{0, int32(n)}, Caches: []*Cache{c}}, y))
			out = append(out, get(base, y)...)
			if i == 0 {
				require.NoError(t, base.Read(&first, l.Indices(n).Rows(0, 4)))
			}
			r0 += n
		}
		return out, first
	}
	two, _ := forward(4, 3)
	one, _ := forward(7)
	require.InDeltaSlice(t, two, one, 1e-5, "one chunk against two")
	// With DenseSelections the skipped rows' selections are the indexer's,
	// in its order: those the rows get in a chunk of their own.
	l.DenseSelections = true
	_, want := forward(4, 3)
	_, got := forward(7)
	require.Equal(t, want, got, "the first rows' selections")
}
