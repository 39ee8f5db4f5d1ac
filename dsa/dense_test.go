package dsa

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
)

// countingBackend counts the indexer calls and products it passes on.
type countingBackend struct {
	compute.Backend
	indexer, matmuls int
}

func (b *countingBackend) LightningIndexer(a *compute.IndexerArgs) error {
	b.indexer++
	return b.Backend.LightningIndexer(a)
}

func (b *countingBackend) MatMul(dst, x, w compute.Tensor) error {
	b.matmuls++
	return b.Backend.MatMul(dst, x, w)
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
		base := cpu.New(1)
		defer base.Close()
		b := &countingBackend{Backend: base}
		w, err := LoadWeights(b, cfg, randomSource(cfg, 5))
		require.NoError(t, err)
		l, err := NewLayer(b, cfg, w, 8)
		require.NoError(t, err)
		l.DenseSelections = dense
		var cs [2]*Cache
		for i := range cs {
			cs[i], err = NewCache(NewPool(b, cfg), 64)
			require.NoError(t, err)
		}
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
