package dsa

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"k3/comm"
	"k3/compute"
	"k3/internal/cpu"
)

// headTail returns the positions rank r of n takes from a prefill of t
// tokens cut into 2n near-equal pieces: piece r and piece 2n-1-r, the
// balanced split for causal attention.
func headTail(t, n, r int) []int32 {
	var pos []int32
	for _, p := range []int{r, 2*n - 1 - r} {
		for i := p * t / (2 * n); i < (p+1)*t/(2*n); i++ {
			pos = append(pos, int32(i))
		}
	}
	return pos
}

// TestForwardSplitEqualsUnsplit: a prefill split head+tail over 2 to 4
// ranks, then decode steps whose keys spread over the ranks (merging
// partial outputs, or gathering the rows), give the outputs of the unsplit
// layer within the conformance tolerance and the same top-K selections,
// order included; the ranks' decode outputs agree bitwise.
func TestForwardSplitEqualsUnsplit(t *testing.T) {
	sparse := testConfig()
	wide := testConfig()
	wide.Indexer = &IndexerConfig{NumHeads: 2, HeadDim: 16, TopK: 24}
	dense := testConfig()
	dense.Indexer = nil
	const steps = 6
	for _, tc := range []struct {
		name string
		cfg  Config
		t    int
	}{{"sparse", sparse, 37}, {"top-24 across pages", wide, 150}, {"top-24 short", wide, 19}, {"dense MLA", dense, 70}} {
		for _, run := range []struct {
			n      int
			gather bool
		}{{2, false}, {3, false}, {4, false}, {2, true}, {3, true}} {
			n := run.n
			t.Run(fmt.Sprintf("%s/%d ranks/gather %v", tc.name, n, run.gather), func(t *testing.T) {
				cfg, total := tc.cfg, tc.t+steps
				r := rand.New(rand.NewPCG(uint64(n), 9))
				xs := randn(r, total*cfg.Hidden)
				row := func(p int) []float32 { return xs[p*cfg.Hidden : (p+1)*cfg.Hidden] }

				// Unsplit: the prompt as one chunk, then exact steps.
				b := cpu.New(1)
				defer b.Close()
				w, err := LoadWeights(b, cfg, randomSource(cfg, 3))
				require.NoError(t, err)
				l, err := NewLayer(b, cfg, w, tc.t)
				require.NoError(t, err)
				l.DenseSelections = true // the split indexer always selects
				c, err := NewCache(NewPool(b, cfg), 1024)
				require.NoError(t, err)
				y, _ := b.Alloc(compute.F32, tc.t, cfg.Hidden)
				require.NoError(t, l.Forward(up(t, b, xs[:tc.t*cfg.Hidden], tc.t, cfg.Hidden), chunkOf(c, tc.t), y))
				want := get(b, y)
				var wantSel []int32
				if cfg.Indexer != nil {
					wantSel = getI(b, l.Indices(tc.t))
				}
				for p := tc.t; p < total; p++ {
					y1, _ := b.Alloc(compute.F32, 1, cfg.Hidden)
					require.NoError(t, l.Forward(up(t, b, row(p), 1, cfg.Hidden), stepOf(c, 1), y1))
					want = append(want, get(b, y1)...)
					if cfg.Indexer != nil {
						wantSel = append(wantSel, getI(b, l.Indices(1))...)
					}
				}

				// Split over n ranks.
				bs := make([]compute.Backend, n)
				for i := range bs {
					bs[i] = cpu.New(1)
				}
				g, err := comm.NewLocal(bs)
				require.NoError(t, err)
				queries := make([][]int32, n)
				for i := range n {
					queries[i] = headTail(tc.t, n, i)
				}
				got := make([][]float32, n) // per rank: every output it computed, by position
				gotSel := make([][]int32, n)
				var eg errgroup.Group
				for rk := range n {
					eg.Go(func() error {
						b := bs[rk]
						defer b.Close()
						w, err := LoadWeights(b, cfg, randomSource(cfg, 3))
						if err != nil {
							return err
						}
						l, err := NewLayer(b, cfg, w, tc.t)
						if err != nil {
							return err
						}
						c, err := NewCache(NewPool(b, cfg), 1024)
						if err != nil {
							return err
						}
						pl := NewPlacement(n)
						for p := range 2 * n {
							owner := p
							if p >= n {
								owner = 2*n - 1 - p
							}
							pl.Add(owner, (p+1)*tc.t/(2*n)-p*tc.t/(2*n))
						}
						ex := NewExchange(b)
						defer ex.Free()
						got[rk] = make([]float32, total*cfg.Hidden)
						gotSel[rk] = make([]int32, total*max(1, cfg.topK()))
						keep := func(pos []int32, y compute.Tensor) {
							out := get(b, y)
							var sel []int32
							if cfg.Indexer != nil {
								sel = getI(b, l.Indices(len(pos)))
							}
							for i, p := range pos {
								copy(got[rk][int(p)*cfg.Hidden:], out[i*cfg.Hidden:(i+1)*cfg.Hidden])
								if sel != nil {
									k := cfg.topK()
									copy(gotSel[rk][int(p)*k:], sel[i*k:(i+1)*k])
								}
							}
						}
						mine := queries[rk]
						if len(mine) > 0 {
							x := make([]float32, 0, len(mine)*cfg.Hidden)
							for _, p := range mine {
								x = append(x, row(int(p))...)
							}
							y, _ := b.Alloc(compute.F32, len(mine), cfg.Hidden)
							a := &SplitPass{Comm: g[rk], Cache: c, Place: pl, Pos: mine, Queries: queries}
							if err := l.ForwardSplit(context.Background(), ex, a, up(t, b, x, len(mine), cfg.Hidden), y); err != nil {
								return err
							}
							keep(mine, y)
						} else {
							// A rank with no rows still serves the others' queries.
							a := &SplitPass{Comm: g[rk], Cache: c, Place: pl, Queries: queries}
							if err := l.ForwardSplit(context.Background(), ex, a, compute.Tensor{}, compute.Tensor{}); err != nil {
								return err
							}
						}
						for p := tc.t; p < total; p++ {
							pl.Add(pl.Fewest(), 1)
							y1, _ := b.Alloc(compute.F32, 1, cfg.Hidden)
							a := &SplitPass{Comm: g[rk], Cache: c, Place: pl, Pos: []int32{int32(p)}, Shared: true, GatherRows: run.gather}
							if err := l.ForwardSplit(context.Background(), ex, a, up(t, b, row(p), 1, cfg.Hidden), y1); err != nil {
								return err
							}
							keep([]int32{int32(p)}, y1)
						}
						return nil
					})
				}
				require.NoError(t, eg.Wait())
				scale := 0.0
				for _, v := range want {
					scale = math.Max(scale, math.Abs(float64(v)))
				}
				k := max(1, cfg.topK())
				for rk := range n {
					for _, p := range append(slices.Clone(queries[rk]), steps32(tc.t, total)...) {
						for j := range cfg.Hidden {
							i := int(p)*cfg.Hidden + j
							require.InDelta(t, want[i], got[rk][i], 1e-4*scale, "rank %d position %d element %d", rk, p, j)
						}
						if cfg.Indexer != nil {
							require.Equal(t, wantSel[int(p)*k:(int(p)+1)*k], gotSel[rk][int(p)*k:(int(p)+1)*k], "rank %d position %d's selection", rk, p)
						}
					}
					// Decode rows are computed by every rank alike.
					assert.Equal(t, got[0][tc.t*cfg.Hidden:], got[rk][tc.t*cfg.Hidden:], "rank %d's decode outputs", rk)
				}
			})
		}
	}
}

func steps32(lo, hi int) []int32 {
	var v []int32
	for p := lo; p < hi; p++ {
		v = append(v, int32(p))
	}
	return v
}

func (c Config) topK() int {
	if c.Indexer == nil {
		return 0
	}
	return c.Indexer.TopK
}
