package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/kernel"
)

// TestPrepareExperts: where the backend lays weights out k-major (and the
// AMX tiles do not run), PrepareExperts lays out as one weight the w1 and
// w3 of each expert narrower than kernel.KMajorMinN and at least
// gateUpMinI rows, and no others; the halves read back as the weights
// they were, their MatMul (pooled, and serial through MoEExperts when an
// expert's w1 and w3 are halves of different pairs) is the float64
// product within float32 summation error and a row's result does not
// depend on the other rows, a view of a half is refused, and MoEExperts
// over the pairs is the unpaired experts' result within the same error.
func TestPrepareExperts(t *testing.T) {
	b := New(2)
	defer b.Close()
	pairs := b.packing() == kMajor && !kernel.AMXAvailable()
	for _, sh := range []struct{ din, inter int }{{384, 64}, {100, 48}, {256, 47}, {128, 384}, {64, 200}} {
		t.Run(fmt.Sprintf("din=%d/inter=%d", sh.din, sh.inter), func(t *testing.T) {
			din, inter := sh.din, sh.inter
			r := rand.New(rand.NewPCG(uint64(din), uint64(inter)))
			const ne = 3
			var w1, w3, w2 []compute.Tensor
			var v1, v3 [][]float32
			for range ne {
				w, v := bf16Weight(t, b, r, inter, din)
				w1, v1 = append(w1, must(b.PrepareMatMul(w))), append(v1, v)
				w, v = bf16Weight(t, b, r, inter, din)
				w3, v3 = append(w3, must(b.PrepareMatMul(w))), append(v3, v)
				w, _ = bf16Weight(t, b, r, din, inter)
				w2 = append(w2, must(b.PrepareMatMul(w)))
			}
			plain := [][]compute.Tensor{append([]compute.Tensor(nil), w1...), append([]compute.Tensor(nil), w3...)}
			require.ErrorIs(t, b.PrepareExperts(w1[:ne-1], w3, w2), compute.ErrShape, "lists of different lengths")
			require.Equal(t, plain[0], w1, "a refused call moves nothing")
			require.NoError(t, b.PrepareExperts(w1, w3, w2))
			want := pairs && inter >= gateUpMinI && inter < kernel.KMajorMinN
			for e := range ne {
				require.Equal(t, want, gateUpPair(w1[e], w3[e]) != nil, "expert %d laid out as one weight", e)
				for which, ws := range [][]compute.Tensor{w1, w3} {
					got := make([]float32, inter*din)
					require.NoError(t, b.Read(got, ws[e]))
					require.Equal(t, [][]float32{v1[e], v3[e]}[which], got, "expert %d w%d reads back", e, []int{1, 3}[which])
				}
			}
			if !want {
				return
			}
			// MatMul on each half: the float64 product, and each of 40 rows
			// alone gives its bits in the long product.
			const m = 40
			x := normals(r, m*din)
			for which, ws := range [][]compute.Tensor{w1, w3} {
				v := [][]float32{v1[0], v3[0]}[which]
				y := must(b.Alloc(compute.F32, m, inter))
				require.NoError(t, b.MatMul(y, upload(b, x, m, din), ws[0]))
				got := make([]float32, m*inter)
				require.NoError(t, b.Read(got, y))
				for i := range m {
					for j := range inter {
						var s, abs float64
						for kk := range din {
							p := float64(x[i*din+kk]) * float64(v[j*din+kk])
							s, abs = s+p, abs+math.Abs(p)
						}
						require.InDelta(t, s, got[i*inter+j], 1e-5*abs, "w%d row %d column %d", []int{1, 3}[which], i, j)
					}
				}
				for _, i := range []int{0, 17, m - 1} {
					y1 := must(b.Alloc(compute.F32, 1, inter))
					require.NoError(t, b.MatMul(y1, upload(b, x[i*din:(i+1)*din], 1, din), ws[0]))
					alone := make([]float32, inter)
					require.NoError(t, b.Read(alone, y1))
					require.Equal(t, got[i*inter:(i+1)*inter], alone, "w%d row %d alone", []int{1, 3}[which], i)
				}
			}
			view := compute.NewTensor(w1[0].Mem, 0, compute.BF16, inter-1, din)
			require.ErrorIs(t, b.MatMul(must(b.Alloc(compute.F32, 1, inter-1)), upload(b, x[:din], 1, din), view), compute.ErrShape)
			require.ErrorIs(t, b.Read(make([]float32, (inter-1)*din), view), compute.ErrShape)

			// MoEExperts over the pairs, over the unpaired weights, and with
			// expert 1's w1 and w3 halves of different pairs (each half's
			// own product).
			const tok, topk = 40, 2
			idx, wts := weightedRoutes(r, tok, ne, topk)
			run := func(w1, w3 []compute.Tensor) []float32 {
				return runExperts(t, b, x[:tok*din], idx, wts, topk, w1, w3, w2)
			}
			// The float64 experts (hidden rows rounded to float32 as the
			// kernels hold them), within 1e-5 of the sum of the terms'
			// magnitudes, since outputs cancel.
			v2 := make([][]float32, ne)
			for e := range ne {
				v2[e] = make([]float32, din*inter)
				require.NoError(t, b.Read(v2[e], w2[e]))
			}
			reference := func(up [ne]int) (want, scale []float64) {
				want, scale = make([]float64, tok*din), make([]float64, tok*din)
				for i := range tok {
					xi := x[i*din : (i+1)*din]
					for s := range topk {
						e := idx[i*topk+s]
						h := make([]float32, inter)
						for j := range inter {
							var g, u float64
							for kk := range din {
								g += float64(xi[kk]) * float64(v1[e][j*din+kk])
								u += float64(xi[kk]) * float64(v3[up[e]][j*din+kk])
							}
							h[j] = float32(g / (1 + math.Exp(-g)) * u)
						}
						for c := range din {
							for j := range inter {
								p := float64(wts[i*topk+s]) * float64(h[j]) * float64(v2[e][c*inter+j])
								want[i*din+c] += p
								scale[i*din+c] += math.Abs(p)
							}
						}
					}
				}
				return want, scale
			}
			swap := [ne]int{0, 2, 1}
			for _, c := range []struct {
				name   string
				w1, w3 []compute.Tensor
				up     [ne]int
			}{
				{"pairs", w1, w3, [ne]int{0, 1, 2}},
				{"unpaired", plain[0], plain[1], [ne]int{0, 1, 2}},
				{"halves of different pairs", w1, []compute.Tensor{w3[0], w3[2], w3[1]}, swap},
			} {
				got := run(c.w1, c.w3)
				want, scale := reference(c.up)
				for i := range got {
					require.InDelta(t, want[i], got[i], 1e-5*scale[i], "%s: output %d", c.name, i)
				}
			}
		})
	}
}
