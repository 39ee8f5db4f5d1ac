package kernel

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// convOperand returns n floats of varied magnitude with the values the
// activation treats apart: signed zeros, subnormals, huge values on both
// sides of the exponential's range, infinities and NaN.
func convOperand(r *rand.Rand, n int) []float32 {
	special := []float32{0, float32(math.Copysign(0, -1)), 1e-40, -1e-40, 90, -90, 200, -200,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
	v := make([]float32, n)
	for i := range v {
		switch {
		case r.IntN(20) == 0:
			v[i] = special[r.IntN(len(special))]
		default:
			v[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(5)-2)))
		}
	}
	return v
}

// TestConvSiLU4 holds the vector kernel to its specification, bit for
// bit: a cleared row, MulAdd for each tap oldest first, SiLUInPlace.
func TestConvSiLU4(t *testing.T) {
	if !expWide() || !hasZMM {
		t.Skip("no 512-bit exponential on this CPU or path")
	}
	r := rand.New(rand.NewPCG(21, 22))
	for _, c := range []struct {
		rows, stride, cols int
		zeros              bool // x all +0 against negative taps: every product -0, the sum +0
	}{{1, 16, 16, false}, {5, 40, 32, false}, {37, 2304, 2304, false}, {64, 100, 96, false}, {3, 32, 32, true}} {
		x := convOperand(r, (c.rows+3)*c.stride)
		w := convOperand(r, 4*c.stride)
		if c.zeros {
			clear(x)
			for i := range w {
				w[i] = -1 - float32(i%3)
			}
		}
		got := make([]float32, c.rows*c.stride)
		require.True(t, ConvSiLU4(got, x, w, c.stride, c.rows, c.cols))
		want := make([]float32, c.cols)
		for i := 0; i < c.rows; i++ {
			clear(want)
			for tap := 0; tap < 4; tap++ {
				MulAdd(want, w[tap*c.stride:tap*c.stride+c.cols], x[(i+tap)*c.stride:(i+tap)*c.stride+c.cols])
			}
			SiLUInPlace(want)
			for j, v := range want {
				require.Equal(t, math.Float32bits(v), math.Float32bits(got[i*c.stride+j]), "rows %d stride %d: row %d channel %d", c.rows, c.stride, i, j)
			}
			for j := c.cols; j < c.stride; j++ {
				require.Zero(t, got[i*c.stride+j], "wrote past the channels given")
			}
		}
	}
	require.False(t, ConvSiLU4(make([]float32, 64), make([]float32, 64), make([]float32, 64), 16, 1, 8), "cols not a multiple of 16")
}
