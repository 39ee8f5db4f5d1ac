package k3

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/comm"
	"k3/config"
)

// With the indexer's heads split over the TP ranks (Layout.SplitIndexer)
// the ranks sum their partial scores before the top K: the selections
// equal one rank's exactly, prefill and decode, alone and with each CP
// slice a TP group; the tokens are one rank's and the logits within 1e-4
// of their scale; a rank holds fewer weight bytes than with the indexer
// replicated, and the score all-reduce moves more.
func TestSplitIndexer(t *testing.T) {
	dirs := testModels(t)
	ctx := context.Background()
	layouts := []Layout{{TP: 2}, {TP: 4}, {TP: 2, EP: 2}, {CP: 2, TP: 2}}
	if raceEnabled {
		layouts = []Layout{{TP: 4}, {CP: 2, TP: 2}}
	}
	tested := 0
	for _, cfgPath := range dirs {
		dir := filepath.Dir(cfgPath)
		cfg, err := config.Load(dir)
		require.NoError(t, err)
		if cfg.Indexer == nil {
			continue
		}
		tested++
		one, err := Load(ctx, dir)
		require.NoError(t, err)
		v := one.Config.VocabSize
		prompt := make([]int32, 41)
		for i := range prompt {
			prompt[i] = int32((i*131 + 7) % v)
		}
		const steps = 6
		// run feeds the prompt and greedy steps, tracing the prompt and
		// every step.
		type runner interface {
			Forward(context.Context, []int32) ([]float32, error)
		}
		run := func(s runner) (logits []float32, toks []int32, sel [][][]int32) {
			var tr Trace
			logits, err := s.Forward(WithTrace(ctx, &tr), prompt)
			require.NoError(t, err)
			sel = append(sel, tr.DSAIndices)
			for range steps {
				tok := argmax(logits[len(logits)-v:])
				toks = append(toks, tok)
				var tr Trace
				row, err := s.Forward(WithTrace(ctx, &tr), []int32{tok})
				require.NoError(t, err)
				logits = append(logits, row...)
				sel = append(sel, tr.DSAIndices)
			}
			return logits, toks, sel
		}
		s, err := one.NewSession()
		require.NoError(t, err)
		want, wantToks, wantSel := run(s)
		s.Close()
		one.Close()
		scale := maxAbsF(want)
		for _, l := range layouts {
			t.Run(fmt.Sprintf("%s/%v", filepath.Base(dir), l), func(t *testing.T) {
				type result struct {
					held  int64
					bytes int64
				}
				var res [2]result
				for i, split := range []bool{false, true} {
					l := l
					l.SplitIndexer = split
					g := loadGroupFitting(t, dir, cfg, l)
					gs, err := g.NewSession()
					require.NoError(t, err)
					got, toks, sel := run(gs)
					require.Equal(t, wantToks, toks)
					assert.Equal(t, wantSel, sel, "DSA selections")
					worst := 0.0
					for i := range want {
						worst = max(worst, math.Abs(float64(got[i]-want[i])))
					}
					assert.LessOrEqual(t, worst, 1e-4*scale, "largest logit difference, logit scale %.3g", scale)
					res[i] = result{g.Ranks()[0].ShardBytes(), g.Stats().Bytes[comm.OpAllReduce]}
					gs.Close()
					g.Close()
				}
				if _, hasAttn, _ := kinds(cfg); hasAttn && cfg.Indexer.NumHeads >= l.TP {
					// Fewer heads than ranks leave the indexer whole.
					assert.Less(t, res[1].held, res[0].held, "a rank's weight bytes with the indexer split")
					assert.Greater(t, res[1].bytes, res[0].bytes, "all-reduce bytes with the indexer split")
				}
			})
		}
	}
	require.Positive(t, tested, "no checkpoint with a Lightning Indexer")
}
