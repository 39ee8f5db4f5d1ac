package plan

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/config"
)

// The planner's parameter categories add up to the config's own count
// (which also counts norms, conv taps and biases: a fraction of a percent).
func TestCountsMatchConfig(t *testing.T) {
	dirs, err := filepath.Glob("../../testdata/model/*/config.json")
	require.NoError(t, err)
	for _, f := range dirs {
		c, err := config.Load(filepath.Dir(f))
		require.NoError(t, err)
		n := count(c)
		sum := n.attn + n.indexer + n.dense + n.routed + n.shared + n.embed + n.head
		total := float64(c.NumParams())
		assert.InEpsilon(t, total, sum, 0.05, "%s: categories %.0f, config %.0f", f, sum, total)
		assert.LessOrEqual(t, sum, total, f)
	}
}

func TestPlanShape(t *testing.T) {
	c, err := config.Load("../../testdata/model/tiny_k31pro")
	require.NoError(t, err)
	w := Workload{Context: 4096, Batch: 8, Prompt: 1024, WeightBytes: 2, KVBytes: 2, ActBytes: 2}
	one, err := Plan(c, Cards["a3"], 1, w)
	require.NoError(t, err)
	require.Len(t, one, 1)
	assert.Zero(t, one[0].CommMB, "one card moves nothing")
	four, err := Plan(c, Cards["a3"], 4, w)
	require.NoError(t, err)
	byLayout := map[Layout]Estimate{}
	for _, e := range four {
		byLayout[e.Layout] = e
	}
	tp4 := byLayout[Layout{TP: 4, CP: 1, DP: 1, EP: 4}]
	dp4 := byLayout[Layout{TP: 1, CP: 1, DP: 4, EP: 4}]
	cp4 := byLayout[Layout{TP: 1, CP: 4, DP: 1, EP: 4}]
	// Splitting heads shrinks the weights a card holds; splitting
	// sequences or positions shrinks its state.
	assert.Less(t, tp4.WeightsGB, dp4.WeightsGB)
	assert.Less(t, dp4.StateGB, tp4.StateGB)
	assert.Less(t, cp4.StateGB, tp4.StateGB)
	assert.Positive(t, tp4.CommMB)
	assert.Positive(t, cp4.CommMB)
	for i := 1; i < len(four); i++ {
		if four[i-1].Fits == four[i].Fits {
			assert.GreaterOrEqual(t, four[i-1].TokPerCardS, four[i].TokPerCardS)
		}
	}
	_, err = Plan(c, Cards["a3"], 4, Workload{Context: 0, Batch: 1, WeightBytes: 2, KVBytes: 2, ActBytes: 2})
	assert.Error(t, err)
	_, err = Plan(c, Card{Name: "x"}, 4, w)
	assert.Error(t, err)
}

// No layout splits a kind of layer's heads over more TP cards than it
// has: tiny_k3 has 3 KDA and 3 MLA heads, tiny_k31pro 4 of each.
func TestLayoutsBoundTPByHeads(t *testing.T) {
	for dir, most := range map[string]int{"tiny_k3": 2, "tiny_k31pro": 4} {
		c, err := config.Load("../../testdata/model/" + dir)
		require.NoError(t, err)
		largest := 0
		for _, l := range Layouts(c, 8) {
			largest = max(largest, l.TP)
			assert.Equal(t, 8, l.TP*l.CP*l.DP, "%s %v", dir, l)
		}
		assert.Equal(t, most, largest, dir)
	}
	// Not powers of two only: 12 cards take TP 3 where the heads allow.
	c, err := config.Load("../../testdata/model/tiny_k3")
	require.NoError(t, err)
	tps := map[int]bool{}
	for _, l := range Layouts(c, 12) {
		tps[l.TP] = true
	}
	assert.Equal(t, map[int]bool{1: true, 2: true, 3: true}, tps)
}

// DeepSeek-V3.2 and its dense-MLA twin (R1's shape): the categories give
// the config's 672B parameters.
func TestCountsDeepSeek(t *testing.T) {
	for _, f := range []string{"../../docs/plan/deepseek_v32.json", "../../docs/plan/deepseek_r1.json"} {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		c, err := config.Parse(b)
		require.NoError(t, err)
		n := count(c)
		sum := n.attn + n.indexer + n.dense + n.routed + n.shared + n.embed + n.head
		assert.InEpsilon(t, float64(c.NumParams()), sum, 1e-3, f)
	}
}
