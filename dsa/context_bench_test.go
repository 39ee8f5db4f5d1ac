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

// BenchmarkSplitDecodeBytes decodes rows of a DeepSeek-V3.2-sized
// attention layer (latent 512, rope 64, index keys 128, top-K 2048, value
// heads of 128; 16 query heads, a TP rank's share of V3.2's 128) over a
// cache of L positions split head and tail over CP ranks, and reports the bytes ForwardSplit's collectives send per decoded
// row (summed over the ranks) against what an all-gather of the whole
// cache (latent, rope and index keys) would send: merging each rank's
// partial attention over the selected keys it holds (how the model
// decodes), and gathering the selected rows to every rank instead. The
// MLA cases are the same layer without its indexer (dense attention).
//
//	go test ./dsa -run '^$' -bench SplitDecodeBytes -benchtime 3x
func BenchmarkSplitDecodeBytes(b *testing.B) {
	const dc, dr, di, k = 512, 64, 128, 2048
	sparse := Config{Hidden: 64, NumHeads: 16, QLoRARank: 32, KVLoRARank: dc, NopeDim: 128, RopeDim: dr, VDim: 128,
		OutputGate: true, RopeTheta: 10000, Indexer: &IndexerConfig{NumHeads: 8, HeadDim: di, TopK: k}}
	dense := sparse
	dense.Indexer = nil
	for _, kind := range []struct {
		name   string
		cfg    Config
		gather bool
	}{{"dsa", sparse, false}, {"dsa-gather", sparse, true}, {"mla", dense, false}, {"mla-gather", dense, true}} {
		for _, l := range []int{4096, 32768, 131072} {
			for _, n := range []int{2, 4} {
				b.Run(fmt.Sprintf("%s/L%d/cp%d", kind.name, l, n), func(b *testing.B) {
					benchSplitDecode(b, kind.cfg, kind.gather, l, n)
				})
			}
		}
	}
}

func benchSplitDecode(b *testing.B, cfg Config, gather bool, l, n int) {
	bs := make([]compute.Backend, n)
	for i := range bs {
		bs[i] = cpu.New(1)
		defer bs[i].Close()
	}
	g, err := comm.NewLocal(bs)
	if err != nil {
		b.Fatal(err)
	}
	type rank struct {
		l     *Layer
		c     *Cache
		pl    *Placement
		ex    *Exchange
		x, y  compute.Tensor
		split SplitPass
	}
	ranks := make([]*rank, n)
	var eg errgroup.Group
	for r := range n {
		eg.Go(func() error {
			be := bs[r]
			w, err := LoadWeights(be, cfg, randomSource(cfg, 3))
			if err != nil {
				return err
			}
			rk := &rank{pl: NewPlacement(n), ex: NewExchange(be)}
			if rk.l, err = NewLayer(be, cfg, w, 1); err != nil {
				return err
			}
			if rk.c, err = NewCache(NewPool(be, cfg), l+b.N+8); err != nil {
				return err
			}
			// The cache a head-and-tail prefill of l positions leaves.
			for p := range 2 * n {
				owner := p
				if p >= n {
					owner = 2*n - 1 - p
				}
				rk.pl.Add(owner, (p+1)*l/(2*n)-p*l/(2*n))
			}
			rng := rand.New(rand.NewPCG(uint64(r), 5))
			rows := make([]float32, rk.pl.Held(r)*rk.c.RowLen())
			for i := range rows {
				rows[i] = float32(rng.NormFloat64())
			}
			if err := rk.c.AppendRows(rows, rk.pl.Held(r)); err != nil {
				return err
			}
			rk.x, _ = be.Alloc(compute.F32, 1, cfg.Hidden)
			x := make([]float32, cfg.Hidden)
			for i := range x {
				x[i] = float32(rand.New(rand.NewPCG(9, 9)).NormFloat64())
			}
			be.Write(rk.x, x)
			rk.y, _ = be.Alloc(compute.F32, 1, cfg.Hidden)
			ranks[r] = rk
			return nil
		})
	}
	if err := eg.Wait(); err != nil {
		b.Fatal(err)
	}
	step := func() {
		var eg errgroup.Group
		for r, rk := range ranks {
			eg.Go(func() error {
				p := rk.pl.Len()
				rk.pl.Add(rk.pl.Fewest(), 1)
				rk.split = SplitPass{Comm: g[r], Cache: rk.c, Place: rk.pl, Pos: []int32{int32(p)}, Shared: true, GatherRows: gather}
				return rk.l.ForwardSplit(context.Background(), rk.ex, &rk.split, rk.x, rk.y)
			})
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
	all := float64(4 * (n - 1) * l * (cfg.KVLoRARank + cfg.RopeDim + 128))
	b.ReportMetric(sent/1e6, "MB/row")
	b.ReportMetric(all/1e6, "allgather_MB/row")
	b.ReportMetric(sent/all, "of_allgather")
}
