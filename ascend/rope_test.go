package ascend

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
)

// RoPE's composition against the pure-Go backend: halves and interleaved
// pairs, partial rotary dims, theta or explicit frequencies with a scale,
// one or several heads per row.
func TestRoPE(t *testing.T) {
	eachDriver(t, 8<<20, func(t *testing.T, a *Backend) {
		c := cpu.New(1)
		defer c.Close()
		rng := rand.New(rand.NewPCG(51, 52))
		pos := []int32{0, 7, 300, 4095}
		for _, shape := range [][]int{{4, 64}, {4, 3, 32}} {
			d := shape[len(shape)-1]
			for _, inter := range []bool{false, true} {
				for _, dimsRot := range []int{0, d / 2} {
					for _, freqs := range []bool{false, true} {
						n := 1
						for _, s := range shape {
							n *= s
						}
						xa, xc := both(t, a, c, compute.F32, randF32(rng, n), shape...)
						args := func(x compute.Tensor) *compute.RopeArgs {
							r := &compute.RopeArgs{X: x, Pos: pos, Dims: dimsRot, Theta: 10000, Interleaved: inter}
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
						require.NoError(t, a.RoPE(args(xa)))
						require.NoError(t, c.RoPE(args(xc)))
						closeRel(t, read(t, c, xc), read(t, a, xa), 1e-6, 1e-5, shape, inter, dimsRot, freqs)
					}
				}
			}
		}
	})
}
