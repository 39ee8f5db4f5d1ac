package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
)

// splitPair runs f on a backend of two workers and on one of one (whose
// operations never split), each with its own copies of the inputs, and
// returns what each wrote to its outputs.
func splitPair(t *testing.T, inputs [][]float32, f func(b *Backend, in []compute.Tensor) []compute.Tensor) (two, one [][]float32) {
	t.Helper()
	run := func(threads int) [][]float32 {
		b := New(threads)
		t.Cleanup(func() { b.Close() })
		var in []compute.Tensor
		for _, v := range inputs {
			x, err := b.Alloc(compute.F32, len(v))
			require.NoError(t, err)
			require.NoError(t, b.Write(x, v))
			in = append(in, x)
		}
		var got [][]float32
		for _, o := range f(b, in) {
			v := make([]float32, o.Len())
			require.NoError(t, b.Read(v, o))
			got = append(got, v)
		}
		return got
	}
	return run(2), run(1)
}

func randSlice(r *rand.Rand, n int, scale float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = (r.Float32()*2 - 1) * scale
	}
	return v
}

// TestElementwiseSplit: Unary, Binary and AttnResUpdate on a prefill
// chunk's worth of elements split over the pool and give every element
// the bits the unsplit operation gives it.
func TestElementwiseSplit(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const rows, d = 300, 768 // 230,400 elements, well past elementwiseMin
	require.Greater(t, rows*d, 4*elementwiseMin)
	for _, op := range []compute.UnaryOp{compute.SiLU, compute.Sigmoid, compute.Softplus, compute.Exp} {
		t.Run(fmt.Sprint("unary ", op), func(t *testing.T) {
			x := randSlice(r, rows*d+5, 12) // not a multiple of the grain
			two, one := splitPair(t, [][]float32{x}, func(b *Backend, in []compute.Tensor) []compute.Tensor {
				out, _ := b.Alloc(compute.F32, len(x))
				require.NoError(t, b.Unary(op, out, in[0]))
				return []compute.Tensor{out}
			})
			require.Equal(t, one, two)
		})
	}
	for _, op := range []compute.BinaryOp{compute.Add, compute.Mul, compute.Sub, compute.Max, compute.Div} {
		for _, form := range []string{"elements", "rows", "columns"} {
			t.Run(fmt.Sprint("binary ", op, " ", form), func(t *testing.T) {
				x := randSlice(r, rows*d, 3)
				ny := map[string]int{"elements": rows * d, "rows": d, "columns": rows}[form]
				y := randSlice(r, ny, 3)
				two, one := splitPair(t, [][]float32{x, y}, func(b *Backend, in []compute.Tensor) []compute.Tensor {
					a := in[0].Reshape(rows, d)
					bt := in[1]
					switch form {
					case "rows":
						bt = bt.Reshape(d)
					case "columns":
						bt = bt.Reshape(rows, 1)
					default:
						bt = bt.Reshape(rows, d)
					}
					out, _ := b.Alloc(compute.F32, rows, d)
					require.NoError(t, b.Binary(op, out, a, bt))
					return []compute.Tensor{out}
				})
				require.Equal(t, one, two)
			})
		}
	}
	for _, c := range []struct {
		name              string
		delta, hasPartial bool
	}{{"merge", false, true}, {"delta into partial", true, true}, {"delta as partial", true, false}, {"history only", false, false}} {
		t.Run("attnres update "+c.name, func(t *testing.T) {
			inputs := [][]float32{
				randSlice(r, d, 1),      // query
				randSlice(r, rows*d, 2), // num
				randSlice(r, rows, 1),   // max
				randSlice(r, rows, 1),   // sum
				randSlice(r, rows*d, 2), // partial
				randSlice(r, rows*d, 2), // delta
				randSlice(r, d, 1),      // pre-norm weight
			}
			for i := range inputs[3] {
				inputs[3][i] += 2 // sums stay positive
			}
			two, one := splitPair(t, inputs, func(b *Backend, in []compute.Tensor) []compute.Tensor {
				h, _ := b.Alloc(compute.F32, rows, d)
				normed, _ := b.Alloc(compute.F32, rows, d)
				a := &compute.AttnResUpdateArgs{Query: in[0], Num: in[1].Reshape(rows, d), Max: in[2], Sum: in[3],
					Partial: in[4].Reshape(rows, d), HasPartial: c.hasPartial, H: h, Eps: 1e-6,
					Normed: normed, NormWeight: in[6], NormEps: 1e-5}
				if c.delta {
					a.Delta = in[5].Reshape(rows, d)
				}
				require.NoError(t, b.AttnResUpdate(a))
				require.Equal(t, c.delta || c.hasPartial, a.HasPartial)
				// The pre-norm has RMSNorm's bits.
				sep, _ := b.Alloc(compute.F32, rows, d)
				require.NoError(t, b.RMSNorm(sep, h, in[6], 1e-5))
				require.True(t, bitsEqual(F32(sep), F32(normed)), "pre-norm against RMSNorm of h")
				return []compute.Tensor{h, in[4], normed}
			})
			require.Equal(t, one, two)
		})
	}
}

// TestAttnResUpdateNormErrors: a pre-norm output or weight of the wrong
// size is an error naming it, and the update then changes nothing.
func TestAttnResUpdateNormErrors(t *testing.T) {
	b := New(1)
	defer b.Close()
	r := rand.New(rand.NewPCG(7, 8))
	const rows, d = 4, 16
	for _, c := range []struct {
		name           string
		normed, weight int // lengths
		want           string
	}{{"short output", rows*d - 1, d, "normed output"}, {"long weight", rows * d, d + 1, "norm weight"}} {
		partial := randSlice(r, rows*d, 1)
		p := upload(b, partial, rows, d)
		a := &compute.AttnResUpdateArgs{Query: upload(b, randSlice(r, d, 1), d), Num: upload(b, randSlice(r, rows*d, 1), rows, d),
			Max: upload(b, randSlice(r, rows, 1), rows), Sum: upload(b, make([]float32, rows), rows), Partial: p,
			Delta: upload(b, randSlice(r, rows*d, 1), rows, d), H: must(b.Alloc(compute.F32, rows, d)),
			Normed: must(b.Alloc(compute.F32, c.normed)), NormWeight: must(b.Alloc(compute.F32, c.weight))}
		err := b.AttnResUpdate(a)
		require.ErrorIs(t, err, compute.ErrShape, c.name)
		require.ErrorContains(t, err, c.want, c.name)
		require.False(t, a.HasPartial, "%s: HasPartial set by a failed update", c.name)
		require.Equal(t, partial, F32(p), "%s: partial changed by a failed update", c.name)
	}
}
