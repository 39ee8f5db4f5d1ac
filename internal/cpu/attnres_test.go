package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
)

// TestAttnResPrepareSplit: AttnResPrepare gives the same bits on the
// calling goroutine and split over the pool by token (a batch of decode
// rows is split, one row is not), and matches a float64 reference.
func TestAttnResPrepareSplit(t *testing.T) {
	b := New(2)
	defer b.Close()
	r := rand.New(rand.NewPCG(4, 4))
	defer func(v int) { prepareSerial = v }(prepareSerial)
	const s, d, nb = 3, 40, 3
	for _, tok := range []int{1, 8, 37} {
		var blocks []compute.Tensor
		var host [][]float32
		for range nb {
			v := normals(r, tok*d)
			host = append(host, v)
			blocks = append(blocks, upload(b, v, tok, d))
		}
		q := normals(r, s*d)
		run := func(serial int) ([]float32, []float32, []float32) {
			prepareSerial = serial
			a := compute.AttnResPrepareArgs{Blocks: blocks, Queries: upload(b, q, s, d), Eps: 1e-6,
				Num: must(b.Alloc(compute.F32, s, tok, d)), Max: must(b.Alloc(compute.F32, s, tok)), Sum: must(b.Alloc(compute.F32, s, tok))}
			require.NoError(t, b.AttnResPrepare(&a))
			return F32(a.Num), F32(a.Max), F32(a.Sum)
		}
		n1, m1, s1 := run(math.MaxInt)
		n2, m2, s2 := run(0)
		name := fmt.Sprintf("%d tokens", tok)
		require.True(t, bitsEqual(n1, n2) && bitsEqual(m1, m2) && bitsEqual(s1, s2), "%s: split over the pool", name)
		for qi := range s {
			for k := range tok {
				var z [nb]float64
				m := math.Inf(-1)
				for n, blk := range host {
					row := blk[k*d : (k+1)*d]
					var ss, dot float64
					for i, v := range row {
						ss += float64(v) * float64(v)
						dot += float64(q[qi*d+i]) * float64(v)
					}
					z[n] = dot / math.Sqrt(ss/d+1e-6)
					m = max(m, z[n])
				}
				var sum float64
				num := make([]float64, d)
				for n, blk := range host {
					e := math.Exp(z[n] - m)
					sum += e
					for i := range d {
						num[i] += e * float64(blk[k*d+i])
					}
				}
				o := qi*tok + k
				require.InDelta(t, m, float64(m1[o]), 1e-4, "%s: max", name)
				require.InDelta(t, sum, float64(s1[o]), 1e-4, "%s: sum", name)
				for i := range d {
					require.InDelta(t, num[i], float64(n1[o*d+i]), 1e-4*(1+math.Abs(num[i])), "%s: numerator", name)
				}
			}
		}
	}
}
