// Package computetest checks a compute.Backend's contracts that every
// backend shares, for the backends' own tests.
package computetest

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/floatx"
)

// TypedReadWrite checks Write and Read as compute.Backend types them:
// float32 values into and out of F32, BF16 and F16 tensors (rounded to
// nearest even, widened back exactly), int32 values for I32, raw bits for
// BF16 and F16, through slices and pointers to them, and an ErrShape for
// every other pairing or length. The expected values come from floatx.
func TypedReadWrite(t *testing.T, b compute.Backend) {
	t.Helper()
	rng := rand.New(rand.NewPCG(91, 92))
	v := make([]float32, 15)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	// A bf16 tie broken by the low bits; an f16 subnormal.
	v[0], v[1] = 1+1.0/256+1.0/65536, -3.0e-6
	for _, dt := range []compute.DType{compute.F32, compute.BF16, compute.F16} {
		x, err := b.Alloc(dt, 3, 5)
		require.NoError(t, err)
		require.NoError(t, b.Write(x, v))
		got := make([]float32, 15)
		require.NoError(t, b.Read(&got, x))
		bits := make([]uint16, 15)
		for i, f := range v {
			want := f
			switch dt {
			case compute.BF16:
				bits[i] = floatx.BF16(f)
				want = floatx.FromBF16(bits[i])
			case compute.F16:
				bits[i] = floatx.F16(f)
				want = floatx.FromF16(bits[i])
			}
			require.Equal(t, math.Float32bits(want), math.Float32bits(got[i]), "%v element %d", dt, i)
		}
		if dt == compute.F32 {
			require.ErrorIs(t, b.Read(make([]uint16, 15), x), compute.ErrShape)
			require.ErrorIs(t, b.Write(x, make([]uint16, 15)), compute.ErrShape)
			continue
		}
		raw := make([]uint16, 15)
		require.NoError(t, b.Read(raw, x))
		require.Equal(t, bits, raw, "%v bits", dt)
		raw[3] ^= 1
		require.NoError(t, b.Write(x, &raw))
		back := make([]uint16, 15)
		require.NoError(t, b.Read(back, x))
		require.Equal(t, raw, back, "%v raw round trip", dt)
	}

	ids, err := b.Alloc(compute.I32, 4)
	require.NoError(t, err)
	require.NoError(t, b.Write(ids, []int32{7, -1, 0, 1 << 30}))
	gotIDs := make([]int32, 4)
	require.NoError(t, b.Read(gotIDs, ids))
	require.Equal(t, []int32{7, -1, 0, 1 << 30}, gotIDs)

	f, err := b.Alloc(compute.F32, 4)
	require.NoError(t, err)
	for _, c := range []struct {
		dst compute.Tensor
		src any
	}{
		{f, []int32{1, 2, 3, 4}}, {ids, []float32{1, 2, 3, 4}}, {f, []float32{1, 2, 3}},
		{f, []float64{1, 2, 3, 4}}, {ids, []uint16{1, 2, 3, 4}},
	} {
		require.ErrorIs(t, b.Write(c.dst, c.src), compute.ErrShape, "write %T into %v", c.src, c.dst)
		require.ErrorIs(t, b.Read(c.src, c.dst), compute.ErrShape, "read %v into %T", c.dst, c.src)
	}
}
