package dsa

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"k3/comm"
	"k3/compute"
	"k3/internal/cpu"
)

// splitCase is a sequence's cache of L positions, paged, and one decode
// row's queries.
type splitCase struct {
	l, k, hi, di, hq, dc, dr int
	ik, lat, pe              [][]float32 // global pages
	iq, iw, q, qpe           []float32
}

func newSplitCase(rng *rand.Rand, l, k int) *splitCase {
	c := &splitCase{l: l, k: k, hi: 4, di: 16, hq: 4, dc: 32, dr: 8}
	rnd := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	for p := 0; p*PageSize < l; p++ {
		c.ik = append(c.ik, rnd(PageSize*c.di))
		c.lat = append(c.lat, rnd(PageSize*c.dc))
		c.pe = append(c.pe, rnd(PageSize*c.dr))
	}
	// Exact score ties across pages (and so across ranks): the selection
	// must settle them as the unsplit indexer does, by position.
	for _, pair := range [][2]int{{3, 200}, {70, 130}, {5, l - 1}} {
		a, b := pair[0], pair[1]
		if b >= l {
			continue
		}
		copy(c.ik[b/PageSize][b%PageSize*c.di:(b%PageSize+1)*c.di], c.ik[a/PageSize][a%PageSize*c.di:(a%PageSize+1)*c.di])
	}
	c.iq, c.iw, c.q, c.qpe = rnd(c.hi*c.di), rnd(c.hi), rnd(c.hq*c.dc), rnd(c.hq*c.dr)
	return c
}

func upl(t *testing.T, b compute.Backend, v []float32, dims ...int) compute.Tensor {
	t.Helper()
	x, err := b.Alloc(compute.F32, dims...)
	require.NoError(t, err)
	require.NoError(t, b.Write(x, v))
	return x
}

// unsplit is the one-rank result: indexer over every key, then sparse
// attention over the selection.
func (c *splitCase) unsplit(t *testing.T, b compute.Backend) ([]int32, []float32) {
	var ik, lat, pe []compute.Tensor
	for p := range c.ik {
		ik = append(ik, upl(t, b, c.ik[p], PageSize, c.di))
		lat = append(lat, upl(t, b, c.lat[p], PageSize, 1, c.dc))
		pe = append(pe, upl(t, b, c.pe[p], PageSize, c.dr))
	}
	idx, _ := b.Alloc(compute.I32, 1, c.k)
	ix := compute.IndexerArgs{Q: upl(t, b, c.iq, 1, c.hi, c.di), W: upl(t, b, c.iw, 1, c.hi), KPages: ik, PageSize: PageSize,
		KLen: c.l, QPos: []int32{int32(c.l - 1)}, TopK: c.k, Indices: idx}
	require.NoError(t, b.LightningIndexer(&ix))
	sel := make([]int32, c.k)
	require.NoError(t, b.Read(sel, idx))
	out, _ := b.Alloc(compute.F32, 1, c.hq, c.dc)
	at := compute.AttnArgs{Q: upl(t, b, c.q, 1, c.hq, c.dc), QRope: upl(t, b, c.qpe, 1, c.hq, c.dr), KPages: lat, KRopePages: pe,
		PageSize: PageSize, Indices: idx.Reshape(1, 1, c.k), QPos: []int32{int32(c.l - 1)}, KVLen: c.l, Causal: true, Scale: 0.125, Out: out}
	require.NoError(t, b.Attention(&at))
	o := make([]float32, c.hq*c.dc)
	require.NoError(t, b.Read(o, out))
	return sel, o
}

// split runs the same row on n context-parallel ranks; it returns rank
// 0's selection and output (every rank's must agree) and the bytes sent.
func (c *splitCase) split(t *testing.T, n int) ([]int32, []float32, comm.Stats) {
	bs := make([]compute.Backend, n)
	for i := range bs {
		bs[i] = cpu.New(1)
	}
	g, err := comm.NewLocal(bs)
	require.NoError(t, err)
	sels, outs := make([][]int32, n), make([][]float32, n)
	var eg errgroup.Group
	for r := range n {
		eg.Go(func() error {
			b := bs[r]
			a := SplitArgs{IQ: upl(t, b, c.iq, 1, c.hi, c.di), IW: upl(t, b, c.iw, 1, c.hi), Q: upl(t, b, c.q, 1, c.hq, c.dc),
				QPE: upl(t, b, c.qpe, 1, c.hq, c.dr), Scale: 0.125, Selected: make([]int32, c.k)}
			for p := r; p < len(c.ik); p += n {
				a.IKPages = append(a.IKPages, upl(t, b, c.ik[p], PageSize, c.di))
				a.Lat = append(a.Lat, upl(t, b, c.lat[p], PageSize, c.dc))
				a.PE = append(a.PE, upl(t, b, c.pe[p], PageSize, c.dr))
				a.Keys += min(PageSize, c.l-p*PageSize)
			}
			a.Out, _ = b.Alloc(compute.F32, 1, c.hq, c.dc)
			s := &Split{B: b, Comm: g[r], TopK: c.k, Latent: c.dc, Rope: c.dr}
			if err := s.Decode(context.Background(), &a); err != nil {
				return err
			}
			sels[r] = a.Selected
			outs[r] = make([]float32, c.hq*c.dc)
			return b.Read(outs[r], a.Out)
		})
	}
	require.NoError(t, eg.Wait())
	var st comm.Stats
	for r := range n {
		assert.Equal(t, sels[0], sels[r], "rank %d's selection", r)
		assert.Equal(t, outs[0], outs[r], "rank %d's output", r)
		st = st.Add(g[r].Stats())
	}
	return sels[0], outs[0], st
}

// Context-parallel sparse attention selects exactly the unsplit top-K
// (ties included) and attends to the same output, moving only the
// selected rows.
func TestSplitEqualsUnsplit(t *testing.T) {
	b := cpu.New(1)
	for _, tc := range []struct{ l, k int }{{1000, 64}, {300, 64}, {70, 64}, {2048, 16}} {
		c := newSplitCase(rand.New(rand.NewPCG(uint64(tc.l), 1)), tc.l, tc.k)
		wantSel, want := c.unsplit(t, b)
		for _, n := range []int{1, 2, 4} {
			t.Run(fmt.Sprintf("L%d_K%d_cp%d", tc.l, tc.k, n), func(t *testing.T) {
				sel, got, st := c.split(t, n)
				require.Equal(t, wantSel, sel)
				worst := 0.0
				for i := range want {
					worst = max(worst, math.Abs(float64(got[i]-want[i])))
				}
				assert.LessOrEqual(t, worst, 1e-5, "largest difference from the unsplit output")
				t.Logf("largest difference %.3g", worst)
				// Rows sent: each selected row to the other n-1 ranks.
				k := min(tc.k, tc.l)
				rows := st.Bytes[comm.OpAllToAllV]
				assert.EqualValues(t, 4*(n-1)*k*(c.dc+c.dr), rows)
			})
		}
	}
}
