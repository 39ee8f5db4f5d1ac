package nz

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The worked example of the reference notes (checked there with numpy).
func TestWorkedIndex(t *testing.T) {
	l, err := NewLayout([]int{100, 30}, C0(2))
	require.NoError(t, err)
	assert.Equal(t, []int{2, 7, 16, 16}, l.StorageDims(nil))
	assert.Equal(t, 3584, l.Len())
	assert.Equal(t, 2389, l.Offset(0, 37, 21))

	// ATB's Transdata example writes [8, 100, 30] as [8, 2, 112, 16]: the
	// same bytes with R1 and 16 merged.
	l, err = NewLayout([]int{8, 100, 30}, C0(2))
	require.NoError(t, err)
	d := l.StorageDims([]int{8})
	assert.Equal(t, []int{8, 2, 112, 16}, []int{d[0], d[1], d[2] * d[3], d[4]})
}

// The pad-reshape-transpose definition, computed independently of Offset:
// pad to [R1·16, C1·C0], view as [R1, 16, C1, C0], transpose to
// [C1, R1, 16, C0].
func referencePack(src []int, batch, R, C, c0 int) []int {
	r1, c1 := (R+15)/16, (C+c0-1)/c0
	out := make([]int, 0, batch*r1*16*c1*c0)
	for b := 0; b < batch; b++ {
		for j := 0; j < c1; j++ {
			for i := 0; i < r1; i++ {
				for r0 := 0; r0 < 16; r0++ {
					for k := 0; k < c0; k++ {
						r, c := i*16+r0, j*c0+k
						v := 0
						if r < R && c < C {
							v = src[(b*R+r)*C+c]
						}
						out = append(out, v)
					}
				}
			}
		}
	}
	return out
}

func TestPackMatchesDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		batch, R, C := 1+rng.IntN(3), 1+rng.IntN(70), 1+rng.IntN(90)
		c0 := []int{16, 32}[rng.IntN(2)]
		src := make([]int, batch*R*C)
		for i := range src {
			src[i] = i + 1
		}
		dims := []int{R, C}
		if batch > 1 {
			dims = []int{batch, R, C}
		}
		l, err := NewLayout(dims, c0)
		require.NoError(t, err)
		dst := make([]int, l.Len())
		for i := range dst {
			dst[i] = -1 // padding must be zeroed
		}
		require.NoError(t, Pack(l, dst, src))
		require.Equal(t, referencePack(src, batch, R, C, c0), dst, "dims %v c0 %d", dims, c0)

		back := make([]int, len(src))
		require.NoError(t, Unpack(l, back, dst))
		require.Equal(t, src, back)
	}
}

func TestErrors(t *testing.T) {
	_, err := NewLayout([]int{5}, 16)
	assert.ErrorIs(t, err, ErrShape)
	_, err = NewLayout([]int{0, 5}, 16)
	assert.ErrorIs(t, err, ErrShape)
	_, err = NewLayout([]int{4, 5}, 0)
	assert.ErrorIs(t, err, ErrShape)
	l, err := NewLayout([]int{4, 5}, 16)
	require.NoError(t, err)
	assert.ErrorIs(t, Pack(l, make([]uint16, 10), make([]uint16, 20)), ErrShape)
	assert.ErrorIs(t, Pack(l, make([]uint16, l.Len()), make([]uint16, 19)), ErrShape)
	assert.ErrorIs(t, Unpack(l, make([]uint16, 20), make([]uint16, 3)), ErrShape)
	assert.Equal(t, 0, C0(3))
}
