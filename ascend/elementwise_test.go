package ascend

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
)

// Binary's three forms (same shape, a row over rows, a column [T, 1] over
// each row) for every operation, and Unary Exp, on the pure-Go backend and
// this backend, against values computed here.
func TestElementwiseForms(t *testing.T) {
	rng := rand.New(rand.NewPCG(61, 62))
	const T, D = 3, 5
	x := randF32(rng, T*D)
	same, row, col := randF32(rng, T*D), randF32(rng, D), randF32(rng, T)
	for i := range same { // divisors away from zero
		same[i] = 0.5 + float32(math.Abs(float64(same[i])))
	}
	for i := range row {
		row[i] = 0.5 + float32(math.Abs(float64(row[i])))
	}
	for i := range col {
		col[i] = 0.5 + float32(math.Abs(float64(col[i])))
	}
	apply := func(op compute.BinaryOp, a, b float32) float32 {
		switch op {
		case compute.Add:
			return a + b
		case compute.Sub:
			return a - b
		case compute.Mul:
			return a * b
		case compute.Max:
			return max(a, b)
		}
		return a / b
	}
	forms := []struct {
		name  string
		y     []float32
		shape []int
		at    func(r, c int) float32
	}{
		{"same", same, []int{T, D}, func(r, c int) float32 { return same[r*D+c] }},
		{"row", row, []int{D}, func(_, c int) float32 { return row[c] }},
		{"column", col, []int{T, 1}, func(r, _ int) float32 { return col[r] }},
	}
	check := func(t *testing.T, b compute.Backend) {
		xt, err := b.FromHost(compute.F32, compute.F32, f32bytes(x), T, D)
		require.NoError(t, err)
		out, err := b.Alloc(compute.F32, T, D)
		require.NoError(t, err)
		for _, f := range forms {
			yt, err := b.FromHost(compute.F32, compute.F32, f32bytes(f.y), f.shape...)
			require.NoError(t, err)
			for _, op := range []compute.BinaryOp{compute.Add, compute.Sub, compute.Mul, compute.Max, compute.Div} {
				require.NoError(t, b.Binary(op, out, xt, yt), "%s op %d", f.name, op)
				got := read(t, b, out)
				for r := range T {
					for c := range D {
						require.InDelta(t, apply(op, x[r*D+c], f.at(r, c)), got[r*D+c], 1e-6, "%s op %d at (%d, %d)", f.name, op, r, c)
					}
				}
			}
		}
		require.NoError(t, b.Unary(compute.Exp, out, xt))
		for i, g := range read(t, b, out) {
			require.InDelta(t, math.Exp(float64(x[i])), float64(g), 1e-6*math.Exp(float64(x[i])), "exp %d", i)
		}
	}
	t.Run("cpu", func(t *testing.T) {
		c := cpu.New(1)
		defer c.Close()
		check(t, c)
	})
	eachDriver(t, 4<<20, func(t *testing.T, b *Backend) { check(t, b) })
}
