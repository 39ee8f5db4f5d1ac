package dsa

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
)

// The indexer's projections beside the query's give bitwise the same
// outputs and selections: the same products, only concurrent.
func TestOverlapSameOutputs(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	cfg := testConfig()
	w, err := LoadWeights(b, cfg, randomSource(cfg, 4))
	require.NoError(t, err)
	run := func(overlap bool) ([]float32, []int32) {
		l, err := NewLayer(b, cfg, w, 32)
		require.NoError(t, err)
		l.Overlap = overlap
		l.DenseSelections = true
		c, err := NewCache(NewPool(b, cfg), 128)
		require.NoError(t, err)
		r := rand.New(rand.NewPCG(2, 2))
		var out []float32
		var sel []int32
		for _, n := range []int{20, 1, 1, 3} {
			y, _ := b.Alloc(compute.F32, n, cfg.Hidden)
			seqs := chunkOf(c, n)
			if n <= 3 {
				seqs = stepOf(c, n)
			}
			require.NoError(t, l.Forward(up(t, b, randn(r, n*cfg.Hidden), n, cfg.Hidden), seqs, y))
			out = append(out, get(b, y)...)
			sel = append(sel, getI(b, l.Indices(n))...)
		}
		return out, sel
	}
	wantOut, wantSel := run(false)
	gotOut, gotSel := run(true)
	require.Equal(t, wantOut, gotOut)
	require.Equal(t, wantSel, gotSel)
}

// BenchmarkIndexerOverlap times a DSA layer at DeepSeek-V3.2's widths
// (hidden 7168, q-LoRA 1536, 128 heads, latent 512, indexer 64 heads of
// 128) over 1 and 64 new rows, with the indexer's key and head-weight
// projections beside the query and latent ones or after them.
//
//	go test ./dsa -run '^$' -bench IndexerOverlap -benchtime 20x -count 3
func BenchmarkIndexerOverlap(b *testing.B) {
	cfg := Config{Hidden: 7168, NumHeads: 128, QLoRARank: 1536, KVLoRARank: 512, NopeDim: 128, RopeDim: 64, VDim: 128,
		RopeTheta: 10000, Indexer: &IndexerConfig{NumHeads: 64, HeadDim: 128, TopK: 2048}}
	be := cpu.New(0)
	defer be.Close()
	w, err := LoadWeights(be, cfg, randomSource(cfg, 1))
	if err != nil {
		b.Fatal(err)
	}
	for _, rows := range []int{1, 64} {
		for _, overlap := range []bool{false, true} {
			b.Run(fmt.Sprintf("rows%d/overlap=%v", rows, overlap), func(b *testing.B) {
				l, err := NewLayer(be, cfg, w, rows)
				if err != nil {
					b.Fatal(err)
				}
				l.Overlap = overlap
				x, _ := be.Alloc(compute.F32, rows, cfg.Hidden)
				xs := make([]float32, rows*cfg.Hidden)
				for i := range xs {
					xs[i] = float32(i%7) * 0.1
				}
				be.Write(x, xs)
				b.ResetTimer()
				for range b.N {
					if _, _, _, _, err := l.project(x); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
