//go:build !purego

package kernel

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTile4x3EqualsOneRow checks the four-by-three tiles bit for bit
// against the one-row products (the arithmetic every dot-form tile keeps).
func TestTile4x3EqualsOneRow(t *testing.T) {
	if !useAVX2 {
		t.Skip("no AVX2")
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for _, c := range []struct{ rows, triples, k int }{{4, 1, 8}, {8, 5, 64}, {12, 4, 776}, {8, 2, 2048}, {5, 3, 24}, {10, 7, 768}, {7, 2, 16}} {
		m, n, k := c.rows, 3*c.triples, c.k
		x := make([]float32, m*k)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		wb := make([]uint16, n*k)
		wf := make([]float32, n*k)
		for i := range wb {
			wb[i] = uint16(math.Float32bits(float32(rng.NormFloat64())) >> 16)
			wf[i] = bf16(wb[i])
		}
		gotB, gotF := make([]float32, m*n), make([]float32, m*n)
		tile4x3BF16AVX2(&x[0], k, c.rows, &wb[0], c.triples, k, &gotB[0], n)
		tile4x3F32AVX2(&x[0], k, c.rows, &wf[0], c.triples, k, &gotF[0], n)
		one := make([]float32, n)
		for r := range m {
			MatMulBF16Serial(one, x[r*k:(r+1)*k], wb, 1, n, k)
			for j := range n {
				require.Equal(t, math.Float32bits(one[j]), math.Float32bits(gotB[r*n+j]), "bf16 %+v row %d col %d", c, r, j)
			}
			MatMulSerial(one, x[r*k:(r+1)*k], wf, 1, n, k)
			for j := range n {
				require.Equal(t, math.Float32bits(one[j]), math.Float32bits(gotF[r*n+j]), "f32 %+v row %d col %d", c, r, j)
			}
		}
	}
}
