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

// TestAttnLogitsBF16 checks the bf16 logits tile against its Go twin bit
// for bit and against the float64 logits of the rounded operands, a
// second call over more dimensions continuing the first, with a key row
// stride past the width.
func TestAttnLogitsBF16(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	rb := func(v float32) float64 { return float64(bf16(roundBF16DAZ(v))) }
	for _, hg := range []int{3, 32, 96} {
		for _, c := range [][2]int{{2, 0}, {64, 16}, {130, 6}} {
			d1, d2 := c[0], c[1]
			q1, q2 := randSlice(r, hg*d1), randSlice(r, hg*d2)
			k1f := randSlice(r, (AttnLogitsKeys-1)*(d1+4)+d1)
			k2f := randSlice(r, (AttnLogitsKeys-1)*(d2+2)+max(d2, 2))
			k1, k2 := make([]uint16, len(k1f)), make([]uint16, len(k2f))
			RoundBF16DAZ(k1, k1f)
			RoundBF16DAZ(k2, k2f)
			qp1, qp2 := make([]uint32, hg*d1/2), make([]uint32, hg*d2/2)
			TransposeQueryBF16(qp1, q1, hg, d1)
			TransposeQueryBF16(qp2, q2, hg, d2)
			n := (hg + 31) / 32 * 32 * AttnLogitsKeys
			got, twin := randSlice(r, n), randSlice(r, n) // overwritten, not added to
			for _, run := range []struct {
				z    []float32
				tile func(zt []float32, k []uint16, stride int, qp []uint32, hg, d int, acc bool)
			}{{got, AttnLogitsBF16}, {twin, attnLogitsBF16Go}} {
				run.tile(run.z, k1, d1+4, qp1, hg, d1, false)
				if d2 > 0 {
					run.tile(run.z, k2, d2+2, qp2, hg, d2, true)
				}
			}
			for s := range AttnLogitsKeys {
				for h := range hg {
					at := AttnLogitsAt(s, h)
					require.Equal(t, math.Float32bits(twin[at]), math.Float32bits(got[at]), "hg %d d %d+%d key %d head %d: tile against twin", hg, d1, d2, s, h)
					var want, scale float64
					for i := range d1 {
						p := rb(q1[h*d1+i]) * rb(k1f[s*(d1+4)+i])
						want, scale = want+p, scale+math.Abs(p)
					}
					for i := range d2 {
						p := rb(q2[h*d2+i]) * rb(k2f[s*(d2+2)+i])
						want, scale = want+p, scale+math.Abs(p)
					}
					require.InDelta(t, want, float64(got[at]), 1e-6*scale+1e-7, "hg %d d %d+%d key %d head %d", hg, d1, d2, s, h)
				}
			}
		}
	}
}
