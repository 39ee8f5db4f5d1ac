package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/kernel"
)

// TestLightningIndexer checks a ragged call (a prefill chunk, decode rows
// and a short run over three sequences) against a float64 reference:
// every score within tolerance and every selection equal to the
// reference's, order included, wherever the reference separates its k-th
// and next score by more than the tolerance. It then checks that a row's
// results do not depend on the rows scored beside it: each row alone,
// and the call cut into waves of one row, give bitwise the same indices
// and scores.
//
// With 16 and 32 heads (the second taking the row tile's 32-head form),
// where the CPU has the 512-bit kernels, a row alone in its
// sequence (the decode row; every row alone and in waves of one row) is
// scored from the keys as stored (kernel.IndexerRows) and the chunk's rows
// from transposed blocks, so the bitwise checks hold the two tiles to the
// same bits; the last, partial block of a sequence takes the transposed
// block either way.
func TestLightningIndexer(t *testing.T) {
	for _, hi := range []int{8, 16, 32} {
		t.Run(fmt.Sprintf("heads=%d", hi), func(t *testing.T) {
			b := New(2)
			defer b.Close()
			testLightningIndexer(t, b, hi, func(v float32) float64 { return float64(v) })
		})
	}
}

// TestLightningIndexerBF16 is TestLightningIndexer on NewFastBF16Indexer:
// where it scores in bf16 (16 heads, where the CPU pays), against the
// float64 scores of the operands rounded as it rounds them, and the rows
// tile (kernel.IndexerRowsBF16) held to the block tile's bits; elsewhere
// (8 heads: too few for the rows tile) against the exact scores.
func TestLightningIndexerBF16(t *testing.T) {
	for _, hi := range []int{8, 16} {
		t.Run(fmt.Sprintf("heads=%d", hi), func(t *testing.T) {
			b := NewFastBF16Indexer(2)
			defer b.Close()
			round := func(v float32) float64 { return float64(v) }
			if b.fastDot() && kernel.IndexerRowsBF16Fast(hi, 64) {
				round = func(v float32) float64 {
					var h [1]uint16
					kernel.RoundBF16DAZ(h[:], []float32{v})
					return float64(math.Float32frombits(uint32(h[0]) << 16))
				}
			} else {
				t.Log("the bf16 dot product does not pay here: the indexer stays exact")
			}
			testLightningIndexer(t, b, hi, round)
		})
	}
}

// testLightningIndexer runs TestLightningIndexer's checks on b, whose
// scores the float64 reference computes over operands rounded by round.
func testLightningIndexer(t *testing.T, b *Backend, hi int, round func(float32) float64) {
	r := rand.New(rand.NewPCG(8, 9))
	const di, topK = 64, 32
	lens := []int{700, 130, 64}                  // keys per sequence
	qpos := [][]int32{{600, 601, 602, 603, 604}, // a chunk
		{129},          // a decode row
		{0, 1, 40, 63}} // a short run from the start
	var cuQ, cuK []int32
	var pos []int32
	cuQ, cuK = append(cuQ, 0), append(cuK, 0)
	for s := range lens {
		pos = append(pos, qpos[s]...)
		cuQ = append(cuQ, cuQ[s]+int32(len(qpos[s])))
		cuK = append(cuK, cuK[s]+int32(lens[s]))
	}
	tq, l := len(pos), int(cuK[len(lens)])
	rnd := func(n int) []float32 { return normals(r, n) }
	q, keys, w := rnd(tq*hi*di), rnd(l*di), rnd(tq*hi)
	copy(keys[300*di:301*di], keys[20*di:21*di]) // an exact tie
	up := func(v []float32, dims ...int) compute.Tensor { return upload(b, v, dims...) }
	call := func(rows []int) ([]int32, []int32, []float32) {
		// rows of one sequence each, or all rows
		var cq, ck []int32
		var p []int32
		var qs, ws []float32
		cq, ck = append(cq, 0), append(ck, 0)
		for s := range lens {
			n := 0
			for _, row := range rows {
				if row >= int(cuQ[s]) && row < int(cuQ[s+1]) {
					p = append(p, pos[row])
					qs = append(qs, q[row*hi*di:(row+1)*hi*di]...)
					ws = append(ws, w[row*hi:(row+1)*hi]...)
					n++
				}
			}
			cq, ck = append(cq, cq[s]+int32(n)), append(ck, ck[s]+int32(lens[s]))
		}
		n := len(p)
		a := compute.IndexerArgs{Q: up(qs, n, hi, di), K: up(keys, l, di), W: up(ws, n, hi), QPos: uploadI32(b, p),
			CuSeqlensQ: cq, CuSeqlensK: ck, TopK: topK,
			Indices: must(b.Alloc(compute.I32, n, topK)), Counts: must(b.Alloc(compute.I32, n)),
			Scores: must(b.Alloc(compute.F32, n, 800))}
		require.NoError(t, b.LightningIndexer(&a))
		idx, cnt, sc := make([]int32, n*topK), make([]int32, n), make([]float32, n*800)
		must(0, b.Read(idx, a.Indices))
		must(0, b.Read(cnt, a.Counts))
		must(0, b.Read(sc, a.Scores))
		return idx, cnt, sc
	}
	all := make([]int, tq)
	for i := range all {
		all[i] = i
	}
	idx, cnt, sc := call(all)
	checked := 0
	for row := range tq {
		s := 0
		for int(cuQ[s+1]) <= row {
			s++
		}
		vis := int(pos[row]) + 1
		ref := make([]float64, vis)
		scale := 0.0
		for h := range hi {
			scale += math.Abs(float64(w[row*hi+h])) * math.Sqrt(di) * 4
		}
		for k := range vis {
			key := keys[(int(cuK[s])+k)*di:]
			for h := range hi {
				var dot float64
				for d := range di {
					dot += round(q[(row*hi+h)*di+d]) * round(key[d])
				}
				ref[k] += float64(w[row*hi+h]) * math.Max(dot, 0)
			}
		}
		tol := 1e-6 * scale
		for k := range vis {
			require.InDelta(t, ref[k], float64(sc[row*800+k]), tol, "row %d key %d", row, k)
		}
		for k := vis; k < 800; k++ {
			require.True(t, math.IsInf(float64(sc[row*800+k]), -1), "row %d key %d past the visible ones", row, k)
		}
		n := min(topK, vis)
		require.Equal(t, int32(n), cnt[row], "row %d count", row)
		order := make([]int, vis)
		for i := range order {
			order[i] = i
		}
		sort.SliceStable(order, func(i, j int) bool { return ref[order[i]] > ref[order[j]] })
		got := idx[row*topK : row*topK+n]
		for i := n; i < topK; i++ {
			require.Equal(t, int32(-1), idx[row*topK+i], "row %d pad %d", row, i)
		}
		// The selection is settled where the first n+1 ranks are apart.
		separated := true
		for i := 0; i < n && i+1 < vis; i++ {
			separated = separated && ref[order[i]]-ref[order[i+1]] > 2*tol
		}
		if separated {
			want := make([]int32, n)
			for i := range n {
				want[i] = int32(order[i])
			}
			require.Equal(t, want, got, "row %d selection", row)
			checked++
		}
	}
	require.GreaterOrEqual(t, checked, tq/2, "rows whose selection the reference settles")
	// Row by row, and in waves of one row: bitwise the same.
	for row := range tq {
		i1, c1, s1 := call([]int{row})
		require.Equal(t, idx[row*topK:(row+1)*topK], i1, "row %d alone: indices", row)
		require.Equal(t, cnt[row], c1[0], "row %d alone: count", row)
		require.True(t, bitsEqual(sc[row*800:(row+1)*800], s1), "row %d alone: scores", row)
	}
	defer func(v int) { indexerWave = v }(indexerWave)
	indexerWave = 1
	i2, c2, s2 := call(all)
	require.Equal(t, idx, i2, "waves of one row: indices")
	require.Equal(t, cnt, c2, "waves of one row: counts")
	require.True(t, bitsEqual(sc, s2), "waves of one row: scores")
}

func bitsEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// BenchmarkLightningIndexer times one call: over a 100M-preset-shaped
// indexer (8 heads of 64, top 256) at 2,048 cached keys, a decode row and
// a 64-row prefill chunk; over K3.1 Pro's (64 heads of 128, top 2,048),
// a decode row at 65,536 keys and a 64-row chunk at 4,096. GFLOP/s counts
// the head products of every key, the causally hidden ones included. Each
// case runs on the exact backend and on NewFastBF16Indexer (bf16 only
// where the bf16 dot product pays and at 64 heads: 8 are too few).
func BenchmarkLightningIndexer(b *testing.B) {
	for _, be := range []*Backend{New(0), NewFastBF16Indexer(0)} {
		name := "exact"
		if be.bf16Idx && be.fastDot() {
			name = "bf16"
		}
		b.Run(name, func(b *testing.B) {
			defer be.Close()
			benchmarkLightningIndexer(b, be)
		})
	}
}

func benchmarkLightningIndexer(b *testing.B, be *Backend) {
	r := rand.New(rand.NewPCG(1, 1))
	rnd := func(n int) []float32 { return normals(r, n) }
	up := func(v []float32, dims ...int) compute.Tensor { return upload(be, v, dims...) }
	for _, c := range []struct{ hi, di, topK, l, rows int }{
		{8, 64, 256, 2048, 1}, {8, 64, 256, 2048, 64}, {64, 128, 2048, 65536, 1}, {64, 128, 2048, 4096, 64},
	} {
		b.Run(fmt.Sprintf("heads=%d/keys=%d/rows=%d", c.hi, c.l, c.rows), func(b *testing.B) {
			k := up(rnd(c.l*c.di), c.l, c.di)
			defer be.Free(k)
			pos := make([]int32, c.rows)
			for i := range pos {
				pos[i] = int32(c.l - c.rows + i)
			}
			a := compute.IndexerArgs{Q: up(rnd(c.rows*c.hi*c.di), c.rows, c.hi, c.di), K: k, W: up(rnd(c.rows*c.hi), c.rows, c.hi),
				QPos: uploadI32(be, pos), TopK: c.topK, Indices: must(be.Alloc(compute.I32, c.rows, c.topK))}
			for b.Loop() {
				if err := be.LightningIndexer(&a); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(2*float64(c.rows*c.l*c.hi*c.di)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// TestLightningIndexerBadCuSeqlens: prefix sums that go down are refused,
// naming them.
func TestLightningIndexerBadCuSeqlens(t *testing.T) {
	b := New(1)
	defer b.Close()
	r := rand.New(rand.NewPCG(2, 3))
	a := compute.IndexerArgs{Q: upload(b, normals(r, 3*2*8), 3, 2, 8), K: upload(b, normals(r, 6*8), 6, 8),
		W: upload(b, normals(r, 3*2), 3, 2), QPos: uploadI32(b, []int32{0, 0, 1}), TopK: 2,
		CuSeqlensQ: []int32{0, 2, 1, 3}, CuSeqlensK: []int32{0, 2, 4, 6},
		Indices: must(b.Alloc(compute.I32, 3, 2))}
	require.ErrorContains(t, b.LightningIndexer(&a), "cu_seqlens q [0 2 1 3]")
}
