package kernel

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPairRowsBF16 checks the pairing of rows (the assembly where the CPU
// has it) against roundBF16DAZ element by element, an odd last row paired
// with zeros, columns past the last whole 16 included.
func TestPairRowsBF16(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	for _, rows := range []int{1, 2, 5, 64} {
		for _, n := range []int{1, 16, 37, 512} {
			ldv := n + 3
			v := randSlice(r, rows*ldv)
			dst := make([]uint32, (rows+1)/2*n)
			PairRowsBF16(dst, v, ldv, rows, n)
			for p := range (rows + 1) / 2 {
				for x := range n {
					want := uint32(roundBF16DAZ(v[2*p*ldv+x]))
					if 2*p+1 < rows {
						want |= uint32(roundBF16DAZ(v[(2*p+1)*ldv+x])) << 16
					}
					require.Equal(t, want, dst[p*n+x], "rows %d n %d pair %d column %d", rows, n, p, x)
				}
			}
		}
	}
}

// TestMatAccumulatePairs checks the bf16 accumulation against its Go
// arithmetic bit for bit (six-row, 32-column tiles and the tails) and
// against the float64 sums of the rounded operands.
func TestMatAccumulatePairs(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	for _, m := range []int{1, 6, 7, 13, 96} {
		for _, n := range []int{1, 32, 70, 512} {
			for _, kp := range []int{0, 1, 3, 32} {
				k, ldc, lda := 2*kp, n+2, 2*kp+2
				a, b := randSlice(r, m*k), randSlice(r, k*n)
				ab := make([]uint16, m*lda)
				for row := range m {
					RoundBF16DAZ(ab[row*lda:row*lda+k], a[row*k:(row+1)*k])
				}
				bp := make([]uint32, kp*n)
				PairRowsBF16(bp, b, n, k, n)
				c0 := randSlice(r, m*ldc)
				got, twin := slices.Clone(c0), slices.Clone(c0)
				MatAccumulatePairs(got, ldc, ab, lda, bp, m, n, kp)
				for row := range m {
					matAccPairsGo(twin[row*ldc:], ab[row*lda:], bp, n, kp, 0)
				}
				rb := func(v float32) float64 { return float64(bf16(roundBF16DAZ(v))) }
				for row := range m {
					for x := range n {
						i := row*ldc + x
						require.Equal(t, math.Float32bits(twin[i]), math.Float32bits(got[i]), "m %d n %d kp %d: row %d column %d against the twin", m, n, kp, row, x)
						want, scale := float64(c0[i]), math.Abs(float64(c0[i]))
						for q := range k {
							p := rb(a[row*k+q]) * rb(b[q*n+x])
							want, scale = want+p, scale+math.Abs(p)
						}
						require.InDelta(t, want, float64(got[i]), 1e-6*scale, "m %d n %d kp %d: row %d column %d", m, n, kp, row, x)
					}
					for x := n; x < ldc; x++ {
						require.Equal(t, c0[row*ldc+x], got[row*ldc+x], "m %d n %d kp %d: row %d past n", m, n, kp, row)
					}
				}
			}
		}
	}
}
