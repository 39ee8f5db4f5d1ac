package plan

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/config"
	"k3/k3"
)

// The planner's bytes per decode step are what a k3 Group's collectives
// count for one decoded token, per card, on every checkpoint: TP 2 and 4,
// with the experts' columns split or whole experts over EP, and CP 2 and 4.
// A k3 CP rank holds every expert, where the planner spreads them over all
// the cards, so there only CP's own share (CPCommMB) is compared.
func TestBytesMatchCounters(t *testing.T) {
	dirs, err := filepath.Glob("../../testdata/model/*/config.json")
	require.NoError(t, err)
	ctx := context.Background()
	for _, f := range dirs {
		dir := filepath.Dir(f)
		c, err := config.Load(dir)
		require.NoError(t, err)
		for _, l := range []k3.Layout{{TP: 2}, {TP: 4}, {TP: 2, EP: 2}, {TP: 4, EP: 4}, {CP: 2}, {CP: 4},
			{TP: 2, SplitIndexer: true}, {TP: 4, EP: 2, SplitIndexer: true}} {
			n := l.Ranks()
			g, err := k3.LoadGroup(ctx, dir, l)
			require.NoError(t, err)
			gs, err := g.NewSession()
			require.NoError(t, err)
			prompt := make([]int32, 40)
			for i := range prompt {
				prompt[i] = int32(3 + i%200)
			}
			_, err = gs.Forward(ctx, prompt)
			require.NoError(t, err)
			before := g.Stats()
			_, err = gs.Forward(ctx, []int32{5})
			require.NoError(t, err)
			measured := float64(g.Stats().Sub(before).TotalBytes()) / float64(n)
			w := Workload{Context: len(prompt) + 1, Batch: 1, WeightBytes: 4, KVBytes: 4, ActBytes: 4, SplitIndexer: l.SplitIndexer}
			pl := Layout{TP: max(l.TP, 1), CP: max(l.CP, 1), DP: 1, EP: max(l.EP, 1)}
			e := count(c).estimate(c, Cards["a3"], n, w, pl)
			planned := e.CommMB
			if l.CP > 1 {
				planned = e.CPCommMB
			}
			assert.InEpsilon(t, measured, planned*1e6, 1e-9, "%s %v: counted %.0f bytes a card, planned %.0f", filepath.Base(dir), l, measured, planned*1e6)
			t.Logf("%s %v: %.0f bytes a card per decoded token, counted and planned", filepath.Base(dir), l, measured)
			gs.Close()
			g.Close()
		}
	}
}
