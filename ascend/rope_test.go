package ascend

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
)

// RoPE's composition against the pure-Go backend: halves and interleaved
// pairs, partial rotary dims, theta or explicit frequencies with a scale,
// one or several heads per row; positions first below 201, then up to
// 4095 (the table grows).
func TestRoPE(t *testing.T) {
	eachDriver(t, 32<<20, func(t *testing.T, a *Backend) {
		c := cpu.New(1)
		defer c.Close()
		rng := rand.New(rand.NewPCG(51, 52))
		for _, shape := range [][]int{{4, 64}, {4, 3, 32}} {
			d := shape[len(shape)-1]
			for _, inter := range []bool{false, true} {
				for _, dimsRot := range []int{0, d / 2} {
					for _, freqs := range []bool{false, true} {
						n := 1
						for _, s := range shape {
							n *= s
						}
						for _, pos := range [][]int32{{0, 7, 200, 100}, {0, 7, 300, 4095}} {
							xa, xc := both(t, a, c, compute.F32, randF32(rng, n), shape...)
							pa, pc := positions(t, a, pos), positions(t, c, pos)
							args := func(x, p compute.Tensor) *compute.RopeArgs {
								r := &compute.RopeArgs{X: x, Pos: p, MaxPos: int(slices.Max(pos)) + 1, Dims: dimsRot, Theta: 10000, Interleaved: inter}
								if freqs {
									rd := dimsRot
									if rd == 0 {
										rd = d
									}
									r.Freqs = make([]float64, rd/2)
									for i := range r.Freqs {
										r.Freqs[i] = 1 / float64(i+1)
									}
									r.Scale = 1.25
								}
								return r
							}
							require.NoError(t, a.RoPE(args(xa, pa)))
							require.NoError(t, c.RoPE(args(xc, pc)))
							closeRel(t, read(t, c, xc), read(t, a, xa), 1e-6, 1e-5, shape, inter, dimsRot, freqs, pos)
						}
					}
				}
			}
		}
	})
}

// positions uploads a RoPE positions tensor.
func positions(t *testing.T, b compute.Backend, pos []int32) compute.Tensor {
	t.Helper()
	p, err := b.Alloc(compute.I32, len(pos))
	require.NoError(t, err)
	require.NoError(t, b.Write(p, pos))
	return p
}

// RoPE refuses positions that are not an I32 tensor of one per row, or
// without a bound; the pure-Go backend also refuses a position past it.
func TestRoPEErrors(t *testing.T) {
	c := cpu.New(1)
	defer c.Close()
	eachDriver(t, 8<<20, func(t *testing.T, a *Backend) {
		for _, be := range []compute.Backend{a, c} {
			x, err := be.Alloc(compute.F32, 2, 8)
			require.NoError(t, err)
			p := positions(t, be, []int32{0, 5})
			f, err := be.Alloc(compute.F32, 2)
			require.NoError(t, err)
			for _, bad := range []compute.RopeArgs{
				{X: x, Pos: p, MaxPos: 0, Theta: 10000},
				{X: x, Pos: p.Rows(0, 1), MaxPos: 6, Theta: 10000},
				{X: x, Pos: f, MaxPos: 6, Theta: 10000},
			} {
				require.ErrorIs(t, be.RoPE(&bad), compute.ErrShape, "%s: %+v", be.Name(), bad)
			}
		}
		require.ErrorIs(t, c.RoPE(&compute.RopeArgs{X: func() compute.Tensor { x, _ := c.Alloc(compute.F32, 2, 8); return x }(),
			Pos: positions(t, c, []int32{0, 5}), MaxPos: 5, Theta: 10000}), compute.ErrShape, "a position past MaxPos")
	})
}
