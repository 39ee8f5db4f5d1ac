package dsa

import (
	"fmt"
	"testing"

	"k3/internal/bench"
	"k3/internal/cpu"
)

// BenchmarkDecodeSparseVsDense times one decode step's attention core of a
// K3.1 Pro-shaped DSA layer (indexer + top-2048 + sparse attention) against
// dense MLA attention of the same layer, and reports the measured ratio
// beside the FLOP ratio for the shape. `k3 bench dsa` prints the same as a
// table and a plot.
func BenchmarkDecodeSparseVsDense(b *testing.B) {
	be := cpu.New(0)
	defer be.Close()
	for _, l := range []int{4 << 10, 16 << 10, 64 << 10, 128 << 10} {
		b.Run(fmt.Sprintf("ctx=%dK", l>>10), func(b *testing.B) {
			r, err := bench.DSADecode(be, bench.K31Pro, l, max(b.N, 1))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(r.Sparse.Microseconds())/1e3, "sparse_ms")
			b.ReportMetric(float64(r.Dense.Microseconds())/1e3, "dense_ms")
			b.ReportMetric(float64(r.Dense)/float64(r.Sparse), "speedup")
			b.ReportMetric(bench.K31Pro.DenseFLOPs(l)/bench.K31Pro.SparseFLOPs(l), "flop_ratio")
			b.ReportMetric(float64(r.Indexer)/float64(r.Sparse), "indexer_share")
		})
	}
}
