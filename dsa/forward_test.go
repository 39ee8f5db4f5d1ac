package dsa

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
)

// TestForwardPacked: one Forward over exact runs and prefill chunks of
// several sequences gives each what it gets alone: exact rows bitwise
// (outputs, caches, selections), chunks within the conformance tolerance
// with the same selections. The chunks mix the absorbed and the MHA form,
// so the absorbed ones form runs around an MHA one.
func TestForwardPacked(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	sparse := testConfig()
	wide := testConfig()
	wide.Indexer = &IndexerConfig{NumHeads: 2, HeadDim: 16, TopK: 64}
	dense := testConfig()
	dense.Indexer = nil
	for name, cfg := range map[string]Config{"sparse": sparse, "top-64": wide, "dense MLA": dense} {
		t.Run(name, func(t *testing.T) {
			w, err := LoadWeights(b, cfg, randomSource(cfg, 5))
			require.NoError(t, err)
			lens := []int{1, 3, 20, 2, 17, 5} // the first two exact
			const exact = 2
			cu := []int32{0}
			for _, n := range lens {
				cu = append(cu, cu[len(cu)-1]+int32(n))
			}
			total := int(cu[len(lens)])
			l, err := NewLayer(b, cfg, w, total)
			require.NoError(t, err)
			l.DenseSelections = true // the selections are compared too
			r := rand.New(rand.NewPCG(6, 6))
			xs := randn(r, total*cfg.Hidden)
			warm := func() []*Cache {
				var cs []*Cache
				for i := range lens {
					c, err := NewCache(NewPool(b, cfg), 128)
					require.NoError(t, err)
					n := 1 + i%3
					y, _ := b.Alloc(compute.F32, n, cfg.Hidden)
					require.NoError(t, l.Forward(up(t, b, randn(rand.New(rand.NewPCG(uint64(i), 8)), n*cfg.Hidden), n, cfg.Hidden), chunkOf(c, n), y))
					cs = append(cs, c)
				}
				return cs
			}
			together, alone := warm(), warm()
			y, _ := b.Alloc(compute.F32, total, cfg.Hidden)
			require.NoError(t, l.Forward(up(t, b, xs, total, cfg.Hidden), &Seqs{Cu: cu, Caches: together, Exact: exact}, y))
			got := get(b, y)
			var gotIdx []int32
			if cfg.Indexer != nil {
				gotIdx = getI(b, l.Indices(total))
			}
			k := 0
			if cfg.Indexer != nil {
				k = cfg.Indexer.TopK
			}
			d := cfg.Hidden
			for i, n := range lens {
				r0, r1 := int(cu[i]), int(cu[i+1])
				yi, _ := b.Alloc(compute.F32, n, d)
				one := chunkOf(alone[i], n)
				if i < exact {
					one = stepOf(alone[i], n)
				}
				require.NoError(t, l.Forward(up(t, b, xs[r0*d:r1*d], n, d), one, yi))
				want := get(b, yi)
				if k > 0 {
					assert.Equal(t, getI(b, l.Indices(n)), gotIdx[r0*k:r1*k], "sequence %d selections", i)
				}
				c1, c2 := alone[i], together[i]
				require.Equal(t, c1.Len, c2.Len)
				if i < exact {
					require.Equal(t, want, got[r0*d:r1*d], "exact sequence %d output", i)
					require.Equal(t, rows(t, c1), rows(t, c2), "exact sequence %d cache", i)
					continue
				}
				assert.InDeltaSlice(t, want, got[r0*d:r1*d], 1e-4, "chunk %d output", i)
				assert.InDeltaSlice(t, rows(t, c1), rows(t, c2), 1e-5, "chunk %d cache", i)
			}
		})
	}
}

func randn(r *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return v
}

func up(t *testing.T, b compute.Backend, v []float32, dims ...int) compute.Tensor {
	x, err := b.Alloc(compute.F32, dims...)
	require.NoError(t, err)
	require.NoError(t, b.Write(x, v))
	return x
}

func get(b compute.Backend, x compute.Tensor) []float32 {
	v := make([]float32, x.Len())
	b.Read(v, x)
	return v
}

func getI(b compute.Backend, x compute.Tensor) []int32 {
	v := make([]int32, x.Len())
	b.Read(v, x)
	return v
}

// rows reads every position of c (ReadRows' layout).
func rows(t *testing.T, c *Cache) []float32 {
	v := make([]float32, c.Len*c.RowLen())
	require.NoError(t, c.ReadRows(v, 0, c.Len))
	return v
}
