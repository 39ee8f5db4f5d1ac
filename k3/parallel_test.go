package k3

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/comm"
)

// parallelLayouts are the layouts of issue 19's point 3.
var parallelLayouts = []Layout{{TP: 2}, {TP: 4}, {EP: 2}, {EP: 4}, {TP: 2, EP: 2}, {TP: 2, EP: 4}, {TP: 4, EP: 2}, {TP: 4, EP: 4},
	{EP: 2, Dispatch: true}, {EP: 4, Dispatch: true}, {TP: 2, EP: 4, Dispatch: true},
	// Three ranks share one head, or one of two, where a model has fewer.
	{TP: 3}, {TP: 3, SplitIndexer: true}}

// run feeds a prompt and decodes greedily with caches, one token a step,
// returning every logit row and the tokens.
func runAlone(t *testing.T, s *Session, prompt []int32, steps int) ([]float32, []int32) {
	t.Helper()
	ctx := context.Background()
	v := s.m.Config.VocabSize
	logits, err := s.Forward(ctx, prompt)
	require.NoError(t, err)
	var toks []int32
	for range steps {
		tok := argmax(logits[len(logits)-v:])
		toks = append(toks, tok)
		row, err := s.Forward(ctx, []int32{tok})
		require.NoError(t, err)
		logits = append(logits, row...)
	}
	return logits, toks
}

// loadGroupFitting loads dir split by l, or, where the checkpoint cannot
// take l (expert ranks for a model without routed experts, or beyond
// them), checks that LoadGroup says so and skips.
func loadGroupFitting(t *testing.T, dir string, cfg *Config, l Layout) *Group {
	t.Helper()
	g, err := LoadGroup(context.Background(), dir, l)
	if n := l.norm(); n.EP > 1 && (cfg.MoE == nil || n.EP > cfg.MoE.NumExperts) {
		require.ErrorIs(t, err, ErrLayoutMismatch)
		t.Skipf("%v does not fit the checkpoint: %v", l, err)
	}
	require.NoError(t, err)
	return g
}

func maxAbsF(v []float32) float64 {
	m := 0.0
	for _, x := range v {
		m = max(m, math.Abs(float64(x)))
	}
	return m
}

// A model split by TP and EP gives the tokens of one rank, with logits
// within 1e-4 of the logit scale, on every conformance checkpoint; every
// rank holds a part of the weights that falls as ranks grow.
func TestGroupEqualsOneRank(t *testing.T) {
	dirs := testModels(t)
	ctx := context.Background()
	layouts := parallelLayouts
	if raceEnabled {
		layouts = []Layout{{TP: 2}, {TP: 4, EP: 2}, {EP: 4, Dispatch: true}}
	}
	for _, cfgPath := range dirs {
		dir := filepath.Dir(cfgPath)
		one, err := Load(ctx, dir)
		require.NoError(t, err)
		s, err := one.NewSession()
		require.NoError(t, err)
		// A prompt longer than the prefill chunk's first pass and past
		// the indexer's top-k, then decode steps.
		prompt := make([]int32, 37)
		for i := range prompt {
			prompt[i] = int32((i*131 + 7) % one.Config.VocabSize)
		}
		const steps = 8
		want, wantToks := runAlone(t, s, prompt, steps)
		s.Close()
		scale := maxAbsF(want)
		full := one.ShardBytes()
		_, _, hasMoE := kinds(one.Config)
		cfg := one.Config
		one.Close()
		for _, l := range layouts {
			t.Run(fmt.Sprintf("%s/%v", filepath.Base(dir), l), func(t *testing.T) {
				g := loadGroupFitting(t, dir, cfg, l)
				defer g.Close()
				gs, err := g.NewSession()
				require.NoError(t, err)
				defer gs.Close()
				got, err := gs.Forward(ctx, prompt)
				require.NoError(t, err)
				v := g.Ranks()[0].Config.VocabSize
				var toks []int32
				for range steps {
					tok := argmax(got[len(got)-v:])
					toks = append(toks, tok)
					row, err := gs.Forward(ctx, []int32{tok})
					require.NoError(t, err)
					got = append(got, row...)
				}
				require.Equal(t, wantToks, toks)
				require.Len(t, got, len(want))
				worst := 0.0
				for i := range want {
					worst = max(worst, math.Abs(float64(got[i]-want[i])))
				}
				assert.LessOrEqual(t, worst, 1e-4*scale, "largest logit difference, logit scale %.3g", scale)
				// Every rank holds less than the whole model, unless the
				// layout splits only experts and no layer has any.
				st := g.Stats()
				if l.TP > 1 || hasMoE {
					for r, m := range g.Ranks() {
						assert.Less(t, m.ShardBytes(), full, "rank %d", r)
					}
				}
				switch {
				case l.Dispatch && hasMoE:
					assert.Positive(t, st.Bytes[comm.OpAllToAllV], "tokens went to their experts")
				case l.TP > 1 || hasMoE:
					assert.Positive(t, st.Calls[comm.OpAllReduce])
				}
				t.Logf("rank 0 holds %d of %d weight bytes (%.2f); collectives sent %d bytes (all-reduce %d, all-to-all-v %d, all-gather %d) over %d tokens",
					g.Ranks()[0].ShardBytes(), full, float64(g.Ranks()[0].ShardBytes())/float64(full), st.TotalBytes(),
					st.Bytes[comm.OpAllReduce], st.Bytes[comm.OpAllToAllV], st.Bytes[comm.OpAllGather], len(prompt)+steps)
			})
		}
	}
}

// The tokens GroupSession.Generate streams are rank 0's, equal to one
// rank's; stopping early leaves the group usable.
func TestGroupGenerate(t *testing.T) {
	ctx := context.Background()
	dir := "../testdata/model/tiny_k31pro"
	one, err := Load(ctx, dir)
	require.NoError(t, err)
	defer one.Close()
	prompt := []int32{5, 9, 17, 33, 65, 129, 257, 3, 11, 200}
	s, err := one.NewSession()
	require.NoError(t, err)
	var want []int32
	for tok, err := range s.GenerateTokens(ctx, prompt, WithMaxTokens(12), WithTemperature(0.8), WithSeed(3)) {
		require.NoError(t, err)
		want = append(want, tok.ID)
	}
	s.Close()

	g, err := LoadGroup(ctx, dir, Layout{TP: 2, EP: 4})
	require.NoError(t, err)
	defer g.Close()
	gs, err := g.NewSession()
	require.NoError(t, err)
	n := 0
	for tok, err := range gs.GenerateTokens(ctx, prompt, WithMaxTokens(12), WithTemperature(0.8), WithSeed(3)) {
		require.NoError(t, err)
		require.Equal(t, want[n], tok.ID, "token %d", n)
		if n++; n == 5 {
			break
		}
	}
	require.NoError(t, gs.Close())
	gs, err = g.NewSession()
	require.NoError(t, err)
	defer gs.Close()
	var got []int32
	for tok, err := range gs.GenerateTokens(ctx, prompt, WithMaxTokens(12), WithTemperature(0.8), WithSeed(3)) {
		require.NoError(t, err)
		got = append(got, tok.ID)
	}
	require.Equal(t, want, got)
}

func TestLayoutErrors(t *testing.T) {
	ctx := context.Background()
	dir := "../testdata/model/tiny_k3"
	for _, l := range []Layout{{TP: 3, EP: 2}, {EP: 16}, {TP: -1}, {TP: 4, EP: 2, Dispatch: true}} {
		_, err := LoadGroup(ctx, dir, l)
		require.ErrorIs(t, err, ErrInvalidOption, "%+v", l)
		// Only the layout a valid checkpoint cannot take (8 experts over
		// 16 ranks) is a mismatch; the others are wrong for any model.
		assert.Equal(t, l.EP == 16, errors.Is(err, ErrLayoutMismatch), "%+v: %v", l, err)
	}
	// Expert ranks for a model without routed experts: only config.json
	// is read before the layout is checked.
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	require.NoError(t, err)
	var cfg map[string]any
	require.NoError(t, json.Unmarshal(raw, &cfg))
	text := cfg["text_config"].(map[string]any)
	text["num_experts"] = nil
	dense := t.TempDir()
	raw, err = json.Marshal(cfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dense, "config.json"), raw, 0o644))
	_, err = LoadGroup(ctx, dense, Layout{TP: 2, EP: 4})
	require.ErrorIs(t, err, ErrLayoutMismatch)
	require.ErrorContains(t, err, "no routed experts")
	// More TP ranks than vocabulary entries: a rank's slice would be empty.
	text["vocab_size"], text["bos_token_id"], text["eos_token_id"], text["pad_token_id"] = 3, 1, 2, 0
	raw, err = json.Marshal(cfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dense, "config.json"), raw, 0o644))
	_, err = LoadConfig(dense)
	require.NoError(t, err)
	_, err = LoadGroup(ctx, dense, Layout{TP: 4})
	require.ErrorIs(t, err, ErrLayoutMismatch)
	require.ErrorContains(t, err, "a vocabulary of 3 over 4 TP ranks")
	b, err := OpenBackend("go")
	require.NoError(t, err)
	defer b.Close()
	_, err = LoadGroup(ctx, dir, Layout{TP: 2}, WithComputeBackend(b))
	require.ErrorIs(t, err, ErrInvalidOption)
}

func TestPart(t *testing.T) {
	for _, c := range []struct{ n, ranks int }{{8, 2}, {8, 4}, {3, 2}, {3, 4}, {1, 4}, {96, 4}, {5, 3}, {1, 3}, {2, 3}, {2, 5}} {
		counted := make([]int, c.n)
		for i := range c.ranks {
			lo, hi, dup := part(c.n, c.ranks, i)
			require.Less(t, lo, hi, "%+v rank %d holds nothing", c, i)
			if !dup {
				for u := lo; u < hi; u++ {
					counted[u]++
				}
			}
		}
		for u, n := range counted {
			assert.Equal(t, 1, n, "%+v: unit %d counted %d times", c, u, n)
		}
	}
}
