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

	if !kernel.KMajorFast() {
		t.Skip("no k-major weights on this path")
	}
	w, want := bf16Weight(t, b, rand.New(rand.NewPCG(93, 94)), kernel.KMajorMinN, 64)
	p, err := b.PrepareMatMul(w)
	require.NoError(t, err)
	km, err := kmajorOf(p)
	require.NoError(t, err)
	require.NotNil(t, km, "the weight is k-major")
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
