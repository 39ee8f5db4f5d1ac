package cpu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/compute/computetest"
	"k3/internal/floatx"
	"k3/internal/kernel"
)

// Reads and writes are typed as the seam says; a k-major weight reads in
// row-major order; the caller's bytes behind a FromHost tensor are never
// written.
func TestTypedReadWrite(t *testing.T) {
	b := New(1)
	defer b.Close()
	computetest.TypedReadWrite(t, b)

	data := make([]byte, 8)
	binary.LittleEndian.PutUint32(data, math.Float32bits(2.5))
	host, err := b.FromHost(compute.F32, compute.F32, data, 2)
	require.NoError(t, err)
	require.ErrorIs(t, b.Write(host, []float32{7, 8}), compute.ErrUnsupported)
	require.Equal(t, math.Float32bits(2.5), binary.LittleEndian.Uint32(data))

	if b.packing() == 0 {
		t.Skip("no packed weights on this path")
	}
	w, want := bf16Weight(t, b, rand.New(rand.NewPCG(93, 94)), kernel.KMajorMinN, 64)
	p, err := b.PrepareMatMul(w)
	require.NoError(t, err)
	km, _, err := packedOf(p)
	require.NoError(t, err)
	require.NotNil(t, km, "the weight is packed")
	gotW := make([]float32, len(want))
	require.NoError(t, b.Read(gotW, p))
	require.Equal(t, want, gotW)
	wBits := make([]uint16, len(want))
	require.NoError(t, b.Read(wBits, p))
	for i, f := range want {
		require.Equal(t, floatx.BF16(f), wBits[i], "element %d", i)
	}
	require.ErrorIs(t, b.Write(p, want), compute.ErrShape, "a prepared weight is written only by PrepareMatMul")
}

// KDAChunk and CausalConv over a pool of states equal the calls over one
// state per sequence, and ScatterRows puts rows where its indices say;
// bad indices are refused, naming the index.
func TestStatePools(t *testing.T) {
	b := New(2)
	defer b.Close()
	computetest.StatePools(t, b)
	computetest.Scatter(t, b)

	pool, err := b.Alloc(compute.F32, 3, 1, 4)
	require.NoError(t, err)
	x, _ := b.Alloc(compute.F32, 2, 4)
	w, _ := b.Alloc(compute.F32, 4, 2)
	out, _ := b.Alloc(compute.F32, 2, 4)
	idx, _ := b.Alloc(compute.I32, 2)
	for _, c := range []struct {
		slots []int32
		want  string
	}{{[]int32{0, 3}, "index 3 of sequence 1 outside a pool of 3"}, {[]int32{1, 1}, "index 1 given to two sequences"}, {[]int32{-1, 0}, "index -1"}} {
		require.NoError(t, b.Write(idx, c.slots))
		err := b.CausalConv(&compute.ConvArgs{X: x, Weight: w, State: pool, StateIdx: idx, Out: out, CuSeqlens: []int32{0, 1, 2}})
		require.ErrorIs(t, err, compute.ErrShape)
		require.ErrorContains(t, err, c.want)
	}
}

// Attention and the indexer over pools and a page table equal the calls
// over page lists; a table naming a page past the pool is refused.
func TestPagePools(t *testing.T) {
	b := New(2)
	defer b.Close()
	computetest.PagePools(t, b)

	pool, _ := b.Alloc(compute.F32, 128, 1, 16)
	q, _ := b.Alloc(compute.F32, 1, 2, 16)
	out, _ := b.Alloc(compute.F32, 1, 2, 16)
	pos, _ := b.Alloc(compute.I32, 1)
	table, _ := b.Alloc(compute.I32, 1)
	require.NoError(t, b.Write(table, []int32{2}))
	err := b.Attention(&compute.AttnArgs{Q: q, KPool: pool, PageTable: table, PageSize: 64, QPos: pos, KVLen: 1, Causal: true, Scale: 1, Out: out})
	require.ErrorIs(t, err, compute.ErrShape)
	require.ErrorContains(t, err, "page 0 is page 2 of a pool of 2")
}

// Degenerate pooled operands are errors, not panics.
func TestPagePoolsDegenerate(t *testing.T) {
	b := New(1)
	defer b.Close()
	pool, _ := b.Alloc(compute.F32, 64, 1, 1)
	table, _ := b.Alloc(compute.I32, 1)
	pos, _ := b.Alloc(compute.I32, 1)
	q, _ := b.Alloc(compute.F32, 1, 1, 0)
	out, _ := b.Alloc(compute.F32, 1, 1, 0)
	require.Error(t, b.Attention(&compute.AttnArgs{Q: q, KPool: pool, PageTable: table, PageSize: 64, QPos: pos, KVLen: 1, Causal: true, Out: out}))
	iq, _ := b.Alloc(compute.F32, 1, 1, 0)
	w, _ := b.Alloc(compute.F32, 1, 1)
	idx, _ := b.Alloc(compute.I32, 1, 1)
	require.Error(t, b.LightningIndexer(&compute.IndexerArgs{Q: iq, W: w, KPool: pool, PageTable: table, PageSize: 64, KLen: 1, QPos: pos, TopK: 1, Indices: idx}))
}
