package kernel

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAttnLogits checks the logits tile and its Go twin against a float64
// reference, a second call over more dimensions continuing the first
// (a latent part, then a rope part), with a key row stride past the width.
func TestAttnLogits(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, hg := range []int{3, 32, 96} {
		for _, c := range [][2]int{{1, 0}, {64, 16}, {130, 7}} {
			d1, d2 := c[0], c[1]
			q1, q2 := randSlice(r, hg*d1), randSlice(r, hg*d2)
			k1 := randSlice(r, (AttnLogitsKeys-1)*(d1+3)+d1)
			k2 := randSlice(r, (AttnLogitsKeys-1)*(d2+1)+max(d2, 1))
			qt1, qt2 := make([]float32, hg*d1), make([]float32, hg*d2)
			TransposeQuery(qt1, q1, hg, d1)
			TransposeQuery(qt2, q2, hg, d2)
			n := (hg + 31) / 32 * 32 * AttnLogitsKeys
			got, twin := randSlice(r, n), randSlice(r, n) // overwritten, not added to
			for _, run := range []struct {
				z    []float32
				tile func(zt, k []float32, stride int, qt []float32, hg, d int, acc bool)
			}{{got, AttnLogits}, {twin, attnLogitsGo}} {
				run.tile(run.z, k1, d1+3, qt1, hg, d1, false)
				if d2 > 0 {
					run.tile(run.z, k2, d2+1, qt2, hg, d2, true)
				}
			}
			for s := range AttnLogitsKeys {
				for h := range hg {
					var want, scale float64
					for i := range d1 {
						want += float64(q1[h*d1+i]) * float64(k1[s*(d1+3)+i])
						scale += math.Abs(float64(q1[h*d1+i]) * float64(k1[s*(d1+3)+i]))
					}
					for i := range d2 {
						want += float64(q2[h*d2+i]) * float64(k2[s*(d2+1)+i])
						scale += math.Abs(float64(q2[h*d2+i]) * float64(k2[s*(d2+1)+i]))
					}
					tol := 1e-6*scale + 1e-7
					require.InDelta(t, want, float64(got[AttnLogitsAt(s, h)]), tol, "hg %d d %d+%d key %d head %d", hg, d1, d2, s, h)
					require.InDelta(t, want, float64(twin[AttnLogitsAt(s, h)]), tol, "twin: hg %d d %d+%d key %d head %d", hg, d1, d2, s, h)
				}
			}
		}
	}
}
