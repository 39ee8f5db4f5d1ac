package dsa

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"golang.org/x/sync/errgroup"

	"k3/comm"
	"k3/compute"
	"k3/internal/cpu"
)

// BenchmarkSplitBytes decodes one row of DeepSeek-V3.2-sized sparse
// attention (latent 512, rope 64, index keys 128, top-K 2048) over a cache
// split by position over CP ranks, and reports the bytes its collectives
// send per decoded row (summed over the ranks) against what an all-gather
// of the whole cache (latent, rope and index keys) would send.
//
//	go test ./dsa -run '^$' -bench SplitBytes -benchtime 3x
func BenchmarkSplitBytes(b *testing.B) {
	const dc, dr, di, hi, hq, k = 512, 64, 128, 8, 16, 2048
	for _, l := range []int{4096, 32768, 131072} {
		for _, n := range []int{2, 4} {
			b.Run(fmt.Sprintf("L%d/cp%d", l, n), func(b *testing.B) {
				bs := make([]compute.Backend, n)
				for i := range bs {
					bs[i] = cpu.New(1)
				}
				g, err := comm.NewLocal(bs)
				if err != nil {
					b.Fatal(err)
				}
				args := make([]*SplitArgs, n)
				splits := make([]*Split, n)
				rng := rand.New(rand.NewPCG(1, 2))
				fill := func(be compute.Backend, dims ...int) compute.Tensor {
					t, _ := be.Alloc(compute.F32, dims...)
					v := make([]float32, t.Len())
					for i := range v {
						v[i] = float32(rng.NormFloat64())
					}
					be.Write(t, v)
					return t
				}
				for r := range n {
					be := bs[r]
					a := &SplitArgs{IQ: fill(be, 1, hi, di), IW: fill(be, 1, hi), Q: fill(be, 1, hq, dc), QPE: fill(be, 1, hq, dr), Scale: 0.05}
					for p := r; p*PageSize < l; p += n {
						a.IKPages = append(a.IKPages, fill(be, PageSize, di))
						a.Lat = append(a.Lat, fill(be, PageSize, dc))
						a.PE = append(a.PE, fill(be, PageSize, dr))
						a.Keys += min(PageSize, l-p*PageSize)
					}
					a.Out, _ = be.Alloc(compute.F32, 1, hq, dc)
					args[r], splits[r] = a, &Split{B: be, Comm: g[r], TopK: k, Latent: dc, Rope: dr}
				}
				step := func() {
					var eg errgroup.Group
					for r := range n {
						eg.Go(func() error { return splits[r].Decode(context.Background(), args[r]) })
					}
					if err := eg.Wait(); err != nil {
						b.Fatal(err)
					}
				}
				step()
				var before comm.Stats
				for r := range n {
					before = before.Add(g[r].Stats())
				}
				b.ResetTimer()
				for range b.N {
					step()
				}
				b.StopTimer()
				var after comm.Stats
				for r := range n {
					after = after.Add(g[r].Stats())
				}
				sent := float64(after.Sub(before).TotalBytes()) / float64(b.N)
				gather := float64(4 * (n - 1) * l * (dc + dr + di))
				b.ReportMetric(sent/1e6, "MB/row")
				b.ReportMetric(gather/1e6, "allgather_MB/row")
				b.ReportMetric(sent/gather, "of_allgather")
			})
		}
	}
}
